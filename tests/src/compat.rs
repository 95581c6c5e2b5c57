//! What earlier versions stored, read by the code of today: the compatibility policy for
//! stored items, held by fixtures. `tests/fixtures/stored-0.1.json` holds every kind of
//! item version 0.1 writes on DynamoDB (a record pending, dispatched and tombstoned, an
//! entry in an item and a sent mark, an idempotency record) as the table held them, with
//! the control messages it sent; `stored-0.2.json` adds what 0.2 stores besides (a vacant
//! item keeping its version, an entity's chain heads, messages placed in their entity's
//! history). [`check`] loads one into a fresh table and reads it through the store, the
//! status reads and the control path.
//!
//! The fixture is written once per release that changes what is stored, by [`write`]
//! (`OUTBOX_WRITE_FIXTURE=1` on the test), and a release keeps reading the fixtures of
//! every earlier one.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use outbox::control::ControlOutcome;
use outbox::ports::{Clock, ControlDelivery, ExpectedVersion, ItemKey};
use outbox::protocol::{IdempotencyKey, IdempotencySlot, Message, StoredResponse, TxnId};
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
}
