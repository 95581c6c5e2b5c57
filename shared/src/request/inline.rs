//! Publishing a committed transaction's messages in the request path, before the answer
//! or right after it (docs/PROTOCOL.md section 3, "Settling in the request path").

use std::time::Duration;

use tracing::Instrument;

use super::settle::within;
use super::Outbox;
use crate::earlier;
use crate::ports::{ItemKey, Publisher};
use crate::protocol::{DestinationName, OutboxRecord, OutboxState, OutgoingMessage};
use crate::publish::{publish_all, RetryPolicy};
use crate::time::Timestamp;

/// Sends of one message the request path tries inline: fewer than the worker's, since a
/// client waits and the worker is the safety net.
const INLINE_RETRY: RetryPolicy = RetryPolicy {
    attempts: 2,
    base_delay: Duration::from_millis(25),
    max_delay: Duration::from_millis(100),
};

/// How long a publisher waits for the earlier publisher of its entity in this process
/// to finish sending ([`super::turns`]) before it publishes without its turn: order does
/// not rest on the turn, and a publisher stuck on a slow destination must not hold up
/// the next one (another request's, on Lambda Managed Instances another invocation's)
/// for longer.
const TURN_WAIT: Duration = Duration::from_secs(1);

/// What the request path did with a committed transaction's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InlineDispatch {
    /// Inline publishing is off: the control worker publishes them.
    Off,
    /// The transaction emitted nothing: its record was committed `dispatched`.
    NothingToPublish,
    /// Published and the record marked `dispatched`: the control message finds it done.
    Dispatched,
    /// Publishing or marking failed, or the deadline came first: the control worker
    /// publishes them (again, under the same ids), as without inline publishing.
    LeftToWorker,
    /// Handed over to run right after the answer ([`super::AfterAnswer`]); what it
    /// cannot do, the control worker does.
    AfterAnswer,
}

impl InlineDispatch {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NothingToPublish => "nothing_to_publish",
            Self::Dispatched => "dispatched",
            Self::LeftToWorker => "left_to_worker",
            Self::AfterAnswer => "after_answer",
        }
    }
}

impl Outbox {
    /// Publishes a committed transaction's messages and marks it dispatched, in the form
    /// it was committed in (`entry_in`: an entry in that item), after the entity's
    /// earlier transactions still unsent (`behind`), now or, when it publishes after the
    /// answer, on its [`super::AfterAnswer`] as soon as this returns. Never fails: what
    /// it cannot do, the control worker does.
    pub(super) async fn dispatch_committed(
        &self,
        entry_in: Option<&ItemKey>,
        behind: Option<Behind>,
        committed: &OutboxRecord,
        deadline: Option<Timestamp>,
    ) -> InlineDispatch {
        let to_publish = entry_in.is_some() || committed.state == OutboxState::Pending;
        match &self.after_answer {
            Some(after) if self.inline.is_some() && to_publish => {
                let (outbox, entry_in, committed) = (self.clone(), entry_in.cloned(), committed.clone());
                // In a span of its own below the request's (its logs keep the request's
                // fields), so that the span it was handed over in ends with the answer.
                let span = tracing::info_span!("after_answer", txn_id = %committed.txn_id);
                // Filtered out, it would leave the logs without the request's span.
                let span = if span.is_disabled() {
                    tracing::Span::current()
                } else {
                    span
                };
                let dispatch = async move {
                    let outcome = outbox
                        .dispatch_now(entry_in.as_ref(), behind.as_ref(), &committed, deadline)
                        .await;
                    tracing::debug!(txn_id = %committed.txn_id, inline = outcome.as_str(), "published after the answer");
                };
                after.run(dispatch.instrument(span));
                InlineDispatch::AfterAnswer
            }
            _ => self.dispatch_now(entry_in, behind.as_ref(), committed, deadline).await,
        }
    }

    async fn dispatch_now(
        &self,
        entry_in: Option<&ItemKey>,
        behind: Option<&Behind>,
        committed: &OutboxRecord,
        deadline: Option<Timestamp>,
    ) -> InlineDispatch {
        let Some(publisher) = &self.inline else {
            return InlineDispatch::Off;
        };
        if entry_in.is_none() && committed.state != OutboxState::Pending {
            return InlineDispatch::NothingToPublish;
        }
        let clock = self.ports.clock.as_ref();
        let settle = async {
            // Where order is kept, the entity's publishers in this process send one after
            // another (crate::request::turns), each leaving out what the ones before it
            // sent.
            let keeps_order = |destination: &DestinationName| publisher.keeps_order(destination);
            let turn = match behind {
                Some(behind) if earlier::is_ordered(committed, &keeps_order) => {
                    self.turns.take(clock, &behind.key, TURN_WAIT).await
                }
                _ => None,
            };
            if let Some(behind) = behind {
                if !self.send_earlier_first(publisher.as_ref(), behind, committed).await {
                    return InlineDispatch::LeftToWorker;
                }
            }
            if !self.publish_inline(publisher.as_ref(), committed).await {
                return InlineDispatch::LeftToWorker;
            }
            if turn.is_some() {
                self.turns.sent(committed.txn_id);
            }
            drop(turn);
            match entry_in {
                Some(key) => self.settle_entry_inline(key, committed).await,
                None => self.mark_inline(committed).await,
            }
        };
        let outcome = within(clock, deadline, settle).await.unwrap_or_else(|| {
            tracing::warn!("the deadline came during inline publishing; the control worker will publish");
            InlineDispatch::LeftToWorker
        });
        self.count_inline(outcome);
        outcome
    }

    /// The messages of the entity's earlier transactions still unsent, to destinations
    /// that keep order (FIFO), sent before this one's, so that none of this one's
    /// overtakes them there: the entries the entity held as read, and the records their
    /// chains name ([`crate::earlier`]). Each stays for its own publisher, which sends it
    /// all and settles it (FIFO drops the copies within its deduplication window); where
    /// order is not kept, nothing is gained by sending them twice. Whether they all went
    /// out (or there were none).
    async fn send_earlier_first(&self, publisher: &dyn Publisher, behind: &Behind, committed: &OutboxRecord) -> bool {
        let keeps_order = |destination: &DestinationName| publisher.keeps_order(destination);
        let earlier = if earlier::is_ordered(committed, &keeps_order) || !behind.entries.is_empty() {
            let found = earlier::unsent_before(
                self.ports.store.as_ref(),
                &keeps_order,
                &behind.key,
                behind.entries.clone(),
                committed,
                &|txn_id| self.turns.was_sent(txn_id),
            )
            .await;
            match found {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(error = %error, "the entity's earlier transactions could not all be found; the control worker will publish");
                    return false;
                }
            }
        } else {
            Vec::new()
        };
        let ordered: Vec<&OutgoingMessage> = earlier
            .iter()
            .flat_map(|earlier| &earlier.record().messages)
            .filter(|message| publisher.keeps_order(&message.destination))
            .collect();
        if ordered.is_empty() {
            return true;
        }
        let report = publish_all(publisher, self.ports.clock.as_ref(), &ordered, INLINE_RETRY).await;
        if !report.failed.is_empty() {
            tracing::warn!(
                failed = report.failed.len(),
                "an earlier transaction's messages could not be sent first; the control worker will publish"
            );
            return false;
        }
        tracing::info!(
            earlier = earlier.len(),
            messages = ordered.len(),
            "sent the entity's earlier messages first"
        );
        true
    }

    /// Settles a transaction's entry committed into its entity (entity mode) whose
    /// messages went out: one write that removes the entry and leaves the transaction's
    /// sent mark in the item, its proof of commit (where a fence, the control worker and
    /// `GET /transactions` find it).
    async fn settle_entry_inline(&self, key: &ItemKey, entry: &OutboxRecord) -> InlineDispatch {
        let settled = self
            .ports
            .store
            .settle_entry(
                key,
                entry.txn_id,
                entry.created_at,
                self.ports.clock.now().plus(self.timing.retention),
                self.sent_marks,
            )
            .await;
        if let Err(error) = settled {
            tracing::warn!(error = %error, "settling the entry failed; the control worker will");
            return InlineDispatch::LeftToWorker;
        }
        if entry.messages.is_empty() {
            InlineDispatch::NothingToPublish
        } else {
            InlineDispatch::Dispatched
        }
    }

    /// Marks a committed record whose messages went out dispatched.
    async fn mark_inline(&self, record: &OutboxRecord) -> InlineDispatch {
        // Only after every message went out: a record marked first and a crash before
        // publishing would lose them (I1).
        let expires_at = self.ports.clock.now().plus(self.timing.retention);
        match self
            .ports
            .store
            .mark_dispatched(std::slice::from_ref(record), expires_at)
            .await
            .pop()
        {
            Some(Ok(())) => InlineDispatch::Dispatched,
            other => {
                tracing::warn!(error = ?other.and_then(Result::err).map(|e| e.to_string()), "marking the record dispatched failed; the control worker will");
                InlineDispatch::LeftToWorker
            }
        }
    }

    /// Publishes `record`'s messages through `publisher`: whether every one went out.
    async fn publish_inline(&self, publisher: &dyn Publisher, record: &OutboxRecord) -> bool {
        let messages: Vec<&OutgoingMessage> = record.messages.iter().collect();
        let report = publish_all(publisher, self.ports.clock.as_ref(), &messages, INLINE_RETRY).await;
        if !report.failed.is_empty() {
            tracing::warn!(
                failed = report.failed.len(),
                "inline publishing failed; the control worker will publish"
            );
        }
        report.failed.is_empty()
    }

    /// Which path dispatched the transaction: the worker counts its own dispatches.
    fn count_inline(&self, outcome: InlineDispatch) {
        crate::metrics::MetricRecord::new(self.service.to_string(), self.ports.clock.now())
            .count("InlineDispatches", usize::from(outcome == InlineDispatch::Dispatched))
            .count("InlineFailures", usize::from(outcome == InlineDispatch::LeftToWorker))
            .emit();
    }
}

/// The entity a transaction's messages have their place in, with the entries of earlier
/// transactions it held when the transaction read it: with the records their chains
/// name, what goes out before the transaction's own messages.
#[derive(Debug, Clone)]
pub(super) struct Behind {
    /// The item.
    pub(super) key: ItemKey,
    /// Its pending entries of earlier transactions, in commit order.
    pub(super) entries: Vec<OutboxRecord>,
}
