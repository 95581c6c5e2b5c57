//! How many AWS calls the request path and the control path make, counted on the wire
//! against the emulator.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use outbox::control::worker::lambda::handle_event;
use outbox::control::{ControlOutcome, ControlPath};
use outbox::ports::ExpectedVersion;
use outbox::protocol::DestinationName;
use outbox::protocol::{Message, TxnId};
use outbox::request::{InlineDispatch, Settlement};
use outbox::settings::Timing;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::{bus, events, fanout, Backend};
use outbox_tests::emulator::emulator;
use serde_json::json;

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(name, count)| ((*name).to_owned(), *count)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_path_makes_one_send_and_one_transaction_beyond_its_reads() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let outbox = backend.outbox(Timing::default());
    counter.reset();

    let mut txn = outbox.begin().await.expect("begin");
    let key = "ORDER#1".parse().unwrap();
    assert!(txn.get(&key).await.expect("read").is_none());
    txn.put(key, json!({"status": "placed"}), ExpectedVersion::Absent);
    txn.emit(Message::json("events".parse().unwrap(), &json!({"type": "OrderPlaced"})).unwrap());
    txn.commit().await.expect("commit");

    let seen = counter.counts();
    println!("request path calls: {seen:?}");
    assert_eq!(
        seen,
        counts(&[("BatchGetItem", 1), ("SendMessage", 1), ("TransactWriteItems", 1)])
    );
}

/// With inline publishing the request path also publishes and marks the record, and the
/// control message then costs one read that finds it dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_inline_publishing_a_commit_adds_one_batch_send_and_one_write_and_its_check_one_read() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let timing = Timing::default();
    let outbox = backend.outbox(timing).with_inline_publisher(backend.publisher.clone());
    let control = backend.control(timing);
    counter.reset();

    let mut txn = outbox.begin().await.expect("begin");
    let key = "ORDER#1".parse().unwrap();
    assert!(txn.get(&key).await.expect("read").is_none());
    txn.put(key, json!({"status": "placed"}), ExpectedVersion::Absent);
    txn.emit(Message::json("events".parse().unwrap(), &json!({"type": "OrderPlaced"})).unwrap());
    let committed = txn.commit().await.expect("commit");
    assert_eq!(committed.inline, InlineDispatch::Dispatched);
    let request = counter.counts();
    let (worker, checks) =
        settle_on_the_wire(&backend, &control, &counter, committed.txn_id, timing.first_check_delay).await;
    println!("committed with inline publishing: request path {request:?}, control path {worker:?} over {checks} control message(s)");
    assert_eq!(
        request,
        counts(&[
            ("BatchGetItem", 1),
            ("BatchWriteItem", 1),
            ("SendMessage", 1),
            ("SendMessageBatch", 1),
            ("TransactWriteItems", 1)
        ])
    );
    assert_eq!((worker, checks), (counts(&[("BatchGetItem", 1)]), 1));
    assert_eq!(backend.drain(&"events".parse().unwrap()).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatching_a_transaction_of_ten_messages_takes_one_read_one_send_and_one_write() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let timing = Timing::default();
    let outbox = backend.outbox(timing);
    let control = backend.control(timing);
    let mut txn = outbox.begin().await.expect("begin");
    for n in 0..10 {
        txn.emit(Message::json("events".parse().unwrap(), &json!({"n": n})).unwrap());
    }
    let committed = txn.commit().await.expect("commit");
    let deliveries = backend
        .next_control_message(committed.txn_id, timing.first_check_delay)
        .await;
    counter.reset();

    let report = control.handle_batch(&deliveries).await;
    assert!(
        matches!(
            report.items[0].result,
            Ok(ControlOutcome::Dispatched { messages: 10, .. })
        ),
        "{report:?}"
    );
    let seen = counter.counts();
    println!("control path calls for one transaction of 10 messages: {seen:?}");
    assert_eq!(
        seen,
        counts(&[("BatchGetItem", 1), ("BatchWriteItem", 1), ("SendMessageBatch", 1)])
    );
    assert_eq!(backend.drain(&"events".parse().unwrap()).await.len(), 10);
}

/// End to end through the control worker's Lambda handler: one transaction emits ten
/// messages to each kind of destination (an SQS queue, an SNS topic a queue subscribes
/// to, an EventBridge bus whose rule targets a queue); its control message, handled as
/// the control queue's SQS event, publishes each ten in one batch call, and every message
/// arrives on its kind's queue with its stable id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_messages_to_each_kind_of_destination_take_one_batch_call_each_and_arrive_with_their_ids() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let timing = Timing::default();
    let outbox = backend.outbox(timing);
    let control = backend.control(timing);
    let kinds = [events(), fanout(), bus()];
    let mut txn = outbox.begin().await.expect("begin");
    let mut emitted: BTreeMap<DestinationName, Vec<String>> = BTreeMap::new();
    for destination in &kinds {
        for n in 0..10 {
            let message = Message::json(destination.clone(), &json!({"n": n}))
                .unwrap()
                .with_event("com.example.test", "Counted");
            emitted
                .entry(destination.clone())
                .or_default()
                .push(txn.emit(message).to_string());
        }
    }
    let committed = txn.commit().await.expect("commit");
    let deliveries = backend
        .next_control_message(committed.txn_id, timing.first_check_delay)
        .await;
    let mut event = SqsEvent::default();
    let mut record = SqsMessage::default();
    record.message_id = Some(deliveries[0].message_id.clone());
    record.body = Some(deliveries[0].body.clone());
    event.records.push(record);
    counter.reset();

    let response = handle_event(&control, backend.inbox.as_ref(), backend.clock.as_ref(), event).await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let seen = counter.counts();
    println!("control worker calls for one transaction of 10 messages to each of an SQS queue, an SNS topic and an EventBridge bus: {seen:?}");
    assert_eq!(
        seen,
        counts(&[
            ("BatchGetItem", 1),
            ("BatchWriteItem", 1),
            ("PublishBatch", 1),
            ("PutEvents", 1),
            ("SendMessageBatch", 1)
        ])
    );
    for destination in &kinds {
        let delivered = backend.drain(destination).await;
        let mut ids: Vec<String> = delivered
            .iter()
            .map(|message| message.message_id.clone().expect("a stable id"))
            .collect();
        ids.sort();
        let mut expected = emitted[destination].clone();
        expected.sort();
        println!(
            "{destination} ({}): {} arrived, stable ids {} .. {}",
            backend.targets[destination],
            delivered.len(),
            ids[0],
            ids[ids.len() - 1]
        );
        assert_eq!(ids, expected, "{destination}: each message once, with its stable id");
        assert!(delivered
            .iter()
            .all(|message| message.txn_id.as_deref() == Some(committed.txn_id.to_string().as_str())));
    }
}

/// Runs the control path on transaction `txn_id`'s control messages as they come due,
/// until it is settled; returns the AWS calls the control path made for it (receives and
/// deletes, which the Lambda event source mapping makes, are left out) and how many
/// control messages it handled.
async fn settle_on_the_wire(
    backend: &Backend,
    control: &ControlPath,
    counter: &CallCounter,
    txn_id: TxnId,
    first_check: Duration,
) -> (BTreeMap<String, usize>, usize) {
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    let handled = backend
        .handle_until_settled(control, txn_id, first_check, |before| {
            if before {
                counter.reset();
            } else {
                for (operation, count) in counter.counts() {
                    *calls.entry(operation).or_default() += count;
                }
            }
        })
        .await;
    (calls, handled)
}

/// A transaction abandoned before its control message was sent (the default: it goes out
/// with the commit) costs nothing on the wire. One abandoned after its control message was
/// sent early (`Transaction::send_control`) costs that message and one tombstone write in
/// the request path, and one read when the control message comes; one left to its control
/// message (dropped after its send, as a crash leaves it) costs a read per check, a
/// deferral per check within the window, and the tombstone. Counted on the wire; printed
/// for the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_transaction_costs_nothing_unsent_and_one_control_message_and_one_tombstone_write_sent() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    // A 3 s window: a transaction left to its control message is checked at 1 s,
    // deferred once, and tombstoned at 3 s (at the default 30 s window: 6 checks).
    let timing = Timing {
        max_commit_duration: Duration::from_secs(3),
        ..Timing::default()
    };
    let outbox = backend.outbox(timing);
    let control = backend.control(timing);

    counter.reset();
    let txn = outbox.begin().await.expect("begin");
    assert_eq!(txn.abandon().await, Settlement::NothingSent);
    assert_eq!(counter.counts(), counts(&[]), "abandoned before its control message");

    // The request path bounds its tombstone write to SETTLE_RESERVE (200 ms): a busy
    // emulator's first writes to a new table can take longer, and the transaction is
    // then left to the worker, which counts differently: measured again (at most three
    // times) when the emulator was too slow for the bound.
    let mut tries = 0;
    let (abandoned, request) = loop {
        tries += 1;
        counter.reset();
        let txn = outbox.begin().await.expect("begin");
        txn.send_control().await.expect("the control message");
        let abandoned = txn.id();
        let settled = txn.abandon().await;
        if settled == Settlement::Tombstoned || tries == 3 {
            assert_eq!(settled, Settlement::Tombstoned, "in {tries} tries");
            break (abandoned, counter.counts());
        }
        // Its control message is still due: settle it, uncounted, before the next try.
        backend
            .handle_until_settled(&control, abandoned, timing.first_check_delay, |_| {})
            .await;
    };
    let request_replies = format!(
        "PutItem {:?}, SendMessage {:?}",
        counter.replies("PutItem"),
        counter.replies("SendMessage")
    );
    let (worker, checks) = settle_on_the_wire(&backend, &control, &counter, abandoned, timing.first_check_delay).await;
    println!("abandoned in the request path: request path {request:?}, control path {worker:?} over {checks} control message(s)");
    assert_eq!(
        request,
        counts(&[("PutItem", 1), ("SendMessage", 1)]),
        "replies on the wire: {request_replies}"
    );
    assert_eq!(worker, counts(&[("BatchGetItem", 1)]));
    assert_eq!(checks, 1);

    counter.reset();
    let txn = outbox.begin().await.expect("begin");
    txn.send_control().await.expect("the control message");
    let dropped = txn.id();
    drop(txn);
    let request = counter.counts();
    let (worker, checks) = settle_on_the_wire(&backend, &control, &counter, dropped, timing.first_check_delay).await;
    println!("dropped, left to its control message: request path {request:?}, control path {worker:?} over {checks} control message(s)");
    assert_eq!(request, counts(&[("SendMessage", 1)]));
    assert_eq!(
        worker,
        counts(&[("BatchGetItem", 2), ("PutItem", 1), ("SendMessage", 1)]),
        "replies on the wire (the last check's): BatchGetItem {:?}, PutItem {:?}, SendMessage {:?}",
        counter.replies("BatchGetItem"),
        counter.replies("PutItem"),
        counter.replies("SendMessage")
    );
    assert_eq!(checks, 2);
}
