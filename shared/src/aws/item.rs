//! How records are laid out as DynamoDB items, and JSON to `AttributeValue` and back.
//!
//! Each record is keyed by its logical key as the [`TableLayout`] says (partition key
//! `pk` and TTL attribute `expires_at` by default, in unix seconds):
//!
//! | item | logical key | other attributes |
//! |---|---|---|
//! | business item (portable form) | the application's key | `version` (N), `data` (M, the JSON object; only while the item is live), `chain:<destination>` (M, `seq` and `version`: the head of the entity's chain to each destination, kept across a delete) |
//! | outbox record | `TXN#{txn_id}` | `txn_id`, `state`, `created_at` (N, unix ms), `messages` (S, JSON array), `parts` (N, when split), TTL |
//! | outbox part | `TXN#{txn_id}#PART#{n}` | `messages` (S, JSON array), TTL (an orphan guard) |
//! | idempotency record | `IDEM#{scope}#{sha256(key)}` | `scope`, `key_hash`, `fingerprint`, `txn_id`, `status`, `headers` (S, JSON), `body`, `created_at`, TTL |
//!
//! A business item is live while it has `data`. A delete removes `data` and keeps the key
//! vacant at the next `version` (with its fence mark), so that a create continues the
//! versions instead of restarting them; a vacant item written before versions were kept
//! has no `version` and is at version 0.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Map, Number, Value};

use crate::aws::dynamodb::applied::applied_of;
use crate::aws::dynamodb::chain::heads_of;
use crate::aws::dynamodb::entity_attributes::entries_of;
use crate::ports::{ItemKey, KeyRead, StoreError, VersionedItem};
use crate::protocol::{
    IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, OutgoingMessage, StoredResponse, TxnId,
};
use crate::settings::TableLayout;
use crate::time::Timestamp;

/// An item as the SDK holds it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Message bytes (as JSON) per outbox item: DynamoDB's 400 KB item limit, less room for
/// the other attributes.
pub const PART_BYTES: usize = 350_000;

pub(crate) fn outbox_pk(txn_id: TxnId) -> String {
    txn_id.record_key()
}

pub(crate) fn part_pk(txn_id: TxnId, part: usize) -> String {
    format!("{}#PART#{part}", txn_id.record_key())
}

pub(crate) fn idempotency_pk(slot: &IdempotencySlot) -> String {
    format!("IDEM#{slot}")
}

pub(crate) fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

pub(crate) fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// TTL seconds for an expiry instant, rounded up so that an item never expires early.
pub(crate) fn ttl_seconds(at: Timestamp) -> u64 {
    at.as_millis().div_ceil(1000)
}

/// JSON to an attribute value. Numbers keep their exact text.
pub fn to_attribute(value: &Value) -> AttributeValue {
    match value {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(flag) => AttributeValue::Bool(*flag),
        Value::Number(number) => AttributeValue::N(number.to_string()),
        Value::String(text) => AttributeValue::S(text.clone()),
        Value::Array(values) => AttributeValue::L(values.iter().map(to_attribute).collect()),
        Value::Object(fields) => AttributeValue::M(fields.iter().map(|(k, v)| (k.clone(), to_attribute(v))).collect()),
    }
}

/// An attribute value back to JSON; types JSON cannot hold (binary, sets) are errors.
pub fn from_attribute(value: &AttributeValue) -> Result<Value, String> {
    Ok(match value {
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::Bool(flag) => Value::Bool(*flag),
        AttributeValue::N(text) => Value::Number(parse_number(text)?),
        AttributeValue::S(text) => Value::String(text.clone()),
        AttributeValue::L(values) => Value::Array(values.iter().map(from_attribute).collect::<Result<_, _>>()?),
        AttributeValue::M(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), from_attribute(v)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
        other => return Err(format!("attribute type {other:?} has no JSON form")),
    })
}

fn parse_number(text: &str) -> Result<Number, String> {
    if let Ok(unsigned) = text.parse::<u64>() {
        return Ok(unsigned.into());
    }
    if let Ok(signed) = text.parse::<i64>() {
        return Ok(signed.into());
    }
    text.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(|| format!("number {text:?} does not fit JSON"))
}

/// Reads the attributes of one item, naming its logical key in every error.
pub(crate) struct Reader<'a> {
    layout: &'a TableLayout,
    item: &'a Item,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(layout: &'a TableLayout, item: &'a Item) -> Self {
        Self { layout, item }
    }

    pub(crate) fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            key: self.layout.logical_key(self.item).unwrap_or_default().to_owned(),
            reason: reason.into(),
        }
    }

    fn text(&self, name: &str) -> Result<&'a str, StoreError> {
        self.item
            .get(name)
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
            .ok_or_else(|| self.corrupt(format!("no string {name}")))
    }

    fn number(&self, name: &str) -> Result<u64, StoreError> {
        self.item
            .get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.corrupt(format!("no whole number {name}")))
    }

    fn optional_number(&self, name: &str) -> Result<Option<u64>, StoreError> {
        if self.item.contains_key(name) {
            self.number(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The item's expiry, if it has one.
    pub(crate) fn expires_at(&self) -> Result<Option<Timestamp>, StoreError> {
        Ok(self
            .optional_number(&self.layout.ttl_attribute)?
            .map(|seconds| Timestamp::from_millis(seconds.saturating_mul(1000))))
    }

    /// Whether the item's TTL has passed at `now` (DynamoDB deletes it only eventually).
    pub(crate) fn is_expired(&self, now: Timestamp) -> Result<bool, StoreError> {
        Ok(self.expires_at()?.is_some_and(|at| at <= now))
    }

    /// A business item's version, if it has a readable one.
    pub(crate) fn version(&self) -> Option<u64> {
        self.number("version").ok()
    }

    /// How many parts beyond the main item an outbox item says it has.
    pub(crate) fn part_count(&self) -> Result<usize, StoreError> {
        Ok(self
            .optional_number("parts")?
            .map_or(0, |parts| parts.saturating_sub(1) as usize))
    }
}

/// A business item as read; `None` for a vacant key (no data: a deleted item, or one
/// never created, that keeps only its version and fence mark), which reads as absent.
pub(crate) fn business_from_item(
    layout: &TableLayout,
    key: &ItemKey,
    item: &Item,
) -> Result<Option<VersionedItem>, StoreError> {
    let Some(data) = item.get("data") else {
        return Ok(None);
    };
    let reader = Reader::new(layout, item);
    Ok(Some(VersionedItem {
        key: key.clone(),
        version: reader.number("version")?,
        data: from_attribute(data).map_err(|reason| reader.corrupt(reason))?,
    }))
}

/// A key as read, live or vacant: its item where it has `data`, with the outbox entries
/// it holds (entity mode), its version (a vacant item written before versions were kept
/// across deletes has none: version 0), and its chain heads (`chain:<destination>`; an
/// item written before the chains has none). A vacant item holds no entries.
pub(crate) fn key_from_item(layout: &TableLayout, key: &ItemKey, item: &Item) -> Result<KeyRead, StoreError> {
    let heads = heads_of(layout, item)?;
    match business_from_item(layout, key, item)? {
        Some(live) => Ok(KeyRead {
            version: live.version,
            item: Some(live),
            heads,
            entries: entries_of(layout, item)?,
            applied: applied_of(layout, item)?,
        }),
        None => Ok(KeyRead {
            item: None,
            version: Reader::new(layout, item).optional_number("version")?.unwrap_or(0),
            heads,
            entries: BTreeMap::new(),
            applied: applied_of(layout, item)?,
        }),
    }
}

/// The messages of a record cut into the groups that go in one item each. Deterministic,
/// so that the marking code finds the parts the commit wrote. A message larger than an
/// item can hold (`part_bytes`, [`PART_BYTES`] but in tests) is an error.
pub(crate) fn split_messages(messages: &[OutgoingMessage], part_bytes: usize) -> Result<Vec<String>, String> {
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    let mut bytes = 0;
    for message in messages {
        let json = serde_json::to_string(message).map_err(|error| error.to_string())?;
        if json.len() > part_bytes {
            return Err(format!(
                "message {} is {} bytes; one item holds {part_bytes}",
                message.id,
                json.len()
            ));
        }
        if bytes + json.len() + 1 > part_bytes {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += json.len() + 1;
        groups.last_mut().expect("never empty").push(json);
    }
    Ok(groups
        .into_iter()
        .map(|group| format!("[{}]", group.join(",")))
        .collect())
}

/// The items of an outbox record: the record itself and, when its messages do not fit
/// one item (`part_bytes` of them), its parts.
pub(crate) fn outbox_items(
    layout: &TableLayout,
    record: &OutboxRecord,
    part_expiry: Timestamp,
    part_bytes: usize,
) -> Result<Vec<Item>, String> {
    let groups = split_messages(&record.messages, part_bytes)?;
    let mut main = layout.item(
        &outbox_pk(record.txn_id),
        [
            ("txn_id".to_owned(), s(record.txn_id.to_string())),
            ("state".to_owned(), s(record.state.as_str())),
            ("created_at".to_owned(), n(record.created_at.as_millis())),
            ("messages".to_owned(), s(groups[0].clone())),
        ],
    );
    if let Some(at) = record.expires_at {
        main.insert(layout.ttl_attribute.clone(), n(ttl_seconds(at)));
    }
    if let Some(attempt) = record.attempt {
        main.insert("attempt".into(), s(attempt.to_string()));
    }
    if groups.len() > 1 {
        main.insert("parts".into(), n(groups.len()));
    }
    let mut items = vec![main];
    for (index, group) in groups.into_iter().enumerate().skip(1) {
        items.push(layout.item(
            &part_pk(record.txn_id, index),
            [
                ("messages".to_owned(), s(group)),
                (layout.ttl_attribute.clone(), n(ttl_seconds(part_expiry))),
            ],
        ));
    }
    Ok(items)
}

/// The main item of a record marked dispatched: its messages dropped, its TTL set.
pub(crate) fn dispatched_item(layout: &TableLayout, record: &OutboxRecord, expires_at: Timestamp) -> Item {
    let mut item = layout.item(
        &outbox_pk(record.txn_id),
        [
            ("txn_id".to_owned(), s(record.txn_id.to_string())),
            ("state".to_owned(), s(OutboxState::Dispatched.as_str())),
            ("created_at".to_owned(), n(record.created_at.as_millis())),
            (layout.ttl_attribute.clone(), n(ttl_seconds(expires_at))),
        ],
    );
    if let Some(attempt) = record.attempt {
        item.insert("attempt".into(), s(attempt.to_string()));
    }
    item
}

/// An outbox record from its main item and its parts, in order.
pub(crate) fn outbox_from_items(
    layout: &TableLayout,
    main: &Item,
    parts: &[&Item],
) -> Result<OutboxRecord, StoreError> {
    let reader = Reader::new(layout, main);
    // A main item read without its parts (from a cancellation reason, or `ALL_OLD`) is not
    // the record: taken as one, it would lose every message beyond the first part.
    if reader.part_count()? != parts.len() {
        return Err(reader.corrupt(format!(
            "a split record read with {} of its {} parts",
            parts.len(),
            reader.part_count()?
        )));
    }
    let txn_id: TxnId = reader
        .text("txn_id")?
        .parse()
        .map_err(|_| reader.corrupt("bad txn_id"))?;
    let state = match reader.text("state")? {
        "pending" => OutboxState::Pending,
        "dispatched" => OutboxState::Dispatched,
        "tombstone" => OutboxState::Tombstone,
        other => return Err(reader.corrupt(format!("unknown state {other:?}"))),
    };
    let mut messages = Vec::new();
    for item in std::iter::once(main).chain(parts.iter().copied()) {
        let json = item
            .get("messages")
            .and_then(|v| v.as_s().ok())
            .map_or("[]", String::as_str);
        let group: Vec<OutgoingMessage> =
            serde_json::from_str(json).map_err(|error| Reader::new(layout, item).corrupt(error.to_string()))?;
        messages.extend(group);
    }
    Ok(OutboxRecord {
        txn_id,
        state,
        messages,
        created_at: Timestamp::from_millis(reader.number("created_at")?),
        expires_at: reader.expires_at()?,
        attempt: attempt_of(main).map_err(|()| reader.corrupt("bad attempt"))?,
    })
}

/// The `attempt` of a record's main item, if it names one.
pub(crate) fn attempt_of(main: &Item) -> Result<Option<TxnId>, ()> {
    main.get("attempt")
        .map(|value| value.as_s().map_err(|_| ())?.parse().map_err(|_| ()))
        .transpose()
}

pub(crate) fn idempotency_item(layout: &TableLayout, record: &IdempotencyRecord) -> Item {
    let headers = serde_json::to_string(&record.response.headers).expect("string pairs serialise");
    layout.item(
        &idempotency_pk(&record.slot),
        [
            ("scope".to_owned(), s(record.slot.scope.clone())),
            ("key_hash".to_owned(), s(record.slot.key_hash.clone())),
            ("fingerprint".to_owned(), s(record.fingerprint.clone())),
            ("txn_id".to_owned(), s(record.txn_id.to_string())),
            ("status".to_owned(), n(record.response.status)),
            ("headers".to_owned(), s(headers)),
            ("body".to_owned(), s(record.response.body.clone())),
            ("created_at".to_owned(), n(record.created_at.as_millis())),
            (layout.ttl_attribute.clone(), n(ttl_seconds(record.expires_at))),
        ],
    )
}

pub(crate) fn idempotency_from_item(layout: &TableLayout, item: &Item) -> Result<IdempotencyRecord, StoreError> {
    let reader = Reader::new(layout, item);
    let headers: Vec<(String, String)> =
        serde_json::from_str(reader.text("headers")?).map_err(|error| reader.corrupt(error.to_string()))?;
    Ok(IdempotencyRecord {
        slot: IdempotencySlot {
            scope: reader.text("scope")?.to_owned(),
            key_hash: reader.text("key_hash")?.to_owned(),
        },
        fingerprint: reader.text("fingerprint")?.to_owned(),
        txn_id: reader
            .text("txn_id")?
            .parse()
            .map_err(|_| reader.corrupt("bad txn_id"))?,
        response: StoredResponse {
            status: u16::try_from(reader.number("status")?).map_err(|_| reader.corrupt("bad status"))?,
            headers,
            body: reader.text("body")?.to_owned(),
        },
        created_at: Timestamp::from_millis(reader.number("created_at")?),
        expires_at: reader.expires_at()?.ok_or_else(|| reader.corrupt("no TTL"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ChainHead, ChainHeads, DestinationName, Message};
    use serde_json::json;

    #[test]
    fn json_round_trips_through_attribute_values() {
        let value = json!({"a": [1, -2, 3.5, "x", null, true], "b": {"c": 18446744073709551615u64}, "d": ""});
        assert_eq!(from_attribute(&to_attribute(&value)).unwrap(), value);
    }

    #[test]
    fn records_round_trip_through_items_split_or_not() {
        let txn = TxnId::from_parts(Timestamp::from_millis(1_000), [1; 10]);
        let big = "x".repeat(100_000);
        let messages: Vec<OutgoingMessage> = (0..9)
            .map(|i| OutgoingMessage::new(txn, i, Message::json("events".parse().unwrap(), &big).unwrap()))
            .collect();
        let record = OutboxRecord::committed(
            txn,
            messages,
            Timestamp::from_millis(5_000),
            Timestamp::from_millis(9_000),
        );
        let layout = TableLayout::dedicated("t");
        let items = outbox_items(&layout, &record, Timestamp::from_millis(99_000), PART_BYTES).unwrap();
        assert_eq!(items.len(), 3, "9 messages of 100 kB take three items of 350 kB");
        assert_eq!(Reader::new(&layout, &items[0]).part_count().unwrap(), 2);
        let parts: Vec<&Item> = items[1..].iter().collect();
        assert_eq!(outbox_from_items(&layout, &items[0], &parts).unwrap(), record);
        assert!(
            outbox_from_items(&layout, &items[0], &parts[..1]).is_err(),
            "a main item without all of its parts is not the record"
        );

        let small = OutboxRecord::committed(
            txn,
            vec![],
            Timestamp::from_millis(5_000),
            Timestamp::from_millis(9_500),
        );
        let items = outbox_items(&layout, &small, Timestamp::from_millis(99_000), PART_BYTES).unwrap();
        assert_eq!(items.len(), 1);
        let back = outbox_from_items(&layout, &items[0], &[]).unwrap();
        assert_eq!(
            back.expires_at,
            Some(Timestamp::from_millis(10_000)),
            "TTL seconds round up"
        );
    }

    #[test]
    fn a_message_larger_than_an_item_is_refused() {
        let txn = TxnId::from_parts(Timestamp::from_millis(1_000), [1; 10]);
        let huge = OutgoingMessage::new(
            txn,
            0,
            Message::json("events".parse().unwrap(), &"x".repeat(PART_BYTES)).unwrap(),
        );
        assert!(split_messages(&[huge], PART_BYTES).is_err());
    }

    /// An item is live while it has data; a vacant one keeps its version, or is at 0 when
    /// written before versions were kept across deletes.
    #[test]
    fn a_key_is_live_while_its_item_has_data() {
        let layout = TableLayout::dedicated("t");
        let key: ItemKey = "ORDER#1".parse().unwrap();
        let item = |attributes: &[(&str, AttributeValue)]| -> Item {
            let mut item = layout.key(key.as_str());
            item.extend(attributes.iter().map(|(name, value)| (name.to_string(), value.clone())));
            item
        };
        let data = to_attribute(&json!({"n": 1}));
        let live = item(&[("version", n(3)), ("data", data.clone())]);
        let read = key_from_item(&layout, &key, &live).unwrap();
        assert_eq!(
            (read.item.map(|item| item.data), read.version),
            (Some(json!({"n": 1})), 3)
        );
        let vacant = item(&[("version", n(4)), ("outbox_fence", s("x"))]);
        assert_eq!(business_from_item(&layout, &key, &vacant).unwrap(), None);
        let read = key_from_item(&layout, &key, &vacant).unwrap();
        assert_eq!((read.item, read.version), (None, 4));
        let vacant_of_old = item(&[("outbox_fence", s("x"))]);
        assert_eq!(key_from_item(&layout, &key, &vacant_of_old).unwrap().version, 0);
        assert!(business_from_item(&layout, &key, &item(&[("data", data)])).is_err());
        assert!(key_from_item(&layout, &key, &item(&[("version", s("x"))])).is_err());
    }

    /// A key reads with its chain heads, live or vacant (none where it was written before
    /// the chains), and a live item with its outbox entries as the entity mode reads them.
    #[test]
    fn a_key_reads_with_its_heads_and_its_entries() {
        let layout = TableLayout::dedicated("t");
        let key: ItemKey = "ORDER#1".parse().unwrap();
        let item = |attributes: Vec<(&str, AttributeValue)>| -> Item {
            let mut item = layout.key(key.as_str());
            item.extend(attributes.into_iter().map(|(name, value)| (name.to_string(), value)));
            item
        };
        let head = AttributeValue::M(HashMap::from([("seq".to_owned(), n(2)), ("version".to_owned(), n(5))]));
        let txn = TxnId::from_parts(Timestamp::from_millis(1_000), [1; 10]);
        let entry = OutboxRecord::committed(
            txn,
            vec![],
            Timestamp::from_millis(1_000),
            Timestamp::from_millis(9_000),
        );
        let entries = AttributeValue::M(HashMap::from([(
            txn.to_string(),
            s(serde_json::to_string(&entry).unwrap()),
        )]));
        let live = item(vec![
            ("version", n(5)),
            ("data", to_attribute(&json!({}))),
            ("chain:events", head.clone()),
            ("outbox", entries),
        ]);
        let read = key_from_item(&layout, &key, &live).unwrap();
        let events: DestinationName = "events".parse().unwrap();
        assert_eq!(
            read.heads,
            ChainHeads::from([(
                events,
                ChainHead {
                    seq: 2,
                    version: 5,
                    txn: None
                }
            )])
        );
        assert_eq!(read.entries, BTreeMap::from([(txn, entry)]));
        let vacant = item(vec![("version", n(6)), ("chain:events", head)]);
        let read = key_from_item(&layout, &key, &vacant).unwrap();
        assert_eq!((read.item, read.version, read.heads.len()), (None, 6, 1));
        assert!(read.entries.is_empty());
        let old = item(vec![("version", n(5)), ("data", to_attribute(&json!({})))]);
        let read = key_from_item(&layout, &key, &old).unwrap();
        assert!(read.heads.is_empty() && read.entries.is_empty());
        assert!(matches!(
            key_from_item(&layout, &key, &item(vec![("version", n(6)), ("chain:events", n(1))])),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            key_from_item(
                &layout,
                &key,
                &item(vec![
                    ("version", n(5)),
                    ("data", to_attribute(&json!({}))),
                    ("outbox", s("x"))
                ])
            ),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
