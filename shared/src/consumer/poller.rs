//! The local poller: what a Lambda event source mapping does for a consumer, done by hand
//! against an [`Inbox`] (an embedded queue, or SQS outside Lambda).
//!
//! One cycle receives a batch, hands it to the [`Consumer`], and deletes exactly the
//! messages that succeeded; the failed ones come back after the queue's visibility
//! timeout and count toward its dead-letter policy.

use std::future::Future;
use std::time::Duration;

use super::{BatchReport, Consumer, Delivery};
use crate::control::poller::{poll_loop, PollerStats, MAX_BATCH};
use crate::ports::{Inbox, QueueError};

/// Receives one batch (waiting up to `wait` for it), processes it, and acknowledges the
/// messages that succeeded. Returns the batch's report; an empty one when nothing came.
pub async fn poll_once(inbox: &dyn Inbox, consumer: &Consumer, wait: Duration) -> Result<BatchReport, QueueError> {
    let deliveries = inbox.receive(MAX_BATCH, wait).await?;
    process(inbox, consumer, &deliveries).await
}

async fn process(inbox: &dyn Inbox, consumer: &Consumer, deliveries: &[Delivery]) -> Result<BatchReport, QueueError> {
    if deliveries.is_empty() {
        return Ok(BatchReport::default());
    }
    let report = consumer.consume_batch(deliveries).await;
    let failed = report.failed_message_ids();
    let handled: Vec<String> = deliveries
        .iter()
        .filter(|delivery| !failed.contains(&delivery.message_id.as_str()))
        .map(|delivery| delivery.receipt.clone())
        .collect();
    if !handled.is_empty() {
        // If this fails the messages come back, and their records make that harmless.
        inbox.ack(&handled).await?;
    }
    Ok(report)
}

/// Polls until `shutdown` completes, calling `on_batch` with each batch's report. A
/// shutdown interrupts only the wait for messages: a batch in hand is always finished
/// and acknowledged first. A failed receive is logged and retried after a short backoff.
pub async fn run(
    inbox: &dyn Inbox,
    consumer: &Consumer,
    wait: Duration,
    shutdown: impl Future<Output = ()>,
    on_batch: impl FnMut(&BatchReport),
) -> PollerStats {
    let stats = poll_loop(
        || inbox.receive(MAX_BATCH, wait),
        |deliveries| async move { process(inbox, consumer, &deliveries).await },
        |report: &BatchReport| report.items.is_empty(),
        shutdown,
        on_batch,
        "the source queue",
    )
    .await;
    tracing::info!(?stats, consumer = %consumer.name(), "consumer poller stopped");
    stats
}
