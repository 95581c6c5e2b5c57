//! The `Idempotent<T>` extractor: a request's `Idempotency-Key`, fingerprint and body,
//! for [`super::RequestScope::begin`].

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, OriginalUri, Request};
use axum::response::{IntoResponse, Response};

use super::caller::{Authentication, Caller};
use super::error::HttpError;
use super::headers::IdempotencyKeyHeader;
use super::idempotency::Idempotency;
use super::scope::RequestScope;

/// A request's idempotency, and its body as extractor `T` reads it: an extractor that
/// reads the `Idempotency-Key` header, the method, the path and the body, and hands the
/// body on to `T` ([`super::JsonBody`], `Bytes`...). Give [`Idempotent::idempotency`] to
/// [`RequestScope::begin`]: it replays a repeat, and stores the answer of a new request.
///
/// The key's record is kept under the service's name (the request path's
/// [`crate::request::Outbox::service_name`]) and the [`Caller`], so that neither services
/// sharing a table nor two callers ever share keys (a request with a key and no caller
/// the service accepts is refused, 401; a router that says nothing of callers, with no
/// [`Authentication`] extension, keeps keys by service only); the fingerprint is the method, the path as the client sent it and the
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
        // A router that says nothing of callers (no `Authentication`, no caller) keeps its
        // keys by service only; otherwise they are the caller's, and a request without the
        // caller the service requires is refused.
        let knows_callers = parts.extensions.get::<Authentication>().is_some() || Caller::of(&parts).is_some();
        let caller = if knows_callers {
            Some(
                Caller::from_request_parts(&mut parts, state)
                    .await
                    .map_err(IntoResponse::into_response)?,
            )
        } else {
            None
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
        let bytes = Bytes::from_request(copy, state)
            .await
            .map_err(|rejection| HttpError::unreadable_body(&rejection).into_response())?;
        let idempotency = Idempotency::new(
            &key_scope(caller.as_ref(), scope.outbox().service_name()),
            &key,
            &parts.method,
            &path,
            &bytes,
        );
        let body = T::from_request(Request::from_parts(parts, Body::from(bytes)), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            idempotency: Some(idempotency),
            body,
        })
    }
}

/// Where a key's record lives: the service's keys, the caller's among them when known.
fn key_scope(caller: Option<&Caller>, service: &str) -> String {
    caller.map_or_else(|| service.to_owned(), |caller| caller.key_scope(service))
}
