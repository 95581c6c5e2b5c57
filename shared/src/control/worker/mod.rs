//! The control worker (feature `worker`): the control path of the outbox as a Lambda
//! handler for the control queue's SQS events, and as a local poller for running without
//! Lambda. The `control-worker` binary runs these with the `OUTBOX_*` settings; a service
//! that wants the worker inside its own binary calls them the same way.
//!
//! # Layout
//!
//! - [`lambda`]: the SQS event handler that answers with a partial batch response.
//! - [`batch_metrics`]: a batch's report as CloudWatch Embedded Metric Format.
//! - [`poll`]: the local poller over the control queue, as the binary runs it.
//! - [`setup`]: from settings to a ready control path and control queue.
//! - [`cli`]: the whole command line of the `control-worker` binary (the worker, redrive,
//!   release, consumer-state, bootstrap), for a binary of one line in a crate of your own.

pub mod batch_metrics;
pub mod cli;
pub mod lambda;
pub mod poll;
pub mod setup;
