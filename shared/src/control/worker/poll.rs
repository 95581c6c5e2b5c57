//! The local poller as `control-worker poll` runs it: long polls of the control queue,
//! each batch through the control path, its metrics emitted, until shutdown.

use std::future::Future;
use std::time::Duration;

use crate::control::lease::LEASE;
use crate::control::poller::{self, PollerStats};

use super::batch_metrics;
use super::setup::Worker;

/// How long one receive waits for messages: SQS's longest long poll, so that an idle
/// queue costs three receives a minute. The receive's own timeout outlasts it
/// ([`crate::aws::receive_timeouts`]).
pub const LONG_POLL_WAIT: Duration = Duration::from_secs(20);

/// Polls `worker`'s control queue until `shutdown` completes; returns what it did. Each
/// message is leased for the queue's own visibility timeout (read once; [`LEASE`] when
/// it cannot be read), renewed while it is handled.
pub async fn run(worker: &Worker, shutdown: impl Future<Output = ()>) -> PollerStats {
    let lease = match crate::aws::queue_visibility_timeout(&worker.clients.sqs, &worker.control_queue_url).await {
        Ok(visibility) => visibility.max(Duration::from_secs(1)),
        Err(error) => {
            tracing::warn!(error = %error, lease_s = LEASE.as_secs(), "could not read the control queue's visibility timeout; leasing messages for the default");
            LEASE
        }
    };
    tracing::info!(queue = %worker.control_queue_url, lease_s = lease.as_secs(), "polling the control queue");
    poller::run(
        worker.control_queue.as_ref(),
        &worker.control,
        LONG_POLL_WAIT,
        lease,
        shutdown,
        |report| batch_metrics::for_batch(report, worker.clock.now()).emit(),
    )
    .await
}
