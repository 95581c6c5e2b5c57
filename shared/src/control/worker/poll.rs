//! The local poller as `control-worker poll` runs it: long polls of the control queue,
//! each batch through the control path, its metrics emitted, until shutdown.

use std::future::Future;
use std::time::Duration;

use crate::control::poller::{self, PollerStats};

use super::batch_metrics;
use super::setup::Worker;

/// How long one receive waits for messages: SQS's longest long poll, so that an idle
/// queue costs three receives a minute. The receive's own timeout outlasts it
/// ([`crate::aws::receive_timeouts`]).
pub const LONG_POLL_WAIT: Duration = Duration::from_secs(20);

/// Polls `worker`'s control queue until `shutdown` completes; returns what it did.
pub async fn run(worker: &Worker, shutdown: impl Future<Output = ()>) -> PollerStats {
    tracing::info!(queue = %worker.control_queue_url, "polling the control queue");
    poller::run(
        worker.control_queue.as_ref(),
        &worker.control,
        LONG_POLL_WAIT,
        shutdown,
        |report| batch_metrics::for_batch(report, worker.clock.now()).emit(),
    )
    .await
}
