//! The local poller: what a Lambda event source mapping does for a consumer, done by hand
//! against an [`Inbox`] (an embedded queue, or SQS outside Lambda).
//!
//! One cycle receives a batch under a lease ([`crate::control::lease`]), hands it to the
//! [`Consumer`], and deletes each message that succeeded as soon as it is done (those
//! finishing together in one call), while the lease of those still being handled is
//! renewed; the failed ones come back when their lease runs out and count toward the
//! queue's dead-letter policy.

use std::future::Future;
use std::time::Duration;

use futures_util::future::join;

use super::{BatchReport, Consumer, Delivery};
use crate::control::lease::{while_renewing, Held, LEASE};
use crate::control::poller::{poll_loop, visible_now, PollerStats, MAX_BATCH};
use crate::ports::{Inbox, QueueError};

/// Receives one batch (waiting up to `wait` for it) under a [`LEASE`], processes it, and
/// acknowledges the messages that succeeded. Returns the batch's report; an empty one
/// when nothing came.
pub async fn poll_once(inbox: &dyn Inbox, consumer: &Consumer, wait: Duration) -> Result<BatchReport, QueueError> {
    let deliveries = inbox.receive(MAX_BATCH, wait, LEASE).await?;
    process(inbox, consumer, &deliveries, LEASE).await
}

/// Processes `deliveries`, received under `lease`: acknowledges each that succeeded when
/// it is done, and renews the lease of those still being handled. An acknowledgement
/// that failed is the error (its messages come back, and their records make that
/// harmless).
pub async fn process(
    inbox: &dyn Inbox,
    consumer: &Consumer,
    deliveries: &[Delivery],
    lease: Duration,
) -> Result<BatchReport, QueueError> {
    if deliveries.is_empty() {
        return Ok(BatchReport::default());
    }
    let held = &Held::new(deliveries.iter().map(|delivery| delivery.receipt.clone()));
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel::<String>();
    let consume = async move {
        consumer
            .consume_batch_with(deliveries, move |index, result| {
                let receipt = &deliveries[index].receipt;
                held.release(receipt);
                if result.is_ok() {
                    // The acknowledger ends only after the batch, so it still listens.
                    let _ = done.send(receipt.clone());
                }
            })
            .await
    };
    let acknowledge = async {
        let mut failure = None;
        while let Some(receipt) = finished.recv().await {
            let mut receipts = vec![receipt];
            while let Ok(more) = finished.try_recv() {
                receipts.push(more);
            }
            if let Err(error) = inbox.ack(&receipts).await {
                failure.get_or_insert(error);
            }
        }
        failure
    };
    let renewing = while_renewing(consume, held, lease, consumer.clock(), |receipts| async move {
        inbox.set_visibility(&receipts).await
    });
    let (report, failure) = join(renewing, acknowledge).await;
    match failure {
        Some(error) => Err(error),
        None => Ok(report),
    }
}

/// Polls until `shutdown` completes, each batch received under `lease`, calling
/// `on_batch` with each batch's report. A shutdown stops receiving: the receive still
/// open is waited for and what it brings handed back at once (visibility 0); a batch in
/// hand is always finished and acknowledged first. A failed receive is logged
/// and retried after a short backoff.
pub async fn run(
    inbox: &dyn Inbox,
    consumer: &Consumer,
    wait: Duration,
    lease: Duration,
    shutdown: impl Future<Output = ()>,
    on_batch: impl FnMut(&BatchReport),
) -> PollerStats {
    let stats = poll_loop(
        || inbox.receive(MAX_BATCH, wait, lease),
        |deliveries| async move { process(inbox, consumer, &deliveries, lease).await },
        |deliveries: Vec<Delivery>| async move {
            inbox
                .set_visibility(&visible_now(&deliveries, |delivery| &delivery.receipt))
                .await
        },
        |report: &BatchReport| report.items.is_empty(),
        shutdown,
        on_batch,
        "the source queue",
        // One batch at a time: its messages are handled concurrently and acknowledged
        // each when done already.
        1,
    )
    .await;
    tracing::info!(?stats, consumer = %consumer.name(), "consumer poller stopped");
    stats
}
