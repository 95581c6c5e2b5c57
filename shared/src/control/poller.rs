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
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

use crate::control::lease::{while_renewing, Held, LEASE};
use crate::control::redelivery::retry_failed_soon;
use crate::control::{BatchReport, ControlPath};
use crate::ports::{Clock, ControlDelivery, ControlInbox, QueueError};

/// Most messages one receive asks for (SQS's limit).
pub const MAX_BATCH: usize = 10;
/// Batches the control poller handles at once: a receive starts whenever fewer are in
/// hand, so that a batch waiting on its writes never holds up the next one.
pub const BATCHES_IN_FLIGHT: usize = 4;
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
    acknowledge(inbox, deliveries, report, control.clock()).await
}

/// What a poller does with a handled batch: acknowledges the messages that succeeded
/// and makes the failed ones come back soon ([`process`] without the lease, for a caller
/// that keeps time by itself).
pub async fn acknowledge(
    inbox: &dyn ControlInbox,
    deliveries: &[ControlDelivery],
    report: BatchReport,
    clock: &dyn Clock,
) -> Result<BatchReport, QueueError> {
    let failed = report.failed_message_ids();
    let handled: Vec<String> = deliveries
        .iter()
        .filter(|delivery| !failed.contains(&delivery.message_id.as_str()))
        .map(|delivery| delivery.receipt.clone())
        .collect();
    retry_failed_soon(inbox, deliveries, &report, clock).await;
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
    /// Messages the receive open at shutdown took, handed back unhandled.
    pub handed_back: u64,
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
/// queue's own visibility timeout, as the worker reads it), up to [`BATCHES_IN_FLIGHT`]
/// batches handled at once, calling `on_batch` with each batch's report. A shutdown
/// stops receiving: the receive still open is waited for (at most its `wait`) and what
/// it brings is handed back at once (visibility 0), so that a poller started next
/// finds it instead of waiting out its lease; the batches in hand are finished and
/// acknowledged. A failed receive is logged and retried after a short backoff
/// ([`receive_backoff`]).
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
        |deliveries: Vec<ControlDelivery>| async move {
            inbox
                .set_visibility(&visible_now(&deliveries, |delivery| &delivery.receipt))
                .await
        },
        |report: &BatchReport| report.items.is_empty(),
        shutdown,
        on_batch,
        "the control queue",
        BATCHES_IN_FLIGHT,
    )
    .await;
    tracing::info!(?stats, "control poller stopped");
    stats
}

/// `deliveries`' receipts (each read by `receipt`), each to be made visible at once.
pub(crate) fn visible_now<D>(deliveries: &[D], receipt: impl Fn(&D) -> &String) -> Vec<(String, Duration)> {
    deliveries
        .iter()
        .map(|delivery| (receipt(delivery).clone(), Duration::ZERO))
        .collect()
}

/// The loop of a poller (the control worker's, a consumer's): receive, interrupted only
/// by `shutdown`; hand each batch to `process`, with up to `in_flight` batches being
/// processed at once (a receive starts whenever fewer are); report the non-empty ones to
/// `on_batch`; after a failed cycle, pause ([`receive_backoff`]) before the next receive.
/// A shutdown stops receiving: the receive still open is waited for, never dropped (a
/// long poll dropped on the client's side may still take messages, which would stay
/// invisible for their whole lease), and what it brought goes to `hand_back` unhandled;
/// then the batches in hand finish.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn poll_loop<D, R, Received, Processed, HandedBack>(
    mut receive: impl FnMut() -> Received,
    mut process: impl FnMut(Vec<D>) -> Processed,
    mut hand_back: impl FnMut(Vec<D>) -> HandedBack,
    is_empty: impl Fn(&R) -> bool,
    shutdown: impl Future<Output = ()>,
    mut on_batch: impl FnMut(&R),
    queue: &str,
    in_flight: usize,
) -> PollerStats
where
    Received: Future<Output = Result<Vec<D>, QueueError>>,
    Processed: Future<Output = Result<R, QueueError>>,
    HandedBack: Future<Output = Result<Vec<String>, QueueError>>,
{
    tokio::pin!(shutdown);
    let in_flight = in_flight.max(1);
    let mut stats = PollerStats::default();
    let mut failures_in_a_row = 0;
    // The receive under way, kept across turns of the loop: dropping a long poll that
    // has taken messages would leave them invisible for their whole lease.
    let mut receiving: Option<Pin<Box<Received>>> = None;
    let mut batches = FuturesUnordered::new();
    let mut pause: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let failed = |stats: &mut PollerStats, failures_in_a_row: &mut u32, error: QueueError| {
        stats.failures += 1;
        *failures_in_a_row += 1;
        let wait = receive_backoff(*failures_in_a_row);
        tracing::warn!(error = %error, retry_in_ms = wait.as_millis() as u64, "polling {queue} failed; retrying");
        Some(Box::pin(tokio::time::sleep(wait)))
    };
    loop {
        if receiving.is_none() && pause.is_none() && batches.len() < in_flight {
            // Never a new long poll once the stop was asked for: it would only be waited
            // out and its messages handed back.
            if shutdown.as_mut().now_or_never().is_some() {
                break;
            }
            receiving = Some(Box::pin(receive()));
        }
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            received = until_some(receiving.as_mut()) => {
                receiving = None;
                match received {
                    Ok(deliveries) => {
                        failures_in_a_row = 0;
                        stats.receives += 1;
                        stats.messages += deliveries.len() as u64;
                        batches.push(process(deliveries));
                    }
                    Err(error) => pause = failed(&mut stats, &mut failures_in_a_row, error),
                }
            }
            Some(result) = batches.next(), if !batches.is_empty() => match result {
                Ok(report) => {
                    failures_in_a_row = 0;
                    if !is_empty(&report) {
                        on_batch(&report);
                    }
                }
                Err(error) => pause = failed(&mut stats, &mut failures_in_a_row, error),
            },
            () = until_some(pause.as_mut()) => pause = None,
        }
    }
    // The open receive is waited for (what it took goes back to the queue at once) while
    // the batches in hand finish and are acknowledged: both at once, so that a batch
    // never stalls, its lease unrenewed, behind a long poll.
    let handing_back = async {
        let Some(open) = receiving else {
            return (0, 0);
        };
        tracing::info!("stopping: waiting for the open receive of {queue} to return, to hand back what it takes");
        match open.await {
            Ok(deliveries) if !deliveries.is_empty() => {
                let count = deliveries.len() as u64;
                match hand_back(deliveries).await {
                    Ok(_) => {
                        tracing::info!(messages = count, "stopping: handed back to {queue} unhandled");
                        (count, 0)
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, messages = count, "stopping: handing back to {queue} failed; they come back when their lease ends");
                        (0, 1)
                    }
                }
            }
            Ok(_) => (0, 0),
            // It may have taken messages before it failed: they come back after their lease.
            Err(error) => {
                tracing::warn!(error = %error, "stopping: the open receive of {queue} failed; what it took comes back after its lease");
                (0, 1)
            }
        }
    };
    let finishing = async {
        let mut failures = 0;
        while let Some(result) = batches.next().await {
            match result {
                Ok(report) if !is_empty(&report) => on_batch(&report),
                Ok(_) => {}
                Err(error) => {
                    failures += 1;
                    tracing::warn!(error = %error, "finishing a batch from {queue} failed");
                }
            }
        }
        failures
    };
    let ((handed_back, hand_back_failures), batch_failures) = futures_util::future::join(handing_back, finishing).await;
    stats.handed_back += handed_back;
    stats.failures += hand_back_failures + batch_failures;
    stats
}

/// `future`'s output, or never when there is none.
async fn until_some<F: Future + Unpin>(future: Option<&mut F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Up to `in_flight` batches are handled at once, a receive starting whenever fewer
    /// are; a shutdown stops receiving and lets the batches in hand finish.
    #[tokio::test]
    async fn several_batches_are_handled_at_once_and_finished_at_shutdown() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (running, most, received) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(AtomicUsize::new(0));
        let (received_by, running_in, most_in, release_in, finished_in) = (
            received.clone(),
            running.clone(),
            most.clone(),
            release.clone(),
            finished.clone(),
        );
        let poller = poll_loop(
            move || {
                let received = received_by.clone();
                async move {
                    received.fetch_add(1, Ordering::SeqCst);
                    Ok(vec![1u8])
                }
            },
            move |batch: Vec<u8>| {
                let (running, most, release, finished) = (
                    running_in.clone(),
                    most_in.clone(),
                    release_in.clone(),
                    finished_in.clone(),
                );
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    release.acquire().await.expect("open").forget();
                    running.fetch_sub(1, Ordering::SeqCst);
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok::<usize, QueueError>(batch.len())
                }
            },
            |_: Vec<u8>| async { Ok(Vec::new()) },
            |_: &usize| false,
            async {
                let _ = stopped.await;
            },
            |_| {},
            "a test queue",
            3,
        );
        let poller = tokio::spawn(poller);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(running.load(Ordering::SeqCst), 3, "three batches in hand at once");
        assert_eq!(received.load(Ordering::SeqCst), 3, "no receive while three are in hand");
        release.add_permits(1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            received.load(Ordering::SeqCst),
            4,
            "one receive more once one batch ended"
        );
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!poller.is_finished(), "the batches in hand are waited for");
        release.add_permits(3);
        let stats = tokio::time::timeout(Duration::from_secs(5), poller)
            .await
            .expect("stops")
            .unwrap();
        assert_eq!((finished.load(Ordering::SeqCst), stats.receives), (4, 4));
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }

    /// Stopped while a receive is open and a batch is in hand: the batch finishes while
    /// the receive is still waited for, and what the receive then brings is handed back,
    /// unhandled, before the poller ends.
    #[tokio::test]
    async fn a_stop_finishes_the_batch_in_hand_and_hands_back_what_the_open_receive_takes() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        let receives = Arc::new(AtomicUsize::new(0));
        let receive_returns = Arc::new(tokio::sync::Notify::new());
        let batch_ends = Arc::new(tokio::sync::Notify::new());
        let batch_done = Arc::new(AtomicBool::new(false));
        let handed = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (receives_in, returns_in, ends_in, done_in, handed_in) = (
            receives.clone(),
            receive_returns.clone(),
            batch_ends.clone(),
            batch_done.clone(),
            handed.clone(),
        );
        let poller = tokio::spawn(poll_loop(
            move || {
                let (receives, returns) = (receives_in.clone(), returns_in.clone());
                async move {
                    if receives.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Ok(vec![1u8]);
                    }
                    returns.notified().await;
                    Ok(vec![7, 8])
                }
            },
            move |batch: Vec<u8>| {
                let (ends, done) = (ends_in.clone(), done_in.clone());
                async move {
                    ends.notified().await;
                    done.store(true, Ordering::SeqCst);
                    Ok::<usize, QueueError>(batch.len())
                }
            },
            move |taken: Vec<u8>| {
                let handed = handed_in.clone();
                async move {
                    handed.lock().unwrap().extend(taken);
                    Ok(Vec::new())
                }
            },
            |_: &usize| false,
            async {
                let _ = stopped.await;
            },
            |_| {},
            "a test queue",
            2,
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(receives.load(Ordering::SeqCst), 2, "a batch in hand, a receive open");
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        batch_ends.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            batch_done.load(Ordering::SeqCst),
            "the batch finished while the receive was open"
        );
        assert!(!poller.is_finished(), "the open receive is waited for");
        receive_returns.notify_one();
        let stats = tokio::time::timeout(Duration::from_secs(5), poller)
            .await
            .expect("stops")
            .unwrap();
        assert_eq!(*handed.lock().unwrap(), [7, 8], "handed back, unhandled");
        assert_eq!((stats.handed_back, stats.receives), (2, 1));
        assert_eq!(receives.load(Ordering::SeqCst), 2, "no receive after the stop");
    }

    #[test]
    fn a_failing_receive_is_retried_within_seconds_not_a_long_poll() {
        let pauses: Vec<u128> = (1..=7).map(|n| receive_backoff(n).as_millis()).collect();
        assert_eq!(pauses, [250, 500, 1000, 2000, 4000, 5000, 5000]);
    }
}
