//! `Idempotency-Key` on the mutating routes, as the IETF httpapi draft describes it.
//!
//! The first request with a key runs and commits, in the same transaction as its change,
//! the response it answers with. A repeat of the same request gets that response again
//! with `Idempotent-Replayed: true`; the same key on a different request is a 422. Two
//! concurrent requests with one key both run, but only one can commit its record: the
//! other's commit fails on the key, and it replays the winner's response.

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox::protocol::{IdempotencyKey, IdempotencyRecord, IdempotencySlot, StoredResponse};
use outbox::request::Outbox;

use crate::error::ApiError;

/// The scope of every key of this API.
const SCOPE: &str = "orders-api";
/// The header on replayed responses.
pub const REPLAYED: &str = "idempotent-replayed";

/// A request's key and fingerprint.
#[derive(Debug, Clone)]
pub struct Idempotency {
    /// Where the key's record lives.
    pub slot: IdempotencySlot,
    /// What the request was.
    pub fingerprint: String,
}

impl Idempotency {
    /// The key's context for a request of `method` on `path` with `body`.
    pub fn new(key: &IdempotencyKey, method: &Method, path: &str, body: &[u8]) -> Self {
        Self {
            slot: IdempotencySlot::new(SCOPE, key),
            fingerprint: IdempotencyRecord::fingerprint_of(&[method.as_str().as_bytes(), path.as_bytes(), body]),
        }
    }

    /// The stored answer for this key: a replay when the request is the same, an error
    /// when it is not, nothing when the key is new.
    pub async fn replay(&self, outbox: &Outbox) -> Result<Option<Response>, ApiError> {
        let record = outbox
            .store()
            .get_idempotency(&self.slot)
            .await
            .map_err(ApiError::Unavailable)?;
        match record {
            None => Ok(None),
            Some(record) if record.fingerprint == self.fingerprint => Ok(Some(replayed(&record.response))),
            Some(_) => Err(ApiError::IdempotencyKeyReused),
        }
    }
}

/// What to store of a response for replay: status, the headers that matter, body.
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

fn replayed(response: &StoredResponse) -> Response {
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
