//! What handling control messages did: each message's outcome or error, and a batch's
//! report (the partial batch response is read from it).

use std::sync::Arc;
use std::time::Duration;

use crate::ports::{QueueError, StoreError};
use crate::protocol::{DecodeError, OutboxState, TxnId};
use crate::publish::PublishFailure;
use crate::time::Timestamp;

/// What handling one control message did. Logs, metrics and tests use these words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlOutcome {
    /// The transaction's messages were published and its record marked dispatched.
    Dispatched {
        /// How many messages.
        messages: usize,
        /// When the record was committed (for the dispatch lag).
        committed_at: Timestamp,
    },
    /// Nothing to do: the record was already `dispatched` or a `tombstone`.
    AlreadyDone {
        /// The state found.
        state: OutboxState,
    },
    /// No record yet, within the window: a later check was scheduled.
    Deferred {
        /// The attempt number of the new control message.
        next_attempt: u32,
        /// Its delay.
        delay: Duration,
    },
    /// No record after the window: the transaction can never commit now.
    Tombstoned,
    /// No record after the window, and the fence in the transaction's item was refused
    /// because other writes to the item kept it from applying (a busy item): a later
    /// check, in a new control message, fences it then. The message does not fail, so a
    /// busy item never sends a control message to the dead-letter queue.
    FenceOnBusyItem {
        /// The attempt number of the new control message.
        next_attempt: u32,
        /// Its delay.
        delay: Duration,
    },
    /// Entity mode: the transaction's entry was found in its item beside its tombstone
    /// record (a tombstone written without the fence while a commit of it was on its way,
    /// which only a direct `Store::put_tombstone` does). The entry
    /// is proof of the commit: its messages were published, its record put dispatched and
    /// the entry removed. Counted (`EntriesBesideTombstones`) and alarmed.
    DispatchedBesideTombstone {
        /// How many messages.
        messages: usize,
        /// When the entry was committed.
        committed_at: Timestamp,
    },
    /// No record, and the control message is older than the retention: whatever the
    /// transaction did has long been settled and its record forgotten; writing a
    /// tombstone now could contradict a commit that has since expired.
    Stale,
}

impl ControlOutcome {
    /// A short name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Dispatched { .. } => "dispatched",
            Self::AlreadyDone { .. } => "already_done",
            Self::Deferred { .. } => "deferred",
            Self::FenceOnBusyItem { .. } => "fence_on_busy_item",
            Self::Tombstoned => "tombstoned",
            Self::DispatchedBesideTombstone { .. } => "dispatched_beside_tombstone",
            Self::Stale => "stale",
        }
    }
}

/// Why a control message must be retried (it goes back to the queue, and after the
/// redrive policy's receive count to the dead-letter queue).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The body is not a control message this worker understands.
    #[error("undecodable control message")]
    Decode(#[source] Arc<DecodeError>),
    /// Reading the outbox record failed.
    #[error("reading the outbox record failed")]
    Read(#[source] Arc<StoreError>),
    /// Some messages could not be published; the rest may have been.
    #[error("{failed} of {total} messages could not be published")]
    Publish {
        /// How many failed.
        failed: usize,
        /// How many the transaction has.
        total: usize,
        /// The first failure.
        first: PublishFailure,
    },
    /// Marking the record dispatched failed; its messages were published.
    #[error("marking the outbox record dispatched failed")]
    Mark(#[source] Arc<StoreError>),
    /// Sending the re-deferred control message failed.
    #[error("re-deferring the control message failed")]
    Defer(#[source] Arc<QueueError>),
    /// Writing the tombstone failed.
    #[error("writing the tombstone failed")]
    Tombstone(#[source] Arc<StoreError>),
    /// More earlier transactions of the entity are still unsent than one search reads
    /// (on a destination that keeps order, they go first): this one waits for a later
    /// try, while the oldest go out through their own control messages.
    #[error("more than {max} earlier transactions of entity {entity} are still unsent")]
    EarlierUnsent {
        /// The entity.
        entity: crate::ports::ItemKey,
        /// How many one search reads.
        max: usize,
    },
}

/// The result for one control message of a batch.
#[derive(Debug, Clone)]
pub struct ItemReport {
    /// The queue's id of the message.
    pub message_id: String,
    /// The transaction, when the body could be decoded.
    pub txn_id: Option<TxnId>,
    /// The control message's attempt number, when decoded.
    pub attempt: Option<u32>,
    /// What happened.
    pub result: Result<ControlOutcome, ControlError>,
}

/// The results for a batch, one per control message, in the batch's order.
#[derive(Debug, Clone, Default)]
pub struct BatchReport {
    /// One per message.
    pub items: Vec<ItemReport>,
}

impl BatchReport {
    /// The queue ids of the messages that must be retried (the partial batch response).
    pub fn failed_message_ids(&self) -> Vec<&str> {
        self.items
            .iter()
            .filter(|item| item.result.is_err())
            .map(|item| item.message_id.as_str())
            .collect()
    }
}
