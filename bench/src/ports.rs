//! Latency-injecting wrappers around the ports: each waits as long as the AWS call it
//! stands for would take, then delegates to the embedded port, which does the real work
//! (conditions, versions, queues) in microseconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox::embedded::{EmbeddedQueue, QueueFault, SendRequest};
use outbox::ports::{
    CommitError, CommitRequest, ControlQueue, EntryFailure, ItemKey, NativeAction, PublishError, Publisher, QueueError,
    Store, StoreError, TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    ControlMessage, DestinationName, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutgoingMessage, TxnId,
};
use outbox::time::Timestamp;

use crate::latency::{Call, Delays};

/// A store whose every call first waits its DynamoDB latency. The latency is paid before
/// the call is applied: a reply's transit is not modelled apart from the request's, which
/// changes nothing for one caller waiting on both.
pub struct SlowStore {
    inner: Arc<dyn Store>,
    delays: Arc<Delays>,
}

impl SlowStore {
    /// `inner`, slowed by `delays`.
    pub fn new(inner: Arc<dyn Store>, delays: Arc<Delays>) -> Self {
        Self { inner, delays }
    }

    /// Stands for one conditional `PutItem` of a business item, outside any transaction:
    /// the write a service without an outbox would make. The store port has no such call
    /// (every business write goes through a commit with an outbox record), so this only
    /// waits the `PutItem` latency and writes nothing. What it leaves out is the embedded
    /// store's in-memory write, microseconds, which the zero-latency line of the report
    /// bounds.
    pub async fn simulated_conditional_put(&self) {
        self.delays.wait(Call::Put).await;
    }
}

#[async_trait]
impl Store for SlowStore {
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.delays.wait(Call::Transact).await;
        self.inner.commit(request).await
    }

    fn runs_native_actions(&self) -> bool {
        self.inner.runs_native_actions()
    }

    async fn commit_native(&self, request: &CommitRequest, actions: &[NativeAction]) -> Result<(), CommitError> {
        self.delays.wait(Call::Transact).await;
        self.inner.commit_native(request, actions).await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.delays.wait(Call::Get).await;
        self.inner.get_items(keys).await
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.delays.wait(Call::Get).await;
        self.inner.get_outboxes(txn_ids).await
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.delays.wait(Call::Get).await;
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.delays.wait(Call::Put).await;
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        // The DynamoDB adapter marks any number of records in one BatchWriteItem.
        self.delays.wait(Call::Update).await;
        self.inner.mark_dispatched(records, expires_at).await
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
