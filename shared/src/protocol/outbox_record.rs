//! The outbox record: one per committed transaction (and one tombstone per aborted one).

use serde::{Deserialize, Serialize};

use super::message::OutgoingMessage;
use super::txn_id::TxnId;
use crate::time::Timestamp;

/// Where a transaction stands. The only transitions are `pending -> dispatched`
/// (by the control worker) and `absent -> pending | dispatched` (the commit) or
/// `absent -> tombstone` (the control worker, after the commit window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxState {
    /// Committed; its messages wait to be published.
    Pending,
    /// Committed and published (or committed with nothing to publish).
    Dispatched,
    /// Not committed, and now never will be.
    Tombstone,
}

impl OutboxState {
    /// The state's name as stored and reported.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Dispatched => "dispatched",
            Self::Tombstone => "tombstone",
        }
    }
}

/// The protocol record of one transaction, keyed `TXN#{txn_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxRecord {
    /// The transaction.
    pub txn_id: TxnId,
    /// Its state.
    pub state: OutboxState,
    /// The messages to publish, in emission order; empty once dispatched.
    pub messages: Vec<OutgoingMessage>,
    /// When the record was written.
    pub created_at: Timestamp,
    /// When it may be deleted (TTL). `None` only while pending: a pending record must
    /// outlive any delay in dispatching it (invariant I1); every other state expires (I6).
    pub expires_at: Option<Timestamp>,
    /// The attempt that committed it, where several attempts race to commit one record
    /// (a consumed message's, [`TxnId::consumed`]): the store tells its own record from
    /// a rival's by it. `None` for the request path, whose transaction id is its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<TxnId>,
}

impl OutboxRecord {
    /// The record a commit writes: `pending` with its messages, or directly `dispatched`
    /// (expiring) when the transaction emitted nothing, so that its control message finds
    /// it committed and writes no tombstone.
    pub fn committed(txn_id: TxnId, messages: Vec<OutgoingMessage>, now: Timestamp, expires_at: Timestamp) -> Self {
        let state = if messages.is_empty() {
            OutboxState::Dispatched
        } else {
            OutboxState::Pending
        };
        Self {
            txn_id,
            state,
            messages,
            created_at: now,
            expires_at: (state != OutboxState::Pending).then_some(expires_at),
            attempt: None,
        }
    }

    /// This record, committed by attempt `attempt` (see [`Self::attempt`]).
    pub fn by_attempt(mut self, attempt: TxnId) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// Whether `other`, found where this record was to be written, is this very record
    /// committed: same transaction, same attempt, not a tombstone. An earlier request of
    /// the same commit applied, and the commit has happened.
    pub fn is_own(&self, other: &OutboxRecord) -> bool {
        other.txn_id == self.txn_id && other.attempt == self.attempt && other.state != OutboxState::Tombstone
    }

    /// A tombstone for `txn_id`.
    pub fn tombstone(txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Self {
        Self {
            txn_id,
            state: OutboxState::Tombstone,
            messages: Vec::new(),
            created_at: now,
            expires_at: Some(expires_at),
            attempt: None,
        }
    }

    /// Whether the record no longer exists for readers at `now` (its TTL has passed;
    /// DynamoDB deletes such items only eventually).
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|expires_at| expires_at <= now)
    }

    /// The record after dispatch: no messages, expiring.
    pub fn dispatched(&self, expires_at: Timestamp) -> Self {
        Self {
            state: OutboxState::Dispatched,
            messages: Vec::new(),
            expires_at: Some(expires_at),
            ..self.clone()
        }
    }
}

/// Where a committed record stands in commit order: its place in its entity's history
/// where its messages have one (the version after its commit), else its commit time, then
/// its transaction. Records of one entity sort by the entity's versions, whatever the
/// clocks of the hosts that committed them.
pub fn commit_order(record: &OutboxRecord) -> (u64, crate::time::Timestamp, super::TxnId) {
    let version = record
        .messages
        .iter()
        .find_map(|message| message.position.as_ref().map(|position| position.version))
        .unwrap_or(0);
    (version, record.created_at, record.txn_id)
}
