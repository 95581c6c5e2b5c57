//! The control-message outbox for the HTTP boundary of serverless functions.
//!
//! An API handler begins a [`request::Transaction`], which sends a delayed control
//! message naming the transaction; it then reads, decides, stages business writes and
//! emits messages, and commits everything with an outbox record in one atomic write.
//! When the control message arrives, the [`control::ControlPath`] publishes the
//! committed messages, or tombstones the transaction so that a late commit fails.
//!
//! # Layout
//!
//! - [`protocol`]: ids, the control message and its encoding, outgoing messages, the
//!   outbox and idempotency records. Pure data.
//! - [`ports`]: the traits for the store, the control queue, the publisher and the clock.
//! - [`request`]: the request path. [`native`]: the application's own DynamoDB actions
//!   in its commits. [`control`]: the control path, with its poller, the redelivery of
//!   failed control messages and (feature `worker`) the control worker's Lambda handler
//!   and set-up. [`publish`]: batching and retrying sends, shared by every publisher.
//! - [`prelude`]: one `use` for a service's handlers and consumers.
//! - [`settings`]: configuration from the environment, validated.
//! - [`embedded`]: the in-process backend. [`aws`]: the DynamoDB and SQS adapters.
//!   [`wiring`]: the paths' ports from either backend.
//! - [`time`]: the protocol's timestamps.
//! - `logging` (feature `logging`): one logging set-up for the binaries, honouring
//!   Lambda's advanced logging controls.
//! - [`telemetry`]: the trace context each message carries from the span that emitted
//!   it, and the spans that continue it; with feature `otel`, spans exported over OTLP.
//! - `http` (feature `axum`): the glue for axum handlers: problem+json answers,
//!   `Idempotency-Key`, `If-Match`, each request's deadline (from the Lambda context with
//!   feature `lambda`).
//! - `testing` (feature `testing`): a service under test in the test's process, its
//!   routes called, its consumers drained, its items read.

#![warn(missing_docs)]

pub mod aws;
pub mod consumer;
pub mod control;
pub mod counter;
pub mod destination;
mod earlier;
pub mod embedded;
pub mod event_detail;
#[cfg(feature = "axum")]
pub mod http;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metrics;
pub mod native;
pub mod ports;
pub mod prelude;
pub mod protocol;
pub mod publish;
pub mod request;
#[cfg(feature = "service")]
pub mod service;
pub mod settings;
pub mod staging;
pub mod telemetry;
#[cfg(test)]
mod test_log;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod wiring;

/// The README's examples, compiled as doc tests so that they cannot rot (with the
/// one-call service, which brings the HTTP glue and the consumer they use).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "service"))]
pub struct ReadmeDoctests;

/// The guide's examples (`docs/GUIDE.md`), compiled as doc tests too (with the test
/// harness, which brings the one-call service). Only under `doctest`: `docs/` is not in
/// the package, and nothing else reads it.
#[doc = include_str!("../../docs/GUIDE.md")]
#[cfg(all(doctest, feature = "testing"))]
pub struct GuideDoctests;
