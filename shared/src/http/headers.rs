//! The request headers of the protocol's HTTP side: `Idempotency-Key` (IETF httpapi
//! draft) and `If-Match` (RFC 9110), as axum extractors that refuse a malformed header
//! with a 400 problem, and the ETag of a version.
//!
//! Each rule is also stated as a pattern ([`IDEMPOTENCY_KEY_PATTERN`],
//! [`IF_MATCH_PATTERN`]) for an API's OpenAPI document; the tests hold the hand-written
//! checks to them.

use axum::extract::FromRequestParts;
use axum::http::header::IF_MATCH;
use axum::http::request::Parts;

use super::error::HttpError;
use crate::protocol::IdempotencyKey;

/// The `Idempotency-Key` header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The `Idempotency-Key` header's rule, as an ECMA-262 pattern: a key of 1 to 255
/// printable ASCII characters, bare or as a structured-field string (in double quotes,
/// which are not part of the key). A bare key neither starts nor ends with a space: HTTP
/// would strip it.
pub const IDEMPOTENCY_KEY_PATTERN: &str = "^(\"[ -~]{1,255}\"|[!-~]([ -~]{0,253}[!-~])?)$";

/// The `If-Match` header's rule, as an ECMA-262 pattern: `*`, or one ETag, strong or
/// weak, of a version of at most 19 digits (so that every one fits a `u64`).
pub const IF_MATCH_PATTERN: &str = "^(\\*|(W/)?\"[0-9]{1,19}\")$";

fn printable(byte: u8) -> bool {
    (b' '..=b'~').contains(&byte)
}

/// The key an `Idempotency-Key` value carries, if it follows [`IDEMPOTENCY_KEY_PATTERN`].
pub fn parse_idempotency_key(value: &[u8]) -> Option<IdempotencyKey> {
    let key = match value {
        [b'"', inner @ .., b'"'] if !inner.is_empty() => inner,
        bare => {
            let (first, last) = (bare.first()?, bare.last()?);
            if *first == b' ' || *last == b' ' {
                return None;
            }
            bare
        }
    };
    if key.len() > 255 || !key.iter().copied().all(printable) {
        return None;
    }
    std::str::from_utf8(key).ok()?.parse().ok()
}

/// The `Idempotency-Key` header, when sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKeyHeader(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get(IDEMPOTENCY_KEY) {
            None => Ok(Self(None)),
            Some(value) => parse_idempotency_key(value.as_bytes())
                .map(|key| Self(Some(key)))
                .ok_or_else(|| HttpError::InvalidHeader {
                    header: "Idempotency-Key",
                    detail: "must be 1 to 255 printable ASCII characters, bare or in double quotes".into(),
                }),
        }
    }
}

/// The `If-Match` header's version, when the client sent one (`"3"`, `W/"3"` or `*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfMatch {
    /// No header.
    Absent,
    /// `*`: any existing version.
    Any,
    /// One version.
    Version(u64),
}

impl IfMatch {
    /// The precondition an `If-Match` value states, if it follows [`IF_MATCH_PATTERN`].
    pub fn parse(value: &[u8]) -> Option<Self> {
        if value == b"*" {
            return Some(Self::Any);
        }
        let tag = value.strip_prefix(b"W/").unwrap_or(value);
        let digits = tag.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok().map(Self::Version)
    }

    /// Whether `version` satisfies the precondition.
    pub fn allows(self, version: u64) -> bool {
        match self {
            Self::Absent | Self::Any => true,
            Self::Version(expected) => expected == version,
        }
    }

    /// Whether the client asked for a precondition.
    pub fn is_present(self) -> bool {
        self != Self::Absent
    }
}

/// The strong ETag of a version: `"3"`.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get(IF_MATCH) {
            None => Ok(Self::Absent),
            Some(value) => Self::parse(value.as_bytes()).ok_or_else(|| HttpError::InvalidHeader {
                header: "If-Match",
                detail: "must be * or an ETag such as \"3\"".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_read_bare_or_quoted() {
        let key = |text: &str| parse_idempotency_key(text.as_bytes()).map(|key| key.as_str().to_owned());
        assert_eq!(key("k-1").as_deref(), Some("k-1"));
        assert_eq!(key("\"k 1\"").as_deref(), Some("k 1"));
        assert_eq!(key("a b").as_deref(), Some("a b"));
        // Two quotes around nothing are no structured-field string: the key is the quotes.
        assert_eq!(key("\"\"").as_deref(), Some("\"\""));
        assert_eq!(key(&"x".repeat(255)).map(|k| k.len()), Some(255));
        for bad in [
            "",
            " k",
            "k ",
            "é",
            "k\u{7f}",
            &"x".repeat(256),
            &format!("\"{}\"", "x".repeat(256)),
        ] {
            assert_eq!(key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn if_match_is_a_star_or_one_etag_of_a_u64() {
        assert_eq!(IfMatch::parse(b"*"), Some(IfMatch::Any));
        assert_eq!(IfMatch::parse(b"\"3\""), Some(IfMatch::Version(3)));
        assert_eq!(IfMatch::parse(b"W/\"3\""), Some(IfMatch::Version(3)));
        for bad in [
            &b"3"[..],
            b"\"\"",
            b"\"+3\"",
            b" \"3\"",
            b"\"99999999999999999999\"",
            b"\"3\", \"4\"",
        ] {
            assert_eq!(IfMatch::parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(IfMatch::Version(3).allows(3) && !IfMatch::Version(3).allows(4));
        assert_eq!(etag(3), "\"3\"");
    }
}
