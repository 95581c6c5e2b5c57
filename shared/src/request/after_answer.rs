//! Work the request path leaves for after its answer: publishing a committed
//! transaction's messages once the client has its response (docs/PROTOCOL.md section 3,
//! "Publishing after the answer").
//!
//! [`AfterAnswer`] runs each piece of work on a spawner (tokio's by default) and counts
//! what is still running, in all and per [`Invocation`], so that whatever must not stop
//! before it can wait for it: graceful shutdown waits for all of it
//! ([`AfterAnswer::idle_within`]), the Lambda glue for one invocation's
//! ([`AfterAnswer::idle_for`]), since on Lambda Managed Instances several invocations run
//! at once in one process and none should wait for another's work. A piece of work
//! belongs to the invocation whose future handed it over ([`Invocation::scope`], a tokio
//! task-local), and so does the work it hands over in turn. Work cut off (a crash, a
//! freeze, a timeout) loses nothing: the transaction's control message dispatches what
//! the request path did not.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

/// A piece of work handed to a spawner.
pub type Work = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs a piece of work to its end, independently of the request that handed it over.
pub type Spawner = Arc<dyn Fn(Work) + Send + Sync>;

tokio::task_local! {
    static CURRENT: Invocation;
}

/// One invocation of a function (on Lambda, its request id): what work after the answer
/// is counted under. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Invocation(Arc<str>);

impl Invocation {
    /// The invocation named `id` (a Lambda request id).
    pub fn new(id: &str) -> Self {
        Self(Arc::from(id))
    }

    /// Its name.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// Runs `future` as this invocation's: the work it hands to an [`AfterAnswer`] is
    /// counted as this invocation's, wherever it then runs.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, future)
    }

    /// The invocation whose future is being polled, if it runs in one's
    /// [`scope`](Self::scope).
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }
}

impl fmt::Debug for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Invocation").field(&self.id()).finish()
    }
}

impl fmt::Display for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Runs work after the answer and tells when none is left, in all or of one invocation.
/// Cheap to clone; clones share their counts.
#[derive(Clone)]
pub struct AfterAnswer {
    spawn: Spawner,
    running: Arc<Running>,
}

/// What is running, and a wake-up for every piece that ends.
#[derive(Default)]
struct Running {
    counts: Mutex<Counts>,
    ended: Notify,
}

#[derive(Default)]
struct Counts {
    all: usize,
    /// Only invocations with work running: an entry goes with its last piece.
    by_invocation: HashMap<Invocation, usize>,
}

impl Running {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        // A std mutex, never held across an await: a count is read or changed in place.
        self.counts.lock().expect("after-answer counts lock")
    }
}

/// Counts one piece of work as running until dropped: when it ends, or when its future
/// is dropped unfinished.
struct Counted {
    running: Arc<Running>,
    invocation: Option<Invocation>,
}

impl Counted {
    fn new(running: Arc<Running>, invocation: Option<Invocation>) -> Self {
        {
            let mut counts = running.counts();
            counts.all += 1;
            if let Some(invocation) = &invocation {
                *counts.by_invocation.entry(invocation.clone()).or_default() += 1;
            }
        }
        Self { running, invocation }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        {
            let mut counts = self.running.counts();
            counts.all -= 1;
            if let Some(invocation) = &self.invocation {
                if let Some(count) = counts.by_invocation.get_mut(invocation) {
                    *count -= 1;
                    if *count == 0 {
                        counts.by_invocation.remove(invocation);
                    }
                }
            }
        }
        // Every waiter looks again at what it waits for: all the work, or its invocation's.
        self.running.ended.notify_waiters();
    }
}

impl fmt::Debug for AfterAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AfterAnswer").field("running", &self.running()).finish()
    }
}

impl AfterAnswer {
    /// Work runs on tokio's runtime (`tokio::spawn`).
    pub fn on_tokio() -> Self {
        Self::with_spawner(Arc::new(|work: Work| {
            tokio::spawn(work);
        }))
    }

    /// Work runs on `spawn` (a simulation's scheduler, another runtime).
    pub fn with_spawner(spawn: Spawner) -> Self {
        Self {
            spawn,
            running: Arc::default(),
        }
    }

    /// Hands `work` to the spawner, counted as running until it ends or is dropped: in
    /// all, and as the current [`Invocation`]'s when it is handed over in one's scope
    /// (the work runs in that scope too).
    pub fn run(&self, work: impl Future<Output = ()> + Send + 'static) {
        let invocation = Invocation::current();
        let counted = Counted::new(self.running.clone(), invocation.clone());
        let work: Work = match invocation {
            Some(invocation) => Box::pin(invocation.scope(async move {
                work.await;
                drop(counted);
            })),
            None => Box::pin(async move {
                work.await;
                drop(counted);
            }),
        };
        (self.spawn)(work);
    }

    /// How many pieces of work are running, in all.
    pub fn running(&self) -> usize {
        self.running.counts().all
    }

    /// How many pieces of work `invocation` handed over are running.
    pub fn running_for(&self, invocation: &Invocation) -> usize {
        self.running
            .counts()
            .by_invocation
            .get(invocation)
            .copied()
            .unwrap_or(0)
    }

    /// Completes once `done` holds of the counts, looked at now and after each piece of
    /// work ends.
    async fn until(&self, done: impl Fn(&Counts) -> bool) {
        loop {
            let ended = self.running.ended.notified();
            tokio::pin!(ended);
            // Registered before the counts are read: a piece ending in between wakes it.
            ended.as_mut().enable();
            if done(&self.running.counts()) {
                return;
            }
            ended.await;
        }
    }

    /// Completes once no work is running.
    pub async fn idle(&self) {
        self.until(|counts| counts.all == 0).await;
    }

    /// Waits until no work is running, or `bound` has passed: whether none is left.
    pub async fn idle_within(&self, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.idle()).await.is_ok()
    }

    /// Waits until none of the work `invocation` handed over is running, or `bound` has
    /// passed: whether none is left. Other invocations' work does not hold it.
    pub async fn idle_for(&self, invocation: &Invocation, bound: Duration) -> bool {
        let idle = self.until(|counts| !counts.by_invocation.contains_key(invocation));
        tokio::time::timeout(bound, idle).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn idle_waits_for_every_piece_of_work_and_a_dropped_one_counts_as_ended() {
        let after = AfterAnswer::on_tokio();
        assert!(after.idle_within(Duration::from_millis(10)).await, "nothing ran yet");
        let (release, released) = oneshot::channel::<()>();
        after.run(async move {
            let _ = released.await;
        });
        let kept: Arc<Mutex<Option<Work>>> = Arc::default();
        let keeper = kept.clone();
        let held = AfterAnswer {
            spawn: Arc::new(move |work| *keeper.lock().unwrap() = Some(work)),
            running: after.running.clone(),
        };
        held.run(async {});
        assert_eq!(after.running(), 2);
        assert!(
            !after.idle_within(Duration::from_millis(50)).await,
            "idle while work runs"
        );
        release.send(()).unwrap();
        assert!(
            !after.idle_within(Duration::from_millis(50)).await,
            "idle while work is held"
        );
        // A crash: the held work is dropped unfinished.
        kept.lock().unwrap().take();
        assert!(after.idle_within(Duration::from_secs(5)).await);
        assert_eq!(after.running(), 0);
    }

    /// Two invocations in flight at once, as on Lambda Managed Instances: each one's
    /// wait ends with its own work, the other's still running; work handed over by work
    /// stays its invocation's; work outside any invocation counts in all only.
    #[tokio::test]
    async fn each_invocation_waits_for_its_own_work_only() {
        let after = AfterAnswer::on_tokio();
        let (a, b) = (Invocation::new("a"), Invocation::new("b"));
        let (release_a, released_a) = oneshot::channel::<()>();
        let (release_b, released_b) = oneshot::channel::<()>();
        let (release_none, released_none) = oneshot::channel::<()>();
        a.clone()
            .scope(async {
                after.run(async move {
                    let _ = released_a.await;
                })
            })
            .await;
        b.clone()
            .scope(async {
                let inner = after.clone();
                // Ends at once, handing the waiting over to a piece of its own.
                after.run(async move {
                    inner.run(async move {
                        let _ = released_b.await;
                    })
                })
            })
            .await;
        after.run(async move {
            let _ = released_none.await;
        });
        assert!(Invocation::current().is_none(), "the scope ends with its future");
        tokio::task::yield_now().await;
        assert_eq!(
            (after.running_for(&a), after.running_for(&b), after.running()),
            (1, 1, 3)
        );

        let waiting_for_a = tokio::spawn({
            let (after, a) = (after.clone(), a.clone());
            async move { after.idle_for(&a, Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting_for_a.is_finished(), "a's work is still running");
        release_a.send(()).unwrap();
        assert!(waiting_for_a.await.unwrap(), "a's wait ends with a's work");
        assert!(
            !after.idle_for(&b, Duration::from_millis(50)).await,
            "b's work, handed over by b's work, is still b's"
        );
        assert_eq!(
            (after.running_for(&a), after.running_for(&b), after.running()),
            (0, 1, 2)
        );

        release_b.send(()).unwrap();
        assert!(after.idle_for(&b, Duration::from_secs(5)).await);
        assert!(
            !after.idle_within(Duration::from_millis(50)).await,
            "work outside any invocation still runs"
        );
        release_none.send(()).unwrap();
        assert!(after.idle_within(Duration::from_secs(5)).await);
        assert!(
            after.idle_for(&Invocation::new("never"), Duration::ZERO).await,
            "an invocation that handed nothing over has nothing to wait for"
        );
    }
}
