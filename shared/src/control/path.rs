//! The control path's handling of one batch of control messages: the [`ControlPath`],
//! its ports, and the batch's reading and grouping of transactions. What it decides for
//! each transaction is in `decide`, its publishing and marking in `dispatch`.

mod decide;
mod dispatch;
mod release;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::join_all;

use super::outcome::{BatchReport, ControlError, ControlOutcome, ItemReport};
use crate::ports::{Clock, ControlDelivery, ControlQueue, ItemKey, Publisher, Store, StoreError};
use crate::protocol::{sent_marks, ControlMessage, TxnId};
use crate::publish::RetryPolicy;
use crate::settings::Timing;
use decide::Decision;

pub use decide::MAX_ATTEMPTS;
pub use release::ReleaseError;

/// The ports the control path uses.
#[derive(Clone)]
pub struct ControlPorts {
    /// The table.
    pub store: Arc<dyn Store>,
    /// Where re-deferred control messages go.
    pub control_queue: Arc<dyn ControlQueue>,
    /// Where outgoing messages go.
    pub publisher: Arc<dyn Publisher>,
    /// Wall-clock time.
    pub clock: Arc<dyn Clock>,
}

/// Handles control messages. Build one per process and share it.
#[derive(Clone)]
pub struct ControlPath {
    ports: ControlPorts,
    timing: Timing,
    retry: RetryPolicy,
    sent_marks: usize,
    release_refused: bool,
}

/// The span of one control message's handling: its SQS message id and its transaction.
fn message_span(message_id: &str, txn_id: Option<TxnId>) -> tracing::Span {
    tracing::info_span!(
        "control_message",
        sqs_message_id = %message_id,
        txn_id = txn_id.map(tracing::field::display)
    )
}

impl ControlPath {
    /// The control path over `ports`, with `timing` from the settings.
    pub fn new(ports: ControlPorts, timing: Timing) -> Self {
        Self {
            ports,
            timing,
            retry: RetryPolicy::default(),
            sent_marks: sent_marks::MAX_SENT_MARKS,
            release_refused: false,
        }
    }

    /// An operator's release of a parked transaction: a message that a destination refuses
    /// for good no longer holds its transaction back (nor, on a destination that keeps
    /// order, the later messages of its entity). It is skipped, logged at error with its
    /// id, destination and the destination's code, and the transaction is marked
    /// dispatched once every other message went out. Never the worker's own mode: only a
    /// person decides to skip a message (`control-worker release`).
    pub fn releasing_refused(mut self) -> Self {
        self.release_refused = true;
        self
    }

    /// Replaces how many sent marks an item holds (entity mode;
    /// [`sent_marks::MAX_SENT_MARKS`] by default): as many as the request path's
    /// ([`crate::request::Outbox::with_sent_marks`]).
    pub fn with_sent_marks(mut self, max: usize) -> Self {
        self.sent_marks = max;
        self
    }

    /// Replaces the retry policy for failed publish entries.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The clock it keeps time by (its poller's lease renewals too).
    pub fn clock(&self) -> &dyn Clock {
        self.ports.clock.as_ref()
    }

    /// Handles one control message.
    pub async fn handle(&self, delivery: &ControlDelivery) -> ItemReport {
        let mut report = self.handle_batch(std::slice::from_ref(delivery)).await;
        report.items.pop().expect("one report per delivery")
    }

    /// Handles a batch: one batched read, one publishing pass, one marking pass, and a
    /// result per message so that one bad message never fails its neighbours. Several
    /// messages for one transaction (duplicates) are settled once and share the result.
    pub async fn handle_batch(&self, deliveries: &[ControlDelivery]) -> BatchReport {
        let decoded: Vec<Result<ControlMessage, ControlError>> = deliveries
            .iter()
            .map(|delivery| {
                ControlMessage::decode(&delivery.body).map_err(|error| {
                    tracing::error!(sqs_message_id = %delivery.message_id, error = %error, "undecodable control message");
                    ControlError::Decode(Arc::new(error))
                })
            })
            .collect();
        // The newest message of each transaction speaks for it (its attempt is highest).
        let mut controls: BTreeMap<TxnId, ControlMessage> = BTreeMap::new();
        for message in decoded.iter().flatten() {
            let entry = controls.entry(message.txn_id).or_insert_with(|| message.clone());
            if message.attempt > entry.attempt {
                *entry = message.clone();
            }
        }
        // A span per message from here to its outcome, linking the trace of the request
        // that began its transaction (the trace it settles is the transaction's own:
        // `dispatch` below).
        let spans: Vec<tracing::Span> = deliveries
            .iter()
            .zip(&decoded)
            .map(|(delivery, decoded)| {
                let message = decoded.as_ref().ok();
                let span = message_span(&delivery.message_id, message.map(|message| message.txn_id));
                if let Some(trace) = message.and_then(|message| message.trace.as_ref()) {
                    crate::telemetry::link(&span, trace);
                }
                span
            })
            .collect();
        // Each transaction's decision under the span of (the first of) its messages.
        let mut by_txn: BTreeMap<TxnId, &tracing::Span> = BTreeMap::new();
        for (decoded, span) in decoded.iter().zip(&spans) {
            if let Ok(message) = decoded {
                by_txn.entry(message.txn_id).or_insert(span);
            }
        }
        let outcomes = self.settle(&controls, &by_txn).await;
        let items = deliveries
            .iter()
            .zip(decoded)
            .zip(spans)
            .map(|((delivery, decoded), span)| {
                let (txn_id, attempt, result) = match decoded {
                    Err(error) => (None, None, Err(error)),
                    Ok(message) => (
                        Some(message.txn_id),
                        Some(message.attempt),
                        outcomes[&message.txn_id].clone(),
                    ),
                };
                let _span = span.entered();
                match &result {
                    Ok(outcome) => tracing::info!(outcome = outcome.as_str(), "control message handled"),
                    Err(error) => tracing::warn!(error = %error, "control message failed"),
                }
                ItemReport {
                    message_id: delivery.message_id.clone(),
                    txn_id,
                    attempt,
                    result,
                }
            })
            .collect();
        BatchReport { items }
    }

    async fn settle(
        &self,
        controls: &BTreeMap<TxnId, ControlMessage>,
        spans: &BTreeMap<TxnId, &tracing::Span>,
    ) -> BTreeMap<TxnId, Result<ControlOutcome, ControlError>> {
        if controls.is_empty() {
            return BTreeMap::new();
        }
        // Entity mode reads the item first (its sent mark settles most), the record only
        // where the item does not tell; the others' records are read in one batch.
        let txn_ids: Vec<TxnId> = controls
            .iter()
            .filter(|(_, control)| control.entity.is_none())
            .map(|(txn_id, _)| *txn_id)
            .collect();
        // Each record on its own: one that cannot be read fails its control message
        // alone, never its neighbours.
        let mut records = match self.read_records(&txn_ids).await {
            Ok(records) => records,
            Err(error) => {
                let error = ControlError::Read(Arc::new(error));
                return controls.keys().map(|id| (*id, Err(error.clone()))).collect();
            }
        };
        // Transactions decided at once: the reads of their items, the fences and the
        // deferrals of a batch overlap instead of queueing. Those naming the same item go
        // one after another, so that their fences of it never contend.
        let mut by_item: BTreeMap<&ItemKey, Vec<(TxnId, &ControlMessage)>> = BTreeMap::new();
        let mut groups: Vec<Vec<(TxnId, &ControlMessage)>> = Vec::new();
        for (txn_id, control) in controls {
            match &control.entity {
                Some(key) => by_item.entry(key).or_default().push((*txn_id, control)),
                None => groups.push(vec![(*txn_id, control)]),
            }
        }
        groups.extend(by_item.into_values());
        let decided = groups.into_iter().map(|group| {
            let group: Vec<_> = group
                .into_iter()
                .map(|(txn_id, control)| (txn_id, control, records.remove(&txn_id)))
                .collect();
            async move {
                let mut decisions = Vec::with_capacity(group.len());
                for (txn_id, control, record) in group {
                    let parent = spans
                        .get(&txn_id)
                        .map(|span| (*span).clone())
                        .unwrap_or_else(tracing::Span::current);
                    decisions.push((txn_id, self.decide(control, record, &parent).await));
                }
                decisions
            }
        });
        let decisions: BTreeMap<TxnId, Decision> = join_all(decided).await.into_iter().flatten().collect();
        self.dispatch(decisions).await
    }

    /// Records `txn_ids`, each read on its own (no call for none).
    async fn read_records(&self, txn_ids: &[TxnId]) -> Result<crate::ports::OutboxReads, StoreError> {
        if txn_ids.is_empty() {
            return Ok(BTreeMap::new());
        }
        self.ports.store.get_outboxes_each(txn_ids).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::{EmbeddedBackend, ManualClock};
    use crate::test_log::Logged;
    use crate::time::Timestamp;

    #[tokio::test]
    async fn each_control_message_is_handled_in_a_span_naming_its_transaction() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), []);
        let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
        let txn_id = TxnId::new_v7();
        let delivery = ControlDelivery {
            message_id: "m-1".into(),
            receipt: "r-1".into(),
            body: ControlMessage::first(txn_id, clock.now()).encode(),
            receive_count: 1,
        };
        let logged = Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_writer(move || writer.clone())
            .finish();
        crate::test_log::keep_callsites_interested();
        let _guard = tracing::subscriber::set_default(subscriber);
        control.handle_batch(std::slice::from_ref(&delivery)).await;
        let text = logged.text();
        let lines: Vec<serde_json::Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        let handled = lines
            .iter()
            .find(|line| line["fields"]["message"] == "control message handled")
            .unwrap_or_else(|| panic!("no 'control message handled' line: {text}"));
        assert_eq!(handled["span"]["name"], "control_message", "{handled}");
        assert_eq!(handled["span"]["txn_id"], txn_id.to_string(), "{handled}");
        assert_eq!(handled["span"]["sqs_message_id"], "m-1", "{handled}");
    }
}
