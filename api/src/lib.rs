//! The REST API: an order service on the control-message outbox, served on Lambda
//! through `lambda_http` and locally through a tokio listener.
//!
//! # Layout
//!
//! - [`app`]: the router and its layers, built once. [`deadline`]: each request's
//!   deadline, and answers that name the transaction when time runs out.
//! - [`orders`]: the example domain and its handlers, written against the public API of
//!   the outbox library the way a user's own handlers would be.
//! - [`transactions`]: the status of a transaction, for ambiguous answers.
//! - [`idempotency`]: `Idempotency-Key` replay. [`extract`]: input that fails cleanly.
//! - [`rules`]: the input rules, written once for the checks and the document.
//! - [`error`]: the one error type and its RFC 9457 mapping. [`openapi`]: the document.
//! - [`runtime`]: from settings to a running service (embedded with its own worker, or
//!   AWS).

pub mod app;
pub mod deadline;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod openapi;
pub mod orders;
pub mod rules;
pub mod runtime;
pub mod state;
pub mod transactions;
