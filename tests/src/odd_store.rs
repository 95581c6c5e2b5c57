//! A store that misbehaves on purpose around a real one: business reads that lag a
//! version behind or take their time, and commits that stall, never to apply or to
//! apply late (a request that reaches the table after its caller gave up) or whose reply
//! is lost, and tombstone writes that stall; commits and fences in entity mode alike.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox::ports::{
    CommitError, CommitRequest, EntityCommit, EntityItem, FenceOutcome, ItemKey, Store, StoreError, TombstoneOutcome,
    VersionedItem,
};
use outbox::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, TxnId};
use outbox::time::Timestamp;

/// What a commit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitStall {
    /// Applies at once.
    #[default]
    None,
    /// Never answers and never applies.
    Forever,
    /// Applies after this long (tokio time), whether or not its caller still waits.
    AppliesAfter(Duration),
    /// Applies, but the reply is lost: the caller gets "outcome unknown".
    ReplyLost,
    /// The first attempt times out without applying (the caller gets "outcome
    /// unknown"); every later one is refused for a version conflict on its first write.
    LostThenConflict,
}

/// The misbehaving store.
pub struct OddStore {
    /// The real store.
    pub inner: Arc<dyn Store>,
    /// Business reads report each item one version behind (every change loses its race).
    pub stale: bool,
    /// Business reads take this long (tokio time).
    pub read_delay: Duration,
    /// What commits do.
    pub commit: CommitStall,
    /// Tombstone writes never answer and never apply.
    pub tombstones_stall: bool,
    /// Commit calls so far.
    pub commits: std::sync::atomic::AtomicUsize,
}

impl OddStore {
    /// A store that behaves like `inner` until told otherwise.
    pub fn around(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            stale: false,
            read_delay: Duration::ZERO,
            commit: CommitStall::None,
            tombstones_stall: false,
            commits: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl OddStore {
    /// Runs a commit (`apply`, whose first item is `key`) as [`Self::commit`] says.
    async fn stalled<Fut>(
        &self,
        key: Option<ItemKey>,
        apply: impl Fn() -> Fut + Send + Sync + 'static,
    ) -> Result<(), CommitError>
    where
        Fut: std::future::Future<Output = Result<(), CommitError>> + Send + 'static,
    {
        let earlier = self.commits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match self.commit {
            CommitStall::None => apply().await,
            CommitStall::Forever => std::future::pending().await,
            CommitStall::AppliesAfter(delay) => {
                // A task of its own: dropping this call (a deadline) does not stop it.
                let applied = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    apply().await
                });
                applied.await.expect("the late commit ran")
            }
            CommitStall::ReplyLost => {
                apply().await?;
                Err(CommitError::Ambiguous("injected: the reply was lost".into()))
            }
            CommitStall::LostThenConflict if earlier == 0 => {
                Err(CommitError::Ambiguous("injected: timed out on its way".into()))
            }
            CommitStall::LostThenConflict => Err(CommitError::VersionConflict {
                key: key.expect("a commit that conflicts writes an item"),
            }),
        }
    }
}

#[async_trait]
impl Store for OddStore {
    fn producer(&self) -> Option<outbox::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let (inner, owned) = (self.inner.clone(), request.clone());
        self.stalled(request.writes.first().map(|write| write.key().clone()), move || {
            let (inner, request) = (inner.clone(), owned.clone());
            async move { inner.commit(&request).await }
        })
        .await
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        let (inner, owned) = (self.inner.clone(), commit.clone());
        self.stalled(Some(commit.key.clone()), move || {
            let (inner, commit) = (inner.clone(), owned.clone());
            async move { inner.commit_entity(&commit).await }
        })
        .await
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        tokio::time::sleep(self.read_delay).await;
        let mut entity = self.inner.get_entity(key).await?;
        if self.stale {
            entity.iter_mut().for_each(|entity| entity.item.version -= 1);
        }
        Ok(entity)
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.inner.remove_entry(key, txn_id).await
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
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
        self.inner.settle_entry(key, txn_id, now, expires_at, max_marks).await
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        self.inner.forget_marks(key, forget).await
    }

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        if self.tombstones_stall {
            return std::future::pending().await;
        }
        self.inner.fence_entity(key, txn_id, now, expires_at).await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        tokio::time::sleep(self.read_delay).await;
        let mut items = self.inner.get_items(keys).await?;
        if self.stale {
            items.values_mut().for_each(|item| item.version -= 1);
        }
        Ok(items)
    }

    async fn get_outboxes(&self, ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.inner.get_outboxes(ids).await
    }

    async fn get_outboxes_each(&self, ids: &[TxnId]) -> Result<outbox::ports::OutboxReads, StoreError> {
        self.inner.get_outboxes_each(ids).await
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        if self.tombstones_stall {
            return std::future::pending().await;
        }
        self.inner.put_tombstone(id, now, expires_at).await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }
}
