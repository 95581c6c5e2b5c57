//! Publishing a committed transaction's messages in the request path, before the answer
//! or right after it (docs/PROTOCOL.md section 3, "Settling in the request path").

use std::time::Duration;

use tracing::Instrument;

use super::settle::within;
use super::Outbox;
use crate::ports::{ItemKey, Publisher};
use crate::protocol::{OutboxRecord, OutboxState, OutgoingMessage};
use crate::publish::{publish_all, RetryPolicy};
use crate::time::Timestamp;

/// Sends of one message the request path tries inline: fewer than the worker's, since a
/// client waits and the worker is the safety net.
const INLINE_RETRY: RetryPolicy = RetryPolicy {
    attempts: 2,
    base_delay: Duration::from_millis(25),
    max_delay: Duration::from_millis(100),
};

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
    /// it was committed in (`entity`: an entry in that item), now or, when it publishes
    /// after the answer, on its [`super::AfterAnswer`] as soon as this returns.
    pub(super) async fn dispatch_committed(
        &self,
        entity: Option<&InEntity>,
        committed: &OutboxRecord,
        deadline: Option<Timestamp>,
    ) -> InlineDispatch {
        let to_publish = entity.is_some() || committed.state == OutboxState::Pending;
        match &self.after_answer {
            Some(after) if self.inline.is_some() && to_publish => {
                let (outbox, entity, committed) = (self.clone(), entity.cloned(), committed.clone());
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
                    let outcome = outbox.dispatch_now(entity.as_ref(), &committed, deadline).await;
                    tracing::debug!(txn_id = %committed.txn_id, inline = outcome.as_str(), "published after the answer");
                };
                after.run(dispatch.instrument(span));
                InlineDispatch::AfterAnswer
            }
            _ => self.dispatch_now(entity, committed, deadline).await,
        }
    }

    async fn dispatch_now(
        &self,
        entity: Option<&InEntity>,
        committed: &OutboxRecord,
        deadline: Option<Timestamp>,
    ) -> InlineDispatch {
        match entity {
            Some(entity) => self.dispatch_entry_inline(entity, committed, deadline).await,
            None => self.dispatch_inline(committed, deadline).await,
        }
    }

    /// Publishes a transaction's entry committed into its entity (entity mode), then
    /// settles it, within `deadline`: one write that removes the entry and leaves the
    /// transaction's sent mark in the item, its proof of commit (where a fence, the
    /// control worker and `GET /transactions` find it). The messages of earlier
    /// transactions the entity held to destinations that keep order go out first, so
    /// that none of this one's leaves before an earlier one's there (a copy sent meanwhile
    /// keeps its id, which FIFO deduplicates). Never fails: what it cannot do, the control
    /// worker does.
    async fn dispatch_entry_inline(
        &self,
        entity: &InEntity,
        entry: &OutboxRecord,
        deadline: Option<Timestamp>,
    ) -> InlineDispatch {
        let Some(publisher) = &self.inline else {
            return InlineDispatch::Off;
        };
        let clock = self.ports.clock.as_ref();
        let settle = async {
            // The entity's earlier entries still waiting: their messages to destinations
            // that keep order (FIFO) go out first, so that none of this one's overtakes
            // them there. Each entry stays for its own publisher, which sends it all and
            // settles it (FIFO drops the copies within its deduplication window); where
            // order is not kept, nothing is gained by sending them twice.
            let ordered: Vec<&OutgoingMessage> = entity
                .earlier
                .iter()
                .flat_map(|earlier| &earlier.messages)
                .filter(|message| publisher.keeps_order(&message.destination))
                .collect();
            if !ordered.is_empty() {
                let report = publish_all(publisher.as_ref(), clock, &ordered, INLINE_RETRY).await;
                if !report.failed.is_empty() {
                    tracing::warn!(
                        failed = report.failed.len(),
                        "an earlier entry's messages could not be sent first; the control worker will publish"
                    );
                    return InlineDispatch::LeftToWorker;
                }
                tracing::info!(
                    earlier = entity.earlier.len(),
                    messages = ordered.len(),
                    "sent the entity's earlier messages first"
                );
            }
            if !self.publish_inline(publisher.as_ref(), entry).await {
                return InlineDispatch::LeftToWorker;
            }
            let settled = self
                .ports
                .store
                .settle_entry(
                    &entity.key,
                    entry.txn_id,
                    entry.created_at,
                    clock.now().plus(self.timing.retention),
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
        };
        let outcome = within(clock, deadline, settle).await.unwrap_or_else(|| {
            tracing::warn!("the deadline came during inline publishing; the control worker will publish");
            InlineDispatch::LeftToWorker
        });
        self.count_inline(outcome);
        outcome
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

    /// Publishes a committed record's messages and marks it dispatched, within
    /// `deadline`. Never fails: what it cannot do, the control worker does.
    async fn dispatch_inline(&self, record: &OutboxRecord, deadline: Option<Timestamp>) -> InlineDispatch {
        let Some(publisher) = &self.inline else {
            return InlineDispatch::Off;
        };
        if record.state != OutboxState::Pending {
            return InlineDispatch::NothingToPublish;
        }
        let clock = self.ports.clock.as_ref();
        let settle = async {
            if !self.publish_inline(publisher.as_ref(), record).await {
                return InlineDispatch::LeftToWorker;
            }
            // Only after every message went out: a record marked first and a crash before
            // publishing would lose them (I1).
            let expires_at = clock.now().plus(self.timing.retention);
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
        };
        let outcome = within(clock, deadline, settle).await.unwrap_or_else(|| {
            tracing::warn!("the deadline came during inline publishing; the control worker will publish");
            InlineDispatch::LeftToWorker
        });
        self.count_inline(outcome);
        outcome
    }
}

/// The entity a transaction committed into (entity mode), with the entries of earlier
/// transactions it held when the transaction read it: what goes out before the
/// transaction's own messages.
#[derive(Debug, Clone)]
pub(super) struct InEntity {
    /// The item.
    pub(super) key: ItemKey,
    /// The entries of earlier transactions, in commit order.
    pub(super) earlier: Vec<OutboxRecord>,
}
