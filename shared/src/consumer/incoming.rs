//! An incoming message as a consumer's handler sees it, read from what the queue
//! delivered: unwrapped from an SNS notification or an EventBridge event when it came
//! that way, with the id it is deduplicated on (docs/PROTOCOL.md section 10, "The id").

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use super::in_order::is_wait_attribute;
use crate::event_detail::{DATA_FIELD, METADATA_FIELD};
use crate::ports::Delivery;
use crate::protocol::{InvalidPosition, Position, TraceContext, MESSAGE_ID_ATTRIBUTE};

/// The id a message is deduplicated on: the same for every copy of one message,
/// whoever sent it again. 1 to 1024 bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IncomingId(String);

impl IncomingId {
    /// Most bytes an incoming id may have.
    pub const MAX_BYTES: usize = 1024;

    /// `text` as an id, if it has 1 to [`Self::MAX_BYTES`] bytes.
    pub fn new(text: impl Into<String>) -> Option<Self> {
        let text = text.into();
        (1..=Self::MAX_BYTES).contains(&text.len()).then_some(Self(text))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IncomingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the message came, as its body showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Sent to the queue, or by an SNS topic with raw message delivery: the body and
    /// attributes are the sender's.
    Queue,
    /// An SNS notification without raw delivery: the body was the notification's
    /// `Message`, the attributes its `MessageAttributes`.
    Topic {
        /// The topic's ARN.
        topic_arn: String,
    },
    /// An EventBridge event a rule delivered: the body is its `detail.data` (this
    /// library's events) or its whole `detail`, the attributes the strings of
    /// `detail.metadata`.
    Bus {
        /// The event's `source`.
        source: String,
        /// The event's `detail-type`.
        detail_type: String,
    },
}

/// What a consumer's handler gets: one incoming message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// The id it is deduplicated on.
    pub id: IncomingId,
    /// The body, unwrapped from an SNS notification or an EventBridge event.
    pub body: String,
    /// Its string attributes (for an event, those of `detail.metadata`).
    pub attributes: BTreeMap<String, String>,
    /// How it came.
    pub source: Source,
    /// The FIFO message group, on FIFO queues.
    pub group_id: Option<String>,
    /// The queue's id of this delivery.
    pub queue_message_id: String,
    /// How many times the queue has delivered it, this time included.
    pub receive_count: u32,
    /// The trace context its sender gave it: its `traceparent` attribute (for an event,
    /// in `detail.metadata`; through SNS, the notification's), else the queue's X-Ray
    /// header. Its processing continues that trace.
    pub trace: Option<TraceContext>,
}

impl Incoming {
    /// Its place in the history of the entity its sender's transaction changed, on the
    /// destination it came through ([`Position`]): `None` where the transaction changed
    /// no one portable item it read (one over several items, one with native actions
    /// only, a blind create), an error where the attributes are there but cannot be read.
    pub fn position(&self) -> Result<Option<Position>, InvalidPosition> {
        Position::from_attributes(&self.attributes)
    }

    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.body)
    }
}

/// Where a consumer finds each message's id. Every copy of a message must carry the same
/// id, or the copies are not recognised as one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MessageIds {
    /// This library's messages: the `outbox-message-id` message attribute (on SQS, and
    /// through SNS, raw or not), or `detail.metadata.outbox-message-id` of an
    /// EventBridge event.
    #[default]
    Outbox,
    /// A foreign producer's message attribute (or, for an event, `detail.metadata` field)
    /// of this name.
    Attribute(String),
    /// A JSON pointer (RFC 6901) into the body as the queue delivered it (so
    /// `/detail/orderId` for an EventBridge event, `/Message` is not unwrapped), to a
    /// string or an integer.
    JsonPointer(String),
    /// SQS's own `messageId`. Opt-in only: it tells apart the queue's redeliveries of one
    /// send, but a producer that sends again gets a new one, so its re-sends are not
    /// recognised.
    QueueMessageId,
}

/// A setting that names no usable id rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an id rule: outbox, attribute:NAME, json:/POINTER or sqs-message-id")]
pub struct InvalidMessageIds {
    input: String,
}

impl std::str::FromStr for MessageIds {
    type Err = InvalidMessageIds;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidMessageIds {
            input: input.chars().take(80).collect(),
        };
        match input {
            "outbox" => Ok(Self::Outbox),
            "sqs-message-id" => Ok(Self::QueueMessageId),
            _ => match input.split_once(':') {
                Some(("attribute", name)) if !name.is_empty() => Ok(Self::Attribute(name.to_owned())),
                Some(("json", pointer)) if pointer.starts_with('/') => Ok(Self::JsonPointer(pointer.to_owned())),
                _ => Err(invalid()),
            },
        }
    }
}

impl fmt::Display for MessageIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Outbox => f.write_str("outbox"),
            Self::Attribute(name) => write!(f, "attribute:{name}"),
            Self::JsonPointer(pointer) => write!(f, "json:{pointer}"),
            Self::QueueMessageId => f.write_str("sqs-message-id"),
        }
    }
}

/// Why a delivery has no usable id. It is never processed without one (C5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the message has no usable id ({rule}): {reason}")]
pub struct NoId {
    /// The rule that found none.
    pub rule: String,
    /// What was missing or wrong.
    pub reason: String,
}

impl MessageIds {
    /// Reads `delivery` as the handler will see it, with its id.
    pub fn read(&self, delivery: &Delivery) -> Result<Incoming, NoId> {
        let parsed: Option<Value> = serde_json::from_str(&delivery.body).ok();
        let (body, attributes, source) = unwrap(delivery, parsed.as_ref());
        let no_id = |reason: String| NoId {
            rule: self.to_string(),
            reason,
        };
        let text = match self {
            Self::Outbox => attributes
                .get(MESSAGE_ID_ATTRIBUTE)
                .cloned()
                .ok_or_else(|| no_id(format!("no {MESSAGE_ID_ATTRIBUTE} attribute")))?,
            Self::Attribute(name) => attributes
                .get(name)
                .cloned()
                .ok_or_else(|| no_id(format!("no attribute {name}")))?,
            Self::JsonPointer(pointer) => {
                let value = parsed
                    .as_ref()
                    .ok_or_else(|| no_id("the body is not JSON".into()))?
                    .pointer(pointer)
                    .ok_or_else(|| no_id(format!("nothing at {pointer}")))?;
                match value {
                    Value::String(text) => text.clone(),
                    Value::Number(number) if number.is_i64() || number.is_u64() => number.to_string(),
                    other => return Err(no_id(format!("{pointer} is not a string or an integer: {other}"))),
                }
            }
            Self::QueueMessageId => delivery.message_id.clone(),
        };
        let id =
            IncomingId::new(text).ok_or_else(|| no_id(format!("ids have 1 to {} bytes", IncomingId::MAX_BYTES)))?;
        let trace = TraceContext::from_message(
            |name| attributes.get(name).map(String::as_str),
            delivery.trace_header.as_deref(),
        );
        Ok(Incoming {
            id,
            body,
            attributes,
            source,
            group_id: delivery.group_id.clone(),
            queue_message_id: delivery.message_id.clone(),
            receive_count: delivery.receive_count,
            trace,
        })
    }
}

/// The body, attributes and source of a delivery: unwrapped from an SNS notification or
/// an EventBridge event, else as delivered.
fn unwrap(delivery: &Delivery, parsed: Option<&Value>) -> (String, BTreeMap<String, String>, Source) {
    let as_queue = || (delivery.body.clone(), delivery.attributes.clone(), Source::Queue);
    // SNS without raw delivery and EventBridge's SQS targets send no message attributes:
    // a delivery that has some is its sender's own, whatever its body looks like. (The
    // attributes an in-order consumer adds to a waiting message's copy are its own, not
    // the sender's.)
    let sent_with_attributes = delivery.attributes.keys().any(|name| !is_wait_attribute(name));
    let Some(Value::Object(object)) = parsed.filter(|_| !sent_with_attributes) else {
        return as_queue();
    };
    let text = |field: &str| object.get(field).and_then(Value::as_str);
    // An SNS notification (a subscription without raw message delivery).
    if let (Some("Notification"), Some(topic_arn), Some(message)) = (text("Type"), text("TopicArn"), text("Message")) {
        let attributes = object
            .get("MessageAttributes")
            .and_then(Value::as_object)
            .map(|attributes| {
                attributes
                    .iter()
                    .filter_map(|(name, attribute)| Some((name.clone(), attribute.get("Value")?.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let source = Source::Topic {
            topic_arn: topic_arn.to_owned(),
        };
        return (message.to_owned(), attributes, source);
    }
    // An EventBridge event, as a rule's SQS target receives it.
    if let (Some(source), Some(detail_type), Some(detail)) = (text("source"), text("detail-type"), object.get("detail"))
    {
        let source = Source::Bus {
            source: source.to_owned(),
            detail_type: detail_type.to_owned(),
        };
        let metadata = detail.get(METADATA_FIELD).and_then(Value::as_object);
        let attributes = metadata
            .map(|metadata| {
                metadata
                    .iter()
                    .filter_map(|(name, value)| Some((name.clone(), value.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let body = match (metadata, detail.get(DATA_FIELD)) {
            // This library's event: the emitter's body, as the emitter wrote it (a body
            // that was not JSON travels as a JSON string).
            (Some(_), Some(Value::String(text))) => text.clone(),
            (Some(_), Some(data)) => data.to_string(),
            _ => detail.to_string(),
        };
        return (body, attributes, source);
    }
    as_queue()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::in_order::{WAITING_SINCE_ATTRIBUTE, WAITS_ATTRIBUTE, WAIT_ATTRIBUTE};
    use serde_json::json;

    fn delivery(body: &str, attributes: &[(&str, &str)]) -> Delivery {
        Delivery {
            message_id: "sqs-1".into(),
            receipt: "r-1".into(),
            body: body.into(),
            attributes: attributes.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            group_id: None,
            receive_count: 1,
            trace_header: None,
        }
    }

    #[test]
    fn a_queue_message_is_read_by_its_outbox_id_attribute() {
        let read = MessageIds::Outbox
            .read(&delivery(
                r#"{"type":"OrderPlaced"}"#,
                &[("outbox-message-id", "T:0"), ("type", "x")],
            ))
            .unwrap();
        assert_eq!(read.id.as_str(), "T:0");
        assert_eq!(read.body, r#"{"type":"OrderPlaced"}"#);
        assert_eq!(read.source, Source::Queue);
        assert_eq!(read.attributes["type"], "x");
    }

    #[test]
    fn an_sns_notification_is_unwrapped() {
        let body = json!({
            "Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:us-east-1:1:t",
            "Message": "{\"type\":\"OrderPlaced\"}",
            "MessageAttributes": {"outbox-message-id": {"Type": "String", "Value": "T:1"}}
        });
        let read = MessageIds::Outbox.read(&delivery(&body.to_string(), &[])).unwrap();
        assert_eq!(read.id.as_str(), "T:1");
        assert_eq!(read.body, r#"{"type":"OrderPlaced"}"#);
        assert!(matches!(read.source, Source::Topic { .. }));
        // A waiting message's copy, which carries the in-order consumer's own attributes,
        // is unwrapped all the same.
        for wait in [
            &[(WAIT_ATTRIBUTE, "2;1")][..],
            &[(WAITS_ATTRIBUTE, "2"), (WAITING_SINCE_ATTRIBUTE, "1")],
        ] {
            let copy = delivery(&body.to_string(), wait);
            let read = MessageIds::Outbox.read(&copy).unwrap();
            assert_eq!(
                (read.id.as_str(), read.body.as_str()),
                ("T:1", r#"{"type":"OrderPlaced"}"#)
            );
        }
    }

    #[test]
    fn an_eventbridge_event_is_read_from_its_detail() {
        let body = json!({
            "version": "0", "id": "eb-1", "detail-type": "OrderPlaced", "source": "com.example.orders",
            "detail": {"data": {"type": "OrderPlaced", "order_id": "o-1"}, "metadata": {"outbox-message-id": "T:2", "outbox-txn-id": "T"}}
        });
        let read = MessageIds::Outbox.read(&delivery(&body.to_string(), &[])).unwrap();
        assert_eq!(read.id.as_str(), "T:2");
        assert_eq!(
            read.json::<Value>().unwrap(),
            json!({"type": "OrderPlaced", "order_id": "o-1"})
        );
        assert_eq!(
            read.source,
            Source::Bus {
                source: "com.example.orders".into(),
                detail_type: "OrderPlaced".into()
            }
        );
        // A foreign event: the whole detail is the body; a pointer names its id.
        let foreign = json!({"detail-type": "Paid", "source": "bank", "detail": {"payment": {"ref": 42}}});
        let read = MessageIds::JsonPointer("/detail/payment/ref".into())
            .read(&delivery(&foreign.to_string(), &[]))
            .unwrap();
        assert_eq!(read.id.as_str(), "42");
        assert_eq!(read.json::<Value>().unwrap(), json!({"payment": {"ref": 42}}));
    }

    #[test]
    fn a_queue_message_with_attributes_is_its_senders_whatever_its_body() {
        let event = json!({"detail-type": "Paid", "source": "bank", "detail": {"payment": 1}});
        let read = MessageIds::Outbox
            .read(&delivery(&event.to_string(), &[("outbox-message-id", "T:3")]))
            .unwrap();
        assert_eq!((read.id.as_str(), read.source), ("T:3", Source::Queue));
        assert_eq!(read.body, event.to_string(), "not unwrapped");
    }

    #[test]
    fn a_message_without_a_usable_id_is_refused_with_the_reason() {
        let plain = delivery("{}", &[]);
        assert!(MessageIds::Outbox
            .read(&plain)
            .unwrap_err()
            .reason
            .contains("outbox-message-id"));
        assert!(MessageIds::Attribute("key".into()).read(&plain).is_err());
        let error = MessageIds::JsonPointer("/id".into())
            .read(&delivery(r#"{"id": {"nested": 1}}"#, &[]))
            .unwrap_err();
        assert!(error.reason.contains("not a string or an integer"), "{error}");
        let too_long = delivery("{}", &[("outbox-message-id", &"x".repeat(1025))]);
        assert!(MessageIds::Outbox.read(&too_long).is_err());
        // The queue's own id only when asked.
        assert_eq!(MessageIds::QueueMessageId.read(&plain).unwrap().id.as_str(), "sqs-1");
    }

    #[test]
    fn id_rules_read_back_as_written() {
        for text in ["outbox", "attribute:key", "json:/detail/id", "sqs-message-id"] {
            assert_eq!(text.parse::<MessageIds>().unwrap().to_string(), text);
        }
        for bad in ["", "attribute:", "json:id", "messageid"] {
            assert!(bad.parse::<MessageIds>().is_err(), "{bad:?} accepted");
        }
    }
}
