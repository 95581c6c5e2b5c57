//! The request and control paths on the embedded backend, one behaviour per test; and the
//! request path served on Lambda, driven through a fake Runtime API (`outbox_tests::fake_lambda`).

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
use serde_json::{json, Value};

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
        TxnStatus::Unknown,
        "nothing written, not even a tombstone"
    );
    assert!(
        f.backend.control_queue.queue().sent().is_empty(),
        "refused before its control message was sent"
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
    // Nothing is sent at begin: the send fails with the commit (or with an early
    // `send_control`), and nothing is written.
    let mut txn = broken.begin().await.unwrap();
    txn.put(key("ITEM#1"), json!({"n": 1}), ExpectedVersion::Absent);
    assert!(matches!(txn.commit().await, Err(TxnError::ControlSend { .. })));
    let early = broken.begin().await.unwrap();
    assert!(matches!(early.send_control().await, Err(TxnError::ControlSend { .. })));
    assert!(f.backend.store.outbox_records().is_empty());
    assert!(f.backend.store.get_items(&[key("ITEM#1")]).await.unwrap().is_empty());
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

/// A transaction abandoned before its control message was sent leaves nothing: no record,
/// no control message. One abandoned after its control message was sent
/// (`Transaction::send_control`) is tombstoned by the request path: its control message
/// finds it settled at the first check, with no deferral.
#[tokio::test]
async fn an_abandoned_transaction_is_tombstoned_at_once_and_its_first_check_finds_it_settled() {
    let f = fixture();
    let txn = f.outbox.begin().await.unwrap();
    let txn_id = txn.id();
    assert_eq!(txn.abandon().await, outbox::request::Settlement::NothingSent);
    assert_eq!(f.outbox.status(txn_id).await.unwrap(), TxnStatus::Unknown);
    assert!(f.backend.control_queue.queue().sent().is_empty());

    let txn = f.outbox.begin().await.unwrap();
    txn.send_control().await.unwrap();
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

/// The Lambda function the Runtime API tests below start, as a process of its own (this
/// test binary, running this test alone, with the variables Lambda sets). As `orders`:
/// the request path on the embedded backend served by `outbox::http::lambda::run`,
/// publishing after the answer through a publisher the test holds, invocation by
/// invocation. As `batches`: an SQS handler under `outbox::telemetry::lambda::run`, the
/// control worker's and the consumers' runtime loop, each batch waiting at a gate. Does
/// nothing when run otherwise.
#[test]
#[ignore = "the function's process of the Lambda Runtime API tests, which start it"]
fn lambda_function_process() {
    let Ok(role) = std::env::var("OUTBOX_TESTS_LAMBDA_FUNCTION") else {
        return;
    };
    if role == "verbose" {
        return verbose_function_process();
    }
    if let Some(which) = role.strip_prefix("service-") {
        return service_function_process(which);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let runtime_api = std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap();
    if role == "batches" {
        use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
        use lambda_http::lambda_runtime::{service_fn, LambdaEvent};
        let handler = service_fn(move |_: LambdaEvent<SqsEvent>| {
            let runtime_api = runtime_api.clone();
            async move {
                outbox_tests::fake_lambda::call(&runtime_api, "/test/gate/batches/4").await?;
                Ok::<_, lambda_http::Error>(SqsBatchResponse::default())
            }
        });
        let stopped = runtime.block_on(outbox::telemetry::lambda::run(handler));
        panic!("the function stopped: {stopped:?}");
    }
    let stopped = runtime.block_on(async {
        let f = fixture();
        let after = outbox::request::AfterAnswer::on_tokio();
        let held = Arc::new(HeldByTheTest {
            inner: f.backend.publisher.clone(),
            runtime_api: runtime_api.clone(),
        });
        let outbox = f.outbox.clone().with_publishing_after_answer(held, after.clone());
        let app = axum::Router::new()
            .route("/orders/{key}", axum::routing::get(place_on_lambda))
            .with_state((outbox, runtime_api));
        outbox::http::lambda::run(app, Some(after)).await
    });
    panic!("the function stopped: {stopped:?}");
}

/// Places order `key` (one message): first, with `?gate=N`, waits until N handlers are
/// inside at once.
async fn place_on_lambda(
    axum::extract::State((outbox, runtime_api)): axum::extract::State<(Outbox, String)>,
    axum::extract::Path(order): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> String {
    if let Some(count) = query.get("gate") {
        outbox_tests::fake_lambda::call(&runtime_api, &format!("/test/gate/inside/{count}"))
            .await
            .expect("the gate");
    }
    let mut txn = outbox.begin().await.unwrap();
    txn.put(
        key(&format!("ORDER#{order}")),
        json!({"order": order}),
        ExpectedVersion::Absent,
    );
    txn.emit(Message::json(events(), &json!({"type": "Placed", "order": order})).unwrap());
    let committed = txn.commit().await.unwrap();
    assert_eq!(committed.inline, outbox::request::InlineDispatch::AfterAnswer);
    order
}

/// A publisher that publishes for an invocation once the test released it (the
/// invocation the publishing after the answer runs for is its current one), and says so.
struct HeldByTheTest {
    inner: Arc<dyn outbox::ports::Publisher>,
    runtime_api: String,
}

#[async_trait::async_trait]
impl outbox::ports::Publisher for HeldByTheTest {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[outbox::protocol::OutgoingMessage],
    ) -> Result<Vec<outbox::ports::EntryFailure>, outbox::ports::PublishError> {
        use outbox::request::after_answer::Invocation;
        use outbox_tests::fake_lambda::call;
        let invocation = Invocation::current().map_or_else(|| "none".to_owned(), |it| it.id().to_owned());
        call(&self.runtime_api, &format!("/test/hold/{invocation}"))
            .await
            .expect("held");
        let sent = self.inner.send_batch(destination, messages).await;
        call(&self.runtime_api, &format!("/test/mark/published-{invocation}"))
            .await
            .expect("marked");
        sent
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &outbox::protocol::OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }
}

/// The most invocations delivered and not answered yet at any one time.
fn most_in_flight(timeline: &[outbox_tests::fake_lambda::Event]) -> usize {
    use outbox_tests::fake_lambda::Seen;
    let (mut now, mut most) = (0usize, 0usize);
    for event in timeline {
        match event.seen {
            Seen::Delivered(_) => now += 1,
            Seen::Answered(..) | Seen::Failed(..) => now = now.saturating_sub(1),
            _ => continue,
        }
        most = most.max(now);
    }
    most
}

/// The debug line `outbox::http::lambda` writes once an invocation's work after the
/// answer is done.
fn work_done_for(request_id: &str) -> impl Fn(&outbox_tests::fake_lambda::Seen) -> bool + '_ {
    move |seen| {
        matches!(seen, outbox_tests::fake_lambda::Seen::Output(line)
            if line.contains("the invocation's work after the answer is done")
                && line.contains(&format!("request_id={request_id}")))
    }
}

/// The warning `outbox::http::lambda` writes when an invocation's deadline comes before
/// its work after the answer is done.
fn late_for(request_id: &str) -> impl Fn(&outbox_tests::fake_lambda::Seen) -> bool + '_ {
    move |seen| {
        matches!(seen, outbox_tests::fake_lambda::Seen::Output(line)
            if line.contains("deadline came before publishing after the answer was done")
                && line.contains(&format!("request_id={request_id}")))
    }
}

/// On Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY=4`), driven through the
/// Runtime API as Lambda drives it: four invocations are in the handler at once (a gate
/// opens only with all four inside), each answers while its publishing after the answer
/// is held, and each invocation's work is followed on its own: released one by one, each
/// is seen done while the others are still held; the one whose deadline comes first is
/// warned about, alone, and still finishes. No extension registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_managed_instances_invocations_run_at_once_each_followed_by_its_own_work_only() {
    use outbox_tests::fake_lambda::{FakeLambda, Invoke, Model, Seen};
    let lambda = FakeLambda::start(Model::ManagedInstances).await;
    let orders = ["alpha", "bravo", "charlie", "delta"];
    for order in orders {
        let timeout = Duration::from_secs(if order == "delta" { 3 } else { 60 });
        lambda.invoke(Invoke::http_get(order, &format!("/orders/{order}?gate=4"), timeout));
    }
    let _function = lambda.start_function(
        "lambda_function_process",
        "orders",
        Some(4),
        "outbox::http::lambda=debug,warn",
    );
    let answered = |order: &'static str| move |seen: &Seen| matches!(seen, Seen::Answered(id, _) if id == order);
    let mut answers = Vec::new();
    for order in orders {
        let event = lambda
            .wait_for(Duration::from_secs(30), answered(order))
            .await
            .unwrap_or_else(|timeline| panic!("{order} was not answered:\n{timeline}"));
        let Seen::Answered(_, body) = &event.seen else {
            unreachable!()
        };
        assert_eq!(body["statusCode"], 200, "{body}");
        assert_eq!(body["body"], order, "{body}");
        answers.push(event.at);
    }
    let timeline = lambda.timeline();
    let inside: Vec<_> = timeline
        .iter()
        .filter(|event| matches!(event.seen, Seen::Entered(_)))
        .map(|event| event.at)
        .collect();
    let first_answer = answers.iter().min().copied().unwrap();
    assert_eq!(inside.len(), 4, "{}", lambda.describe());
    assert!(
        inside.iter().all(|at| *at <= first_answer),
        "all four were inside before any answered:\n{}",
        lambda.describe()
    );
    assert_eq!(most_in_flight(&timeline), 4, "{}", lambda.describe());
    for order in orders {
        lambda
            .wait_for(
                Duration::from_secs(5),
                |seen| matches!(seen, Seen::Held(key) if key == order),
            )
            .await
            .unwrap_or_else(|timeline| panic!("{order}'s publishing was not held:\n{timeline}"));
    }
    println!(
        "managed instances: 4 invocations in the handler at once (gate of 4 passed at {:.0}-{:.0} ms), answered at {:.0}-{:.0} ms, the 4 publishings after the answer held",
        lambda.ms(*inside.iter().min().unwrap()),
        lambda.ms(*inside.iter().max().unwrap()),
        lambda.ms(first_answer),
        lambda.ms(*answers.iter().max().unwrap()),
    );

    for (index, order) in orders[..3].iter().enumerate() {
        let still_held = &orders[index + 1..];
        lambda.release(order);
        let freed = std::time::Instant::now();
        let done = lambda
            .wait_for(Duration::from_secs(5), work_done_for(order))
            .await
            .unwrap_or_else(|timeline| {
                panic!("{order}'s work after the answer was not seen done while {still_held:?} were held:\n{timeline}")
            });
        for other in still_held {
            assert!(
                !lambda
                    .timeline()
                    .iter()
                    .any(|event| work_done_for(other)(&event.seen)
                        || event.seen == Seen::Mark(format!("published-{other}"))),
                "{other} was held:\n{}",
                lambda.describe()
            );
        }
        println!(
            "managed instances: {order}'s work after the answer seen done {:.1} ms after its release, {still_held:?} still held",
            done.at.duration_since(freed).as_secs_f64() * 1000.0
        );
    }
    let warned = lambda
        .wait_for(Duration::from_secs(10), late_for("delta"))
        .await
        .unwrap_or_else(|timeline| panic!("delta's late publishing was not warned about:\n{timeline}"));
    assert!(
        !lambda
            .timeline()
            .iter()
            .any(|event| orders[..3].iter().any(|order| late_for(order)(&event.seen))),
        "only delta was late:\n{}",
        lambda.describe()
    );
    lambda.release("delta");
    lambda
        .wait_for(Duration::from_secs(5), work_done_for("delta"))
        .await
        .unwrap_or_else(|timeline| {
            panic!("delta's work after the answer did not finish after its deadline:\n{timeline}")
        });
    assert!(
        !lambda
            .timeline()
            .iter()
            .any(|event| matches!(event.seen, Seen::Registered(..) | Seen::Refused(..))),
        "no extension registers on Managed Instances:\n{}",
        lambda.describe()
    );
    println!(
        "managed instances: delta's deadline (3 s) came at {:.0} ms with its publishing held: warned about, alone; released, it finished; no extension registered",
        lambda.ms(warned.at)
    );
}

/// On Lambda (default; `AWS_LAMBDA_MAX_CONCURRENCY` unset), driven through the Runtime and
/// Extensions APIs as Lambda drives them: one invocation at a time, each held by the
/// internal extension until no work after an answer is left in the environment (a freeze
/// would stop any of it halfway): the first one's publishing is still held when its
/// deadline comes (warned about; the extension lets it go 200 ms before); the second one,
/// whose own publishing goes at once, is held until the first one's, left behind, is
/// done; the third one until its own is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lambda_one_invocation_at_a_time_is_held_until_no_work_is_left() {
    use outbox_tests::fake_lambda::{FakeLambda, Invoke, Model, Seen};
    let lambda = FakeLambda::start(Model::OneAtATime).await;
    lambda.invoke(Invoke::http_get("one", "/orders/one", Duration::from_millis(3000)));
    lambda.invoke(Invoke::http_get("two", "/orders/two", Duration::from_secs(60)));
    lambda.invoke(Invoke::http_get("three", "/orders/three", Duration::from_secs(60)));
    lambda.release("two");
    let _function = lambda.start_function(
        "lambda_function_process",
        "orders",
        None,
        "outbox::http::lambda=debug,warn",
    );
    let seen = |what: Seen| move |seen: &Seen| *seen == what;
    let at = |what: Seen, within: Duration| {
        let lambda = &lambda;
        async move {
            lambda
                .wait_for(within, seen(what.clone()))
                .await
                .unwrap_or_else(|timeline| panic!("not seen: {what:?}\n{timeline}"))
                .at
        }
    };
    let registered = lambda
        .wait_for(Duration::from_secs(30), |seen| matches!(seen, Seen::Registered(..)))
        .await
        .unwrap_or_else(|timeline| panic!("no extension registered:\n{timeline}"));
    assert_eq!(
        registered.seen,
        Seen::Registered(outbox::http::lambda::EXTENSION_NAME.into(), vec!["INVOKE".into()])
    );

    let delivered_one = at(Seen::Delivered("one".into()), Duration::from_secs(30)).await;
    lambda
        .wait_for(
            Duration::from_secs(5),
            |seen| matches!(seen, Seen::Answered(id, _) if id == "one"),
        )
        .await
        .unwrap_or_else(|timeline| panic!("one was not answered:\n{timeline}"));
    let released_one = at(Seen::Released("one".into()), Duration::from_secs(10)).await;
    let held_one = released_one.duration_since(delivered_one);
    assert!(
        held_one >= Duration::from_millis(2750),
        "one was held until its deadline less the margin, not {held_one:?}:\n{}",
        lambda.describe()
    );
    lambda
        .wait_for(Duration::from_secs(5), late_for("one"))
        .await
        .unwrap_or_else(|timeline| panic!("one's late publishing was not warned about:\n{timeline}"));

    let delivered_two = at(Seen::Delivered("two".into()), Duration::from_secs(5)).await;
    assert!(
        delivered_two >= released_one,
        "frozen until the extension let one go:\n{}",
        lambda.describe()
    );
    let answered_two = lambda
        .wait_for(
            Duration::from_secs(5),
            |seen| matches!(seen, Seen::Answered(id, _) if id == "two"),
        )
        .await
        .unwrap_or_else(|timeline| panic!("two was not answered:\n{timeline}"))
        .at;
    at(Seen::Mark("published-two".into()), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lambda
            .timeline()
            .iter()
            .any(|event| event.seen == Seen::Released("two".into())),
        "two was let go with one's publishing, left behind, still running (a freeze would stop it):\n{}",
        lambda.describe()
    );
    lambda.release("one");
    let published_one = at(Seen::Mark("published-one".into()), Duration::from_secs(5)).await;
    let released_two = at(Seen::Released("two".into()), Duration::from_secs(5)).await;
    assert!(
        released_two >= published_one,
        "two let go before one's publishing was done:\n{}",
        lambda.describe()
    );

    at(Seen::Delivered("three".into()), Duration::from_secs(5)).await;
    at(Seen::Held("three".into()), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lambda
            .timeline()
            .iter()
            .any(|event| event.seen == Seen::Released("three".into())),
        "three was let go before its own publishing was done:\n{}",
        lambda.describe()
    );
    lambda.release("three");
    let published_three = at(Seen::Mark("published-three".into()), Duration::from_secs(5)).await;
    let released_three = at(Seen::Released("three".into()), Duration::from_secs(5)).await;
    assert!(released_three >= published_three);
    assert_eq!(most_in_flight(&lambda.timeline()), 1, "{}", lambda.describe());
    println!(
        "one at a time: one held {:.0} ms by the extension (deadline 3000 ms, margin 200 ms) and warned about; two held {:.0} ms after its answer, let go {:.1} ms after one's publishing (left behind) was done; three let go {:.1} ms after its own publishing; never more than 1 invocation in flight",
        held_one.as_secs_f64() * 1000.0,
        released_two.duration_since(answered_two).as_secs_f64() * 1000.0,
        released_two.duration_since(published_one).as_secs_f64() * 1000.0,
        released_three.duration_since(published_three).as_secs_f64() * 1000.0,
    );
}

/// The control worker's and the consumers' runtime loop (`outbox::telemetry::lambda::run`)
/// on Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY=4`): four SQS batches are in
/// the handler at once (a gate opens only with all four inside), and each is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_managed_instances_the_batch_handlers_take_batches_at_once() {
    use outbox_tests::fake_lambda::{FakeLambda, Invoke, Model, Seen};
    let lambda = FakeLambda::start(Model::ManagedInstances).await;
    let batches = ["batch-1", "batch-2", "batch-3", "batch-4"];
    for batch in batches {
        lambda.invoke(Invoke::sqs(batch, Duration::from_secs(60)));
    }
    let _function = lambda.start_function("lambda_function_process", "batches", Some(4), "warn");
    for batch in batches {
        let answer = lambda
            .wait_for(
                Duration::from_secs(30),
                |seen| matches!(seen, Seen::Answered(id, _) if id == batch),
            )
            .await
            .unwrap_or_else(|timeline| panic!("{batch} was not answered:\n{timeline}"));
        let Seen::Answered(_, body) = answer.seen else {
            unreachable!()
        };
        assert_eq!(body, json!({"batchItemFailures": []}));
    }
    let timeline = lambda.timeline();
    let inside: Vec<_> = timeline
        .iter()
        .filter(|event| matches!(event.seen, Seen::Entered(_)))
        .map(|event| event.at)
        .collect();
    let first_answer = timeline
        .iter()
        .find(|event| matches!(event.seen, Seen::Answered(..)))
        .map(|event| event.at)
        .unwrap();
    assert_eq!(inside.len(), 4, "{}", lambda.describe());
    assert!(inside.iter().all(|at| *at <= first_answer), "{}", lambda.describe());
    assert_eq!(most_in_flight(&timeline), 4, "{}", lambda.describe());
    println!(
        "managed instances: 4 SQS batches in the handler at once (gate of 4 passed at {:.0}-{:.0} ms), all answered",
        lambda.ms(*inside.iter().min().unwrap()),
        lambda.ms(*inside.iter().max().unwrap()),
    );
}

/// What a token, a secret key, a session token and a request body's password look like in
/// the secrets test: none may appear in any line the function writes.
const SECRETS: [&str; 4] = [
    "eyJraWQiOiJTRUNSRVQtQkVBUkVSLVRPS0VOIn0.SECRET-BEARER-TOKEN",
    "SECRET-ACCESS-KEY-do-not-log",
    "SECRET-SESSION-TOKEN-do-not-log",
    "SECRET-BODY-PASSWORD",
];

/// The function of the secrets test, as `lambda_function_process` starts it with role
/// `verbose`: the binaries' own logging (`outbox::logging::init`, at the level its
/// environment asks for), one request to SQS signed with a session token, then the
/// orders API's router with sign-in required, served by `outbox::http::lambda::run`.
fn verbose_function_process() {
    outbox::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let runtime_api = std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap();
    let stopped = runtime.block_on(async {
        use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
        // Signed and sent (to the fake Runtime API, which refuses it): the SDK's trace of
        // the signing and of the request is what is looked at.
        let credentials = Credentials::new("AKIDEXAMPLE", SECRETS[1], Some(SECRETS[2].to_owned()), None, "test");
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(credentials)
            .endpoint_url(format!("http://{runtime_api}"))
            .build();
        let sent = aws_sdk_sqs::Client::from_conf(config)
            .send_message()
            .queue_url(format!("http://{runtime_api}/123456789012/q"))
            .message_body("signed")
            .send()
            .await;
        tracing::info!(refused = sent.is_err(), "the signed request was sent");
        // The level asked for is at work: this line is written.
        tracing::trace!("the function logs at trace");
        let f = fixture();
        let state = api::state::AppState {
            outbox: Arc::new(f.outbox.clone()),
            events: events(),
        };
        let config = api::app::HttpConfig {
            authentication: outbox::http::Authentication::Jwt,
            ..api::app::HttpConfig::default()
        };
        outbox::http::lambda::run(api::app::router(state, &config), None).await
    });
    panic!("the function stopped: {stopped:?}");
}

/// No log level writes a secret: the function runs at the most verbose level there is
/// (`trace`, and directives naming the crates that log what they carry at `trace`), signs
/// an AWS request with a session token, and serves two requests carrying a bearer token,
/// one of them with a password in its body. Not one line it writes holds the token, the
/// secret key, the session token or the password, while the trace level is seen at work
/// (lines at TRACE, the runtime's debug lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_level_writes_a_token_a_key_or_a_bodys_credentials() {
    use outbox_tests::fake_lambda::{FakeLambda, Invoke, Model, Seen};
    let lambda = FakeLambda::start(Model::OneAtATime).await;
    let event = |request_id: &str, body: Value| {
        let mut payload: Value = serde_json::from_str(include_str!("../fixtures/apigw_v2_create_order.json")).unwrap();
        payload["headers"]["authorization"] = json!(format!("Bearer {}", SECRETS[0]));
        payload["headers"]["content-length"] = json!(body.to_string().len().to_string());
        payload["requestContext"]["requestId"] = json!(request_id);
        payload["requestContext"]["authorizer"] = json!({"jwt": {
            "claims": {"sub": "alice", "iss": "https://issuer.example"}, "scopes": ["orders/write"]}});
        payload["body"] = json!(body.to_string());
        Invoke {
            request_id: request_id.to_owned(),
            payload,
            timeout: Duration::from_secs(30),
        }
    };
    lambda.invoke(event(
        "place",
        json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}]}),
    ));
    lambda.invoke(event(
        "credentials-in-the-body",
        json!({"customer_id": "c-1", "items": [], "password": SECRETS[3]}),
    ));
    let function = lambda.start_function(
        "lambda_function_process",
        "verbose",
        None,
        "trace,lambda_runtime=trace,lambda_http=trace,aws_sigv4=trace,aws_smithy_runtime=trace,hyper=trace",
    );
    for (request_id, status) in [("place", 201), ("credentials-in-the-body", 422)] {
        let answered = lambda
            .wait_for(
                Duration::from_secs(30),
                |seen| matches!(seen, Seen::Answered(id, _) if id == request_id),
            )
            .await
            .unwrap_or_else(|timeline| panic!("{request_id} was not answered:\n{timeline}"));
        let Seen::Answered(_, body) = &answered.seen else {
            unreachable!()
        };
        assert_eq!(body["statusCode"], status, "{request_id}: {body}");
    }
    // Every line it wrote, to the last: some may still be in the pipe after its answers.
    function.stop(Duration::from_secs(30));
    let lines: Vec<String> = lambda
        .timeline()
        .into_iter()
        .filter_map(|event| match event.seen {
            Seen::Output(line) => Some(line),
            _ => None,
        })
        .collect();
    let leaks: Vec<&String> = lines
        .iter()
        .filter(|line| SECRETS.iter().any(|secret| line.contains(secret)))
        .collect();
    assert!(
        leaks.is_empty(),
        "{} of {} lines hold a secret:\n{}",
        leaks.len(),
        lines.len(),
        leaks.iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n")
    );
    let traced = lines
        .iter()
        .filter(|line| line.contains("\"level\":\"TRACE\"") && line.contains("the function logs at trace"))
        .count();
    let runtime_debug = lines
        .iter()
        .filter(|line| line.contains("DEBUG") && line.contains("lambda_runtime"))
        .count();
    assert!(
        traced == 1 && runtime_debug > 0,
        "the trace level at work: {traced} line at TRACE of the function's own, {runtime_debug} of the runtime at DEBUG:\n{}",
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|line| line.contains("the signed request was sent")),
        "{}",
        lines.join("\n")
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("\"level\":\"DEBUG\"") && line.contains("aws_smithy_runtime")),
        "the SDK's request traced at DEBUG:\n{}",
        lines.join("\n")
    );
    println!(
        "secrets: {} lines at the most verbose level (the function's own at TRACE, {runtime_debug} of the runtime at DEBUG), none holding a token, a key or a body's password",
        lines.len()
    );
}

/// The inventory's binary (`Service::from_env()...serve`) as one of its Lambda functions,
/// as `lambda_function_process` starts it with role `service-consumer` or `service-api`,
/// on emulators of its own: the table and queues its bootstrap makes, and the settings a
/// template gives each function, the consumer's naming it (`OUTBOX_CONSUMER_NAME=ledger`).
fn service_function_process(which: &str) {
    use outbox::aws::{bootstrap, AwsClients, ConsumerResource, ResourceNames};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stopped = runtime.block_on(async {
        let emulator = outbox_tests::emulator::emulator();
        let clients = AwsClients::new(&emulator.sdk_config().await);
        let stack = outbox_tests::emulator::unique_name("one-binary");
        let ledger = ConsumerResource::for_stack(&stack, "ledger".parse().unwrap(), "events".parse().unwrap(), []);
        let resources = bootstrap(&clients, &ResourceNames::for_stack(&stack).with_consumer(ledger))
            .await
            .expect("the stack's table and queues");
        let mut settings: Vec<(String, String)> = [
            ("OUTBOX_BACKEND", "aws"),
            ("OUTBOX_TABLE_NAME", resources.layout.table.as_str()),
            ("OUTBOX_CONTROL_QUEUE_URL", resources.control_queue_url.as_str()),
            ("OUTBOX_AUTH", "off"),
            ("OUTBOX_AUTH_OFF_EXPOSED", "allow"),
            ("AWS_ENDPOINT_URL", emulator.endpoint.as_str()),
            ("AWS_ENDPOINT_URL_DYNAMODB", emulator.dynamodb_endpoint.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .into();
        if which == "consumer" {
            let consumer = resources.consumer.as_ref().expect("the ledger's queues");
            settings.extend(
                consumer
                    .variables()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value)),
            );
        }
        // This process is the function alone: its environment is its own to set.
        for (name, value) in settings {
            std::env::set_var(name, value);
        }
        outbox::service::Service::from_env()?
            .consumer("ledger", "events", inventory::ledger::Ledger)?
            .serve(|_outbox| inventory::router())
            .await
    });
    panic!("the function stopped: {stopped:?}");
}

/// One binary deploys as the API's function and as its consumer's, each function's
/// settings saying which (`Service::serve`): the inventory's service, with the ledger's
/// settings (`OUTBOX_CONSUMER_NAME=ledger`), handles an SQS event as the ledger (its
/// message processed, no item failed); without them, it answers its routes (the status
/// route, through an API Gateway event). Each function runs on the fake Lambda.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_binary_is_the_api_or_its_consumer_as_its_functions_settings_say() {
    use outbox_tests::fake_lambda::{FakeLambda, Invoke, Model, Seen};
    let body = json!({"type": "StockReserved", "product_id": "p1", "quantity": 2, "reservation_id": "r-1"});
    let mut event: Value = serde_json::from_str(include_str!("../fixtures/sam_sqs_receive_message.json")).unwrap();
    event["Records"][0]["body"] = json!(body.to_string());
    event["Records"][0]["messageAttributes"] = json!({
        "outbox-message-id": {"stringValue": "one-binary-1", "dataType": "String", "stringListValues": [], "binaryListValues": []}
    });
    let consumer = FakeLambda::start(Model::OneAtATime).await;
    consumer.invoke(Invoke {
        request_id: "batch-1".to_owned(),
        payload: event,
        timeout: Duration::from_secs(60),
    });
    let consumer_function = consumer.start_function("lambda_function_process", "service-consumer", None, "info");
    let answer = consumer
        .wait_for(
            Duration::from_secs(120),
            |seen| matches!(seen, Seen::Answered(id, _) if id == "batch-1"),
        )
        .await
        .unwrap_or_else(|timeline| panic!("the ledger's batch was not answered:\n{timeline}"));
    let Seen::Answered(_, answered) = answer.seen else {
        unreachable!()
    };
    assert_eq!(answered, json!({"batchItemFailures": []}), "{}", consumer.describe());
    // Its log line was written before its answer, and may still be in the pipe.
    consumer_function.stop(Duration::from_secs(30));
    let processed = consumer.timeline().iter().any(|event| {
        matches!(&event.seen, Seen::Output(line) if line.contains("message consumed") && line.contains("processed"))
    });
    assert!(processed, "the ledger processed the message:\n{}", consumer.describe());

    let api = FakeLambda::start(Model::OneAtATime).await;
    let txn = TxnId::new_v7();
    api.invoke(Invoke::http_get(
        "get-1",
        &format!("/transactions/{txn}"),
        Duration::from_secs(30),
    ));
    let _api = api.start_function("lambda_function_process", "service-api", None, "info");
    let answer = api
        .wait_for(
            Duration::from_secs(120),
            |seen| matches!(seen, Seen::Answered(id, _) if id == "get-1"),
        )
        .await
        .unwrap_or_else(|timeline| panic!("the API's request was not answered:\n{timeline}"));
    let Seen::Answered(_, answered) = answer.seen else {
        unreachable!()
    };
    assert_eq!(answered["statusCode"], 200, "{answered}\n{}", api.describe());
    let status: Value = serde_json::from_str(answered["body"].as_str().unwrap()).unwrap();
    assert_eq!(status, json!({"transaction_id": txn.to_string(), "status": "unknown"}));
    println!("one binary: as the ledger's function, its SQS batch answered with no failure; as the API's, its status route answered");
}
