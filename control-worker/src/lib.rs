//! The control worker: the control path of the outbox as a Lambda handler for the
//! control queue's SQS events, and as a local poller for running without Lambda.
//!
//! # Layout
//!
//! - [`lambda`]: the SQS event handler that answers with a partial batch response.
//! - [`batch_metrics`]: a batch's report as CloudWatch Embedded Metric Format.
//! - [`poll`]: the local poller over the control queue, as the binary runs it.
//! - [`setup`]: from settings to a ready control path and control queue.

pub mod batch_metrics;
pub mod lambda;
pub mod poll;
pub mod setup;
