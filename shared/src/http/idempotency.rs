//! `Idempotency-Key` on mutating routes, as the IETF httpapi draft describes it.
//!
//! The first request with a key runs and commits, in the same transaction as its change,
//! the answer it gives ([`crate::request::Transaction::remember_response`]). A repeat of
//! the same request gets that answer again with `Idempotent-Replayed: true`; the same key
//! on a different request is a 422. Two concurrent requests with one key both run, but
//! only one can commit its record: the other's commit fails on the key, and it replays
//! the winner's answer ([`super::RequestScope::commit`] does that).
//!
//! A refusal the service decided after the transaction began (a 4xx such as 404, 409,
//! 412 or 422: [`is_final_refusal`]) commits nothing, so the middleware keeps it under
//! the key on its own ([`Idempotency::keep_refusal`]): a repeat replays it too, whatever
//! changed since. An answer that is not final is never kept, and a repeat runs again: a
//! 5xx (an outcome unknown, a timeout, a store unavailable), a 408, 425 or 429, a
//! version conflict (contention: a repeat may pass), and a refusal given before the transaction began (a body that does not parse), as Stripe
//! keeps none for a request that failed its validation.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use crate::ports::Store;
use crate::protocol::{IdempotencyKey, IdempotencyRecord, IdempotencySlot, StoredResponse, TxnId};
use crate::time::Timestamp;

/// The largest body of a refusal kept for replays (a problem+json is far smaller); a
/// larger one is answered and not kept.
const KEPT_BODY_BYTES: usize = 64 * 1024;

/// The problem type of a commit refused for a version conflict outside `If-Match`.
const VERSION_CONFLICT: &str = "/problems/version-conflict";

/// Whether an answer is final for its key: a refusal the service decided (a 4xx), but
/// not one that a repeat may rightly answer otherwise (408, 425, 429). A 5xx never is.
pub fn is_final_refusal(status: StatusCode) -> bool {
    status.is_client_error() && !matches!(status.as_u16(), 408 | 425 | 429)
}

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

impl Idempotency {
    /// Keeps `response`, a refusal that transaction `txn_id` ended with (nothing of it
    /// committed), as the key's answer for `retention` from `now`, and returns the answer
    /// to give: this one; or the key's first, replayed, where another request under the
    /// key completed first; or [`HttpError::IdempotencyKeyReused`] where that one was a
    /// different request. A refusal that cannot be kept (the table unavailable, a body
    /// over 64 KiB) is given all the same, and a repeat runs again.
    pub async fn keep_refusal(
        &self,
        store: &dyn Store,
        txn_id: TxnId,
        now: Timestamp,
        retention: Duration,
        response: Response,
    ) -> Response {
        let (parts, body) = response.into_parts();
        // The body is the handler's, whole in memory already.
        let bytes = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(error = %error, "a refusal's body could not be read to keep it");
                let problem = "a refusal's body could not be read";
                return HttpError::Misconfigured { problem }
                    .in_transaction(txn_id)
                    .into_response();
            }
        };
        let text = std::str::from_utf8(&bytes)
            .ok()
            .filter(|text| text.len() <= KEPT_BODY_BYTES);
        // A version conflict is contention, not the service's decision: a repeat may pass.
        let contended = text
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .is_some_and(|problem| problem["type"] == VERSION_CONFLICT);
        if contended {
            return Response::from_parts(parts, Body::from(bytes));
        }
        let record = text.map(|text| IdempotencyRecord {
            slot: self.slot.clone(),
            fingerprint: self.fingerprint.clone(),
            txn_id,
            response: stored(parts.status, &parts.headers, text),
            created_at: now,
            expires_at: now.plus(retention),
        });
        let answer = Response::from_parts(parts, Body::from(bytes));
        let Some(record) = record else {
            tracing::warn!(%txn_id, "a refusal too large to keep under its idempotency key; a repeat runs again");
            return answer;
        };
        match store.put_idempotency(&record).await {
            Ok(None) => answer,
            Ok(Some(first)) if first.fingerprint == self.fingerprint => replayed(&first.response),
            Ok(Some(_)) => HttpError::IdempotencyKeyReused.into_response(),
            Err(error) => {
                tracing::warn!(%txn_id, error = %error, "keeping a refusal under its idempotency key failed; a repeat runs again");
                answer
            }
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

    #[test]
    fn a_refusal_the_service_decided_is_final_and_nothing_else() {
        for status in [400, 403, 404, 409, 412, 422] {
            assert!(is_final_refusal(StatusCode::from_u16(status).unwrap()), "{status}");
        }
        for status in [200, 201, 408, 425, 429, 500, 503, 504] {
            assert!(!is_final_refusal(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }

    /// A refusal is kept where the key holds nothing; where another request under the key
    /// completed first, its answer is given instead (replayed), or a 422 if it was another
    /// request.
    #[tokio::test]
    async fn a_refusal_is_kept_unless_the_key_has_its_first_answer_already() {
        use crate::embedded::{EmbeddedStore, ManualClock};
        use crate::ports::Clock;
        let clock = std::sync::Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let store = EmbeddedStore::new(clock.clone());
        let key: IdempotencyKey = "k".parse().unwrap();
        let request = |body: &[u8]| Idempotency::new("svc", &key, &Method::POST, "/loans/dune", body);
        let refusal = || (StatusCode::CONFLICT, "{\"type\":\"/problems/no-copy-free\"}").into_response();
        let keep = |idempotency: Idempotency| {
            let (store, now) = (&store, clock.now());
            async move {
                idempotency
                    .keep_refusal(store, TxnId::new_v7(), now, Duration::from_secs(3600), refusal())
                    .await
            }
        };
        let kept = keep(request(b"")).await;
        assert_eq!(kept.status(), StatusCode::CONFLICT);
        assert!(!kept.headers().contains_key(REPLAYED));
        let stored = store.get_idempotency(&request(b"").slot).await.unwrap().expect("kept");
        assert_eq!(stored.response.status, 409);
        // The key answered already: that answer, replayed.
        let again = keep(request(b"")).await;
        assert_eq!(again.headers()[REPLAYED], "true");
        // Under the same key, another request: refused.
        let other = keep(request(b"other")).await;
        assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
        // A version conflict is never the key's answer.
        let fresh: IdempotencyKey = "fresh".parse().unwrap();
        let contended = Idempotency::new("svc", &fresh, &Method::POST, "/loans/dune", b"");
        let conflict = crate::http::Problem::new(StatusCode::CONFLICT, "version-conflict", "Conflict").into_response();
        let answer = contended
            .keep_refusal(
                &store,
                TxnId::new_v7(),
                clock.now(),
                Duration::from_secs(3600),
                conflict,
            )
            .await;
        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert_eq!(store.get_idempotency(&contended.slot).await.unwrap(), None);
    }

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
