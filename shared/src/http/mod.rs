//! The HTTP glue every service on the outbox needs, for axum handlers (feature `axum`;
//! the Lambda deadline needs feature `lambda`, the OpenAPI schemas feature `openapi`):
//!
//! - [`problem`]: RFC 9457 `application/problem+json` answers, and the one mapping from a
//!   [`TxnError`](crate::request::TxnError) to its status (409, 412, 422, 503 with
//!   `Retry-After`), always naming the transaction once one began.
//! - [`caller`]: who calls ([`Caller`]): the issuer and subject the front door verified
//!   (a JWT, IAM or Lambda authorizer), with its scopes, or the development caller where
//!   sign-in is off.
//! - [`authorization`]: [`RequireScope`], the route layer that serves only callers
//!   granted the route's scope, whatever path or front-door route brought the request.
//! - `paths` (feature `lambda`): paths with dot segments or encoded slashes refused
//!   before routing, since the front door and the function could route them apart.
//! - [`headers`]: the `Idempotency-Key` and `If-Match` extractors, and ETags.
//! - [`idempotency`] and `idempotent`: the [`Idempotent`] extractor (a request's key and fingerprint, from
//!   its method, path and body), the stored answer's replay.
//! - [`scope`]: each request's deadline (the Lambda invocation's, or a timeout) as a
//!   middleware, and the request's transaction from `begin` to the answer, so that even a
//!   timeout names it.
//! - `stage` (feature `lambda`): API Gateway's stage taken off the path before routing
//!   and put back in front of a `Location`.
//! - `lambda` (feature `lambda`): the router on Lambda, with an internal extension that
//!   holds the environment until publishing after the answer is done.
//! - `compression` (feature `lambda`): no compressed answer to a request that came
//!   through a REST API, which would hand the client base64 text.
//! - [`status`]: the ready `GET /transactions/{id}` route, for clients answered a 503.
//! - [`consumers`]: a route that shows what an in-order consumer did with one entity's
//!   chain, for the service to mount behind its operators' sign-in.
//! - `retry`: [`RequestScope::retry_conflicts`], a handler's step run again on a version
//!   conflict.
//! - [`request_id`]: the request's id as API Gateway gave it, so that the service's log
//!   and the access log name a request alike.
//! - [`trace`]: the trace a request continues (`traceparent`, or X-Ray's header), which
//!   its span takes as parent.
//! - [`HttpError`]: what these pieces fail with, answered as problem+json.
//!
//! A handler with native DynamoDB actions, from request to answer:
//!
//! ```no_run
//! use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
//! use axum::body::Bytes;
//! use axum::http::StatusCode;
//! use axum::response::Response;
//! use outbox::http::{Answer, Begun, HttpError, Idempotent, RequestScope};
//! use outbox::protocol::Message;
//!
//! async fn reserve(scope: RequestScope, Idempotent { idempotency, body }: Idempotent<Bytes>)
//!     -> Result<Response, HttpError> {
//!     let mut txn = match scope.begin_native(idempotency).await? {
//!         Begun::Replay(first_answer) => return Ok(first_answer),
//!         Begun::Started(txn) => txn,
//!     };
//!     let sku = AttributeValue::S("PRODUCT#1".into());
//!     let update = Update::builder().table_name("shop").key("PK", sku.clone()).key("SK", sku)
//!         .update_expression("ADD reserved :one").condition_expression("attribute_exists(PK)")
//!         .expression_attribute_values(":one", AttributeValue::N("1".into()))
//!         .build().expect("a complete update");
//!     txn.action(TransactWriteItem::builder().update(update).build());
//!     let event = serde_json::json!({"type": "Reserved", "sku": "PRODUCT#1"});
//!     txn.emit(Message::json("events".parse().expect("a destination"), &event).expect("JSON"));
//!     let answer = Answer::json(StatusCode::CREATED, &serde_json::json!({"reserved": 1}));
//!     scope.commit(txn, answer).await
//! }
//! ```

mod answer;
pub mod authorization;
pub mod caller;
mod command;
#[cfg(feature = "lambda")]
pub mod compression;
pub mod consumers;
mod error;
pub mod headers;
pub mod idempotency;
mod idempotent;
mod json;
#[cfg(feature = "lambda")]
pub mod lambda;
#[cfg(feature = "lambda")]
pub mod paths;
pub mod problem;
mod progress;
pub mod request_id;
mod retry;
pub mod scope;
#[cfg(feature = "lambda")]
pub mod stage;
pub mod status;
pub mod trace;
pub mod unrouted;

pub use authorization::RequireScope;
pub use caller::{Authentication, Caller, Scopes};
pub use command::{key_for, Command, KEY_ID_MAX};
#[cfg(feature = "lambda")]
pub use compression::UncompressedThroughRestApiLayer;
pub use error::HttpError;
pub use headers::{etag, IdempotencyKeyHeader, IfMatch};
pub use idempotency::Idempotency;
pub use idempotent::Idempotent;
pub use json::JsonBody;
pub use problem::{encode_item_key, FieldError, Problem, TRANSACTION_ID_HEADER, TRANSACTION_ITEM_HEADER};
pub use retry::RETRY_PAUSE_CAP;
pub use scope::{enforce_deadline, Answer, Begun, Deadlines, Progress, RequestScope};
#[cfg(feature = "lambda")]
pub use stage::serve_under_stage;
pub use unrouted::problem_for_unrouted;
