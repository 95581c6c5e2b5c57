//! The control path for transactions in entity mode, on the embedded backend: an entry
//! in the entity is dispatched, a fence goes into the entity after the window, and a
//! record found first is handled as for any transaction.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{ControlOutcome, ControlPath, FENCE_LIFETIME};
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, ControlDelivery, EntityCommit, ExpectedVersion, ItemKey, Store,
};
use crate::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use crate::settings::Timing;
use crate::time::Timestamp;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    control: ControlPath,
    key: ItemKey,
}

/// An order `ORDER#1` written in the transactional mode (version 1).
async fn world() -> World {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let key: ItemKey = "ORDER#1".parse().unwrap();
    let txn_id = TxnId::new_v7();
    let create = CommitRequest {
        txn_id,
        writes: vec![BusinessWrite::Put {
            key: key.clone(),
            data: json!({"lines": 1}),
            expected: ExpectedVersion::Absent,
        }],
        outbox: OutboxRecord::committed(txn_id, vec![], clock.now(), clock.now().plus(Duration::from_secs(60))),
        idempotency: None,
    };
    backend.store.commit(&create).await.unwrap();
    World {
        clock,
        backend,
        control,
        key,
    }
}

/// `control`, delivered once to `path`: its outcome.
async fn handle_with(path: &ControlPath, control: ControlMessage) -> ControlOutcome {
    let delivery = ControlDelivery {
        message_id: "m-1".into(),
        receipt: "r-1".into(),
        body: control.encode(),
        receive_count: 1,
    };
    path.handle(&delivery).await.result.unwrap()
}

impl World {
    /// T's commit into the order, as the request path writes it.
    fn commit(&self, txn_id: TxnId) -> EntityCommit {
        let message = Message::json(events(), &json!({"type": "LineAdded"})).unwrap();
        let now = self.clock.now();
        EntityCommit {
            key: self.key.clone(),
            data: json!({"lines": 2}),
            expected: ExpectedVersion::Exactly(1),
            entry: OutboxRecord::committed(
                txn_id,
                vec![OutgoingMessage::new(txn_id, 0, message)],
                now,
                now.plus(Duration::from_secs(60)),
            ),
        }
    }

    async fn handle(&self, control: ControlMessage) -> ControlOutcome {
        handle_with(&self.control, control).await
    }

    /// `control` handled by a control path whose store lets the request path do
    /// `meanwhile` just before the worker's fence.
    async fn handle_meanwhile(&self, control: ControlMessage, meanwhile: Meanwhile) -> ControlOutcome {
        let store = Arc::new(SettledFirst {
            inner: self.backend.store.clone(),
            meanwhile,
            settled: Default::default(),
        });
        let ports = super::ControlPorts {
            store,
            ..self.backend.control_ports(self.clock.clone())
        };
        handle_with(&ControlPath::new(ports, Timing::default()), control).await
    }

    async fn handle_delivery(&self, delivery: &crate::embedded::Received) -> ControlOutcome {
        let delivery = ControlDelivery {
            message_id: delivery.message_id.clone(),
            receipt: delivery.receipt.clone(),
            body: delivery.body.clone(),
            receive_count: delivery.receive_count,
        };
        self.control.handle(&delivery).await.result.unwrap()
    }

    /// The next control message, the clock moved to when it becomes visible; acknowledged
    /// as the worker would once handled. `None` when the queue is empty.
    async fn next_control(&self) -> Option<crate::embedded::Received> {
        let queue = self.backend.control_queue.queue();
        loop {
            if let Some(received) = queue.receive(1).pop() {
                queue.delete(&received.receipt);
                return Some(received);
            }
            let visible_at = queue.next_visible_at()?;
            self.clock.set(visible_at);
        }
    }

    /// T's fence in the order, if there.
    async fn fence(&self, txn_id: TxnId) -> Option<OutboxRecord> {
        let entity = self.backend.store.get_entity(&self.key).await.unwrap()?;
        let fence = entity.entries.get(&txn_id).cloned()?;
        assert_eq!(fence.state, OutboxState::Tombstone);
        Some(fence)
    }

    async fn record(&self, txn_id: TxnId) -> Option<OutboxRecord> {
        self.backend
            .store
            .get_outboxes(&[txn_id])
            .await
            .unwrap()
            .remove(&txn_id)
    }
}

#[tokio::test]
async fn an_entry_in_the_entity_is_published_then_recorded_then_removed() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world.backend.store.commit_entity(&world.commit(txn_id)).await.unwrap();
    let outcome = world.handle(control.clone()).await;
    assert!(
        matches!(outcome, ControlOutcome::Dispatched { messages: 1, .. }),
        "{outcome:?}"
    );
    let published = world.backend.publisher.queue(&events()).unwrap().receive(10);
    assert_eq!(published.len(), 1);
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Dispatched);
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert!(entity.entries.is_empty(), "the entry is removed");
    assert_eq!(entity.item.data, json!({"lines": 2}));
    // A copy of the control message: the record speaks for the transaction now.
    let again = world.handle(control).await;
    assert_eq!(
        again,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
}

#[tokio::test]
async fn within_the_window_no_entry_means_a_later_check() {
    let world = world().await;
    let control = ControlMessage::first(TxnId::new_v7(), world.clock.now()).with_entity(world.key.clone());
    let outcome = world.handle(control).await;
    assert!(
        matches!(outcome, ControlOutcome::Deferred { next_attempt: 2, .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn past_the_window_the_fence_goes_into_the_entity_and_a_late_commit_fails() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    assert_eq!(world.handle(control.clone()).await, ControlOutcome::Tombstoned);
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert_eq!(entity.entries[&txn_id].state, OutboxState::Tombstone, "the fence");
    assert_eq!(entity.item.version, 1, "the order itself unchanged");
    match world.backend.store.commit_entity(&world.commit(txn_id)).await {
        Err(CommitError::Tombstoned { txn_id: fenced }) => assert_eq!(fenced, txn_id),
        other => panic!("a late commit after the fence: {other:?}"),
    }
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
}

/// A fence is kept until no request of its transaction can reach the table (its prune
/// time, [`FENCE_LIFETIME`] after it was written), by control messages the worker sends
/// itself, then removed; its tombstone record stays, and the order can be deleted.
#[tokio::test]
async fn a_fence_is_kept_until_due_then_pruned_by_the_re_checks_the_worker_schedules() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    let fenced_at = world.clock.now();
    assert_eq!(world.handle(control).await, ControlOutcome::Tombstoned);
    let mut outcomes = Vec::new();
    // Each re-check arrives when the queue delivers it; its handling schedules the next.
    while let Some(delivery) = world.next_control().await {
        let outcome = world.handle_delivery(&delivery).await;
        let fence = world.fence(txn_id).await;
        if world.clock.now() < fenced_at.plus(FENCE_LIFETIME) {
            assert!(fence.is_some(), "the fence is kept before it is due ({outcome:?})");
        }
        outcomes.push(outcome);
        assert!(outcomes.len() < 10, "the re-checks end: {outcomes:?}");
    }
    assert_eq!(
        outcomes,
        vec![
            ControlOutcome::FenceKept {
                next_attempt: 3,
                delay: Duration::from_secs(300)
            },
            ControlOutcome::FencePruned,
        ],
        "a first re-check at SQS's longest delay (15 min), then the rest (5), then the pruning"
    );
    assert!(world.clock.now() >= fenced_at.plus(FENCE_LIFETIME));
    assert!(world.fence(txn_id).await.is_none(), "the fence is pruned");
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
    // A copy of a re-check, after the pruning: nothing to do.
    let copy = ControlMessage::first(txn_id, fenced_at).with_entity(world.key.clone());
    assert_eq!(
        world.handle(copy).await,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }
    );
    // With its map empty again, the order can be deleted.
    let delete_id = TxnId::new_v7();
    let now = world.clock.now();
    let delete = CommitRequest {
        txn_id: delete_id,
        writes: vec![BusinessWrite::Delete {
            key: world.key.clone(),
            version: 1,
        }],
        outbox: OutboxRecord::committed(delete_id, vec![], now, now.plus(Duration::from_secs(60))),
        idempotency: None,
    };
    world.backend.store.commit(&delete).await.unwrap();
}

/// The request path's settling fence (an abandoned entity-mode transaction) is pruned by
/// the transaction's own control message, re-scheduled until the fence is due.
#[tokio::test]
async fn a_settling_fence_is_pruned_by_the_transactions_control_message() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    let now = world.clock.now();
    let outcome = world
        .backend
        .store
        .fence_entity(
            &world.key,
            txn_id,
            now,
            now.plus(Timing::default().retention),
            now.plus(FENCE_LIFETIME),
        )
        .await
        .unwrap();
    assert_eq!(outcome, crate::ports::FenceOutcome::Fenced);
    world.clock.advance(Duration::from_secs(1));
    let kept = world.handle(control).await;
    assert_eq!(
        kept,
        ControlOutcome::FenceKept {
            next_attempt: 2,
            delay: Duration::from_secs(900)
        }
    );
    let mut last = kept;
    while let Some(delivery) = world.next_control().await {
        last = world.handle_delivery(&delivery).await;
    }
    assert_eq!(last, ControlOutcome::FencePruned);
    assert!(world.clock.now() >= now.plus(FENCE_LIFETIME));
    assert!(world.fence(txn_id).await.is_none());
}

/// Past the window, an entry already in the entity is the transaction's commit: it is
/// dispatched, never fenced.
#[tokio::test]
async fn past_the_window_an_entry_is_dispatched_not_fenced() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world.backend.store.commit_entity(&world.commit(txn_id)).await.unwrap();
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    let handled = world.handle(control).await;
    assert!(
        matches!(handled, ControlOutcome::Dispatched { messages: 1, .. }),
        "{handled:?}"
    );
    assert!(world
        .backend
        .store
        .get_entity(&world.key)
        .await
        .unwrap()
        .unwrap()
        .entries
        .is_empty());
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Dispatched);
}

/// The request path recorded the transaction dispatched but failed to remove its entry:
/// the worker removes it.
#[tokio::test]
async fn an_entry_left_beside_its_dispatched_record_is_removed() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world.backend.store.commit_entity(&world.commit(txn_id)).await.unwrap();
    let now = world.clock.now();
    world
        .backend
        .store
        .put_dispatched(txn_id, now, now.plus(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        world.handle(control).await,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert!(entity.entries.is_empty(), "the leftover entry is removed");
    assert!(
        world.backend.publisher.queue(&events()).unwrap().receive(10).is_empty(),
        "nothing published again"
    );
}

/// What the request path does between the worker's reads and its fence.
enum Meanwhile {
    /// It settles T with its own fence, pruned at this time.
    Fences(Timestamp),
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
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.inner.commit(request).await
    }

    async fn get_items(
        &self,
        keys: &[ItemKey],
    ) -> Result<std::collections::BTreeMap<ItemKey, crate::ports::VersionedItem>, crate::ports::StoreError> {
        self.inner.get_items(keys).await
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

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        prune_at: Timestamp,
    ) -> Result<crate::ports::FenceOutcome, crate::ports::StoreError> {
        if !self.settled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            match &self.meanwhile {
                Meanwhile::Fences(prune_at) => {
                    let settled = self.inner.fence_entity(key, txn_id, now, expires_at, *prune_at).await?;
                    assert_eq!(settled, crate::ports::FenceOutcome::Fenced);
                }
                Meanwhile::CommitsAndRecords(commit) => {
                    self.inner.commit_entity(commit).await.expect("the late commit applies");
                    self.inner.put_dispatched(txn_id, now, expires_at).await?;
                }
            }
        }
        self.inner.fence_entity(key, txn_id, now, expires_at, prune_at).await
    }
}

/// Past the window the worker reads no record, and the request path's settling fence
/// lands before the worker's own: the worker's fence finds the tombstone record, and the
/// fence in the entity (the request path's) is still this control message's to prune. It
/// is kept until due, then pruned (found by the simulation: answered "already done", the
/// fence stayed in the entity for good).
#[tokio::test]
async fn a_settling_fence_landing_before_the_workers_is_pruned_by_the_worker() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    let settled_at = world.clock.now();
    let outcome = world
        .handle_meanwhile(control, Meanwhile::Fences(settled_at.plus(FENCE_LIFETIME)))
        .await;
    assert!(
        matches!(outcome, ControlOutcome::FenceKept { .. }),
        "the fence is to be pruned later: {outcome:?}"
    );
    assert!(world.fence(txn_id).await.is_some());
    let mut last = outcome;
    while let Some(delivery) = world.next_control().await {
        last = world.handle_delivery(&delivery).await;
    }
    assert_eq!(last, ControlOutcome::FencePruned);
    assert!(world.clock.now() >= settled_at.plus(FENCE_LIFETIME));
    assert!(world.fence(txn_id).await.is_none());
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
    let outcome = world
        .handle_meanwhile(control, Meanwhile::CommitsAndRecords(Box::new(commit)))
        .await;
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
