//! The control path's handling of one batch of control messages: the [`ControlPath`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tracing::Instrument;

use super::outcome::{BatchReport, ControlError, ControlOutcome, ItemReport};
use crate::ports::{
    Clock, ControlDelivery, ControlQueue, FenceOutcome, ItemKey, Publisher, Store, StoreError, TombstoneOutcome,
};
use crate::protocol::{sent_marks, ControlMessage, OutboxRecord, OutboxState, TraceContext, TxnId};
use crate::publish::{publish_all, PublishFailure, RetryPolicy};
use crate::settings::Timing;

/// After this many checks a transaction is tombstoned even if the worker's clock says
/// its window is still open: tombstoning is always safe (in entity mode too: the fence
/// mark is never pruned, so a commit arriving after it fails however late), and this
/// bounds the work a clock far behind the API's could cause.
pub const MAX_ATTEMPTS: u32 = 64;

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
}

/// The span of one control message's handling: its SQS message id and its transaction.
fn message_span(message_id: &str, txn_id: Option<TxnId>) -> tracing::Span {
    tracing::info_span!(
        "control_message",
        sqs_message_id = %message_id,
        txn_id = txn_id.map(tracing::field::display)
    )
}

/// The trace context a transaction's messages were emitted in, if traced.
fn stored_trace(record: &OutboxRecord) -> Option<&TraceContext> {
    record.messages.iter().find_map(|message| message.trace.as_ref())
}

/// The span of one transaction's dispatch by the worker: in the transaction's trace, a
/// child of the span that emitted its messages.
fn dispatch_span(record: &OutboxRecord) -> tracing::Span {
    let span = tracing::info_span!(
        "dispatch",
        txn_id = %record.txn_id,
        messages = record.messages.len(),
        committed_at = record.created_at.as_millis()
    );
    if let Some(trace) = stored_trace(record) {
        crate::telemetry::continue_from(&span, trace);
    }
    span
}

/// What the batch decided for one transaction before publishing.
enum Decision {
    /// A pending record: publish, then mark it.
    Publish(OutboxRecord),
    /// An entry committed into its entity (entity mode): publish, then put the
    /// transaction's record dispatched, then remove the entry. `true`: found beside the
    /// transaction's tombstone record.
    PublishEntry(ItemKey, OutboxRecord, bool),
    Done(Result<ControlOutcome, ControlError>),
}

impl ControlPath {
    /// The control path over `ports`, with `timing` from the settings.
    pub fn new(ports: ControlPorts, timing: Timing) -> Self {
        Self {
            ports,
            timing,
            retry: RetryPolicy::default(),
            sent_marks: sent_marks::MAX_SENT_MARKS,
        }
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

    /// What to do for one transaction, given what the batched read found of its record
    /// (entity mode: nothing was read yet).
    async fn decide(
        &self,
        control: &ControlMessage,
        record: Option<Result<OutboxRecord, StoreError>>,
        parent: &tracing::Span,
    ) -> Decision {
        if let Some(key) = &control.entity {
            let span =
                tracing::info_span!(parent: parent, "decide", txn_id = %control.txn_id, attempt = control.attempt);
            return self.decide_in_entity(control, key).instrument(span).await;
        }
        match record {
            Some(Ok(record)) => self.decide_on_record(record),
            Some(Err(error)) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            None => {
                let span =
                    tracing::info_span!(parent: parent, "decide", txn_id = %control.txn_id, attempt = control.attempt);
                self.decide_on_absence(control).instrument(span).await
            }
        }
    }

    fn decide_on_record(&self, record: OutboxRecord) -> Decision {
        match record.state {
            OutboxState::Pending => Decision::Publish(record),
            state => Decision::Done(Ok(ControlOutcome::AlreadyDone { state })),
        }
    }

    /// T's record as found, in entity mode, where the entity may still hold T's entry
    /// (`slot`: T's slot in the entity as read already, `None` where it was not read):
    /// beside a dispatched record (a full item's settle, or a removal of an earlier
    /// version, that failed after the record) it is removed; beside a tombstone it is
    /// proof of a commit the tombstone did not fence, and is published.
    async fn decide_on_entity_record(
        &self,
        control: &ControlMessage,
        key: &ItemKey,
        record: OutboxRecord,
        slot: Option<Option<OutboxRecord>>,
    ) -> Decision {
        let slot = match slot {
            Some(slot) => Ok(slot),
            None => self.slot(key, control.txn_id).await,
        };
        match record.state {
            OutboxState::Dispatched => match slot {
                Ok(Some(_)) => {
                    tracing::info!(txn_id = %control.txn_id, entity = %key, "removing an entry left in its entity");
                    match self.ports.store.remove_entry(key, control.txn_id).await {
                        Ok(()) => self.decide_on_record(record),
                        Err(error) => Decision::Done(Err(ControlError::Mark(Arc::new(error)))),
                    }
                }
                Ok(_) => self.decide_on_record(record),
                Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            },
            OutboxState::Tombstone => match slot {
                Ok(Some(entry)) => {
                    tracing::error!(
                        txn_id = %control.txn_id,
                        entity = %key,
                        committed_at = %entry.created_at,
                        "an entry beside its transaction's tombstone: the transaction committed; publishing it"
                    );
                    Decision::PublishEntry(key.clone(), entry, true)
                }
                Ok(None) => self.decide_on_record(record),
                Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            },
            OutboxState::Pending => self.decide_on_record(record),
        }
    }

    /// Transaction `txn_id`'s committed entry in `key`, if it is there.
    async fn slot(&self, key: &ItemKey, txn_id: TxnId) -> Result<Option<OutboxRecord>, StoreError> {
        let entity = self.ports.store.get_entity(key).await?;
        Ok(entity.and_then(|entity| entity.entries.get(&txn_id).cloned()))
    }

    /// Entity mode: the item first. T's sent mark there settles it (one read, the usual
    /// case once the request path dispatched); otherwise T's record tells, read after the
    /// item: a mark leaves the item only once its record is put, so a mark missed by the
    /// item's read is found in the record. An entry is published; nothing at all is an
    /// absence (the fence, which checks both again atomically, decides).
    async fn decide_in_entity(&self, control: &ControlMessage, key: &ItemKey) -> Decision {
        let txn_id = control.txn_id;
        let entity = match self.ports.store.get_entity(key).await {
            Ok(entity) => entity,
            Err(error) => return Decision::Done(Err(ControlError::Read(Arc::new(error)))),
        };
        if let Some(entity) = &entity {
            self.forget_marks(key, &entity.sent).await;
            if entity.sent.contains_key(&txn_id) {
                return Decision::Done(Ok(ControlOutcome::AlreadyDone {
                    state: OutboxState::Dispatched,
                }));
            }
        }
        let record = match self.ports.store.get_outboxes_each(&[txn_id]).await {
            Ok(mut records) => records.remove(&txn_id),
            Err(error) => Some(Err(error)),
        };
        match record {
            Some(Ok(record)) => {
                let slot = entity.as_ref().and_then(|entity| entity.entries.get(&txn_id).cloned());
                self.decide_on_entity_record(control, key, record, Some(slot)).await
            }
            Some(Err(error)) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            None => match entity.and_then(|entity| entity.entries.get(&txn_id).cloned()) {
                Some(entry) => Decision::PublishEntry(key.clone(), entry, false),
                None => self.decide_on_absence(control).await,
            },
        }
    }

    /// Drops the marks past their time from an item that holds as many as it keeps, to
    /// make room for the next. A failure is logged: the next control message of the item
    /// tries again, and nothing depends on it (a full item settles in two writes).
    async fn forget_marks(&self, key: &ItemKey, sent: &BTreeMap<TxnId, crate::time::Timestamp>) {
        let Some(forget) = sent_marks::past_their_time(sent, self.ports.clock.now(), self.sent_marks) else {
            return;
        };
        match self.ports.store.forget_marks(key, &forget).await {
            Ok(()) => tracing::info!(entity = %key, forgotten = forget.len(), "sent marks past their time dropped"),
            Err(error) => tracing::warn!(entity = %key, error = %error, "dropping sent marks past their time failed"),
        }
    }

    async fn decide_on_absence(&self, control: &ControlMessage) -> Decision {
        let now = self.ports.clock.now();
        // Stale after the shorter of the sender's retention and this worker's: past the
        // sender's, the proof of a commit (its record, its sent mark) may have expired, and
        // a fence then would stand beside a commit.
        let stale_after = control.stale_after(self.timing.retention, self.timing.max_commit_duration);
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let disagree = control.retention.is_some_and(|sender| sender != self.timing.retention);
        if disagree && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                txn_id = %control.txn_id,
                sender_retention_s = control.retention.map(|sender| sender.as_secs()),
                worker_retention_s = self.timing.retention.as_secs(),
                stale_after_s = stale_after.as_secs(),
                "the API's OUTBOX_RETENTION_SECONDS differs from this worker's: the shorter holds (one within the commit window is ignored); set one value for both"
            );
        }
        if now >= control.first_sent_at.plus(stale_after) {
            tracing::warn!(txn_id = %control.txn_id, "control message older than the retention; acknowledging it without a tombstone");
            return Decision::Done(Ok(ControlOutcome::Stale));
        }
        let window_end = control.first_sent_at.plus(self.timing.max_commit_duration);
        if now < window_end && control.attempt < MAX_ATTEMPTS {
            let next = control.next_attempt();
            let delay = self.deferral_delay(control.attempt, window_end.since(now));
            return Decision::Done(match self.ports.control_queue.send(&next, delay).await {
                Ok(()) => Ok(ControlOutcome::Deferred {
                    next_attempt: next.attempt,
                    delay,
                }),
                Err(error) => Err(ControlError::Defer(Arc::new(error))),
            });
        }
        let expires_at = now.plus(self.timing.retention);
        if let Some(key) = &control.entity {
            // The fence raises the entity's fence mark, with the record's tombstone: no
            // commit of the transaction, in either form, applies after it, however late
            // (docs/ENTITY_MODE.md). Nothing to prune: the mark is one attribute.
            return match self
                .ports
                .store
                .fence_entity(key, control.txn_id, now, expires_at)
                .await
            {
                Ok(FenceOutcome::Fenced) => Decision::Done(Ok(ControlOutcome::Tombstoned)),
                Ok(FenceOutcome::Committed(entry)) => Decision::PublishEntry(key.clone(), entry, false),
                Ok(FenceOutcome::Dispatched) => Decision::Done(Ok(ControlOutcome::AlreadyDone {
                    state: OutboxState::Dispatched,
                })),
                // Recorded since this message's read (tombstoned by the request path's
                // settling fence, or committed and dispatched, its entry perhaps left in
                // the entity by a removal that failed): handled as a record read first is.
                Ok(FenceOutcome::Recorded(record)) => self.decide_on_entity_record(control, key, record, None).await,
                Err(error @ StoreError::Contention(_)) => self.fence_later(control, key, error).await,
                Err(error) => Decision::Done(Err(ControlError::Tombstone(Arc::new(error)))),
            };
        }
        match self.ports.store.put_tombstone(control.txn_id, now, expires_at).await {
            Ok(TombstoneOutcome::Written) => Decision::Done(Ok(ControlOutcome::Tombstoned)),
            // The transaction committed after our read (or a duplicate tombstoned it):
            // handle the record as it is now.
            Ok(TombstoneOutcome::Exists(record)) => self.decide_on_record(record),
            Err(error) => Decision::Done(Err(ControlError::Tombstone(Arc::new(error)))),
        }
    }

    /// A fence refused by a busy item: a new control message fences it later (its delay
    /// growing with the attempts, up to the backoff cap), and this one is done. Failing
    /// this message instead would count each refusal toward the dead-letter queue, where
    /// the transaction would wait unfenced, with a commit of it still able to land.
    async fn fence_later(&self, control: &ControlMessage, key: &ItemKey, error: StoreError) -> Decision {
        let next = control.next_attempt();
        let delay = self.deferral_delay(control.attempt, self.timing.backoff_cap);
        tracing::warn!(
            txn_id = %control.txn_id,
            entity = %key,
            error = %error,
            delay_s = delay.as_secs(),
            "the item is busy: fencing the transaction in a later check"
        );
        Decision::Done(match self.ports.control_queue.send(&next, delay).await {
            Ok(()) => Ok(ControlOutcome::FenceOnBusyItem {
                next_attempt: next.attempt,
                delay,
            }),
            Err(error) => Err(ControlError::Defer(Arc::new(error))),
        })
    }

    /// The delay before re-checking after check number `attempt`: the first check delay
    /// doubled per attempt, capped by the backoff cap and by the time left in the window,
    /// in whole seconds (SQS's unit), at least one.
    pub fn deferral_delay(&self, attempt: u32, left_in_window: Duration) -> Duration {
        let base = self.timing.first_check_delay.max(Duration::from_secs(1));
        let doubled = base.saturating_mul(1u32 << attempt.min(16));
        let delay = doubled.min(self.timing.backoff_cap).min(left_in_window);
        let whole_seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        Duration::from_secs(whole_seconds.clamp(1, 900))
    }

    /// An entry whose messages went out leaves its entity, which keeps the transaction's
    /// sent mark ([`Store::settle_entry`]). Beside a tombstone record the record is put
    /// dispatched over it instead, then the entry removed: a record that says tombstone
    /// must not outlive the proof of the commit.
    async fn finish_entry(
        &self,
        key: &ItemKey,
        entry: &OutboxRecord,
        beside_tombstone: bool,
    ) -> Result<ControlOutcome, ControlError> {
        let now = self.ports.clock.now();
        let store = &self.ports.store;
        let expires_at = now.plus(self.timing.retention);
        let settled = if beside_tombstone {
            match store.put_dispatched(entry.txn_id, entry.created_at, expires_at).await {
                Ok(()) => store.remove_entry(key, entry.txn_id).await,
                Err(error) => Err(error),
            }
        } else {
            store
                .settle_entry(key, entry.txn_id, entry.created_at, expires_at, self.sent_marks)
                .await
        };
        settled.map_err(|error| ControlError::Mark(Arc::new(error)))?;
        let (messages, committed_at) = (entry.messages.len(), entry.created_at);
        Ok(if beside_tombstone {
            ControlOutcome::DispatchedBesideTombstone { messages, committed_at }
        } else {
            ControlOutcome::Dispatched { messages, committed_at }
        })
    }

    /// Publishes every pending record's messages in one pass, then marks the records
    /// whose messages all went out.
    async fn dispatch(
        &self,
        decisions: BTreeMap<TxnId, Decision>,
    ) -> BTreeMap<TxnId, Result<ControlOutcome, ControlError>> {
        let mut outcomes = BTreeMap::new();
        let mut pending = Vec::new();
        let mut entities: BTreeMap<TxnId, (ItemKey, bool)> = BTreeMap::new();
        for (txn_id, decision) in decisions {
            match decision {
                Decision::Done(outcome) => {
                    outcomes.insert(txn_id, outcome);
                }
                Decision::Publish(record) => pending.push(record),
                Decision::PublishEntry(key, entry, beside_tombstone) => {
                    entities.insert(txn_id, (key, beside_tombstone));
                    pending.push(entry);
                }
            }
        }
        if pending.is_empty() {
            return outcomes;
        }
        // Commit order: successive transactions on one item commit one after the other,
        // so their events go out in the order the changes happened.
        pending.sort_by_key(|record| (record.created_at, record.txn_id));
        // Each transaction's dispatch is a span of its own trace, a child of the span that
        // emitted its messages (stored with them), however late and wherever it runs. The
        // batch's publish is a child of the one dispatch, or, where a batch mixes
        // transactions, a span of its own linking each dispatch.
        let spans: BTreeMap<TxnId, tracing::Span> = pending
            .iter()
            .map(|record| (record.txn_id, dispatch_span(record)))
            .collect();
        let messages: Vec<_> = pending.iter().flat_map(|record| &record.messages).collect();
        let publish_span = match &pending[..] {
            [only] => spans[&only.txn_id].clone(),
            _ => {
                let span = tracing::info_span!("publish_batch", transactions = pending.len());
                for dispatch in spans.values().filter_map(crate::telemetry::of) {
                    crate::telemetry::link(&span, &dispatch);
                }
                span
            }
        };
        let report = publish_all(
            self.ports.publisher.as_ref(),
            self.ports.clock.as_ref(),
            &messages,
            self.retry,
        )
        .instrument(publish_span)
        .await;

        let mut to_mark = Vec::new();
        let mut entries_out = Vec::new();
        for record in &pending {
            let failures: Vec<&PublishFailure> = record
                .messages
                .iter()
                .filter_map(|message| report.failed.get(&message.id))
                .collect();
            match failures.first() {
                None if entities.contains_key(&record.txn_id) => entries_out.push(record),
                None => to_mark.push(record),
                Some(first) => {
                    outcomes.insert(
                        record.txn_id,
                        Err(ControlError::Publish {
                            failed: failures.len(),
                            total: record.messages.len(),
                            first: (*first).clone(),
                        }),
                    );
                }
            }
        }
        // Each entry's record and removal on its own, all at once.
        let finished = entries_out.into_iter().map(|entry| {
            let (key, beside_tombstone) = &entities[&entry.txn_id];
            let span = spans[&entry.txn_id].clone();
            async move { (entry.txn_id, self.finish_entry(key, entry, *beside_tombstone).await) }.instrument(span)
        });
        outcomes.extend(join_all(finished).await);
        if to_mark.is_empty() {
            return outcomes;
        }
        let records: Vec<OutboxRecord> = to_mark.iter().map(|record| (*record).clone()).collect();
        let expires_at = self.ports.clock.now().plus(self.timing.retention);
        let results = self.ports.store.mark_dispatched(&records, expires_at).await;
        // A store that answers fewer results than asked leaves the rest failed, never
        // silently acknowledged.
        let results = results.into_iter().map(Some).chain(std::iter::repeat_with(|| None));
        for (record, result) in to_mark.into_iter().zip(results) {
            let result = result.unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "the store gave no result for this record".into(),
                ))
            });
            let outcome = result
                .map(|()| ControlOutcome::Dispatched {
                    messages: record.messages.len(),
                    committed_at: record.created_at,
                })
                .map_err(|error| ControlError::Mark(Arc::new(error)));
            outcomes.insert(record.txn_id, outcome);
        }
        outcomes
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
