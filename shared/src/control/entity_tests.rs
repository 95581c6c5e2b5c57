//! The control path for transactions in entity mode, on the embedded backend: an entry
//! in the entity is dispatched, a fence raises the entity's fence mark after the window,
//! and a record found first is handled as for any transaction.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{ControlOutcome, ControlPath, MAX_ATTEMPTS};
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, ControlDelivery, EntityCommit, ExpectedVersion, ItemKey, Store,
};
use crate::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use crate::settings::Timing;
use crate::time::Timestamp;

pub(super) fn events() -> DestinationName {
    "events".parse().unwrap()
}

pub(super) struct World {
    pub(super) clock: Arc<ManualClock>,
    pub(super) backend: EmbeddedBackend,
    pub(super) control: ControlPath,
    pub(super) key: ItemKey,
}

/// An order `ORDER#1` written in the transactional mode (version 1).
pub(super) async fn world() -> World {
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
pub(super) async fn handle_with(path: &ControlPath, control: ControlMessage) -> ControlOutcome {
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
    pub(super) fn commit(&self, txn_id: TxnId) -> EntityCommit {
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
            checks_fence: true,
            applied: None,
        }
    }

    pub(super) async fn handle(&self, control: ControlMessage) -> ControlOutcome {
        handle_with(&self.control, control).await
    }

    /// The order's fence mark.
    pub(super) async fn fence(&self) -> Option<TxnId> {
        self.backend.store.get_entity(&self.key).await.unwrap().unwrap().fence
    }

    /// A commit of the order in the transactional form (`writes` on it), by `txn_id`.
    pub(super) async fn commit_transactional(&self, txn_id: TxnId, write: BusinessWrite) -> Result<(), CommitError> {
        let now = self.clock.now();
        let request = CommitRequest {
            txn_id,
            writes: vec![write],
            outbox: OutboxRecord::committed(txn_id, vec![], now, now.plus(Duration::from_secs(60))),
            idempotency: None,
        };
        self.backend.store.commit(&request).await
    }

    pub(super) async fn record(&self, txn_id: TxnId) -> Option<OutboxRecord> {
        self.backend
            .store
            .get_outboxes(&[txn_id])
            .await
            .unwrap()
            .remove(&txn_id)
    }
}

#[tokio::test]
async fn an_entry_in_the_entity_is_published_then_settled_into_a_sent_mark() {
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
    assert!(world.record(txn_id).await.is_none(), "no record: one write settles it");
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert!(entity.entries.is_empty(), "the entry is removed");
    assert!(entity.sent.contains_key(&txn_id), "its sent mark is its proof");
    assert_eq!(entity.item.data, json!({"lines": 2}));
    // A copy of the control message: the mark speaks for the transaction now.
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
async fn past_the_window_the_fence_mark_blocks_a_late_commit_however_late() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    assert_eq!(world.handle(control.clone()).await, ControlOutcome::Tombstoned);
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert_eq!(entity.fence, Some(txn_id), "the fence mark");
    assert!(entity.entries.is_empty(), "no slot per transaction");
    assert_eq!(entity.item.version, 1, "the order itself unchanged");
    assert!(
        world.backend.control_queue.queue().next_visible_at().is_none(),
        "nothing scheduled: there is nothing to prune"
    );
    // A request of T arriving a year later, its tombstone record long expired: the mark
    // still refuses it, whatever any clock says.
    world.clock.advance(Duration::from_secs(365 * 24 * 3600));
    assert!(world.record(txn_id).await.is_none(), "the tombstone record expired");
    match world.backend.store.commit_entity(&world.commit(txn_id)).await {
        Err(CommitError::EntityFenced { txn_id: fenced }) => assert_eq!(fenced, txn_id),
        other => panic!("a late commit after the fence: {other:?}"),
    }
    assert_eq!(world.fence().await, Some(txn_id));
}

/// The worker fences once `MAX_ATTEMPTS` checks are used up, even inside a long window:
/// a commit of the transaction coming later, still inside its window, is refused.
#[tokio::test]
async fn a_fence_inside_a_long_window_blocks_a_slow_commit() {
    let world = world().await;
    let timing = Timing {
        max_commit_duration: Duration::from_secs(3600),
        ..Timing::default()
    };
    let control_path = ControlPath::new(world.backend.control_ports(world.clock.clone()), timing);
    let txn_id = TxnId::new_v7();
    let mut control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    while control.attempt < MAX_ATTEMPTS {
        control = control.next_attempt();
    }
    world.clock.advance(Duration::from_secs(60));
    assert_eq!(handle_with(&control_path, control).await, ControlOutcome::Tombstoned);
    world.clock.advance(Duration::from_secs(1800));
    assert!(matches!(
        world.backend.store.commit_entity(&world.commit(txn_id)).await,
        Err(CommitError::EntityFenced { .. })
    ));
}

/// Deleted and created again: the order's fence mark stays with its key (a vacant item),
/// so a late commit of a transaction fenced before the delete fails on the new order too,
/// even when that order reached the version the commit expects.
#[tokio::test]
async fn a_deleted_and_recreated_item_keeps_its_fence_mark() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    assert_eq!(world.handle(control).await, ControlOutcome::Tombstoned);
    let delete = BusinessWrite::Delete {
        key: world.key.clone(),
        version: 1,
    };
    world.commit_transactional(TxnId::new_v7(), delete).await.unwrap();
    assert!(world.backend.store.get_entity(&world.key).await.unwrap().is_none());
    assert!(world
        .backend
        .store
        .get_items(std::slice::from_ref(&world.key))
        .await
        .unwrap()
        .is_empty());
    let create = BusinessWrite::Put {
        key: world.key.clone(),
        data: json!({"lines": 0}),
        expected: ExpectedVersion::Absent,
    };
    world.commit_transactional(TxnId::new_v7(), create).await.unwrap();
    assert_eq!(world.fence().await, Some(txn_id), "the mark survived the delete");
    assert!(matches!(
        world.backend.store.commit_entity(&world.commit(txn_id)).await,
        Err(CommitError::EntityFenced { .. })
    ));
    // A transaction begun after the fence commits as usual, at the version the new item
    // continued from the old one's (1, then 2 for the delete, 3 for the create).
    let later = TxnId::new_v7();
    let mut commit = world.commit(later);
    commit.expected = ExpectedVersion::Exactly(3);
    world.backend.store.commit_entity(&commit).await.unwrap();
}

/// A fence on a key with no item (deleted while the transaction was in flight) keeps the
/// mark there: an item created on the key later still refuses the transaction.
#[tokio::test]
async fn a_fence_on_a_missing_item_keeps_its_mark_for_the_next_item() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let delete = BusinessWrite::Delete {
        key: world.key.clone(),
        version: 1,
    };
    world.commit_transactional(TxnId::new_v7(), delete).await.unwrap();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    assert_eq!(world.handle(control).await, ControlOutcome::Tombstoned);
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
    let create = BusinessWrite::Put {
        key: world.key.clone(),
        data: json!({"lines": 1}),
        expected: ExpectedVersion::Absent,
    };
    world.commit_transactional(TxnId::new_v7(), create).await.unwrap();
    assert_eq!(world.fence().await, Some(txn_id));
    assert!(matches!(
        world.backend.store.commit_entity(&world.commit(txn_id)).await,
        Err(CommitError::EntityFenced { .. })
    ));
}

/// The request path's settling fence: T's control message finds its tombstone record and
/// has nothing left to do (nothing to prune).
#[tokio::test]
async fn a_settling_fence_leaves_nothing_for_the_control_message() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    let now = world.clock.now();
    let outcome = world
        .backend
        .store
        .fence_entity(&world.key, txn_id, now, now.plus(Timing::default().retention))
        .await
        .unwrap();
    assert_eq!(outcome, crate::ports::FenceOutcome::Fenced);
    world.clock.advance(Duration::from_secs(1));
    assert_eq!(
        world.handle(control).await,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }
    );
    assert!(world.backend.control_queue.queue().next_visible_at().is_none());
    assert_eq!(world.fence().await, Some(txn_id));
}

/// An entry beside its transaction's tombstone record (a tombstone written without the
/// fence while a commit of it was on its way) is proof of the commit: it is published,
/// recorded dispatched and removed, and counted apart.
#[tokio::test]
async fn an_entry_beside_its_tombstone_is_published() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    let now = world.clock.now();
    world
        .backend
        .store
        .put_tombstone(txn_id, now, now.plus(Duration::from_secs(60)))
        .await
        .unwrap();
    world.backend.store.commit_entity(&world.commit(txn_id)).await.unwrap();
    let outcome = world.handle(control).await;
    assert!(
        matches!(outcome, ControlOutcome::DispatchedBesideTombstone { messages: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(world.backend.publisher.queue(&events()).unwrap().receive(10).len(), 1);
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Dispatched);
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert!(entity.entries.is_empty());
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
    assert!(world
        .backend
        .store
        .get_entity(&world.key)
        .await
        .unwrap()
        .unwrap()
        .sent
        .contains_key(&txn_id));
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

/// Once settled, the entry is gone and no record is written: a copy of the control
/// message past the window, and a fence, find the sent mark and write nothing.
#[tokio::test]
async fn past_the_window_a_sent_mark_is_found_and_nothing_is_fenced() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let control = ControlMessage::first(txn_id, world.clock.now()).with_entity(world.key.clone());
    world.backend.store.commit_entity(&world.commit(txn_id)).await.unwrap();
    assert!(matches!(
        world.handle(control.clone()).await,
        ControlOutcome::Dispatched { .. }
    ));
    world
        .clock
        .advance(Timing::default().max_commit_duration + Duration::from_secs(1));
    assert_eq!(
        world.handle(control).await,
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
    let now = world.clock.now();
    let fenced = world
        .backend
        .store
        .fence_entity(&world.key, txn_id, now, now.plus(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(fenced, crate::ports::FenceOutcome::Dispatched);
    assert!(world.record(txn_id).await.is_none(), "no tombstone");
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert_eq!(entity.fence, None, "no fence mark raised");
    assert!(entity.sent.contains_key(&txn_id));
}

/// A control message is stale after the shorter of its sender's retention and the
/// worker's: here the API kept proofs for an hour (its sent mark, forgotten since) and the
/// worker keeps them for seven days. Two hours after the transaction began, with no proof
/// left, the worker acknowledges the message instead of fencing a transaction that may
/// have committed and been dispatched.
#[tokio::test]
async fn a_control_message_is_stale_after_the_senders_retention_when_it_is_the_shorter() {
    let world = world().await;
    let txn_id = TxnId::new_v7();
    let hour = Duration::from_secs(3600);
    let control = ControlMessage::first(txn_id, world.clock.now())
        .with_entity(world.key.clone())
        .with_retention(hour);
    world.clock.advance(2 * hour);
    assert_eq!(world.handle(control.clone()).await, ControlOutcome::Stale);
    assert!(world.record(txn_id).await.is_none(), "no tombstone");
    let entity = world.backend.store.get_entity(&world.key).await.unwrap().unwrap();
    assert_eq!(entity.fence, None, "no fence");
    // Without the sender's retention the worker's own holds: within it, the fence.
    let unsaid = ControlMessage {
        retention: None,
        ..control
    };
    assert_eq!(world.handle(unsaid).await, ControlOutcome::Tombstoned);
}
