//! The local poller: what a Lambda event source mapping does for the control worker,
//! done by hand against a [`ControlInbox`] (the embedded queue, or SQS outside Lambda).
//!
//! One cycle receives a batch, hands it to the [`ControlPath`], and deletes exactly the
//! messages that were handled; failed ones are left alone and come back after the
//! visibility timeout, which is how their receive count (and the dead-letter policy)
//! keeps meaning something.

use std::future::Future;
use std::time::Duration;

use crate::control::{BatchReport, ControlPath};
use crate::ports::{ControlDelivery, ControlInbox, QueueError};

/// Most messages one receive asks for (SQS's limit).
pub const MAX_BATCH: usize = 10;

/// Receives one batch (waiting up to `wait` for it), handles it, and acknowledges the
/// messages that succeeded. Returns the batch's report; an empty one when nothing came.
pub async fn poll_once(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    wait: Duration,
) -> Result<BatchReport, QueueError> {
    let deliveries = inbox.receive(MAX_BATCH, wait).await?;
    process(inbox, control, &deliveries).await
}

/// Handles received `deliveries` and acknowledges the ones that succeeded.
pub async fn process(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    deliveries: &[ControlDelivery],
) -> Result<BatchReport, QueueError> {
    if deliveries.is_empty() {
        return Ok(BatchReport::default());
    }
    let report = control.handle_batch(deliveries).await;
    let failed = report.failed_message_ids();
    let handled: Vec<String> = deliveries
        .iter()
        .filter(|delivery| !failed.contains(&delivery.message_id.as_str()))
        .map(|delivery| delivery.receipt.clone())
        .collect();
    if !handled.is_empty() {
        // If this fails the messages come back and are handled again, which the control
        // path makes harmless.
        inbox.ack(&handled).await?;
    }
    Ok(report)
}

/// Polls until `shutdown` completes, calling `on_batch` with each batch's report. A
/// shutdown interrupts only the wait for messages: a batch in hand is always finished
/// and acknowledged first. A failed receive is logged and retried after `wait`.
pub async fn run(
    inbox: &dyn ControlInbox,
    control: &ControlPath,
    wait: Duration,
    shutdown: impl Future<Output = ()>,
    mut on_batch: impl FnMut(&BatchReport),
) {
    tokio::pin!(shutdown);
    loop {
        let received = tokio::select! {
            () = &mut shutdown => break,
            received = inbox.receive(MAX_BATCH, wait) => received,
        };
        let result = match received {
            Ok(deliveries) => process(inbox, control, &deliveries).await,
            Err(error) => Err(error),
        };
        match result {
            Ok(report) if report.items.is_empty() => {}
            Ok(report) => on_batch(&report),
            Err(error) => {
                tracing::warn!(error = %error, "polling the control queue failed; retrying");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(wait.max(Duration::from_secs(1))) => {}
                }
            }
        }
    }
    tracing::info!("control poller stopped");
}
