//! Outgoing messages: what business logic emits, and the stable identity each one gets.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::item_key::ItemKey;
use super::position::{Position, ENTITY_ATTRIBUTE, POSITION_ATTRIBUTE};
use super::trace_context::{TraceContext, TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE};
use super::txn_id::TxnId;

/// The message attribute that carries a message's stable id on every send.
pub const MESSAGE_ID_ATTRIBUTE: &str = "outbox-message-id";
/// The message attribute that carries the id of the transaction that emitted a message.
pub const TXN_ID_ATTRIBUTE: &str = "outbox-txn-id";
/// The most message attributes one SQS message or SNS notification may carry.
pub const MAX_MESSAGE_ATTRIBUTES: usize = 10;

/// The logical name of a destination queue (`events`, `audit`); settings map each name
/// to a queue URL. 1 to 64 characters from `A-Z a-z 0-9 - _`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DestinationName(String);

/// A destination name that breaks the naming rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("destination name {input:?} must be 1 to 64 characters from A-Z a-z 0-9 - _")]
pub struct InvalidDestination {
    input: String,
}

/// Why [`Message::event`] could not make an event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The destination's name breaks the naming rule.
    #[error(transparent)]
    Destination(#[from] InvalidDestination),
    /// The body could not be written as JSON.
    #[error("the event's body is not JSON")]
    Body(#[from] serde_json::Error),
}

impl DestinationName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DestinationName {
    type Err = InvalidDestination;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let valid = (1..=64).contains(&input.len())
            && input
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(Self(input.to_owned()))
        } else {
            Err(InvalidDestination {
                input: input.chars().take(80).collect(),
            })
        }
    }
}

impl TryFrom<String> for DestinationName {
    type Error = InvalidDestination;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<DestinationName> for String {
    fn from(name: DestinationName) -> Self {
        name.0
    }
}

impl fmt::Display for DestinationName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stable id of an outgoing message: `{txn_id}:{position}`. Every send of the message,
/// first or repeated, carries it (invariant I4); it is the FIFO deduplication id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(String);

impl MessageId {
    /// The id of the message at `position` (from 0) in transaction `txn_id`.
    pub fn new(txn_id: TxnId, position: u32) -> Self {
        Self(format!("{txn_id}:{position}"))
    }

    /// The id as text (at most 47 characters, valid as an SQS deduplication id).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the messages the emitter gave no group go in FIFO groups (`OUTBOX_FIFO_GROUPS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FifoGrouping {
    /// One group per entity, for the messages positioned in an entity's history (others
    /// by transaction): each entity's messages in commit order.
    #[default]
    Entity,
    /// One group per transaction, given to each message at its commit: more groups, so
    /// more throughput, and no order between transactions.
    Transaction,
}

/// The FIFO group of entity `key`'s messages: the key itself where it is a valid
/// `MessageGroupId` (at most 128 characters, each printable ASCII), else `entity-` and
/// the hex of its SHA-256 (71 characters).
pub fn fifo_group_of(key: &ItemKey) -> String {
    let text = key.as_str();
    if super::sendable::is_valid_group_id(text) {
        return text.to_owned();
    }
    let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("entity-{hex}")
}

/// A message as business logic emits it, before the transaction gives it an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Where it goes.
    pub destination: DestinationName,
    /// The body, JSON text.
    pub body: String,
    /// String attributes (SQS message attributes).
    pub attributes: BTreeMap<String, String>,
    /// The FIFO message group; FIFO destinations use the transaction id when it is unset.
    pub group_id: Option<String>,
    /// On an EventBridge bus, the event's `Source` and `DetailType` (see
    /// [`Message::with_event`]); other destinations ignore it.
    pub event: Option<EventType>,
}

/// What names an event on an EventBridge bus: its `Source` (the emitting service, such as
/// `com.example.orders`) and its `DetailType` (what happened, such as `OrderPlaced`).
/// Rules match on both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventType {
    /// `Source`: 1 to 256 characters; `aws.` prefixes are AWS's own.
    pub source: String,
    /// `DetailType`: 1 to 128 characters.
    pub detail_type: String,
}

impl EventType {
    /// The `Source` of an event whose message did not name one.
    pub const DEFAULT_SOURCE: &'static str = "outbox";
    /// The `DetailType` of an event whose message did not name one.
    pub const DEFAULT_DETAIL_TYPE: &'static str = "outbox-message";
}

impl Default for EventType {
    fn default() -> Self {
        Self {
            source: Self::DEFAULT_SOURCE.to_owned(),
            detail_type: Self::DEFAULT_DETAIL_TYPE.to_owned(),
        }
    }
}

impl Message {
    /// A message whose body is `body` serialised as JSON.
    pub fn json(destination: DestinationName, body: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Self {
            destination,
            body: serde_json::to_string(body)?,
            attributes: BTreeMap::new(),
            group_id: None,
            event: None,
        })
    }

    /// An event from `source` on `destination`: its body `body` as JSON, named on an
    /// EventBridge bus by `source` and the body's `type` field as its detail-type
    /// ([`EventType::DEFAULT_DETAIL_TYPE`] when it has none). Queues and topics get the
    /// body alone.
    ///
    /// ```
    /// use outbox::protocol::Message;
    /// use serde_json::json;
    ///
    /// let added = json!({"type": "ProductAdded", "product_id": "p1"});
    /// let message = Message::event("events", "com.example.inventory", &added).unwrap();
    /// assert_eq!(message.destination.as_str(), "events");
    /// assert_eq!(message.event.unwrap().detail_type, "ProductAdded");
    /// assert!(Message::event("no such/name", "com.example.inventory", &added).is_err());
    /// ```
    pub fn event(destination: &str, source: &str, body: &impl Serialize) -> Result<Self, EventError> {
        let body = serde_json::to_value(body)?;
        let detail_type = body["type"]
            .as_str()
            .unwrap_or(EventType::DEFAULT_DETAIL_TYPE)
            .to_owned();
        Ok(Self::json(destination.parse()?, &body)?.with_event(source, detail_type))
    }

    /// Adds a string attribute.
    pub fn with_attribute(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// Sets the FIFO message group.
    pub fn with_group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// Names the event on an EventBridge bus: `Source` and `DetailType`. Unset, a bus
    /// gets [`EventType::DEFAULT_SOURCE`] and [`EventType::DEFAULT_DETAIL_TYPE`]; queues
    /// and topics ignore it.
    pub fn with_event(mut self, source: impl Into<String>, detail_type: impl Into<String>) -> Self {
        self.event = Some(EventType {
            source: source.into(),
            detail_type: detail_type.into(),
        });
        self
    }
}

/// A message committed in an outbox record: the emitted message plus its identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingMessage {
    /// Stable id, the same on every send.
    pub id: MessageId,
    /// The transaction that emitted it.
    pub txn_id: TxnId,
    /// Where it goes.
    pub destination: DestinationName,
    /// The body, JSON text.
    pub body: String,
    /// String attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// FIFO message group, when the emitter chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// The event's `Source` and `DetailType` on an EventBridge bus, when the emitter named
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventType>,
    /// The trace context of the span that emitted it, carried on every send of it
    /// ([`TraceContext::attributes`], and X-Ray's header where the service has one), so
    /// that whoever publishes it, whenever, its consumers continue the emitter's trace.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_trace")]
    pub trace: Option<TraceContext>,
    /// Its place in the history of the entity its transaction changed, on its
    /// destination, where the transaction changed one entity it read ([`Position`]):
    /// carried on every send ([`ENTITY_ATTRIBUTE`], [`POSITION_ATTRIBUTE`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_position"
    )]
    pub position: Option<Position>,
}

/// A stored trace context, or none where it cannot be read: a context never makes its
/// message unreadable (docs/PROTOCOL.md section 14).
fn lenient_trace<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<TraceContext>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(value.and_then(|value| serde_json::from_value(value).ok()))
}

/// A stored position, or none where it cannot be read: a position never makes its
/// message unreadable.
fn lenient_position<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Position>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(value.and_then(|value| serde_json::from_value(value).ok()))
}

impl OutgoingMessage {
    /// Gives `message` its identity as the message at `position` of `txn_id`.
    pub fn new(txn_id: TxnId, position: u32, message: Message) -> Self {
        Self {
            id: MessageId::new(txn_id, position),
            txn_id,
            destination: message.destination,
            body: message.body,
            attributes: message.attributes,
            group_id: message.group_id,
            event: message.event,
            trace: None,
            position: None,
        }
    }

    /// This message with the trace context of the span that emitted it.
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// The attributes every send of it carries: the emitter's, its stable id and
    /// transaction id and its position where it has one, which win over an emitter's
    /// attribute of the same name (an emitter's position attributes on a message without
    /// a position, say copied from a message it consumed, are dropped: they would claim a
    /// place in a history the message does not have), and its
    /// trace context (`traceparent`, `tracestate`, replacing an emitter's of those names)
    /// as far as they fit: within [`MAX_MESSAGE_ATTRIBUTES`] beside the emitter's others
    /// and the ids, and within the bytes of one send ([`crate::publish::MAX_BATCH_BYTES`]).
    pub fn send_attributes(&self) -> BTreeMap<String, String> {
        let mut attributes = self.attributes.clone();
        if self.trace.is_some() {
            attributes.remove(TRACEPARENT_ATTRIBUTE);
            attributes.remove(TRACESTATE_ATTRIBUTE);
        }
        attributes.remove(ENTITY_ATTRIBUTE);
        attributes.remove(POSITION_ATTRIBUTE);
        attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), self.id.to_string());
        attributes.insert(TXN_ID_ATTRIBUTE.to_owned(), self.txn_id.to_string());
        for (name, value) in self.position.iter().flat_map(Position::attributes) {
            attributes.insert(name.to_owned(), value);
        }
        for (name, value) in self.trace_attributes() {
            attributes.insert(name.to_owned(), value);
        }
        attributes
    }

    /// The trace attributes a send carries: as many of `traceparent` and `tracestate`, in
    /// that order, as fit beside the emitter's other attributes and the two ids within
    /// [`MAX_MESSAGE_ATTRIBUTES`], and within the bytes of one send to a queue or topic
    /// ([`crate::publish::MAX_BATCH_BYTES`]; a bus entry is judged by
    /// [`crate::event_detail::detail`]). The trace never crowds out what the emitter sends,
    /// nor makes a message too large to send: then SQS carries it as its `AWSTraceHeader`
    /// only.
    fn trace_attributes(&self) -> Vec<(&'static str, String)> {
        let Some(trace) = &self.trace else {
            return Vec::new();
        };
        let own: Vec<(&String, &String)> = self
            .attributes
            .iter()
            .filter(|(name, _)| {
                ![
                    MESSAGE_ID_ATTRIBUTE,
                    TXN_ID_ATTRIBUTE,
                    TRACEPARENT_ATTRIBUTE,
                    TRACESTATE_ATTRIBUTE,
                    ENTITY_ATTRIBUTE,
                    POSITION_ATTRIBUTE,
                ]
                .contains(&name.as_str())
            })
            .collect();
        let position = self.position.iter().flat_map(Position::attributes);
        let protocol: Vec<(&str, String)> = [
            (MESSAGE_ID_ATTRIBUTE, self.id.to_string()),
            (TXN_ID_ATTRIBUTE, self.txn_id.to_string()),
        ]
        .into_iter()
        .chain(position)
        .collect();
        let ids: usize = protocol.iter().map(|(name, value)| attribute_bytes(name, value)).sum();
        let mut bytes = self.body.len()
            + ids
            + own
                .iter()
                .map(|(name, value)| attribute_bytes(name, value))
                .sum::<usize>();
        let mut room = MAX_MESSAGE_ATTRIBUTES.saturating_sub(own.len() + protocol.len());
        let mut kept = Vec::new();
        for (name, value) in trace.attributes() {
            bytes += attribute_bytes(name, &value);
            if room == 0 || bytes > crate::publish::MAX_BATCH_BYTES {
                break;
            }
            room -= 1;
            kept.push((name, value));
        }
        kept
    }

    /// Its `Source` and `DetailType` on an EventBridge bus: the emitter's, or the defaults.
    pub fn event_type(&self) -> EventType {
        self.event.clone().unwrap_or_default()
    }

    /// The FIFO group this message goes in: the emitter's choice (or the one its commit
    /// gave it, [`FifoGrouping::Transaction`]); else the entity it is positioned in
    /// ([`fifo_group_of`]), so that a FIFO destination keeps each entity's messages in
    /// commit order; else its transaction.
    pub fn fifo_group(&self) -> String {
        match (&self.group_id, &self.position) {
            (Some(group), _) => group.clone(),
            (None, Some(position)) => fifo_group_of(&position.entity),
            (None, None) => self.txn_id.to_string(),
        }
    }

    /// Bytes this message adds to a queue send, the measure SQS and SNS apply to their
    /// size limits: its body and every attribute a send of it carries
    /// ([`Self::send_attributes`]: the emitter's, its ids, its position, its trace
    /// context), each attribute's name, data type and value.
    pub fn payload_bytes(&self) -> usize {
        self.body.len()
            + self
                .send_attributes()
                .iter()
                .map(|(name, value)| attribute_bytes(name, value))
                .sum::<usize>()
    }
}

/// The bytes SQS counts for one string message attribute: its name, its data type
/// (`String`) and its value.
fn attribute_bytes(name: &str, value: &str) -> usize {
    name.len() + "String".len() + value.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    #[test]
    fn ids_are_stable_and_distinct_per_position() {
        let txn = TxnId::from_parts(Timestamp::from_millis(1), [2; 10]);
        assert_eq!(MessageId::new(txn, 0), MessageId::new(txn, 0));
        assert_ne!(MessageId::new(txn, 0), MessageId::new(txn, 1));
        assert!(
            MessageId::new(txn, u32::MAX).as_str().len() <= 128,
            "fits an SQS deduplication id"
        );
    }

    /// An emitter's copy of a consumed message's position attributes never claims a
    /// place for a message without one; a placed message's own position wins over them.
    #[test]
    fn only_a_placed_message_carries_a_position() {
        let txn = TxnId::from_parts(Timestamp::from_millis(1), [2; 10]);
        let message = Message::json("events".parse().unwrap(), &serde_json::json!({}))
            .unwrap()
            .with_attribute(ENTITY_ATTRIBUTE, "ORDER#1")
            .with_attribute(POSITION_ATTRIBUTE, "chain=events;seq=7;version=9;after=8")
            .with_attribute("colour", "blue");
        let mut outgoing = OutgoingMessage::new(txn, 0, message);
        let sent = outgoing.send_attributes();
        assert!(
            !sent.contains_key(ENTITY_ATTRIBUTE) && !sent.contains_key(POSITION_ATTRIBUTE),
            "{sent:?}"
        );
        assert_eq!(sent["colour"], "blue");
        let mut heads = crate::protocol::ChainHeads::new();
        heads = crate::protocol::stamp_chain(
            std::slice::from_mut(&mut outgoing),
            &"SHIP#1".parse().unwrap(),
            1,
            &heads,
        );
        assert_eq!(heads.len(), 1);
        let sent = outgoing.send_attributes();
        assert_eq!(sent[ENTITY_ATTRIBUTE], "SHIP#1");
        assert_eq!(sent[POSITION_ATTRIBUTE], "chain=events;seq=1;version=1;after=0");
    }

    #[test]
    fn destination_names_are_validated() {
        assert!("events".parse::<DestinationName>().is_ok());
        assert!("audit_log-2".parse::<DestinationName>().is_ok());
        for bad in ["", "has space", "a.fifo", &"x".repeat(65)] {
            assert!(bad.parse::<DestinationName>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn outgoing_messages_round_trip_through_json() {
        let txn = TxnId::from_parts(Timestamp::from_millis(5), [3; 10]);
        let message = Message::json("events".parse().unwrap(), &serde_json::json!({"type": "OrderPlaced"}))
            .unwrap()
            .with_attribute("type", "OrderPlaced")
            .with_group_id("order-1")
            .with_event("com.example.orders", "OrderPlaced");
        let outgoing = OutgoingMessage::new(txn, 2, message);
        let text = serde_json::to_string(&outgoing).unwrap();
        assert_eq!(serde_json::from_str::<OutgoingMessage>(&text).unwrap(), outgoing);
        assert_eq!(outgoing.fifo_group(), "order-1");
        assert_eq!(outgoing.event_type().detail_type, "OrderPlaced");
    }

    #[test]
    fn the_trace_goes_as_attributes_where_they_fit_and_never_crowds_out_the_emitters() {
        let txn = TxnId::from_parts(Timestamp::from_millis(5), [3; 10]);
        let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .unwrap()
            .with_tracestate(Some("congo=t61rcWkgMzE"));
        let with = |own: usize| {
            let mut message = Message::json("events".parse().unwrap(), &serde_json::json!({})).unwrap();
            for n in 0..own {
                message = message.with_attribute(format!("a{n}"), "v");
            }
            OutgoingMessage::new(txn, 0, message).with_trace(Some(trace.clone()))
        };
        let names = |own: usize| {
            let attributes = with(own).send_attributes();
            assert!(attributes.len() <= MAX_MESSAGE_ATTRIBUTES, "{attributes:?}");
            (
                attributes.contains_key("traceparent"),
                attributes.contains_key("tracestate"),
            )
        };
        assert_eq!(names(0), (true, true));
        assert_eq!(names(6), (true, true));
        assert_eq!(names(7), (true, false), "tracestate goes first");
        assert_eq!(names(8), (false, false), "the emitter's eight and the two ids");
        assert_eq!(with(8).send_attributes().len(), MAX_MESSAGE_ATTRIBUTES);
        // The size limits count what is sent, the ids included.
        let sent: usize = with(7)
            .send_attributes()
            .iter()
            .map(|(name, value)| name.len() + "String".len() + value.len())
            .sum();
        assert_eq!(with(7).payload_bytes(), 2 + sent);
        let untraced = with(7).with_trace(None);
        assert!(!untraced.send_attributes().contains_key("traceparent"));
        // An emitter's own trace attributes give way to the message's context, and never
        // push the count over: seven of its own, one of them a tracestate.
        let mut stale = with(6);
        stale.attributes.insert("tracestate".into(), "other=1".into());
        let attributes = stale
            .clone()
            .with_trace(Some(trace.clone().with_tracestate(None)))
            .send_attributes();
        assert_eq!(attributes.get("tracestate"), None, "not another trace's state");
        assert_eq!(attributes.get("traceparent"), Some(&trace.traceparent()));
        stale.attributes.insert("a6".into(), "v".into());
        assert!(stale.send_attributes().len() <= MAX_MESSAGE_ATTRIBUTES);
        // Nor makes the message too large to send.
        let mut large = with(0);
        large.body = "x".repeat(crate::publish::MAX_BATCH_BYTES - 120);
        assert!(!large.send_attributes().contains_key("traceparent"));
        large.body.truncate(crate::publish::MAX_BATCH_BYTES - 400);
        assert!(large.send_attributes().contains_key("traceparent"));
    }

    /// The size limits count every attribute a send adds to the emitter's: the two ids,
    /// the position where the message has one, the trace context; each with its name,
    /// data type and value, as SQS counts them.
    #[test]
    fn the_size_counts_the_attributes_every_send_adds() {
        let txn = TxnId::from_parts(Timestamp::from_millis(1), [0; 10]);
        let message = Message::json("events".parse().unwrap(), &serde_json::json!({"x": 1}))
            .unwrap()
            .with_attribute("own", "v");
        let body = message.body.len();
        let mut outgoing = [OutgoingMessage::new(txn, 0, message)];
        let id = outgoing[0].id.to_string();
        let ids = "outbox-message-id".len() + id.len() + "outbox-txn-id".len() + txn.to_string().len();
        let typed = |count: usize| count * "String".len();
        assert_eq!(outgoing[0].payload_bytes(), body + "own".len() + 1 + ids + typed(3));
        let plain = outgoing[0].payload_bytes();
        let order: ItemKey = "ORDER#1".parse().unwrap();
        crate::protocol::stamp_chain(&mut outgoing, &order, 1, &Default::default());
        let position = outgoing[0].position.clone().expect("stamped");
        let placed: usize = position
            .attributes()
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum();
        assert_eq!(outgoing[0].payload_bytes(), plain + placed + typed(2));
        let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .unwrap()
            .with_tracestate(Some("congo=t61rcWkgMzE"));
        let traced = outgoing[0].clone().with_trace(Some(trace.clone()));
        let carried: usize = trace.attributes().map(|(name, value)| name.len() + value.len()).sum();
        assert_eq!(traced.payload_bytes(), plain + placed + carried + typed(4));
    }

    #[test]
    fn a_stored_trace_that_cannot_be_read_leaves_the_message_readable() {
        let txn = TxnId::from_parts(Timestamp::from_millis(5), [3; 10]);
        let text = format!(
            r#"{{"id":"{txn}:0","txn_id":"{txn}","destination":"events","body":"{{}}","trace":{{"traceparent":"junk"}}}}"#
        );
        let outgoing: OutgoingMessage = serde_json::from_str(&text).unwrap();
        assert_eq!(outgoing.trace, None);
    }

    #[test]
    fn records_written_before_events_had_a_type_still_read_and_get_the_defaults() {
        let txn = TxnId::from_parts(Timestamp::from_millis(5), [3; 10]);
        let text = format!(r#"{{"id":"{txn}:0","txn_id":"{txn}","destination":"events","body":"{{}}"}}"#);
        let outgoing: OutgoingMessage = serde_json::from_str(&text).unwrap();
        assert_eq!(outgoing.event, None);
        assert_eq!(outgoing.event_type(), EventType::default());
        assert!(!serde_json::to_string(&outgoing).unwrap().contains(r#""event""#));
    }
}
