//! Work the request path leaves for after its answer: publishing a committed
//! transaction's messages once the client has its response (docs/PROTOCOL.md section 3,
//! "Publishing after the answer").
//!
//! [`AfterAnswer`] runs each piece of work on a spawner (tokio's by default) and counts
//! what is still running, so that whatever must not stop before it (graceful shutdown,
//! the Lambda extension that holds the environment's freeze) can wait for it. Work cut
//! off (a crash, a freeze, a timeout) loses nothing: the transaction's control message
//! dispatches what the request path did not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// A piece of work handed to a spawner.
pub type Work = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs a piece of work to its end, independently of the request that handed it over.
pub type Spawner = Arc<dyn Fn(Work) + Send + Sync>;

/// Runs work after the answer and tells when none is left. Cheap to clone; clones share
/// their count.
#[derive(Clone)]
pub struct AfterAnswer {
    spawn: Spawner,
    running: Arc<Running>,
}

#[derive(Default)]
struct Running {
    count: Mutex<usize>,
    idle: Notify,
}

/// Counts one piece of work as running until dropped: when it ends, or when its future
/// is dropped unfinished.
struct Counted(Arc<Running>);

impl Counted {
    fn new(running: Arc<Running>) -> Self {
        *running.count.lock().expect("count lock") += 1;
        Self(running)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().expect("count lock");
        *count -= 1;
        if *count == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

impl std::fmt::Debug for AfterAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

    /// Hands `work` to the spawner, counted as running until it ends or is dropped.
    pub fn run(&self, work: impl Future<Output = ()> + Send + 'static) {
        let counted = Counted::new(self.running.clone());
        (self.spawn)(Box::pin(async move {
            work.await;
            drop(counted);
        }));
    }

    /// How many pieces of work are running.
    pub fn running(&self) -> usize {
        *self.running.count.lock().expect("count lock")
    }

    /// Completes once no work is running.
    pub async fn idle(&self) {
        loop {
            let notified = self.running.idle.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a last piece ending in between wakes it.
            notified.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Waits until no work is running, or `bound` has passed: whether none is left.
    pub async fn idle_within(&self, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.idle()).await.is_ok()
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
}
