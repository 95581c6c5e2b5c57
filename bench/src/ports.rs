//! Latency-injecting wrappers around the ports: each waits as long as the AWS call it
//! stands for would take, then delegates to the embedded port, which does the real work
//! (conditions, versions, queues) in microseconds.

use outbox::ports::ExpectedVersion;
use outbox::protocol::Applied;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox::embedded::{EmbeddedQueue, QueueFault, SendRequest};
use outbox::ports::{
    CommitError, CommitRequest, ControlQueue, EntityCommit, EntityItem, EntryFailure, FenceOutcome, ItemKey, KeyRead,
    NativeAction, PublishError, Publisher, QueueError, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    ControlMessage, DestinationName, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutgoingMessage, TxnId,
};
use outbox::time::Timestamp;

use crate::latency::{Call, Delays};

/// A store operation, as [`SlowStore`] counts them: one per method of the store port it
/// forwards, so that a run can show which form its commits took (a commit in entity mode
/// that fell back to the transactional form is a `commit`, not a `commit_entity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StoreOp {
    /// `commit`: `TransactWriteItems`.
    Commit,
    /// `commit_native`: `TransactWriteItems`.
    CommitNative,
    /// `get_items`, and `get_keys` (the same read, with the key's version across its
    /// lives): `BatchGetItem`.
    GetItems,
    /// `get_outboxes`: `BatchGetItem`.
    GetOutboxes,
    /// `get_idempotency`: `GetItem`.
    GetIdempotency,
    /// `put_tombstone`: `PutItem`.
    PutTombstone,
    /// `mark_dispatched`: `BatchWriteItem`.
    MarkDispatched,
    /// `get_entity` (entity mode): `GetItem`.
    GetEntity,
    /// `commit_entity` (entity mode): one conditional `UpdateItem` of the item.
    CommitEntity,
    /// `remove_entry` (entity mode): `UpdateItem`.
    RemoveEntry,
    /// `fence_entity` (entity mode): `TransactWriteItems`.
    FenceEntity,
    /// `put_dispatched` (entity mode): `PutItem` of the dispatched record.
    PutDispatched,
    /// `settle_entry` (entity mode): one `UpdateItem`, the entry out and its sent mark in.
    SettleEntry,
    /// `forget_marks` (entity mode): `UpdateItem`.
    ForgetMarks,
}

impl StoreOp {
    /// Every operation, in the order printed.
    pub const ALL: [StoreOp; 14] = [
        StoreOp::Commit,
        StoreOp::CommitNative,
        StoreOp::GetItems,
        StoreOp::GetOutboxes,
        StoreOp::GetIdempotency,
        StoreOp::PutTombstone,
        StoreOp::MarkDispatched,
        StoreOp::GetEntity,
        StoreOp::CommitEntity,
        StoreOp::RemoveEntry,
        StoreOp::FenceEntity,
        StoreOp::PutDispatched,
        StoreOp::SettleEntry,
        StoreOp::ForgetMarks,
    ];

    /// The store port's method.
    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Commit => "commit",
            StoreOp::CommitNative => "commit_native",
            StoreOp::GetItems => "get_items",
            StoreOp::GetOutboxes => "get_outboxes",
            StoreOp::GetIdempotency => "get_idempotency",
            StoreOp::PutTombstone => "put_tombstone",
            StoreOp::MarkDispatched => "mark_dispatched",
            StoreOp::GetEntity => "get_entity",
            StoreOp::CommitEntity => "commit_entity",
            StoreOp::RemoveEntry => "remove_entry",
            StoreOp::FenceEntity => "fence_entity",
            StoreOp::PutDispatched => "put_dispatched",
            StoreOp::SettleEntry => "settle_entry",
            StoreOp::ForgetMarks => "forget_marks",
        }
    }

    /// The modelled call whose latency it waits.
    pub fn call(self) -> Call {
        match self {
            StoreOp::Commit | StoreOp::CommitNative | StoreOp::FenceEntity => Call::Transact,
            StoreOp::GetItems | StoreOp::GetOutboxes | StoreOp::GetIdempotency | StoreOp::GetEntity => Call::Get,
            StoreOp::PutTombstone | StoreOp::PutDispatched => Call::Put,
            StoreOp::MarkDispatched
            | StoreOp::CommitEntity
            | StoreOp::RemoveEntry
            | StoreOp::SettleEntry
            | StoreOp::ForgetMarks => Call::Update,
        }
    }

    fn index(self) -> usize {
        StoreOp::ALL.iter().position(|op| *op == self).expect("listed")
    }
}

/// How many calls of each store operation a [`SlowStore`] forwarded.
pub type StoreCalls = BTreeMap<StoreOp, usize>;

/// A store whose every call first waits its DynamoDB latency, and is counted by
/// operation. The latency is paid before the call is applied: a reply's transit is not
/// modelled apart from the request's, which changes nothing for one caller waiting on
/// both.
///
/// Every method of the store port is forwarded, the entity mode's included (their
/// defaults answer "unsupported", which would make an entity-mode commit fail rather
/// than fall back). `commit_entity` waits an `UpdateItem`'s latency: on DynamoDB it is one
/// conditional `UpdateItem` of an item that already holds its `outbox` map. The first
/// change of an item written in the transactional form (no map yet) takes a second
/// `UpdateItem` there (the first one's condition fails); the embedded store makes no such
/// distinction, so this models the steady state.
pub struct SlowStore {
    inner: Arc<dyn Store>,
    delays: Arc<Delays>,
    calls: [AtomicUsize; StoreOp::ALL.len()],
}

impl SlowStore {
    /// `inner`, slowed by `delays`.
    pub fn new(inner: Arc<dyn Store>, delays: Arc<Delays>) -> Self {
        Self {
            inner,
            delays,
            calls: Default::default(),
        }
    }

    /// Stands for one conditional `PutItem` of a business item, outside any transaction:
    /// the write a service without an outbox would make. The store port has no such call
    /// (every business write goes through a commit with an outbox record), so this only
    /// waits the `PutItem` latency and writes nothing. What it leaves out is the embedded
    /// store's in-memory write, microseconds, which the zero-latency line of the report
    /// bounds. Not counted among the port's calls.
    pub async fn simulated_conditional_put(&self) {
        self.delays.wait(Call::Put).await;
    }

    /// The calls forwarded so far, by operation (operations never called left out).
    pub fn calls(&self) -> StoreCalls {
        StoreOp::ALL
            .into_iter()
            .map(|op| (op, self.calls[op.index()].load(Ordering::Relaxed)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// Counts one `op` and waits its latency.
    async fn call(&self, op: StoreOp) {
        self.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        self.delays.wait(op.call()).await;
    }
}

#[async_trait]
impl Store for SlowStore {
    fn producer(&self) -> Option<outbox::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.call(StoreOp::Commit).await;
        self.inner.commit(request).await
    }

    fn runs_native_actions(&self) -> bool {
        self.inner.runs_native_actions()
    }

    async fn commit_native(&self, request: &CommitRequest, actions: &[NativeAction]) -> Result<(), CommitError> {
        self.call(StoreOp::CommitNative).await;
        self.inner.commit_native(request, actions).await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.call(StoreOp::GetItems).await;
        self.inner.get_items(keys).await
    }

    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        self.call(StoreOp::GetItems).await;
        self.inner.get_keys(keys).await
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.call(StoreOp::GetOutboxes).await;
        self.inner.get_outboxes(txn_ids).await
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.call(StoreOp::GetIdempotency).await;
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.call(StoreOp::PutTombstone).await;
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        // The DynamoDB adapter marks any number of records in one BatchWriteItem.
        self.call(StoreOp::MarkDispatched).await;
        self.inner.mark_dispatched(records, expires_at).await
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        self.call(StoreOp::GetEntity).await;
        self.inner.get_entity(key).await
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        // One conditional UpdateItem, as an entity commit.
        self.call(StoreOp::CommitEntity).await;
        self.inner.keep_applied(key, expected, name, applied).await
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        // One conditional UpdateItem, not a transaction.
        self.call(StoreOp::CommitEntity).await;
        self.inner.commit_entity(commit).await
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.call(StoreOp::RemoveEntry).await;
        self.inner.remove_entry(key, txn_id).await
    }

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        // The tombstone record and the fence in the item: one TransactWriteItems.
        self.call(StoreOp::FenceEntity).await;
        self.inner.fence_entity(key, txn_id, now, expires_at).await
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        self.call(StoreOp::PutDispatched).await;
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }

    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        // One UpdateItem (a full item's two writes are not modelled).
        self.call(StoreOp::SettleEntry).await;
        self.inner.settle_entry(key, txn_id, now, expires_at, max_marks).await
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        self.call(StoreOp::ForgetMarks).await;
        self.inner.forget_marks(key, forget).await
    }
}

/// A control queue whose sends first wait the `SendMessage` latency.
pub struct SlowControlQueue {
    inner: Arc<dyn ControlQueue>,
    delays: Arc<Delays>,
}

impl SlowControlQueue {
    /// `inner`, slowed by `delays`.
    pub fn new(inner: Arc<dyn ControlQueue>, delays: Arc<Delays>) -> Self {
        Self { inner, delays }
    }
}

#[async_trait]
impl ControlQueue for SlowControlQueue {
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        self.delays.wait(Call::Send).await;
        self.inner.send(message, delay).await
    }
}

/// A publisher whose batches first wait the `SendMessageBatch` latency.
pub struct SlowPublisher {
    inner: Arc<dyn Publisher>,
    delays: Arc<Delays>,
}

impl SlowPublisher {
    /// `inner`, slowed by `delays`.
    pub fn new(inner: Arc<dyn Publisher>, delays: Arc<Delays>) -> Self {
        Self { inner, delays }
    }
}

#[async_trait]
impl Publisher for SlowPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        self.delays.wait(Call::SendBatch).await;
        self.inner.send_batch(destination, messages).await
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

/// One destination queue written directly with `SendMessage`, as a service without an
/// outbox would publish its event (the naive dual write).
pub struct SlowQueue {
    inner: Arc<EmbeddedQueue>,
    delays: Arc<Delays>,
}

impl SlowQueue {
    /// `inner`, slowed by `delays`.
    pub fn new(inner: Arc<EmbeddedQueue>, delays: Arc<Delays>) -> Self {
        Self { inner, delays }
    }

    /// Sends one message, returning the queue's id for it.
    pub async fn send_message(&self, request: SendRequest) -> Result<String, QueueFault> {
        self.delays.wait(Call::Send).await;
        self.inner.send(request)
    }
}
