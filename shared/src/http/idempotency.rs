//! `Idempotency-Key` on mutating routes, as the IETF httpapi draft describes it.
//!
//! The first request with a key runs and commits, in the same transaction as its change,
//! the answer it gives ([`crate::request::Transaction::remember_response`]). A repeat of
//! the same request gets that answer again with `Idempotent-Replayed: true`; the same key
//! on a different request is a 422. Two concurrent requests with one key both run, but
//! only one can commit its record: the other's commit fails on the key, and it replays
//! the winner's answer ([`super::RequestScope::commit`] does that).

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
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
    // Every header as the first answer had it, a name given several values included:
    // the first value of a name replaces the default one, the next ones are added.
    let mut seen = std::collections::HashSet::new();
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            if seen.insert(name.clone()) {
                reply.headers_mut().insert(name, value);
            } else {
                reply.headers_mut().append(name, value);
            }
        }
    }
    reply.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    reply
}

#[cfg(test)]
mod tests {
    use axum::http::header::{CONTENT_TYPE, LINK};

    use super::*;

    /// A replay carries every header of the first answer, each value of a name given
    /// several, and the stored content type rather than the default one.
    #[test]
    fn a_replay_keeps_every_header_of_the_first_answer() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.append(LINK, HeaderValue::from_static("</a>; rel=\"first\""));
        headers.append(LINK, HeaderValue::from_static("</b>; rel=\"second\""));
        headers.insert("x-transaction-item", HeaderValue::from_static("ORDER%231"));
        let reply = replayed(&stored(StatusCode::CREATED, &headers, "{}"));
        assert_eq!(reply.status(), StatusCode::CREATED);
        let links: Vec<_> = reply.headers().get_all(LINK).iter().collect();
        assert_eq!(links, ["</a>; rel=\"first\"", "</b>; rel=\"second\""]);
        let types: Vec<_> = reply.headers().get_all(CONTENT_TYPE).iter().collect();
        assert_eq!(types, ["application/json"]);
        assert_eq!(reply.headers()["x-transaction-item"], "ORDER%231");
        assert_eq!(reply.headers()[REPLAYED], "true");
    }
}
