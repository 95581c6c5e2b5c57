//! Gates: the points where an actor parks until the scheduler lets it through, and
//! learns which fault its operation meets.

use std::collections::{BTreeMap, BTreeSet};
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use outbox::time::Timestamp;

/// An actor's number in the simulation.
pub type ActorId = usize;

/// The operations that go through gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// Send to the control queue (the request path's first message, or a re-deferral).
    ControlSend,
    /// Receive from the control queue.
    Receive,
    /// Delete received control messages.
    Ack,
    /// A strongly consistent read.
    Read,
    /// The atomic commit.
    Commit,
    /// A single write of the request path's (entity mode's one conditional write of an
    /// item and its entry), where a run tells it from the transactional commit.
    EntityWrite,
    /// A commit request still on its way to the table after its caller stopped waiting
    /// (a ghost actor of [`Fault::Late`]): it applies when it passes, or is lost.
    LateCommit,
    /// The conditional tombstone put.
    Tombstone,
    /// A tombstone put still on its way after its caller stopped waiting.
    LateTombstone,
    /// Marking records dispatched.
    Mark,
    /// A mark still on its way after its caller stopped waiting.
    LateMark,
    /// A control message send still on its way after its caller stopped waiting.
    LateSend,
    /// A `SendMessageBatch` to a destination.
    Publish,
    /// A backoff wait.
    Sleep,
    /// The deleter of a bounded exploration waiting until its counter holds no entries:
    /// the scheduler opens it only then, or once nothing else can move.
    AwaitIdle,
}

/// What an operation meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: it runs normally.
    None,
    /// The actor crashes before the operation: nothing applied.
    CrashBefore,
    /// The operation applies, then the actor crashes.
    CrashAfter,
    /// The operation applies, but the caller gets an error (reply lost, timeout).
    ReplyLost,
    /// The operation is refused: nothing applied, the caller gets an error.
    Fail,
    /// Queue sends: the message is enqueued twice (at-least-once delivery).
    Duplicate,
    /// Publishes: the first entry of the batch fails, the others are sent.
    FirstEntryFails,
    /// Commits: refused for contention (another transaction held an item, throttling);
    /// nothing applied.
    Busy,
    /// The caller times out with the request still on its way (a commit's outcome is
    /// unknown; a tombstone, mark or control send failed, as far as its caller knows);
    /// the request applies later, at a step the scheduler picks, or is lost.
    Late,
}

impl Op {
    /// The faults offered when exploring this operation's retry loop to its end: every
    /// way a commit attempt can fail without a crash, or every way a publish entry can
    /// fail. Other operations run clean, so the budget goes to stacking faults on one
    /// loop.
    pub fn retry_loop_faults(self) -> Vec<Fault> {
        use Fault::*;
        match self {
            Op::Commit => vec![ReplyLost, Late, Fail, Busy],
            Op::Publish => vec![Fail, FirstEntryFails],
            // The request path's settling write (and the worker's tombstone, which fails
            // its control message instead of retrying).
            Op::Tombstone => vec![Fail, ReplyLost],
            _ => vec![],
        }
    }

    /// The faults this operation can meet, beyond `None`. A commit's [`Fault::Late`] is
    /// left to retry-loop runs ([`Op::retry_loop_faults`]): its ghost doubles the
    /// interleavings of every schedule it is in.
    pub fn faults(self, random: bool) -> Vec<Fault> {
        use Fault::*;
        match self {
            Op::Sleep | Op::AwaitIdle => vec![],
            // The late request is lost on its way and never applies.
            Op::LateCommit | Op::LateTombstone | Op::LateMark | Op::LateSend => vec![Fail],
            Op::Read | Op::Receive => vec![CrashBefore, Fail],
            Op::ControlSend if random => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Duplicate, Late],
            Op::Tombstone | Op::Mark if random => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Late],
            Op::Publish => vec![CrashBefore, CrashAfter, ReplyLost, Fail, FirstEntryFails],
            Op::ControlSend | Op::Ack | Op::Commit | Op::EntityWrite | Op::Tombstone | Op::Mark => {
                vec![CrashBefore, CrashAfter, ReplyLost, Fail]
            }
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct GateState {
    /// Actors parked at a gate, and the operation they wait to perform.
    pub waiting: BTreeMap<ActorId, Op>,
    /// Permissions granted but not yet taken.
    pub granted: BTreeMap<ActorId, Fault>,
    /// Actors that crashed inside an operation.
    pub crashed: BTreeSet<ActorId>,
    /// Timers running, by actor and number: when each fires, on the simulation's clock.
    pub timers: BTreeMap<(ActorId, u64), Timestamp>,
    /// The next timer's number.
    pub next_timer: u64,
}

/// The gates of all actors; each actor's ports hold a [`Gate`] naming it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gates(Arc<Mutex<GateState>>);

impl Gates {
    pub fn lock(&self) -> MutexGuard<'_, GateState> {
        self.0.lock().expect("gate lock")
    }

    pub fn for_actor(&self, actor: ActorId) -> Gate {
        Gate {
            gates: self.clone(),
            actor: Some(actor),
        }
    }

    /// A gate that belongs to whichever actor is being polled when it is passed.
    pub fn shared(&self) -> Gate {
        Gate {
            gates: self.clone(),
            actor: None,
        }
    }
}

thread_local! {
    /// The actor the scheduler is polling, for gates shared by several actors.
    static POLLING: std::cell::Cell<ActorId> = const { std::cell::Cell::new(ActorId::MAX) };
}

/// Runs `poll` as actor `actor`'s: a shared gate ([`Gates::shared`]) passed in it is that
/// actor's.
pub(crate) fn as_actor<T>(actor: ActorId, poll: impl FnOnce() -> T) -> T {
    let before = POLLING.replace(actor);
    let result = poll();
    POLLING.set(before);
    result
}

/// One actor's way through the gates; or, shared, the way of whichever actor is polled
/// (ports shared by a request and the task it hands its transaction to).
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    gates: Gates,
    actor: Option<ActorId>,
}

impl Gate {
    /// Parks until the scheduler lets this actor perform `op`; returns the fault. An
    /// actor whose timer fires while it waits (a deadline) drops the wait: it no longer
    /// waits there.
    pub async fn pass(&self, op: Op) -> Fault {
        struct Waiting<'a>(&'a Gates, ActorId);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.lock().waiting.remove(&self.1);
            }
        }
        let actor = self.actor();
        let waiting = Waiting(&self.gates, actor);
        let fault = poll_fn(|_| {
            let mut state = self.gates.lock();
            match state.granted.remove(&actor) {
                Some(fault) => Poll::Ready(fault),
                None => {
                    state.waiting.insert(actor, op);
                    Poll::Pending
                }
            }
        })
        .await;
        std::mem::forget(waiting);
        fault
    }

    /// Waits until the simulation's clock (`now`) reaches `at`: the actor moves on when
    /// the scheduler wakes it after the clock got there.
    pub async fn timer(&self, at: Timestamp, now: impl Fn() -> Timestamp) {
        struct Running<'a>(&'a Gates, ActorId, u64);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.lock().timers.remove(&(self.1, self.2));
            }
        }
        let actor = self.actor();
        let number = {
            let mut state = self.gates.lock();
            state.next_timer += 1;
            let number = state.next_timer;
            state.timers.insert((actor, number), at);
            number
        };
        let _running = Running(&self.gates, actor, number);
        poll_fn(|_| if now() >= at { Poll::Ready(()) } else { Poll::Pending }).await;
    }

    /// The actor this gate belongs to.
    pub fn actor(&self) -> ActorId {
        self.actor.unwrap_or_else(|| POLLING.get())
    }

    /// Crashes the actor: marks it and never returns (the scheduler drops it).
    pub async fn crash<T>(&self) -> T {
        self.gates.lock().crashed.insert(self.actor());
        std::future::pending().await
    }
}
