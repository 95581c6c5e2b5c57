//! A consumer that publishes is a producer like any other, on the embedded backend: on a
//! destination that keeps order, an entity's messages go out in the order of its history
//! whoever publishes them, and a consumer's commit still unsent is its consumer's to
//! settle.

use std::sync::atomic::AtomicBool;

use crate::control::{ControlOutcome, ControlPath};
use crate::ports::ControlDelivery;
use crate::protocol::{fifo_group_of, ControlMessage, Position, TxnId};
use crate::request::Outbox;
use crate::settings::Timing;

use super::*;

fn audit() -> DestinationName {
    "audit".parse().unwrap()
}

/// A publisher that fails every entry while `failing`, and says whether a destination
/// keeps order as the one it wraps does.
struct Switched {
    inner: Arc<dyn Publisher>,
    failing: AtomicBool,
}

#[async_trait]
impl Publisher for Switched {
    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }

    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        if self.failing.load(Ordering::SeqCst) {
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

/// Reads the order the message names, writes it one step further at the version read,
/// and emits one message to `audit`; in entity mode where `entity_mode`.
struct Advance {
    entity_mode: bool,
}

fn order_key(message: &Incoming) -> Result<ItemKey, HandlerError> {
    let body: Value = serde_json::from_str(&message.body)?;
    Ok(body["order"].as_str().ok_or("no order")?.parse()?)
}

#[async_trait]
impl Handler for Advance {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let order = order_key(message)?;
        let item = staging.get(&order).await?.ok_or("no order")?;
        let n = item.data["n"].as_u64().unwrap_or(0);
        staging.put(order, json!({"n": n + 1}), ExpectedVersion::Exactly(item.version));
        staging.emit(Message::json(audit(), &json!({"by": "consumer", "n": n + 1}))?);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        self.entity_mode.then(|| order_key(message)).transpose()
    }
}

struct Hop {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    /// The request path, publishing inline.
    publishing: Outbox,
    /// The request path, leaving every publish to the worker.
    silent: Outbox,
    control: ControlPath,
    order: ItemKey,
}

/// An order `ORDER#1` created by the request path, its message out (seq 1).
async fn hop() -> Hop {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(audit(), true)]);
    let publishing = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        Default::default(),
    )
    .with_inline_publisher(backend.publisher.clone());
    let silent = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        Default::default(),
    );
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let hop = Hop {
        clock,
        backend,
        publishing,
        silent,
        control,
        order: "ORDER#1".parse().unwrap(),
    };
    let made = hop.change(&hop.publishing, true).await;
    assert_eq!(hop.audit(), [(made.to_string(), 1)]);
    hop
}

impl Hop {
    /// A consumer `name`, in entity mode or not, publishing through a [`Switched`]
    /// publisher (returned, to switch).
    fn consumer(&self, name: &str, entity_mode: bool) -> (Consumer, Arc<Switched>) {
        let switched = Arc::new(Switched {
            inner: self.backend.publisher.clone(),
            failing: AtomicBool::new(false),
        });
        let mut ports = self.backend.consumer_ports(self.clock.clone());
        ports.publisher = switched.clone();
        let consumer = Consumer::new(
            name.parse().unwrap(),
            ports,
            Arc::new(Advance { entity_mode }),
            RETENTION,
        )
        .with_retry_policy(crate::publish::RetryPolicy {
            attempts: 1,
            ..Default::default()
        });
        (consumer, switched)
    }

    /// One transaction of the request path through `outbox` that writes the order at the
    /// version read and emits one message to `audit`, begun in entity mode or not.
    async fn change(&self, outbox: &Outbox, entity_mode: bool) -> TxnId {
        let mut txn = match entity_mode {
            true => outbox.begin_entity(self.order.clone()).await.unwrap(),
            false => outbox.begin().await.unwrap(),
        };
        let expected = match txn.get(&self.order).await.unwrap() {
            Some(item) => ExpectedVersion::Exactly(item.version),
            None => ExpectedVersion::Absent,
        };
        txn.put(self.order.clone(), json!({"n": 0}), expected);
        txn.emit(Message::json(audit(), &json!({"by": "request"})).unwrap());
        txn.commit().await.unwrap().txn_id
    }

    /// What `audit` received since the last call, in the order it came: each message's
    /// transaction and `seq`, all of the order and in its group.
    fn audit(&self) -> Vec<(String, u64)> {
        let queue = self.backend.publisher.queue(&audit()).unwrap();
        let mut out = Vec::new();
        loop {
            let batch = queue.receive(10);
            if batch.is_empty() {
                return out;
            }
            for message in batch {
                queue.delete(&message.receipt);
                assert_eq!(message.group_id, Some(fifo_group_of(&self.order)));
                let position = Position::from_attributes(&message.attributes).unwrap().expect("placed");
                assert_eq!(position.entity, self.order);
                let txn = message.attributes[crate::protocol::TXN_ID_ATTRIBUTE].clone();
                out.push((txn, position.seq));
            }
        }
    }

    /// The worker, handed `txn_id`'s control message.
    async fn work(&self, txn_id: TxnId) -> Result<ControlOutcome, crate::control::ControlError> {
        let control = ControlMessage::first(txn_id, self.clock.now()).with_entity(self.order.clone());
        let delivery = ControlDelivery {
            message_id: format!("c-{txn_id}"),
            receipt: format!("c-{txn_id}"),
            body: control.encode(),
            receive_count: 1,
        };
        self.control.handle(&delivery).await.result
    }
}

/// Message `id` about the order, as its queue delivers it.
fn about(queue_message_id: &str, id: &str) -> Delivery {
    Delivery {
        message_id: queue_message_id.into(),
        receipt: format!("r-{queue_message_id}"),
        body: json!({"order": "ORDER#1"}).to_string(),
        attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned())]),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// A consumer's commit whose publish failed is still its consumer's to settle (only it
/// writes the message's dedup record), so a later transaction of the same entity on a
/// destination that keeps order waits for it instead of overtaking it: the request path
/// leaves it to the worker, and the worker sends nothing of it (nor settles the consumer's
/// commit) until the consumer's next delivery sent its. In both modes.
#[tokio::test]
async fn a_consumers_unsent_commit_holds_a_later_transaction_back_until_its_consumer_sends_it() {
    for entity_mode in [false, true] {
        let hop = hop().await;
        let (consumer, switched) = hop.consumer("hop", entity_mode);
        switched.failing.store(true, Ordering::SeqCst);
        let failed = consumer.consume(&about("q-1", "M:0")).await;
        assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
        let consumed = consumer.txn_id("M:0");
        let later = hop.change(&hop.publishing, true).await;
        assert_eq!(hop.audit(), [], "entity mode {entity_mode}: the later one waits");
        let waiting = hop.work(later).await;
        assert!(waiting.is_err(), "entity mode {entity_mode}: {waiting:?}");
        assert_eq!(hop.audit(), [], "entity mode {entity_mode}: the worker waits too");
        switched.failing.store(false, Ordering::SeqCst);
        let resumed = consumer.consume(&about("q-2", "M:0")).await.unwrap();
        assert_eq!(
            resumed,
            ConsumeOutcome::Resumed { messages: 1 },
            "entity mode {entity_mode}"
        );
        let sent = hop.work(later).await;
        assert!(
            matches!(sent, Ok(ControlOutcome::Dispatched { .. })),
            "entity mode {entity_mode}: {sent:?}"
        );
        assert_eq!(
            hop.audit(),
            [(consumed.to_string(), 2), (later.to_string(), 3)],
            "entity mode {entity_mode}: in the order of the entity's history"
        );
    }
}

/// The search for an entity's earlier unsent transactions follows the chain through a
/// consumer's commit still unsent: a second consumer's publish finds the first consumer's
/// record (its publish failed) and, through it, the request path's transaction before it
/// (unsent too), and sends both first, in order.
#[tokio::test]
async fn the_search_follows_the_chain_through_a_consumers_unsent_commit() {
    let hop = hop().await;
    let unsent = hop.change(&hop.silent, false).await;
    let (first, failing) = hop.consumer("first", false);
    failing.failing.store(true, Ordering::SeqCst);
    let failed = first.consume(&about("q-1", "M:0")).await;
    assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
    let (second, _) = hop.consumer("second", false);
    let processed = second.consume(&about("q-2", "N:0")).await.unwrap();
    assert_eq!(processed, ConsumeOutcome::Processed { messages: 1 });
    assert_eq!(
        hop.audit(),
        [
            (unsent.to_string(), 2),
            (first.txn_id("M:0").to_string(), 3),
            (second.txn_id("N:0").to_string(), 4),
        ]
    );
    // The first consumer's commit is still its own to settle: its next delivery sends
    // its messages again (FIFO drops the copy) and records the message.
    failing.failing.store(false, Ordering::SeqCst);
    assert_eq!(
        first.consume(&about("q-3", "M:0")).await.unwrap(),
        ConsumeOutcome::Resumed { messages: 1 }
    );
}
