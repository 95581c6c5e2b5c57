//! The control message and its versioned JSON encoding.
//!
//! Wire form, version 1:
//! `{"version":1,"txn_id":"<uuid v7>","first_sent_at":<unix ms>,"attempt":<n >= 1>}`.
//! Version 2 adds `"entity":"<item key>"`: the transaction commits in entity mode into that
//! item (docs/PROTOCOL.md section 11), so its outcome may be in the item rather than in its
//! record. That is a new meaning: a worker that knew only version 1 would tombstone such
//! a transaction's record beside a commit in the item, so it must refuse the message.
//! A message without an entity is still written as version 1.
//! Either version may carry `"traceparent"` (and `"tracestate"`): the trace context of the
//! request that began the transaction, which the worker's span links. An optional field
//! in the sense below: an older worker ignores it, and an invalid one is dropped, never
//! a reason to refuse the message.
//! Either version may carry `"retention_s"`: how long, in seconds, the sender keeps the
//! proof of the transaction's outcome (its record's TTL, its sent mark's time). The worker
//! takes a message for stale after the shorter of that and its own retention, so that a
//! worker configured with a longer retention than the API never fences a transaction whose
//! proof has already expired. Optional in the same sense: absent, invalid, or not beyond
//! the worker's commit window (which every retention must outlast), the worker's own
//! retention holds.
//! Unknown fields are ignored so that a newer sender can add optional fields without
//! breaking an older worker; a new meaning needs a new `version`, which an older worker
//! refuses with [`DecodeError::UnknownVersion`] (and SQS's redrive policy then parks the
//! message in the dead-letter queue until a worker that knows it is deployed).

use std::time::Duration;

use serde_json::{Map, Value};

use super::trace_context::TraceContext;
use super::txn_id::TxnId;
use super::ItemKey;
use crate::time::Timestamp;

/// The newest version this code writes and reads (it reads every earlier one).
pub const CONTROL_MESSAGE_VERSION: u64 = 2;

/// Asks the control worker to settle transaction `txn_id`: dispatch it if it committed,
/// wait if it may still commit, tombstone it if it can no longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlMessage {
    /// The transaction this message drives.
    pub txn_id: TxnId,
    /// When the request path sent the first control message; the commit window counts
    /// from here.
    pub first_sent_at: Timestamp,
    /// 1 for the request path's message, one more for each re-deferral.
    pub attempt: u32,
    /// The one item the transaction commits into, in entity mode (version 2).
    pub entity: Option<ItemKey>,
    /// The trace context of the request that began the transaction, if traced.
    pub trace: Option<TraceContext>,
    /// How long the sender keeps the proof of the transaction's outcome (its retention),
    /// in whole seconds, if it said.
    pub retention: Option<Duration>,
}

/// Why a control message body could not be decoded. Never a panic, whatever the input.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body is not JSON at all.
    #[error("control message is not JSON")]
    NotJson(#[source] serde_json::Error),
    /// The body is JSON but not an object.
    #[error("control message is not a JSON object")]
    NotAnObject,
    /// The object lacks a required field.
    #[error("control message lacks the field `{field}`")]
    MissingField {
        /// The field's name.
        field: &'static str,
    },
    /// A field has the wrong type or an invalid value.
    #[error("control message field `{field}` is invalid: {rule}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// What the field must be.
        rule: &'static str,
    },
    /// A version this code does not know.
    #[error("control message version {version} is not supported (this worker knows {CONTROL_MESSAGE_VERSION})")]
    UnknownVersion {
        /// The version found.
        version: u64,
    },
}

impl ControlMessage {
    /// The first control message of a transaction.
    pub fn first(txn_id: TxnId, sent_at: Timestamp) -> Self {
        Self {
            txn_id,
            first_sent_at: sent_at,
            attempt: 1,
            entity: None,
            trace: None,
            retention: None,
        }
    }

    /// This message, saying that its sender keeps the proof of the transaction's outcome
    /// for `retention` (rounded down to whole seconds).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(Duration::from_secs(retention.as_secs()));
        self
    }

    /// How long after its first sending this message is stale for a worker whose own
    /// retention is `own`: the shorter of the two. A sender's retention that does not
    /// exceed `window` (the commit window, which every retention must outlast) cannot be
    /// right, and is ignored: trusted, it would call a message stale while its
    /// transaction may still commit, and the commit would never be dispatched.
    pub fn stale_after(&self, own: Duration, window: Duration) -> Duration {
        self.retention
            .filter(|sender| *sender > window)
            .map_or(own, |sender| sender.min(own))
    }

    /// This message, carrying the trace context of the request that began the transaction.
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// This message, for a transaction that commits in entity mode into `key`.
    pub fn with_entity(mut self, key: ItemKey) -> Self {
        self.entity = Some(key);
        self
    }

    /// The message that re-defers this one: same transaction and window, next attempt.
    pub fn next_attempt(&self) -> Self {
        Self {
            attempt: self.attempt.saturating_add(1),
            ..self.clone()
        }
    }

    /// The JSON body to send.
    pub fn encode(&self) -> String {
        let mut body = serde_json::json!({
            "version": 1,
            "txn_id": self.txn_id.to_string(),
            "first_sent_at": self.first_sent_at.as_millis(),
            "attempt": self.attempt,
        });
        if let Some(entity) = &self.entity {
            body["version"] = Value::from(2);
            body["entity"] = Value::from(entity.as_str());
        }
        for (name, value) in self.trace.iter().flat_map(TraceContext::attributes) {
            body[name] = Value::from(value);
        }
        if let Some(retention) = self.retention {
            body["retention_s"] = Value::from(retention.as_secs());
        }
        body.to_string()
    }

    /// Decodes a body, checking the version before anything else.
    pub fn decode(body: &str) -> Result<Self, DecodeError> {
        let value: Value = serde_json::from_str(body).map_err(DecodeError::NotJson)?;
        let Value::Object(fields) = value else {
            return Err(DecodeError::NotAnObject);
        };
        let version = unsigned(&fields, "version")?;
        if !(1..=CONTROL_MESSAGE_VERSION).contains(&version) {
            return Err(DecodeError::UnknownVersion { version });
        }
        let txn_id = match required(&fields, "txn_id")? {
            // Only the request path's transactions have control messages: a consumed
            // message's id (v8) in one is forged, and a tombstone for it would block
            // every later copy of that message.
            Value::String(text) => text
                .parse::<TxnId>()
                .ok()
                .filter(|txn_id| !txn_id.is_consumed())
                .ok_or(DecodeError::InvalidField {
                    field: "txn_id",
                    rule: "a UUID v7 in hyphenated form",
                })?,
            _ => {
                return Err(DecodeError::InvalidField {
                    field: "txn_id",
                    rule: "a string",
                })
            }
        };
        let first_sent_at = Timestamp::from_millis(unsigned(&fields, "first_sent_at")?);
        let attempt = u32::try_from(unsigned(&fields, "attempt")?)
            .ok()
            .filter(|attempt| *attempt >= 1)
            .ok_or(DecodeError::InvalidField {
                field: "attempt",
                rule: "an integer from 1 to 4294967295",
            })?;
        let entity = match (version, fields.get("entity")) {
            (1, _) => None,
            (_, Some(Value::String(key))) => Some(key.parse::<ItemKey>().map_err(|_| DecodeError::InvalidField {
                field: "entity",
                rule: "an item key: 1 to 1024 bytes, not a protocol record's",
            })?),
            (_, Some(_)) => {
                return Err(DecodeError::InvalidField {
                    field: "entity",
                    rule: "a string",
                })
            }
            (_, None) => return Err(DecodeError::MissingField { field: "entity" }),
        };
        let text = |name: &str| fields.get(name).and_then(Value::as_str);
        let trace = TraceContext::from_message(text, None);
        let retention = fields
            .get("retention_s")
            .and_then(Value::as_u64)
            .map(Duration::from_secs);
        Ok(Self {
            txn_id,
            first_sent_at,
            attempt,
            entity,
            trace,
            retention,
        })
    }
}

fn required<'a>(fields: &'a Map<String, Value>, field: &'static str) -> Result<&'a Value, DecodeError> {
    fields.get(field).ok_or(DecodeError::MissingField { field })
}

fn unsigned(fields: &Map<String, Value>, field: &'static str) -> Result<u64, DecodeError> {
    required(fields, field)?.as_u64().ok_or(DecodeError::InvalidField {
        field,
        rule: "a non-negative integer",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ControlMessage {
        ControlMessage {
            txn_id: TxnId::from_parts(Timestamp::from_millis(1_700_000_000_000), [1; 10]),
            first_sent_at: Timestamp::from_millis(1_700_000_000_123),
            attempt: 3,
            entity: None,
            trace: None,
            retention: None,
        }
    }

    #[test]
    fn the_senders_retention_travels_and_the_shorter_one_makes_a_message_stale() {
        let day = Duration::from_secs(24 * 3600);
        let message = sample().with_retention(day + Duration::from_millis(400));
        let body = message.encode();
        assert!(body.contains(r#""retention_s":86400"#), "{body}");
        assert!(body.contains(r#""version":1"#), "an optional field: no new version");
        let decoded = ControlMessage::decode(&body).unwrap();
        assert_eq!(decoded, message);
        let window = Duration::from_secs(30);
        assert_eq!(decoded.stale_after(7 * day, window), day, "the sender's, shorter");
        assert_eq!(decoded.stale_after(day / 2, window), day / 2, "the worker's, shorter");
        assert_eq!(sample().stale_after(7 * day, window), 7 * day, "unsaid: the worker's");
        let within_the_window = sample().with_retention(window);
        assert_eq!(
            within_the_window.stale_after(7 * day, window),
            7 * day,
            "a sender's retention within the commit window is ignored"
        );
        let bad = body.replace(r#""retention_s":86400"#, r#""retention_s":"a day""#);
        assert_eq!(ControlMessage::decode(&bad).unwrap(), sample(), "dropped, not refused");
    }

    #[test]
    fn a_trace_context_travels_in_the_body_and_a_bad_one_is_dropped() {
        let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .unwrap()
            .with_tracestate(Some("congo=t61rcWkgMzE"));
        let message = sample().with_trace(Some(trace));
        let body = message.encode();
        assert!(
            body.contains(r#""traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01""#),
            "{body}"
        );
        assert!(body.contains(r#""version":1"#), "an optional field: no new version");
        assert_eq!(ControlMessage::decode(&body).unwrap(), message);
        let bad = body.replace("00-0af7", "zz-0af7");
        assert_eq!(ControlMessage::decode(&bad).unwrap(), sample(), "dropped, not refused");
    }

    #[test]
    fn an_entity_makes_version_2_and_round_trips() {
        let message = sample().with_entity("ORDER#1".parse().unwrap());
        let body = message.encode();
        assert!(body.contains("\"version\":2"), "{body}");
        assert_eq!(ControlMessage::decode(&body).unwrap(), message);
        assert!(
            sample().encode().contains("\"version\":1"),
            "without an entity, version 1"
        );
        let without = body
            .replace(",\"entity\":\"ORDER#1\"", "")
            .replace("\"entity\":\"ORDER#1\",", "");
        assert!(matches!(
            ControlMessage::decode(&without),
            Err(DecodeError::MissingField { field: "entity" })
        ));
        let reserved = body.replace("ORDER#1", "TXN#1");
        assert!(matches!(
            ControlMessage::decode(&reserved),
            Err(DecodeError::InvalidField { field: "entity", .. })
        ));
    }

    #[test]
    fn round_trips() {
        let message = sample();
        assert_eq!(ControlMessage::decode(&message.encode()).unwrap(), message);
    }

    #[test]
    fn ignores_unknown_fields_of_a_known_version() {
        let mut value: Value = serde_json::from_str(&sample().encode()).unwrap();
        value["trace"] = Value::from("abc");
        assert_eq!(ControlMessage::decode(&value.to_string()).unwrap(), sample());
    }

    #[test]
    fn an_unknown_version_is_a_typed_error() {
        let body = sample().encode().replace("\"version\":1", "\"version\":3");
        assert!(matches!(
            ControlMessage::decode(&body),
            Err(DecodeError::UnknownVersion { version: 3 })
        ));
    }

    #[test]
    fn a_missing_field_is_named() {
        for field in ["version", "txn_id", "first_sent_at", "attempt"] {
            let mut value: Value = serde_json::from_str(&sample().encode()).unwrap();
            value.as_object_mut().unwrap().remove(field);
            match ControlMessage::decode(&value.to_string()) {
                Err(DecodeError::MissingField { field: missing }) => assert_eq!(missing, field),
                other => panic!("expected a missing {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_consumed_messages_id_is_refused_no_control_message_names_one() {
        let forged = format!(
            r#"{{"version":1,"txn_id":"{}","first_sent_at":1,"attempt":1}}"#,
            TxnId::consumed("shipping", "T:0")
        );
        assert!(matches!(
            ControlMessage::decode(&forged),
            Err(DecodeError::InvalidField { field: "txn_id", .. })
        ));
    }

    #[test]
    fn garbage_is_a_typed_error_never_a_panic() {
        for body in [
            "",
            "garbage",
            "{",
            "[1,2]",
            "null",
            "\u{0}\u{ffff}",
            "{\"version\":\"1\"}",
        ] {
            assert!(ControlMessage::decode(body).is_err(), "{body:?} decoded");
        }
        assert!(matches!(ControlMessage::decode("nope"), Err(DecodeError::NotJson(_))));
        assert!(matches!(ControlMessage::decode("[]"), Err(DecodeError::NotAnObject)));
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (r#"{"version":1,"txn_id":"x","first_sent_at":1,"attempt":1}"#, "txn_id"),
            (r#"{"version":1,"txn_id":7,"first_sent_at":1,"attempt":1}"#, "txn_id"),
            (
                r#"{"version":1,"txn_id":"018bcfe5-6800-7000-8000-000000000000","first_sent_at":-1,"attempt":1}"#,
                "first_sent_at",
            ),
            (
                r#"{"version":1,"txn_id":"018bcfe5-6800-7000-8000-000000000000","first_sent_at":1,"attempt":0}"#,
                "attempt",
            ),
            (
                r#"{"version":1,"txn_id":"018bcfe5-6800-7000-8000-000000000000","first_sent_at":1,"attempt":1.5}"#,
                "attempt",
            ),
        ];
        for (body, expected) in cases {
            match ControlMessage::decode(body) {
                Err(DecodeError::InvalidField { field, .. }) => assert_eq!(field, expected, "{body}"),
                other => panic!("{body}: expected an invalid {expected}, got {other:?}"),
            }
        }
    }

    #[test]
    fn next_attempt_keeps_the_window() {
        let next = sample().next_attempt();
        assert_eq!(next.attempt, 4);
        assert_eq!(next.first_sent_at, sample().first_sent_at);
        assert_eq!(next.txn_id, sample().txn_id);
    }
}
