//! A local poller's lease on the messages it holds: each is received invisible for the
//! lease, and made invisible for another lease every third of one while it is still
//! being handled, so that a slow message never comes back to another poller meanwhile,
//! whatever the queue's own visibility timeout (AWS's advice for a consumer that cannot
//! know how long a message takes: a heartbeat of `ChangeMessageVisibility`).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::{select, Either};

use crate::ports::{Clock, QueueError};

/// A lease when the queue's own visibility timeout is not known (SQS's default): how
/// long a receive hides a message, and each renewal again. Pollers lease for their
/// queue's visibility timeout where they can read it, so that a message whose poller
/// died comes back when the operator's setting says.
pub const LEASE: Duration = Duration::from_secs(30);

/// The receipts a poller still holds: received and not yet finished.
#[derive(Debug, Default)]
pub struct Held(Mutex<BTreeSet<String>>);

impl Held {
    /// Holds `receipts`.
    pub fn new(receipts: impl IntoIterator<Item = String>) -> Self {
        Self(Mutex::new(receipts.into_iter().collect()))
    }

    /// Stops renewing `receipt`: its message is finished (acknowledged, or left to come
    /// back when its lease runs out).
    pub fn release(&self, receipt: &str) {
        self.0.lock().expect("no panic holds it").remove(receipt);
    }

    fn holds(&self, receipt: &str) -> bool {
        self.0.lock().expect("no panic holds it").contains(receipt)
    }

    fn current(&self) -> Vec<String> {
        self.0.lock().expect("no panic holds it").iter().cloned().collect()
    }
}

/// The metric of messages whose lease ran out while they were still being handled.
pub const LEASES_LOST_METRIC: &str = "LeasesLost";

/// Reports `lost` messages whose lease ran out while they were still being handled (the
/// queue no longer counted them as held by this receiver, and they were not acknowledged):
/// another receiver may be handling them at once, which their records make harmless but
/// costs a second run. A queue whose visibility timeout is shorter than the work shows
/// here. Logged as a warning and counted ([`LEASES_LOST_METRIC`], under `service`).
pub(crate) fn report_lost_leases(lost: usize, service: &'static str, clock: &dyn Clock) {
    if lost == 0 {
        return;
    }
    tracing::warn!(
        messages = lost,
        "the lease of messages still being handled had run out: another receiver may be handling them too"
    );
    crate::metrics::MetricRecord::new(service, clock.now())
        .count(LEASES_LOST_METRIC, lost)
        .emit();
}

/// Runs `work`, renewing the lease of what `held` still holds every third of `lease` by
/// `clock`'s timer (raced against the work, as [`Clock::timer`] is meant) through
/// `renew` (a failed renewal is logged: the message may then come back to another
/// poller, which its record makes harmless).
pub async fn while_renewing<T, Renewed>(
    work: impl Future<Output = T>,
    held: &Held,
    lease: Duration,
    clock: &dyn Clock,
    renew: impl Fn(Vec<(String, Duration)>) -> Renewed,
) -> T
where
    Renewed: Future<Output = Result<Vec<String>, QueueError>>,
{
    let renewer = renew_forever(held, lease, clock, renew);
    let (work, renewer) = (std::pin::pin!(work), std::pin::pin!(renewer));
    match select(work, renewer).await {
        Either::Left((output, _)) => output,
        Either::Right((never, _)) => match never {},
    }
}

async fn renew_forever<Renewed>(
    held: &Held,
    lease: Duration,
    clock: &dyn Clock,
    renew: impl Fn(Vec<(String, Duration)>) -> Renewed,
) -> Infallible
where
    Renewed: Future<Output = Result<Vec<String>, QueueError>>,
{
    loop {
        clock.timer(lease / 3).await;
        let receipts: Vec<(String, Duration)> = held.current().into_iter().map(|receipt| (receipt, lease)).collect();
        if receipts.is_empty() {
            continue;
        }
        let messages = receipts.len();
        match renew(receipts).await {
            Ok(gone) => {
                // One acknowledged while its renewal was on its way is no longer held:
                // nothing lost.
                let lost = gone.iter().filter(|receipt| held.holds(receipt)).count();
                report_lost_leases(lost, "queue-poller", clock);
                tracing::debug!(
                    messages,
                    lease_s = lease.as_secs(),
                    "renewed the lease of messages still being handled"
                )
            }
            Err(error) => tracing::warn!(
                error = %error,
                messages,
                "renewing the lease of messages still being handled failed; they may come back meanwhile"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A renewal that the queue answers "no longer held" for two messages: the one
    /// acknowledged while the renewal was on its way is nothing lost; the one still held
    /// had its lease run out, and is a warning and the `LeasesLost` metric.
    #[tokio::test(start_paused = true)]
    async fn a_lease_that_ran_out_is_a_warning_and_counted_an_acknowledged_one_is_not() {
        let logged = crate::test_log::Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_env_filter("outbox=debug")
            .finish();
        crate::test_log::keep_callsites_interested();
        let _guard = tracing::subscriber::set_default(subscriber);
        let held = Held::new(["acked".to_owned(), "expired".to_owned()]);
        let work = async {
            tokio::time::sleep(Duration::from_secs(11)).await;
        };
        while_renewing(
            work,
            &held,
            Duration::from_secs(30),
            &crate::ports::SystemClock,
            |_receipts| {
                // Acknowledged while its renewal was on its way.
                held.release("acked");
                async { Ok(vec!["acked".to_owned(), "expired".to_owned()]) }
            },
        )
        .await;
        let text = logged.text();
        assert!(
            text.contains("WARN") && text.contains("had run out") && text.contains("messages=1"),
            "{text}"
        );
        assert!(text.contains(r#""LeasesLost":1.0"#), "counted once: {text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_renewed_every_third_of_it_for_what_is_still_held_and_stops_with_the_work() {
        let held = Held::new(["a".to_owned(), "b".to_owned()]);
        let renewals = Mutex::new(Vec::new());
        let calls = AtomicUsize::new(0);
        let work = async {
            tokio::time::sleep(Duration::from_secs(25)).await;
            held.release("a");
            tokio::time::sleep(Duration::from_secs(10)).await;
            "done"
        };
        let output = while_renewing(
            work,
            &held,
            Duration::from_secs(30),
            &crate::ports::SystemClock,
            |receipts| {
                calls.fetch_add(1, Ordering::SeqCst);
                renewals.lock().unwrap().push(receipts);
                async { Ok(Vec::new()) }
            },
        )
        .await;
        assert_eq!(output, "done");
        let renewals = renewals.into_inner().unwrap();
        let lease = Duration::from_secs(30);
        assert_eq!(
            renewals,
            [
                vec![("a".to_owned(), lease), ("b".to_owned(), lease)],
                vec![("a".to_owned(), lease), ("b".to_owned(), lease)],
                vec![("b".to_owned(), lease)],
            ],
            "at 10 s and 20 s both, at 30 s only what is still held, none after 35 s"
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "nothing renews after the work ended");
    }
}
