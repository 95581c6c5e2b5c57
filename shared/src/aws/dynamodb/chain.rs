//! The heads of an entity's chains ([`crate::protocol::Position`]) in its business item:
//! one top-level attribute per destination, `chain:<destination>`, a map
//! `{"seq": N, "version": N, "txn": S}` (`txn`: the transaction that sent the head's
//! message; absent in heads written before heads named it). Top-level, so that a commit sets one head with a plain
//! `SET`, on any item (a nested `SET #chain.#d` fails where the item has no map yet, as
//! every item written before the chains has not). Expressions always name them through
//! expression attribute names (`:` has no place in a path).
//!
//! A commit of K sets the heads that its messages positioned in K move, in the write of K
//! itself. It needs no condition of its own: every write of K is conditioned on K's
//! version, which the messages were stamped against, so the heads it replaces are the
//! ones the stamps counted on from. Nothing removes them: a delete (which vacates K) and
//! a fence keep them, and a create continues them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::aws::item::{n, Item, Reader};
use crate::aws::size::value_bytes;
use crate::ports::{ItemKey, StoreError};
use crate::protocol::{advance_chain, ChainHead, ChainHeads, DestinationName, OutgoingMessage};
use crate::settings::TableLayout;

/// The prefix of the attributes that hold an item's chain heads, one per destination.
pub(crate) const CHAIN_PREFIX: &str = "chain:";

/// The attribute that holds the head of the chain to `destination`.
fn attribute(destination: &DestinationName) -> String {
    format!("{CHAIN_PREFIX}{}", destination.as_str())
}

/// A head as stored.
fn head_value(head: ChainHead) -> AttributeValue {
    let mut fields = HashMap::from([("seq".to_owned(), n(head.seq)), ("version".to_owned(), n(head.version))]);
    if let Some(txn) = head.txn {
        fields.insert("txn".to_owned(), AttributeValue::S(txn.to_string()));
    }
    AttributeValue::M(fields)
}

/// The chain heads of an item as stored, read back (none on an item written before the
/// chains). A `chain:` attribute that cannot be read is the item's corruption.
pub(crate) fn heads_of(layout: &TableLayout, item: &Item) -> Result<ChainHeads, StoreError> {
    let reader = Reader::new(layout, item);
    item.iter()
        .filter_map(|(name, value)| {
            name.strip_prefix(CHAIN_PREFIX)
                .map(|destination| (name, destination, value))
        })
        .map(|(name, destination, value)| {
            let destination: DestinationName = destination
                .parse()
                .map_err(|_| reader.corrupt(format!("{name:?} names no destination")))?;
            let fields = map_of(&reader, name, value)?;
            let number = |field: &str| whole_number(&reader, name, fields, field);
            let txn = match fields.get("txn") {
                None => None,
                Some(value) => Some(
                    value
                        .as_s()
                        .ok()
                        .and_then(|text| text.parse().ok())
                        .ok_or_else(|| reader.corrupt(format!("{name:?} has a txn that is no transaction id")))?,
                ),
            };
            let head = ChainHead {
                seq: number("seq")?,
                version: number("version")?,
                txn,
            };
            Ok((destination, head))
        })
        .collect()
}

/// Map attribute `name` of the item `reader` reads, or the item's corruption.
pub(super) fn map_of<'v>(
    reader: &Reader<'_>,
    name: &str,
    value: &'v AttributeValue,
) -> Result<&'v HashMap<String, AttributeValue>, StoreError> {
    value
        .as_m()
        .map_err(|_| reader.corrupt(format!("{name:?} is not a map")))
}

/// Whole number `field` of map attribute `name` (`fields`), or the item's corruption.
pub(super) fn whole_number(
    reader: &Reader<'_>,
    name: &str,
    fields: &HashMap<String, AttributeValue>,
    field: &str,
) -> Result<u64, StoreError> {
    fields
        .get(field)
        .and_then(|value| value.as_n().ok())
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or_else(|| reader.corrupt(format!("{name:?} has no whole number {field}")))
}

/// The heads a commit of one item sets: those its messages positioned in the item move,
/// as `SET` clauses (`#chain0 = :chain0`, ...) with their names and values.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ChainSets {
    /// Each head's attribute and value, in the order of their placeholders.
    heads: Vec<(String, AttributeValue)>,
}

impl ChainSets {
    /// The heads that a commit of `key` sending `messages` moves
    /// ([`crate::protocol::advance_chain`]: per destination, the highest position in
    /// `key`'s history). Messages of another entity, or without a position, move none.
    pub(crate) fn new(key: &ItemKey, messages: &[OutgoingMessage]) -> Self {
        let mut moved = ChainHeads::new();
        advance_chain(&mut moved, key, messages);
        Self {
            heads: moved
                .into_iter()
                .map(|(destination, head)| (attribute(&destination), head_value(head)))
                .collect(),
        }
    }

    /// The clauses, each after `, `: to follow the other clauses of a `SET`.
    pub(crate) fn after_set(&self) -> String {
        (0..self.heads.len())
            .map(|index| format!(", #chain{index} = :chain{index}"))
            .collect()
    }

    /// The expression attribute names the clauses use.
    pub(crate) fn names(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.heads
            .iter()
            .enumerate()
            .map(|(index, (name, _))| (format!("#chain{index}"), name.clone()))
    }

    /// The expression attribute values the clauses use.
    pub(crate) fn values(&self) -> impl Iterator<Item = (String, AttributeValue)> + '_ {
        self.heads
            .iter()
            .enumerate()
            .map(|(index, (_, value))| (format!(":chain{index}"), value.clone()))
    }

    /// What the heads take in the item as stored: each attribute's name and value.
    pub(crate) fn stored_bytes(&self) -> usize {
        self.heads
            .iter()
            .map(|(name, value)| name.len() + value_bytes(value))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::item::s;
    use crate::protocol::{stamp_chain, Message, TxnId};
    use serde_json::json;

    fn emitted(destinations: &[&str]) -> Vec<OutgoingMessage> {
        let txn = TxnId::new_v7();
        destinations
            .iter()
            .enumerate()
            .map(|(index, destination)| {
                let message = Message::json(destination.parse().unwrap(), &json!({ "n": index })).unwrap();
                OutgoingMessage::new(txn, index as u32, message)
            })
            .collect()
    }

    fn txn_of_first(messages: &[OutgoingMessage]) -> TxnId {
        messages[0].id.as_str().rsplit_once(':').unwrap().0.parse().unwrap()
    }

    /// The heads a commit sets are the highest position per destination in its item's
    /// history; other entities' messages set none; what it sets reads back.
    #[test]
    fn a_commit_sets_the_heads_its_messages_move_and_they_read_back() {
        let layout = TableLayout::dedicated("t");
        let order: ItemKey = "ORDER#1".parse().unwrap();
        let other: ItemKey = "ORDER#2".parse().unwrap();
        let read = ChainHeads::from([
            (
                "events".parse().unwrap(),
                ChainHead {
                    seq: 3,
                    version: 5,
                    txn: None,
                },
            ),
            (
                "bus".parse().unwrap(),
                ChainHead {
                    seq: 2,
                    version: 4,
                    txn: Some(TxnId::new_v7()),
                },
            ),
        ]);
        let mut messages = emitted(&["events", "audit", "events"]);
        let after = stamp_chain(&mut messages, &order, 7, &read);
        let sets = ChainSets::new(&order, &messages);
        assert_eq!(sets.after_set(), ", #chain0 = :chain0, #chain1 = :chain1");
        assert_eq!(ChainSets::new(&other, &messages), ChainSets::default());
        assert_eq!(ChainSets::default().after_set(), "");

        // As DynamoDB would store them over the heads read: the bus head is kept.
        let mut item = layout.key(order.as_str());
        item.insert("version".into(), n(7));
        item.insert("chain:bus".into(), head_value(read[&"bus".parse().unwrap()]));
        let values: HashMap<String, AttributeValue> = sets.values().collect();
        for (placeholder, name) in sets.names() {
            item.insert(name, values[&placeholder.replace('#', ":")].clone());
        }
        let heads = heads_of(&layout, &item).unwrap();
        assert_eq!(heads, after, "the heads stored are the ones the stamps end at");
        assert_eq!(
            heads[&"events".parse().unwrap()],
            ChainHead {
                seq: 5,
                version: 7,
                txn: Some(txn_of_first(&messages))
            }
        );
        // Each head: its name, the map's 3 bytes, per field its name, 1 byte and its value
        // (a number of one digit: 2 bytes; the transaction id: 36).
        let head_bytes = 3 + (3 + 1 + 2) + (7 + 1 + 2) + (3 + 1 + 36);
        assert_eq!(
            sets.stored_bytes(),
            ("chain:audit".len() + head_bytes) + ("chain:events".len() + head_bytes)
        );
    }

    #[test]
    fn an_item_without_chains_has_no_heads_and_a_malformed_head_is_corrupt() {
        let layout = TableLayout::dedicated("t");
        let item = |attributes: &[(&str, AttributeValue)]| -> Item {
            let mut item = layout.key("ORDER#1");
            item.extend(attributes.iter().map(|(name, value)| (name.to_string(), value.clone())));
            item
        };
        let old = item(&[("version", n(3)), ("data", AttributeValue::M(HashMap::new()))]);
        assert_eq!(heads_of(&layout, &old).unwrap(), ChainHeads::new());
        let head = |fields: &[(&str, AttributeValue)]| {
            AttributeValue::M(fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
        };
        for bad in [
            item(&[("chain:events", s("seq=1"))]),
            item(&[("chain:events", head(&[("seq", n(1))]))]),
            item(&[("chain:events", head(&[("seq", s("1")), ("version", n(2))]))]),
            item(&[("chain:events", head(&[("seq", n(-1)), ("version", n(2))]))]),
            item(&[("chain:no room", head(&[("seq", n(1)), ("version", n(2))]))]),
            item(&[("chain:", head(&[("seq", n(1)), ("version", n(2))]))]),
        ] {
            match heads_of(&layout, &bad) {
                Err(StoreError::Corrupt { key, reason }) => {
                    assert_eq!(key, "ORDER#1");
                    assert!(reason.contains("chain:"), "{reason}");
                }
                other => panic!("{bad:?} read as {other:?}"),
            }
        }
    }
}
