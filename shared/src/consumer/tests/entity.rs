//! The consumer in entity mode on the embedded backend: one conditional write per
//! message, each ordering rule of docs/PROTOCOL.md section 11 shown by the failure it prevents.

use crate::ports::ExpectedVersion;
use crate::protocol::Applied;
use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::*;
use crate::embedded::{EmbeddedStore, StoreEvent};
use crate::ports::{
    CommitError, CommitRequest, EntityCommit, EntityItem, OutboxReads, Store, StoreError, TombstoneOutcome,
    VersionedItem,
};
use crate::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, TxnId};

fn entity_mode() -> Counting {
    Counting {
        entity: true,
        ..Counting::default()
    }
}

/// The embedded store, with faults and a pause a test sets.
struct Hooked {
    inner: Arc<EmbeddedStore>,
    /// Dedup record puts to fail before one goes through.
    failing_dedup_puts: AtomicU32,
    /// At the first read of a message's entity or record: once the read is done, says
    /// so, then waits for the word to go on.
    pause_after_first_read: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
    /// The same, at the first read of a record only.
    pause_after_first_record_read: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
    /// The next entity commit is held in the network: answered "outcome unknown", kept
    /// here to land later.
    hold_next_commit: std::sync::atomic::AtomicBool,
    held: Mutex<Option<EntityCommit>>,
    /// When a commit is held, another copy of its message records a decision that writes
    /// nothing (its dedup record, dispatched).
    settled_by_another_copy: std::sync::atomic::AtomicBool,
    /// When a commit is held, another writer changes its entity (its version moves on).
    changed_by_another_writer: std::sync::atomic::AtomicBool,
}

impl Hooked {
    fn new(inner: Arc<EmbeddedStore>) -> Self {
        Self {
            inner,
            failing_dedup_puts: AtomicU32::new(0),
            pause_after_first_read: Mutex::new(None),
            pause_after_first_record_read: Mutex::new(None),
            hold_next_commit: Default::default(),
            held: Mutex::new(None),
            settled_by_another_copy: Default::default(),
            changed_by_another_writer: Default::default(),
        }
    }

    async fn after_read(&self) {
        let pause = self.pause_after_first_read.lock().unwrap().take();
        if let Some((read_done, go_on)) = pause {
            read_done.send(()).unwrap();
            go_on.await.unwrap();
        }
    }
}

#[async_trait]
impl Store for Hooked {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.inner.commit(request).await
    }
    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.inner.get_items(keys).await
    }
    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, crate::ports::KeyRead>, StoreError> {
        self.inner.get_keys(keys).await
    }
    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.inner.get_outboxes(txn_ids).await
    }
    async fn get_outboxes_each(&self, txn_ids: &[TxnId]) -> Result<OutboxReads, StoreError> {
        let read = self.inner.get_outboxes_each(txn_ids).await;
        self.after_read().await;
        let pause = self.pause_after_first_record_read.lock().unwrap().take();
        if let Some((read_done, go_on)) = pause {
            read_done.send(()).unwrap();
            go_on.await.unwrap();
        }
        read
    }
    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.get_idempotency(slot).await
    }
    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }
    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }
    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        let read = self.inner.get_entity(key).await;
        self.after_read().await;
        read
    }
    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        self.inner.keep_applied(key, expected, name, applied).await
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        if self.hold_next_commit.swap(false, Ordering::SeqCst) {
            *self.held.lock().unwrap() = Some(commit.clone());
            if self.settled_by_another_copy.load(Ordering::SeqCst) {
                let entry = &commit.entry;
                self.inner
                    .put_dispatched(entry.txn_id, entry.created_at, entry.created_at.plus(RETENTION))
                    .await
                    .unwrap();
            }
            if self.changed_by_another_writer.load(Ordering::SeqCst) {
                let entry = &commit.entry;
                let other = TxnId::new_v7();
                self.inner
                    .commit(&CommitRequest {
                        txn_id: other,
                        writes: vec![crate::ports::BusinessWrite::Put {
                            key: commit.key.clone(),
                            data: json!({"count": 100}),
                            expected: commit.expected,
                        }],
                        outbox: OutboxRecord::committed(
                            other,
                            vec![],
                            entry.created_at,
                            entry.created_at.plus(RETENTION),
                        ),
                        idempotency: None,
                    })
                    .await
                    .unwrap();
            }
            return Err(CommitError::Ambiguous("held in the network".into()));
        }
        self.inner.commit_entity(commit).await
    }
    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.inner.remove_entry(key, txn_id).await
    }
    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        let failing = self.failing_dedup_puts.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_dedup_puts.store(failing - 1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("the dedup record's put failed".into()));
        }
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }
}

/// A world in entity mode whose consumer works on a [`Hooked`] store.
fn hooked_world(publish_failures: u32) -> (World, Arc<Hooked>) {
    let mut world = world(entity_mode(), publish_failures);
    let hooked = Arc::new(Hooked::new(world.backend.store.clone()));
    let mut ports = world.backend.consumer_ports(world.clock.clone());
    ports.store = hooked.clone();
    world.consumer = Consumer::new("counter".parse().unwrap(), ports, world.handler.clone(), RETENTION);
    (world, hooked)
}

impl World {
    async fn entity(&self, order: &str) -> EntityItem {
        let key: ItemKey = format!("COUNT#{order}").parse().unwrap();
        self.backend.store.get_entity(&key).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn in_entity_mode_a_message_is_one_conditional_write_and_leaves_no_entry_behind() {
    let world = world(entity_mode(), 0);
    world.backend.store.record_history();
    let started = world.clock.now();
    let outcome = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 });
    assert_eq!(world.count("o-1").await, 1);
    let published = world.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].0, format!("{}:0", world.consumer.txn_id("T:0")));
    let history = world.backend.store.history();
    assert!(
        matches!(
            history.as_slice(),
            [
                StoreEvent::EntityCommitted { .. },
                StoreEvent::MarkedDispatched { .. },
                StoreEvent::EntryRemoved { .. }
            ]
        ),
        "no transaction: {history:?}"
    );
    assert!(world.entity("o-1").await.entries.is_empty(), "the entry is removed");
    let record = world.record("T:0").unwrap();
    assert_eq!(record.state, OutboxState::Dispatched);
    assert_eq!(
        record.expires_at,
        Some(started.plus(Duration::from_secs(1)).plus(RETENTION)),
        "the dedup record's TTL runs from dispatch"
    );
    let again = world.consumer.consume(&copy("q-2", "T:0", "o-1")).await.unwrap();
    assert_eq!(again, ConsumeOutcome::Duplicate);
    assert_eq!(world.runs(), 1);
}

#[tokio::test]
async fn in_entity_mode_concurrent_copies_apply_once_and_only_the_winners_messages_go_out() {
    for copies in [2usize, 3] {
        let world = world(
            Counting {
                interleave: true,
                ..entity_mode()
            },
            0,
        );
        let deliveries: Vec<Delivery> = (0..copies).map(|n| copy(&format!("q-{n}"), "T:0", "o-1")).collect();
        let report = world.consumer.consume_batch(&deliveries).await;
        let outcomes: Vec<&str> = report
            .items
            .iter()
            .map(|item| item.result.as_ref().unwrap().as_str())
            .collect();
        assert_eq!(world.runs() as usize, copies, "the copies ran concurrently");
        assert_eq!(
            outcomes.iter().filter(|o| **o == "processed").count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(world.count("o-1").await, 1, "applied once");
        let published = world.published();
        let winner = published[0].1["run"].clone();
        assert!(published.iter().all(|(_, body)| body["run"] == winner), "{published:?}");
        assert!(world.entity("o-1").await.entries.is_empty());
    }
}

#[tokio::test]
async fn in_entity_mode_a_publish_failure_leaves_the_entry_and_the_redelivery_sends_it() {
    let world = world(entity_mode(), 1);
    let failed = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await;
    assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
    assert_eq!(
        world.entity("o-1").await.entries.len(),
        1,
        "the entry waits in the item"
    );
    assert!(
        world.record("T:0").is_none(),
        "no dedup record before the messages went out"
    );
    let again = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(again, ConsumeOutcome::Resumed { messages: 1 });
    assert_eq!(world.runs(), 1);
    assert_eq!(world.count("o-1").await, 1);
    assert_eq!(world.published()[0].1["run"], 1);
    assert!(world.entity("o-1").await.entries.is_empty());
}

/// The dedup record goes in before the entry comes out: the other order, with the
/// record's put failing, leaves neither, and the redelivery applies the message again.
#[tokio::test]
async fn in_entity_mode_the_dedup_record_is_written_before_the_entry_is_removed() {
    let (world, hooked) = hooked_world(0);
    hooked.failing_dedup_puts.store(1, Ordering::SeqCst);
    let failed = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await;
    assert!(matches!(failed, Err(ConsumeError::Mark(_))), "{failed:?}");
    let again = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(again, ConsumeOutcome::Resumed { messages: 1 });
    assert_eq!(world.count("o-1").await, 1, "applied once");
    assert_eq!(world.runs(), 1);
    assert!(world.entity("o-1").await.entries.is_empty());
}

/// The entity is read before the dedup record. A copy that read them the other way
/// could find no record, then (while the first copy dispatches, writes its record and
/// removes its entry) read the entity without the entry, and apply the message again.
#[tokio::test]
async fn in_entity_mode_the_entity_is_read_before_the_dedup_record() {
    let (world, hooked) = hooked_world(0);
    let (read_done, first_read) = oneshot::channel();
    let (go_on, wait) = oneshot::channel();
    *hooked.pause_after_first_read.lock().unwrap() = Some((read_done, wait));
    let late = copy("q-2", "T:0", "o-1");
    let (late_outcome, ()) = tokio::join!(world.consumer.consume(&late), async {
        first_read.await.unwrap();
        // Between the late copy's two reads, the first copy goes all the way.
        let first = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
        assert_eq!(first, ConsumeOutcome::Processed { messages: 1 });
        go_on.send(()).unwrap();
    });
    assert_eq!(late_outcome.unwrap(), ConsumeOutcome::Duplicate);
    assert_eq!(world.count("o-1").await, 1, "applied once");
    assert_eq!(world.runs(), 1);
}

#[tokio::test]
async fn in_entity_mode_a_handler_that_writes_another_item_fails_the_message_writing_nothing() {
    struct TwoItems;
    #[async_trait]
    impl Handler for TwoItems {
        async fn handle(&self, _: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
            staging.put("A#1".parse()?, json!({}), ExpectedVersion::Absent);
            staging.put("B#1".parse()?, json!({}), ExpectedVersion::Absent);
            Ok(())
        }
        fn entity(&self, _: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
            Ok(Some("A#1".parse()?))
        }
    }
    let world = world(Counting::default(), 0);
    let consumer = Consumer::new(
        "two".parse().unwrap(),
        world.backend.consumer_ports(world.clock.clone()),
        Arc::new(TwoItems),
        RETENTION,
    );
    let failed = consumer.consume(&copy("q-1", "T:0", "o-1")).await;
    match failed {
        Err(error @ ConsumeError::NotOneItem { .. }) => {
            assert_eq!(error.to_string(), "entity mode commits one item, A#1: a write to B#1")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(world.backend.store.sizes().business_items, 0);
    assert!(world.backend.store.outbox_records().is_empty());
}

/// A transactional put of an item whose entry is still to be dispatched keeps the entry;
/// a delete would drop its messages, so it meets contention (tried again) until the entry
/// is removed.
#[tokio::test]
async fn a_transactional_put_keeps_the_items_entries_and_a_delete_waits_for_them() {
    let world = world(entity_mode(), 1);
    world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap_err();
    let key: ItemKey = "COUNT#o-1".parse().unwrap();
    let commit = |write: crate::ports::BusinessWrite| {
        let txn_id = TxnId::new_v7();
        CommitRequest {
            txn_id,
            writes: vec![write],
            outbox: OutboxRecord::committed(txn_id, vec![], world.clock.now(), world.clock.now().plus(RETENTION)),
            idempotency: None,
        }
    };
    let put = commit(crate::ports::BusinessWrite::Put {
        key: key.clone(),
        data: json!({"count": 7}),
        expected: ExpectedVersion::Exactly(1),
    });
    world.backend.store.commit(&put).await.unwrap();
    let entity = world.entity("o-1").await;
    assert_eq!((entity.item.version, entity.entries.len()), (2, 1), "the entry stays");
    let delete = commit(crate::ports::BusinessWrite::Delete {
        key: key.clone(),
        version: 2,
    });
    let refused = world.backend.store.commit(&delete).await;
    assert!(matches!(refused, Err(CommitError::Contention(_))), "{refused:?}");
    assert_eq!(
        world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap(),
        ConsumeOutcome::Resumed { messages: 1 }
    );
    world.backend.store.commit(&delete).await.unwrap();
    assert_eq!(world.count("o-1").await, 0, "deleted");
}

/// Stages nothing when its entity is absent, else bumps it and emits: a decision that
/// depends on the entity.
struct OnlyIfThere;

#[async_trait]
impl Handler for OnlyIfThere {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let key: ItemKey = format!("COUNT#{}", order_of(message)?).parse()?;
        if let Some(item) = staging.get(&key).await? {
            let count = item.data["count"].as_u64().unwrap_or(0);
            staging.put(key, json!({"count": count + 1}), ExpectedVersion::Exactly(item.version));
            staging.emit(Message::json(events(), &json!({"type": "Bumped", "count": count + 1}))?);
        }
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(Some(format!("COUNT#{}", order_of(message)?).parse()?))
    }
}

/// A copy that decided "nothing" on the entity as it was records its decision after
/// another copy committed on the entity as it became, and failed to publish: the record
/// says dispatched, the entry says pending. The next copy publishes the entry's messages
/// before removing it, rather than taking the record's word and losing them.
#[tokio::test]
async fn a_pending_entry_beside_a_dispatched_record_is_published_before_it_is_removed() {
    let (mut world, hooked) = hooked_world(1);
    let mut ports = world.backend.consumer_ports(world.clock.clone());
    ports.store = hooked.clone();
    ports.publisher = Arc::new(Flaky {
        inner: world.backend.publisher.clone(),
        failures: AtomicU32::new(1),
        clock: world.clock.clone(),
    });
    world.consumer = Consumer::new("counter".parse().unwrap(), ports, Arc::new(OnlyIfThere), RETENTION)
        .with_retry_policy(crate::publish::RetryPolicy {
            attempts: 1,
            ..Default::default()
        });
    let (read_done, reads_done) = oneshot::channel();
    let (go_on, wait) = oneshot::channel();
    *hooked.pause_after_first_record_read.lock().unwrap() = Some((read_done, wait));
    let first = copy("q-1", "T:0", "o-1");
    let (nothing, ()) = tokio::join!(world.consumer.consume(&first), async {
        reads_done.await.unwrap();
        // The entity appears (another message), then a second copy commits on it and
        // fails to publish.
        let other = EntityCommit {
            key: "COUNT#o-1".parse().unwrap(),
            data: json!({"count": 10}),
            expected: ExpectedVersion::Absent,
            entry: OutboxRecord::committed(TxnId::new_v7(), vec![], world.clock.now(), world.clock.now()),
            checks_fence: false,
            applied: None,
        };
        world.backend.store.commit_entity(&other).await.unwrap();
        world
            .backend
            .store
            .remove_entry(&other.key, other.entry.txn_id)
            .await
            .unwrap();
        let failed = world.consumer.consume(&copy("q-2", "T:0", "o-1")).await;
        assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
        go_on.send(()).unwrap();
    });
    assert_eq!(
        nothing.unwrap(),
        ConsumeOutcome::Processed { messages: 0 },
        "the first copy decided nothing"
    );
    assert_eq!(world.count("o-1").await, 11, "the second copy's change");
    let third = world.consumer.consume(&copy("q-3", "T:0", "o-1")).await.unwrap();
    assert_eq!(third, ConsumeOutcome::Resumed { messages: 1 });
    let published = world.published();
    assert_eq!(published.len(), 1, "the committed change's message went out");
    assert_eq!(published[0].1["count"], 11);
    assert!(world.entity("o-1").await.entries.is_empty());
}

/// Bumps its entity and emits the first time it runs; later runs stage nothing (its
/// decision depends on something else: another item, the time, configuration).
#[derive(Default)]
struct ChangesItsMind {
    runs: AtomicU32,
}

#[async_trait]
impl Handler for ChangesItsMind {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let key: ItemKey = format!("COUNT#{}", order_of(message)?).parse()?;
        let item = staging.get(&key).await?.expect("the test creates the entity");
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            let count = item.data["count"].as_u64().unwrap_or(0);
            staging.put(key, json!({"count": count + 1}), ExpectedVersion::Exactly(item.version));
            staging.emit(Message::json(events(), &json!({"type": "Bumped", "count": count + 1}))?);
        }
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(Some(format!("COUNT#{}", order_of(message)?).parse()?))
    }
}

/// A world whose counter `COUNT#o-1` exists (count 1, version 1), consumed by
/// [`ChangesItsMind`] through a [`Hooked`] store.
async fn changes_its_mind_world() -> (World, Arc<Hooked>) {
    let (mut world, hooked) = hooked_world(0);
    let key: ItemKey = "COUNT#o-1".parse().unwrap();
    let create = TxnId::new_v7();
    let now = world.clock.now();
    world
        .backend
        .store
        .commit(&CommitRequest {
            txn_id: create,
            writes: vec![crate::ports::BusinessWrite::Put {
                key,
                data: json!({"count": 1}),
                expected: ExpectedVersion::Absent,
            }],
            outbox: OutboxRecord::committed(create, vec![], now, now.plus(RETENTION)),
            idempotency: None,
        })
        .await
        .unwrap();
    let mut ports = world.backend.consumer_ports(world.clock.clone());
    ports.store = hooked.clone();
    world.consumer = Consumer::new(
        "counter".parse().unwrap(),
        ports,
        Arc::new(ChangesItsMind::default()),
        RETENTION,
    );
    (world, hooked)
}

/// Round 1 commits a change and a message, its outcome unknown (held in the network);
/// round 2 reads the entity unchanged and, deciding otherwise, stages nothing. Recording
/// only the decision would let round 1 land after the acknowledgement, its message never
/// sent (C2, C5). Round 2 writes the entity as read instead, so round 1 can never land.
#[tokio::test]
async fn a_handler_that_changes_its_mind_after_an_unknown_attempt_blocks_that_attempt() {
    let (world, hooked) = changes_its_mind_world().await;
    hooked.hold_next_commit.store(true, Ordering::SeqCst);
    let outcome = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 0 });
    let held = hooked.held.lock().unwrap().take().expect("round 1's commit was held");
    let late = world.backend.store.commit_entity(&held).await;
    assert!(
        matches!(late, Err(CommitError::VersionConflict { .. })),
        "round 1 landed: {late:?}"
    );
    let entity = world.entity("o-1").await;
    assert_eq!(entity.item.data, json!({"count": 1}), "no change applied");
    assert!(entity.entries.is_empty(), "{:?}", entity.entries);
    assert!(world.published().is_empty());
}

/// Round 1 commits a change and a message, its outcome unknown (held in the network);
/// meanwhile another copy of the message, deciding otherwise, records that it wrote
/// nothing. Round 2 finds that record: acknowledging at once would let round 1 land
/// afterwards, its change applied and its message never sent (C1, C2). Round 2 writes the
/// entity as read first, so round 1 can never land.
#[tokio::test]
async fn a_copy_that_finds_the_message_settled_after_its_unknown_attempt_blocks_that_attempt() {
    let (world, hooked) = changes_its_mind_world().await;
    hooked.hold_next_commit.store(true, Ordering::SeqCst);
    hooked.settled_by_another_copy.store(true, Ordering::SeqCst);
    let outcome = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Duplicate);
    let held = hooked.held.lock().unwrap().take().expect("round 1's commit was held");
    let late = world.backend.store.commit_entity(&held).await;
    assert!(
        matches!(late, Err(CommitError::VersionConflict { .. })),
        "round 1 landed: {late:?}"
    );
    let entity = world.entity("o-1").await;
    assert_eq!(entity.item.data, json!({"count": 1}), "no change applied");
    assert!(entity.entries.is_empty(), "{:?}", entity.entries);
    assert!(world.published().is_empty());
}

/// The same, but another writer changed the entity meanwhile: the attempt, which expected
/// the version it read, can no longer land, so the copy acknowledges without writing the
/// entity again.
#[tokio::test]
async fn a_copy_whose_entity_moved_on_since_its_unknown_attempt_acknowledges_without_a_block() {
    let (world, hooked) = changes_its_mind_world().await;
    hooked.hold_next_commit.store(true, Ordering::SeqCst);
    hooked.settled_by_another_copy.store(true, Ordering::SeqCst);
    hooked.changed_by_another_writer.store(true, Ordering::SeqCst);
    let outcome = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Duplicate);
    let entity = world.entity("o-1").await;
    assert_eq!(
        (entity.item.version, entity.item.data),
        (2, json!({"count": 100})),
        "only the other writer's change: no block written"
    );
    let held = hooked.held.lock().unwrap().take().expect("round 1's commit was held");
    let late = world.backend.store.commit_entity(&held).await;
    assert!(matches!(late, Err(CommitError::VersionConflict { .. })), "{late:?}");
}

/// In entity mode, a create of an entity whose item was deleted expects the key at the
/// version the delete left, not merely "absent": so an attempt of the message still on
/// its way can never apply to a later life of the entity. Its messages are placed in the
/// entity's history.
#[tokio::test]
async fn in_entity_mode_a_create_expects_the_version_a_delete_left() {
    let world = world(entity_mode(), 0);
    let key: ItemKey = "COUNT#o-1".parse().unwrap();
    let store = world.backend.store.clone();
    let commit = |writes| crate::ports::CommitRequest {
        txn_id: TxnId::new_v7(),
        writes,
        outbox: OutboxRecord::committed(TxnId::new_v7(), vec![], world.clock.now(), world.clock.now()),
        idempotency: None,
    };
    let create = crate::ports::BusinessWrite::Put {
        key: key.clone(),
        data: json!({"count": 5}),
        expected: ExpectedVersion::Absent,
    };
    let mut request = commit(vec![create]);
    request.outbox.txn_id = request.txn_id;
    crate::ports::Store::commit(store.as_ref(), &request).await.unwrap();
    let mut delete = commit(vec![crate::ports::BusinessWrite::Delete {
        key: key.clone(),
        version: 1,
    }]);
    delete.outbox.txn_id = delete.txn_id;
    crate::ports::Store::commit(store.as_ref(), &delete).await.unwrap();
    store.record_history();
    world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    let expected: Vec<(ExpectedVersion, u64, bool)> = store
        .history()
        .into_iter()
        .filter_map(|event| match event {
            StoreEvent::EntityCommitted { commit, version, .. } => Some((
                commit.expected,
                version,
                commit.entry.messages.iter().all(|message| message.position.is_some()),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(expected, [(ExpectedVersion::AbsentAt(2), 3, true)]);
}

/// A consumer's entry waiting in its entity (its publish failed) is the consumer's: a
/// request-path transaction committed into the same item, which publishes the item's
/// earlier waiting entries first, leaves it there, so that the consumer writes its dedup
/// record before the entry leaves (else a copy of the message would apply again).
#[tokio::test]
async fn a_request_path_publisher_leaves_a_consumers_entry_to_the_consumer() {
    let world = world(entity_mode(), 1);
    let failed = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await;
    assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
    let consumed = world.consumer.txn_id("T:0");
    assert!(world.entity("o-1").await.entries.contains_key(&consumed));
    let ports = world.backend.request_ports(world.clock.clone());
    let outbox = crate::request::Outbox::new(ports, crate::settings::Timing::default(), Default::default())
        .with_inline_publisher(world.backend.publisher.clone());
    let key: ItemKey = "COUNT#o-1".parse().unwrap();
    let mut txn = outbox.begin_entity(key.clone()).await.unwrap();
    let read = txn.get(&key).await.unwrap().unwrap();
    txn.put(
        key.clone(),
        json!({"count": 50}),
        ExpectedVersion::Exactly(read.version),
    );
    txn.emit(Message::json(events(), &json!({"type": "Changed"})).unwrap());
    txn.commit().await.unwrap();
    assert!(
        world.entity("o-1").await.entries.contains_key(&consumed),
        "the consumer's entry stays for the consumer"
    );
    assert_eq!(
        world.consumer.consume(&copy("q-2", "T:0", "o-1")).await.unwrap(),
        ConsumeOutcome::Resumed { messages: 1 }
    );
}
