//! The request and control paths on the embedded backend, one behaviour per test.

use std::sync::Arc;
use std::time::Duration;

use outbox::control::{ControlOutcome, ControlPath};
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::ports::{Clock, ControlDelivery, ExpectedVersion, ItemKey, Store, TombstoneOutcome};
use outbox::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, TxnId};
use outbox::request::{Outbox, TxnError, TxnStatus};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use outbox_tests::odd_store::{CommitStall, OddStore};
use serde_json::json;

struct Fixture {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    outbox: Outbox,
    control: ControlPath,
    timing: Timing,
}

impl Fixture {
    /// The control path handling transaction `txn_id`'s first control message.
    async fn first_check(&self, txn_id: TxnId) -> outbox::control::ItemReport {
        let message = ControlMessage::first(txn_id, self.clock.now());
        self.control.handle(&delivery("m-1", message.encode())).await
    }
}

fn fixture() -> Fixture {
    fixture_with_limits(TransactionLimits::default())
}

fn fixture_with_limits(limits: TransactionLimits) -> Fixture {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    backend.record();
    let timing = Timing::default();
    let outbox = Outbox::new(backend.request_ports(clock.clone()), timing, limits);
    let control = ControlPath::new(backend.control_ports(clock.clone()), timing);
    Fixture {
        clock,
        backend,
        outbox,
        control,
        timing,
    }
}

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn delivery(id: &str, body: String) -> ControlDelivery {
    ControlDelivery {
        message_id: id.into(),
        receipt: format!("r-{id}"),
        body,
        receive_count: 1,
    }
}

fn key(text: &str) -> ItemKey {
    text.parse().unwrap()
}

#[tokio::test]
async fn a_commit_after_a_tombstone_is_refused_and_writes_nothing() {
    let f = fixture();
    let mut txn = f.outbox.begin().await.unwrap();
    txn.put(key("ITEM#1"), json!({"n": 1}), ExpectedVersion::Absent);
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let now = f.clock.now();
    let written = f
        .backend
        .store
        .put_tombstone(txn.id(), now, now.plus(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(written, TombstoneOutcome::Written);

    let error = txn.commit().await.unwrap_err();
    assert!(matches!(error, TxnError::CommitWindowExpired { .. }), "{error:?}");
    assert!(
        f.backend.store.get_items(&[key("ITEM#1")]).await.unwrap().is_empty(),
        "the business write was not applied"
    );
}

#[tokio::test]
async fn a_tombstone_after_a_commit_is_refused_and_returns_the_record() {
    let f = fixture();
    let mut txn = f.outbox.begin().await.unwrap();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let committed = txn.commit().await.unwrap();
    let now = f.clock.now();
    match f.backend.store.put_tombstone(committed.txn_id, now, now).await.unwrap() {
        TombstoneOutcome::Exists(record) => assert_eq!(record.state, OutboxState::Pending),
        other => panic!("expected the committed record, got {other:?}"),
    }
}

#[tokio::test]
async fn a_retried_commit_whose_first_attempt_applied_reports_success() {
    let f = fixture();
    let mut txn = f.outbox.begin().await.unwrap();
    txn.put(key("ITEM#1"), json!({"n": 1}), ExpectedVersion::Absent);
    let txn_id = txn.id();
    // The first attempt: applied behind the caller's back (its reply was lost).
    let record = OutboxRecord::committed(
        txn_id,
        vec![],
        f.clock.now(),
        f.clock.now().plus(Duration::from_secs(60)),
    );
    let request = outbox::ports::CommitRequest {
        txn_id,
        writes: vec![outbox::ports::BusinessWrite::Put {
            key: key("ITEM#1"),
            data: json!({"n": 1}),
            expected: ExpectedVersion::Absent,
        }],
        outbox: record,
        idempotency: None,
    };
    f.backend.store.commit(&request).await.unwrap();
    // The retry finds its own record: committed, although its version condition fails.
    assert_eq!(txn.commit().await.unwrap().txn_id, txn_id);
}

#[tokio::test]
async fn a_transaction_without_messages_is_recorded_dispatched_and_never_tombstoned() {
    let f = fixture();
    let mut txn = f.outbox.begin().await.unwrap();
    txn.put(key("ITEM#1"), json!({"n": 1}), ExpectedVersion::Absent);
    let committed = txn.commit().await.unwrap();
    assert_eq!(f.outbox.status(committed.txn_id).await.unwrap(), TxnStatus::Dispatched);
    f.clock.advance(f.timing.max_commit_duration);
    let control = ControlMessage::first(committed.txn_id, f.clock.now());
    let report = f.control.handle(&delivery("m1", control.encode())).await;
    assert_eq!(
        report.result.unwrap(),
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
}

#[tokio::test]
async fn a_transaction_beyond_its_limits_is_refused_before_anything_is_written() {
    let f = fixture_with_limits(TransactionLimits {
        max_messages: 2,
        max_message_bytes: 1_000,
    });
    let mut txn = f.outbox.begin().await.unwrap();
    for n in 0..3 {
        txn.emit(Message::json(events(), &json!({ "n": n })).unwrap());
    }
    let txn_id = txn.id();
    assert!(matches!(txn.commit().await, Err(TxnError::TooLarge { .. })));
    assert_eq!(
        f.outbox.status(txn_id).await.unwrap(),
        TxnStatus::Tombstoned,
        "nothing but its tombstone written"
    );

    let mut txn = f.outbox.begin().await.unwrap();
    txn.emit(Message::json(events(), &"x".repeat(1_001)).unwrap());
    assert!(matches!(txn.commit().await, Err(TxnError::TooLarge { .. })));
}

#[tokio::test]
async fn a_concurrent_update_of_the_same_version_loses_with_a_conflict() {
    let f = fixture();
    let mut first = f.outbox.begin().await.unwrap();
    let mut second = f.outbox.begin().await.unwrap();
    first.put(key("ITEM#1"), json!({"n": 1}), ExpectedVersion::Absent);
    second.put(key("ITEM#1"), json!({"n": 2}), ExpectedVersion::Absent);
    first.commit().await.unwrap();
    match second.commit().await {
        Err(TxnError::VersionConflict { key: conflict, .. }) => assert_eq!(conflict, key("ITEM#1")),
        other => panic!("expected a version conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn deferral_delays_double_stay_capped_and_end_at_the_window() {
    let f = fixture();
    let left = Duration::from_secs(30);
    let delays: Vec<u64> = (1..=5)
        .map(|attempt| f.control.deferral_delay(attempt, left).as_secs())
        .collect();
    assert_eq!(
        delays,
        [2, 4, 8, 8, 8],
        "doubling from the first check delay, capped at 8 s"
    );
    assert_eq!(
        f.control.deferral_delay(3, Duration::from_millis(2_500)),
        Duration::from_secs(3),
        "rounded up to the window's end"
    );
    assert_eq!(
        f.control.deferral_delay(1, Duration::from_millis(10)),
        Duration::from_secs(1),
        "never zero"
    );
}

#[tokio::test]
async fn a_batch_with_every_kind_of_control_message_fails_only_the_garbage() {
    let f = fixture();
    // A committed transaction (pending).
    let mut txn = f.outbox.begin().await.unwrap();
    txn.emit(Message::json(events(), &json!({"kind": "pending"})).unwrap());
    let pending = txn.commit().await.unwrap().txn_id;
    // One committed and already dispatched (no messages).
    let dispatched = f.outbox.begin().await.unwrap().commit().await.unwrap().txn_id;
    // One tombstoned.
    let tombstoned = TxnId::new_v7();
    let now = f.clock.now();
    f.backend
        .store
        .put_tombstone(tombstoned, now, now.plus(Duration::from_secs(600)))
        .await
        .unwrap();
    // Two never committed: one within its window, one past it.
    let young = ControlMessage::first(TxnId::new_v7(), now);
    let old = ControlMessage::first(TxnId::new_v7(), Timestamp::from_millis(now.as_millis() - 31_000));

    let batch = [
        delivery("pending", ControlMessage::first(pending, now).encode()),
        delivery("dispatched", ControlMessage::first(dispatched, now).encode()),
        delivery("tombstoned", ControlMessage::first(tombstoned, now).encode()),
        delivery("young", young.encode()),
        delivery("old", old.encode()),
        delivery("garbage", "not json at all".into()),
        delivery("future", r#"{"version":9,"txn_id":"x"}"#.into()),
        delivery("duplicate", ControlMessage::first(pending, now).encode()),
    ];
    let report = f.control.handle_batch(&batch).await;
    assert_eq!(report.failed_message_ids(), ["garbage", "future"]);
    let outcome = |id: &str| {
        report
            .items
            .iter()
            .find(|item| item.message_id == id)
            .unwrap()
            .result
            .clone()
            .unwrap()
    };
    assert!(matches!(
        outcome("pending"),
        ControlOutcome::Dispatched { messages: 1, .. }
    ));
    assert_eq!(
        outcome("duplicate"),
        outcome("pending"),
        "a duplicate shares its transaction's result"
    );
    assert_eq!(
        outcome("dispatched"),
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
    assert_eq!(
        outcome("tombstoned"),
        ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }
    );
    assert_eq!(
        outcome("young"),
        ControlOutcome::Deferred {
            next_attempt: 2,
            delay: Duration::from_secs(2)
        }
    );
    assert_eq!(outcome("old"), ControlOutcome::Tombstoned);

    assert_eq!(f.outbox.status(pending).await.unwrap(), TxnStatus::Dispatched);
    assert_eq!(f.outbox.status(old.txn_id).await.unwrap(), TxnStatus::Tombstoned);
    assert_eq!(f.outbox.status(young.txn_id).await.unwrap(), TxnStatus::Unknown);
    let published = f.backend.publisher.queue(&events()).unwrap().sent();
    assert_eq!(published.len(), 1, "the duplicate did not publish twice");
}

#[tokio::test]
async fn a_control_send_failure_writes_nothing() {
    // A control queue that refuses the message: a delay beyond SQS's 15 minutes.
    let f = fixture();
    let broken = Outbox::new(
        f.backend.request_ports(f.clock.clone()),
        Timing {
            first_check_delay: Duration::from_secs(901),
            ..f.timing
        },
        TransactionLimits::default(),
    );
    assert!(matches!(broken.begin().await, Err(TxnError::ControlSend { .. })));
    assert!(f.backend.store.outbox_records().is_empty());
}

/// The request path over a store whose commits stall as `stall` says.
fn outbox_with_stalled_commits(f: &Fixture, stall: CommitStall) -> Outbox {
    outbox_over(
        f,
        OddStore {
            commit: stall,
            ..OddStore::around(f.backend.store.clone())
        },
    )
}

/// The request path over a store that misbehaves as `odd` says.
fn outbox_over(f: &Fixture, odd: OddStore) -> Outbox {
    Outbox::new(
        outbox::request::RequestPorts {
            store: Arc::new(odd),
            ..f.backend.request_ports(f.clock.clone())
        },
        f.timing,
        TransactionLimits::default(),
    )
}

/// A commit cut short in flight is settled by the tombstone: a definite answer, and the
/// attempt in flight can never apply.
#[tokio::test(start_paused = true)]
async fn a_commit_in_flight_at_the_deadline_is_fenced_by_its_tombstone_and_answered_definitely() {
    let f = fixture();
    let outbox = outbox_with_stalled_commits(&f, CommitStall::Forever);
    let deadline = f.clock.now().plus(Duration::from_secs(2));
    let mut txn = outbox.begin_within(deadline).await.unwrap();
    let txn_id = txn.id();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let started = tokio::time::Instant::now();
    let error = tokio::time::timeout(Duration::from_secs(60), txn.commit())
        .await
        .expect("the commit kept to its deadline")
        .unwrap_err();
    assert!(
        matches!(error, TxnError::Fenced { txn_id: id, .. } if id == txn_id),
        "{error:?}"
    );
    assert!(error.is_definite());
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2) - outbox::request::SETTLE_RESERVE,
        "one attempt, cut short before the deadline's reserve, and no retry after it"
    );
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Tombstoned);
}

/// When even the tombstone cannot be written before the deadline, the answer is
/// "outcome unknown", naming the transaction, at the deadline.
#[tokio::test(start_paused = true)]
async fn a_commit_that_cannot_be_settled_by_the_deadline_is_ambiguous_naming_its_transaction() {
    let f = fixture();
    let outbox = outbox_over(
        &f,
        OddStore {
            commit: CommitStall::Forever,
            tombstones_stall: true,
            ..OddStore::around(f.backend.store.clone())
        },
    );
    let deadline = f.clock.now().plus(Duration::from_secs(2));
    let mut txn = outbox.begin_within(deadline).await.unwrap();
    let txn_id = txn.id();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let started = tokio::time::Instant::now();
    let error = tokio::time::timeout(Duration::from_secs(60), txn.commit())
        .await
        .expect("the commit kept to its deadline")
        .unwrap_err();
    assert!(
        matches!(error, TxnError::Ambiguous { txn_id: id, .. } if id == txn_id),
        "{error:?}"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed > Duration::from_secs(2) - outbox::request::SETTLE_RESERVE && elapsed <= Duration::from_secs(2),
        "tried to settle until the deadline, and answered by it: {elapsed:?}"
    );
}

/// A refusal that follows an attempt of unknown outcome is not the last word while that
/// attempt may still be on its way: unsettled (the tombstone cannot be written), the
/// answer is "outcome unknown", not a conflict.
#[tokio::test(start_paused = true)]
async fn a_refusal_after_an_unknown_attempt_is_ambiguous_until_the_tombstone_settles_it() {
    let f = fixture();
    let outbox = outbox_over(
        &f,
        OddStore {
            commit: CommitStall::LostThenConflict,
            tombstones_stall: true,
            ..OddStore::around(f.backend.store.clone())
        },
    );
    let mut txn = outbox
        .begin_within(f.clock.now().plus(Duration::from_secs(2)))
        .await
        .unwrap();
    txn.put(key("ORDER#1"), json!({"n": 1}), ExpectedVersion::Absent);
    let error = txn.commit().await.unwrap_err();
    assert!(matches!(error, TxnError::Ambiguous { .. }), "{error:?}");

    // Settled, the same refusal is definite.
    let outbox = outbox_over(
        &f,
        OddStore {
            commit: CommitStall::LostThenConflict,
            ..OddStore::around(f.backend.store.clone())
        },
    );
    let mut txn = outbox.begin().await.unwrap();
    let txn_id = txn.id();
    txn.put(key("ORDER#2"), json!({"n": 1}), ExpectedVersion::Absent);
    let error = txn.commit().await.unwrap_err();
    assert!(matches!(error, TxnError::VersionConflict { .. }), "{error:?}");
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Tombstoned);
}

/// A commit that applied but whose every reply was lost: the tombstone write finds the
/// transaction's own record, and the answer is success.
#[tokio::test]
async fn a_commit_whose_replies_were_lost_is_found_committed_by_the_settling_write() {
    let f = fixture();
    let outbox = outbox_with_stalled_commits(&f, CommitStall::ReplyLost);
    let mut txn = outbox.begin().await.unwrap();
    let txn_id = txn.id();
    txn.put(key("ORDER#1"), json!({"n": 1}), ExpectedVersion::Absent);
    let id = txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let committed = txn.commit().await.expect("it committed");
    assert_eq!((committed.txn_id, committed.message_ids), (txn_id, vec![id]));
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Pending);
}

#[tokio::test]
async fn a_deadline_passed_before_the_commit_is_definite_and_the_transaction_is_tombstoned() {
    let f = fixture();
    let deadline = f.clock.now().plus(Duration::from_secs(2));
    let mut txn = f.outbox.begin_within(deadline).await.unwrap();
    let txn_id = txn.id();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    f.clock.advance(Duration::from_secs(3));
    let error = txn.commit().await.unwrap_err();
    assert!(
        matches!(error, TxnError::DeadlineExceeded { txn_id: id } if id == txn_id),
        "{error:?}"
    );
    assert!(error.is_definite());
    assert_eq!(
        f.outbox.status(txn_id).await.unwrap(),
        TxnStatus::Unknown,
        "nothing written"
    );
}

/// A commit still on its way when the deadline came is fenced: the answer says nothing
/// was written, and when the late request reaches the table it is refused.
#[tokio::test(start_paused = true)]
async fn a_commit_that_would_land_after_its_deadline_is_refused_by_the_tombstone_it_was_answered_with() {
    let f = fixture();
    let outbox = outbox_with_stalled_commits(&f, CommitStall::AppliesAfter(Duration::from_secs(3)));
    let mut txn = outbox
        .begin_within(f.clock.now().plus(Duration::from_secs(1)))
        .await
        .unwrap();
    let txn_id = txn.id();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let error = txn.commit().await.unwrap_err();
    assert!(matches!(error, TxnError::Fenced { .. }), "{error:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        f.outbox.status(txn_id).await.unwrap(),
        TxnStatus::Tombstoned,
        "the late commit was refused"
    );
}

/// Without the tombstone (its write stalls too), the same late commit is answered
/// "outcome unknown", and it does commit.
#[tokio::test(start_paused = true)]
async fn a_commit_that_lands_after_an_unsettled_deadline_was_reported_ambiguous_not_failed() {
    let f = fixture();
    let outbox = outbox_over(
        &f,
        OddStore {
            commit: CommitStall::AppliesAfter(Duration::from_secs(3)),
            tombstones_stall: true,
            ..OddStore::around(f.backend.store.clone())
        },
    );
    let mut txn = outbox
        .begin_within(f.clock.now().plus(Duration::from_secs(1)))
        .await
        .unwrap();
    let txn_id = txn.id();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let error = txn.commit().await.unwrap_err();
    assert!(!error.is_definite(), "{error:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        f.outbox.status(txn_id).await.unwrap(),
        TxnStatus::Pending,
        "it did commit"
    );
}

/// An abandoned transaction is tombstoned by the request path: its control message finds
/// it settled at the first check, with no deferral.
#[tokio::test]
async fn an_abandoned_transaction_is_tombstoned_at_once_and_its_first_check_finds_it_settled() {
    let f = fixture();
    let txn = f.outbox.begin().await.unwrap();
    let txn_id = txn.id();
    assert_eq!(txn.abandon().await, outbox::request::Settlement::Tombstoned);
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Tombstoned);
    let report = f.first_check(txn_id).await;
    assert_eq!(
        report.result.unwrap(),
        ControlOutcome::AlreadyDone {
            state: OutboxState::Tombstone
        }
    );
}

/// A definite commit failure settles the transaction the same way.
#[tokio::test]
async fn a_definite_commit_failure_tombstones_the_transaction() {
    let f = fixture();
    let mut txn = f.outbox.begin().await.unwrap();
    let txn_id = txn.id();
    // The item does not exist at version 3.
    txn.put(key("ORDER#9"), json!({"n": 1}), ExpectedVersion::Exactly(3));
    let error = txn.commit().await.unwrap_err();
    assert!(matches!(error, TxnError::VersionConflict { .. }), "{error:?}");
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Tombstoned);
}

/// With inline publishing the request path publishes the committed messages and marks
/// the record itself: the event is out before the answer, and the control message finds
/// the transaction done.
#[tokio::test]
async fn inline_publishing_sends_the_events_before_answering_and_leaves_the_worker_nothing() {
    let f = fixture();
    let publisher: Arc<dyn outbox::ports::Publisher> = f.backend.publisher.clone();
    let outbox = f.outbox.clone().with_inline_publisher(publisher);
    let mut txn = outbox.begin().await.unwrap();
    txn.put(key("ORDER#1"), json!({"n": 1}), ExpectedVersion::Absent);
    let id = txn.emit(Message::json(events(), &json!({"type": "Placed"})).unwrap());
    let committed = txn.commit().await.unwrap();
    assert_eq!(committed.inline, outbox::request::InlineDispatch::Dispatched);
    let sent = f.backend.publisher.queue(&events()).unwrap().sent();
    assert_eq!(sent.len(), 1, "published before the answer");
    assert_eq!(outbox.status(committed.txn_id).await.unwrap(), TxnStatus::Dispatched);
    assert!(sent[0].request.attributes.values().any(|value| value == id.as_str()));

    the_worker_finds_it_done(&f, committed.txn_id).await;
}

/// The first check of a transaction the request path dispatched itself: already done,
/// and its one event published once.
async fn the_worker_finds_it_done(f: &Fixture, txn_id: TxnId) {
    let report = f.first_check(txn_id).await;
    assert_eq!(
        report.result.unwrap(),
        ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched
        }
    );
    assert_eq!(
        f.backend.publisher.queue(&events()).unwrap().sent().len(),
        1,
        "published once"
    );
}

/// A publisher that sends nothing until released.
struct HeldPublisher {
    inner: Arc<dyn outbox::ports::Publisher>,
    released: tokio::sync::Semaphore,
}

#[async_trait::async_trait]
impl outbox::ports::Publisher for HeldPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[outbox::protocol::OutgoingMessage],
    ) -> Result<Vec<outbox::ports::EntryFailure>, outbox::ports::PublishError> {
        let _permit = self.released.acquire().await.expect("open");
        self.inner.send_batch(destination, messages).await
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &outbox::protocol::OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }
}

/// Publishing after the answer: the commit returns before anything is published (the
/// publisher is held), the dispatch runs on its own and is counted until done, and then
/// the event is out once and the control message finds the transaction done.
#[tokio::test]
async fn publishing_after_the_answer_returns_before_the_publish_and_finishes_it_after() {
    let f = fixture();
    let held = Arc::new(HeldPublisher {
        inner: f.backend.publisher.clone(),
        released: tokio::sync::Semaphore::new(0),
    });
    let after = outbox::request::AfterAnswer::on_tokio();
    let outbox = f
        .outbox
        .clone()
        .with_publishing_after_answer(held.clone(), after.clone());
    let mut txn = outbox.begin().await.unwrap();
    txn.put(key("ORDER#1"), json!({"n": 1}), ExpectedVersion::Absent);
    txn.emit(Message::json(events(), &json!({"type": "Placed"})).unwrap());
    let committed = txn.commit().await.unwrap();
    assert_eq!(committed.inline, outbox::request::InlineDispatch::AfterAnswer);
    assert_eq!(after.running(), 1, "the dispatch is counted while it runs");
    assert!(
        f.backend.publisher.queue(&events()).unwrap().sent().is_empty(),
        "nothing published before the answer"
    );
    assert_eq!(outbox.status(committed.txn_id).await.unwrap(), TxnStatus::Pending);
    held.released.add_permits(100);
    assert!(after.idle_within(Duration::from_secs(5)).await, "the dispatch finished");
    assert_eq!(f.backend.publisher.queue(&events()).unwrap().sent().len(), 1);
    assert_eq!(outbox.status(committed.txn_id).await.unwrap(), TxnStatus::Dispatched);
    the_worker_finds_it_done(&f, committed.txn_id).await;
}

/// Inline publishing that fails leaves the record pending for the worker, and the
/// answer is the commit's.
#[tokio::test]
async fn inline_publishing_that_fails_is_left_to_the_worker() {
    let f = fixture();
    // A publisher with no such destination refuses every message.
    let nowhere = Arc::new(outbox::embedded::EmbeddedPublisher::new(Default::default()));
    let outbox = f.outbox.clone().with_inline_publisher(nowhere);
    let mut txn = outbox.begin().await.unwrap();
    txn.emit(Message::json(events(), &json!({"type": "Placed"})).unwrap());
    let committed = txn.commit().await.expect("the commit happened");
    assert_eq!(committed.inline, outbox::request::InlineDispatch::LeftToWorker);
    assert_eq!(outbox.status(committed.txn_id).await.unwrap(), TxnStatus::Pending);
    let report = f.first_check(committed.txn_id).await;
    assert!(matches!(report.result.unwrap(), ControlOutcome::Dispatched { .. }));
    assert_eq!(f.backend.publisher.queue(&events()).unwrap().sent().len(), 1);
}
