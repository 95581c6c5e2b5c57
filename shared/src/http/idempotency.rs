//! `Idempotency-Key` on mutating routes, as the IETF httpapi draft describes it.
//!
//! The first request with a key runs and commits, in the same transaction as its change,
//! the answer it gives ([`crate::request::Transaction::remember_response`]). A repeat of
//! the same request gets that answer again with `Idempotent-Replayed: true`; the same key
//! on a different request is a 422. Two concurrent requests with one key both run, but
//! only one can commit its record: the other's commit fails on the key, and it replays
//! the winner's answer ([`super::RequestScope::commit`] does that).

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, OriginalUri, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use super::headers::IdempotencyKeyHeader;
use super::scope::RequestScope;
use crate::ports::Store;
use crate::protocol::{IdempotencyKey, IdempotencyRecord, IdempotencySlot, StoredResponse};

/// The header on replayed answers.
pub const REPLAYED: &str = "idempotent-replayed";

/// A request's key and fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// Where the key's record lives.
    pub slot: IdempotencySlot,
    /// What the request was: its method, path and body.
    pub fingerprint: String,
}

impl Idempotency {
    /// The key's context for a request of `method` on `path` with `body`, within `scope`.
    pub fn new(scope: &str, key: &IdempotencyKey, method: &Method, path: &str, body: &[u8]) -> Self {
        Self {
            slot: IdempotencySlot::new(scope, key),
            fingerprint: IdempotencyRecord::fingerprint_of(&[method.as_str().as_bytes(), path.as_bytes(), body]),
        }
    }

    /// The stored answer for this key: a replay when the request is the same, an error
    /// when it is not, nothing when the key is new.
    pub async fn replay(&self, store: &dyn Store) -> Result<Option<Response>, HttpError> {
        let record = store
            .get_idempotency(&self.slot)
            .await
            .map_err(HttpError::Unavailable)?;
        match record {
            None => Ok(None),
            Some(record) if record.fingerprint == self.fingerprint => Ok(Some(replayed(&record.response))),
            Some(_) => Err(HttpError::IdempotencyKeyReused),
        }
    }
}

/// A request's idempotency, and its body as extractor `T` reads it: an extractor that
/// reads the `Idempotency-Key` header, the method, the path and the body, and hands the
/// body on to `T` (`JsonBody<T>`, `Bytes`...). Give [`Idempotent::idempotency`] to
/// [`RequestScope::begin`]: it replays a repeat, and stores the answer of a new request.
///
/// The key's record is kept under the service's name (the request path's
/// [`crate::request::Outbox::service_name`]), so that services sharing a table never
/// share keys; the fingerprint is the method, the path as the client sent it and the
/// body's bytes. Without a key the body is not buffered here.
#[derive(Debug)]
pub struct Idempotent<T> {
    /// The request's key and fingerprint, when it sent a key.
    pub idempotency: Option<Idempotency>,
    /// The body, as `T` reads it.
    pub body: T,
}

impl<S, T> FromRequest<S> for Idempotent<T>
where
    S: Send + Sync,
    T: FromRequest<S>,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let IdempotencyKeyHeader(key) = IdempotencyKeyHeader::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Some(key) = key else {
            let body = T::from_request(Request::from_parts(parts, body), state)
                .await
                .map_err(IntoResponse::into_response)?;
            return Ok(Self {
                idempotency: None,
                body,
            });
        };
        let scope = RequestScope::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let path = parts
            .extensions
            .get::<OriginalUri>()
            .map_or_else(|| parts.uri.path().to_owned(), |original| original.path().to_owned());
        // The body, buffered under the same limit as `T` would read it with.
        let mut copy = Request::new(body);
        *copy.method_mut() = parts.method.clone();
        *copy.uri_mut() = parts.uri.clone();
        *copy.version_mut() = parts.version;
        *copy.headers_mut() = parts.headers.clone();
        *copy.extensions_mut() = parts.extensions.clone();
        let bytes = Bytes::from_request(copy, state).await.map_err(|rejection| {
            let status = match &rejection {
                BytesRejection::FailedToBufferBody(failed) if failed.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    StatusCode::PAYLOAD_TOO_LARGE
                }
                _ => StatusCode::BAD_REQUEST,
            };
            HttpError::Body {
                status,
                detail: rejection.body_text(),
            }
            .into_response()
        })?;
        let idempotency = Idempotency::new(scope.outbox().service_name(), &key, &parts.method, &path, &bytes);
        let body = T::from_request(Request::from_parts(parts, Body::from(bytes)), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            idempotency: Some(idempotency),
            body,
        })
    }
}

/// What to store of an answer for replay: status, headers (those with text values), body.
pub fn stored(status: StatusCode, headers: &HeaderMap, body: &str) -> StoredResponse {
    StoredResponse {
        status: status.as_u16(),
        headers: headers
            .iter()
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect(),
        body: body.to_owned(),
    }
}

/// A stored answer, replayed.
pub fn replayed(response: &StoredResponse) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK);
    let mut reply = (status, response.body.clone()).into_response();
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            reply.headers_mut().insert(name, value);
        }
    }
    reply.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    reply
}
