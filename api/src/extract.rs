//! Extractors that turn bad input into the API's problem responses: path parameters, a
//! JSON body that names the failing field, and the `If-Match` and `Idempotency-Key`
//! headers.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{CONTENT_TYPE, IF_MATCH};
use axum::http::request::Parts;
use axum::http::StatusCode;
use outbox::protocol::IdempotencyKey;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, FieldError};

/// A route's path parameters, as axum's `Path` reads them, except that a path it cannot
/// read (a parameter that is not UTF-8 once percent-decoded, as in `/orders/%FF`) is a
/// 400 problem like every other error, not axum's plain-text rejection.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// A JSON body of type `T`, with its raw bytes (for the idempotency fingerprint).
/// Not JSON → 400; JSON of the wrong shape or types → 422 naming the field; not
/// `application/json` → 415; over the body limit → 413.
pub struct JsonBody<T> {
    /// The parsed body.
    pub value: T,
    /// The bytes as received.
    pub raw: Bytes,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|media| {
                let media = media.trim().to_ascii_lowercase();
                media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
            });
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let raw = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| match rejection {
                BytesRejection::FailedToBufferBody(ref failed) if failed.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::PayloadTooLarge
                }
                other => ApiError::MalformedBody(other.body_text()),
            })?;
        let deserializer = &mut serde_json::Deserializer::from_slice(&raw);
        match serde_path_to_error::deserialize::<_, T>(deserializer) {
            Ok(value) => Ok(Self { value, raw }),
            Err(error) => {
                let path = error.path().to_string();
                let inner = error.into_inner();
                if inner.is_data() {
                    let field = if path == "." { "body".to_owned() } else { path };
                    Err(ApiError::Validation(vec![FieldError::new(
                        field,
                        strip_position(&inner.to_string()),
                    )]))
                } else {
                    Err(ApiError::MalformedBody(strip_position(&inner.to_string())))
                }
            }
        }
    }
}

/// serde_json's messages end in " at line L column C": useful, but only after the text.
fn strip_position(message: &str) -> String {
    message.split(" at line ").next().unwrap_or(message).to_owned()
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

/// The ETag of a version.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IF_MATCH) else {
            return Ok(Self::Absent);
        };
        let invalid = || ApiError::InvalidHeader {
            header: "If-Match",
            detail: "must be * or an ETag such as \"3\"".into(),
        };
        let text = value.to_str().map_err(|_| invalid())?.trim();
        if text == "*" {
            return Ok(Self::Any);
        }
        let tag = text.strip_prefix("W/").unwrap_or(text);
        let version = tag
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .and_then(|t| t.parse().ok());
        version.map(Self::Version).ok_or_else(invalid)
    }
}

/// The `Idempotency-Key` header, when sent.
pub struct IdempotencyHeader(pub Option<IdempotencyKey>);

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_KEY) else {
            return Ok(Self(None));
        };
        let invalid = |detail: String| ApiError::InvalidHeader {
            header: "Idempotency-Key",
            detail,
        };
        let text = value.to_str().map_err(|_| invalid("must be printable ASCII".into()))?;
        // The draft makes the key a structured-field string: accept it quoted or bare.
        let text = text
            .trim()
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(text.trim());
        text.parse::<IdempotencyKey>()
            .map(|key| Self(Some(key)))
            .map_err(|error| invalid(error.to_string()))
    }
}
