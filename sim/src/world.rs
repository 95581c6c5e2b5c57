//! The simulated world and the scheduler that runs one schedule in it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use outbox::control::poller::poll_once;
use outbox::control::{ControlPath, ControlPorts};
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::ports::{Clock, ExpectedVersion, IdSource, ItemKey};
use outbox::protocol::sent_marks::FORGET_MARGIN;
use outbox::protocol::{DestinationName, IdempotencyKey, IdempotencySlot, Message, StoredResponse, TxnId};
use outbox::publish::RetryPolicy;
use outbox::request::{
    AfterAnswer, Committed, Outbox, RequestPorts, Settlement, TxnError, COMMIT_ATTEMPTS, SETTLE_ATTEMPTS,
};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use serde_json::json;

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::invariants::Observed;
use super::ports::{
    late_op, GatedClock, GatedControlQueue, GatedPublisher, GatedStore, InFlight, Publishers, Refusals, Signatures,
};
use super::step_checks::StepChecks;

/// The standard destination every transaction emits an event to.
pub const EVENTS: &str = "events";
/// The FIFO destination every transaction emits an audit entry to.
pub const AUDIT: &str = "audit";

/// How many sent marks a counter holds in the simulation (the default holds four): one,
/// so that a second transaction on a counter meets it full and settles in two writes (its
/// record, then its entry's removal), each with its crash points.
pub const SIM_SENT_MARKS: usize = 1;

/// What one schedule contains.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// API requests, each one transaction incrementing a counter item.
    pub transactions: usize,
    /// Counter items; request `i` increments item `i % items`.
    pub items: usize,
    /// Control workers polling concurrently.
    pub workers: usize,
    /// Most faults injected in one schedule.
    pub fault_budget: usize,
    /// Random-run extras: duplicate sends, clock jumps, clock skew, shared idempotency
    /// keys. Exhaustive runs leave them out to keep the tree finite and small.
    pub random_extras: bool,
    /// Steps after which a schedule counts as a livelock.
    pub max_steps: usize,
    /// The protocol's timing.
    pub timing: Timing,
    /// Requests begin with a deadline this long after they start, if set.
    pub deadline: Option<Duration>,
    /// Explore one retry loop to its end: faults only on this operation
    /// ([`Op::retry_loop_faults`]), as many as the budget allows.
    pub retry_loop: Option<Op>,
    /// The request path publishes committed messages itself and marks the record
    /// dispatched (through its own gates: its publishes and its mark can fail or crash
    /// it, and race the worker's).
    pub inline: bool,
    /// Every this many requests, one abandons its transaction after its read (a no-op
    /// or a 404 decided after begin) instead of committing: requests `n-1`, `2n-1`, ...;
    /// 0 for none, 1 for all.
    pub abandon_every: usize,
    /// Offer only these faults, per operation (overrides `retry_loop` and the defaults).
    pub faults_only: Option<fn(Op) -> Vec<Fault>>,
    /// Requests go through an axum router with the deadline middleware
    /// ([`outbox::http::enforce_deadline`]) and this timeout, and timers fire: the
    /// middleware's backstop and the request path's deadlines cut operations short when
    /// the clock passes them. `deadline` is then ignored.
    pub middleware: Option<Duration>,
    /// Entity mode (docs/PROTOCOL.md section 11): the counters exist before the requests start
    /// (at version 1, count 1), and every request begins naming its counter
    /// ([`Outbox::begin_entity`]), so that its increment commits as one conditional write
    /// of the counter carrying its entry, fenced in the counter when settled. Requests
    /// that keep an idempotency key (random extras) commit in the transactional form.
    pub entity: bool,
    /// Commit requests (and late commits) wait at their gate while anything else can
    /// move: a request checks its window and signs its commit, which then reaches the
    /// table only once the workers and the clock are done (the fence written, in entity
    /// mode).
    pub hold_commits: bool,
    /// Skews of the request paths' clock to choose one from per schedule, in
    /// milliseconds from the simulation's clock (AWS's own time); empty for none. The
    /// request path stamps its control message and checks its window on it. AWS's refusal
    /// of requests signed more than 15 minutes from its time is not modelled (nor the
    /// SDK's correction of the signing clock that it would call for): every request
    /// arrives whenever the scheduler lets it, the worst case.
    pub api_skews: &'static [i64],
    /// The same for the workers' clock; empty for the random extras' small skews.
    pub worker_skews: &'static [i64],
    /// Entity mode: AWS's signature check of entity commits modelled (`Signatures`), the
    /// SDK correcting its signing clock by the skew it learnt (`Some(true)`) or not.
    pub aws_signatures: Option<bool>,
    /// Transactions that outlive their request: each request chosen by `abandon_every`
    /// hands its staged transaction to a task of its own (a `tokio::spawn`, a channel),
    /// which commits it whenever the scheduler lets it, and answers; the request is then
    /// settled by abandoning the transaction, as the HTTP glue does
    /// ([`Outbox::abandon`]). The task's commit and the abandon race in every order.
    pub spawned_commits: bool,
    /// With `inline`: the request path publishes after its answer
    /// ([`Outbox::with_publishing_after_answer`]): the commit returns at once, and its
    /// dispatch becomes an actor of its own, which the scheduler runs whenever it likes,
    /// crashes at any of its steps (answered, then crashed before or while dispatching),
    /// or races against the worker.
    pub after_answer: bool,
    /// An actor deletes each counter and creates it again, each in a transaction of the
    /// request path that reads the counter through its staging and emits an event and an
    /// audit entry (placed in the counter's history like the requests'): the delete at
    /// the version it reads (in a new transaction while the counter holds entries), the
    /// create over the vacant key at the version it reads, racing the requests, their
    /// late and held commits, and the workers.
    pub deletes: bool,
    /// Once, at a random step after every request ended and while every worker is
    /// between batches, the clock jumps past the
    /// retention and the sent marks' margin (`FORGET_MARGIN`): records expire, control
    /// messages turn stale, and a worker reading a counter full of marks drops them. With
    /// AWS's signature check modelled ([`Self::aws_signatures`]), which refuses a request
    /// sent before the jump.
    pub retention_jump: bool,
    /// Entity mode: the requests (by index) that keep an idempotency key, so that they
    /// commit in the transactional form, chosen deterministically (the random extras
    /// choose some at random); empty for none.
    pub keyed: &'static [usize],
    /// Bounds the interleavings, as a preemption-bounded search does: the actor that
    /// moved last, while it can move on, is the first option, and at most this many times
    /// per schedule is another option (another actor, the clock) taken instead; once they
    /// are used up it moves on alone. Where it cannot move on (it finished, crashed, or
    /// waits for the queue), any option is free. `None` for every interleaving.
    pub preemption_bound: Option<usize>,
    /// Checks, after every step, the safety properties that hold at every reachable state
    /// (`StepChecks`: nothing accepted by a destination before its transaction
    /// committed, a key's versions only going up across its lives, nothing both committed
    /// and tombstoned); a schedule that breaks one ends there with an error naming the
    /// step.
    pub step_checks: bool,
    /// Entity mode: each counter is deleted right after it is seeded (straight into the
    /// table, a transaction without messages), so that requests read its key vacant at
    /// version 2 and create it again over the vacant key, at the version read.
    pub vacant: bool,
    /// Every request (and every transaction of the deleter) sends its control message
    /// before its read ([`outbox::request::Transaction::send_control`]), as a handler that
    /// will write for sure does; otherwise it goes out with the commit, and a request that
    /// abandons after its read sends nothing.
    pub sends_early: bool,
    /// Entity mode: each request adds one to its counter ([`outbox::request::Transaction::add`]:
    /// a counter commit, one write that reads nothing first and places the request's
    /// messages in the write) instead of putting the count it read plus one; a create
    /// (the counter not there) stays a put.
    pub adds: bool,
}

/// A protocol timing for simulations: a window of `window_seconds`, so that schedules
/// reach the deferral and tombstone paths in a few steps.
pub fn sim_timing(window_seconds: u64) -> Timing {
    Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(4),
        max_commit_duration: Duration::from_secs(window_seconds),
        retention: Duration::from_secs(3600),
    }
}

/// How an API request ended.
#[derive(Debug)]
pub enum ApiResult {
    /// The request path answered.
    Answered(Result<Committed, TxnError>),
    /// The request abandoned its transaction after its read, and the request path's
    /// abandon found this (nothing to settle, or what its tombstone write found).
    Abandoned {
        /// The transaction.
        txn_id: TxnId,
        /// What the abandon found.
        settlement: Settlement,
    },
    /// The API crashed before answering.
    Crashed,
    /// The request went through the deadline middleware, which answered this.
    Http {
        /// The status.
        status: u16,
        /// The transaction the answer names (its `x-transaction-id` header).
        named: Option<TxnId>,
        /// Whether the answer says the outcome is unknown (`/problems/outcome-unknown`).
        unknown: bool,
        /// The transaction the handler began, if its control message was sent (from
        /// then on every answer names it).
        began: Option<TxnId>,
        /// Whether the middleware answered for a handler that overran.
        timed_out: bool,
        /// How many times the handler's read-decide-stage step ran: more than once when a
        /// commit met a version conflict and the step ran again in a new transaction.
        attempts: u32,
    },
}

impl ApiResult {
    /// Whether the answer claims the request's transaction committed (a success).
    pub fn claims_committed(&self) -> bool {
        match self {
            ApiResult::Answered(result) => result.is_ok(),
            ApiResult::Http { status, .. } => (200..300).contains(status),
            ApiResult::Abandoned { .. } | ApiResult::Crashed => false,
        }
    }
}

/// What a schedule did and left behind.
#[derive(Debug)]
pub struct Outcome {
    /// Scheduler steps taken.
    pub steps: usize,
    /// Faults injected.
    pub faults: usize,
    /// Dead-letter redrives performed during recovery.
    pub redrives: usize,
    /// The final state, for the invariant checks.
    pub observed: Observed,
    /// The retry loops this schedule ran to their end.
    pub loop_ends: LoopEnds,
    /// How requests whose commit met an unknown outcome were answered.
    pub unknown_commits: UnknownCommits,
    /// Operations that went on their way after their caller stopped waiting.
    pub late: LateOps,
    /// Dispatches after the answer ([`SimConfig::after_answer`]).
    pub after_answer: AfterAnswerRuns,
    /// What the entities' chains met.
    pub chains: ChainCounts,
    /// Steps after which the per-step checks ran ([`SimConfig::step_checks`]).
    pub steps_checked: usize,
}

/// What the schedules did with the entities' chains: the transactions placed in their
/// entity's history, who published them first, and the attempts the continued version
/// refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainCounts {
    /// Committed transactions whose messages are placed in their entity's history.
    pub placed: usize,
    /// Of those, committed in entity form (their entry in the entity); the others
    /// committed in the transactional form (a record beside it). The first deliveries of
    /// both on a FIFO destination are checked in seq order.
    pub entity_form: usize,
    /// Placed transactions first published by a later transaction's publisher (the
    /// request path or a control worker dispatching a later transaction of the entity
    /// sent its earlier entry first), before their own control message or request path
    /// got to them.
    pub predecessor_first: usize,
    /// Placed transactions first published by a control worker (their request path
    /// crashed or failed after the commit, or does not publish).
    pub first_by_worker: usize,
    /// Commit attempts of a transaction that had committed already, refused by the
    /// version its item continued at (late attempts, and retries after a lost reply).
    pub refused_by_version: usize,
}

impl ChainCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ChainCounts) {
        self.placed += other.placed;
        self.entity_form += other.entity_form;
        self.predecessor_first += other.predecessor_first;
        self.first_by_worker += other.first_by_worker;
        self.refused_by_version += other.refused_by_version;
    }
}

/// What became of the dispatches handed over to run after the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AfterAnswerRuns {
    /// Handed over by a commit that had returned.
    pub handed: usize,
    /// Ran to their end (dispatched, or left to the worker after a failure).
    pub finished: usize,
    /// Crashed at one of their steps: the process died after the answer.
    pub crashed: usize,
    /// Of those, crashed before their first publish: nothing went out inline.
    pub crashed_before_publishing: usize,
}

impl AfterAnswerRuns {
    /// `self + other`.
    pub fn add(&mut self, other: &AfterAnswerRuns) {
        self.handed += other.handed;
        self.finished += other.finished;
        self.crashed += other.crashed;
        self.crashed_before_publishing += other.crashed_before_publishing;
    }
}

/// Operations that went on their way after their caller stopped waiting
/// ([`Fault::Late`]), by kind, and what the request path met while a commit of its own
/// was still on its way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LateOps {
    /// Late commits sent, and applied (the rest were lost on their way).
    pub commits: (usize, usize),
    /// Late tombstone puts sent, and applied.
    pub tombstones: (usize, usize),
    /// Late marks sent, and applied.
    pub marks: (usize, usize),
    /// Late control message sends sent, and applied.
    pub control_sends: (usize, usize),
    /// Late operations that applied after the actor that sent them had ended (answered,
    /// or crashed): what nobody waits for any more.
    pub applied_after_sender_ended: usize,
    /// Requests whose commit was refused definitely (contention, unavailable) while an
    /// earlier attempt of theirs was still on its way: a definite-looking error hiding
    /// an attempt in flight.
    pub refused_behind_in_flight: usize,
    /// Requests whose settling tombstone write failed while an attempt of their commit
    /// was still on its way.
    pub settle_failed_in_flight: usize,
    /// Late commits that applied after their request had been answered.
    pub commit_applied_after_answer: usize,
    /// Entity commits refused by their item's fence mark (entity mode only): late ones,
    /// and any arriving after their transaction, or a later one on the item, was fenced.
    pub fence_refused: usize,
    /// Entity commits AWS refused for their `X-Amz-Date` (where modelled).
    pub signature_refused: usize,
}

impl LateOps {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &LateOps) {
        let sum = |a: &mut (usize, usize), b: (usize, usize)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        sum(&mut self.commits, other.commits);
        sum(&mut self.tombstones, other.tombstones);
        sum(&mut self.marks, other.marks);
        sum(&mut self.control_sends, other.control_sends);
        self.applied_after_sender_ended += other.applied_after_sender_ended;
        self.refused_behind_in_flight += other.refused_behind_in_flight;
        self.settle_failed_in_flight += other.settle_failed_in_flight;
        self.commit_applied_after_answer += other.commit_applied_after_answer;
        self.fence_refused += other.fence_refused;
        self.signature_refused += other.signature_refused;
    }

    fn kind(&mut self, op: Op) -> &mut (usize, usize) {
        match op {
            Op::LateCommit => &mut self.commits,
            Op::LateTombstone => &mut self.tombstones,
            Op::LateMark => &mut self.marks,
            _ => &mut self.control_sends,
        }
    }
}

/// Requests whose commit had an attempt of unknown outcome (its reply lost, or timed out
/// with the request on its way), by how they were answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnknownCommits {
    /// Answered "committed" (the settling write found the transaction's own record, or a
    /// retry did).
    pub committed: usize,
    /// Answered with a definite failure (the settling write's tombstone, or a definite
    /// refusal).
    pub definite_failure: usize,
    /// Answered "outcome unknown" before their deadline (the settling write failed).
    pub ambiguous: usize,
    /// Answered "outcome unknown" after their deadline had passed (no time to settle).
    pub ambiguous_after_deadline: usize,
    /// The API crashed before answering.
    pub crashed: usize,
}

impl UnknownCommits {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &UnknownCommits) {
        self.committed += other.committed;
        self.definite_failure += other.definite_failure;
        self.ambiguous += other.ambiguous;
        self.ambiguous_after_deadline += other.ambiguous_after_deadline;
        self.crashed += other.crashed;
    }

    /// Those answered definitely, of those answered before their deadline.
    pub fn definite_share(&self) -> (usize, usize) {
        let definite = self.committed + self.definite_failure;
        (definite, definite + self.ambiguous)
    }

    fn record(&mut self, result: &ApiResult, before_deadline: bool) {
        match result {
            ApiResult::Http { status, .. } if (200..300).contains(status) => self.committed += 1,
            ApiResult::Http { unknown: true, .. } => self.ambiguous += 1,
            ApiResult::Http { .. } => self.definite_failure += 1,
            ApiResult::Answered(Ok(_)) => self.committed += 1,
            ApiResult::Answered(Err(error)) if error.is_definite() => self.definite_failure += 1,
            ApiResult::Answered(Err(_)) if before_deadline => self.ambiguous += 1,
            ApiResult::Answered(Err(_)) => self.ambiguous_after_deadline += 1,
            ApiResult::Crashed => self.crashed += 1,
            ApiResult::Abandoned { .. } => {}
        }
    }
}

/// Retry loops run to their end in a schedule: every attempt failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopEnds {
    /// Commits whose every attempt had an unknown outcome.
    pub commit_all_unknown: usize,
    /// Commits whose every attempt was refused (unavailable or contention).
    pub commit_all_refused: usize,
    /// Commits whose attempts were first of unknown outcome, then refused.
    pub commit_unknown_then_refused: usize,
    /// Other mixes of failed attempts that used up a commit's attempts.
    pub commit_other_mix: usize,
    /// Publish passes in which an entry failed on every attempt.
    pub publish_exhausted: usize,
    /// Settling tombstone writes of the request path that failed on every attempt.
    pub settle_exhausted: usize,
}

impl LoopEnds {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &LoopEnds) {
        self.commit_all_unknown += other.commit_all_unknown;
        self.commit_all_refused += other.commit_all_refused;
        self.commit_unknown_then_refused += other.commit_unknown_then_refused;
        self.commit_other_mix += other.commit_other_mix;
        self.publish_exhausted += other.publish_exhausted;
        self.settle_exhausted += other.settle_exhausted;
    }

    fn record_commit(&mut self, faults: &[Fault]) {
        let unknown = |fault: &Fault| *fault == Fault::ReplyLost;
        let refused = |fault: &Fault| matches!(fault, Fault::Fail | Fault::Busy);
        if faults.iter().all(unknown) {
            self.commit_all_unknown += 1;
        } else if faults.iter().all(refused) {
            self.commit_all_refused += 1;
        } else if faults.iter().skip_while(|fault| unknown(fault)).all(refused) {
            self.commit_unknown_then_refused += 1;
        } else {
            self.commit_other_mix += 1;
        }
    }
}

struct SimIds(AtomicU64);

impl IdSource for SimIds {
    fn next_txn_id(&self, now: Timestamp) -> TxnId {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let mut random = [0u8; 10];
        random[2..].copy_from_slice(&n.to_be_bytes());
        TxnId::from_parts(now, random)
    }
}

enum Kind {
    Api(usize),
    Worker,
    /// An operation on its way after its caller (`origin`) stopped waiting.
    Ghost {
        origin: ActorId,
        op: Op,
    },
    /// A task a request handed its transaction to, committing it.
    Spawned,
    /// A request path's dispatch after its answer.
    AfterAnswer,
    /// Deletes a counter and creates it again.
    Deleter,
}

/// How an actor's future ends.
enum End {
    Request(ApiResult),
    Ghost,
    /// A commit handed to a task of its own ([`SimConfig::spawned_commits`]), its result.
    Spawned(ApiResult),
    /// A dispatch after the answer that ran to its end.
    AfterAnswer,
}

/// Transactions handed to tasks of their own, waiting for the scheduler to make actors
/// of them.
type Handed = Arc<std::sync::Mutex<Vec<outbox::request::Transaction>>>;

type ActorFuture = Pin<Box<dyn Future<Output = End>>>;

/// Dispatches handed over to run after the answer, waiting for the scheduler to make
/// actors of them.
type AfterWork = Arc<std::sync::Mutex<Vec<outbox::request::after_answer::Work>>>;

struct Actor {
    id: ActorId,
    kind: Kind,
    future: ActorFuture,
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    gates: Gates,
    ids: Arc<SimIds>,
    next_actor: ActorId,
    worker_skew: i64,
    /// The request paths' clock skew.
    api_skew: i64,
    timing: Timing,
    in_flight: InFlight,
    timers_fire: bool,
    /// Transactions handed to tasks of their own.
    handed: Handed,
    /// Dispatches handed over to run after the answer.
    after_work: AfterWork,
    /// Entity mode: commits refused by their item's fence mark.
    fenced_out: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// Entity mode, where modelled: AWS's signature check.
    signatures: Option<Signatures>,
    /// Who publishes for whom.
    publishers: Publishers,
    /// Attempts of committed transactions refused by their item's version.
    refusals: Refusals,
    /// The deleters, by actor, and the counter each deletes.
    deleting: BTreeMap<ActorId, ItemKey>,
}

impl World {
    /// A world; in entity mode (`seeded` counters), counting commits refused by a fence.
    fn new(worker_skew: i64, timing: Timing, timers_fire: bool, seeded: &[ItemKey], vacant: bool) -> Self {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let destinations = [
            (EVENTS.parse().expect("valid"), false),
            (AUDIT.parse().expect("valid"), true),
        ];
        // The invariants are checked against what really happened.
        let backend = EmbeddedBackend::new(clock.clone(), destinations);
        backend.record();
        let ids = Arc::new(SimIds(AtomicU64::new(1)));
        for key in seeded {
            seed(&backend, &ids, clock.now(), timing, key, vacant);
        }
        let fenced_out = (!seeded.is_empty()).then(Arc::default);
        let refusals = Refusals {
            store: backend.store.clone(),
            count: Arc::default(),
        };
        Self {
            refusals,
            publishers: Publishers::default(),
            backend,
            clock,
            gates: Gates::default(),
            ids,
            next_actor: 0,
            worker_skew,
            api_skew: 0,
            timing,
            in_flight: InFlight::default(),
            timers_fire,
            handed: Handed::default(),
            after_work: AfterWork::default(),
            fenced_out,
            signatures: None,
            deleting: BTreeMap::new(),
        }
    }

    /// Whether `actor` is a deleter whose counter holds entries still to be dispatched.
    fn holds_entries(&self, actor: &ActorId) -> bool {
        use futures::FutureExt;
        use outbox::ports::Store;
        self.deleting.get(actor).is_some_and(|key| {
            Store::get_entity(self.backend.store.as_ref(), key)
                .now_or_never()
                .and_then(Result::ok)
                .flatten()
                .is_some_and(|item| !item.entries.is_empty())
        })
    }

    fn store(&self, gate: &Gate) -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner: self.backend.store.clone(),
            gate: gate.clone(),
            in_flight: self.in_flight.clone(),
            fenced_out: self.fenced_out.clone(),
            signatures: self.signatures.clone(),
            publishers: Some(self.publishers.clone()),
            refusals: Some(self.refusals.clone()),
        })
    }

    /// Ghost actors for the operations that went on their way since the last call.
    fn ghosts(&mut self) -> Vec<Actor> {
        let requests = std::mem::take(&mut *self.in_flight.lock().expect("in-flight lock"));
        requests
            .into_iter()
            .map(|(origin, late)| {
                let (id, gate) = self.gate();
                let store: Arc<dyn outbox::ports::Store> = self.backend.store.clone();
                let queue: Arc<dyn outbox::ports::ControlQueue> = self.backend.control_queue.clone();
                let op = late.op();
                let fenced_out = self.fenced_out.clone();
                let signatures = self.signatures.clone();
                let refusals = self.refusals.clone();
                let future: ActorFuture = Box::pin(async move {
                    late_op(
                        store,
                        queue,
                        gate,
                        late,
                        fenced_out.as_ref(),
                        signatures.as_ref(),
                        Some(&refusals),
                    )
                    .await;
                    End::Ghost
                });
                Actor {
                    id,
                    kind: Kind::Ghost { origin, op },
                    future,
                }
            })
            .collect()
    }

    fn control_queue(&self, gate: &Gate) -> GatedControlQueue<outbox::embedded::EmbeddedControlQueue> {
        GatedControlQueue {
            inner: self.backend.control_queue.clone(),
            gate: gate.clone(),
            in_flight: self.in_flight.clone(),
            publishers: Some(self.publishers.clone()),
        }
    }

    fn gate(&mut self) -> (ActorId, Gate) {
        let id = self.next_actor;
        self.next_actor += 1;
        (id, self.gates.for_actor(id))
    }

    fn clock_for(&self, gate: &Gate, skew_millis: i64) -> Arc<dyn Clock> {
        Arc::new(GatedClock {
            inner: self.clock.clone(),
            skew_millis,
            gate: gate.clone(),
            timers_fire: self.timers_fire,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn api(
        &mut self,
        index: usize,
        key: ItemKey,
        idempotency: Option<IdempotencySlot>,
        deadline: Option<Duration>,
        inline: bool,
        abandons: bool,
        middleware: Option<Duration>,
        entity: bool,
        spawns: bool,
        after_answer: bool,
        sends_early: bool,
        adds: bool,
    ) -> Actor {
        let (id, own_gate) = self.gate();
        // A request that hands its transaction to a task, or its dispatch to run after
        // its answer, shares its ports with that task: each operation passes the gate of
        // whichever of them performs it.
        let gate = if (spawns && abandons) || (inline && after_answer) {
            self.gates.shared()
        } else {
            own_gate
        };
        let mut outbox = Outbox::new(
            RequestPorts {
                store: self.store(&gate),
                control_queue: Arc::new(self.control_queue(&gate)),
                clock: self.clock_for(&gate, self.api_skew),
                ids: self.ids.clone(),
            },
            self.timing,
            TransactionLimits::default(),
        )
        .with_sent_marks(SIM_SENT_MARKS);
        if inline {
            let publisher = Arc::new(GatedPublisher {
                inner: self.backend.publisher.clone(),
                gate: gate.clone(),
                publishers: Some(self.publishers.clone()),
            });
            outbox = if after_answer {
                let after_work = self.after_work.clone();
                let spawner = Arc::new(move |work| after_work.lock().expect("after-answer lock").push(work));
                outbox.with_publishing_after_answer(publisher, AfterAnswer::with_spawner(spawner))
            } else {
                outbox.with_inline_publisher(publisher)
            };
        }
        let future: ActorFuture = match middleware {
            Some(timeout) => Box::pin(async move {
                End::Request(increment_over_http(outbox, timeout, key, abandons, entity, sends_early, adds).await)
            }),
            None => {
                let hand_to = (spawns && abandons).then(|| self.handed.clone());
                Box::pin(async move {
                    End::Request(
                        increment(
                            &outbox,
                            key,
                            idempotency,
                            deadline,
                            abandons,
                            entity,
                            sends_early,
                            adds,
                            hand_to,
                        )
                        .await,
                    )
                })
            }
        };
        Actor {
            id,
            kind: Kind::Api(index),
            future,
        }
    }

    /// Actors for the dispatches handed over to run after the answer since the last call
    /// (by `origin`, the actor just polled: they publish for what it committed).
    fn after_answers(&mut self, origin: ActorId) -> Vec<Actor> {
        let handed = std::mem::take(&mut *self.after_work.lock().expect("after-answer lock"));
        handed
            .into_iter()
            .map(|work| {
                let (id, _) = self.gate();
                self.publishers.inherit(origin, id);
                let future: ActorFuture = Box::pin(async move {
                    work.await;
                    End::AfterAnswer
                });
                Actor {
                    id,
                    kind: Kind::AfterAnswer,
                    future,
                }
            })
            .collect()
    }

    /// Tasks for the transactions handed over since the last call: each waits for the
    /// scheduler, then commits.
    fn spawned(&mut self) -> Vec<Actor> {
        let handed = std::mem::take(&mut *self.handed.lock().expect("handed lock"));
        handed
            .into_iter()
            .map(|txn| {
                let (id, _) = self.gate();
                let clock = self.clock_for(&self.gates.shared(), self.api_skew);
                let future: ActorFuture = Box::pin(async move {
                    // The task starts when the scheduler lets it: before the request's
                    // abandon or after it.
                    clock.sleep(Duration::ZERO).await;
                    End::Spawned(ApiResult::Answered(txn.commit().await))
                });
                Actor {
                    id,
                    kind: Kind::Spawned,
                    future,
                }
            })
            .collect()
    }

    /// Deletes counter `key` and creates it again, each in a transaction of the request
    /// path (begun naming the counter in entity mode) through its gates, which reads the
    /// counter through its staging, so that the event and the audit entry it emits are
    /// placed in the counter's history: the delete at the version read (in a new
    /// transaction while the counter holds entries or changes; it reads the counter,
    /// waiting, while it holds entries), then the create of the vacant key at the version
    /// read ([`ExpectedVersion::AbsentAt`]). The worker publishes them.
    fn deleter(&mut self, key: ItemKey, entity: bool, spins: bool, sends_early: bool) -> Actor {
        const TRIES: usize = 6;
        // Reads of the counter while it holds entries, before a delete is tried anyway.
        const WAITS: usize = 4;
        let (id, gate) = self.gate();
        self.deleting.insert(id, key.clone());
        let store = self.store(&gate);
        let clock = self.clock_for(&gate, 0);
        let idle = gate.clone();
        let outbox = Outbox::new(
            RequestPorts {
                store: self.store(&gate),
                control_queue: Arc::new(self.control_queue(&gate)),
                clock: self.clock_for(&gate, 0),
                ids: self.ids.clone(),
            },
            self.timing,
            TransactionLimits::default(),
        )
        .with_sent_marks(SIM_SENT_MARKS);
        let future: ActorFuture = Box::pin(async move {
            use outbox::ports::Store;
            for create in [false, true] {
                for _ in 0..TRIES {
                    // A delete waits while the counter holds entries still to be
                    // dispatched (the table refuses it then), rather than spend a
                    // transaction on each refusal. In a bounded exploration it waits at
                    // a gate the scheduler opens once the counter holds none (or nothing
                    // else can move): each read and sleep of a wait would be a step to
                    // interleave.
                    if !spins && !create {
                        idle.pass(Op::AwaitIdle).await;
                    }
                    for _ in 0..WAITS {
                        if !spins {
                            break;
                        }
                        let busy = store
                            .get_keys(std::slice::from_ref(&key))
                            .await
                            .map_or(true, |read| read.get(&key).is_some_and(|read| !read.entries.is_empty()));
                        if create || !busy {
                            break;
                        }
                        clock.sleep(Duration::from_secs(1)).await;
                    }
                    if delete_or_create(&outbox, &key, entity, create, sends_early).await {
                        break;
                    }
                }
            }
            End::Ghost
        });
        Actor {
            id,
            kind: Kind::Deleter,
            future,
        }
    }

    /// The chain counts of a schedule that ended with `observed`.
    fn chain_counts(&self, observed: &Observed) -> ChainCounts {
        let firsts = self.publishers.first_sends();
        let placed: BTreeMap<TxnId, bool> = observed
            .placed
            .iter()
            .map(|placed| (placed.txn_id, placed.entity_form))
            .collect();
        let mut counts = ChainCounts {
            placed: placed.len(),
            entity_form: placed.values().filter(|entity_form| **entity_form).count(),
            refused_by_version: self.refusals.count.load(Ordering::Relaxed),
            ..ChainCounts::default()
        };
        for first in placed.keys().filter_map(|txn_id| firsts.get(txn_id)) {
            counts.predecessor_first += usize::from(!first.own);
            counts.first_by_worker += usize::from(first.by_worker);
        }
        counts
    }

    fn worker(&mut self) -> Actor {
        let (id, gate) = self.gate();
        let inbox = self.control_queue(&gate);
        let control = ControlPath::new(
            ControlPorts {
                store: self.store(&gate),
                control_queue: Arc::new(self.control_queue(&gate)),
                publisher: Arc::new(GatedPublisher {
                    inner: self.backend.publisher.clone(),
                    gate: gate.clone(),
                    publishers: Some(self.publishers.clone()),
                }),
                clock: self.clock_for(&gate, self.worker_skew),
            },
            self.timing,
        )
        .with_sent_marks(SIM_SENT_MARKS);
        let future = Box::pin(async move {
            loop {
                // Errors leave messages to come back after their visibility timeout.
                let _ = poll_once(&inbox, &control, Duration::ZERO).await;
            }
        });
        Actor {
            id,
            kind: Kind::Worker,
            future,
        }
    }
}

/// Writes counter `key` at version 1, count 1, straight into the table (no gate, no
/// control message): a committed transaction with no messages, in the history like any
/// other, so that the checks count it among the counter's writers; with `vacant`, deleted
/// again the same way (the key vacant at version 2).
fn seed(backend: &EmbeddedBackend, ids: &SimIds, now: Timestamp, timing: Timing, key: &ItemKey, vacant: bool) {
    use futures::FutureExt;
    use outbox::ports::{BusinessWrite, CommitRequest, Store};
    use outbox::protocol::OutboxRecord;

    // One committed transaction of `write`, with no messages.
    let commit = |write: BusinessWrite, what: &str| {
        let txn_id = ids.next_txn_id(now);
        let request = CommitRequest {
            txn_id,
            writes: vec![write],
            outbox: OutboxRecord::committed(txn_id, Vec::new(), now, now.plus(timing.retention)),
            idempotency: None,
        };
        Store::commit(backend.store.as_ref(), &request)
            .now_or_never()
            .expect("the embedded store answers at once")
            .expect(what);
    };
    commit(
        BusinessWrite::Put {
            key: key.clone(),
            data: json!({ "count": 1 }),
            expected: ExpectedVersion::Absent,
        },
        "a fresh table takes the seed",
    );
    if vacant {
        commit(
            BusinessWrite::Delete {
                key: key.clone(),
                version: 1,
            },
            "the seeded counter is deleted",
        );
    }
}

/// One transaction of the deleter: reads `key` through its staging, and deletes it at the
/// version read (`create` false) or creates it over the vacant key at the version read
/// (`create`), with an event and an audit entry about it. Whether it is done: committed,
/// or found done already (the key vacant for a delete, live for a create: an attempt of
/// an earlier try applied late, or a request created the counter); otherwise it is tried
/// again in a new transaction. With `sends_early`, each transaction sends its control
/// message before its read.
async fn delete_or_create(outbox: &Outbox, key: &ItemKey, entity: bool, create: bool, sends_early: bool) -> bool {
    let begun = if entity {
        outbox.begin_entity(key.clone()).await
    } else {
        outbox.begin().await
    };
    let Ok(mut txn) = begun else { return false };
    if sends_early && txn.send_control().await.is_err() {
        return false;
    }
    let read = match txn.get(key).await {
        Ok(read) => read,
        Err(_) => {
            txn.abandon().await;
            return false;
        }
    };
    match (read, create) {
        (Some(item), false) => txn.delete(key.clone(), item.version),
        (None, true) => txn.put(key.clone(), json!({ "count": 1 }), ExpectedVersion::Absent),
        _ => {
            txn.abandon().await;
            return true;
        }
    }
    let change = if create { "created" } else { "deleted" };
    let events: DestinationName = EVENTS.parse().expect("valid");
    let audit: DestinationName = AUDIT.parse().expect("valid");
    txn.emit(Message::json(events, &json!({ "item": key.as_str(), "change": change })).expect("serialisable"));
    let entry = json!({ "item": key.as_str(), "txn": txn.id().to_string(), "change": change });
    txn.emit(
        Message::json(audit, &entry)
            .expect("serialisable")
            .with_group_id(key.as_str()),
    );
    txn.commit().await.is_ok()
}

/// The business logic of every simulated request: read a counter, increment it, and
/// emit one event and one FIFO audit entry about it; or, when it `abandons`, give up the
/// transaction after the read (a no-op, a 404). With `hand_to`, an abandoning request
/// stages its increment and hands the transaction to a task of its own, which commits it
/// (past the answer); then it abandons the transaction, as the HTTP glue does. With
/// `sends_early`, it sends its control message before its read.
#[allow(clippy::too_many_arguments)]
async fn increment(
    outbox: &Outbox,
    key: ItemKey,
    idempotency: Option<IdempotencySlot>,
    deadline: Option<Duration>,
    abandons: bool,
    entity: bool,
    sends_early: bool,
    adds: bool,
    hand_to: Option<Handed>,
) -> ApiResult {
    let result = async {
        let deadline = deadline.map(|deadline| outbox.clock().now().plus(deadline));
        let txn = match (deadline, entity) {
            (Some(deadline), false) => outbox.begin_within(deadline).await?,
            (None, false) => outbox.begin().await?,
            (Some(deadline), true) => outbox.begin_entity_within(key.clone(), deadline).await?,
            (None, true) => outbox.begin_entity(key.clone()).await?,
        };
        let mut txn = txn;
        if sends_early {
            txn.send_control().await?;
        }
        let current = txn.get(&key).await?;
        if let (true, Some(handed)) = (abandons, &hand_to) {
            let txn_id = txn.id();
            stage(&mut txn, key, current, adds);
            handed.lock().expect("handed lock").push(txn);
            // The answer goes out; the task may start its commit before the settling.
            outbox.clock().sleep(Duration::ZERO).await;
            return Ok(Err((txn_id, outbox.abandon(txn_id, None).await)));
        }
        if abandons {
            let txn_id = txn.id();
            return Ok(Err((txn_id, txn.abandon().await)));
        }
        Ok::<_, TxnError>(Ok(stage_increment(txn, key, current, idempotency, adds).await?))
    };
    match result.await {
        Ok(Ok(committed)) => ApiResult::Answered(Ok(committed)),
        Ok(Err((txn_id, settlement))) => ApiResult::Abandoned { txn_id, settlement },
        Err(error) => ApiResult::Answered(Err(error)),
    }
}

/// Stages the increment of `current` and commits it.
async fn stage_increment(
    mut txn: outbox::request::Transaction,
    key: ItemKey,
    current: Option<outbox::ports::VersionedItem>,
    idempotency: Option<IdempotencySlot>,
    adds: bool,
) -> Result<Committed, TxnError> {
    let count = stage(&mut txn, key, current, adds);
    if let Some(slot) = idempotency {
        let response = StoredResponse {
            status: 200,
            headers: vec![],
            body: count.to_string(),
        };
        txn.remember_response(slot, "fingerprint".into(), response);
    }
    txn.commit().await
}

/// The business logic of a request through the deadline middleware: the same increment,
/// in an axum handler that begins through its [`RequestScope`] and commits through it;
/// a request that abandons answers 404 and leaves the middleware to settle its
/// transaction. With `sends_early`, it sends its control message before its read.
async fn increment_over_http(
    outbox: Outbox,
    timeout: Duration,
    key: ItemKey,
    abandons: bool,
    entity: bool,
    sends_early: bool,
    adds: bool,
) -> ApiResult {
    use axum::response::IntoResponse;
    use outbox::http::{Answer, Deadlines, HttpError, RequestScope};
    use tower::ServiceExt;

    let began: Arc<std::sync::Mutex<Option<TxnId>>> = Arc::default();
    let handler_began = began.clone();
    let attempts: Arc<std::sync::atomic::AtomicU32> = Arc::default();
    let handler_attempts = attempts.clone();
    let handler = move |scope: RequestScope| async move {
        // Through the retry of version conflicts, as a handler whose business rule may
        // still allow the change would: each attempt a new transaction, the answer the
        // last one's.
        let on = entity.then(|| key.clone());
        let result: Result<axum::response::Response, HttpError> = scope
            .retry_conflicts(on, None, |mut txn| {
                let (key, began) = (key.clone(), handler_began.clone());
                handler_attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move {
                    // Once its control message is out, every answer must name it (the
                    // last attempt's: an earlier one met a conflict, nothing written).
                    *began.lock().expect("lock") = None;
                    txn.on_control_send(move |txn_id| *began.lock().expect("lock") = Some(txn_id));
                    if sends_early {
                        txn.send_control().await.map_err(HttpError::from)?;
                    }
                    let current = txn.get(&key).await.map_err(HttpError::from)?;
                    if abandons {
                        let missing =
                            outbox::http::Problem::new(axum::http::StatusCode::NOT_FOUND, "not-found", "Not found");
                        return Err(HttpError::from(missing));
                    }
                    let count = stage(&mut txn, key, current, adds);
                    Ok((txn, Answer::json(axum::http::StatusCode::OK, &count)))
                }
            })
            .await;
        result.into_response()
    };
    let app = axum::Router::new()
        .route("/", axum::routing::post(handler))
        .layer(axum::middleware::from_fn_with_state(
            Deadlines::new(outbox, timeout),
            outbox::http::enforce_deadline,
        ));
    let request = axum::http::Request::post("/")
        .body(axum::body::Body::empty())
        .expect("a valid request");
    let response = app.oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let named = response
        .headers()
        .get(outbox::http::TRANSACTION_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok());
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("an in-memory body")
        .to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let problem_type = problem["type"].as_str().unwrap_or_default();
    let began = *began.lock().expect("lock");
    ApiResult::Http {
        status,
        named,
        unknown: problem_type.ends_with("/outcome-unknown"),
        began,
        // The middleware's own answers: a timeout, or an unknown outcome because time ran out.
        timed_out: problem_type.ends_with("/timeout")
            || problem["detail"]
                .as_str()
                .is_some_and(|detail| detail.contains("ran out of time")),
        attempts: attempts.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Stages the increment of `current`, with its event and audit entry; the new count (as
/// read plus one: with `adds`, an addition that another may precede).
fn stage(
    txn: &mut outbox::request::Transaction,
    key: ItemKey,
    current: Option<outbox::ports::VersionedItem>,
    adds: bool,
) -> u64 {
    let (count, expected) = match &current {
        Some(item) => (
            item.data["count"].as_u64().expect("counters hold a count") + 1,
            ExpectedVersion::Exactly(item.version),
        ),
        None => (1, ExpectedVersion::Absent),
    };
    if adds && current.is_some() {
        txn.add(outbox::counter::Add {
            field: "count".into(),
            delta: 1,
            at_least: None,
            at_most: None,
        });
    } else {
        txn.put(key.clone(), json!({ "count": count }), expected);
    }
    let events: DestinationName = EVENTS.parse().expect("valid");
    let audit: DestinationName = AUDIT.parse().expect("valid");
    txn.emit(Message::json(events, &json!({ "item": key.as_str(), "count": count })).expect("serialisable"));
    let entry = json!({ "item": key.as_str(), "txn": txn.id().to_string() });
    txn.emit(
        Message::json(audit, &entry)
            .expect("serialisable")
            .with_group_id(key.as_str()),
    );
    count
}

#[derive(Clone, Copy)]
enum Action {
    /// Let the actor at this position through its gate.
    Step(usize),
    /// Poll the actor at this position, whose timer has fired, without letting it
    /// through its gate.
    Wake(usize),
    /// Move the clock.
    Advance(Timestamp),
}

/// Polls `actor` once; `Some` when it finished.
fn poll(actor: &mut Actor) -> Poll<End> {
    let mut context = Context::from_waker(Waker::noop());
    super::gate::as_actor(actor.id, || actor.future.as_mut().poll(&mut context))
}

/// Runs one schedule to quiescence with every decision taken from `chooser`.
pub fn run_schedule(chooser: &mut dyn Chooser, config: &SimConfig) -> Result<Outcome, String> {
    let extras = config.random_extras;
    let skew_choices = [0_i64, -4_000, 4_000, 15_000];
    let worker_skew = if !config.worker_skews.is_empty() {
        config.worker_skews[chooser.pick(config.worker_skews.len())]
    } else if extras && chooser.chance(20) {
        skew_choices[chooser.pick(skew_choices.len())]
    } else {
        0
    };
    let api_skew = if config.api_skews.is_empty() {
        0
    } else {
        config.api_skews[chooser.pick(config.api_skews.len())]
    };
    let counters: Vec<ItemKey> = (0..config.items.max(1))
        .map(|index| format!("COUNTER#{index}").parse().expect("valid key"))
        .collect();
    let seeded = if config.entity { counters.as_slice() } else { &[] };
    let mut world = World::new(
        worker_skew,
        config.timing,
        config.middleware.is_some(),
        seeded,
        config.vacant,
    );
    world.api_skew = api_skew;
    if let (Some(sdk_corrects), true) = (config.aws_signatures, config.entity) {
        world.signatures = Some(Signatures {
            clock: world.clock.clone(),
            host_skew_millis: api_skew,
            sdk_corrects,
            refused: Arc::default(),
        });
    }
    let mut api_results: Vec<Option<ApiResult>> = (0..config.transactions).map(|_| None).collect();
    let mut actors: Vec<Actor> = Vec::new();
    let mut slots: Vec<Option<IdempotencySlot>> = Vec::new();
    for index in 0..config.transactions {
        let key = counters[index % counters.len()].clone();
        // A client retrying with the key of the request before it.
        let slot = if extras && index > 0 && chooser.chance(25) {
            slots[index - 1].clone()
        } else if config.entity && !config.keyed.contains(&index) && !(extras && chooser.chance(25)) {
            // Entity mode's one-write commit takes no idempotency record; a quarter of
            // the random schedules' requests keep theirs and commit in the
            // transactional form, fenced alike.
            None
        } else {
            let key: IdempotencyKey = format!("key-{index}").parse().expect("valid key");
            Some(IdempotencySlot::new("counters.increment", &key))
        };
        slots.push(slot.clone());
        let abandons = config.abandon_every > 0 && index % config.abandon_every == config.abandon_every - 1;
        actors.push(world.api(
            index,
            key,
            slot,
            config.deadline,
            config.inline,
            abandons,
            config.middleware,
            config.entity,
            config.spawned_commits,
            config.after_answer,
            config.sends_early,
            config.adds,
        ));
    }
    if config.deletes {
        for key in &counters {
            actors.push(world.deleter(
                key.clone(),
                config.entity,
                config.preemption_bound.is_none(),
                config.sends_early,
            ));
        }
    }
    for _ in 0..config.workers {
        actors.push(world.worker());
    }
    // Run every actor to its first gate.
    let mut finished = Vec::new();
    for (position, actor) in actors.iter_mut().enumerate() {
        if let Poll::Ready(End::Request(result)) = poll(actor) {
            finished.push((position, result));
        }
    }
    for (position, result) in finished.into_iter().rev() {
        if let Kind::Api(index) = actors.remove(position).kind {
            api_results[index] = Some(result);
        }
    }
    let deadline = config.deadline.map(|deadline| world.clock.now().plus(deadline));

    let control = world.backend.control_queue.queue().clone();
    let dead_letters = control
        .dead_letter_queue()
        .expect("the control queue has a DLQ")
        .clone();
    let jump_sizes = [
        Duration::from_secs(3),
        Duration::from_secs(11),
        Duration::from_secs(45),
        Duration::from_secs(400),
    ];
    let mut jumps_left = if extras { 3 } else { 0 };
    let mut retention_jump = config.retention_jump;
    let (mut steps, mut faults, mut redrives) = (0, 0, 0);
    let mut loop_ends = LoopEnds::default();
    let mut unknown_commits = UnknownCommits::default();
    // API actors with a commit attempt of unknown outcome.
    let mut unknown: std::collections::BTreeSet<ActorId> = std::collections::BTreeSet::new();
    // Per actor: the faults of its commit attempts since its last clean one, and how
    // many publishes in a row failed.
    let mut commit_faults: BTreeMap<ActorId, Vec<Fault>> = BTreeMap::new();
    let mut publish_faults: BTreeMap<ActorId, u32> = BTreeMap::new();
    let mut tombstone_faults: BTreeMap<ActorId, u32> = BTreeMap::new();
    let mut late = LateOps::default();
    // Ghost actors still on their way: who sent each, and what.
    let mut ghost_origins: BTreeMap<ActorId, (ActorId, Op)> = BTreeMap::new();
    let mut answered: std::collections::BTreeSet<ActorId> = std::collections::BTreeSet::new();
    let mut refused_behind: std::collections::BTreeSet<ActorId> = std::collections::BTreeSet::new();
    let mut settle_failed: std::collections::BTreeSet<ActorId> = std::collections::BTreeSet::new();
    // The answers of commits handed to tasks of their own.
    let mut spawned_results: Vec<ApiResult> = Vec::new();
    let mut after_answer = AfterAnswerRuns::default();
    // Dispatches after the answer that got past their first publish's gate.
    let mut published_after: std::collections::BTreeSet<ActorId> = std::collections::BTreeSet::new();
    // The actor that moved last, and the preemptions taken ([`SimConfig::preemption_bound`]).
    let mut last_moved: Option<ActorId> = None;
    let mut preemptions = 0;
    let mut step_checks = config.step_checks.then(StepChecks::default);
    loop {
        steps += 1;
        if steps > config.max_steps {
            return Err(format!("no quiescence after {} steps: a livelock", config.max_steps));
        }
        // A dispatch after the answer races the worker as the request did; and time
        // passes while the deleter tries again (its delete waits for the worker to settle
        // the counter's entries).
        let api_alive = actors
            .iter()
            .any(|actor| matches!(actor.kind, Kind::Api(_) | Kind::AfterAnswer | Kind::Deleter));
        let faults_allowed = faults < config.fault_budget;
        let waiting = world.gates.lock().waiting.clone();
        let mut options: Vec<Action> = Vec::new();
        let mut held: Vec<Action> = Vec::new();
        for (position, actor) in actors.iter().enumerate() {
            match waiting.get(&actor.id) {
                Some(Op::Receive) if !control.has_visible() => {}
                Some(Op::Commit | Op::LateCommit) if config.hold_commits => held.push(Action::Step(position)),
                Some(Op::AwaitIdle) if world.holds_entries(&actor.id) => held.push(Action::Step(position)),
                Some(_) => options.push(Action::Step(position)),
                None => return Err(format!("actor {} is neither finished nor at a gate", actor.id)),
            }
        }
        // Actors whose timer the clock has passed may move on from it; the clock may
        // move to the next timer while requests run.
        let (expired, next_timer) = {
            let now = world.clock.now();
            let state = world.gates.lock();
            let expired: std::collections::BTreeSet<ActorId> = state
                .timers
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|((actor, _), _)| *actor)
                .collect();
            (expired, state.timers.values().filter(|at| **at > now).min().copied())
        };
        for (position, actor) in actors.iter().enumerate() {
            if expired.contains(&actor.id) {
                options.push(Action::Wake(position));
            }
        }
        if let Some(at) = next_timer.filter(|_| api_alive) {
            options.push(Action::Advance(at));
        }
        // Once the requests are done the order of worker steps against the clock no
        // longer matters to them, so exhaustive runs stop branching on it.
        if let Some(at) = control.next_visible_at() {
            if api_alive || options.is_empty() || extras {
                options.push(Action::Advance(at));
            }
        }
        if options.is_empty() {
            options = held;
        }
        if options.is_empty() {
            if dead_letters.is_empty() {
                break;
            }
            // Recovery: the operator redrives the dead-letter queue once the fault is
            // gone, as docs/RUNNING.md tells them to.
            dead_letters.move_all_to(&control);
            redrives += 1;
            continue;
        }
        if jumps_left > 0 && chooser.chance(3) {
            jumps_left -= 1;
            world.clock.advance(jump_sizes[chooser.pick(jump_sizes.len())]);
            continue;
        }
        // Only once every request has ended and every worker is between batches: a
        // request paused between its window check and its send, or a worker between its
        // read and its write (a fence decided before the jump, landing after the proof of
        // a commit it would have found expired), for longer than the retention is another
        // matter (see the test): an invocation lasts at most 15 minutes, and AWS refuses a
        // request signed longer ago than that.
        let workers_idle = actors
            .iter()
            .filter(|actor| matches!(actor.kind, Kind::Worker))
            .all(|actor| waiting.get(&actor.id) == Some(&Op::Receive));
        if retention_jump && workers_idle && api_results.iter().all(Option::is_some) && chooser.chance(6) {
            retention_jump = false;
            world
                .clock
                .advance(config.timing.retention + FORGET_MARGIN + Duration::from_secs(1));
            continue;
        }
        // With a preemption bound, the actor that moved last goes first while it can move
        // on; once the bound is used up, it alone does.
        let mut can_continue = false;
        if let Some(bound) = config.preemption_bound {
            let continues = options.iter().position(|action| match action {
                Action::Step(position) | Action::Wake(position) => Some(actors[*position].id) == last_moved,
                Action::Advance(_) => false,
            });
            if let Some(continues) = continues {
                let own = options.remove(continues);
                options.insert(0, own);
                if preemptions >= bound {
                    options.truncate(1);
                }
                can_continue = true;
            }
        }
        let choice = if options.len() == 1 {
            0
        } else {
            chooser.pick(options.len())
        };
        if can_continue && choice != 0 {
            preemptions += 1;
        }
        last_moved = None;
        match options.swap_remove(choice) {
            Action::Advance(at) => world.clock.set(at),
            action @ (Action::Step(position) | Action::Wake(position)) => {
                let actor_id = actors[position].id;
                last_moved = Some(actor_id);
                // A woken actor moves on from its timer; a stepped one through its gate.
                if let Action::Step(_) = action {
                    let op = world.gates.lock().waiting.remove(&actor_id).expect("waiting");
                    let offered = match (config.faults_only, config.retry_loop) {
                        (Some(only), _) => only(op),
                        (None, Some(looped)) if looped == op => op.retry_loop_faults(),
                        (None, Some(_)) => Vec::new(),
                        (None, None) => op.faults(extras),
                    };
                    let fault = match offered.len() {
                        n if n > 0 && faults_allowed => match chooser.fault(n) {
                            0 => Fault::None,
                            k => {
                                faults += 1;
                                offered[k - 1]
                            }
                        },
                        _ => Fault::None,
                    };
                    if op == Op::Commit && matches!(fault, Fault::ReplyLost | Fault::Late) {
                        unknown.insert(actor_id);
                    }
                    if matches!(actors[position].kind, Kind::AfterAnswer)
                        && op == Op::Publish
                        && fault != Fault::CrashBefore
                    {
                        published_after.insert(actor_id);
                    }
                    // What the request path meets while a commit of its own is on its way.
                    let commit_in_flight = ghost_origins
                        .values()
                        .any(|(origin, late)| *origin == actor_id && *late == Op::LateCommit);
                    if commit_in_flight && matches!(actors[position].kind, Kind::Api(_)) {
                        if op == Op::Commit && matches!(fault, Fault::Busy | Fault::Fail) {
                            refused_behind.insert(actor_id);
                        }
                        if op == Op::Tombstone && fault != Fault::None {
                            settle_failed.insert(actor_id);
                        }
                    }
                    if let Kind::Ghost { origin, op: late_kind } = actors[position].kind {
                        if fault == Fault::None {
                            late.kind(late_kind).1 += 1;
                            if !actors.iter().any(|actor| actor.id == origin) {
                                late.applied_after_sender_ended += 1;
                                if late_kind == Op::LateCommit && answered.contains(&origin) {
                                    late.commit_applied_after_answer += 1;
                                }
                            }
                        }
                    }
                    match op {
                        Op::Commit => {
                            let sequence = commit_faults.entry(actor_id).or_default();
                            if fault == Fault::None {
                                sequence.clear();
                            } else {
                                sequence.push(fault);
                            }
                            if sequence.len() == COMMIT_ATTEMPTS as usize {
                                loop_ends.record_commit(sequence);
                                sequence.clear();
                            }
                        }
                        Op::Tombstone if matches!(actors[position].kind, Kind::Api(_)) => {
                            let failed = tombstone_faults.entry(actor_id).or_default();
                            *failed = if fault == Fault::None { 0 } else { *failed + 1 };
                            if *failed == SETTLE_ATTEMPTS {
                                loop_ends.settle_exhausted += 1;
                                *failed = 0;
                            }
                        }
                        Op::Publish => {
                            let failed = publish_faults.entry(actor_id).or_default();
                            *failed = if fault == Fault::None { 0 } else { *failed + 1 };
                            if *failed == RetryPolicy::default().attempts {
                                loop_ends.publish_exhausted += 1;
                                *failed = 0;
                            }
                        }
                        _ => {}
                    }
                    world.gates.lock().granted.insert(actor_id, fault);
                }
                let polled = poll(&mut actors[position]);
                let crashed = world.gates.lock().crashed.remove(&actor_id);
                let ended = match polled {
                    Poll::Ready(End::Request(result)) => Some(result),
                    Poll::Ready(End::Spawned(result)) => {
                        spawned_results.push(result);
                        actors.swap_remove(position);
                        None
                    }
                    Poll::Ready(End::Ghost) => {
                        ghost_origins.remove(&actor_id);
                        actors.swap_remove(position);
                        None
                    }
                    Poll::Ready(End::AfterAnswer) => {
                        after_answer.finished += 1;
                        actors.swap_remove(position);
                        None
                    }
                    Poll::Pending if crashed && matches!(actors[position].kind, Kind::AfterAnswer) => {
                        world.gates.lock().waiting.remove(&actor_id);
                        after_answer.crashed += 1;
                        if !published_after.contains(&actor_id) {
                            after_answer.crashed_before_publishing += 1;
                        }
                        actors.swap_remove(position);
                        None
                    }
                    Poll::Pending if crashed => {
                        world.gates.lock().waiting.remove(&actor_id);
                        if let Kind::Worker = actors[position].kind {
                            // Lambda runs the next batch in a fresh instance.
                            let mut replacement = world.worker();
                            let _ = poll(&mut replacement);
                            actors.push(replacement);
                        }
                        Some(ApiResult::Crashed)
                    }
                    Poll::Pending => None,
                };
                if let Some(result) = ended {
                    if !matches!(result, ApiResult::Crashed) {
                        answered.insert(actor_id);
                    }
                    if let Kind::Api(index) = actors.swap_remove(position).kind {
                        if unknown.contains(&actor_id) {
                            let before_deadline = deadline.is_none_or(|deadline| world.clock.now() < deadline);
                            unknown_commits.record(&result, before_deadline);
                        }
                        api_results[index] = Some(result);
                    }
                }
                // Dispatches handed over to run after the answer become actors of their own.
                for mut task in world.after_answers(actor_id) {
                    after_answer.handed += 1;
                    if matches!(poll(&mut task), Poll::Ready(_)) {
                        after_answer.finished += 1;
                    } else {
                        actors.push(task);
                    }
                }
                // Transactions handed to tasks become actors of their own.
                for mut task in world.spawned() {
                    if !matches!(poll(&mut task), Poll::Ready(_)) {
                        actors.push(task);
                    }
                }
                // Commit requests that went on their way become actors of their own.
                for mut ghost in world.ghosts() {
                    if let Kind::Ghost { origin, op } = ghost.kind {
                        late.kind(op).0 += 1;
                        ghost_origins.insert(ghost.id, (origin, op));
                    }
                    if !matches!(poll(&mut ghost), Poll::Ready(_)) {
                        actors.push(ghost);
                    }
                }
                if let Some(checks) = step_checks.as_mut() {
                    checks
                        .after_step(&world.backend)
                        .map_err(|violation| format!("after step {steps}: {violation}"))?;
                }
            }
        }
    }
    let api_results = api_results
        .into_iter()
        .map(|result| result.expect("every request ended"))
        .chain(spawned_results)
        .collect();
    let observed = Observed::capture(&world.backend, world.clock.now(), api_results);
    let chains = world.chain_counts(&observed);
    Ok(Outcome {
        chains,
        steps_checked: step_checks.map_or(0, |checks| checks.steps),
        steps,
        faults,
        redrives,
        observed,
        loop_ends,
        unknown_commits,
        after_answer,
        late: LateOps {
            refused_behind_in_flight: refused_behind.len(),
            settle_failed_in_flight: settle_failed.len(),
            fence_refused: world
                .fenced_out
                .as_ref()
                .map_or(0, |count| count.load(Ordering::Relaxed)),
            signature_refused: world
                .signatures
                .as_ref()
                .map_or(0, |aws| aws.refused.load(Ordering::Relaxed)),
            ..late
        },
    })
}
