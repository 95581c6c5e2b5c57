//! Extractors that turn bad input into the API's problem responses: path parameters, and
//! a JSON body that names the failing field. (`If-Match` and `Idempotency-Key` come from
//! [`outbox::http::headers`].)

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, FieldError};
use crate::strict::Object;

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

/// A JSON body of type `T`, with its raw bytes. Not JSON → 400; JSON of the wrong shape or
/// types → 422 naming the field; not `application/json` → 415; over the body limit → 413.
///
/// `T` is read from a JSON object only ([`crate::strict::Object`]), as the document says
/// of every body; the rules within `T` are serde attributes ([`crate::strict`]).
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
        // Syntax first (400), then the shape (422). A field given twice has already taken
        // its last value, as in most JSON parsers.
        let value: Value = serde_json::from_slice(&raw)
            .map_err(|error| ApiError::MalformedBody(strip_position(&error.to_string())))?;
        match serde_path_to_error::deserialize::<_, Object<T>>(value) {
            Ok(Object(value)) => Ok(Self { value, raw }),
            Err(error) => {
                let path = error.path().to_string();
                let field = if path == "." { "body".to_owned() } else { path };
                Err(ApiError::Validation(vec![FieldError::new(
                    field,
                    error.into_inner().to_string(),
                )]))
            }
        }
    }
}

/// serde_json's messages end in " at line L column C": useful, but only after the text.
fn strip_position(message: &str) -> String {
    message.split(" at line ").next().unwrap_or(message).to_owned()
}
