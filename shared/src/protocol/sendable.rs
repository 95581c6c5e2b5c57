//! What every destination takes for good: the characters, attribute names and values,
//! FIFO groups and event names that SQS, SNS and EventBridge accept, checked when a
//! transaction's messages are staged, before anything is written.
//!
//! A message a destination refuses for good (SQS's `InvalidMessageContents`, an attribute
//! name it reserves) could never leave once committed: on a destination that keeps order
//! every later message of its entity would wait behind it. So the commit refuses it first,
//! naming the message and what is wrong. Sizes are the transaction's limits' business
//! ([`crate::settings::TransactionLimits`]).

use super::message::{MessageId, OutgoingMessage};

/// The longest name of a message attribute SQS and SNS take.
pub const MAX_ATTRIBUTE_NAME: usize = 256;
/// The longest FIFO message group id.
pub const MAX_GROUP_ID: usize = 128;
/// The longest `Source` of an event on an EventBridge bus.
pub const MAX_EVENT_SOURCE: usize = 256;
/// The longest `DetailType` of an event on an EventBridge bus.
pub const MAX_EVENT_DETAIL_TYPE: usize = 128;

/// A message no destination would take, and why. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unsendable {
    /// A character SQS and SNS refuse (they take tab, line feed, carriage return, and
    /// U+0020 to U+D7FF, U+E000 to U+FFFD, U+10000 and above).
    #[error("message {message}: its {field} holds U+{code:04X} at character {at}, which queues and topics refuse")]
    Character {
        /// The message.
        message: MessageId,
        /// Where: `body`, or `attribute NAME`.
        field: String,
        /// The character's code point.
        code: u32,
        /// Its index among the field's characters, from 0.
        at: usize,
    },
    /// An attribute name queues and topics refuse.
    #[error("message {message}: attribute name {name:?} is refused: {rule}")]
    AttributeName {
        /// The message.
        message: MessageId,
        /// The name, cut to 80 characters.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// An attribute with an empty value, which SQS refuses.
    #[error("message {message}: attribute {name:?} is empty; queues refuse an empty attribute")]
    EmptyAttribute {
        /// The message.
        message: MessageId,
        /// The attribute's name.
        name: String,
    },
    /// A FIFO group id the emitter gave that FIFO queues and topics refuse.
    #[error("message {message}: its FIFO group is refused: it must be 1 to {MAX_GROUP_ID} printable ASCII characters")]
    GroupId {
        /// The message.
        message: MessageId,
    },
    /// An event name EventBridge refuses.
    #[error("message {message}: its event {field} is refused: {rule}")]
    EventType {
        /// The message.
        message: MessageId,
        /// `source` or `detail type`.
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
}

/// Whether FIFO queues and topics take `text` as a message group id: 1 to
/// [`MAX_GROUP_ID`] characters, each printable ASCII.
pub fn is_valid_group_id(text: &str) -> bool {
    !text.is_empty() && text.len() <= MAX_GROUP_ID && text.bytes().all(|byte| byte.is_ascii_graphic())
}

/// Whether queues and topics take character `c` in a body or an attribute value.
pub fn is_sendable_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

fn characters(message: &OutgoingMessage, field: impl Fn() -> String, text: &str) -> Result<(), Unsendable> {
    match text.chars().enumerate().find(|(_, c)| !is_sendable_char(*c)) {
        Some((at, c)) => Err(Unsendable::Character {
            message: message.id.clone(),
            field: field(),
            code: u32::from(c),
            at,
        }),
        None => Ok(()),
    }
}

/// Why SQS and SNS refuse attribute name `name`, if they do: 1 to 256 characters of
/// `A-Z a-z 0-9 _ - .`, neither starting nor ending with a period nor holding two in a
/// row, and not starting with `AWS.` or `Amazon.` in any case (theirs).
fn attribute_name_rule(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME {
        Some("a name has 1 to 256 characters")
    } else if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
    {
        Some("a name holds only letters, digits, '_', '-' and '.'")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("a name neither starts nor ends with '.', nor holds '..'")
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some("names starting with 'AWS.' or 'Amazon.' are reserved")
    } else {
        None
    }
}

/// Checks that every destination kind takes `message`: its body's characters, the
/// emitter's attributes (names and values), its FIFO group where the emitter chose one,
/// and its event name where it has one. The attributes the protocol adds (ids, the
/// position, the trace) are made sendable where they are written.
pub fn check(message: &OutgoingMessage) -> Result<(), Unsendable> {
    characters(message, || "body".to_owned(), &message.body)?;
    for (name, value) in &message.attributes {
        if let Some(rule) = attribute_name_rule(name) {
            return Err(Unsendable::AttributeName {
                message: message.id.clone(),
                name: name.chars().take(80).collect(),
                rule,
            });
        }
        if value.is_empty() {
            return Err(Unsendable::EmptyAttribute {
                message: message.id.clone(),
                name: name.clone(),
            });
        }
        characters(message, || format!("attribute {name}"), value)?;
    }
    if let Some(group) = &message.group_id {
        if !is_valid_group_id(group) {
            return Err(Unsendable::GroupId {
                message: message.id.clone(),
            });
        }
    }
    if let Some(event) = &message.event {
        let rule = |field, rule| Unsendable::EventType {
            message: message.id.clone(),
            field,
            rule,
        };
        if event.source.is_empty() || event.source.chars().count() > MAX_EVENT_SOURCE {
            return Err(rule("source", "a source has 1 to 256 characters"));
        }
        if event.source.to_ascii_lowercase().starts_with("aws.") {
            return Err(rule("source", "sources starting with 'aws.' are AWS's own"));
        }
        if event.detail_type.is_empty() || event.detail_type.chars().count() > MAX_EVENT_DETAIL_TYPE {
            return Err(rule("detail type", "a detail type has 1 to 128 characters"));
        }
        for (field, text) in [("source", &event.source), ("detail type", &event.detail_type)] {
            if !text.chars().all(is_sendable_char) {
                return Err(rule(field, "it holds a character EventBridge refuses"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
    use serde_json::json;

    fn outgoing(message: Message) -> OutgoingMessage {
        OutgoingMessage::new(TxnId::new_v7(), 0, message)
    }

    fn message() -> Message {
        Message::json("events".parse().unwrap(), &json!({"name": "ok"})).unwrap()
    }

    #[test]
    fn an_ordinary_message_is_sendable() {
        let plain = outgoing(
            message()
                .with_attribute("kind", "OrderPlaced")
                .with_attribute("tenant.id", "é ü 日本 🎉")
                .with_group_id("ORDER#1")
                .with_event("com.example.orders", "OrderPlaced"),
        );
        assert_eq!(check(&plain), Ok(()));
    }

    /// U+FFFF is what SQS refused as `InvalidMessageContents` in the field: JSON keeps it
    /// as it is, since it is a valid character.
    #[test]
    fn a_body_with_a_character_queues_refuse_is_unsendable() {
        for (c, at) in [('\u{FFFF}', 9), ('\u{FFFE}', 9), ('\u{1}', 9), ('\u{1F}', 9)] {
            let mut refused = message();
            refused.body = format!("{{\"name\":\"{c}\"}}");
            let error = check(&outgoing(refused)).unwrap_err();
            assert!(
                matches!(&error, Unsendable::Character { field, code, at: found, .. }
                    if field == "body" && *code == u32::from(c) && *found == at),
                "{error}"
            );
            assert!(
                error.to_string().contains(&format!("U+{:04X}", u32::from(c))),
                "{error}"
            );
        }
        // serde_json escapes control characters itself: a body made by Message::json never
        // holds one raw.
        let escaped = Message::json("events".parse().unwrap(), &json!({"name": "\u{1}"})).unwrap();
        assert_eq!(check(&outgoing(escaped)), Ok(()));
    }

    #[test]
    fn attributes_queues_refuse_are_unsendable() {
        let refused = |name: &str, value: &str| check(&outgoing(message().with_attribute(name, value))).unwrap_err();
        for name in [
            "",
            "has space",
            "AWS.trace",
            "amazon.x",
            ".lead",
            "trail.",
            "a..b",
            &"n".repeat(257),
        ] {
            assert!(
                matches!(refused(name, "v"), Unsendable::AttributeName { .. }),
                "{name:?}"
            );
        }
        assert!(matches!(refused("kind", ""), Unsendable::EmptyAttribute { .. }));
        assert!(matches!(
            refused("kind", "a\u{FFFF}"),
            Unsendable::Character { field, code: 0xFFFF, at: 1, .. } if field == "attribute kind"
        ));
        assert_eq!(check(&outgoing(message().with_attribute("n".repeat(256), "v"))), Ok(()));
    }

    #[test]
    fn a_group_or_an_event_name_destinations_refuse_is_unsendable() {
        for group in [String::new(), "a b".into(), "日本".into(), "g".repeat(129)] {
            assert!(
                matches!(
                    check(&outgoing(message().with_group_id(group.clone()))),
                    Err(Unsendable::GroupId { .. })
                ),
                "{group:?}"
            );
        }
        for (source, detail_type) in [
            ("", "T"),
            ("aws.ec2", "T"),
            ("s", ""),
            ("s", &"t".repeat(129)),
            ("s\u{FFFF}", "T"),
        ] {
            assert!(
                matches!(
                    check(&outgoing(message().with_event(source, detail_type))),
                    Err(Unsendable::EventType { .. })
                ),
                "{source:?} {detail_type:?}"
            );
        }
    }
}
