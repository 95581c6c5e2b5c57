//! When a control message that failed comes back: in seconds, with a backoff by its
//! receive count, instead of after the queue's whole visibility timeout.
//!
//! The Lambda handler (partial batch response) and the local poller (no delete) both
//! leave a failed message in the queue, and SQS shows it again only once its visibility
//! timeout runs out, which must be at least six times the worker's timeout: minutes.
//! Shortening the visibility of exactly the failed messages makes a transient failure
//! cost seconds. The dead-letter policy keeps its meaning: every return is one more
//! receive, and the delays grow so that the control queue's `maxReceiveCount` of 10
//! spans [`BEFORE_DEAD_LETTER`] of continuous failure before a message is set aside.

use std::time::Duration;

use crate::control::lease::report_lost_leases;
use crate::control::BatchReport;
use crate::ports::{Clock, ControlDelivery, ControlInbox};

/// The delay after a message's first failed receive.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest delay between two receives of a failing message.
pub const MAX_RETRY: Duration = Duration::from_secs(300);
pub use crate::ports::CONTROL_MAX_RECEIVE_COUNT as MAX_RECEIVE_COUNT;
/// How long a message that fails every time stays in the control queue: the sum of the
/// delays after each of its [`MAX_RECEIVE_COUNT`] receives (2 s doubling, capped at
/// 5 min: 2 + 4 + … + 256 + 300 + 300 s, about 18.5 minutes).
pub const BEFORE_DEAD_LETTER: Duration = Duration::from_secs(1110);

/// The visibility to give a message that failed on its `receive_count`-th receive:
/// [`FIRST_RETRY`] doubled per earlier receive, at most [`MAX_RETRY`].
pub fn retry_delay(receive_count: u32) -> Duration {
    let doublings = receive_count.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// Shortens the visibility of the messages of `deliveries` that `report` says failed.
/// If that fails the messages still come back, after the visibility timeout; it is
/// logged, never an error of the batch.
pub async fn retry_failed_soon(
    inbox: &dyn ControlInbox,
    deliveries: &[ControlDelivery],
    report: &BatchReport,
    clock: &dyn Clock,
) {
    let failed = report.failed_message_ids();
    let receipts: Vec<(String, Duration)> = deliveries
        .iter()
        .filter(|delivery| failed.contains(&delivery.message_id.as_str()))
        .map(|delivery| (delivery.receipt.clone(), retry_delay(delivery.receive_count)))
        .collect();
    if receipts.is_empty() {
        return;
    }
    match inbox.set_visibility(&receipts).await {
        // Failed and not acknowledged: one no longer held had its lease run out.
        Ok(gone) => report_lost_leases(gone.len(), "control-worker", clock),
        Err(error) => tracing::warn!(
            error = %error,
            messages = receipts.len(),
            "could not shorten the visibility of failed control messages; they come back after the visibility timeout"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_seconds_and_outlast_a_quarter_hour_before_the_dead_letter_queue() {
        let delays: Vec<u64> = (1..=MAX_RECEIVE_COUNT).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(delays.iter().sum::<u64>(), BEFORE_DEAD_LETTER.as_secs());
        assert_eq!(retry_delay(0), FIRST_RETRY);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY);
    }
}
