//! Extractors that turn bad input into the API's problem responses: path parameters, and
//! a JSON body that names the failing field. (`If-Match` and `Idempotency-Key` come from
//! [`outbox::http::headers`].)

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
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

/// A JSON body of type `T`, with its raw bytes: the library's [`outbox::http::JsonBody`]
/// (not JSON → 400; JSON of the wrong shape or types → 422 naming the field; not
/// `application/json` → 415; over the body limit → 413), read from a JSON object only
/// ([`crate::strict::Object`]), as the document says of every body; the rules within `T`
/// are serde attributes ([`crate::strict`]).
pub struct JsonBody<T> {
    /// The parsed body.
    pub value: T,
    /// The bytes as received.
    pub raw: Bytes,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let outbox::http::JsonBody {
            value: Object(value),
            raw,
        } = outbox::http::JsonBody::<Object<T>>::from_request(request, state).await?;
        Ok(Self { value, raw })
    }
}
