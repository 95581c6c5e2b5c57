//! A message's place in the history of the entity its transaction changed, per
//! destination: the chain an in-order consumer applies by.
//!
//! An entity K keeps, per destination, the head of its chain: the last message it sent
//! there (its `seq`) and K's version after the transaction that sent it. A transaction
//! that changes K alone, reading K at version `v`, stamps its messages from the heads as
//! read: to each destination, `seq` counts on from the head's with no gap (in the order
//! the transaction emitted them), `version` is `v + 1`, and `after` is the head's version.
//! Its commit is conditioned on K's version `v` and moves the heads in the same write, so
//! that two transactions on K can never stamp from the same heads: the chain follows
//! K's commit order, with no gap and no fork, across deletes and re-creates (a key's
//! version and heads outlive its item).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::item_key::ItemKey;
use super::message::{DestinationName, MessageId, OutgoingMessage};
use super::txn_id::TxnId;

/// The message attribute that names the entity whose history a message has its place in.
pub const ENTITY_ATTRIBUTE: &str = "outbox-entity";
/// The message attribute that carries a message's place in its entity's history, on the
/// chain of the destination it was sent to, and the table whose chain it is:
/// `producer=orders;chain=events;seq=12;version=5;after=3` ([`Position`]). A position
/// that names no producer reads `chain=events;seq=12;version=5;after=3`.
pub const POSITION_ATTRIBUTE: &str = "outbox-position";

/// Who keeps a chain: the table its entities' chain heads live in (a DynamoDB table's
/// name; the embedded store's own name). Two producers' chains are two chains, whatever
/// their destination and their entities' keys: 1 to 255 characters of `A-Z`, `a-z`,
/// `0-9`, `_`, `.` and `-`, as every DynamoDB table name is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Producer(String);

/// A producer's name that is not one ([`Producer`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a producer is 1 to 255 characters of A-Z, a-z, 0-9, '_', '.' and '-', not {input:?}")]
pub struct InvalidProducer {
    input: String,
}

impl Producer {
    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The producer of the DynamoDB table `table`, named by its name or by its ARN
    /// (`arn:...:table/NAME`): its name.
    pub fn of_table(table: &str) -> Result<Self, InvalidProducer> {
        let name = match table.strip_prefix("arn:") {
            Some(arn) => arn.rsplit_once(":table/").map_or(table, |(_, name)| name),
            None => table,
        };
        name.parse()
    }
}

impl fmt::Display for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Producer {
    type Err = InvalidProducer;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let valid = (1..=255).contains(&input.len())
            && input
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if valid {
            Ok(Self(input.to_owned()))
        } else {
            Err(InvalidProducer {
                input: input.chars().take(80).collect(),
            })
        }
    }
}

impl TryFrom<String> for Producer {
    type Error = InvalidProducer;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<Producer> for String {
    fn from(producer: Producer) -> Self {
        producer.0
    }
}

/// Where a message stands in the history of its entity, on its destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The table whose chain it is: the one its entity's chain heads live in, named by
    /// whoever stamped the message ([`crate::ports::Store::producer`]). `None` in a
    /// position stamped by a store that names none (and by versions before producers were
    /// named): such a chain is told from another only by its destination and its entity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<Producer>,
    /// The entity the transaction changed.
    pub entity: ItemKey,
    /// The destination it was sent to, whose chain it is in: the entity's messages to
    /// each destination form a chain of their own.
    pub chain: DestinationName,
    /// Its place among the messages the entity sent to this destination: 1, 2, 3, ...
    /// with no gap, in commit order, and within a transaction in the order emitted.
    pub seq: u64,
    /// The entity's version after the transaction that emitted it: its place in the
    /// entity's history.
    pub version: u64,
    /// The entity's version after its previous transaction that sent to this destination
    /// (0: none did).
    pub after: u64,
    /// That previous transaction, where the heads it was stamped from name it: what a
    /// publisher that keeps order sends first if it is still unsent. Kept in the
    /// transaction's record, not sent with the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<TxnId>,
}

/// The last message an entity sent to one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChainHead {
    /// The [`Position::seq`] of that message.
    pub seq: u64,
    /// The entity's version after the transaction that sent it.
    pub version: u64,
    /// The transaction that sent it (none in heads written before heads named it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<TxnId>,
}

/// An entity's chain heads, by destination.
pub type ChainHeads = BTreeMap<DestinationName, ChainHead>;

/// The last message of one chain an in-order consumer applied: its [`Position::seq`] and
/// [`Position::version`]. In entity mode the consumer keeps it in its own entity's key,
/// which keeps it across the entity's lives, as it keeps the chain heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Applied {
    /// The `seq` of that message.
    pub seq: u64,
    /// The version of its entity after the transaction that sent it.
    pub version: u64,
    /// The consumer's transaction that applied it (its effect), where kept (positions
    /// stored before it was kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<TxnId>,
}

/// The positions a key keeps for in-order consumers, by name (the consumer, the chain
/// and the source entity, as the consumer names them).
pub type AppliedPositions = BTreeMap<String, Applied>;

/// What the entity attribute escapes of an entity's key: `%` itself, and the control
/// characters SQS refuses in an attribute (all but tab, line feed and carriage return);
/// every character beyond ASCII is escaped too (SQS refuses some, such as U+FFFF).
const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .remove(b'\t')
    .remove(b'\n')
    .remove(b'\r')
    .add(b'%');

/// A [`POSITION_ATTRIBUTE`] value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a position reads [producer=NAME;]chain=NAME;seq=N;version=N;after=N, not {input:?}")]
pub struct InvalidPosition {
    input: String,
}

/// A position's numbers as its attribute carries them, without the entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// [`Position::seq`].
    pub seq: u64,
    /// [`Position::version`].
    pub version: u64,
    /// [`Position::after`].
    pub after: u64,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq={};version={};after={}", self.seq, self.version, self.after)
    }
}

impl FromStr for Place {
    type Err = InvalidPosition;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidPosition {
            input: input.chars().take(80).collect(),
        };
        let mut fields = input.split(';').map(|field| field.split_once('='));
        let mut number = |name: &str| match fields.next() {
            Some(Some((found, value))) if found == name => value.parse::<u64>().map_err(|_| invalid()),
            _ => Err(invalid()),
        };
        let place = Self {
            seq: number("seq")?,
            version: number("version")?,
            after: number("after")?,
        };
        if fields.next().is_some() || place.seq == 0 || place.after >= place.version {
            return Err(invalid());
        }
        Ok(place)
    }
}

impl Position {
    /// Its numbers, as [`POSITION_ATTRIBUTE`] carries them.
    pub fn place(&self) -> Place {
        Place {
            seq: self.seq,
            version: self.version,
            after: self.after,
        }
    }

    /// The two attributes every send of a positioned message carries. The entity's key
    /// is percent-escaped where a message attribute could not carry it as it is (`%`,
    /// control characters, anything beyond ASCII); [`Self::from_attributes`] reads it
    /// back.
    pub fn attributes(&self) -> [(&'static str, String); 2] {
        [
            (
                ENTITY_ATTRIBUTE,
                percent_encoding::utf8_percent_encode(self.entity.as_str(), ESCAPED).to_string(),
            ),
            (
                POSITION_ATTRIBUTE,
                match &self.producer {
                    Some(producer) => format!("producer={producer};chain={};{}", self.chain, self.place()),
                    None => format!("chain={};{}", self.chain, self.place()),
                },
            ),
        ]
    }

    /// The same place on the chain as a position that names no producer reads it: the
    /// chain an in-order consumer kept for it before its producer named itself.
    pub fn unnamed(&self) -> Self {
        Self {
            producer: None,
            ..self.clone()
        }
    }

    /// The position `attributes` carry, if they carry one: `None` without either
    /// attribute, an error where they are there but cannot be read.
    pub fn from_attributes(attributes: &BTreeMap<String, String>) -> Result<Option<Self>, InvalidPosition> {
        let (Some(entity), Some(place)) = (attributes.get(ENTITY_ATTRIBUTE), attributes.get(POSITION_ATTRIBUTE)) else {
            return Ok(None);
        };
        let invalid = |input: &str| InvalidPosition {
            input: input.chars().take(80).collect(),
        };
        let (producer, named) = match place.strip_prefix("producer=") {
            Some(rest) => {
                let (producer, rest) = rest.split_once(';').ok_or_else(|| invalid(place))?;
                (Some(producer.parse().map_err(|_| invalid(place))?), rest)
            }
            None => (None, place.as_str()),
        };
        let (chain, numbers) = named
            .strip_prefix("chain=")
            .and_then(|rest| rest.split_once(';'))
            .ok_or_else(|| invalid(place))?;
        let chain = chain.parse().map_err(|_| invalid(place))?;
        let place: Place = numbers.parse()?;
        let entity = percent_encoding::percent_decode_str(entity)
            .decode_utf8()
            .map_err(|_| invalid(entity))?
            .parse()
            .map_err(|_| invalid(entity))?;
        Ok(Some(Self {
            producer,
            entity,
            chain,
            seq: place.seq,
            version: place.version,
            after: place.after,
            previous: None,
        }))
    }
}

/// The transaction whose message `id` is (`{txn_id}:{index}`).
fn txn_of(id: &MessageId) -> Option<TxnId> {
    id.as_str().rsplit_once(':').and_then(|(txn, _)| txn.parse().ok())
}

/// Stamps the messages of a transaction that takes `entity` from the `heads` read to
/// version `version`, in the order emitted, and returns the heads after them; the
/// positions name no producer ([`stamp_named`] names one).
pub fn stamp(messages: &mut [OutgoingMessage], entity: &ItemKey, version: u64, heads: &ChainHeads) -> ChainHeads {
    stamp_named(messages, entity, version, heads, None)
}

/// [`stamp`], the positions naming `producer`: the table `entity`'s heads live in.
pub fn stamp_named(
    messages: &mut [OutgoingMessage],
    entity: &ItemKey,
    version: u64,
    heads: &ChainHeads,
    producer: Option<&Producer>,
) -> ChainHeads {
    let mut after = heads.clone();
    for message in messages.iter_mut() {
        let head = heads.get(&message.destination).copied().unwrap_or_default();
        let next = after.entry(message.destination.clone()).or_default();
        next.seq += 1;
        next.version = version;
        next.txn = txn_of(&message.id);
        message.position = Some(Position {
            producer: producer.cloned(),
            entity: entity.clone(),
            chain: message.destination.clone(),
            seq: next.seq,
            version,
            after: head.version,
            previous: head.txn,
        });
    }
    after
}

/// `heads` moved past the messages of a transaction positioned in `entity`'s history
/// (what its commit writes into the entity; messages of another entity, or none, leave
/// them as they are). Each destination's head is *set* to the highest position the
/// commit's messages take in it, whatever the head held, as DynamoDB's `SET` of the
/// head's attribute does: both stores write the same heads for the same commit. The
/// commit's condition on the version its messages were stamped against is what keeps
/// the chain whole; a head is never compared here.
pub fn advance(heads: &mut ChainHeads, entity: &ItemKey, messages: &[OutgoingMessage]) {
    let mut moved = ChainHeads::new();
    for message in messages {
        if let Some(position) = message.position.as_ref().filter(|position| &position.entity == entity) {
            let head = moved.entry(message.destination.clone()).or_default();
            if position.seq > head.seq {
                *head = ChainHead {
                    seq: position.seq,
                    version: position.version,
                    txn: txn_of(&message.id),
                };
            }
        }
    }
    heads.extend(moved);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
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

    #[test]
    fn a_chain_counts_on_per_destination_and_points_at_the_last_sender() {
        let order: ItemKey = "ORDER#1".parse().unwrap();
        let mut first = emitted(&["events", "audit", "events"]);
        let producer: Producer = "orders".parse().unwrap();
        let heads = stamp_named(&mut first, &order, 1, &ChainHeads::new(), Some(&producer));
        assert!(
            first
                .iter()
                .all(|m| m.position.as_ref().unwrap().producer.as_ref() == Some(&producer)),
            "each names its producer"
        );
        let places: Vec<Place> = first.iter().map(|m| m.position.as_ref().unwrap().place()).collect();
        assert_eq!(
            places,
            [
                Place {
                    seq: 1,
                    version: 1,
                    after: 0
                },
                Place {
                    seq: 1,
                    version: 1,
                    after: 0
                },
                Place {
                    seq: 2,
                    version: 1,
                    after: 0
                },
            ]
        );
        // Version 2 sent nothing; version 3 sends to events only.
        let mut third = emitted(&["events"]);
        let heads = stamp(&mut third, &order, 3, &heads);
        assert_eq!(
            third[0].position.as_ref().unwrap().place(),
            Place {
                seq: 3,
                version: 3,
                after: 1
            }
        );
        let first_txn = txn_of(&first[0].id);
        assert!(first_txn.is_some());
        assert_eq!(
            heads[&"audit".parse::<DestinationName>().unwrap()],
            ChainHead {
                seq: 1,
                version: 1,
                txn: first_txn
            }
        );
        let previous: Vec<Option<TxnId>> = first
            .iter()
            .chain(&third)
            .map(|m| m.position.as_ref().unwrap().previous)
            .collect();
        assert_eq!(
            previous,
            [None, None, None, first_txn],
            "each names the chain's transaction before it"
        );
        let mut advanced = ChainHeads::new();
        advance(&mut advanced, &order, &first);
        advance(&mut advanced, &order, &third);
        assert_eq!(advanced, heads, "the store's advance agrees with the stamps");
        let other: ItemKey = "ORDER#2".parse().unwrap();
        let mut untouched = ChainHeads::new();
        advance(&mut untouched, &other, &third);
        assert!(untouched.is_empty(), "another entity's messages leave the heads");
    }

    #[test]
    fn a_position_reads_back_from_its_attributes() {
        let position = Position {
            producer: None,
            entity: "ORDER#1;x=y".parse().unwrap(),
            chain: "events".parse().unwrap(),
            seq: 12,
            version: 5,
            after: 3,
            previous: None,
        };
        let attributes: BTreeMap<String, String> = position
            .attributes()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        assert_eq!(attributes[POSITION_ATTRIBUTE], "chain=events;seq=12;version=5;after=3");
        assert_eq!(Position::from_attributes(&attributes), Ok(Some(position)));
        assert_eq!(Position::from_attributes(&BTreeMap::new()), Ok(None));
        for bad in [
            "seq=12;version=5;after=3",
            "chain=;seq=12;version=5;after=3",
            "chain=a b;seq=1;version=2;after=1",
        ] {
            let mut broken = attributes.clone();
            broken.insert(POSITION_ATTRIBUTE.to_owned(), bad.to_owned());
            assert!(Position::from_attributes(&broken).is_err(), "{bad:?}");
        }
        for bad in [
            "",
            "seq=1",
            "seq=0;version=2;after=1",
            "seq=1;version=2;after=2",
            "seq=1;version=2;after=1;x=1",
            "version=2;seq=1;after=1",
        ] {
            assert!(bad.parse::<Place>().is_err(), "{bad:?}");
        }
    }

    /// A position that names its producer carries it first; one that names none reads as
    /// before, and both read back as they were.
    #[test]
    fn a_named_position_reads_back_and_an_unnamed_one_reads_as_before() {
        let named = Position {
            producer: Some("orders-table.v2".parse().unwrap()),
            entity: "CUSTOMER#42".parse().unwrap(),
            chain: "events".parse().unwrap(),
            seq: 12,
            version: 5,
            after: 3,
            previous: None,
        };
        let attributes = |position: &Position| -> BTreeMap<String, String> {
            position
                .attributes()
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect()
        };
        let sent = attributes(&named);
        assert_eq!(
            sent[POSITION_ATTRIBUTE],
            "producer=orders-table.v2;chain=events;seq=12;version=5;after=3"
        );
        assert_eq!(Position::from_attributes(&sent), Ok(Some(named.clone())));
        let unnamed = named.unnamed();
        assert_eq!(unnamed.producer, None);
        let sent = attributes(&unnamed);
        assert_eq!(sent[POSITION_ATTRIBUTE], "chain=events;seq=12;version=5;after=3");
        assert_eq!(Position::from_attributes(&sent), Ok(Some(unnamed)));
        for bad in [
            "producer=;chain=events;seq=12;version=5;after=3",
            "producer=a b;chain=events;seq=12;version=5;after=3",
            "producer=orders",
            "producer=orders;seq=12;version=5;after=3",
            "chain=events;producer=orders;seq=12;version=5;after=3",
        ] {
            let mut broken = sent.clone();
            broken.insert(POSITION_ATTRIBUTE.to_owned(), bad.to_owned());
            assert!(Position::from_attributes(&broken).is_err(), "{bad:?}");
        }
        // As a record keeps it: the producer only where there is one, so that a record
        // stored before producers were named reads as unnamed.
        let stored = serde_json::to_value(&named).unwrap();
        assert_eq!(stored["producer"], "orders-table.v2");
        let mut old = stored.clone();
        old.as_object_mut().unwrap().remove("producer");
        assert_eq!(serde_json::from_value::<Position>(old).unwrap(), named.unnamed());
        assert!(serde_json::to_value(named.unnamed()).unwrap().get("producer").is_none());
        assert!(serde_json::from_value::<Position>(serde_json::json!({
            "producer": "a/b", "entity": "K", "chain": "events", "seq": 1, "version": 1, "after": 0
        }))
        .is_err());
    }

    #[test]
    fn a_producer_is_a_table_name() {
        for good in ["orders", "a", "Orders_2024.v-1", &"t".repeat(255)] {
            assert_eq!(good.parse::<Producer>().map(|p| p.to_string()), Ok(good.to_owned()));
        }
        for bad in ["", "a b", "a/b", "a:b", "a@b", "a#b", &"t".repeat(256)] {
            assert!(bad.parse::<Producer>().is_err(), "{bad:?}");
        }
        assert_eq!(
            Producer::of_table("arn:aws:dynamodb:eu-west-1:123456789012:table/orders")
                .unwrap()
                .as_str(),
            "orders"
        );
        assert_eq!(Producer::of_table("orders").unwrap().as_str(), "orders");
    }

    /// A key with characters SQS refuses in an attribute goes out escaped, only those,
    /// and reads back as it was.
    #[test]
    fn an_entity_key_goes_out_as_an_attribute_can_carry_it() {
        let position = |entity: &str| Position {
            producer: None,
            entity: entity.parse().unwrap(),
            chain: "events".parse().unwrap(),
            seq: 1,
            version: 1,
            after: 0,
            previous: None,
        };
        for (key, sent) in [
            ("ORDER#1;x=y z", "ORDER#1;x=y z"),
            ("ORDER#\u{0}\u{1f}\tx", "ORDER#%00%1F\tx"),
            ("50%#%41", "50%25#%2541"),
            ("ORDER#é\u{ffff}", "ORDER#%C3%A9%EF%BF%BF"),
        ] {
            let position = position(key);
            let attributes: BTreeMap<String, String> = position
                .attributes()
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect();
            assert_eq!(attributes[ENTITY_ATTRIBUTE], sent, "{key:?}");
            let sqs_can_carry =
                |c: char| matches!(c, '\t' | '\n' | '\r' | ' '..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..);
            assert!(attributes[ENTITY_ATTRIBUTE].chars().all(sqs_can_carry), "{key:?}");
            assert_eq!(Position::from_attributes(&attributes), Ok(Some(position)), "{key:?}");
        }
    }
}
