//! The local poller: what a Lambda event source mapping does for the control worker,
//! done by hand against a [`ControlInbox`] (the embedded queue, or SQS outside Lambda).
//!
//! One cycle receives a batch under a lease ([`crate::control::lease`]), hands it to the
//! [`ControlPath`] while renewing the lease, deletes exactly the messages that were
//! handled, and brings the failed ones back in seconds ([`crate::control::redelivery`]);
//! their receive count (and the dead-letter policy) keeps meaning something. A batch's
//! messages finish together (one read, one publishing pass, one mark for all), so they
//! are acknowledged together, when each is done.

use std::future::Future;
use std::time::Duration;

use crate::control::lease::{while_renewing, Held, LEASE};
use crate::control::redelivery::retry_failed_soon;
use crate::control::{BatchReport, ControlPath};
use crate::ports::{ControlDelivery, ControlInbox, QueueError};

/// Most messages one receive asks for (SQS's limit).
pub const MAX_BATCH: usize = 10;
/// The pause after the first failed receive; doubled after each further one in a row.
pub const FIRST_RECEIVE_BACKOFF: Duration = Duration::from_millis(250);
/// The longest pause between two failed receives.
pub const MAX_RECEIVE_BACKOFF: Duration = Duration::from_secs(5);

/// Receives one batch (waiting up to `wait` for it) under a [`LEASE`], handles it, and
/// acknowledges the messages that succeeded. Returns the batch's report; an empty one
/// when nothing came.
pub async fn poll_once(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    wait: Duration,
) -> Result<BatchReport, QueueError> {
    let deliveries = inbox.receive(MAX_BATCH, wait, LEASE).await?;
    process(inbox, control, &deliveries, LEASE).await
}

/// Handles `deliveries`, received under `lease`, renewing the lease while they are
/// handled; acknowledges the ones that succeeded and makes the failed ones come back
/// soon.
pub async fn process(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    deliveries: &[ControlDelivery],
    lease: Duration,
) -> Result<BatchReport, QueueError> {
    if deliveries.is_empty() {
        return Ok(BatchReport::default());
    }
    let held = Held::new(deliveries.iter().map(|delivery| delivery.receipt.clone()));
    let report = while_renewing(
        control.handle_batch(deliveries),
        &held,
        lease,
        control.clock(),
        |receipts| async move { inbox.set_visibility(&receipts).await },
    )
    .await;
    acknowledge(inbox, deliveries, report).await
}

/// What a poller does with a handled batch: acknowledges the messages that succeeded
/// and makes the failed ones come back soon ([`process`] without the lease, for a caller
/// that keeps time by itself).
pub async fn acknowledge(
    inbox: &dyn ControlInbox,
    deliveries: &[ControlDelivery],
    report: BatchReport,
) -> Result<BatchReport, QueueError> {
    let failed = report.failed_message_ids();
    let handled: Vec<String> = deliveries
        .iter()
        .filter(|delivery| !failed.contains(&delivery.message_id.as_str()))
        .map(|delivery| delivery.receipt.clone())
        .collect();
    retry_failed_soon(inbox, deliveries, &report).await;
    if !handled.is_empty() {
        // If this fails the messages come back and are handled again, which the control
        // path makes harmless.
        inbox.ack(&handled).await?;
    }
    Ok(report)
}

/// What a poller did until it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollerStats {
    /// Receives that returned, empty or not.
    pub receives: u64,
    /// Receives or acknowledgements that failed.
    pub failures: u64,
    /// Control messages handled (successfully or not).
    pub messages: u64,
}

/// The pause after `failures_in_a_row` failed cycles: [`FIRST_RECEIVE_BACKOFF`] doubled
/// per further failure, at most [`MAX_RECEIVE_BACKOFF`]. Short, so that a blip of the
/// queue service costs a moment, not a whole long poll.
pub fn receive_backoff(failures_in_a_row: u32) -> Duration {
    let doublings = failures_in_a_row.saturating_sub(1).min(16);
    FIRST_RECEIVE_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_RECEIVE_BACKOFF)
}

/// Polls until `shutdown` completes, each batch received under `lease` (the control
/// queue's own visibility timeout, as the worker reads it), calling `on_batch` with each
/// batch's report. A shutdown interrupts only the wait for messages: a batch in hand is
/// always finished and acknowledged first. A failed receive is logged and retried after a
/// short backoff ([`receive_backoff`]).
pub async fn run(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    wait: Duration,
    lease: Duration,
    shutdown: impl Future<Output = ()>,
    on_batch: impl FnMut(&BatchReport),
) -> PollerStats {
    let stats = poll_loop(
        || inbox.receive(MAX_BATCH, wait, lease),
        |deliveries| async move { process(inbox, control, &deliveries, lease).await },
        |report: &BatchReport| report.items.is_empty(),
        shutdown,
        on_batch,
        "the control queue",
    )
    .await;
    tracing::info!(?stats, "control poller stopped");
    stats
}

/// The loop of a poller (the control worker's, a consumer's): receive, interrupted only
/// by `shutdown`; hand each batch to `process`; report the non-empty ones to `on_batch`;
/// after a failed cycle, pause ([`receive_backoff`]) and try again.
pub(crate) async fn poll_loop<D, R, Received, Processed>(
    mut receive: impl FnMut() -> Received,
    mut process: impl FnMut(Vec<D>) -> Processed,
    is_empty: impl Fn(&R) -> bool,
    shutdown: impl Future<Output = ()>,
    mut on_batch: impl FnMut(&R),
    queue: &str,
) -> PollerStats
where
    Received: Future<Output = Result<Vec<D>, QueueError>>,
    Processed: Future<Output = Result<R, QueueError>>,
{
    tokio::pin!(shutdown);
    let mut stats = PollerStats::default();
    let mut failures_in_a_row = 0;
    loop {
        let received = tokio::select! {
            () = &mut shutdown => break,
            received = receive() => received,
        };
        let result = match received {
            Ok(deliveries) => {
                stats.receives += 1;
                stats.messages += deliveries.len() as u64;
                process(deliveries).await
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(report) => {
                failures_in_a_row = 0;
                if !is_empty(&report) {
                    on_batch(&report);
                }
            }
            Err(error) => {
                stats.failures += 1;
                failures_in_a_row += 1;
                let pause = receive_backoff(failures_in_a_row);
                tracing::warn!(error = %error, retry_in_ms = pause.as_millis() as u64, "polling {queue} failed; retrying");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_receive_is_retried_within_seconds_not_a_long_poll() {
        let pauses: Vec<u128> = (1..=7).map(|n| receive_backoff(n).as_millis()).collect();
        assert_eq!(pauses, [250, 500, 1000, 2000, 4000, 5000, 5000]);
    }
}
