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

    fn current(&self) -> Vec<String> {
        self.0.lock().expect("no panic holds it").iter().cloned().collect()
    }
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
    Renewed: Future<Output = Result<(), QueueError>>,
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
    Renewed: Future<Output = Result<(), QueueError>>,
{
    loop {
        clock.timer(lease / 3).await;
        let receipts: Vec<(String, Duration)> = held.current().into_iter().map(|receipt| (receipt, lease)).collect();
        if receipts.is_empty() {
            continue;
        }
        let messages = receipts.len();
        match renew(receipts).await {
            Ok(()) => tracing::debug!(
                messages,
                lease_s = lease.as_secs(),
                "renewed the lease of messages still being handled"
            ),
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
                async { Ok(()) }
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
