//! How many AWS calls the request path and the control path make, counted on the wire
//! against the emulator.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox::control::ControlOutcome;
use outbox::ports::ExpectedVersion;
use outbox::protocol::{ControlMessage, Message};
use outbox::settings::Timing;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::Backend;
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
    backend.wait(timing.first_check_delay).await;
    let deliveries = backend
        .inbox
        .receive(10, Duration::from_secs(2))
        .await
        .expect("receive");
    assert_eq!(deliveries.len(), 1);
    assert_eq!(
        ControlMessage::decode(&deliveries[0].body).unwrap().txn_id,
        committed.txn_id
    );
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
