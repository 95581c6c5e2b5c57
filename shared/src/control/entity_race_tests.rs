//! The control path for transactions in entity mode, racing the request path: its
//! settling fence or a late commit lands between the worker's reads and its own fence.

use std::sync::Arc;
use std::time::Duration;

use super::entity_tests::{handle_with, world, World};
use super::{ControlOutcome, ControlPath};
use crate::ports::{Clock, CommitError, CommitRequest, EntityCommit, ItemKey, Store};
use crate::protocol::{ControlMessage, OutboxRecord, OutboxState, TxnId};
use crate::settings::Timing;
use crate::time::Timestamp;

/// `control` handled by a control path whose store lets the request path do
/// `meanwhile` just before the worker's fence.
async fn handle_meanwhile(world: &World, control: ControlMessage, meanwhile: Meanwhile) -> ControlOutcome {
    let store = Arc::new(SettledFirst {
        inner: world.backend.store.clone(),
        meanwhile,
        settled: Default::default(),
    });
    let ports = super::ControlPorts {
        store,
        ..world.backend.control_ports(world.clock.clone())
    };
    handle_with(&ControlPath::new(ports, Timing::default()), control).await
}

/// What the request path does between the worker's reads and its fence.
enum Meanwhile {
    /// It settles T with its own fence.
    Fences,
    /// T's commit lands (late) and inline dispatch records it dispatched, but the
    /// entry's removal fails.
    CommitsAndRecords(Box<EntityCommit>),
}

/// A store whose first `fence_entity` call is preceded by what the request path does
/// meanwhile: the worker read no record and no entry, then the request path acted, then
/// the worker's own fence finds T's record.
struct SettledFirst {
    inner: Arc<crate::embedded::EmbeddedStore>,
    meanwhile: Meanwhile,
    settled: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Store for SettledFirst {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.inner.commit(request).await
    }

    async fn get_items(
        &self,
        keys: &[ItemKey],
    ) -> Result<std::collections::BTreeMap<ItemKey, crate::ports::VersionedItem>, crate::ports::StoreError> {
        self.inner.get_items(keys).await
    }

    async fn get_keys(
        &self,
        keys: &[ItemKey],
    ) -> Result<std::collections::BTreeMap<ItemKey, crate::ports::KeyRead>, crate::ports::StoreError> {
        self.inner.get_keys(keys).await
    }
    async fn get_outboxes(
        &self,
        txn_ids: &[TxnId],
    ) -> Result<std::collections::BTreeMap<TxnId, OutboxRecord>, crate::ports::StoreError> {
        self.inner.get_outboxes(txn_ids).await
    }

    async fn get_idempotency(
        &self,
        slot: &crate::protocol::IdempotencySlot,
    ) -> Result<Option<crate::protocol::IdempotencyRecord>, crate::ports::StoreError> {
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<crate::ports::TombstoneOutcome, crate::ports::StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }

    async fn mark_dispatched(
        &self,
        records: &[OutboxRecord],
        expires_at: Timestamp,
    ) -> Vec<Result<(), crate::ports::StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<crate::ports::EntityItem>, crate::ports::StoreError> {
        self.inner.get_entity(key).await
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), crate::ports::StoreError> {
        self.inner.remove_entry(key, txn_id).await
    }

    async fn put_dispatched(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<(), crate::ports::StoreError> {
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<crate::ports::FenceOutcome, crate::ports::StoreError> {
        if !self.settled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            match &self.meanwhile {
                Meanwhile::Fences => {
                    let settled = self.inner.fence_entity(key, txn_id, now, expires_at).await?;
                    assert_eq!(settled, crate::ports::FenceOutcome::Fenced);
                }
                Meanwhile::CommitsAndRecords(commit) => {
                    self.inner.commit_entity(commit).await.expect("the late commit applies");
                    self.inner.put_dispatched(txn_id, now, expires_at).await?;
                }
            }
        }
        self.inner.fence_entity(key, txn_id, now, expires_at).await
    }
}

/// Past the window the worker reads no record, and the request path's settling fence
/// lands before the worker's own: the worker's fence finds the tombstone record, and the
/// transaction is settled.
#[tokio::test]
async fn a_settling_fence_landing_before_the_workers_settles_it() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    let outcome = handle_meanwhile(&world, control, Meanwhile::Fences).await;
    assert_eq!(
        outcome,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }
    );
    assert_eq!(world.fence().await, Some(txn_id));
    assert!(world.backend.control_queue.queue().next_visible_at().is_none());
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
}

/// Past the window the worker reads no record and no entry; meanwhile T's commit lands
/// late, inline dispatch publishes it and records it dispatched, and its removal of the
/// entry fails. The worker's fence then finds the dispatched record: the entry left in
/// the entity is removed, as when the record is read first (found in review: it was
/// acknowledged "already done" and the entry stayed in the entity for good).
#[tokio::test]
async fn a_dispatched_record_found_by_the_workers_fence_has_its_entry_removed() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    let commit = world.commit(txn_id);
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    let outcome = handle_meanwhile(&world, control, Meanwhile::CommitsAndRecords(Box::new(commit))).await;
    assert_eq!(
        outcome,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert!(
        entity.entries.is_empty(),
        "the entry left by the failed removal is removed: {:?}",
        entity.entries
    );
    assert_eq!(entity.item.version, 2, "the late commit stays");
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Dispatched);
}
