//! The ports of the simulation: the embedded ones, each call taking its modelled
//! latency in virtual time. A call's effect (a write applied, a message on its queue)
//! happens when its latency less the reply's transit has passed; the caller continues
//! when all of it has. The store also notes when each commit was acknowledged, and the
//! control queue wakes idle workers when a message arrives.

use outbox::ports::ExpectedVersion;
use outbox::protocol::Applied;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use outbox::ports::{
    CommitError, CommitRequest, ControlQueue, EntityCommit, EntityItem, EntryFailure, FenceOutcome, ItemKey, KeyRead,
    PublishError, Publisher, QueueError, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    ControlMessage, DestinationName, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutgoingMessage, TxnId,
};
use outbox::time::Timestamp;

use super::executor::{Signal, VirtualTime};
use super::model::{Call, Draws};

/// What every port of one run shares: virtual time, the latency draws, the workers'
/// wake-up signal, and what the ports observed.
pub struct Env {
    /// Virtual time.
    pub time: Arc<VirtualTime>,
    /// The latency draws.
    pub draws: Draws,
    /// Notified when a control message is sent or a batch acknowledged.
    pub signal: Signal,
    observed: Mutex<Observed>,
}

/// What the ports saw.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// When each transaction's commit was acknowledged to the request path.
    pub acks: BTreeMap<TxnId, Timestamp>,
    /// Transactions whose request crashed after its commit.
    pub crashed: BTreeSet<TxnId>,
}

impl Env {
    /// The shared state of a run.
    pub fn new(time: Arc<VirtualTime>, draws: Draws) -> Arc<Self> {
        Arc::new(Self {
            time,
            draws,
            signal: Signal::default(),
            observed: Mutex::new(Observed::default()),
        })
    }

    fn observed(&self) -> MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the ports saw so far.
    pub fn snapshot(&self) -> Observed {
        self.observed().clone()
    }

    /// Runs `effect` as an AWS `call`: after the request's share of its latency, then
    /// waits the reply's.
    async fn call<T>(&self, call: Call, effect: impl Future<Output = T>) -> T {
        let (before, after) = self.draws.split(call);
        self.time.sleep(before).await;
        let result = effect.await;
        self.time.sleep(after).await;
        result
    }
}

/// The table, slowed.
pub struct SimStore {
    /// The embedded store.
    pub inner: Arc<dyn Store>,
    /// The run.
    pub env: Arc<Env>,
}

#[async_trait]
impl Store for SimStore {
    fn producer(&self) -> Option<outbox::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let result = self.env.call(Call::Transact, self.inner.commit(request)).await;
        if result.is_ok() {
            let now = self.env.time.now();
            self.env.observed().acks.entry(request.txn_id).or_insert(now);
        }
        result
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.env.call(Call::Get, self.inner.get_items(keys)).await
    }

    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        self.env.call(Call::Get, self.inner.get_keys(keys)).await
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.env.call(Call::Get, self.inner.get_outboxes(txn_ids)).await
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.env.call(Call::Get, self.inner.get_idempotency(slot)).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.env
            .call(Call::Put, self.inner.put_tombstone(txn_id, now, expires_at))
            .await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.env
            .call(Call::Update, self.inner.mark_dispatched(records, expires_at))
            .await
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        self.env.call(Call::Get, self.inner.get_entity(key)).await
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        self.env
            .call(Call::Update, self.inner.keep_applied(key, expected, name, applied))
            .await
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        let result = self.env.call(Call::Update, self.inner.commit_entity(commit)).await;
        if result.is_ok() {
            let now = self.env.time.now();
            self.env.observed().acks.entry(commit.entry.txn_id).or_insert(now);
        }
        result
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.env.call(Call::Update, self.inner.remove_entry(key, txn_id)).await
    }

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        self.env
            .call(Call::Transact, self.inner.fence_entity(key, txn_id, now, expires_at))
            .await
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        self.env
            .call(Call::Put, self.inner.put_dispatched(txn_id, now, expires_at))
            .await
    }

    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        self.env
            .call(
                Call::Update,
                self.inner.settle_entry(key, txn_id, now, expires_at, max_marks),
            )
            .await
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        self.env.call(Call::Update, self.inner.forget_marks(key, forget)).await
    }
}

/// The control queue's sending side, slowed; a send wakes the idle workers.
pub struct SimControlQueue {
    /// The embedded control queue.
    pub inner: Arc<dyn ControlQueue>,
    /// The run.
    pub env: Arc<Env>,
}

#[async_trait]
impl ControlQueue for SimControlQueue {
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        let send = async {
            let result = self.inner.send(message, delay).await;
            self.env.signal.notify();
            result
        };
        self.env.call(Call::Send, send).await
    }
}

/// A destination publisher, slowed.
pub struct SimPublisher {
    /// The embedded publisher.
    pub inner: Arc<dyn Publisher>,
    /// The run.
    pub env: Arc<Env>,
}

#[async_trait]
impl Publisher for SimPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        self.env
            .call(Call::SendBatch, self.inner.send_batch(destination, messages))
            .await
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

/// The inline publisher of a request whose API process crashes after its commit: its
/// first publish never returns (the process is gone), and nothing is sent.
pub struct CrashingPublisher {
    /// The run.
    pub env: Arc<Env>,
}

#[async_trait]
impl Publisher for CrashingPublisher {
    async fn send_batch(
        &self,
        _destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        self.env
            .observed()
            .crashed
            .extend(messages.iter().map(|message| message.txn_id));
        std::future::pending().await
    }
}
