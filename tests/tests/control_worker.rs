//! The control worker: its Lambda handler on real event payloads, its local poller, and
//! the dead-letter round trip on the emulator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_sqs::types::QueueAttributeName;
use outbox::aws::{
    bootstrap, dead_letter_source, redrive, AwsClients, AwsPublisher, DestinationResource, DynamoStore, ResourceNames,
    SqsControlQueue, TableLayout,
};
use outbox::control::lease::LEASE;
use outbox::control::poller;
use outbox::control::worker::lambda::handle_event;
use outbox::control::{ControlOutcome, ControlPath, ControlPorts};
use outbox::destination::Target;
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::ports::{Clock, CommitRequest, ControlDelivery, ControlInbox, QueueError, RandomIds, Store, SystemClock};
use outbox::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use outbox::request::{Outbox, RequestPorts, TxnStatus};
use outbox::settings::{vars, Settings, Timing, TransactionLimits};
use outbox::time::Timestamp;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::Backend;
use outbox_tests::emulator::{emulator, unique_name};
use serde_json::json;
use tokio::sync::Notify;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn event_of(deliveries: &[ControlDelivery]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for delivery in deliveries {
        let mut message = SqsMessage::default();
        message.message_id = Some(delivery.message_id.clone());
        message.receipt_handle = Some(delivery.receipt.clone());
        message.body = Some(delivery.body.clone());
        message
            .attributes
            .insert("ApproximateReceiveCount".into(), delivery.receive_count.to_string());
        event.records.push(message);
    }
    event
}

fn failures(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.as_str())
        .collect()
}

fn pending_record(txn_id: TxnId, at: Timestamp, bodies: usize) -> CommitRequest {
    let messages = (0..bodies)
        .map(|n| OutgoingMessage::new(txn_id, n as u32, Message::json(events(), &json!({"n": n})).unwrap()))
        .collect();
    CommitRequest {
        txn_id,
        writes: vec![],
        outbox: OutboxRecord::committed(txn_id, messages, at, at.plus(Duration::from_secs(86_400))),
        idempotency: None,
    }
}

#[tokio::test]
async fn a_real_sqs_event_goes_through_the_real_handler() {
    let event: SqsEvent =
        serde_json::from_str(include_str!("../fixtures/sqs_control_event.json")).expect("Lambda SQS event");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_002_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let txn_id: TxnId = "018bcfe5-6800-7000-8000-000000000042".parse().unwrap();
    backend
        .store
        .commit(&pending_record(txn_id, clock.now(), 1))
        .await
        .unwrap();
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());

    let response = handle_event(&control, backend.control_queue.as_ref(), clock.as_ref(), event).await;

    assert_eq!(
        failures(&response),
        [
            "2e1424d4-f796-459a-8184-9c92662be6da",
            "8b0fd3e2-4a2d-4c07-9d3f-1e0d5c2b7a91"
        ]
    );
    let record = backend
        .store
        .get_outboxes(&[txn_id])
        .await
        .unwrap()
        .remove(&txn_id)
        .unwrap();
    assert_eq!(record.state, OutboxState::Dispatched);
    assert_eq!(backend.publisher.queue(&events()).unwrap().len(), 1);
    let wire = serde_json::to_value(&response).unwrap();
    assert_eq!(
        wire["batchItemFailures"][0]["itemIdentifier"], "2e1424d4-f796-459a-8184-9c92662be6da",
        "the Lambda wire format"
    );
}

#[tokio::test]
async fn a_batch_with_every_kind_of_message_fails_exactly_the_undecodable_ones() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let timing = Timing::default();
    let control = ControlPath::new(backend.control_ports(clock.clone()), timing);
    let now = clock.now();
    let (pending, dispatched, tombstoned) = (TxnId::new_v7(), TxnId::new_v7(), TxnId::new_v7());
    backend.store.commit(&pending_record(pending, now, 2)).await.unwrap();
    backend.store.commit(&pending_record(dispatched, now, 0)).await.unwrap();
    backend
        .store
        .put_tombstone(tombstoned, now, now.plus(timing.retention))
        .await
        .unwrap();
    let (within, after) = (TxnId::new_v7(), TxnId::new_v7());
    let late_start = Timestamp::from_millis(now.as_millis() - timing.max_commit_duration.as_millis() as u64);
    let body = |txn, at| ControlMessage::first(txn, at).encode();
    let deliveries: Vec<ControlDelivery> = [
        ("pending", body(pending, now)),
        ("absent-within-window", body(within, now)),
        ("absent-after-window", body(after, late_start)),
        ("already-dispatched", body(dispatched, now)),
        ("tombstoned", body(tombstoned, now)),
        ("garbage", "{\"version\":1".to_owned()),
    ]
    .into_iter()
    .map(|(id, body)| ControlDelivery {
        message_id: id.into(),
        receipt: id.into(),
        body,
        receive_count: 1,
    })
    .collect();

    let response = handle_event(
        &control,
        backend.control_queue.as_ref(),
        clock.as_ref(),
        event_of(&deliveries),
    )
    .await;

    assert_eq!(failures(&response), ["garbage"]);
    let records = backend
        .store
        .get_outboxes(&[pending, dispatched, tombstoned, within, after])
        .await
        .unwrap();
    let state = |txn: TxnId| records.get(&txn).map(|record| record.state);
    assert_eq!(state(pending), Some(OutboxState::Dispatched));
    assert_eq!(state(dispatched), Some(OutboxState::Dispatched));
    assert_eq!(state(tombstoned), Some(OutboxState::Tombstone));
    assert_eq!(state(within), None, "within the window: deferred, nothing written");
    assert_eq!(state(after), Some(OutboxState::Tombstone));
    assert_eq!(
        backend.publisher.queue(&events()).unwrap().len(),
        2,
        "the pending record's two messages"
    );
    let deferred: Vec<ControlMessage> = backend
        .control_queue
        .queue()
        .bodies()
        .iter()
        .map(|b| ControlMessage::decode(b).unwrap())
        .collect();
    assert_eq!(deferred.len(), 1);
    assert_eq!((deferred[0].txn_id, deferred[0].attempt), (within, 2));
}

/// An inbox that asks for shutdown the moment it hands out a batch.
struct ShutdownOnReceive {
    inner: Arc<dyn ControlInbox>,
    shutdown: Arc<Notify>,
}

#[async_trait]
impl ControlInbox for ShutdownOnReceive {
    async fn receive(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<ControlDelivery>, QueueError> {
        let received = self.inner.receive(max, wait, visibility).await?;
        if !received.is_empty() {
            self.shutdown.notify_one();
        }
        Ok(received)
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        self.inner.ack(receipts).await
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        self.inner.set_visibility(receipts).await
    }
}

#[tokio::test]
async fn the_local_poller_finishes_the_batch_in_hand_before_shutting_down() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let mut txn = outbox.begin().await.unwrap();
    txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
    let txn_id = txn.commit().await.unwrap().txn_id;
    clock.advance(Duration::from_secs(1));
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let shutdown = Arc::new(Notify::new());
    let inbox = ShutdownOnReceive {
        inner: backend.control_queue.clone(),
        shutdown: shutdown.clone(),
    };
    let mut batches = 0;

    let signal = shutdown.clone();
    poller::run(
        &inbox,
        &control,
        Duration::from_secs(1),
        LEASE,
        async move { signal.notified().await },
        |_| batches += 1,
    )
    .await;

    assert_eq!(batches, 1);
    assert_eq!(outbox.status(txn_id).await.unwrap(), TxnStatus::Dispatched);
    assert!(
        backend.control_queue.queue().is_empty(),
        "the handled message was acknowledged before stopping"
    );
}

/// A control path on the emulator's resources, publishing to `destinations`.
fn control_on(
    clients: &AwsClients,
    table: TableLayout,
    control_url: &str,
    destinations: BTreeMap<DestinationName, Target>,
) -> ControlPath {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    ControlPath::new(
        ControlPorts {
            store: Arc::new(DynamoStore::new(clients.dynamodb.clone(), table, clock.clone())),
            control_queue: Arc::new(SqsControlQueue::new(clients.sqs.clone(), control_url)),
            publisher: Arc::new(AwsPublisher::new(clients.clone(), destinations)),
            clock,
        },
        Timing::default(),
    )
}

async fn depth(clients: &AwsClients, url: &str) -> usize {
    let output = clients
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    let attributes = output.attributes().unwrap();
    attributes
        .values()
        .map(|count| count.parse::<usize>().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_reaches_the_dead_letter_queue_and_is_dispatched_after_redrive() {
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let mut names = ResourceNames::for_stack(&unique_name("poison"));
    names.control_visibility_timeout = Duration::from_secs(1);
    names.max_receive_count = 2;
    names.destinations.push((
        "audit".parse().unwrap(),
        DestinationResource::Queue {
            queue: format!("{}-audit", names.control_queue),
        },
    ));
    let resources = bootstrap(&clients, &names).await.unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let control_queue = Arc::new(SqsControlQueue::new(
        clients.sqs.clone(),
        resources.control_queue_url.clone(),
    ));
    let outbox = Outbox::new(
        RequestPorts {
            store: Arc::new(DynamoStore::new(
                clients.dynamodb.clone(),
                resources.layout.clone(),
                clock.clone(),
            )),
            control_queue: control_queue.clone(),
            clock: clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Timing {
            first_check_delay: Duration::ZERO,
            ..Timing::default()
        },
        TransactionLimits::default(),
    );
    let mut txn = outbox.begin().await.unwrap();
    let id = txn.emit(Message::json("audit".parse().unwrap(), &json!({"type": "Audited"})).unwrap());
    let txn_id = txn.commit().await.unwrap().txn_id;

    // The fault: this worker was deployed without the `audit` destination.
    let mut broken_destinations = resources.destinations.clone();
    broken_destinations.remove(&"audit".parse().unwrap());
    let broken = control_on(
        &clients,
        resources.layout.clone(),
        &resources.control_queue_url,
        broken_destinations,
    );
    let mut attempts = 0;
    while depth(&clients, &resources.control_dead_letter_queue_url).await == 0 {
        attempts += 1;
        assert!(attempts < 30, "the poison message never reached the dead-letter queue");
        let report = poller::poll_once(control_queue.as_ref(), &broken, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(report.items.iter().all(|item| item.result.is_err()), "{report:?}");
    }
    assert_eq!(
        outbox.status(txn_id).await.unwrap(),
        TxnStatus::Pending,
        "committed, not yet dispatched"
    );

    // The fix: deploy with the destination, then redrive.
    let fixed = control_on(
        &clients,
        resources.layout.clone(),
        &resources.control_queue_url,
        resources.destinations.clone(),
    );
    // Each dead-letter queue's source is the queue whose redrive policy names it.
    let source = dead_letter_source(&clients.sqs, &resources.control_dead_letter_queue_url)
        .await
        .unwrap();
    assert_eq!(source, resources.control_queue_url);
    for (destination, dead_letters) in &resources.delivery_dead_letter_queues {
        assert_eq!(
            dead_letter_source(&clients.sqs, dead_letters).await.unwrap(),
            resources.delivery_queues[destination]
        );
    }
    let moved = redrive(&clients.sqs, &resources.control_dead_letter_queue_url, &source)
        .await
        .unwrap();
    assert_eq!(moved, 1);
    let report = poller::poll_once(control_queue.as_ref(), &fixed, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(
            report.items[0].result,
            Ok(ControlOutcome::Dispatched { messages: 1, .. })
        ),
        "{report:?}"
    );
    assert_eq!(outbox.status(txn_id).await.unwrap(), TxnStatus::Dispatched);
    let audit = clients
        .sqs
        .receive_message()
        .queue_url(&resources.delivery_queues[&"audit".parse::<DestinationName>().unwrap()])
        .message_attribute_names("All")
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let delivered = &audit.messages()[0];
    let stable_id = delivered.message_attributes().unwrap()["outbox-message-id"].string_value();
    assert_eq!(stable_id, Some(id.as_str()));
    assert_eq!(depth(&clients, &resources.control_dead_letter_queue_url).await, 0);
    assert_eq!(depth(&clients, &resources.control_queue_url).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ten_pending_transactions_costs_three_calls() {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let timing = Timing {
        first_check_delay: Duration::ZERO,
        ..Timing::default()
    };
    let outbox = backend.outbox(timing);
    for n in 0..10 {
        let mut txn = outbox.begin().await.unwrap();
        txn.emit(Message::json(events(), &json!({"n": n})).unwrap());
        txn.commit().await.unwrap();
    }
    let mut deliveries = Vec::new();
    while deliveries.len() < 10 {
        let received = backend
            .inbox
            .receive(10 - deliveries.len(), Duration::from_secs(1), LEASE)
            .await
            .unwrap();
        assert!(!received.is_empty(), "the control messages did not arrive");
        deliveries.extend(received);
    }
    let control = backend.control(timing);
    counter.reset();

    let response = handle_event(
        &control,
        backend.inbox.as_ref(),
        backend.clock.as_ref(),
        event_of(&deliveries),
    )
    .await;

    assert!(response.batch_item_failures.is_empty());
    let calls = counter.counts();
    let total: usize = calls.values().sum();
    println!("control worker: a batch of 10 pending transactions of one message each took {total} AWS calls: {calls:?} (one by one: 10 reads + 10 sends + 10 marks + 10 deletes = 40)");
    assert_eq!(total, 3, "{calls:?}");
    assert_eq!(backend.drain(&events()).await.len(), 10);
}

/// Settings as a user deploys them: every default, pointed at `resources`.
fn default_settings(resources: &outbox::aws::Resources) -> Settings {
    let destinations: Vec<String> = resources
        .destinations
        .iter()
        .map(|(name, url)| format!("{name}={url}"))
        .collect();
    let values: BTreeMap<&str, String> = [
        (vars::BACKEND, "aws".to_owned()),
        (vars::TABLE_NAME, resources.layout.table.clone()),
        (vars::CONTROL_QUEUE_URL, resources.control_queue_url.clone()),
        (vars::DESTINATIONS, destinations.join(",")),
    ]
    .into_iter()
    .collect();
    Settings::from_lookup(|name| values.get(name).cloned()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_worker_with_default_settings_dispatches_promptly_after_an_idle_long_poll() {
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let resources = bootstrap(&clients, &ResourceNames::for_stack(&unique_name("idle")))
        .await
        .unwrap();
    let settings = default_settings(&resources);
    assert_eq!(settings.sdk_operation_timeout, Duration::from_secs(5), "the default");
    let sdk_config = emulator().sdk_config_with(settings.sdk_operation_timeout).await;
    let worker = Arc::new(outbox::control::worker::setup::Worker::new(&settings, &sdk_config).unwrap());
    let stop = Arc::new(Notify::new());
    let poller = tokio::spawn({
        let (worker, stop) = (worker.clone(), stop.clone());
        async move { outbox::control::worker::poll::run(&worker, async move { stop.notified().await }).await }
    });

    // One whole long poll on an idle queue, and a bit: the receive must outwait it.
    tokio::time::sleep(outbox::control::worker::poll::LONG_POLL_WAIT + Duration::from_secs(2)).await;
    let outbox = Outbox::new(
        RequestPorts {
            store: Arc::new(DynamoStore::new(
                worker.clients.dynamodb.clone(),
                resources.layout.clone(),
                worker.clock.clone(),
            )),
            control_queue: worker.control_queue.clone(),
            clock: worker.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        settings.timing,
        settings.limits,
    );
    let mut committed = Vec::new();
    for n in 0..5 {
        let mut txn = outbox.begin().await.unwrap();
        txn.emit(Message::json(events(), &json!({"n": n})).unwrap());
        committed.push((txn.commit().await.unwrap().txn_id, std::time::Instant::now()));
    }
    // The first check comes after the first check delay; a couple of seconds more for
    // the long poll to return it and the worker to dispatch.
    let allowed = settings.timing.first_check_delay + Duration::from_secs(3);
    let mut lags = Vec::new();
    for (txn_id, at) in &committed {
        while outbox.status(*txn_id).await.unwrap() != TxnStatus::Dispatched {
            assert!(
                at.elapsed() < allowed,
                "transaction {txn_id} not dispatched {allowed:?} after its commit"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lags.push(at.elapsed());
    }
    stop.notify_one();
    let stats = poller.await.unwrap();
    println!("poll mode with default settings after an idle long poll: dispatched within {lags:?} of each commit; poller {stats:?}");
    assert_eq!(stats.failures, 0, "no receive failed (and so no warning) while idle");
    assert!(stats.messages >= 5, "{stats:?}");
    assert_eq!(depth(&clients, &resources.control_dead_letter_queue_url).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_control_message_comes_back_in_seconds_in_poll_and_in_lambda_mode() {
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let resources = bootstrap(&clients, &ResourceNames::for_stack(&unique_name("retry")))
        .await
        .unwrap();
    let worker =
        outbox::control::worker::setup::Worker::new(&default_settings(&resources), &emulator().sdk_config().await)
            .unwrap();
    clients
        .sqs
        .send_message()
        .queue_url(&resources.control_queue_url)
        .message_body("not a control message")
        .send()
        .await
        .unwrap();
    let inbox = worker.control_queue.as_ref();
    let receive = || async {
        let started = std::time::Instant::now();
        loop {
            let received = inbox.receive(10, Duration::from_secs(1), LEASE).await.unwrap();
            if !received.is_empty() {
                return (received, started.elapsed());
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "the failed message did not come back within 15 s (the visibility timeout is 60 s)"
            );
        }
    };

    // Poll mode: the poller leaves it, visible again after the first retry delay.
    let report = poller::poll_once(inbox, &worker.control, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(report.failed_message_ids().len(), 1);
    let (again, poll_mode_wait) = receive().await;
    assert_eq!(again[0].receive_count, 2);

    // Lambda mode: the handler answers a partial batch failure and shortens the message's
    // visibility before answering.
    let mut event = SqsEvent::default();
    let mut message = SqsMessage::default();
    message.message_id = Some(again[0].message_id.clone());
    message.receipt_handle = Some(again[0].receipt.clone());
    message.body = Some(again[0].body.clone());
    message
        .attributes
        .insert("ApproximateReceiveCount".into(), again[0].receive_count.to_string());
    event.records.push(message);
    let response = handle_event(&worker.control, inbox, worker.clock.as_ref(), event).await;
    assert_eq!(failures(&response), [again[0].message_id.as_str()]);
    let (third, lambda_mode_wait) = receive().await;
    assert_eq!(third[0].receive_count, 3);
    println!(
        "a failed control message came back after {poll_mode_wait:?} (poll mode, 1st failure) and {lambda_mode_wait:?} (Lambda mode, 2nd failure); visibility timeout 60 s"
    );
}

/// The SQS event `sam local generate-event sqs receive-message` writes (its body is not a
/// control message) goes through the real handler: that record, and only it, is reported
/// failed, in Lambda's wire format.
#[tokio::test]
async fn the_sqs_event_sam_generates_is_reported_failed_alone() {
    let event: SqsEvent = serde_json::from_str(include_str!("../fixtures/sam_sqs_receive_message.json"))
        .expect("the Lambda SQS event SAM generates");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_002_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let response = handle_event(&control, backend.control_queue.as_ref(), clock.as_ref(), event).await;
    assert_eq!(failures(&response), ["19dd0b57-b21e-4ac1-bd88-01bbb068cb78"]);
    let wire = serde_json::to_value(&response).unwrap();
    assert_eq!(
        wire,
        json!({"batchItemFailures": [{"itemIdentifier": "19dd0b57-b21e-4ac1-bd88-01bbb068cb78"}]})
    );
}

/// A poller stopped during its long poll waits for the receive it has open and hands
/// back what that receive took (visibility 0), unhandled: a poller started right after
/// dispatches the message at once, not after the queue's 60-second visibility timeout
/// (which a dropped long poll would leave the message hidden for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poller_stopped_during_its_long_poll_hands_back_what_it_took() {
    use outbox::control::worker::{poll, setup::Worker};
    use outbox::ports::ControlQueue;
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let resources = bootstrap(&clients, &ResourceNames::for_stack(&unique_name("restart")))
        .await
        .unwrap();
    let settings = default_settings(&resources);
    let sdk_config = emulator().sdk_config_with(settings.sdk_operation_timeout).await;
    let worker = Arc::new(Worker::new(&settings, &sdk_config).unwrap());
    let store = DynamoStore::new(
        worker.clients.dynamodb.clone(),
        resources.layout.clone(),
        worker.clock.clone(),
    );
    let start = |worker: Arc<Worker>| {
        let stop = Arc::new(Notify::new());
        let poller = tokio::spawn({
            let stop = stop.clone();
            async move { poll::run(&worker, async move { stop.notified().await }).await }
        });
        (stop, poller)
    };
    let (stop, first) = start(worker.clone());
    // Its long poll is open.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let txn_id = TxnId::new_v7();
    let now = worker.clock.now();
    store.commit(&pending_record(txn_id, now, 1)).await.unwrap();
    // Stopped, then the transaction's control message comes: the open receive takes it.
    stop.notify_one();
    worker
        .control_queue
        .send(&ControlMessage::first(txn_id, now), Duration::ZERO)
        .await
        .unwrap();
    let stopped = first.await.unwrap();
    assert_eq!(stopped.handed_back, 1, "its open receive took the message: {stopped:?}");
    assert_eq!(
        stopped.messages, 0,
        "nothing handled by the stopped poller: {stopped:?}"
    );
    let restarted = std::time::Instant::now();
    let (stop, second) = start(worker.clone());
    loop {
        let state = store.get_outboxes(&[txn_id]).await.unwrap()[&txn_id].state;
        if state == OutboxState::Dispatched {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "not dispatched 10 s after the restart: the message stayed hidden"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lag = restarted.elapsed();
    // Not stopped gracefully: that would wait out its idle long poll.
    drop(stop);
    second.abort();
    println!(
        "restart during a long poll: the message the stopped poller's receive took was dispatched {lag:?} after the restart (the queue's visibility timeout: {:?})",
        ResourceNames::for_stack("x").control_visibility_timeout
    );
}
