//! The conformance case of a consumer that publishes (docs/PROTOCOL.md): it is a producer
//! like any other. Every message it emits about the one entity it changes has its place
//! in that entity's history, in both modes, an update as well as a create; and before its
//! own, it sends the entity's earlier transactions still unsent, so that on a destination
//! that keeps order the entity's messages arrive in the order of its history, however
//! the request path, the worker and consumers take turns on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::ports::{ExpectedVersion, ItemKey, RandomIds};
use outbox::protocol::{fifo_group_of, Message, Place, TxnId, MESSAGE_ID_ATTRIBUTE};
use outbox::request::Outbox;
use serde_json::json;

use super::backend::{audit, Backend};
use super::cases::{key, RETENTION};
use super::chain::timing;

/// Reads the order the message names, writes it one step further, at the version read,
/// and emits one message to the destination that keeps order (`audit`); in entity mode
/// where `entity_mode`.
struct Advance {
    entity_mode: bool,
}

fn order_of(message: &Incoming) -> Result<ItemKey, HandlerError> {
    let body: serde_json::Value = serde_json::from_str(&message.body)?;
    Ok(body["order"].as_str().ok_or("no order")?.parse()?)
}

#[async_trait]
impl Handler for Advance {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let order = order_of(message)?;
        let read = staging.get(&order).await?;
        let (n, expected) = match &read {
            Some(item) => (
                item.data["n"].as_u64().unwrap_or(0),
                ExpectedVersion::Exactly(item.version),
            ),
            None => (0, ExpectedVersion::Absent),
        };
        staging.put(order, json!({"n": n + 1}), expected);
        staging.emit(Message::json(audit(), &json!({"by": "consumer", "n": n + 1}))?);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        self.entity_mode.then(|| order_of(message)).transpose()
    }
}

/// A consumer `name` of `b`, in entity mode or not, publishing to `b`'s destinations.
fn consumer(b: &Backend, name: &str, entity_mode: bool) -> Consumer {
    Consumer::new(
        name.parse().unwrap(),
        ConsumerPorts {
            store: b.store.clone(),
            publisher: b.publisher.clone(),
            clock: b.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(Advance { entity_mode }),
        RETENTION,
    )
}

/// Message `id` about `order`, as its queue delivers it.
fn about(order: &ItemKey, id: &str) -> Delivery {
    Delivery {
        message_id: format!("q-{id}"),
        receipt: String::new(),
        body: json!({"order": order.as_str()}).to_string(),
        attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned())]),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// What `audit` received, in the order it came: each message's transaction and place,
/// all of `order` and in its group.
async fn audit_of(b: &Backend, order: &ItemKey) -> Vec<(String, Place)> {
    b.drain(&audit())
        .await
        .into_iter()
        .map(|delivered| {
            let position = delivered
                .position
                .unwrap_or_else(|| panic!("{}: a message without its place: {:?}", b.name, delivered.body));
            assert_eq!(&position.entity, order, "{}", b.name);
            assert_eq!(
                delivered.group_id,
                Some(fifo_group_of(order)),
                "{}: grouped by entity",
                b.name
            );
            let place = Place {
                seq: position.seq,
                version: position.version,
                after: position.after,
            };
            (delivered.txn_id.expect("a transaction id"), place)
        })
        .collect()
}

/// One transaction of the request path that writes `n` to `order` at the version read
/// and emits one message to `audit`: begun in entity mode (its commit an entry in the
/// item) or not (a record of its own beside it).
async fn change(outbox: &Outbox, order: &ItemKey, n: u64, entity_mode: bool) -> TxnId {
    let mut txn = match entity_mode {
        true => outbox.begin_entity(order.clone()).await.expect("begin"),
        false => outbox.begin().await.expect("begin"),
    };
    let expected = match txn.get(order).await.expect("read") {
        Some(item) => ExpectedVersion::Exactly(item.version),
        None => ExpectedVersion::Absent,
    };
    txn.put(order.clone(), json!({ "n": n }), expected);
    txn.emit(Message::json(audit(), &json!({"by": "request", "n": n})).expect("a message"));
    txn.commit().await.expect("the commit").txn_id
}

fn place(seq: u64, version: u64, after: u64) -> Place {
    Place { seq, version, after }
}

/// A consumer places what it emits about the entity it changes, in both modes, an update
/// as well as a create, continuing the chain the request path began.
pub async fn a_consumer_places_what_it_emits_in_both_modes(b: &Backend) {
    let publishing = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let in_entity = consumer(b, "hop-entity", true);
    let transactional = consumer(b, "hop-transactional", false);
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let id = |n: u32| format!("{}:{n}", TxnId::new_v7());
    let txn = |consumer: &Consumer, id: &str| consumer.txn_id(id).to_string();

    // Creates, by either consumer.
    let created = key(&format!("ORDER#{}", TxnId::new_v7()));
    let first = id(0);
    let outcome = in_entity.consume(&about(&created, &first)).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 }, "{}", b.name);
    let second = id(0);
    transactional.consume(&about(&created, &second)).await.unwrap();
    assert_eq!(
        audit_of(b, &created).await,
        [
            (txn(&in_entity, &first), place(1, 1, 0)),
            (txn(&transactional, &second), place(2, 2, 1)),
        ],
        "{}: creates and updates, both modes",
        b.name
    );

    // Updates, by either consumer, after the request path's create.
    let made = change(&publishing, &order, 0, true).await;
    let (one, two) = (id(1), id(2));
    let outcome = in_entity.consume(&about(&order, &one)).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 }, "{}", b.name);
    transactional.consume(&about(&order, &two)).await.unwrap();
    assert_eq!(
        audit_of(b, &order).await,
        [
            (made.to_string(), place(1, 1, 0)),
            (txn(&in_entity, &one), place(2, 2, 1)),
            (txn(&transactional, &two), place(3, 3, 2)),
        ],
        "{}: updates by either consumer continue the request path's chain",
        b.name
    );
}

/// A consumer, publishing, sends its entity's earlier transactions still unsent first,
/// as the request path does: a transaction of the request path committed in the
/// transactional form whose messages were not sent goes out before the consumer's (found
/// through the chain), so that a later transaction of the request path, whose search stops
/// at the consumer's commit (sent), follows them both in order. In either mode.
pub async fn a_consumer_sends_its_entitys_earlier_transactions_first(b: &Backend) {
    let silent = b.outbox(timing());
    let publishing = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let in_entity = consumer(b, "hop-entity", true);
    let transactional = consumer(b, "hop-transactional", false);
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let made = change(&publishing, &order, 0, true).await;
    assert_eq!(
        audit_of(b, &order).await,
        [(made.to_string(), place(1, 1, 0))],
        "{}",
        b.name
    );
    for (consumer, at) in [(&transactional, 2), (&in_entity, 5)] {
        let unsent = change(&silent, &order, 10, false).await;
        let message = format!("{}:0", TxnId::new_v7());
        let outcome = consumer.consume(&about(&order, &message)).await.unwrap();
        assert_eq!(outcome, ConsumeOutcome::Processed { messages: 1 }, "{}", b.name);
        let later = change(&publishing, &order, 20, true).await;
        assert_eq!(
            audit_of(b, &order).await,
            [
                (unsent.to_string(), place(at, at, at - 1)),
                (consumer.txn_id(&message).to_string(), place(at + 1, at + 1, at)),
                (later.to_string(), place(at + 2, at + 2, at + 1)),
            ],
            "{}: the earlier transaction first, then the consumer's, then the later one",
            b.name
        );
    }
}
