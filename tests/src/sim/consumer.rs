//! Message handlers in the simulation (DESIGN.md section 10): copies of one incoming
//! message M, each a real [`Consumer`] consuming its delivery over gated ports.
//!
//! Every copy is an actor. Its record read, its handler's read, its commit, its publishes
//! and its mark pass gates, where the [`Chooser`] picks who moves and which fault the
//! operation meets (a crash before or after it, its reply lost, refused, contention, a
//! publish entry failing, or a commit timed out on its way: a *ghost* actor applies it
//! later, or it is lost). Copies start together (the scheduler interleaves them) or one
//! after another. A copy that crashed or failed was not acknowledged: like SQS after the
//! visibility timeout, the queue delivers it again, as a new actor, until every copy has
//! been acknowledged; once the fault budget is spent nothing fails any more (recovery).
//!
//! The handler is not idempotent: it increments `COUNT#o-1` (read strongly consistent,
//! written conditioned on the version it read) and emits one message whose body names the
//! run, so that every run's message differs. A conflicting writer may add 100 to the
//! counter once, in a transaction of its own, so that a handler's commit fails its
//! business condition and the handler runs again on fresh reads.
//!
//! After recovery the checks: C1 (the counter changed once, and the handler ran only in
//! rounds whose read found no record), C2 and C3 (every message out has the derived id
//! and the committed run's body, none went out before the commit), C4 (the record is
//! dispatched, its TTL is the clock at a mark plus the retention, not before the first
//! publish), C5 (every acknowledgement came after M's message had gone out).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox::consumer::{
    ConsumeError, ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming,
};
use outbox::embedded::{EmbeddedBackend, ManualClock, StoreEvent};
use outbox::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, ExpectedVersion, IdSource, ItemKey, Store, StoreError,
    TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    DestinationName, IdempotencyRecord, IdempotencySlot, Message, OutboxRecord, OutboxState, TxnId,
    MESSAGE_ID_ATTRIBUTE,
};
use outbox::publish::RetryPolicy;
use outbox::staging::Staging;
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::ports::{late_op, GatedClock, GatedPublisher, GatedStore, InFlight, LateOp};

/// The id every copy of M carries (`outbox-message-id`).
pub const INCOMING_ID: &str = "T:0";
/// The consumer's name.
pub const CONSUMER: &str = "counter";
/// How long the consumer keeps M's dedup data from its dispatch.
pub const RETENTION: Duration = Duration::from_secs(3600);
/// The order M is about, and the counter its handler increments.
const ORDER: &str = "o-1";
const COUNTER: &str = "COUNT#o-1";
/// What the conflicting writer adds to the counter.
const WRITER_ADDS: u64 = 100;
/// How far the clock moves before every step: each operation takes a second, so that a
/// TTL computed at the wrong moment shows.
const STEP: Duration = Duration::from_secs(1);
const EVENTS: &str = "events";

/// What one consumer schedule contains.
#[derive(Debug, Clone)]
pub struct ConsumerSimConfig {
    /// Copies of M the queue delivers (a producer's re-sends, the queue's duplicates).
    pub copies: usize,
    /// All copies start at once (the scheduler interleaves them), or each only after the
    /// one before it ended (acknowledged, failed or crashed).
    pub concurrent: bool,
    /// Another actor adds 100 to the counter once, in a commit of its own.
    pub conflicting_writer: bool,
    /// Most faults injected in one schedule; then recovery runs with none.
    pub fault_budget: usize,
    /// The faults each operation can meet ([`consumer_faults`] by default).
    pub faults: fn(Op) -> Vec<Fault>,
    /// Deliveries of one copy at most before the schedule counts as a livelock.
    pub max_deliveries: u32,
    /// Steps after which the schedule counts as a livelock.
    pub max_steps: usize,
}

impl ConsumerSimConfig {
    /// `copies` copies, with `fault_budget` faults, the default fault menu and bounds.
    pub fn new(copies: usize, concurrent: bool, conflicting_writer: bool, fault_budget: usize) -> Self {
        Self {
            copies,
            concurrent,
            conflicting_writer,
            fault_budget,
            faults: consumer_faults,
            max_deliveries: 12,
            max_steps: 1_000,
        }
    }
}

/// The faults a consumer's operations can meet, beyond none.
pub fn consumer_faults(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Read => vec![CrashBefore, Fail],
        Op::Commit => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Busy, Late],
        Op::Publish => vec![CrashBefore, CrashAfter, ReplyLost, Fail, FirstEntryFails],
        Op::Mark => vec![CrashBefore, CrashAfter, ReplyLost, Fail],
        // The ghost of a late commit is lost on its way.
        Op::LateCommit => vec![Fail],
        _ => vec![],
    }
}

/// What the schedules did, summed over copies (and over schedules with [`Self::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerCounts {
    /// How each delivery ended: `processed`, `resumed`, `adopted`, `duplicate`,
    /// `failed: <kind>` for each [`ConsumeError`] kind, or `crashed`.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Crashes, by operation and side (`commit after`: committed, crashed before
    /// publishing; `publish after`, `mark before`: published, crashed before the mark).
    pub crashes: BTreeMap<&'static str, usize>,
    /// Runs of the handler.
    pub handler_runs: usize,
    /// Commits of a copy refused because another attempt's record was there (lost races).
    pub superseded: usize,
    /// Runs of the handler after a business condition failed at its copy's commit.
    pub business_reruns: usize,
    /// Deliveries of a copy after it crashed or failed.
    pub redeliveries: usize,
    /// Sends of M's messages (a message sent twice counts twice).
    pub publishes: usize,
    /// Late commits (timed out with the request on its way) sent.
    pub late_commits: usize,
    /// Late commits that applied (their attempt won).
    pub late_applied: usize,
    /// Late commits that reached the table after another attempt had won: refused.
    pub late_superseded: usize,
    /// Of those, the ones whose winner was another copy's attempt.
    pub late_superseded_by_other_copy: usize,
    /// Late commits lost on their way.
    pub late_lost: usize,
    /// Schedules in which M's message went out again after the TTL's start (a copy that
    /// had read the record pending published after another copy's mark).
    pub republished_after_ttl_start: usize,
}

impl ConsumerCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ConsumerCounts) {
        for (name, n) in &other.outcomes {
            *self.outcomes.entry(name).or_default() += n;
        }
        for (name, n) in &other.crashes {
            *self.crashes.entry(name).or_default() += n;
        }
        self.handler_runs += other.handler_runs;
        self.superseded += other.superseded;
        self.business_reruns += other.business_reruns;
        self.redeliveries += other.redeliveries;
        self.publishes += other.publishes;
        self.late_commits += other.late_commits;
        self.late_applied += other.late_applied;
        self.late_superseded += other.late_superseded;
        self.late_superseded_by_other_copy += other.late_superseded_by_other_copy;
        self.late_lost += other.late_lost;
        self.republished_after_ttl_start += other.republished_after_ttl_start;
    }

    /// Deliveries that ended as `name`.
    pub fn outcome(&self, name: &str) -> usize {
        self.outcomes.get(name).copied().unwrap_or(0)
    }

    /// Crashes after a commit applied, before anything was published.
    pub fn crashed_after_commit_before_publish(&self) -> usize {
        self.crash("commit after")
    }

    /// Crashes after the messages went out, before the mark applied.
    pub fn crashed_after_publish_before_mark(&self) -> usize {
        self.crash("publish after") + self.crash("mark before")
    }

    fn crash(&self, name: &str) -> usize {
        self.crashes.get(name).copied().unwrap_or(0)
    }
}

/// What one consumer schedule did.
#[derive(Debug)]
pub struct ConsumerOutcome {
    /// Scheduler steps taken.
    pub steps: usize,
    /// Faults injected.
    pub faults: usize,
    /// What happened.
    pub counts: ConsumerCounts,
    /// The schedule, one line per step.
    pub trace: Vec<String>,
}

/// What the consumers' probes and handlers saw, in order.
#[derive(Debug, Clone)]
enum Event {
    /// A read of M's record answered.
    RecordRead { actor: ActorId, found: bool },
    /// The handler started a run.
    HandlerRun { actor: ActorId },
    /// A commit attempt was sent.
    CommitSent { actor: ActorId, attempt: Option<TxnId> },
    /// A commit attempt answered.
    CommitAnswered { actor: ActorId, result: &'static str },
    /// A mark was sent, at `at`, with this TTL.
    MarkSent {
        actor: ActorId,
        at: Timestamp,
        expires_at: Timestamp,
    },
}

type Log = Arc<Mutex<Vec<Event>>>;

fn push(log: &Log, event: Event) {
    log.lock().expect("log lock").push(event);
}

fn commit_result_name(result: &Result<(), CommitError>) -> &'static str {
    match result {
        Ok(()) => "applied",
        Err(CommitError::Superseded { .. }) => "superseded",
        Err(CommitError::VersionConflict { .. }) => "version conflict",
        Err(CommitError::Ambiguous(_)) => "unknown",
        Err(CommitError::Contention(_)) => "contention",
        Err(CommitError::Unavailable(_)) => "unavailable",
        Err(_) => "other",
    }
}

/// A consumer's store as it sees it: the gated store, with what it asked and heard
/// written down.
struct Probe {
    inner: Arc<dyn Store>,
    actor: ActorId,
    clock: Arc<ManualClock>,
    log: Log,
}

#[async_trait]
impl Store for Probe {
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let attempt = request.outbox.attempt;
        push(
            &self.log,
            Event::CommitSent {
                actor: self.actor,
                attempt,
            },
        );
        let result = self.inner.commit(request).await;
        let result_name = commit_result_name(&result);
        push(
            &self.log,
            Event::CommitAnswered {
                actor: self.actor,
                result: result_name,
            },
        );
        result
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.inner.get_items(keys).await
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        let result = self.inner.get_outboxes(txn_ids).await;
        if let Ok(records) = &result {
            push(
                &self.log,
                Event::RecordRead {
                    actor: self.actor,
                    found: !records.is_empty(),
                },
            );
        }
        result
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        push(
            &self.log,
            Event::MarkSent {
                actor: self.actor,
                at: self.clock.now(),
                expires_at,
            },
        );
        self.inner.mark_dispatched(records, expires_at).await
    }
}

fn destination() -> DestinationName {
    EVENTS.parse().expect("valid")
}

fn counter_key() -> ItemKey {
    COUNTER.parse().expect("valid key")
}

/// The handler: increments the order's counter (not idempotent: a second applied run
/// would count twice) and emits one message naming the run.
struct Counting {
    actor: ActorId,
    runs: Arc<AtomicU32>,
    log: Log,
}

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        push(&self.log, Event::HandlerRun { actor: self.actor });
        let order = message.json::<Value>()?["order_id"]
            .as_str()
            .ok_or("no order_id")?
            .to_owned();
        let key: ItemKey = format!("COUNT#{order}").parse()?;
        let (count, expected) = match staging.get(&key).await? {
            Some(item) => (
                item.data["count"].as_u64().ok_or("a counter without a count")?,
                ExpectedVersion::Exactly(item.version),
            ),
            None => (0, ExpectedVersion::Absent),
        };
        staging.put(key, json!({ "count": count + 1 }), expected);
        staging.emit(Message::json(
            destination(),
            &json!({ "type": "Counted", "order_id": order, "run": run }),
        )?);
        Ok(())
    }
}

/// Deterministic attempt ids.
struct SimIds(AtomicU64);

impl IdSource for SimIds {
    fn next_txn_id(&self, now: Timestamp) -> TxnId {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let mut random = [0u8; 10];
        random[2..].copy_from_slice(&n.to_be_bytes());
        TxnId::from_parts(now, random)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A delivery of copy `n`.
    Copy(usize),
    /// The conflicting writer.
    Writer,
    /// A late commit of copy `origin_copy`'s on its way.
    Ghost { origin_copy: usize },
}

enum End {
    Consumed(Result<ConsumeOutcome, ConsumeError>),
    Writer,
    /// A late operation reached the table (with the commit's answer) or was lost.
    Ghost(&'static str),
}

type ActorFuture = Pin<Box<dyn Future<Output = End>>>;

struct Actor {
    id: ActorId,
    kind: Kind,
    future: ActorFuture,
}

fn poll(actor: &mut Actor) -> Poll<End> {
    let mut context = Context::from_waker(Waker::noop());
    actor.future.as_mut().poll(&mut context)
}

/// One copy of M as the queue delivers it: copies differ in their queue message id (a
/// producer's re-send), and share the outbox id.
fn delivery(copy: usize, receive_count: u32) -> Delivery {
    Delivery {
        message_id: format!("q-{copy}"),
        receipt: format!("r-{copy}-{receive_count}"),
        body: json!({ "type": "OrderPlaced", "order_id": ORDER }).to_string(),
        attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), INCOMING_ID.to_owned())]),
        group_id: None,
        receive_count,
    }
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    gates: Gates,
    ids: Arc<SimIds>,
    runs: Arc<AtomicU32>,
    log: Log,
    in_flight: InFlight,
    next_actor: ActorId,
}

impl World {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), [(destination(), false)]);
        backend.record();
        Self {
            clock,
            backend,
            gates: Gates::default(),
            ids: Arc::new(SimIds(AtomicU64::new(1))),
            runs: Arc::default(),
            log: Log::default(),
            in_flight: InFlight::default(),
            next_actor: 0,
        }
    }

    fn gate(&mut self) -> (ActorId, Gate) {
        let id = self.next_actor;
        self.next_actor += 1;
        (id, self.gates.for_actor(id))
    }

    fn gated_store(&self, gate: &Gate) -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner: self.backend.store.clone(),
            gate: gate.clone(),
            in_flight: self.in_flight.clone(),
        })
    }

    /// A consumer consuming delivery `receive_count` of copy `copy`.
    fn copy(&mut self, copy: usize, receive_count: u32) -> Actor {
        let (id, gate) = self.gate();
        let ports = ConsumerPorts {
            store: Arc::new(Probe {
                inner: self.gated_store(&gate),
                actor: id,
                clock: self.clock.clone(),
                log: self.log.clone(),
            }),
            publisher: Arc::new(GatedPublisher {
                inner: self.backend.publisher.clone(),
                gate: gate.clone(),
            }),
            clock: Arc::new(GatedClock {
                inner: self.clock.clone(),
                skew_millis: 0,
                gate: gate.clone(),
                timers_fire: false,
            }),
            ids: self.ids.clone(),
        };
        let handler = Arc::new(Counting {
            actor: id,
            runs: self.runs.clone(),
            log: self.log.clone(),
        });
        let consumer =
            Consumer::new(CONSUMER.parse().expect("valid"), ports, handler, RETENTION).with_retry_policy(RetryPolicy {
                attempts: 2,
                ..RetryPolicy::default()
            });
        let delivery = delivery(copy, receive_count);
        Actor {
            id,
            kind: Kind::Copy(copy),
            future: Box::pin(async move { End::Consumed(consumer.consume(&delivery).await) }),
        }
    }

    /// Another writer of the counter: reads it and adds 100 in a transaction of its own,
    /// again on a conflict, until it applied once.
    fn writer(&mut self) -> Actor {
        let (id, gate) = self.gate();
        let store = self.gated_store(&gate);
        let clock = self.clock.clone();
        let ids = self.ids.clone();
        let future: ActorFuture = Box::pin(async move {
            let key = counter_key();
            loop {
                let Ok(mut items) = store.get_items(std::slice::from_ref(&key)).await else {
                    continue;
                };
                let (count, expected) = match items.remove(&key) {
                    Some(item) => (
                        item.data["count"].as_u64().expect("counters hold a count"),
                        ExpectedVersion::Exactly(item.version),
                    ),
                    None => (0, ExpectedVersion::Absent),
                };
                let now = clock.now();
                let txn_id = ids.next_txn_id(now);
                let request = CommitRequest {
                    txn_id,
                    writes: vec![BusinessWrite::Put {
                        key: key.clone(),
                        data: json!({ "count": count + WRITER_ADDS }),
                        expected,
                    }],
                    outbox: OutboxRecord::committed(txn_id, vec![], now, now.plus(RETENTION)),
                    idempotency: None,
                };
                if store.commit(&request).await.is_ok() {
                    return End::Writer;
                }
            }
        });
        Actor {
            id,
            kind: Kind::Writer,
            future,
        }
    }

    /// Ghosts for the operations that went on their way since the last call.
    fn ghosts(&mut self, copy_of: &BTreeMap<ActorId, usize>) -> Vec<Actor> {
        let requests = std::mem::take(&mut *self.in_flight.lock().expect("in-flight lock"));
        requests
            .into_iter()
            .map(|(origin, late)| {
                let (id, gate) = self.gate();
                let store: Arc<dyn Store> = self.backend.store.clone();
                let queue: Arc<dyn outbox::ports::ControlQueue> = self.backend.control_queue.clone();
                let future: ActorFuture = Box::pin(async move {
                    match late {
                        LateOp::Commit(request) => {
                            if gate.pass(Op::LateCommit).await == Fault::Fail {
                                return End::Ghost("lost");
                            }
                            End::Ghost(commit_result_name(&store.commit(&request).await))
                        }
                        other => {
                            late_op(store, queue, gate, other).await;
                            End::Ghost("other")
                        }
                    }
                });
                Actor {
                    id,
                    kind: Kind::Ghost {
                        origin_copy: copy_of.get(&origin).copied().unwrap_or(usize::MAX),
                    },
                    future,
                }
            })
            .collect()
    }
}

fn outcome_name(result: &Result<ConsumeOutcome, ConsumeError>) -> &'static str {
    match result {
        Ok(outcome) => outcome.as_str(),
        Err(ConsumeError::NoId(_)) => "failed: no id",
        Err(ConsumeError::Read(_)) => "failed: read",
        Err(ConsumeError::Handler(_)) => "failed: handler",
        Err(ConsumeError::Conflict { .. }) => "failed: conflict",
        Err(ConsumeError::Refused(_)) => "failed: refused",
        Err(ConsumeError::Unsettled(_)) => "failed: unsettled",
        Err(ConsumeError::Publish { .. }) => "failed: publish",
        Err(ConsumeError::Mark(_)) => "failed: mark",
        Err(ConsumeError::Corrupt { .. }) => "failed: corrupt",
        Err(_) => "failed: other",
    }
}

fn crash_name(op: Op, fault: Fault) -> Option<&'static str> {
    let after = match fault {
        Fault::CrashBefore => false,
        Fault::CrashAfter => true,
        _ => return None,
    };
    Some(match (op, after) {
        (Op::Read, _) => "read before",
        (Op::Commit, false) => "commit before",
        (Op::Commit, true) => "commit after",
        (Op::Publish, false) => "publish before",
        (Op::Publish, true) => "publish after",
        (Op::Mark, false) => "mark before",
        (Op::Mark, true) => "mark after",
        _ => "other",
    })
}

/// The deliveries of each copy so far, and the copy each consumer actor delivered.
struct Deliveries {
    per_copy: Vec<u32>,
    copy_of: BTreeMap<ActorId, usize>,
    max: u32,
}

impl Deliveries {
    /// Delivers `copy` (again): a new consumer actor, run to its first gate.
    fn start(
        &mut self,
        world: &mut World,
        copy: usize,
        actors: &mut Vec<Actor>,
        trace: &mut Vec<String>,
    ) -> Result<(), String> {
        self.per_copy[copy] += 1;
        let receive_count = self.per_copy[copy];
        if receive_count > self.max {
            return Err(format!(
                "liveness: copy {copy} was not acknowledged in {} deliveries",
                self.max
            ));
        }
        let mut actor = world.copy(copy, receive_count);
        self.copy_of.insert(actor.id, copy);
        trace.push(format!("deliver copy {copy} (#{}, receive {receive_count})", actor.id));
        let _ = poll(&mut actor);
        actors.push(actor);
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Action {
    /// Let the actor at this position through its gate.
    Step(usize),
    /// Deliver the pending copy at this position.
    Deliver(usize),
}

/// Runs one consumer schedule with every decision taken from `chooser`, then checks C1
/// to C5; an `Err` names the violated invariant (or the livelock) and the schedule.
pub fn run_consumer_schedule(chooser: &mut dyn Chooser, config: &ConsumerSimConfig) -> Result<ConsumerOutcome, String> {
    let mut world = World::new();
    let mut counts = ConsumerCounts::default();
    let mut trace: Vec<String> = Vec::new();
    let fail = |trace: &[String], what: String| format!("{what}\nschedule:\n  {}", trace.join("\n  "));
    let mut actors: Vec<Actor> = Vec::new();
    let mut deliveries = Deliveries {
        per_copy: vec![0; config.copies],
        copy_of: BTreeMap::new(),
        max: config.max_deliveries,
    };
    let mut acknowledged = vec![false; config.copies];
    // Copies waiting to be delivered (again), in the queue's order.
    let mut pending: Vec<usize> = Vec::new();
    let mut ghost_ends: Vec<(usize, &'static str)> = Vec::new();
    let expected_id = format!("{}:0", TxnId::consumed(CONSUMER, INCOMING_ID));
    let queue = world.backend.publisher.queue(&destination()).expect("events").clone();
    let published = || {
        queue
            .sent()
            .into_iter()
            .filter(|sent| sent.request.attributes.get(MESSAGE_ID_ATTRIBUTE) == Some(&expected_id))
            .count()
    };

    if config.conflicting_writer {
        let mut writer = world.writer();
        let _ = poll(&mut writer);
        actors.push(writer);
    }
    if config.concurrent {
        for copy in 0..config.copies {
            deliveries.start(&mut world, copy, &mut actors, &mut trace)?;
        }
    } else {
        pending.extend(0..config.copies);
    }

    let began = world.clock.now();
    let (mut steps, mut faults) = (0, 0);
    loop {
        steps += 1;
        if steps > config.max_steps {
            return Err(fail(
                &trace,
                format!("liveness: no quiescence after {} steps", config.max_steps),
            ));
        }
        let waiting = world.gates.lock().waiting.clone();
        let mut options: Vec<Action> = Vec::new();
        for (position, actor) in actors.iter().enumerate() {
            if !waiting.contains_key(&actor.id) {
                return Err(fail(
                    &trace,
                    format!("actor {} is neither finished nor at a gate", actor.id),
                ));
            }
            options.push(Action::Step(position));
        }
        let consuming = actors.iter().any(|actor| matches!(actor.kind, Kind::Copy(_)));
        if config.concurrent {
            options.extend((0..pending.len()).map(Action::Deliver));
        } else if !consuming && !pending.is_empty() {
            options.push(Action::Deliver(0));
        }
        if options.is_empty() {
            break;
        }
        let choice = if options.len() == 1 {
            0
        } else {
            chooser.pick(options.len())
        };
        let position = match options[choice] {
            Action::Deliver(index) => {
                let copy = pending.remove(index);
                deliveries
                    .start(&mut world, copy, &mut actors, &mut trace)
                    .map_err(|error| fail(&trace, error))?;
                continue;
            }
            Action::Step(position) => position,
        };
        world.clock.advance(STEP);
        let (actor_id, kind) = (actors[position].id, actors[position].kind);
        let op = world.gates.lock().waiting.remove(&actor_id).expect("waiting");
        let offered = match kind {
            Kind::Writer => Vec::new(),
            Kind::Copy(_) | Kind::Ghost { .. } => (config.faults)(op),
        };
        let fault = match offered.len() {
            n if n > 0 && faults < config.fault_budget => match chooser.fault(n) {
                0 => Fault::None,
                k => {
                    faults += 1;
                    offered[k - 1]
                }
            },
            _ => Fault::None,
        };
        if let Some(name) = crash_name(op, fault) {
            *counts.crashes.entry(name).or_default() += 1;
        }
        trace.push(format!(
            "t+{:>3}s #{actor_id} {kind:?}: {op:?}{}",
            world.clock.now().since(began).as_secs(),
            if fault == Fault::None {
                String::new()
            } else {
                format!(", {fault:?}")
            }
        ));
        world.gates.lock().granted.insert(actor_id, fault);
        let polled = poll(&mut actors[position]);
        let crashed = world.gates.lock().crashed.remove(&actor_id);
        match polled {
            Poll::Pending if crashed => {
                world.gates.lock().waiting.remove(&actor_id);
                actors.swap_remove(position);
                if let Kind::Copy(copy) = kind {
                    *counts.outcomes.entry("crashed").or_default() += 1;
                    trace.push(format!("        copy {copy} crashed, not acknowledged"));
                    pending.push(copy);
                    counts.redeliveries += 1;
                }
            }
            Poll::Pending => {}
            Poll::Ready(End::Consumed(result)) => {
                actors.swap_remove(position);
                let Kind::Copy(copy) = kind else {
                    unreachable!("only copies consume")
                };
                let name = outcome_name(&result);
                *counts.outcomes.entry(name).or_default() += 1;
                trace.push(format!("        copy {copy}: {name}"));
                if result.is_ok() {
                    // C5: acknowledged only once M's messages went out.
                    if published() == 0 {
                        return Err(fail(
                            &trace,
                            format!("C5 truthful acknowledgement: copy {copy} was acknowledged ({name}) before any of M's messages was published"),
                        ));
                    }
                    acknowledged[copy] = true;
                } else {
                    pending.push(copy);
                    counts.redeliveries += 1;
                }
            }
            Poll::Ready(End::Writer) => {
                actors.swap_remove(position);
            }
            Poll::Ready(End::Ghost(result)) => {
                actors.swap_remove(position);
                if let Kind::Ghost { origin_copy } = kind {
                    trace.push(format!("        late commit of copy {origin_copy}: {result}"));
                    ghost_ends.push((origin_copy, result));
                }
            }
        }
        for mut ghost in world.ghosts(&deliveries.copy_of) {
            counts.late_commits += 1;
            if !matches!(poll(&mut ghost), Poll::Ready(_)) {
                actors.push(ghost);
            }
        }
    }
    if let Some(copy) = acknowledged.iter().position(|acked| !acked) {
        return Err(fail(&trace, format!("liveness: copy {copy} was never acknowledged")));
    }

    counts.handler_runs = world.runs.load(Ordering::SeqCst) as usize;
    counts.publishes = published();
    let events = world.log.lock().expect("log lock").clone();
    let (winner_copy, republished) = check(&world, &events, &deliveries.copy_of, config.conflicting_writer)
        .map_err(|violation| fail(&trace, violation))?;
    counts.republished_after_ttl_start += usize::from(republished);
    // What the copies met, from what their probes saw.
    let mut last_commit: BTreeMap<ActorId, &'static str> = BTreeMap::new();
    for event in &events {
        match event {
            Event::CommitAnswered { actor, result } => {
                counts.superseded += usize::from(*result == "superseded");
                last_commit.insert(*actor, result);
            }
            // The handler runs again after its copy's commit failed a business condition.
            Event::HandlerRun { actor } if last_commit.remove(actor) == Some("version conflict") => {
                counts.business_reruns += 1;
            }
            _ => {}
        }
    }
    for (origin_copy, result) in ghost_ends {
        match result {
            "applied" => counts.late_applied += 1,
            "superseded" => {
                counts.late_superseded += 1;
                counts.late_superseded_by_other_copy += usize::from(Some(origin_copy) != winner_copy);
            }
            "lost" => counts.late_lost += 1,
            _ => {}
        }
    }
    Ok(ConsumerOutcome {
        steps,
        faults,
        counts,
        trace,
    })
}

/// Checks C1 to C4 after recovery (C5 is checked at each acknowledgement); returns the
/// copy whose attempt won, where known.
fn check(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    writer: bool,
) -> Result<(Option<usize>, bool), String> {
    let txn_id = TxnId::consumed(CONSUMER, INCOMING_ID);
    let expected_id = format!("{txn_id}:0");

    // C1: the state change applied once, and the handler never ran in a round whose read
    // found M's record (step 1: a committed record is used as it is).
    let key = counter_key();
    let items = Store::get_items(world.backend.store.as_ref(), std::slice::from_ref(&key))
        .now_or_never()
        .expect("the embedded store answers at once")
        .map_err(|error| format!("reading the counter failed: {error}"))?;
    let count = items
        .get(&key)
        .and_then(|item| item.data["count"].as_u64())
        .unwrap_or(0);
    // The writer retries until its commit applies, and the schedule ends only after it.
    let expected = 1 + if writer { WRITER_ADDS } else { 0 };
    if count != expected {
        return Err(format!(
            "C1 once in effect: {COUNTER} counts {count}, expected {expected} (M once{})",
            if writer { ", plus the other writer's 100" } else { "" }
        ));
    }
    let commits: Vec<(Box<CommitRequest>, Timestamp)> = world
        .backend
        .store
        .history()
        .into_iter()
        .filter_map(|event| match event {
            StoreEvent::Committed { request, at } if request.txn_id == txn_id => Some((request, at)),
            _ => None,
        })
        .collect();
    let [(winner, committed_at)] = commits.as_slice() else {
        return Err(format!(
            "C1 once in effect: M's record was committed {} times",
            commits.len()
        ));
    };
    let mut last_read: BTreeMap<ActorId, bool> = BTreeMap::new();
    for event in events {
        match event {
            Event::RecordRead { actor, found } => {
                last_read.insert(*actor, *found);
            }
            Event::HandlerRun { actor } if last_read.get(actor) != Some(&false) => {
                return Err(format!(
                    "C1 once in effect (step 1): copy {:?} ran the handler although its read found M's record",
                    copy_of.get(actor)
                ));
            }
            _ => {}
        }
    }
    let winner_copy = events.iter().find_map(|event| match event {
        Event::CommitSent { actor, attempt } if *attempt == winner.outbox.attempt => copy_of.get(actor).copied(),
        _ => None,
    });

    // C2 and C3: the winner's message, under its derived id, and nothing before the
    // commit; never a losing run's.
    let [message] = winner.outbox.messages.as_slice() else {
        return Err(format!(
            "the winning commit holds {} messages, not 1",
            winner.outbox.messages.len()
        ));
    };
    let sent = world.backend.publisher.queue(&destination()).expect("events").sent();
    if sent.is_empty() {
        return Err("C2 winner's messages: M's message was never published".into());
    }
    for send in &sent {
        let id = send.request.attributes.get(MESSAGE_ID_ATTRIBUTE);
        if id != Some(&expected_id) {
            return Err(format!(
                "C2 winner's messages: a message went out with id {id:?}, not {expected_id}"
            ));
        }
        if send.request.body != message.body {
            return Err(format!(
                "C2/C3 winner's messages: {} went out, but the committed run's body is {}: a losing run's message",
                send.request.body, message.body
            ));
        }
        if send.sent_at < *committed_at {
            return Err(format!(
                "C3 nothing before the commit: M's message went out at {} before the commit at {}",
                send.sent_at, committed_at
            ));
        }
    }

    // C4: dispatched, its TTL the clock at a mark plus the retention, the clock started
    // no earlier than the messages went out.
    let record = world
        .backend
        .store
        .outbox_records()
        .into_iter()
        .find(|record| record.txn_id == txn_id)
        .ok_or("C4 deterministic retention: M's record is gone")?;
    if record.state != OutboxState::Dispatched {
        return Err(format!(
            "C4 deterministic retention: M's record is {:?}, not dispatched",
            record.state
        ));
    }
    let expires_at = record.expires_at.ok_or("C4: a dispatched record without a TTL")?;
    let from_a_mark = events.iter().any(|event| {
        matches!(event, Event::MarkSent { at, expires_at: sent, .. } if *sent == expires_at && at.plus(RETENTION) == expires_at)
    });
    if !from_a_mark {
        return Err(format!(
            "C4 deterministic retention: the TTL {expires_at} is not the clock at a mark plus the retention (marks sent, by copy, at, TTL: {:?})",
            events
                .iter()
                .filter_map(|event| match event {
                    Event::MarkSent { actor, at, expires_at } => Some((copy_of.get(actor), *at, *expires_at)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        ));
    }
    let first_publish = sent.iter().map(|send| send.sent_at).min().expect("not empty");
    if expires_at < first_publish.plus(RETENTION) {
        return Err(format!(
            "C4 deterministic retention: the dedup clock started at {}, before M's message went out at {first_publish}",
            expires_at.minus(RETENTION)
        ));
    }
    // A copy that found the record pending may publish again after another copy's mark
    // started the clock (a harmless duplicate under the same id; its own mark, if it
    // lands last, moves the TTL on).
    let republished = sent.iter().any(|send| send.sent_at > expires_at.minus(RETENTION));
    Ok((winner_copy, republished))
}
