//! The store: business items and protocol records in one strongly consistent table.
//!
//! The commit is one method because it is one atomic `TransactWriteItems`: business
//! writes, the outbox record and the idempotency record succeed or fail together, and a
//! failure says which condition failed.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use super::BoxError;
use crate::protocol::{
    Applied, AppliedPositions, ChainHeads, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, TxnId,
};
pub use crate::protocol::{InvalidItemKey, ItemKey};
use crate::time::Timestamp;

/// A business item as read: its JSON data and its version (1 after the first write).
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedItem {
    /// Its key.
    pub key: ItemKey,
    /// Incremented by every committed write.
    pub version: u64,
    /// The application's data, a JSON object.
    pub data: Value,
}

/// What a business write expects to find, checked atomically with the commit.
///
/// A key's version never restarts: a delete leaves the key vacant at the next version
/// (it reads as absent), and a create continues from there. So a write expecting a
/// version can only ever match the life of the item it read, and an attempt of a
/// committed transaction that arrives late never applies to a later life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpectedVersion {
    /// No item at the key, whatever its past (never written, or deleted): a create that
    /// did not read the key. A transaction's staging turns it into [`Self::AbsentAt`]
    /// where it read the key.
    Absent,
    /// No item at the key, which is at exactly this version: 0 where it was never
    /// written, else the version its last delete left ([`KeyRead::version`]).
    AbsentAt(u64),
    /// The item must exist at exactly this version.
    Exactly(u64),
}

impl ExpectedVersion {
    /// What a write of an item read as `read` expects: exactly the version read, or no
    /// item where none was read (the read recorded where the key stands).
    ///
    /// ```
    /// # use outbox::ports::{ExpectedVersion, VersionedItem};
    /// let item = VersionedItem { key: "TALLY#p1".parse().unwrap(), version: 3, data: serde_json::json!({}) };
    /// assert_eq!(ExpectedVersion::of(Some(&item)), ExpectedVersion::Exactly(3));
    /// assert_eq!(ExpectedVersion::of(None), ExpectedVersion::Absent);
    /// ```
    pub fn of(read: Option<&VersionedItem>) -> Self {
        read.map_or(Self::Absent, |item| Self::Exactly(item.version))
    }

    /// The version a write expecting this stores, where the expectation names it (a
    /// blind [`Self::Absent`] continues from whatever version the key is at).
    pub fn next(self) -> Option<u64> {
        match self {
            Self::Absent => None,
            Self::AbsentAt(version) | Self::Exactly(version) => Some(version + 1),
        }
    }

    /// Whether a key at `version` (0: never written), holding an item or not (`live`),
    /// is as expected.
    pub fn holds(self, live: bool, version: u64) -> bool {
        match self {
            Self::Absent => !live,
            Self::AbsentAt(expected) => !live && version == expected,
            Self::Exactly(expected) => live && version == expected,
        }
    }
}

/// A key as read with what it keeps across its lives ([`Store::get_keys`]): its item, if
/// it holds one, its version, and the heads of its chains, which a vacant key keeps (a
/// deleted item's, or 0 and none where nothing was ever written).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyRead {
    /// The item, where the key holds one.
    pub item: Option<VersionedItem>,
    /// The key's version: the item's, or the one a delete left (0: never written).
    pub version: u64,
    /// The last message the key's entity sent to each destination
    /// ([`crate::protocol::Position`]): a commit that changes it moves them.
    pub heads: ChainHeads,
    /// The outbox entries the item holds (entity mode): committed transactions whose
    /// messages a publisher of a later one sends first.
    pub entries: BTreeMap<TxnId, OutboxRecord>,
    /// The positions in-order consumers keep in the key (entity mode), which it keeps
    /// across its lives.
    pub applied: AppliedPositions,
}

/// One business action of a commit.
#[derive(Debug, Clone, PartialEq)]
pub enum BusinessWrite {
    /// Create or replace an item; it is stored at the key's next version. Where the
    /// commit's messages are positioned in this item's history, the item's chain heads
    /// move past them ([`crate::protocol::advance_chain`]), in the same write.
    Put {
        /// Which item.
        key: ItemKey,
        /// The new data (a JSON object).
        data: Value,
        /// The condition.
        expected: ExpectedVersion,
    },
    /// Delete an item that is at exactly `version`: the key stays vacant at the next
    /// version, so that a create continues from there.
    Delete {
        /// Which item.
        key: ItemKey,
        /// The version it must be at.
        version: u64,
    },
    /// Write nothing but require the item to be as expected (a read the decision
    /// depended on).
    Check {
        /// Which item.
        key: ItemKey,
        /// The condition.
        expected: ExpectedVersion,
    },
}

impl BusinessWrite {
    /// The item this action touches.
    pub fn key(&self) -> &ItemKey {
        match self {
            Self::Put { key, .. } | Self::Delete { key, .. } | Self::Check { key, .. } => key,
        }
    }
}

/// An action the application built for DynamoDB itself: a `Put`, `Update`, `Delete` or
/// `ConditionCheck` on any table, with any key schema, expressions and conditions. Only a
/// store whose [`Store::runs_native_actions`] is true (the DynamoDB store) can commit
/// them; see [`Store::commit_native`].
pub type NativeAction = aws_sdk_dynamodb::types::TransactWriteItem;

/// A DynamoDB item: attribute name to value.
pub type NativeItem = std::collections::HashMap<String, AttributeValue>;

/// Everything one transaction commits, atomically.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitRequest {
    /// The transaction; also the commit's `ClientRequestToken`.
    pub txn_id: TxnId,
    /// Business actions, at most one per item.
    pub writes: Vec<BusinessWrite>,
    /// The outbox record, put only where none exists (a tombstone blocks it).
    pub outbox: OutboxRecord,
    /// The idempotency record, put only where none exists (or it has expired).
    pub idempotency: Option<IdempotencyRecord>,
}

/// A business item of the portable form as read with its outbox entries (entity mode,
/// docs/PROTOCOL.md section 11): the outbox records of the commits it carried, keyed by
/// transaction (for a consumer, [`TxnId::consumed`] of the incoming message).
#[derive(Debug, Clone, PartialEq)]
pub struct EntityItem {
    /// The item as [`Store::get_items`] reads it.
    pub item: VersionedItem,
    /// Its entries: committed (pending, or dispatched with nothing to send) until removed.
    pub entries: BTreeMap<TxnId, OutboxRecord>,
    /// Its fence mark: the highest transaction fenced in it ([`Store::fence_entity`]), if
    /// any. A commit of the request path in entity form by a transaction at or below it is
    /// refused ([`CommitError::EntityFenced`]); the mark only moves up.
    pub fence: Option<TxnId>,
    /// Its sent marks ([`Store::settle_entry`]): the transactions committed into it whose
    /// messages went out and whose entries left it, each with the time its proof may be
    /// forgotten. A mark is the transaction's proof of commit while it is there (a delete
    /// of the item moves it to the transaction's record).
    pub sent: BTreeMap<TxnId, Timestamp>,
    /// The positions in-order consumers keep in it ([`KeyRead::applied`]).
    pub applied: AppliedPositions,
}

/// A commit of one item that carries its outbox entry: one conditional write, no
/// transaction (entity mode, docs/PROTOCOL.md section 11).
#[derive(Debug, Clone, PartialEq)]
pub struct EntityCommit {
    /// The item.
    pub key: ItemKey,
    /// Its new data (a JSON object); it is stored at the key's next version.
    pub data: Value,
    /// The condition on the item.
    pub expected: ExpectedVersion,
    /// The entry, added where the item holds none for its transaction; the item's other
    /// entries are left as they are. It is the commit itself, so never a tombstone
    /// ([`EntityCommit::check_entry`]).
    pub entry: OutboxRecord,
    /// Whether the commit is refused where the item's fence mark is at or above its
    /// transaction ([`CommitError::EntityFenced`]): the request path's commits, whose
    /// transactions are fenced in their item. A consumer's (whose ids are not ordered,
    /// and which is never fenced) ignores the mark and keeps it.
    pub checks_fence: bool,
    /// An in-order consumer's position that the commit sets (its name, and the message
    /// applied): kept in the item, under the commit's condition on its version.
    pub applied: Option<(String, Applied)>,
}

impl EntityCommit {
    /// Refuses an entry that is not a commit (a tombstone): every store checks this
    /// before writing, so that an entry in an item is always proof of its transaction's
    /// commit. Nothing is written.
    pub fn check_entry(&self) -> Result<(), CommitError> {
        if self.entry.state == OutboxState::Tombstone {
            return Err(CommitError::Invalid {
                reason: format!("the entry of {} is a tombstone, not a commit", self.entry.txn_id),
            });
        }
        Ok(())
    }
}

/// Why a commit did not apply, per failed condition; or that nobody knows whether it did.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// A tombstone holds the outbox record's key: the transaction can never commit.
    /// Nothing was written.
    #[error("transaction {txn_id} was tombstoned")]
    Tombstoned {
        /// The transaction.
        txn_id: TxnId,
    },
    /// Another attempt committed this transaction's record first (a consumed message's
    /// record, which every copy of the message races to write). Nothing of this attempt
    /// was written; the record found is the winner's.
    #[error("another attempt committed record {txn_id} first")]
    Superseded {
        /// The transaction.
        txn_id: TxnId,
    },
    /// The item's fence mark is at or above the transaction ([`EntityItem::fence`]): this
    /// transaction, or a later one on the item, was fenced, so its commit in entity form
    /// can never apply. Nothing was written. The transactional form decides: it fails
    /// where the transaction itself was fenced (its tombstone record), and applies
    /// otherwise.
    #[error("transaction {txn_id} is at or below its item's fence mark")]
    EntityFenced {
        /// The transaction.
        txn_id: TxnId,
    },
    /// A business item was not at the expected version. Nothing was written.
    #[error("item {key} is not at the expected version")]
    VersionConflict {
        /// The first item whose condition failed.
        key: ItemKey,
    },
    /// The idempotency key has a record already. Nothing was written.
    #[error("idempotency key {slot} is already used")]
    IdempotencyKeyUsed {
        /// The key.
        slot: IdempotencySlot,
    },
    /// Another transaction held an item, or the table throttled. Nothing was written;
    /// trying again may succeed.
    #[error("the commit met contention or throttling")]
    Contention(#[source] BoxError),
    /// One of the application's native actions was cancelled: its condition failed, or
    /// DynamoDB refused it for its own reason. Nothing was written.
    #[error("the application's action {index} was cancelled ({code})")]
    ActionCancelled {
        /// The action's position among the native actions, from 0.
        index: usize,
        /// DynamoDB's cancellation code (`ConditionalCheckFailed`, ...).
        code: String,
        /// The item as it was, when the action asked for it
        /// (`ReturnValuesOnConditionCheckFailure::AllOld`).
        item: Option<NativeItem>,
    },
    /// The store runs only the portable form of business writes; native actions need
    /// the DynamoDB store. Nothing was written.
    #[error("this store cannot run native DynamoDB actions")]
    NativeUnsupported,
    /// The store cannot commit in entity mode (a store that wraps another and does not
    /// forward [`Store::commit_entity`]). Nothing was written.
    #[error("this store cannot commit in entity mode")]
    EntityUnsupported,
    /// The commit exceeds what one `TransactWriteItems` can carry. Nothing was written.
    #[error("the commit exceeds one transaction's limits: {reason}")]
    TooLarge {
        /// Which limit, and how much of it the protocol's own records used.
        reason: String,
    },
    /// The store refused the request as malformed (a native action's expression, say).
    /// Nothing was written.
    #[error("the store refused the commit as invalid: {reason}")]
    Invalid {
        /// What was wrong, as the store said it.
        reason: String,
    },
    /// The store could not be reached; nothing was written.
    #[error("the store is unavailable")]
    Unavailable(#[source] BoxError),
    /// The request may or may not have been applied (timeout, connection lost after
    /// sending). Committing the same request again settles it.
    #[error("the commit's outcome is unknown")]
    Ambiguous(#[source] BoxError),
}

/// A read or a protocol write that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or failed the call; a write may or may not have
    /// been applied.
    #[error("the store is unavailable")]
    Unavailable(#[source] BoxError),
    /// An item exists but cannot be understood.
    #[error("item {key} is malformed: {reason}")]
    Corrupt {
        /// The item's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store does not offer the operation (a store that wraps another and does not
    /// forward the entity mode's operations). Nothing was written.
    #[error("this store does not offer {0}")]
    Unsupported(&'static str),
    /// Other writes to the same items kept this one from applying (DynamoDB's
    /// `TransactionConflict`, or an item that changed under each try). Nothing was
    /// written; a later try can pass once the items are quieter.
    #[error("other writes to the same items kept this one from applying")]
    Contention(#[source] BoxError),
}

/// Outbox records read each on its own ([`Store::get_outboxes_each`]).
pub type OutboxReads = BTreeMap<TxnId, Result<OutboxRecord, StoreError>>;

/// The result of trying to write a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TombstoneOutcome {
    /// The tombstone is written: the transaction can never commit.
    Written,
    /// A record was already there (returned as it was at the condition check): the
    /// transaction committed meanwhile, or another worker tombstoned it.
    Exists(OutboxRecord),
}

/// The result of trying to fence a transaction inside its entity (entity mode's request
/// path, docs/PROTOCOL.md section 11; `docs/ENTITY_MODE.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The item's fence mark is at or above the transaction and its tombstone record is
    /// written: the transaction can never commit, in either form, however late a request
    /// of it arrives.
    Fenced,
    /// The transaction committed into the item: its entry, as it was. An entry is proof
    /// of the commit even beside a tombstone record (one written without the fence).
    Committed(OutboxRecord),
    /// The transaction committed into the item and its messages went out: the item holds
    /// its sent mark ([`Store::settle_entry`]). Nothing is left to do.
    Dispatched,
    /// The transaction has a record already: committed in the transactional form or
    /// dispatched (pending or dispatched; an entry left in the item beside a dispatched
    /// record is the caller's to remove), or tombstoned before (no entry in the item; the
    /// mark is raised to it all the same, as a tombstone written without the fence does
    /// not stop a commit into the item).
    Recorded(OutboxRecord),
}

/// A message an in-order consumer keeps until it has applied the message's predecessor
/// (docs/PROTOCOL.md section 15, "Kept messages"): the delivery as it came, with what it
/// takes to process it again in whichever invocation applies the predecessor. It is an
/// item of the consumer's own (one per message, so a predecessor and its successors are
/// never one write), read and written whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptMessage {
    /// Where it is kept ([`crate::consumer::in_order::kept_key`]): the consumer's, the
    /// chain's, the entity's and the message's `seq`, so that every copy of one message
    /// is kept in one place.
    pub key: String,
    /// The message as delivered: its queue id, body, string attributes, FIFO group and
    /// trace header (its receipt is empty and its receive count 1: a kept message is
    /// acknowledged, and no queue holds it any more).
    pub delivery: super::Delivery,
    /// When it was kept.
    pub kept_at: Timestamp,
    /// When it expires (the consumer's retention from `kept_at`, which outlives every way
    /// its predecessor can still arrive): it reads as absent from then on.
    pub expires_at: Timestamp,
}

/// The table of business items and protocol records.
///
/// Reads are strongly consistent: they see every write acknowledged before they began.
/// Items whose TTL has passed read as absent, deleted or not.
#[async_trait]
pub trait Store: Send + Sync {
    /// Applies `request` atomically, or nothing of it.
    ///
    /// The outbox put succeeds only where no record exists for the transaction. If one
    /// does and it is this very record committed ([`OutboxRecord::is_own`]: a retried
    /// commit whose first request applied), the commit has happened and this returns
    /// `Ok`, whatever the other conditions say; another attempt's committed record is
    /// [`CommitError::Superseded`], a tombstone [`CommitError::Tombstoned`].
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError>;

    /// The producer this table is ([`crate::protocol::Producer`]): the name every message
    /// placed in the history of one of its entities carries, stamped with its position and
    /// stored with it, so that an in-order consumer never mixes its chains with another
    /// table's. Every process that writes the table must name it alike (a DynamoDB store
    /// names it by its table's name). The default names none, as versions before
    /// producers were named: a store that wraps another forwards it.
    fn producer(&self) -> Option<crate::protocol::Producer> {
        None
    }

    /// Whether [`Self::commit_native`] runs native actions. False unless a store says
    /// otherwise.
    fn runs_native_actions(&self) -> bool {
        false
    }

    /// Applies the application's native `actions` (first, in order: a cancellation
    /// names its index among them) and `request`, atomically, or nothing of them. A
    /// store that cannot run native actions answers [`CommitError::NativeUnsupported`]
    /// and writes nothing.
    async fn commit_native(&self, request: &CommitRequest, actions: &[NativeAction]) -> Result<(), CommitError> {
        if actions.is_empty() {
            self.commit(request).await
        } else {
            Err(CommitError::NativeUnsupported)
        }
    }

    /// Reads business items; absent ones are missing from the map.
    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError>;

    /// Reads keys with what each keeps across its lives ([`KeyRead`]), in the one read
    /// [`Self::get_items`] makes; a key never written is missing from the map (at version
    /// 0). The default answers [`StoreError::Unsupported`]: a transaction's staging then
    /// reads with [`Self::get_items`], and a create that read its key stays blind
    /// ([`ExpectedVersion::Absent`]). A store that wraps another forwards it.
    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        let _ = keys;
        Err(StoreError::Unsupported("reads of keys across their lives"))
    }

    /// Reads outbox records; absent (or expired) ones are missing from the map.
    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError>;

    /// Reads outbox records each on its own: the call fails only when nothing could be
    /// read, and a record that cannot be read (a split record with a part missing, an
    /// item that cannot be understood) is that record's error, so that it never fails
    /// its neighbours. Absent (or expired) ones are missing from the map. By default,
    /// [`Self::get_outboxes`] with every record read: a store that wraps another must
    /// forward this too, or lose the isolation.
    async fn get_outboxes_each(&self, txn_ids: &[TxnId]) -> Result<OutboxReads, StoreError> {
        Ok(self
            .get_outboxes(txn_ids)
            .await?
            .into_iter()
            .map(|(txn_id, record)| (txn_id, Ok(record)))
            .collect())
    }

    /// Reads an idempotency record.
    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// Puts `record` on its own where its key holds no live record: the answer of a
    /// request under an `Idempotency-Key` that committed nothing (a refusal its service
    /// decided), for its repeats. Returns the live record found instead, if any: the key's
    /// first answer, which stays.
    async fn put_idempotency(&self, record: &IdempotencyRecord) -> Result<Option<IdempotencyRecord>, StoreError> {
        let _ = record;
        Err(StoreError::Unsupported("idempotency records on their own"))
    }

    /// Puts a tombstone for `txn_id` where no record exists.
    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError>;

    /// Marks records `dispatched`: drops their messages and sets their TTL. Only for
    /// records read as pending, passed as read (so none can be a tombstone, and adapters
    /// that split large records know the parts to drop); marking twice is harmless.
    /// Returns one result per record, in order, so that one failure does not fail the
    /// others.
    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>>;

    /// Reads an item with its outbox entries, strongly consistent (entity mode). The
    /// default answers [`StoreError::Unsupported`]: a store that wraps another forwards it.
    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        let _ = key;
        Err(StoreError::Unsupported("the entity mode"))
    }

    /// Writes `commit` as one conditional write (entity mode): the item at
    /// `commit.expected`, holding no entry for the commit's transaction, gets the new
    /// data and the entry; its other entries stay as they are (a concurrent removal is
    /// never undone). If the entry is there already and is this very attempt's
    /// ([`OutboxRecord::is_own`]), the commit has happened: `Ok`. Another attempt's is
    /// [`CommitError::Superseded`], a fence mark at or above the transaction (where
    /// [`EntityCommit::checks_fence`]) [`CommitError::EntityFenced`], a version that does
    /// not match [`CommitError::VersionConflict`].
    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        let _ = commit;
        Err(CommitError::EntityUnsupported)
    }

    /// Writes a counter commit (entity mode, [`crate::counter`]) as one conditional write
    /// that reads nothing first: the additions within their bounds, the entry with its
    /// messages stamped from the item as it was, the version and the chain heads moved. An
    /// entry of this very attempt there already is `Ok` with the values now, as for
    /// [`Self::commit_entity`]; a bound refuses the change
    /// ([`crate::counter::CounterError::Refused`]).
    async fn commit_counter(
        &self,
        commit: &crate::counter::CounterCommit,
    ) -> Result<crate::counter::CounterCommitted, crate::counter::CounterError> {
        let _ = commit;
        Err(CommitError::EntityUnsupported.into())
    }

    /// Removes transaction `txn_id`'s entry from item `key`, touching nothing else: a
    /// change made meanwhile is kept, and an item deleted meanwhile is not brought back.
    /// Removing an entry that is not there is harmless.
    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        let _ = (key, txn_id);
        Err(StoreError::Unsupported("the entity mode"))
    }

    /// Fences transaction `txn_id` inside item `key`, in one atomic write, where the item
    /// holds no entry and no sent mark of it: the item's fence mark is raised to `txn_id`
    /// (left where it is at or above it already), and the transaction's record becomes a
    /// tombstone expiring at `expires_at`, where it has none (a mark moved out with a delete
    /// goes to that record, and a commit in the transactional form writes it). So neither form of its
    /// commit can apply any more: the mark never moves down and is never pruned, so no
    /// request of the transaction, however late, gets past it. A key without an item (never
    /// created, or deleted) keeps the mark in a vacant item, which reads as absent, which a
    /// create keeps, and which does not expire.
    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        let _ = (key, txn_id, now, expires_at);
        Err(StoreError::Unsupported("the entity mode"))
    }

    /// Settles transaction `txn_id`'s entry in item `key` once its messages went out, in
    /// one write where the item holds fewer than `max_marks` sent marks: the entry leaves
    /// the item, and the item keeps the transaction's sent mark, to be forgotten at
    /// `expires_at`, as the proof that it committed (what a fence, the control worker and a
    /// status read find). In an item that holds `max_marks` already, the proof goes to the
    /// transaction's record instead: the record is put dispatched, then the entry removed
    /// (two writes). Touches nothing else; an entry that is not there (settled already) is
    /// harmless. The default always takes the two writes, which is as safe and costs one
    /// write more: a store that wraps another forwards this to keep the one.
    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        let _ = max_marks;
        self.put_dispatched(txn_id, now, expires_at).await?;
        self.remove_entry(key, txn_id).await
    }

    /// Drops the sent marks of `forget` from item `key` ([`Self::settle_entry`]): marks
    /// past their time, whose proof is kept no longer (as a record's TTL ends it), to make
    /// room in a full item. Touches nothing else, and never brings back an item deleted
    /// meanwhile.
    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        let _ = (key, forget);
        Err(StoreError::Unsupported("the entity mode"))
    }

    /// Sets position `name` of key `key` to `applied` (an in-order consumer's, entity
    /// mode), where the key is as `expected` (an item at a version, or none at a version)
    /// and the position is below `applied` (or not there), in one conditional write that
    /// touches nothing else (the version stays): how a consumer records a message it
    /// applied without changing its entity. A position at or above `applied` already is
    /// `Ok` (set by another copy); a key not as expected is
    /// [`CommitError::VersionConflict`]. The default answers
    /// [`CommitError::EntityUnsupported`]: a store that wraps another forwards it.
    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        let _ = (key, expected, name, applied);
        Err(CommitError::EntityUnsupported)
    }

    /// Puts `txn_id`'s record `dispatched`, expiring at `expires_at`, whatever was there
    /// (entity mode's deduplication record, written once its messages went out).
    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        let _ = (txn_id, now, expires_at);
        Err(StoreError::Unsupported("the entity mode"))
    }

    /// Keeps `kept` (an in-order consumer's message that came before its predecessor), in
    /// one write that replaces whatever was kept under its key (another copy of the same
    /// message). The default answers [`StoreError::Unsupported`], and the consumer sends
    /// the message back to its queue instead: a store that wraps another forwards it.
    async fn keep_message(&self, kept: &KeptMessage) -> Result<(), StoreError> {
        let _ = kept;
        Err(StoreError::Unsupported("kept messages"))
    }

    /// Reads the message kept under `key`, strongly consistent; `None` where none is (or it
    /// expired). The default answers [`StoreError::Unsupported`].
    async fn get_kept(&self, key: &str) -> Result<Option<KeptMessage>, StoreError> {
        let _ = key;
        Err(StoreError::Unsupported("kept messages"))
    }

    /// Removes the message kept under `key` (applied, or a copy of one applied); removing
    /// one that is not there is harmless. The default answers [`StoreError::Unsupported`].
    async fn remove_kept(&self, key: &str) -> Result<(), StoreError> {
        let _ = key;
        Err(StoreError::Unsupported("kept messages"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_versions_give_the_next_version() {
        assert_eq!(ExpectedVersion::Absent.next(), None);
        assert_eq!(ExpectedVersion::AbsentAt(0).next(), Some(1));
        assert_eq!(ExpectedVersion::AbsentAt(3).next(), Some(4));
        assert_eq!(ExpectedVersion::Exactly(4).next(), Some(5));
    }

    #[test]
    fn an_expectation_holds_for_the_key_it_names() {
        use ExpectedVersion::*;
        for (expected, live, version, holds) in [
            (Absent, false, 0, true),
            (Absent, false, 7, true),
            (Absent, true, 7, false),
            (AbsentAt(7), false, 7, true),
            (AbsentAt(7), false, 0, false),
            (AbsentAt(7), true, 7, false),
            (Exactly(7), true, 7, true),
            (Exactly(7), false, 7, false),
            (Exactly(7), true, 8, false),
        ] {
            assert_eq!(expected.holds(live, version), holds, "{expected:?} at {live} {version}");
        }
    }
}
