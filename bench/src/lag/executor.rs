//! A single-threaded executor on a virtual clock: a discrete-event simulation of async
//! code.
//!
//! Tasks run until every one of them waits; then the clock ([`ManualClock`]) jumps to the
//! earliest pending [`Sleep`] and wakes it. So events happen in virtual-time order, the
//! request path and the control path interleave as they would in real time, and a run of
//! minutes of virtual time takes milliseconds. The run ends when no task can run and no
//! sleep is pending (tasks still waiting then, such as idle workers or crashed requests,
//! are left unfinished).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use outbox::embedded::ManualClock;
use outbox::ports::Clock;
use outbox::time::Timestamp;

/// A task of the simulation.
pub type Task = Pin<Box<dyn Future<Output = ()>>>;

#[derive(Default)]
struct Timers {
    /// Pending wake-ups: (instant in ms, sequence number).
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    /// The waker of each live sleep, by sequence number; a dropped sleep leaves its heap
    /// entry behind, skipped when it comes up.
    wakers: BTreeMap<u64, Waker>,
    next: u64,
}

/// Virtual time: the clock every port reads and the sleeps that move it.
pub struct VirtualTime {
    clock: Arc<ManualClock>,
    timers: Mutex<Timers>,
}

impl VirtualTime {
    /// Virtual time read from `clock`, which only this moves.
    pub fn new(clock: Arc<ManualClock>) -> Arc<Self> {
        Arc::new(Self {
            clock,
            timers: Mutex::new(Timers::default()),
        })
    }

    /// The current virtual instant.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Completes `duration` of virtual time from now.
    pub fn sleep(self: &Arc<Self>, duration: Duration) -> Sleep {
        self.sleep_until(self.now().plus(duration))
    }

    /// Completes at `at` (at once if it has passed).
    pub fn sleep_until(self: &Arc<Self>, at: Timestamp) -> Sleep {
        Sleep {
            time: self.clone(),
            at,
            seq: None,
        }
    }

    fn timers(&self) -> MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the clock to the earliest live sleep and wakes it; false when none is left.
    fn fire_next(&self) -> bool {
        let mut timers = self.timers();
        while let Some(Reverse((at, seq))) = timers.heap.pop() {
            if let Some(waker) = timers.wakers.remove(&seq) {
                drop(timers);
                if at > self.now().as_millis() {
                    self.clock.set(Timestamp::from_millis(at));
                }
                waker.wake();
                return true;
            }
        }
        false
    }
}

/// A wait in virtual time.
pub struct Sleep {
    time: Arc<VirtualTime>,
    at: Timestamp,
    seq: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.time.now() >= self.at {
            if let Some(seq) = self.seq.take() {
                self.time.timers().wakers.remove(&seq);
            }
            return Poll::Ready(());
        }
        let at = self.at.as_millis();
        let time = self.time.clone();
        let mut timers = time.timers();
        let seq = match self.seq {
            Some(seq) => seq,
            None => {
                let seq = timers.next;
                timers.next += 1;
                timers.heap.push(Reverse((at, seq)));
                self.seq = Some(seq);
                seq
            }
        };
        timers.wakers.insert(seq, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(seq) = self.seq {
            self.time.timers().wakers.remove(&seq);
        }
    }
}

/// A notification that wakes every task waiting for it (the control queue got a
/// message, a batch was acknowledged): idle workers look at the queue again.
#[derive(Default)]
pub struct Signal {
    state: Mutex<(u64, Vec<Waker>)>,
}

impl Signal {
    fn state(&self) -> MutexGuard<'_, (u64, Vec<Waker>)> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many notifications so far.
    pub fn generation(&self) -> u64 {
        self.state().0
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        let waiters = {
            let mut state = self.state();
            state.0 += 1;
            std::mem::take(&mut state.1)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Completes once a notification after generation `seen` has come, or `deadline`
    /// has (if any).
    pub async fn wait(&self, seen: u64, deadline: Option<Sleep>) {
        let mut deadline = deadline;
        std::future::poll_fn(|cx| {
            if let Some(sleep) = deadline.as_mut() {
                if Pin::new(sleep).poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            let mut state = self.state();
            if state.0 != seen {
                return Poll::Ready(());
            }
            state.1.push(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

/// Both futures, polled together (`tokio::join!` without tokio's macros).
pub async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let (mut done_a, mut done_b) = (None, None);
    std::future::poll_fn(move |cx| {
        if done_a.is_none() {
            if let Poll::Ready(value) = a.as_mut().poll(cx) {
                done_a = Some(value);
            }
        }
        if done_b.is_none() {
            if let Poll::Ready(value) = b.as_mut().poll(cx) {
                done_b = Some(value);
            }
        }
        if done_a.is_some() && done_b.is_some() {
            Poll::Ready((done_a.take().expect("done"), done_b.take().expect("done")))
        } else {
            Poll::Pending
        }
    })
    .await
}

struct TaskWaker {
    id: usize,
    ready: Arc<Mutex<VecDeque<usize>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push_back(self.id);
    }
}

/// Runs `tasks` on virtual time until nothing can happen any more. Returns how many
/// tasks were left unfinished.
pub fn run(time: &VirtualTime, tasks: Vec<Task>) -> usize {
    let ready = Arc::new(Mutex::new((0..tasks.len()).collect::<VecDeque<usize>>()));
    let wakers: Vec<Waker> = (0..tasks.len())
        .map(|id| {
            Waker::from(Arc::new(TaskWaker {
                id,
                ready: ready.clone(),
            }))
        })
        .collect();
    let mut tasks: Vec<Option<Task>> = tasks.into_iter().map(Some).collect();
    loop {
        loop {
            let next = ready
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .pop_front();
            let Some(id) = next else { break };
            if let Some(task) = tasks[id].as_mut() {
                let mut cx = Context::from_waker(&wakers[id]);
                if task.as_mut().poll(&mut cx).is_ready() {
                    tasks[id] = None;
                }
            }
        }
        if !time.fire_next() {
            break;
        }
    }
    tasks.iter().filter(|task| task.is_some()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_complete_in_virtual_time_order() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let time = VirtualTime::new(clock);
        let log = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<Task> = [30u64, 10, 20]
            .into_iter()
            .map(|ms| {
                let (time, log) = (time.clone(), log.clone());
                Box::pin(async move {
                    time.sleep(Duration::from_millis(ms)).await;
                    log.lock().unwrap().push((ms, time.now().as_millis()));
                }) as Task
            })
            .collect();
        assert_eq!(run(&time, tasks), 0);
        assert_eq!(*log.lock().unwrap(), [(10, 1_010), (20, 1_020), (30, 1_030)]);
    }

    #[test]
    fn a_signal_wakes_a_waiter_before_its_deadline() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
        let time = VirtualTime::new(clock);
        let signal = Arc::new(Signal::default());
        let woke_at = Arc::new(Mutex::new(0));
        let waiter: Task = {
            let (time, signal, woke_at) = (time.clone(), signal.clone(), woke_at.clone());
            Box::pin(async move {
                let seen = signal.generation();
                signal.wait(seen, Some(time.sleep(Duration::from_secs(60)))).await;
                *woke_at.lock().unwrap() = time.now().as_millis();
            })
        };
        let notifier: Task = {
            let (time, signal) = (time.clone(), signal.clone());
            Box::pin(async move {
                time.sleep(Duration::from_millis(5)).await;
                signal.notify();
            })
        };
        assert_eq!(run(&time, vec![waiter, notifier]), 0);
        assert_eq!(*woke_at.lock().unwrap(), 5);
    }
}
