//! Message handlers in the simulation (docs/PROTOCOL.md section 10): copies of one incoming
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
//!
//! The same schedules run in entity mode (docs/PROTOCOL.md section 11, [`ConsumerSimConfig::entity`]):
//! the handler names the counter as its one item, so each copy reads the counter with its
//! entries, then M's dedup record; commits the counter and M's entry in one conditional
//! write; publishes; puts the dedup record; removes the entry. Each of those steps passes
//! a gate and meets the same faults (its late commit, dedup put or removal applied by a
//! ghost), and the conflicting writer commits into the counter in entity mode too, with
//! an entry of its own that it removes. The checks are C1 to C5 on the entity's history,
//! and that M's entry is gone after recovery and no removed entry ever came back
//! ([`super::entity`]).

use outbox::protocol::Applied;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox::consumer::{ConsumeError, ConsumeOutcome, Consumer, Delivery, Handler, HandlerError, Incoming};
use outbox::embedded::{EmbeddedBackend, ManualClock, StoreEvent};
use outbox::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, EntityCommit, EntityItem, ExpectedVersion, IdSource, ItemKey,
    KeyRead, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    DestinationName, IdempotencyRecord, IdempotencySlot, Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId,
    MESSAGE_ID_ATTRIBUTE,
};
use outbox::publish::RetryPolicy;
use outbox::staging::Staging;
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::ports::{consumer_ports, late_op, plain_gated_store, GatedStore, InFlight, LateOp};

/// The id every copy of M carries (`outbox-message-id`).
pub const INCOMING_ID: &str = "T:0";
/// The consumer's name.
pub const CONSUMER: &str = "counter";
/// How long the consumer keeps M's dedup data from its dispatch.
pub const RETENTION: Duration = Duration::from_secs(3600);
/// The order M is about, and the counter its handler increments.
const ORDER: &str = "o-1";
pub(super) const COUNTER: &str = "COUNT#o-1";
/// What the conflicting writer adds to the counter.
pub(super) const WRITER_ADDS: u64 = 100;
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
    /// The handler names the counter as its entity: entity mode (docs/PROTOCOL.md section 11),
    /// and the conflicting writer commits in entity mode too.
    pub entity: bool,
    /// The handler changes its mind: its first run counts M and emits, every later run
    /// (of any copy) stages nothing, as a decision that depends on another item, the time
    /// or configuration would (entity mode). M's effect is then the count and its message,
    /// or nothing at all.
    pub changes_mind: bool,
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
            entity: false,
            changes_mind: false,
        }
    }

    /// As [`Self::new`], in entity mode, with the fault menu [`entity_faults`].
    pub fn entity(copies: usize, concurrent: bool, conflicting_writer: bool, fault_budget: usize) -> Self {
        Self {
            faults: entity_faults,
            entity: true,
            ..Self::new(copies, concurrent, conflicting_writer, fault_budget)
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

/// The faults of entity mode's operations, beyond none: as [`consumer_faults`], where the
/// dedup record's put and the entry's removal (which pass the mark's gate) can also time
/// out on their way, their ghosts applying them later or losing them.
pub fn entity_faults(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Mark => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Late],
        Op::LateMark => vec![Fail],
        other => consumer_faults(other),
    }
}

/// What the schedules did, summed over copies (and over schedules with [`Self::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerCounts {
    /// How each delivery ended: `processed`, `resumed`, `adopted`, `duplicate`,
    /// `failed: <kind>` for each [`ConsumeError`] kind (in entity mode `failed: dedup
    /// put` where the mark's is, and `failed: remove entry`), or `crashed`.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Crashes, by step and side (`commit after`: committed, crashed before publishing;
    /// `publish after`, `mark before`: published, crashed before the mark; in entity
    /// mode `entity read`, `entity commit`, `dedup put` and `entry removal`).
    pub crashes: BTreeMap<String, usize>,
    /// The other faults injected, by step and fault (`entity commit: Late`).
    pub faults: BTreeMap<String, usize>,
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
    /// Other late writes (entity mode's dedup puts and removals), by step and end
    /// (`late dedup put: applied`, `late entry removal: lost`).
    pub late_writes: BTreeMap<String, usize>,
    /// Copies that found M's dedup record and M's entry still in the entity, and removed
    /// it (entity mode: an earlier copy put the dedup record, then crashed or failed
    /// before its removal; a pending entry goes out again first).
    pub leftover_entries_removed: usize,
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
            *self.crashes.entry(name.clone()).or_default() += n;
        }
        for (name, n) in &other.faults {
            *self.faults.entry(name.clone()).or_default() += n;
        }
        for (name, n) in &other.late_writes {
            *self.late_writes.entry(name.clone()).or_default() += n;
        }
        self.leftover_entries_removed += other.leftover_entries_removed;
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

    /// Crashes after a commit (either mode's) applied, before anything was published.
    pub fn crashed_after_commit_before_publish(&self) -> usize {
        self.crash("commit after") + self.crash("entity commit after")
    }

    /// Crashes after the messages went out, before the mark (or in entity mode the dedup
    /// record's put) applied.
    pub fn crashed_after_publish_before_mark(&self) -> usize {
        self.crash("publish after") + self.crash("mark before") + self.crash("dedup put before")
    }

    /// Entity mode: crashes after the dedup record's put applied, before the entry's
    /// removal did.
    pub fn crashed_after_dedup_put_before_removal(&self) -> usize {
        self.crash("dedup put after") + self.crash("entry removal before")
    }

    /// Crashes at `step` (`entity read`), either side.
    pub fn crashes_at(&self, step: &str) -> usize {
        self.crash(&format!("{step} before")) + self.crash(&format!("{step} after"))
    }

    /// Faults other than crashes met at `step` (`entity commit`), of any kind.
    pub fn faults_at(&self, step: &str) -> usize {
        let prefix = format!("{step}: ");
        self.faults
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum()
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
pub(super) enum Event {
    /// A read of M's record answered.
    RecordRead { actor: ActorId, found: bool },
    /// Entity mode: a read of the entity answered; `found` whether it held M's entry.
    EntityRead { actor: ActorId, found: bool },
    /// Entity mode: a removal of M's entry was sent.
    RemovalSent { actor: ActorId },
    /// The handler started a run.
    HandlerRun { actor: ActorId },
    /// A commit attempt was sent.
    CommitSent { actor: ActorId, attempt: Option<TxnId> },
    /// A commit attempt answered.
    CommitAnswered { actor: ActorId, result: &'static str },
    /// A mark (in entity mode, the dedup record's put) was sent, at `at`, with this TTL.
    MarkSent {
        actor: ActorId,
        at: Timestamp,
        expires_at: Timestamp,
    },
}

type Log = Arc<Mutex<Vec<Event>>>;

/// The actor an event is of.
fn event_actor(event: &Event) -> Option<ActorId> {
    match event {
        Event::RecordRead { actor, .. }
        | Event::EntityRead { actor, .. }
        | Event::RemovalSent { actor }
        | Event::HandlerRun { actor }
        | Event::CommitSent { actor, .. }
        | Event::CommitAnswered { actor, .. }
        | Event::MarkSent { actor, .. } => Some(*actor),
    }
}

/// The store call each actor made last, by the name of its step (`entity commit`): the
/// gated store's operations share gates, so the gate's [`Op`] alone does not say.
type Asking = Arc<Mutex<BTreeMap<ActorId, &'static str>>>;

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
    asking: Asking,
}

impl Probe {
    fn ask(&self, step: &'static str) {
        self.asking.lock().expect("asking lock").insert(self.actor, step);
    }

    /// Sends a commit (either mode's) of attempt `attempt`, writing down its answer.
    async fn commit_logged(
        &self,
        attempt: Option<TxnId>,
        commit: impl Future<Output = Result<(), CommitError>>,
    ) -> Result<(), CommitError> {
        push(
            &self.log,
            Event::CommitSent {
                actor: self.actor,
                attempt,
            },
        );
        let result = commit.await;
        push(
            &self.log,
            Event::CommitAnswered {
                actor: self.actor,
                result: commit_result_name(&result),
            },
        );
        result
    }

    /// Writes down a mark (or a dedup record's put) sent now with TTL `expires_at`.
    fn mark_sent(&self, expires_at: Timestamp) {
        push(
            &self.log,
            Event::MarkSent {
                actor: self.actor,
                at: self.clock.now(),
                expires_at,
            },
        );
    }
}

#[async_trait]
impl Store for Probe {
    fn producer(&self) -> Option<outbox::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.ask("commit");
        self.commit_logged(request.outbox.attempt, self.inner.commit(request))
            .await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.ask("read");
        self.inner.get_items(keys).await
    }

    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        self.ask("read");
        self.inner.get_keys(keys).await
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        self.ask("position write");
        self.inner.keep_applied(key, expected, name, applied).await
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.ask("read");
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
        self.ask("read");
        self.inner.get_idempotency(slot).await
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.ask("tombstone");
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.ask("mark");
        self.mark_sent(expires_at);
        self.inner.mark_dispatched(records, expires_at).await
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        self.ask("entity read");
        let result = self.inner.get_entity(key).await;
        if let Ok(entity) = &result {
            let found = entity
                .as_ref()
                .is_some_and(|entity| entity.entries.contains_key(&incoming_txn_id()));
            push(
                &self.log,
                Event::EntityRead {
                    actor: self.actor,
                    found,
                },
            );
        }
        result
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        self.ask("entity commit");
        self.commit_logged(commit.entry.attempt, self.inner.commit_entity(commit))
            .await
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.ask("entry removal");
        push(&self.log, Event::RemovalSent { actor: self.actor });
        self.inner.remove_entry(key, txn_id).await
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        self.ask("dedup put");
        self.mark_sent(expires_at);
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }
}

/// The counter at count 0, version 1, written straight into the table.
fn seed_counter(world: &World) {
    let txn_id = world.ids.next_txn_id(world.clock.now());
    let now = world.clock.now();
    let request = CommitRequest {
        txn_id,
        writes: vec![outbox::ports::BusinessWrite::Put {
            key: counter_key(),
            data: json!({ "count": 0 }),
            expected: ExpectedVersion::Absent,
        }],
        outbox: outbox::protocol::OutboxRecord::committed(txn_id, Vec::new(), now, now.plus(RETENTION)),
        idempotency: None,
    };
    Store::commit(world.backend.store.as_ref(), &request)
        .now_or_never()
        .expect("the embedded store answers at once")
        .expect("a fresh table takes the seed");
}

pub(super) fn destination() -> DestinationName {
    EVENTS.parse().expect("valid")
}

pub(super) fn counter_key() -> ItemKey {
    COUNTER.parse().expect("valid key")
}

/// M's record id (its dedup record's, in entity mode), and its entry's in the counter.
pub(super) fn incoming_txn_id() -> TxnId {
    TxnId::consumed(CONSUMER, INCOMING_ID)
}

/// The order a message is about, and its counter.
fn order_and_counter(message: &Incoming) -> Result<(String, ItemKey), HandlerError> {
    let order = message.json::<Value>()?["order_id"]
        .as_str()
        .ok_or("no order_id")?
        .to_owned();
    let key = format!("COUNT#{order}").parse()?;
    Ok((order, key))
}

/// The handler: increments the order's counter (not idempotent: a second applied run
/// would count twice) and emits one message naming the run. In entity mode it names the
/// counter as the one item it changes.
struct Counting {
    actor: ActorId,
    runs: Arc<AtomicU32>,
    log: Log,
    entity: bool,
    changes_mind: bool,
}

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        push(&self.log, Event::HandlerRun { actor: self.actor });
        if self.changes_mind && run > 1 {
            return Ok(());
        }
        let (order, key) = order_and_counter(message)?;
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

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        if !self.entity {
            return Ok(None);
        }
        Ok(Some(order_and_counter(message)?.1))
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
    /// A late operation (a commit; in entity mode also a dedup put or a removal) of copy
    /// `origin_copy`'s on its way.
    Ghost { origin_copy: usize },
}

pub(super) enum End {
    Consumed(Result<ConsumeOutcome, ConsumeError>),
    Writer,
    /// A late operation reached the table (with the commit's answer, or `applied`) or
    /// was lost.
    Ghost(&'static str),
}

pub(super) type ActorFuture = Pin<Box<dyn Future<Output = End>>>;

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
        trace_header: None,
    }
}

pub(super) struct World {
    pub(super) clock: Arc<ManualClock>,
    pub(super) backend: EmbeddedBackend,
    gates: Gates,
    ids: Arc<SimIds>,
    runs: Arc<AtomicU32>,
    log: Log,
    asking: Asking,
    in_flight: InFlight,
    next_actor: ActorId,
    entity: bool,
    changes_mind: bool,
}

impl World {
    fn new(entity: bool) -> Self {
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
            asking: Asking::default(),
            in_flight: InFlight::default(),
            next_actor: 0,
            entity,
            changes_mind: false,
        }
    }

    fn gate(&mut self) -> (ActorId, Gate) {
        let id = self.next_actor;
        self.next_actor += 1;
        (id, self.gates.for_actor(id))
    }

    fn gated_store(&self, gate: &Gate) -> Arc<GatedStore> {
        plain_gated_store(self.backend.store.clone(), gate, &self.in_flight)
    }

    /// The step `actor` waits to perform at a gate of `op`: the store call its probe saw
    /// it make last (the store's calls share gates), or the operation itself.
    fn step(&self, actor: ActorId, op: Op) -> &'static str {
        match op {
            Op::Publish => "publish",
            Op::Sleep => "sleep",
            _ => self.asked(actor),
        }
    }

    /// The store call `actor` made last (a ghost's: its late operation).
    fn asked(&self, actor: ActorId) -> &'static str {
        self.asking
            .lock()
            .expect("asking lock")
            .get(&actor)
            .copied()
            .unwrap_or("other")
    }

    /// A consumer consuming delivery `receive_count` of copy `copy`.
    fn copy(&mut self, copy: usize, receive_count: u32) -> Actor {
        let (id, gate) = self.gate();
        let store = Arc::new(Probe {
            inner: self.gated_store(&gate),
            actor: id,
            clock: self.clock.clone(),
            log: self.log.clone(),
            asking: self.asking.clone(),
        });
        let ports = consumer_ports(
            store,
            self.backend.publisher.clone(),
            &self.clock,
            &gate,
            self.ids.clone(),
        );
        let handler = Arc::new(Counting {
            actor: id,
            runs: self.runs.clone(),
            log: self.log.clone(),
            entity: self.entity,
            changes_mind: self.changes_mind,
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

    /// Another writer of the counter: reads it and adds 100 in a commit of its own (a
    /// transaction; in entity mode, [`super::entity::writer`]), again on a conflict,
    /// until it applied once.
    fn writer(&mut self) -> Actor {
        let (id, gate) = self.gate();
        self.asking.lock().expect("asking lock").insert(id, "writer");
        let store = self.gated_store(&gate);
        let clock = self.clock.clone();
        let ids = self.ids.clone();
        if self.entity {
            return Actor {
                id,
                kind: Kind::Writer,
                future: super::entity::writer(store, clock, ids),
            };
        }
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
                let step = match &late {
                    LateOp::Commit(_) => "late commit",
                    LateOp::EntityCommit(..) => "late entity commit",
                    LateOp::PutDispatched { .. } => "late dedup put",
                    LateOp::RemoveEntry { .. } => "late entry removal",
                    _ => "late other",
                };
                self.asking.lock().expect("asking lock").insert(id, step);
                let store: Arc<dyn Store> = self.backend.store.clone();
                let queue: Arc<dyn outbox::ports::ControlQueue> = self.backend.control_queue.clone();
                let future: ActorFuture = Box::pin(async move {
                    let commit = match late {
                        LateOp::Commit(request) => GhostCommit::Transaction(request),
                        LateOp::EntityCommit(commit, _) => GhostCommit::Entity(commit),
                        other => {
                            let arrived = late_op(store, queue, gate, other, None, None, None).await;
                            return End::Ghost(if arrived { "applied" } else { "lost" });
                        }
                    };
                    if gate.pass(Op::LateCommit).await == Fault::Fail {
                        return End::Ghost("lost");
                    }
                    let result = match commit {
                        GhostCommit::Transaction(request) => store.commit(&request).await,
                        GhostCommit::Entity(commit) => store.commit_entity(&commit).await,
                    };
                    End::Ghost(commit_result_name(&result))
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

/// A late commit of either mode.
enum GhostCommit {
    Transaction(Box<CommitRequest>),
    Entity(Box<EntityCommit>),
}

fn outcome_name(result: &Result<ConsumeOutcome, ConsumeError>, entity: bool) -> &'static str {
    match result {
        Ok(outcome) => outcome.as_str(),
        Err(ConsumeError::NoId(_)) => "failed: no id",
        Err(ConsumeError::Read(_)) => "failed: read",
        Err(ConsumeError::Handler(_)) => "failed: handler",
        Err(ConsumeError::Conflict { .. }) => "failed: conflict",
        Err(ConsumeError::Refused(_)) => "failed: refused",
        Err(ConsumeError::Unsettled(_)) => "failed: unsettled",
        Err(ConsumeError::Publish { .. }) => "failed: publish",
        // In entity mode, the dedup record's put.
        Err(ConsumeError::Mark(_)) if entity => "failed: dedup put",
        Err(ConsumeError::Mark(_)) => "failed: mark",
        Err(ConsumeError::Corrupt { .. }) => "failed: corrupt",
        Err(ConsumeError::NotOneItem { .. }) => "failed: not one item",
        Err(ConsumeError::RemoveEntry(_)) => "failed: remove entry",
        Err(_) => "failed: other",
    }
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
    let mut world = World::new(config.entity);
    world.changes_mind = config.changes_mind;
    if config.changes_mind {
        // The counter exists (count 0): the run that changes its mind finds it unchanged
        // and can write it as read (where it does not exist, the message is failed and
        // comes back, a limit `docs/ENTITY_MODE.md` names).
        seed_counter(&world);
    }
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
    // Each late operation's end: its origin copy, its step, its answer.
    let mut ghost_ends: Vec<(usize, &'static str, &'static str)> = Vec::new();
    let expected_id = format!("{}:0", incoming_txn_id());
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
        let step = world.step(actor_id, op);
        match fault {
            Fault::None => {}
            Fault::CrashBefore => *counts.crashes.entry(format!("{step} before")).or_default() += 1,
            Fault::CrashAfter => *counts.crashes.entry(format!("{step} after")).or_default() += 1,
            other => *counts.faults.entry(format!("{step}: {other:?}")).or_default() += 1,
        }
        trace.push(format!(
            "t+{:>3}s #{actor_id} {kind:?}: {op:?} ({step}){}",
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
                let name = outcome_name(&result, config.entity);
                *counts.outcomes.entry(name).or_default() += 1;
                if matches!(result, Ok(ConsumeOutcome::Duplicate | ConsumeOutcome::Resumed { .. })) {
                    let log = world.log.lock().expect("log lock");
                    let mine = |wanted: fn(&Event) -> bool| {
                        log.iter()
                            .any(|event| wanted(event) && event_actor(event) == Some(actor_id))
                    };
                    let leftover = mine(|event| matches!(event, Event::RecordRead { found: true, .. }))
                        && mine(|event| matches!(event, Event::EntityRead { found: true, .. }))
                        && mine(|event| matches!(event, Event::RemovalSent { .. }));
                    counts.leftover_entries_removed += usize::from(leftover);
                }
                trace.push(format!("        copy {copy}: {name}"));
                if result.is_ok() {
                    // C5: acknowledged only once M's messages went out. A handler that
                    // changes its mind may have decided M has none, but only while no write
                    // of M carrying messages has applied (the final check holds the rest:
                    // the count unchanged and nothing published ever).
                    let counted = world.backend.store.history().iter().any(|event| {
                        matches!(event, StoreEvent::EntityCommitted { commit, .. }
                            if commit.entry.txn_id == incoming_txn_id() && !commit.entry.messages.is_empty())
                    });
                    let decided_nothing = config.changes_mind
                        && !counted
                        && matches!(
                            result,
                            Ok(ConsumeOutcome::Processed { messages: 0 }
                                | ConsumeOutcome::Resumed { messages: 0 }
                                | ConsumeOutcome::Adopted { messages: 0 }
                                | ConsumeOutcome::Duplicate)
                        );
                    if published() == 0 && !decided_nothing {
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
                    let step = world.asked(actor_id);
                    trace.push(format!("        {step} of copy {origin_copy}: {result}"));
                    ghost_ends.push((origin_copy, step, result));
                }
            }
        }
        for mut ghost in world.ghosts(&deliveries.copy_of) {
            match world.asked(ghost.id) {
                "late commit" | "late entity commit" => counts.late_commits += 1,
                step => *counts.late_writes.entry(format!("{step}: sent")).or_default() += 1,
            }
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
    let checked = if config.entity {
        super::entity::check(
            &world,
            &events,
            &deliveries.copy_of,
            config.conflicting_writer,
            config.changes_mind,
        )
    } else {
        check(&world, &events, &deliveries.copy_of, config.conflicting_writer)
    };
    let (winner_copy, republished) = checked.map_err(|violation| fail(&trace, violation))?;
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
    for (origin_copy, step, result) in ghost_ends {
        if !matches!(step, "late commit" | "late entity commit") {
            *counts.late_writes.entry(format!("{step}: {result}")).or_default() += 1;
            continue;
        }
        match result {
            "applied" => counts.late_applied += 1,
            "superseded" => {
                counts.late_superseded += 1;
                counts.late_superseded_by_other_copy += usize::from(Some(origin_copy) != winner_copy);
            }
            "lost" => counts.late_lost += 1,
            // Refused otherwise (in entity mode, by the version another commit moved on).
            other => *counts.late_writes.entry(format!("{step}: {other}")).or_default() += 1,
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
/// copy whose attempt won, where known, and whether M's message went out again after
/// the TTL's start.
fn check(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    writer: bool,
) -> Result<(Option<usize>, bool), String> {
    let txn_id = incoming_txn_id();

    // C1: the state change applied once, and the handler never ran in a round whose read
    // found M's record (step 1: a committed record is used as it is).
    check_counter(world, writer)?;
    let commits: Vec<(Box<CommitRequest>, Timestamp)> = world
        .backend
        .store
        .history()
        .into_iter()
        .filter_map(|event| match event {
            StoreEvent::Committed { request, at, .. } if request.txn_id == txn_id => Some((request, at)),
            _ => None,
        })
        .collect();
    let [(winner, committed_at)] = commits.as_slice() else {
        return Err(format!(
            "C1 once in effect: M's record was committed {} times",
            commits.len()
        ));
    };
    check_handler_runs(events, copy_of)?;
    let winner_copy = winner_copy(events, copy_of, winner.outbox.attempt);

    // C2 and C3, then C4.
    check_messages(world, &winner.outbox.messages, *committed_at)?;
    let republished = check_retention(world, events, copy_of)?;
    Ok((winner_copy, republished))
}

/// C1, the business state: the counter counts M once (and the other writer's 100).
pub(super) fn check_counter(world: &World, writer: bool) -> Result<(), String> {
    check_count(world, writer, true)
}

/// C1, the business state: the counter counts M once if `applied`, else not at all (and
/// the other writer's 100).
pub(super) fn check_count(world: &World, writer: bool, applied: bool) -> Result<(), String> {
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
    let expected = u64::from(applied) + if writer { WRITER_ADDS } else { 0 };
    if count != expected {
        return Err(format!(
            "C1 once in effect: {COUNTER} counts {count}, expected {expected} (M once{})",
            if writer { ", plus the other writer's 100" } else { "" }
        ));
    }
    Ok(())
}

/// C1, step 1: the handler never ran in a round whose reads found M committed (its
/// record, or in entity mode its entry in the entity) or deduplicated.
pub(super) fn check_handler_runs(events: &[Event], copy_of: &BTreeMap<ActorId, usize>) -> Result<(), String> {
    let mut last_read: BTreeMap<ActorId, bool> = BTreeMap::new();
    let mut last_entity_read: BTreeMap<ActorId, bool> = BTreeMap::new();
    for event in events {
        match event {
            Event::RecordRead { actor, found } => {
                last_read.insert(*actor, *found);
            }
            Event::EntityRead { actor, found } => {
                last_entity_read.insert(*actor, *found);
            }
            Event::HandlerRun { actor } if last_read.get(actor) != Some(&false) => {
                return Err(format!(
                    "C1 once in effect (step 1): copy {:?} ran the handler although its read found M's record",
                    copy_of.get(actor)
                ));
            }
            Event::HandlerRun { actor } if last_entity_read.get(actor) == Some(&true) => {
                return Err(format!(
                    "C1 once in effect (step 1): copy {:?} ran the handler although its read of {COUNTER} found M's entry",
                    copy_of.get(actor)
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The copy that sent the winning commit attempt `attempt`, where known.
pub(super) fn winner_copy(
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    attempt: Option<TxnId>,
) -> Option<usize> {
    events.iter().find_map(|event| match event {
        Event::CommitSent { actor, attempt: sent } if *sent == attempt => copy_of.get(actor).copied(),
        _ => None,
    })
}

/// C2 and C3: the winner's message (`committed`, committed at `committed_at`), under its
/// derived id, and nothing before the commit; never a losing run's.
pub(super) fn check_messages(
    world: &World,
    committed: &[OutgoingMessage],
    committed_at: Timestamp,
) -> Result<(), String> {
    let expected_id = format!("{}:0", incoming_txn_id());
    let [message] = committed else {
        return Err(format!("the winning commit holds {} messages, not 1", committed.len()));
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
        if send.sent_at < committed_at {
            return Err(format!(
                "C3 nothing before the commit: M's message went out at {} before the commit at {}",
                send.sent_at, committed_at
            ));
        }
    }
    Ok(())
}

/// C4: M's record (in entity mode its dedup record) is dispatched, its TTL the clock at
/// a mark (a dedup put) plus the retention, the clock started no earlier than the
/// messages went out. Returns whether M's message went out again after that start.
pub(super) fn check_retention(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
) -> Result<bool, String> {
    check_retention_of(world, events, copy_of, true)
}

/// [`check_retention`], where M's effect may be nothing at all (`messages` false: a
/// handler that decided M has none), so that no publish started the TTL's clock.
pub(super) fn check_retention_of(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    messages: bool,
) -> Result<bool, String> {
    let txn_id = incoming_txn_id();
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
    let sent = world.backend.publisher.queue(&destination()).expect("events").sent();
    if !messages && sent.is_empty() {
        return Ok(false);
    }
    let first_publish = sent
        .iter()
        .map(|send| send.sent_at)
        .min()
        .ok_or("C4 deterministic retention: M's record is dispatched, but M's message was never published")?;
    if expires_at < first_publish.plus(RETENTION) {
        return Err(format!(
            "C4 deterministic retention: the dedup clock started at {}, before M's message went out at {first_publish}",
            expires_at.minus(RETENTION)
        ));
    }
    // A copy that found the record pending may publish again after another copy's mark
    // started the clock (a harmless duplicate under the same id; its own mark, if it
    // lands last, moves the TTL on).
    Ok(sent.iter().any(|send| send.sent_at > expires_at.minus(RETENTION)))
}
