//! The REST API: an order service on the control-message outbox, served on Lambda
//! through `lambda_http` and locally through a tokio listener.
//!
//! It is the guided tour of the library: the request's deadline, its transaction from
//! `begin` to the answer, `Idempotency-Key`, `If-Match` and every problem+json answer
//! about a transaction come from [`outbox::http`]; what is left here is the order domain
//! and its document.
//!
//! # Layout
//!
//! - [`app`]: the router and its layers, built once.
//! - [`orders`]: the example domain and its handlers, written against the public API of
//!   the outbox library the way a user's own handlers would be.
//! - [`transactions`]: the status of a transaction, for ambiguous answers.
//! - [`extract`]: path parameters and JSON bodies that fail cleanly; [`strict`]: the
//!   document's rules serde's derive would not keep, as attributes.
//! - [`rules`]: the input rules, written once for the checks and the document.
//! - [`error`]: the one error type and its RFC 9457 mapping. [`openapi`]: the document.
//! - [`runtime`]: from settings to a running service (embedded with its own worker, or
//!   AWS).

pub mod app;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod orders;
pub mod rules;
pub mod runtime;
pub mod state;
pub mod strict;
pub mod transactions;
