//! The conformance case of producers (docs/PROTOCOL.md): every message placed in its
//! entity's history names the table whose chain it is, and an in-order consumer keeps one
//! chain per producer, so that two services that publish to one destination about
//! entities whose keys look alike never share a chain, in both modes, on both stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::ports::{ExpectedVersion, ItemKey, RandomIds};
use outbox::protocol::{Message, Position, Producer, TxnId, MESSAGE_ID_ATTRIBUTE};
use serde_json::json;

use super::backend::{events, Backend, Delivered};
use super::cases::{key, RETENTION};
use super::chain::timing;

/// Appends `{producer}:{seq}` of each message to `SEEN#{entity}` (`-` for a producer
/// that names none); in entity mode that item is its entity, which keeps the positions.
struct Seen {
    entity_mode: bool,
}

fn seen_key(position: &Position) -> Result<ItemKey, HandlerError> {
    Ok(format!("SEEN#{}", position.entity).parse()?)
}

#[async_trait]
impl Handler for Seen {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        let key = seen_key(&position)?;
        let read = staging.get(&key).await?;
        let mut seen: Vec<serde_json::Value> = read
            .as_ref()
            .and_then(|item| item.data["seen"].as_array().cloned())
            .unwrap_or_default();
        let producer = position.producer.as_ref().map_or("-", Producer::as_str);
        seen.push(json!(format!("{producer}:{}", position.seq)));
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, json!({ "seen": seen }), expected);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        self.entity_mode.then(|| seen_key(&position)).transpose()
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// An in-order consumer `name` of `b`, in entity mode or not.
fn consumer(b: &Backend, name: &str, entity_mode: bool) -> Consumer {
    Consumer::new(
        name.parse().unwrap(),
        ConsumerPorts {
            store: b.store.clone(),
            publisher: b.publisher.clone(),
            clock: b.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(Seen { entity_mode }),
        RETENTION,
    )
}

/// A message at `position` with `body` and id `id`, as its queue delivers it.
fn delivery(position: &Position, body: &str, id: &str) -> Delivery {
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned());
    Delivery {
        message_id: format!("q-{id}"),
        receipt: String::new(),
        body: body.to_owned(),
        attributes,
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// What `SEEN#{entity}` holds.
async fn seen(b: &Backend, entity: &ItemKey) -> serde_json::Value {
    let key: ItemKey = format!("SEEN#{entity}").parse().unwrap();
    let items = b.store.get_items(std::slice::from_ref(&key)).await.unwrap();
    items.get(&key).map_or(json!(null), |item| item.data["seen"].clone())
}

/// The request path names the table in every position it stamps (on DynamoDB its name),
/// in both forms of commit. An in-order consumer given seq 1 of one entity's chain on
/// `events` from this table and seq 1 of an entity with the same key from another table
/// applies both, in both modes: two chains, each with a position of its own. A message
/// that names no producer (as a producer that names none sends it) keeps the keys it
/// always had, and the next message of its chain, named, continues from it.
pub async fn two_producers_chains_stay_two_at_an_in_order_consumer(b: &Backend) {
    let producer = b
        .store
        .producer()
        .unwrap_or_else(|| panic!("{}: the store names itself", b.name));
    if let Some(layout) = &b.layout {
        assert_eq!(producer.as_str(), layout.table, "{}: the table's name", b.name);
    }
    let outbox = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    for entity_mode in [false, true] {
        let customer = key(&format!("CUSTOMER#{}", TxnId::new_v7()));
        let mut txn = match entity_mode {
            true => outbox.begin_entity(customer.clone()).await.unwrap(),
            false => outbox.begin().await.unwrap(),
        };
        assert!(txn.get(&customer).await.unwrap().is_none());
        txn.put(customer.clone(), json!({"n": 1}), ExpectedVersion::Absent);
        txn.emit(Message::json(events(), &json!({"customer": customer.as_str()})).unwrap());
        txn.commit().await.unwrap();
        let delivered: Vec<Delivered> = b.drain(&events()).await;
        assert_eq!(delivered.len(), 1, "{}", b.name);
        let ours = delivered[0].position.clone().expect("placed");
        assert_eq!(ours.producer.as_ref(), Some(&producer), "{}: named", b.name);
        assert_eq!((ours.seq, ours.version, ours.after), (1, 1, 0), "{}", b.name);
        let id = delivered[0].message_id.clone().expect("an id");
        let body = delivered[0].body.clone();

        // Seq 1 of the same key from another table, and our own.
        let theirs = Position {
            producer: Some("billing-table".parse().unwrap()),
            ..ours.clone()
        };
        let consumer = consumer(b, "ordered", entity_mode);
        for (position, id) in [(&ours, id.clone()), (&theirs, format!("billing:{id}"))] {
            let outcome = consumer.consume(&delivery(position, &body, &id)).await;
            assert!(
                matches!(outcome, Ok(ConsumeOutcome::Processed { .. })),
                "{}, entity mode {entity_mode}: {:?} gives {outcome:?}",
                b.name,
                position.producer
            );
        }
        assert_eq!(
            seen(b, &customer).await,
            json!([format!("{producer}:1"), "billing-table:1"]),
            "{}, entity mode {entity_mode}",
            b.name
        );
        // Each chain has a position of its own, where the mode keeps it.
        for position in [&ours, &theirs] {
            let held = match entity_mode {
                true => {
                    let entity: ItemKey = format!("SEEN#{customer}").parse().unwrap();
                    let keys = b.store.get_keys(std::slice::from_ref(&entity)).await.unwrap();
                    let name = outbox::consumer::in_order::applied_name("ordered", position);
                    keys[&entity].applied.get(&name).map(|applied| applied.seq)
                }
                false => {
                    let item = outbox::consumer::in_order::position_key("ordered", position);
                    let items = b.store.get_items(std::slice::from_ref(&item)).await.unwrap();
                    items.get(&item).and_then(|item| item.data["applied"].as_u64())
                }
            };
            assert_eq!(held, Some(1), "{}, entity mode {entity_mode}", b.name);
        }

        // A chain that names no producer, then names it: seq 1 unnamed, under the keys
        // a consumer always kept it; seq 2 named continues it, and a copy of seq 1
        // unnamed is a duplicate.
        let legacy = Position {
            producer: None,
            entity: key(&format!("CUSTOMER#{}", TxnId::new_v7())),
            ..ours.clone()
        };
        let legacy_body = json!({"customer": legacy.entity.as_str()}).to_string();
        let outcome = consumer
            .consume(&delivery(&legacy, &legacy_body, &format!("legacy:{}", legacy.entity)))
            .await;
        assert!(
            matches!(outcome, Ok(ConsumeOutcome::Processed { .. })),
            "{}, entity mode {entity_mode}: {outcome:?}",
            b.name
        );
        let name = outbox::consumer::in_order::applied_name("ordered", &legacy);
        assert_eq!(name, format!("ordered#events#{}", legacy.entity), "as it always was");
        let next = Position {
            producer: Some(producer.clone()),
            seq: 2,
            version: 2,
            after: 1,
            ..legacy.clone()
        };
        let outcome = consumer
            .consume(&delivery(&next, &legacy_body, &format!("named:{}", legacy.entity)))
            .await;
        assert!(
            matches!(outcome, Ok(ConsumeOutcome::Processed { .. })),
            "{}, entity mode {entity_mode}: {outcome:?}",
            b.name
        );
        let outcome = consumer
            .consume(&delivery(&legacy, &legacy_body, &format!("again:{}", legacy.entity)))
            .await;
        assert!(matches!(outcome, Ok(ConsumeOutcome::Duplicate)), "{outcome:?}");
        assert_eq!(
            seen(b, &legacy.entity).await,
            json!(["-:1", format!("{producer}:2")]),
            "{}, entity mode {entity_mode}",
            b.name
        );
    }
}
