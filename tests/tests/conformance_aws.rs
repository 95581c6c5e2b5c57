//! The conformance suite on the AWS adapters, against the emulators (DynamoDB Local for
//! DynamoDB, `moto[server]` for the rest), through the real `aws-sdk-*` clients, in two
//! layouts of the protocol's records: a dedicated table keyed `pk`, and the
//! application's single-table design keyed `PK` + `SK`.

use outbox_tests::conformance::Backend;

mod dedicated_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws().await);
}

mod single_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws_single_table().await);
}

/// Past DynamoDB's ten-minute window a commit's token is new again: a repeat of an
/// applied commit is no longer answered by the token but cancelled by the transaction's
/// own record, which the store must read from `ALL_OLD` and report as success. The
/// window is out of reach in a test, so an interceptor drops the token from every commit.
mod past_the_token_window {
    use outbox::aws::AwsClients;
    use outbox_tests::calls::{CallCounter, ForgetToken};
    use outbox_tests::conformance::cases;
    use outbox_tests::emulator::emulator;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeat_finds_its_own_record_and_succeeds() {
        let config = emulator().sdk_config().await;
        let wire = CallCounter::default();
        let clients = AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&config)
                    .interceptor(wire.clone())
                    .interceptor(ForgetToken)
                    .build(),
            ),
            ..wire.clients(&config)
        };
        let mut backend = Backend::aws_with(clients).await;
        backend.wire = Some(wire.clone());
        cases::a_retried_commit_finds_its_own_record_and_succeeds(&backend).await;
        // The first attempt applied; both repeats were cancelled by the record and
        // explained, not answered by a token.
        assert_eq!(wire.replies("TransactWriteItems"), [200, 400, 400]);
    }

    /// The same, and a commit after a tombstone, with the old items taken out of every
    /// cancellation (an engine that does not return `ALL_OLD`): the store reads the record
    /// that blocked the commit instead of taking it for a tombstone.
    mod without_the_old_items {
        use outbox_tests::fault_proxy::{Fault, FaultProxy};

        use super::*;

        async fn backend(proxy: &FaultProxy) -> Backend {
            let config = emulator().sdk_config().await;
            let clients = AwsClients {
                dynamodb: aws_sdk_dynamodb::Client::from_conf(
                    aws_sdk_dynamodb::config::Builder::from(&config)
                        .endpoint_url(proxy.endpoint())
                        .interceptor(ForgetToken)
                        .build(),
                ),
                ..AwsClients::new(&config)
            };
            Backend::aws_with(clients).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_repeat_reads_its_own_record_and_succeeds() {
            let proxy = FaultProxy::start(&emulator().dynamodb_endpoint, |_| Fault::WithoutOldItems).await;
            cases::a_retried_commit_finds_its_own_record_and_succeeds(&backend(&proxy).await).await;
            let cancelled: Vec<_> = proxy
                .intercepted()
                .into_iter()
                .filter_map(|attempt| attempt.upstream?.ok())
                .filter(|reply| reply.status == 400)
                .collect();
            assert_eq!(cancelled.len(), 2, "both repeats were cancelled by the record");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_commit_after_a_tombstone_reads_the_tombstone() {
            let proxy = FaultProxy::start(&emulator().dynamodb_endpoint, |_| Fault::WithoutOldItems).await;
            let backend = backend(&proxy).await;
            cases::a_commit_after_a_tombstone_is_rejected_with_nothing_written(&backend).await;
            // The case reads the record once at its end (two reads: item, then record);
            // the store read it once more, after the cancelled commit, to tell the
            // tombstone from the transaction's own record.
            let reads = proxy.replies("DynamoDB_20120810.BatchGetItem").len();
            assert_eq!(reads, 3, "the blocking record was read after the cancellation");
        }
    }
}

/// Records split over part items (beyond one item's 350 KB): marking one never leaves a
/// main item without its parts, and one that cannot be read fails its own control
/// message, never its neighbours'.
mod split_records {
    use std::time::Duration;

    use aws_sdk_dynamodb::types::AttributeValue;
    use outbox::control::ControlOutcome;
    use outbox::ports::Clock;
    use outbox::protocol::{Message, OutboxState};
    use outbox::settings::Timing;
    use outbox_tests::calls::CallCounter;
    use outbox_tests::emulator::emulator;
    use serde_json::json;

    use super::*;

    /// Commits a transaction whose `count` messages of `size` bytes each go to `events`.
    async fn commit(backend: &Backend, count: usize, size: usize) -> outbox::protocol::TxnId {
        let outbox = backend.outbox(Timing::default());
        let mut txn = outbox.begin().await.expect("begin");
        for n in 0..count {
            txn.emit(Message::json("events".parse().unwrap(), &json!({"n": n, "padding": "x".repeat(size)})).unwrap());
        }
        let id = txn.id();
        txn.commit().await.expect("commit");
        id
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marking_puts_the_main_item_before_it_deletes_the_parts() {
        let wire = CallCounter::default();
        let backend = Backend::aws_with(wire.clients(&emulator().sdk_config().await)).await;
        let txn = commit(&backend, 3, 200_000).await;
        let record = backend.store.get_outboxes(&[txn]).await.unwrap().remove(&txn).unwrap();
        wire.reset();
        let results = backend
            .store
            .mark_dispatched(&[record], backend.clock.now().plus(Duration::from_secs(3600)))
            .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let calls: Vec<String> = wire
            .bodies("BatchWriteItem")
            .iter()
            .map(|body| String::from_utf8_lossy(body).into_owned())
            .collect();
        let kinds: Vec<(bool, bool)> = calls
            .iter()
            .map(|body| (body.contains("PutRequest"), body.contains("DeleteRequest")))
            .collect();
        assert_eq!(
            kinds,
            [(true, false), (false, true)],
            "the dispatched main item first, alone; then the parts' deletes"
        );
        let read = backend.store.get_outboxes(&[txn]).await.unwrap();
        assert_eq!(read[&txn].state, OutboxState::Dispatched);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_missing_a_part_fails_its_own_control_message_alone() {
        let backend = Backend::aws().await;
        let torn = commit(&backend, 3, 200_000).await;
        let neighbour = commit(&backend, 1, 10).await;
        // The worst case of the old mark: a part deleted, the main item still pending.
        let config = emulator().sdk_config().await;
        let dynamodb = aws_sdk_dynamodb::Client::new(&config);
        let layout = backend.layout.clone().expect("on AWS");
        dynamodb
            .delete_item()
            .table_name(&layout.table)
            .key(&layout.partition_key, AttributeValue::S(format!("TXN#{torn}#PART#1")))
            .send()
            .await
            .expect("delete a part");

        let control = backend.control(Timing::default());
        backend.wait(Timing::default().first_check_delay).await;
        let mut deliveries = Vec::new();
        for _ in 0..10 {
            if deliveries.len() >= 2 {
                break;
            }
            deliveries.extend(
                backend
                    .inbox
                    .receive(10, Duration::from_secs(1), outbox::control::lease::LEASE)
                    .await
                    .expect("receive"),
            );
        }
        assert_eq!(deliveries.len(), 2, "both control messages");
        let report = control.handle_batch(&deliveries).await;
        let outcome = |txn| {
            report
                .items
                .iter()
                .find(|item| item.txn_id == Some(txn))
                .map(|item| item.result.clone())
                .expect("reported")
        };
        assert!(
            matches!(
                outcome(neighbour),
                Ok(ControlOutcome::AlreadyDone { .. } | ControlOutcome::Dispatched { .. })
            ),
            "the neighbour is not failed by the torn record: {:?}",
            outcome(neighbour)
        );
        assert!(
            outcome(torn).is_err(),
            "the torn record fails alone: {:?}",
            outcome(torn)
        );
    }
}

/// The local consumer poller on SQS: messages received with their attributes and FIFO
/// group, processed, and deleted once processed.
mod consumer_poller {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox::aws::SqsInbox;
    use outbox::consumer::{poll_once, Consumer, ConsumerPorts, Handler, HandlerError, Inbox, Incoming, Staging};
    use outbox::destination::Target;
    use outbox::ports::{ExpectedVersion, RandomIds};
    use outbox::protocol::{Message, OutgoingMessage, TxnId};
    use outbox_tests::conformance::audit;
    use outbox_tests::emulator::emulator;

    use super::*;

    /// Records which group and id each message came with.
    struct Note;

    #[async_trait::async_trait]
    impl Handler for Note {
        async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
            let key = format!("NOTE#{}", message.id).parse()?;
            staging.put(
                key,
                serde_json::json!({"group": message.group_id, "body": message.body}),
                ExpectedVersion::Absent,
            );
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn receives_with_attributes_and_group_processes_and_deletes() {
        let backend = Backend::aws().await;
        let Target::SqsQueue { url, .. } = &backend.targets[&audit()] else {
            panic!("audit is a queue")
        };
        let txn = TxnId::new_v7();
        let sent: Vec<OutgoingMessage> = (0..2)
            .map(|n| {
                let message = Message::json(audit(), &serde_json::json!({"n": n}))
                    .unwrap()
                    .with_group_id("g-1");
                OutgoingMessage::new(txn, n, message)
            })
            .collect();
        assert!(backend.publisher.send_batch(&audit(), &sent).await.unwrap().is_empty());
        let clients = outbox::aws::AwsClients::new(&emulator().sdk_config().await);
        let inbox = SqsInbox::new(clients.sqs, url.clone());
        let consumer = Consumer::new(
            "poller".parse().unwrap(),
            ConsumerPorts {
                store: backend.store.clone(),
                publisher: backend.publisher.clone(),
                clock: backend.clock.clone(),
                ids: Arc::new(RandomIds),
            },
            Arc::new(Note),
            Duration::from_secs(3600),
        );
        let mut processed = 0;
        for _ in 0..4 {
            let report = poll_once(&inbox, &consumer, Duration::from_secs(1))
                .await
                .expect("poll");
            assert!(report.failed_message_ids().is_empty(), "{report:?}");
            processed += report.items.len();
            if processed == 2 {
                break;
            }
        }
        assert_eq!(processed, 2);
        for message in &sent {
            let key = format!("NOTE#{}", message.id).parse().unwrap();
            let items = backend.store.get_items(std::slice::from_ref(&key)).await.unwrap();
            assert_eq!(items[&key].data["group"], "g-1", "the FIFO group came with it");
        }
        assert!(
            inbox
                .receive(10, Duration::from_secs(1), outbox::control::lease::LEASE)
                .await
                .unwrap()
                .is_empty(),
            "processed messages were deleted"
        );
    }
}

/// A fence that meets another transaction on its item (DynamoDB's `TransactionConflict`:
/// a busy item) does not fail its control message, which would count toward the
/// dead-letter queue with the transaction unfenced: a later control message fences it.
mod busy_items {
    use std::time::Duration;

    use outbox::control::ControlOutcome;
    use outbox::ports::{Clock, ControlDelivery, ExpectedVersion, ItemKey};
    use outbox::protocol::{ControlMessage, OutboxState, TxnId};
    use outbox::settings::Timing;
    use outbox_tests::conformance::dynamodb_only::proxied;
    use outbox_tests::fault_proxy::Fault;
    use serde_json::json;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_on_a_busy_item_is_tried_again_in_a_later_check_and_never_fails_its_message() {
        let p = proxied().await;
        let backend = &p.backend;
        let timing = Timing::default();
        let key: ItemKey = format!("ORDER#{}", TxnId::new_v7()).parse().unwrap();
        let mut create = backend.outbox(timing).begin().await.expect("begin");
        create.put(key.clone(), json!({"n": 0}), ExpectedVersion::Absent);
        let created = create.commit().await.expect("the create").txn_id;
        let path = backend.control(timing);
        backend
            .handle_until_settled(&path, created, timing.first_check_delay, |_| {})
            .await;
        // The next transaction on the item, the fence's, meets another one there.
        p.faults.transact(Fault::Conflict);
        // A transaction begun on the item that never committed, its window over.
        let txn = TxnId::new_v7();
        let control = ControlMessage::first(txn, backend.clock.now()).with_entity(key.clone());
        backend
            .clock
            .advance(timing.max_commit_duration + Duration::from_secs(1));
        let delivery = ControlDelivery {
            message_id: "m-1".into(),
            receipt: "r-1".into(),
            body: control.encode(),
            receive_count: 1,
        };
        let delay = match path.handle(&delivery).await.result {
            Ok(ControlOutcome::FenceOnBusyItem { next_attempt: 2, delay }) => delay,
            other => panic!("a fence on a busy item: {other:?}"),
        };
        assert!(
            p.proxy.intercepted().iter().any(|seen| seen.fault == Fault::Conflict),
            "the fence met the conflict"
        );
        assert!(
            backend.store.get_outboxes(&[txn]).await.unwrap().is_empty(),
            "nothing written"
        );
        // The item quiet again, the next check fences it.
        let deliveries = backend.next_control_message(txn, delay).await;
        let report = path.handle_batch(&deliveries).await;
        assert_eq!(report.items[0].result.as_ref().unwrap(), &ControlOutcome::Tombstoned);
        assert_eq!(
            backend.store.get_entity(&key).await.unwrap().unwrap().fence,
            Some(txn),
            "fenced in the item"
        );
        assert_eq!(
            backend.store.get_outboxes(&[txn]).await.unwrap()[&txn].state,
            OutboxState::Tombstone
        );
    }
}

/// What version 0.1 stored on DynamoDB is read by today's code
/// (`tests/fixtures/stored-0.1.json`; `OUTBOX_WRITE_FIXTURE=1` writes it again, once per
/// release that changes what is stored).
mod stored_by_earlier_versions {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_0_1_stored_is_read_and_dispatched_as_it_was_written() {
        outbox_tests::compat::check(&Backend::aws().await, outbox_tests::compat::FIXTURE_0_1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_0_2_stored_is_read_and_dispatched_as_it_was_written() {
        if std::env::var_os("OUTBOX_WRITE_FIXTURE").is_some() {
            outbox_tests::compat::write(&Backend::aws().await).await;
        }
        outbox_tests::compat::check(&Backend::aws().await, outbox_tests::compat::FIXTURE_0_2).await;
    }
}
