//! A trace's context as it travels with a transaction: W3C Trace Context (`traceparent`,
//! `tracestate`), convertible to and from X-Ray's trace header.
//!
//! A transaction's messages store the context of the span that emitted them, so that a
//! publish by the control worker, minutes later and in another process, still names the
//! request's trace (docs/PROTOCOL.md section 14). Every send carries it: the
//! [`TRACEPARENT_ATTRIBUTE`] and [`TRACESTATE_ATTRIBUTE`] message attributes, and, where
//! the service has one, X-Ray's header (SQS's `AWSTraceHeader` system attribute,
//! EventBridge's `TraceHeader`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The message attribute carrying the W3C `traceparent` of the context that emitted a
/// message (or began a transaction, on a control message).
pub const TRACEPARENT_ATTRIBUTE: &str = "traceparent";
/// The message attribute carrying the W3C `tracestate` beside it, when there is one.
pub const TRACESTATE_ATTRIBUTE: &str = "tracestate";

/// The longest `tracestate` kept: W3C's 32 list members of at most 256 characters each
/// would be 8 KB; SQS counts attributes against a message's size, so longer states are
/// dropped (the trace itself is kept).
const MAX_TRACESTATE: usize = 512;

/// One span's context: the trace it belongs to, the span, and whether it is sampled.
/// Held as its W3C `traceparent` (version 00), validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StoredContext", into = "StoredContext")]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
    tracestate: Option<String>,
}

/// A `traceparent` or X-Ray header that cannot name a span.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace context {input:?} is invalid: {rule}")]
pub struct InvalidTraceContext {
    input: String,
    rule: &'static str,
}

fn invalid(input: &str, rule: &'static str) -> InvalidTraceContext {
    InvalidTraceContext {
        input: input.chars().take(80).collect(),
        rule,
    }
}

fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0; N];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl TraceContext {
    /// The context of span `span_id` in trace `trace_id`; `None` if either is all zeros
    /// (W3C's invalid ids).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            sampled,
            tracestate: None,
        })
    }

    /// This context with `tracestate` beside it (dropped if empty or longer than 512
    /// characters, or not printable ASCII).
    pub fn with_tracestate(mut self, tracestate: Option<&str>) -> Self {
        self.tracestate = tracestate
            .map(str::trim)
            .filter(|state| !state.is_empty() && state.len() <= MAX_TRACESTATE)
            .filter(|state| state.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(str::to_owned);
        self
    }

    /// Reads a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`; a later version's
    /// first four fields, as the specification asks).
    pub fn from_traceparent(input: &str) -> Result<Self, InvalidTraceContext> {
        let text = input.trim();
        let mut fields = text.split('-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(invalid(input, "four fields separated by '-'"));
        };
        let version = hex::<1>(version).ok_or_else(|| invalid(input, "a version of 2 lowercase hex digits"))?[0];
        if version == 0xff || (version == 0 && fields.next().is_some()) {
            return Err(invalid(input, "version 00 has exactly four fields; ff is invalid"));
        }
        let trace_id = hex::<16>(trace).ok_or_else(|| invalid(input, "a trace id of 32 lowercase hex digits"))?;
        let span_id = hex::<8>(span).ok_or_else(|| invalid(input, "a span id of 16 lowercase hex digits"))?;
        let flags = hex::<1>(flags).ok_or_else(|| invalid(input, "flags of 2 lowercase hex digits"))?[0];
        Self::new(trace_id, span_id, flags & 1 == 1).ok_or_else(|| invalid(input, "ids that are not all zeros"))
    }

    /// Reads X-Ray's trace header (`Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1>`,
    /// fields in any order, others ignored). A header without `Parent` names no span: an
    /// error.
    pub fn from_xray(input: &str) -> Result<Self, InvalidTraceContext> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for field in input.split(';') {
            match field.trim().split_once('=') {
                Some(("Root", value)) => root = Some(value),
                Some(("Parent", value)) => parent = Some(value),
                Some(("Sampled", value)) => sampled = value == "1",
                _ => {}
            }
        }
        let root = root.ok_or_else(|| invalid(input, "a Root field"))?;
        let trace_id = match root.split('-').collect::<Vec<_>>()[..] {
            ["1", time, random] if time.len() == 8 && random.len() == 24 => {
                hex::<16>(&format!("{time}{random}").to_ascii_lowercase())
            }
            _ => None,
        }
        .ok_or_else(|| invalid(input, "Root=1-<8 hex digits>-<24 hex digits>"))?;
        let span_id = parent
            .and_then(|parent| hex::<8>(&parent.to_ascii_lowercase()))
            .ok_or_else(|| invalid(input, "Parent=<16 hex digits>"))?;
        Self::new(trace_id, span_id, sampled).ok_or_else(|| invalid(input, "ids that are not all zeros"))
    }

    /// The trace's id, 16 bytes.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span's id, 8 bytes.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether the trace is sampled (recorded).
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// The `tracestate` beside it, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// Its W3C `traceparent`, version 00.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// X-Ray's trace header for it: the trace id's first 8 hex digits are its `Root`'s
    /// time, as X-Ray's and OpenTelemetry's AWS propagators both map them.
    pub fn xray(&self) -> String {
        let trace = to_hex(&self.trace_id);
        format!(
            "Root=1-{}-{};Parent={};Sampled={}",
            &trace[..8],
            &trace[8..],
            to_hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// The attributes a message carries for it: `traceparent`, and `tracestate` if any.
    pub fn attributes(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        std::iter::once((TRACEPARENT_ATTRIBUTE, self.traceparent())).chain(
            self.tracestate
                .iter()
                .map(|state| (TRACESTATE_ATTRIBUTE, state.clone())),
        )
    }

    /// The context a received message carries: its `traceparent` attribute (with its
    /// `tracestate`), else an X-Ray header (SQS's `AWSTraceHeader`). `None` where neither
    /// is there or valid: an unreadable context never fails a message.
    pub fn from_message<'a>(attribute: impl Fn(&str) -> Option<&'a str>, xray: Option<&str>) -> Option<Self> {
        attribute(TRACEPARENT_ATTRIBUTE)
            .and_then(|parent| Self::from_traceparent(parent).ok())
            .map(|context| context.with_tracestate(attribute(TRACESTATE_ATTRIBUTE)))
            .or_else(|| xray.and_then(|header| Self::from_xray(header).ok()))
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

/// The stored form: the `traceparent` alone, `"00-..."`, or with its state,
/// `{"traceparent": "00-...", "tracestate": "..."}` (each message of a record stores one:
/// the shorter, the fewer of DynamoDB's 1 KB write units a record takes).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredContext {
    Parent(String),
    WithState {
        traceparent: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tracestate: Option<String>,
    },
}

impl TryFrom<StoredContext> for TraceContext {
    type Error = InvalidTraceContext;

    fn try_from(stored: StoredContext) -> Result<Self, Self::Error> {
        match stored {
            StoredContext::Parent(traceparent) => Self::from_traceparent(&traceparent),
            StoredContext::WithState {
                traceparent,
                tracestate,
            } => Ok(Self::from_traceparent(&traceparent)?.with_tracestate(tracestate.as_deref())),
        }
    }
}

impl From<TraceContext> for StoredContext {
    fn from(context: TraceContext) -> Self {
        match context.tracestate.clone() {
            None => Self::Parent(context.traceparent()),
            Some(tracestate) => Self::WithState {
                traceparent: context.traceparent(),
                tracestate: Some(tracestate),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparents_round_trip_and_bad_ones_are_refused() {
        let context = TraceContext::from_traceparent(PARENT).unwrap();
        assert_eq!(context.traceparent(), PARENT);
        assert!(context.sampled());
        assert!(!TraceContext::from_traceparent(&PARENT.replace("-01", "-00"))
            .unwrap()
            .sampled());
        // A later version's first four fields are read; version 00 has exactly four.
        assert!(TraceContext::from_traceparent(&PARENT.replacen("00-", "01-", 1).replace("-01", "-01-extra")).is_ok());
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
        ] {
            assert!(TraceContext::from_traceparent(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn xray_headers_map_to_the_same_ids() {
        let context = TraceContext::from_traceparent(PARENT).unwrap();
        let header = context.xray();
        assert_eq!(
            header,
            "Root=1-0af76519-16cd43dd8448eb211c80319c;Parent=b7ad6b7169203331;Sampled=1"
        );
        assert_eq!(TraceContext::from_xray(&header).unwrap(), context);
        // Lambda's own header: fields in another order, one more, upper-case hex.
        let lambda = "Root=1-5759E988-BD862E3FE1BE46A994272793;Sampled=0;Lineage=a:1;Parent=53995C3F42CD8AD8";
        let read = TraceContext::from_xray(lambda).unwrap();
        assert_eq!(
            read.traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
        );
        for bad in [
            "Root=1-5759e988-bd862e3fe1be46a994272793",
            "Parent=53995c3f42cd8ad8",
            "Root=2-x-y;Parent=53995c3f42cd8ad8",
        ] {
            assert!(TraceContext::from_xray(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn stored_contexts_round_trip_with_their_state() {
        let context = TraceContext::from_traceparent(PARENT)
            .unwrap()
            .with_tracestate(Some("congo=t61rcWkgMzE"));
        let json = serde_json::to_string(&context).unwrap();
        assert_eq!(
            json,
            format!(r#"{{"traceparent":"{PARENT}","tracestate":"congo=t61rcWkgMzE"}}"#)
        );
        assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), context);
        assert!(serde_json::from_str::<TraceContext>(r#"{"traceparent":"00-x"}"#).is_err());
        // Without a state, the traceparent alone; the longer form still reads.
        let plain = context.clone().with_tracestate(None);
        assert_eq!(serde_json::to_string(&plain).unwrap(), format!(r#""{PARENT}""#));
        assert_eq!(
            serde_json::from_str::<TraceContext>(&format!(r#""{PARENT}""#)).unwrap(),
            plain
        );
        let long_form = format!(r#"{{"traceparent":"{PARENT}"}}"#);
        assert_eq!(serde_json::from_str::<TraceContext>(&long_form).unwrap(), plain);
        assert!(serde_json::from_str::<TraceContext>(r#""junk""#).is_err());
        let long = "a=".to_owned() + &"b".repeat(600);
        assert_eq!(context.clone().with_tracestate(Some(&long)).tracestate(), None);
    }

    #[test]
    fn a_received_message_prefers_its_traceparent_over_its_xray_header() {
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let attributes = |name: &str| (name == TRACEPARENT_ATTRIBUTE).then_some(PARENT);
        assert_eq!(
            TraceContext::from_message(attributes, Some(xray))
                .unwrap()
                .traceparent(),
            PARENT
        );
        let none = |_: &str| None;
        assert_eq!(
            TraceContext::from_message(none, Some(xray)).unwrap().trace_id()[..4],
            [0x57, 0x59, 0xe9, 0x88]
        );
        let garbage = |name: &str| (name == TRACEPARENT_ATTRIBUTE).then_some("junk");
        assert_eq!(TraceContext::from_message(garbage, None), None);
    }
}
