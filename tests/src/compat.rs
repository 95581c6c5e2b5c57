//! What earlier versions stored, read by the code of today: the compatibility policy for
//! stored items, held by fixtures. `tests/fixtures/stored-0.1.json` holds every kind of
//! item version 0.1 writes on DynamoDB (a record pending, dispatched and tombstoned, an
//! entry in an item and a sent mark, an idempotency record) as the table held them, with
//! the control messages it sent; `stored-0.2.json` adds what 0.2 stores besides (a vacant
//! item keeping its version, an entity's chain heads, messages placed in their entity's
//! history). [`check`] loads one into a fresh table and reads it through the store, the
//! status reads and the control path.
//!
//! The fixture is written once per release that changes what is stored, by [`write()`]
//! (`OUTBOX_WRITE_FIXTURE=1` on the test), and a release keeps reading the fixtures of
//! every earlier one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::control::ControlOutcome;
use outbox::ports::{Clock, ControlDelivery, ExpectedVersion, FenceOutcome, ItemKey, RandomIds};
use outbox::protocol::{
    IdempotencyKey, IdempotencySlot, Message, Position, StoredResponse, TxnId, MESSAGE_ID_ATTRIBUTE,
};
use outbox::request::{Outbox, TxnStatus};
use outbox::settings::Timing;
use outbox::time::Timestamp;
use serde_json::{json, Map, Value};

use crate::conformance::{events, Backend};
use crate::emulator::emulator;

/// The fixture of version 0.1.
pub const FIXTURE_0_1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/stored-0.1.json");
/// The fixture of version 0.2: versions kept across deletes, chains.
pub const FIXTURE_0_2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/stored-0.2.json");
/// The version this code stores, and its fixture.
pub const CURRENT: (&str, &str) = ("0.2", FIXTURE_0_2);

/// Long enough that nothing in the fixture expires while it is read (its clock is the
/// fixture's own).
fn timing() -> Timing {
    Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(1),
        max_commit_duration: Duration::from_secs(60),
        retention: Duration::from_secs(3650 * 24 * 3600),
    }
}

fn key(text: &str) -> ItemKey {
    text.parse().expect("a valid key")
}

/// An item as DynamoDB's JSON (`{"S": ...}`, `{"M": {...}}`...).
fn to_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(text) => json!({"S": text}),
        AttributeValue::N(number) => json!({"N": number}),
        AttributeValue::B(blob) => {
            json!({"B": blob.as_ref().iter().map(|byte| format!("{byte:02x}")).collect::<String>()})
        }
        AttributeValue::Bool(flag) => json!({"BOOL": flag}),
        AttributeValue::Null(_) => json!({"NULL": true}),
        AttributeValue::M(map) => json!({"M": map.iter().map(|(k, v)| (k.clone(), to_json(v))).collect::<Map<_, _>>()}),
        AttributeValue::L(list) => json!({"L": list.iter().map(to_json).collect::<Vec<_>>()}),
        AttributeValue::Ss(set) => json!({"SS": set}),
        AttributeValue::Ns(set) => json!({"NS": set}),
        other => panic!("no JSON form for {other:?}"),
    }
}

fn from_json(value: &Value) -> AttributeValue {
    let (kind, inner) = value
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("one typed value");
    match kind.as_str() {
        "S" => AttributeValue::S(inner.as_str().unwrap().into()),
        "N" => AttributeValue::N(inner.as_str().unwrap().into()),
        "B" => {
            let hex = inner.as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap());
            AttributeValue::B(Blob::new(bytes.collect::<Vec<u8>>()))
        }
        "BOOL" => AttributeValue::Bool(inner.as_bool().unwrap()),
        "NULL" => AttributeValue::Null(true),
        "M" => AttributeValue::M(
            inner
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), from_json(v)))
                .collect(),
        ),
        "L" => AttributeValue::L(inner.as_array().unwrap().iter().map(from_json).collect()),
        "SS" => AttributeValue::Ss(serde_json::from_value(inner.clone()).unwrap()),
        "NS" => AttributeValue::Ns(serde_json::from_value(inner.clone()).unwrap()),
        other => panic!("unknown type {other}"),
    }
}

fn table(b: &Backend) -> String {
    b.layout.as_ref().expect("an AWS backend").table.clone()
}

async fn dynamodb() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&emulator().sdk_config().await)
}

/// The event each fixture transaction emits, and its attributes.
fn event(name: &str) -> Message {
    Message::json(events(), &json!({"type": name, "compat": "0.1"}))
        .unwrap()
        .with_attribute("event-type", name)
        .with_event("com.example.compat", name)
}

async fn control_body(b: &Backend, txn_id: TxnId) -> String {
    let deliveries = b.next_control_message(txn_id, timing().first_check_delay).await;
    let body = deliveries[0].body.clone();
    let receipts: Vec<String> = deliveries.iter().map(|delivery| delivery.receipt.clone()).collect();
    b.inbox.ack(&receipts).await.unwrap();
    body
}

/// Appends each message's `seq` to `data.seen` of `COMPAT#SEEN#{consumer}`: in entity mode
/// that item is the consumer's entity, which keeps its chains' positions (`in:`).
#[derive(Clone, Copy)]
struct Seen {
    consumer: &'static str,
    entity_mode: bool,
}

impl Seen {
    fn key(&self) -> ItemKey {
        key(&format!("COMPAT#SEEN#{}", self.consumer))
    }
}

#[async_trait]
impl Handler for Seen {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        let read = staging.get(&self.key()).await?;
        let mut seen: Vec<Value> = read
            .as_ref()
            .and_then(|item| item.data["seen"].as_array().cloned())
            .unwrap_or_default();
        seen.push(json!(position.seq));
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(self.key(), json!({ "seen": seen }), expected);
        Ok(())
    }

    fn entity(&self, _message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(self.entity_mode.then(|| self.key()))
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// The in-order consumers of the fixture: `compat-txn` keeps its positions in items of
/// their own (`IN#AT#...`), `compat-entity` in its entity (`in:...`).
fn in_order_consumer(b: &Backend, entity_mode: bool) -> (Consumer, Seen) {
    let seen = Seen {
        consumer: if entity_mode { "compat-entity" } else { "compat-txn" },
        entity_mode,
    };
    let consumer = Consumer::new(
        seen.consumer.parse().unwrap(),
        ConsumerPorts {
            store: b.store.clone(),
            publisher: b.publisher.clone(),
            clock: b.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(seen),
        timing().retention,
    );
    (consumer, seen)
}

/// Message `seq` of `COMPAT#E`'s chain on `events` (versions `seq + 1` after `seq`),
/// naming `producer` or none, with id `id`.
fn in_order_delivery(producer: Option<&str>, seq: u64, id: &str) -> Delivery {
    let position = Position {
        producer: producer.map(|name| name.parse().unwrap()),
        entity: key("COMPAT#E"),
        chain: events(),
        seq,
        version: seq + 1,
        after: seq,
        previous: None,
    };
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_owned());
    Delivery {
        message_id: format!("q-{id}"),
        receipt: String::new(),
        body: json!({ "seq": seq }).to_string(),
        attributes,
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// What a consumer of [`in_order_consumer`] applied.
async fn seen(b: &Backend, seen: &Seen) -> Value {
    let items = b.store.get_items(std::slice::from_ref(&seen.key())).await.unwrap();
    items
        .get(&seen.key())
        .map_or(json!(null), |item| item.data["seen"].clone())
}

/// The in-order consumers' positions, at seq 2 of `COMPAT#E`'s chain on `events` as a
/// message that names no producer leaves them (an item `IN#AT#compat-txn#events#COMPAT#E`,
/// an attribute `in:compat-entity#events#COMPAT#E` of `COMPAT#SEEN#compat-entity`), and a
/// fence mark in `COMPAT#F` (`outbox_fence`) with its transaction's tombstone; returns
/// that transaction.
async fn write_in_order_and_fence(b: &Backend, outbox: &Outbox) -> TxnId {
    for entity_mode in [false, true] {
        let (consumer, _) = in_order_consumer(b, entity_mode);
        for seq in 1..=2 {
            let outcome = consumer
                .consume(&in_order_delivery(None, seq, &format!("compat-in-order:{seq}")))
                .await
                .unwrap();
            assert!(matches!(outcome, ConsumeOutcome::Processed { .. }), "{outcome:?}");
        }
    }
    let fenced_item = key("COMPAT#F");
    create(b, outbox, &fenced_item).await;
    let fenced = TxnId::new_v7();
    let now = b.clock.now();
    let outcome = b
        .store
        .fence_entity(&fenced_item, fenced, now, now.plus(timing().retention))
        .await
        .unwrap();
    assert!(matches!(outcome, FenceOutcome::Fenced), "{outcome:?}");
    fenced
}

/// A create of `item` in the portable form, settled by the control path.
async fn create(b: &Backend, outbox: &Outbox, item: &ItemKey) {
    let mut txn = outbox.begin().await.unwrap();
    txn.put(item.clone(), json!({"n": 1}), ExpectedVersion::Absent);
    let txn_id = txn.commit().await.unwrap().txn_id;
    b.handle_until_settled(&b.control(timing()), txn_id, timing().first_check_delay, |_| {})
        .await;
}

/// Writes the fixture of [`CURRENT`] from what this code stores (run once per release
/// that changes it).
pub async fn write(b: &Backend) {
    let outbox = b.outbox(timing());
    let control = b.control(timing());
    let mut names = BTreeMap::new();
    let mut control_messages = BTreeMap::new();

    // A record pending: committed, its control message not handled yet.
    let mut txn = outbox.begin().await.unwrap();
    txn.put(key("COMPAT#A"), json!({"n": 1}), ExpectedVersion::Absent);
    txn.emit(event("PendingOne"));
    txn.emit(event("PendingTwo").with_group_id("g-1"));
    let pending = txn.commit().await.unwrap().txn_id;
    names.insert("record_pending", pending);
    control_messages.insert("record_pending", control_body(b, pending).await);

    // A record dispatched.
    let mut txn = outbox.begin().await.unwrap();
    txn.put(key("COMPAT#B"), json!({"n": 1}), ExpectedVersion::Absent);
    txn.emit(event("Dispatched"));
    let dispatched = txn.commit().await.unwrap().txn_id;
    b.handle_until_settled(&control, dispatched, timing().first_check_delay, |_| {})
        .await;
    names.insert("record_dispatched", dispatched);

    // A tombstone.
    let txn = outbox.begin().await.unwrap();
    let tombstoned = txn.id();
    assert!(txn.abandon().await.never_committed());
    names.insert("record_tombstoned", tombstoned);
    let _ = control_body(b, tombstoned).await;

    // An entry pending in its item, and a sent mark.
    for (name, item) in [("entry_pending", "COMPAT#K1"), ("sent_mark", "COMPAT#K2")] {
        let item = key(item);
        create(b, &outbox, &item).await;
        let mut txn = outbox.begin_entity(item.clone()).await.unwrap();
        let read = txn.get(&item).await.unwrap().unwrap();
        txn.put(item.clone(), json!({"n": 2}), ExpectedVersion::Exactly(read.version));
        txn.emit(event(name));
        let txn_id = txn.commit().await.unwrap().txn_id;
        names.insert(name, txn_id);
        if name == "sent_mark" {
            b.handle_until_settled(&control, txn_id, timing().first_check_delay, |_| {})
                .await;
        } else {
            control_messages.insert(name, control_body(b, txn_id).await);
        }
    }

    // An idempotency record with the answer it replays.
    let mut txn = outbox.begin().await.unwrap();
    let slot = IdempotencySlot::new("compat.create", &"key-1".parse::<IdempotencyKey>().unwrap());
    txn.remember_response(slot, "fingerprint-1".into(), stored_response());
    txn.put(key("COMPAT#C"), json!({"n": 1}), ExpectedVersion::Absent);
    let idempotent = txn.commit().await.unwrap().txn_id;
    names.insert("idempotent", idempotent);
    let _ = control_body(b, idempotent).await;

    // A vacant item: created, then deleted; it keeps its version (2) and its chain.
    let vacant = key("COMPAT#V");
    let mut txn = outbox.begin_entity(vacant.clone()).await.unwrap();
    assert!(txn.get(&vacant).await.unwrap().is_none());
    txn.put(vacant.clone(), json!({"n": 1}), ExpectedVersion::Absent);
    txn.emit(event("Created"));
    let created = txn.commit().await.unwrap().txn_id;
    b.handle_until_settled(&control, created, timing().first_check_delay, |_| {})
        .await;
    let mut txn = outbox.begin().await.unwrap();
    let read = txn.get(&vacant).await.unwrap().unwrap();
    txn.delete(vacant.clone(), read.version);
    let deleted = txn.commit().await.unwrap().txn_id;
    let _ = control_body(b, deleted).await;
    names.insert("vacant_created", created);
    let _ = b.drain(&events()).await;

    // In-order consumers' positions, and a fence mark.
    names.insert("fenced", write_in_order_and_fence(b, &outbox).await);

    let scan = dynamodb().await.scan().table_name(table(b)).send().await.unwrap();
    let mut items: Vec<Value> = scan
        .items()
        .iter()
        .map(|item| Value::Object(item.iter().map(|(k, v)| (k.clone(), to_json(v))).collect::<Map<_, _>>()))
        .collect();
    items.sort_by_key(|item| item.to_string());
    let (version, path) = CURRENT;
    let fixture = json!({
        "version": version,
        "clock_ms": b.clock.now().as_millis(),
        "transactions": names.iter().map(|(name, txn)| (name.to_string(), json!(txn.to_string()))).collect::<Map<_, _>>(),
        "control_messages": control_messages,
        "items": items,
    });
    std::fs::write(path, serde_json::to_string_pretty(&fixture).unwrap() + "\n").unwrap();
}

fn stored_response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("location".into(), "/c/1".into()),
        ],
        body: r#"{"id":"c-1"}"#.into(),
    }
}

/// Loads the fixture at `path` into `b`'s fresh table and reads it with today's code.
pub async fn check(b: &Backend, path: &str) {
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let client = dynamodb().await;
    for item in fixture["items"].as_array().unwrap() {
        let attributes: HashMap<String, AttributeValue> = item
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), from_json(v)))
            .collect();
        client
            .put_item()
            .table_name(table(b))
            .set_item(Some(attributes))
            .send()
            .await
            .unwrap();
    }
    b.clock
        .set(Timestamp::from_millis(fixture["clock_ms"].as_u64().unwrap()));
    let txn = |name: &str| -> TxnId { fixture["transactions"][name].as_str().unwrap().parse().unwrap() };
    let outbox = b.outbox(timing());

    // Every status reads as it did.
    assert_eq!(outbox.status(txn("record_pending")).await.unwrap(), TxnStatus::Pending);
    assert_eq!(
        outbox.status(txn("record_dispatched")).await.unwrap(),
        TxnStatus::Dispatched
    );
    assert_eq!(
        outbox.status(txn("record_tombstoned")).await.unwrap(),
        TxnStatus::Tombstoned
    );
    assert_eq!(
        outbox.status_in(txn("entry_pending"), &key("COMPAT#K1")).await.unwrap(),
        TxnStatus::Pending
    );
    assert_eq!(
        outbox.status_in(txn("sent_mark"), &key("COMPAT#K2")).await.unwrap(),
        TxnStatus::Dispatched
    );
    // The business items, with their versions.
    let items = b.store.get_items(&[key("COMPAT#A"), key("COMPAT#K1")]).await.unwrap();
    assert_eq!(
        (items[&key("COMPAT#A")].version, &items[&key("COMPAT#A")].data),
        (1, &json!({"n": 1}))
    );
    assert_eq!(
        (items[&key("COMPAT#K1")].version, &items[&key("COMPAT#K1")].data),
        (2, &json!({"n": 2}))
    );
    // The stored answer replays.
    let slot = IdempotencySlot::new("compat.create", &"key-1".parse::<IdempotencyKey>().unwrap());
    let record = b
        .store
        .get_idempotency(&slot)
        .await
        .unwrap()
        .expect("the idempotency record");
    assert_eq!(
        (record.txn_id, &record.response),
        (txn("idempotent"), &stored_response())
    );

    // The control messages 0.1 sent are handled, and the messages it stored go out as
    // they were emitted.
    let control = b.control(timing());
    for (name, expected) in [
        ("record_pending", vec!["PendingOne", "PendingTwo"]),
        ("entry_pending", vec!["entry_pending"]),
    ] {
        let delivery = ControlDelivery {
            message_id: format!("compat-{name}"),
            receipt: String::new(),
            body: fixture["control_messages"][name].as_str().unwrap().to_owned(),
            receive_count: 1,
        };
        let report = control.handle(&delivery).await;
        assert!(
            matches!(report.result, Ok(ControlOutcome::Dispatched { .. })),
            "{name}: {:?}",
            report.result
        );
        let mut out = b.drain(&events()).await;
        // A standard queue keeps no order: by stable id.
        out.sort_by(|a, b| a.message_id.cmp(&b.message_id));
        let types: Vec<String> = out
            .iter()
            .map(|message| {
                serde_json::from_str::<Value>(&message.body).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(types, expected, "{name}");
        let ids: Vec<_> = out.iter().map(|message| message.message_id.clone()).collect();
        let stable: Vec<_> = (0..expected.len())
            .map(|i| Some(format!("{}:{i}", txn(name))))
            .collect();
        assert_eq!(ids, stable, "{name}: the stable ids");
    }
    assert_eq!(
        outbox.status(txn("record_pending")).await.unwrap(),
        TxnStatus::Dispatched
    );

    // Since 0.2: the entry's message carried its place in its item's history, and a
    // vacant item keeps its version and its chain, which a create continues.
    if fixture["version"] != "0.1" {
        let entry = fixture["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["pk"]["S"] == "COMPAT#K1")
            .expect("the item with its entry");
        assert!(entry.to_string().contains("\\\"position\\\""), "{entry}");
        let vacant = key("COMPAT#V");
        let read = b.store.get_keys(std::slice::from_ref(&vacant)).await.unwrap();
        assert_eq!(read[&vacant].item, None, "vacant");
        assert_eq!(read[&vacant].version, 2, "the version its delete left");
        assert_eq!(read[&vacant].heads[&events()].seq, 1, "its chain on events");
        let mut txn = b.outbox(timing()).begin_entity(vacant.clone()).await.unwrap();
        assert!(txn.get(&vacant).await.unwrap().is_none());
        txn.put(vacant.clone(), json!({"n": 2}), ExpectedVersion::Absent);
        txn.emit(event("CreatedAgain"));
        let again = txn.commit().await.unwrap();
        let delivered = {
            let control = b.control(timing());
            b.handle_until_settled(&control, again.txn_id, timing().first_check_delay, |_| {})
                .await;
            b.drain(&events()).await
        };
        let read = b.store.get_items(std::slice::from_ref(&vacant)).await.unwrap();
        assert_eq!(read[&vacant].version, 3, "the create continued the version");
        let place = delivered[0].position.as_ref().expect("placed").place();
        assert_eq!(
            (place.seq, place.version, place.after),
            (2, 3, 1),
            "the chain continued"
        );
    }

    // In-order consumers' positions and a fence mark, as stored where messages named no
    // producer: they read and gate as they did, and a message that names its producer
    // continues its chain from them.
    if fixture["transactions"].get("fenced").is_some() {
        let producer = b.store.producer().expect("the table names itself");
        let unnamed = Position::from_attributes(&in_order_delivery(None, 2, "-").attributes)
            .unwrap()
            .unwrap();
        for entity_mode in [false, true] {
            let (consumer, by) = in_order_consumer(b, entity_mode);
            assert_eq!(seen(b, &by).await, json!([1, 2]), "{}", by.consumer);
            let held = match entity_mode {
                true => {
                    let read = b.store.get_keys(std::slice::from_ref(&by.key())).await.unwrap();
                    let name = outbox::consumer::in_order::applied_name(by.consumer, &unnamed);
                    assert_eq!(name, "compat-entity#events#COMPAT#E");
                    read[&by.key()].applied.get(&name).map(|held| (held.seq, held.version))
                }
                false => {
                    let item = outbox::consumer::in_order::position_key(by.consumer, &unnamed);
                    assert_eq!(item.as_str(), "IN#AT#compat-txn#events#COMPAT#E");
                    let items = b.store.get_items(std::slice::from_ref(&item)).await.unwrap();
                    items.get(&item).map(|item| {
                        (
                            item.data["applied"].as_u64().unwrap(),
                            item.data["version"].as_u64().unwrap(),
                        )
                    })
                }
            };
            assert_eq!(held, Some((2, 3)), "{}: the position as stored", by.consumer);
            // A copy of seq 2 under another id (its dedup data gone): a duplicate.
            let outcome = consumer.consume(&in_order_delivery(None, 2, "compat-copy:2")).await;
            assert!(
                matches!(outcome, Ok(ConsumeOutcome::Duplicate)),
                "{}: {outcome:?}",
                by.consumer
            );
            // Named seq 4 before named seq 3: kept; 3 continues the chain, then 4.
            let named = |seq: u64| in_order_delivery(Some(producer.as_str()), seq, &format!("compat-named:{seq}"));
            let outcome = consumer.consume(&named(4)).await;
            assert!(
                matches!(outcome, Ok(ConsumeOutcome::Kept { applied: 2, seq: 4 })),
                "{}: {outcome:?}",
                by.consumer
            );
            let outcome = consumer.consume(&named(3)).await;
            assert!(
                matches!(outcome, Ok(ConsumeOutcome::Processed { .. })),
                "{}: {outcome:?}",
                by.consumer
            );
            assert_eq!(seen(b, &by).await, json!([1, 2, 3, 4]), "{}", by.consumer);
        }
        // The fence mark still stops its transaction, and reads as its tombstone.
        let fenced = txn("fenced");
        let fenced_item = key("COMPAT#F");
        assert_eq!(
            outbox.status_in(fenced, &fenced_item).await.unwrap(),
            TxnStatus::Tombstoned
        );
        let read = b.store.get_items(std::slice::from_ref(&fenced_item)).await.unwrap();
        let now = b.clock.now();
        let late = outbox::ports::EntityCommit {
            key: fenced_item.clone(),
            data: json!({"n": 2}),
            expected: ExpectedVersion::Exactly(read[&fenced_item].version),
            entry: outbox::protocol::OutboxRecord::committed(fenced, vec![], now, now.plus(timing().retention))
                .by_attempt(TxnId::new_v7()),
            checks_fence: true,
            applied: None,
        };
        let refused = b.store.commit_entity(&late).await;
        assert!(
            matches!(refused, Err(outbox::ports::CommitError::EntityFenced { .. })),
            "{refused:?}"
        );
    }
}
