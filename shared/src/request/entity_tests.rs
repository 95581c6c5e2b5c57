//! The request path in entity mode, on the embedded backend: a change to one existing
//! item committed with one conditional write, dispatched inline or by the worker, the
//! transactional form where the staging needs it, and the fence that settles it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{InlineDispatch, Outbox, Settlement, TxnError, TxnStatus};
use crate::control::{ControlOutcome, ControlPath};
use crate::embedded::{EmbeddedBackend, ManualClock, StoreEvent};
use crate::ports::{Clock, CommitError, ControlDelivery, EntityCommit, ExpectedVersion, ItemKey, Store};
use crate::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, TxnId};
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn order() -> ItemKey {
    "ORDER#1".parse().unwrap()
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    outbox: Outbox,
    control: ControlPath,
}

/// `ORDER#1` at version 1; inline publishing on or off.
async fn world(inline: bool) -> World {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    backend.store.record_history();
    let mut outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    if inline {
        outbox = outbox.with_inline_publisher(backend.publisher.clone());
    }
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let world = World {
        clock,
        backend,
        outbox,
        control,
    };
    let mut create = world.outbox.begin().await.unwrap();
    create.put(order(), json!({"lines": 1}), ExpectedVersion::Absent);
    create.commit().await.unwrap();
    world.settle_control().await;
    world.backend.publisher.queue(&events()).unwrap().receive(10);
    world
}

impl World {
    /// A request path (inline publishing off) over `store` instead of the world's.
    fn outbox_over(&self, store: impl Store + 'static) -> Outbox {
        let ports = crate::request::RequestPorts {
            store: Arc::new(store),
            ..self.backend.request_ports(self.clock.clone())
        };
        Outbox::new(ports, Timing::default(), TransactionLimits::default())
    }

    /// Adds a line to the order in entity mode.
    async fn add_line(&self) -> Result<super::Committed, TxnError> {
        let mut txn = self.outbox.begin_entity(order()).await.unwrap();
        let read = txn.get(&order()).await.unwrap().unwrap();
        let lines = read.data["lines"].as_u64().unwrap();
        txn.put(
            order(),
            json!({"lines": lines + 1}),
            ExpectedVersion::Exactly(read.version),
        );
        txn.emit(Message::json(events(), &json!({"type": "LineAdded"})).unwrap());
        txn.commit().await
    }

    /// Handles every control message due after the first check's delay.
    async fn settle_control(&self) -> Vec<ControlOutcome> {
        self.clock
            .advance(Timing::default().first_check_delay + Duration::from_secs(1));
        let queue = self.backend.control_queue.queue();
        let mut outcomes = Vec::new();
        for received in queue.receive(10) {
            let delivery = ControlDelivery {
                message_id: received.message_id.clone(),
                receipt: received.receipt.clone(),
                body: received.body.clone(),
                receive_count: received.receive_count,
            };
            outcomes.push(self.control.handle(&delivery).await.result.unwrap());
            queue.delete(&received.receipt);
        }
        outcomes
    }

    fn published(&self) -> usize {
        self.backend.publisher.queue(&events()).unwrap().receive(10).len()
    }

    async fn record(&self, txn_id: TxnId) -> Option<OutboxRecord> {
        self.backend
            .store
            .get_outboxes(&[txn_id])
            .await
            .unwrap()
            .remove(&txn_id)
    }

    fn entity_commits(&self, txn_id: TxnId) -> (usize, usize) {
        let history = self.backend.store.history();
        let entity = history
            .iter()
            .filter(
                |event| matches!(event, StoreEvent::EntityCommitted { commit, .. } if commit.entry.txn_id == txn_id),
            )
            .count();
        let transactional = history
            .iter()
            .filter(|event| matches!(event, StoreEvent::Committed { request, .. } if request.txn_id == txn_id))
            .count();
        (entity, transactional)
    }
}

#[tokio::test]
async fn a_change_to_one_item_commits_in_one_write_and_is_dispatched_inline() {
    let world = world(true).await;
    let committed = world.add_line().await.unwrap();
    assert_eq!(committed.inline, InlineDispatch::Dispatched);
    assert_eq!(
        world.entity_commits(committed.txn_id),
        (1, 0),
        "one write into the item, no transaction"
    );
    assert_eq!(world.published(), 1);
    assert!(
        world.record(committed.txn_id).await.is_none(),
        "no record: the dispatch is one write"
    );
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert!(entity.entries.is_empty(), "the entry moved out");
    assert!(entity.sent.contains_key(&committed.txn_id), "its sent mark stays");
    assert_eq!(
        world.outbox.status_in(committed.txn_id, &order()).await.unwrap(),
        TxnStatus::Dispatched
    );
    assert_eq!(
        (entity.item.version, entity.item.data.clone()),
        (2, json!({"lines": 2}))
    );
    let outcomes = world.settle_control().await;
    assert_eq!(
        outcomes,
        [ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }]
    );
    assert_eq!(world.published(), 0, "published once");
}

#[tokio::test]
async fn with_inline_publishing_off_the_worker_dispatches_the_entry() {
    let world = world(false).await;
    let committed = world.add_line().await.unwrap();
    assert_eq!(committed.inline, InlineDispatch::Off);
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert_eq!(
        entity.entries[&committed.txn_id].state,
        OutboxState::Pending,
        "the entry waits in the item"
    );
    assert_eq!(
        world.outbox.status_in(committed.txn_id, &order()).await.unwrap(),
        TxnStatus::Pending
    );
    assert_eq!(
        world.outbox.status(committed.txn_id).await.unwrap(),
        TxnStatus::Unknown,
        "without the item, nothing tells"
    );
    assert!(world.record(committed.txn_id).await.is_none());
    let outcomes = world.settle_control().await;
    assert!(
        matches!(outcomes.as_slice(), [ControlOutcome::Dispatched { messages: 1, .. }]),
        "{outcomes:?}"
    );
    assert_eq!(world.published(), 1);
    assert!(world.record(committed.txn_id).await.is_none());
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert!(entity.entries.is_empty());
    assert!(entity.sent.contains_key(&committed.txn_id));
}

#[tokio::test]
async fn a_create_begun_in_entity_mode_commits_in_the_transactional_form() {
    let world = world(true).await;
    let mut txn = world.outbox.begin_entity("ORDER#2".parse().unwrap()).await.unwrap();
    txn.put("ORDER#2".parse().unwrap(), json!({"lines": 1}), ExpectedVersion::Absent);
    let committed = txn.commit().await.unwrap();
    assert_eq!(
        world.entity_commits(committed.txn_id),
        (0, 1),
        "a create stays transactional"
    );
    assert_eq!(committed.inline, InlineDispatch::NothingToPublish);
    assert_eq!(
        world.record(committed.txn_id).await.unwrap().state,
        OutboxState::Dispatched
    );
}

/// A transaction abandoned before any commit was sent needs no fence (none can land).
/// Abandoned before its control message was sent too (the default: it goes out with the
/// commit), it costs nothing: no record, no message, the item as it was. Its control
/// message sent early ([`super::Transaction::send_control`]), its record's tombstone
/// settles it, and the item stays as it was.
#[tokio::test]
async fn an_abandoned_transaction_is_tombstoned_without_a_fence_in_its_item() {
    let world = world(true).await;
    let history = world.backend.store.history().len();
    let txn = world.outbox.begin_entity(order()).await.unwrap();
    let txn_id = txn.id();
    assert!(txn.get(&order()).await.unwrap().is_some(), "a read, then the refusal");
    assert_eq!(txn.abandon().await, Settlement::NothingSent);
    assert_eq!(world.record(txn_id).await, None, "no tombstone");
    assert_eq!(world.backend.store.history().len(), history, "nothing written");
    assert_eq!(world.settle_control().await, [], "no control message");

    let txn = world.outbox.begin_entity(order()).await.unwrap();
    let txn_id = txn.id();
    txn.send_control().await.unwrap();
    assert_eq!(txn.abandon().await, Settlement::Tombstoned);
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert!(entity.entries.is_empty(), "no fence: {:?}", entity.entries);
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
    assert_eq!(
        world.settle_control().await,
        [ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }]
    );
}

/// Every commit attempt's outcome unknown (lost on its way): the settling write is the
/// fence in the item, after which the lost attempt can never apply.
#[tokio::test]
async fn a_commit_of_unknown_outcome_is_settled_by_a_fence_in_its_item() {
    let world = world(true).await;
    let outbox = world.outbox_over(HeldCommit {
        inner: world.backend.store.clone(),
        held: tokio::sync::Mutex::new(None),
        lose_all: true,
    });
    let mut txn = outbox.begin_entity(order()).await.unwrap();
    let txn_id = txn.id();
    txn.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(1));
    let answer = txn.commit().await;
    assert!(matches!(answer, Err(TxnError::Fenced { .. })), "{answer:?}");
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert_eq!(entity.fence, Some(txn_id), "the fence mark");
    assert!(entity.entries.is_empty());
    let now = world.clock.now();
    let late = EntityCommit {
        key: order(),
        data: json!({"lines": 9}),
        expected: ExpectedVersion::Exactly(1),
        entry: OutboxRecord::committed(txn_id, vec![], now, now),
        checks_fence: true,
        applied: None,
    };
    assert!(matches!(
        world.backend.store.commit_entity(&late).await,
        Err(CommitError::EntityFenced { .. })
    ));
}

/// The embedded store, its first entity commit held on its way until released (a
/// request in the network): it says when it is held, and applies when let go. With
/// `lose_all`, every entity commit is lost on its way instead (never applied, answered
/// "outcome unknown").
struct HeldCommit {
    inner: Arc<crate::embedded::EmbeddedStore>,
    held: tokio::sync::Mutex<Option<(tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Receiver<()>)>>,
    lose_all: bool,
}

impl HeldCommit {
    /// A store over `world`'s whose first entity commit is held: with the word that it
    /// arrived, and the sender that lets it go on.
    fn first(
        world: &World,
    ) -> (
        Self,
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        let store = Self {
            inner: world.backend.store.clone(),
            held: tokio::sync::Mutex::new(Some((arrived_tx, release_rx))),
            lose_all: false,
        };
        (store, arrived, release)
    }
}

#[async_trait::async_trait]
impl Store for HeldCommit {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &crate::ports::CommitRequest) -> Result<(), CommitError> {
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
    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        if self.lose_all {
            return Err(CommitError::Ambiguous("lost on its way".into()));
        }
        let held = self.held.lock().await.take();
        if let Some((arrived, release)) = held {
            arrived.send(()).unwrap();
            release.await.unwrap();
        }
        self.inner.commit_entity(commit).await
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
    ) -> Result<crate::ports::FenceOutcome, crate::ports::StoreError> {
        self.inner.fence_entity(key, txn_id, now, expires_at).await
    }
    async fn put_dispatched(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<(), crate::ports::StoreError> {
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }
}

/// A handler hands its transaction to a task (or a channel) and answers; the request is
/// settled by abandoning the transaction. The task's commit, coming after, is refused
/// and writes nothing (before, in entity mode, it applied beside the tombstone). Abandoned
/// before its control message was sent, nothing of it is ever sent: the late commit sends
/// no control message either. Sent early, the abandon's tombstone settles it.
#[tokio::test]
async fn a_commit_after_its_transaction_was_abandoned_is_refused_and_writes_nothing() {
    for sent_early in [false, true] {
        let world = world(false).await;
        let mut txn = world.outbox.begin_entity(order()).await.unwrap();
        let txn_id = txn.id();
        if sent_early {
            txn.send_control().await.unwrap();
        }
        txn.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(1));
        txn.emit(Message::json(events(), &json!({"type": "LineAdded"})).unwrap());
        let settled = world.outbox.abandon(txn_id, None).await;
        let late = tokio::spawn(txn.commit()).await.unwrap();
        assert!(matches!(late, Err(TxnError::Abandoned { .. })), "{late:?}");
        let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
        assert_eq!(entity.item.version, 1, "nothing applied");
        assert!(entity.entries.is_empty());
        assert_eq!(world.entity_commits(txn_id), (0, 0));
        let record = world.record(txn_id).await.map(|record| record.state);
        let controls = world.settle_control().await;
        if sent_early {
            assert_eq!(settled, Settlement::Tombstoned);
            assert_eq!(record, Some(OutboxState::Tombstone));
            assert_eq!(controls.len(), 1, "{controls:?}");
        } else {
            assert_eq!(settled, Settlement::NothingSent);
            assert_eq!(record, None, "nothing written");
            assert_eq!(controls, [], "no control message: the late commit sent none");
        }
    }
}

/// The abandon comes while the commit is on its way (a task committing past the answer):
/// the abandon fences the transaction in its item, so the commit, arriving after, is
/// refused in both forms, and the answers agree.
#[tokio::test]
async fn an_abandon_during_a_commit_fences_it_in_its_item() {
    let world = world(false).await;
    let (held, arrived, release) = HeldCommit::first(&world);
    let outbox = world.outbox_over(held);
    let mut txn = outbox.begin_entity(order()).await.unwrap();
    let txn_id = txn.id();
    txn.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(1));
    txn.emit(Message::json(events(), &json!({"type": "LineAdded"})).unwrap());
    let commit = tokio::spawn(txn.commit());
    arrived.await.unwrap();
    assert_eq!(outbox.abandon(txn_id, None).await, Settlement::Tombstoned);
    release.send(()).unwrap();
    let answer = commit.await.unwrap();
    assert!(
        matches!(answer, Err(TxnError::CommitWindowExpired { .. })),
        "{answer:?}"
    );
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert_eq!(entity.item.version, 1, "nothing applied");
    assert_eq!(entity.fence, Some(txn_id));
    assert_eq!(world.entity_commits(txn_id), (0, 0));
    assert_eq!(world.record(txn_id).await.unwrap().state, OutboxState::Tombstone);
}

/// A transaction whose item was fenced for a later transaction cannot commit in entity
/// form (the mark is above it): it commits in the transactional form instead, nothing
/// lost and nothing refused.
#[tokio::test]
async fn a_transaction_below_another_ones_fence_commits_in_the_transactional_form() {
    let world = world(true).await;
    let first = world.outbox.begin_entity(order()).await.unwrap();
    let second = world.outbox.begin_entity(order()).await.unwrap();
    let (mut low, high) = if first.id() < second.id() {
        (first, second)
    } else {
        (second, first)
    };
    let now = world.clock.now();
    world
        .backend
        .store
        .fence_entity(&order(), high.id(), now, now.plus(Duration::from_secs(600)))
        .await
        .unwrap();
    drop(high);
    let read = low.get(&order()).await.unwrap().unwrap();
    low.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(read.version));
    low.emit(Message::json(events(), &json!({"type": "LineAdded"})).unwrap());
    let committed = low.commit().await.unwrap();
    assert_eq!(world.entity_commits(committed.txn_id), (0, 1), "the transactional form");
    assert_eq!(committed.inline, InlineDispatch::Dispatched);
    assert_eq!(world.published(), 1);
}

/// An entry too big for its item (entity mode's item holds it, 400 KB at most) commits in
/// the transactional form, whose records split across items, instead of being refused.
#[tokio::test]
async fn an_entry_too_big_for_its_item_commits_in_the_transactional_form() {
    let world = world(true).await;
    let mut txn = world.outbox.begin_entity(order()).await.unwrap();
    txn.put(
        order(),
        json!({"lines": 2, "note": "x".repeat(250_000)}),
        ExpectedVersion::Exactly(1),
    );
    txn.emit(Message::json(events(), &json!({"type": "LineAdded", "note": "y".repeat(200_000)})).unwrap());
    let committed = txn.commit().await.unwrap();
    assert_eq!(world.entity_commits(committed.txn_id), (0, 1), "the transactional form");
    assert_eq!(world.published(), 1);
}

#[tokio::test]
async fn a_commit_after_the_worker_fenced_it_is_refused() {
    let world = world(true).await;
    let mut txn = world.outbox.begin_entity(order()).await.unwrap();
    let read = txn.get(&order()).await.unwrap().unwrap();
    txn.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(read.version));
    // The worker's checks run out the window before the commit is tried.
    let window = Timing::default().max_commit_duration;
    let control = ControlMessage::first(txn.id(), world.clock.now()).with_entity(order());
    world.clock.advance(window + Duration::from_secs(1));
    let delivery = ControlDelivery {
        message_id: "m".into(),
        receipt: "r".into(),
        body: control.encode(),
        receive_count: 1,
    };
    assert_eq!(
        world.control.handle(&delivery).await.result.unwrap(),
        ControlOutcome::Tombstoned
    );
    let refused = txn.commit().await;
    assert!(
        matches!(refused, Err(TxnError::CommitWindowExpired { .. })),
        "{refused:?}"
    );
    let entity = world.backend.store.get_entity(&order()).await.unwrap().unwrap();
    assert_eq!(entity.item.data, json!({"lines": 1}), "nothing applied");
}

/// A commit cut off midway (its task aborted, a timeout around it) while its request was
/// on its way: the request path keeps the transaction, so that abandoning it later fences
/// it, and the request, landing after, is refused (before, the abandon found nothing and
/// wrote only the tombstone record, which an entity commit does not look at).
#[tokio::test]
async fn a_commit_cut_off_midway_is_fenced_by_a_later_abandon() {
    let world = world(false).await;
    let (held, arrived, _release) = HeldCommit::first(&world);
    let outbox = world.outbox_over(held);
    let mut txn = outbox.begin_entity(order()).await.unwrap();
    let txn_id = txn.id();
    txn.put(order(), json!({"lines": 2}), ExpectedVersion::Exactly(1));
    let commit = tokio::spawn(txn.commit());
    arrived.await.unwrap();
    commit.abort();
    assert!(commit.await.unwrap_err().is_cancelled());
    assert_eq!(outbox.abandon(txn_id, None).await, Settlement::Tombstoned);
    // The request that was on its way lands now.
    let now = world.clock.now();
    let landing = EntityCommit {
        key: order(),
        data: json!({"lines": 2}),
        expected: ExpectedVersion::Exactly(1),
        entry: OutboxRecord::committed(txn_id, vec![], now, now),
        checks_fence: true,
        applied: None,
    };
    assert!(matches!(
        world.backend.store.commit_entity(&landing).await,
        Err(CommitError::EntityFenced { .. })
    ));
    assert_eq!(
        world
            .backend
            .store
            .get_entity(&order())
            .await
            .unwrap()
            .unwrap()
            .item
            .version,
        1
    );
}

/// A publisher whose first call waits until `release` is notified, and whose first
/// `failing` calls then fail; every message id it sent, in order.
struct HeldFirstSend {
    inner: Arc<dyn crate::ports::Publisher>,
    release: Arc<tokio::sync::Notify>,
    first: std::sync::atomic::AtomicBool,
    failing: std::sync::atomic::AtomicUsize,
    sent: std::sync::Mutex<Vec<String>>,
}

impl HeldFirstSend {
    fn over(inner: Arc<dyn crate::ports::Publisher>, failing: usize) -> Self {
        Self {
            inner,
            release: Arc::default(),
            first: true.into(),
            failing: failing.into(),
            sent: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl crate::ports::Publisher for HeldFirstSend {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[crate::protocol::OutgoingMessage],
    ) -> Result<Vec<crate::ports::EntryFailure>, crate::ports::PublishError> {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.release.notified().await;
        }
        let failing = self.failing.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        if failing.is_ok() {
            return Err(crate::ports::PublishError::Unavailable {
                destination: destination.clone(),
                source: "unavailable".into(),
            });
        }
        self.sent
            .lock()
            .unwrap()
            .extend(messages.iter().map(|message| message.id.to_string()));
        self.inner.send_batch(destination, messages).await
    }

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

/// Two changes of one order on a FIFO destination, published after their answers by one
/// process: the later one's publisher, finding the earlier one's entry in the order,
/// waits for the earlier one's turn instead of sending it again first, and then sends
/// only its own. The destination receives each once, in commit order.
#[tokio::test]
async fn a_later_publisher_of_an_entity_in_the_process_waits_its_turn_instead_of_sending_again() {
    let ids = two_changes_published_in_turn(0).await;
    assert_eq!(ids.len(), 2);
}

/// The same when the earlier publisher fails to send (every try): the later one, its turn
/// come, finds the earlier transaction unsent and sends it first, then its own.
#[tokio::test]
async fn a_later_publisher_sends_first_what_the_earlier_one_failed_to_send() {
    let ids = two_changes_published_in_turn(2).await;
    assert_eq!(ids.len(), 2);
}

/// Two changes of one order to a FIFO destination published after their answers, the
/// first one's first send held until the second committed, then its first `failing`
/// sends failing. Each is sent once, in commit order; their ids.
async fn two_changes_published_in_turn(failing: usize) -> Vec<String> {
    let audit: DestinationName = "audit".parse().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(audit.clone(), true)]);
    let publisher = Arc::new(HeldFirstSend::over(backend.publisher.clone(), failing));
    let release = publisher.release.clone();
    let after = super::AfterAnswer::on_tokio();
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    )
    .with_publishing_after_answer(publisher.clone(), after.clone());
    let mut create = outbox.begin().await.unwrap();
    create.put(order(), json!({"lines": 1}), ExpectedVersion::Absent);
    create.commit().await.unwrap();
    let mut ids = Vec::new();
    for lines in [2, 3] {
        let mut txn = outbox.begin_entity(order()).await.unwrap();
        let read = txn.get(&order()).await.unwrap().unwrap();
        txn.put(
            order(),
            json!({ "lines": lines }),
            ExpectedVersion::Exactly(read.version),
        );
        txn.emit(Message::json(audit.clone(), &json!({ "lines": lines })).unwrap());
        ids.push(format!("{}:0", txn.commit().await.unwrap().txn_id));
        // The first one's publish is held in its send, its entry still in the order.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(publisher.sent.lock().unwrap().is_empty(), "the first send is held");
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(5), after.idle())
        .await
        .expect("both publishes end");
    assert_eq!(
        *publisher.sent.lock().unwrap(),
        ids,
        "each sent once, by its own publisher, in commit order"
    );
    let received: Vec<String> = backend
        .publisher
        .queue(&audit)
        .unwrap()
        .receive(10)
        .into_iter()
        .map(|message| message.attributes[crate::protocol::MESSAGE_ID_ATTRIBUTE].clone())
        .collect();
    assert_eq!(received, ids, "the FIFO destination, in commit order");
    ids
}
