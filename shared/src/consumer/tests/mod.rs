//! The consumer on the embedded backend: once in effect, the winner's messages, nothing
//! acknowledged before its messages went out; `entity` the same in entity mode.

mod entity;
mod hop;
mod in_order;
mod poller;
mod rival;
mod unsendable;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::*;
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{Clock, EntryFailure, ExpectedVersion, ItemKey, PublishError, Publisher};
use crate::protocol::{DestinationName, Message, OutboxState, OutgoingMessage, MESSAGE_ID_ATTRIBUTE};
use crate::time::Timestamp;

const RETENTION: Duration = Duration::from_secs(3600);

fn events() -> DestinationName {
    "events".parse().unwrap()
}

/// Counts each order's messages in `COUNT#{order}` (a write that a second run would
/// apply twice) and emits a message whose body names the run, so that runs differ.
#[derive(Default)]
struct Counting {
    runs: AtomicU32,
    /// Yield between the read and the staging, so that copies run concurrently.
    interleave: bool,
    /// Changes the item behind the first run's back, so that its commit fails.
    conflict_once: Option<Arc<crate::embedded::EmbeddedStore>>,
    /// Processes in entity mode, `COUNT#{order}` being the entity.
    entity: bool,
}

fn order_of(message: &Incoming) -> Result<String, HandlerError> {
    Ok(message.json::<Value>()?["order_id"]
        .as_str()
        .ok_or("no order_id")?
        .to_owned())
}

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let order = order_of(message)?;
        let key: ItemKey = format!("COUNT#{order}").parse()?;
        let current = staging.get(&key).await?;
        if self.interleave {
            tokio::task::yield_now().await;
        }
        if let (Some(store), 1) = (&self.conflict_once, run) {
            let mut other = Staging::new(crate::protocol::TxnId::new_v7(), store.clone());
            other.put(key.clone(), json!({"count": 100}), ExpectedVersion::Absent);
            let txn_id = other.id();
            let request = crate::ports::CommitRequest {
                txn_id,
                writes: other.writes.into_values().collect(),
                outbox: crate::protocol::OutboxRecord::committed(
                    txn_id,
                    vec![],
                    Timestamp::from_millis(1),
                    Timestamp::from_millis(2),
                ),
                idempotency: None,
            };
            crate::ports::Store::commit(store.as_ref(), &request).await?;
        }
        let (count, expected) = match current {
            Some(item) => (
                item.data["count"].as_u64().unwrap_or(0),
                ExpectedVersion::Exactly(item.version),
            ),
            None => (0, ExpectedVersion::Absent),
        };
        staging.put(key, json!({"count": count + 1}), expected);
        staging.emit(Message::json(
            events(),
            &json!({"type": "Counted", "order_id": order, "run": run}),
        )?);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        if !self.entity {
            return Ok(None);
        }
        Ok(Some(format!("COUNT#{}", order_of(message)?).parse()?))
    }
}

/// A publisher that fails every entry of its first `failures` calls, and moves the clock
/// on by a second per call (publishing takes time: the TTL must start after it).
struct Flaky {
    inner: Arc<dyn Publisher>,
    failures: AtomicU32,
    clock: Arc<ManualClock>,
}

#[async_trait]
impl Publisher for Flaky {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        self.clock.advance(Duration::from_secs(1));
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Ok(messages
                .iter()
                .map(|message| EntryFailure {
                    id: message.id.clone(),
                    sender_fault: false,
                    code: "InternalError".into(),
                })
                .collect());
        }
        self.inner.send_batch(destination, messages).await
    }
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    consumer: Consumer,
    handler: Arc<Counting>,
}

fn world(handler: Counting, publish_failures: u32) -> World {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let handler = Arc::new(handler);
    let mut ports = backend.consumer_ports(clock.clone());
    ports.publisher = Arc::new(Flaky {
        inner: backend.publisher.clone(),
        failures: AtomicU32::new(publish_failures),
        clock: clock.clone(),
    });
    let consumer = Consumer::new("counter".parse().unwrap(), ports, handler.clone(), RETENTION).with_retry_policy(
        crate::publish::RetryPolicy {
            attempts: 1,
            ..Default::default()
        },
    );
    World {
        clock,
        backend,
        consumer,
        handler,
    }
}

/// One copy of message `id` about `order`, as the queue delivers it.
fn copy(queue_message_id: &str, id: &str, order: &str) -> Delivery {
    Delivery {
        message_id: queue_message_id.into(),
        receipt: format!("r-{queue_message_id}"),
        body: json!({"type": "OrderPlaced", "order_id": order}).to_string(),
        attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned())]),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

impl World {
    async fn count(&self, order: &str) -> u64 {
        let key: ItemKey = format!("COUNT#{order}").parse().unwrap();
        let items = crate::ports::Store::get_items(self.backend.store.as_ref(), std::slice::from_ref(&key))
            .await
            .unwrap();
        items.get(&key).map_or(0, |item| item.data["count"].as_u64().unwrap())
    }

    /// Everything published to `events`: (outbox id, body).
    fn published(&self) -> Vec<(String, Value)> {
        let queue = self.backend.publisher.queue(&events()).unwrap();
        let mut out = Vec::new();
        for message in queue.receive(10) {
            out.push((
                message.attributes[MESSAGE_ID_ATTRIBUTE].clone(),
                serde_json::from_str(&message.body).unwrap(),
            ));
        }
        out
    }

    fn runs(&self) -> u32 {
        self.handler.runs.load(Ordering::SeqCst)
    }

    fn record(&self, id: &str) -> Option<crate::protocol::OutboxRecord> {
        let txn_id = self.consumer.txn_id(id);
        self.backend
            .store
            .outbox_records()
            .into_iter()
            .find(|record| record.txn_id == txn_id)
    }
}

#[tokio::test]
async fn a_message_is_applied_once_and_its_messages_go_out_before_the_dedup_clock_starts() {
    let world = world(Counting::default(), 0);
    let started = world.clock.now();
    let outcome = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 });
    assert_eq!(world.count("o-1").await, 1);
    let txn_id = world.consumer.txn_id("T:0");
    let published = world.published();
    assert_eq!(published.len(), 1);
    assert_eq!(
        published[0].0,
        format!("{txn_id}:0"),
        "outgoing ids derive from consumer and incoming id"
    );
    let record = world.record("T:0").unwrap();
    assert_eq!(record.state, OutboxState::Dispatched);
    // Publishing took a second: the retention runs from dispatch, not from receipt.
    assert_eq!(
        record.expires_at,
        Some(started.plus(Duration::from_secs(1)).plus(RETENTION)),
        "TTL = dispatch + retention"
    );
}

#[tokio::test]
async fn a_copy_delivered_again_is_acknowledged_without_running_the_handler() {
    let world = world(Counting::default(), 0);
    world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    // A producer's re-send: a new queue message id, the same outbox id.
    let again = world.consumer.consume(&copy("q-2", "T:0", "o-1")).await.unwrap();
    assert_eq!(again, ConsumeOutcome::Duplicate);
    assert_eq!(world.runs(), 1);
    assert_eq!(world.count("o-1").await, 1);
    assert_eq!(world.published().len(), 1);
}

#[tokio::test]
async fn concurrent_copies_apply_once_and_only_the_winners_messages_go_out() {
    for copies in [2usize, 3] {
        let world = world(
            Counting {
                interleave: true,
                ..Counting::default()
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
        assert_eq!(
            world.runs() as usize,
            copies,
            "every copy ran the handler: they were concurrent"
        );
        assert_eq!(
            outcomes.iter().filter(|o| **o == "processed").count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(world.count("o-1").await, 1, "applied once");
        let published = world.published();
        assert!(!published.is_empty());
        // Every copy published the winner's message (same id, same body): the run that
        // committed, never a losing run's.
        let winner = published[0].1["run"].clone();
        assert!(published.iter().all(|(_, body)| body["run"] == winner), "{published:?}");
        assert_eq!(
            published
                .iter()
                .map(|(id, _)| id)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            1
        );
    }
}

#[tokio::test]
async fn a_publish_failure_fails_the_message_and_its_redelivery_sends_the_stored_messages() {
    let world = world(Counting::default(), 1);
    let failed = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await;
    assert!(
        matches!(
            failed,
            Err(ConsumeError::Publish {
                failed: 1,
                total: 1,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(
        world.record("T:0").unwrap().state,
        OutboxState::Pending,
        "not acknowledged, not marked"
    );
    assert!(world.published().is_empty());
    let again = world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(again, ConsumeOutcome::Resumed { messages: 1 });
    assert_eq!(world.runs(), 1, "the handler did not run again");
    assert_eq!(world.count("o-1").await, 1);
    let published = world.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].1["run"], 1, "the stored message of the first run");
}

#[tokio::test]
async fn a_business_condition_that_fails_runs_the_handler_again_on_fresh_reads() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let handler = Arc::new(Counting {
        conflict_once: Some(backend.store.clone()),
        ..Counting::default()
    });
    let consumer = Consumer::new(
        "counter".parse().unwrap(),
        backend.consumer_ports(clock.clone()),
        handler.clone(),
        RETENTION,
    );
    let outcome = consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 });
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
    let key: ItemKey = "COUNT#o-1".parse().unwrap();
    let items = crate::ports::Store::get_items(backend.store.as_ref(), std::slice::from_ref(&key))
        .await
        .unwrap();
    assert_eq!(
        items[&key].data["count"], 101,
        "the second run read the other writer's change"
    );
}

#[tokio::test]
async fn a_message_without_an_id_fails_and_is_never_processed() {
    let world = world(Counting::default(), 0);
    let mut plain = copy("q-1", "T:0", "o-1");
    plain.attributes.clear();
    let report = world.consumer.consume_batch(&[plain]).await;
    assert_eq!(report.failed_message_ids(), ["q-1"]);
    assert!(matches!(report.items[0].result, Err(ConsumeError::NoId(_))));
    assert_eq!(world.runs(), 0);
    assert!(world.published().is_empty());
}

#[tokio::test]
async fn a_failure_fails_the_rest_of_its_fifo_group_and_no_other() {
    let world = world(Counting::default(), 0);
    let in_group = |queue_id: &str, id: &str, order: &str, group: &str| Delivery {
        group_id: Some(group.into()),
        ..copy(queue_id, id, order)
    };
    let mut broken = in_group("q-2", "T:1", "o-1", "a");
    broken.body = "{}".into(); // the handler fails: no order_id
    let batch = [
        in_group("q-1", "T:0", "o-1", "a"),
        broken,
        in_group("q-3", "T:2", "o-1", "a"),
        in_group("q-4", "T:3", "o-2", "b"),
    ];
    let report = world.consumer.consume_batch(&batch).await;
    assert_eq!(report.failed_message_ids(), ["q-2", "q-3"]);
    assert!(matches!(report.items[1].result, Err(ConsumeError::Handler(_))));
    assert!(matches!(
        report.items[2].result,
        Err(ConsumeError::EarlierInGroupFailed)
    ));
    assert_eq!(world.count("o-1").await, 1, "q-3 was not tried");
    assert_eq!(world.count("o-2").await, 1);
}

/// The dedup record lives from dispatch for the retention, then is gone.
#[tokio::test]
async fn dedup_data_expires_after_the_retention_and_a_late_copy_is_then_new() {
    let world = world(Counting::default(), 0);
    let received = world.clock.now();
    world.consumer.consume(&copy("q-1", "T:0", "o-1")).await.unwrap();
    world.clock.set(received.plus(RETENTION));
    // A retention after receipt, but within it from dispatch (a second later): a duplicate.
    assert_eq!(
        world.consumer.consume(&copy("q-2", "T:0", "o-1")).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
    world.clock.advance(Duration::from_secs(2));
    assert_eq!(
        world.consumer.consume(&copy("q-3", "T:0", "o-1")).await.unwrap(),
        ConsumeOutcome::Processed { messages: 1 },
        "past the retention the record is gone: why the retention must outlive every copy (C4)"
    );
}
