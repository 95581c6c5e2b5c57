//! How a message travels as an EventBridge event: its `Detail` carries the body beside
//! the message's identity, where rules, input transformers and consumers can read it.
//!
//! ```json
//! {"metadata": {"outbox-message-id": "…:0", "outbox-txn-id": "…", "event-type": "OrderPlaced"},
//!  "data": {"order_id": "…"}}
//! ```
//!
//! `metadata` holds the message's string attributes and its two ids (which win over an
//! attribute of the same name); `data` is the body as the emitter wrote it (a body that
//! is not JSON goes in as a JSON string, since `Detail` must be JSON). A consumer
//! deduplicates on `detail.metadata.outbox-message-id`, the same id that SQS and SNS
//! deliveries carry as a message attribute.

use std::collections::BTreeMap;

use crate::protocol::{OutgoingMessage, TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE};

/// The field of `Detail` that holds the message's ids and attributes.
pub const METADATA_FIELD: &str = "metadata";
/// The field of `Detail` that holds the message's body.
pub const DATA_FIELD: &str = "data";

/// Most bytes of one `PutEvents` entry, as EventBridge counts them.
pub const MAX_ENTRY_BYTES: usize = 256 * 1024;

/// The event's `Detail`: the message's identity and attributes under `metadata`, its body
/// under `data`.
///
/// The trace context (`traceparent`, `tracestate`) goes in `metadata` too, unless it would
/// take the entry past [`MAX_ENTRY_BYTES`]: then only the entry's `TraceHeader` carries it.
pub fn detail(message: &OutgoingMessage) -> String {
    let mut attributes = message.send_attributes();
    let full = detail_with(message, &attributes);
    let event = message.event_type();
    if message.trace.is_none() || event.source.len() + event.detail_type.len() + full.len() <= MAX_ENTRY_BYTES {
        return full;
    }
    attributes.remove(TRACEPARENT_ATTRIBUTE);
    attributes.remove(TRACESTATE_ATTRIBUTE);
    detail_with(message, &attributes)
}

fn detail_with(message: &OutgoingMessage, attributes: &BTreeMap<String, String>) -> String {
    let metadata = serde_json::to_string(attributes).expect("a map of strings serialises");
    let is_json = serde_json::from_str::<serde::de::IgnoredAny>(&message.body).is_ok();
    let data = if is_json {
        message.body.trim().to_owned()
    } else {
        serde_json::to_string(&message.body).expect("a string serialises")
    };
    format!(r#"{{"{METADATA_FIELD}":{metadata},"{DATA_FIELD}":{data}}}"#)
}

/// The bytes EventBridge counts for the message's `PutEvents` entry: `Source`,
/// `DetailType` and `Detail` (AWS's "Calculating PutEvents event entry size"; the entry
/// sets no `Time` or `Resources`).
pub fn entry_bytes(message: &OutgoingMessage) -> usize {
    let event = message.event_type();
    event.source.len() + event.detail_type.len() + detail(message).len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId, MESSAGE_ID_ATTRIBUTE};
    use crate::time::Timestamp;
    use serde_json::json;

    fn outgoing(message: Message) -> OutgoingMessage {
        OutgoingMessage::new(TxnId::from_parts(Timestamp::from_millis(7), [1; 10]), 3, message)
    }

    #[test]
    fn the_trace_stays_out_of_a_detail_it_would_take_past_the_limit() {
        let trace =
            crate::protocol::TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .unwrap();
        let sized = |bytes: usize| {
            let body = serde_json::to_string(&"x".repeat(bytes)).unwrap();
            let message = Message {
                body,
                ..Message::json("bus".parse().unwrap(), &json!({})).unwrap()
            };
            outgoing(message).with_trace(Some(trace.clone()))
        };
        let small = sized(100);
        assert!(detail(&small).contains(&trace.traceparent()));
        let untraced_bytes = entry_bytes(&sized(100).with_trace(None));
        let room = MAX_ENTRY_BYTES - untraced_bytes;
        // Just fits without the trace: sent without it, within the limit.
        let edge = sized(100 + room - 10);
        assert!(entry_bytes(&edge) <= MAX_ENTRY_BYTES, "{}", entry_bytes(&edge));
        assert!(!detail(&edge).contains("traceparent"));
    }

    #[test]
    fn the_detail_carries_the_ids_the_attributes_and_the_body_as_written() {
        let message = outgoing(
            Message::json("events".parse().unwrap(), &json!({"order_id": "o-1", "total": 12}))
                .unwrap()
                .with_attribute("event-type", "OrderPlaced")
                .with_attribute(MESSAGE_ID_ATTRIBUTE, "forged"),
        );
        let detail: serde_json::Value = serde_json::from_str(&detail(&message)).unwrap();
        assert_eq!(
            detail,
            json!({
                "metadata": {
                    "outbox-message-id": message.id.as_str(),
                    "outbox-txn-id": message.txn_id.to_string(),
                    "event-type": "OrderPlaced",
                },
                "data": {"order_id": "o-1", "total": 12},
            })
        );
    }

    #[test]
    fn a_body_that_is_not_json_goes_in_as_a_string() {
        let mut message = outgoing(Message::json("events".parse().unwrap(), &json!(null)).unwrap());
        message.body = "plain text, \"quoted\"".into();
        let parsed: serde_json::Value = serde_json::from_str(&detail(&message)).unwrap();
        assert_eq!(parsed["data"], json!("plain text, \"quoted\""));
        message.body = "{\"a\":1} trailing".into();
        let parsed: serde_json::Value = serde_json::from_str(&detail(&message)).unwrap();
        assert_eq!(parsed["data"], json!("{\"a\":1} trailing"));
    }

    #[test]
    fn the_entry_size_counts_source_detail_type_and_detail() {
        let message = outgoing(
            Message::json("events".parse().unwrap(), &json!({"x": 1}))
                .unwrap()
                .with_event("com.example.orders", "OrderPlaced"),
        );
        assert_eq!(
            entry_bytes(&message),
            "com.example.orders".len() + "OrderPlaced".len() + detail(&message).len()
        );
        let unnamed = outgoing(Message::json("events".parse().unwrap(), &json!({"x": 1})).unwrap());
        assert_eq!(
            entry_bytes(&unnamed),
            "outbox".len() + "outbox-message".len() + detail(&unnamed).len()
        );
    }
}
