//! The in-order consumer in the simulation ([`Handler::in_order`]): the placed messages of
//! two entities, as the real request path stamped and published them, delivered by a
//! queue in any order, with a duplicate, to in-order consumers over gated ports.
//!
//! The producer runs once, on the embedded backend with no fault: five transactions in
//! entity mode, each reading its entity through its staging. `ORDER#a` sends one event,
//! then two in one transaction, then nothing, then one (seq 1 to 4 on `events`, its
//! versions 1, 2, 2, 4 and its `after`s 0, 1, 1, 2); `ORDER#b` sends one. What `events`
//! received, and a second copy of `ORDER#a`'s seq 2 (a producer's re-send: same id, same
//! place), is each schedule's queue.
//!
//! Each delivery taken from the queue is a consumer actor, a real [`Consumer`] whose
//! handler appends the message's seq to an item of its own (not idempotent: applied twice,
//! it would show twice). Its reads, its commit (timed out on its way: a *ghost* applies it
//! later, or it is lost), its mark and its requeue of a waiting copy pass gates, where the
//! [`Chooser`] picks who moves, which delivery in hand starts next, and which fault each
//! operation meets. A delivery that failed or crashed is not acknowledged: the queue
//! delivers it again. A waiting copy comes back after its delay, when nothing else can
//! move (or, where [`InOrderConfig::advance_early`], whenever the chooser says).
//!
//! After the queue is empty the check: per chain and entity, the positions the consumer's
//! commits moved, in the order the history committed them, are 1, 2, ..., n, each once
//! (each placed message applied once, in chain order, none skipped), each commit carrying
//! the handler's effect for that seq; and the handler's item lists 1 to n.
//!
//! In entity mode ([`InOrderConfig::entity`]) the handler names its item as its entity,
//! and the consumer keeps each chain's position in that item's key: the item's own
//! conditional write moves it, and where the handler writes nothing (`ORDER#a`'s seq 2,
//! on the item seq 1 created, and every message of `ORDER#b`, whose item is never
//! written) [`Store::keep_applied`](outbox::ports::Store::keep_applied) moves it alone.
//! The check then follows the entity commits and the kept positions in the history
//! ([`StoreEvent::AppliedKept`]): per chain 1 to n, each once, in commit order, each
//! entity commit carrying the handler's effect for its seq and each message that writes
//! nothing moved alone; the handler's item lists exactly the seqs it wrote; no
//! transaction committed and no position item of the transactional mode was written.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox::consumer::in_order::{applied_name, position_key};
use outbox::consumer::{ConsumeError, ConsumeOutcome, Consumer, Delivery, Handler, HandlerError, Incoming, Requeue};
use outbox::embedded::{EmbeddedBackend, EmbeddedInbox, EmbeddedQueue, ManualClock, SendRequest, StoreEvent};
use outbox::ports::{BusinessWrite, Clock, ExpectedVersion, IdSource, ItemKey, QueueError};
use outbox::protocol::{DestinationName, Message, Position, TxnId};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::TransactionLimits;
use outbox::staging::Staging;
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::in_order_effects::{self, out, pair_faults};
use super::ports::{consumer_ports, late_op, plain_gated_store, InFlight};

/// The consumer's name.
const CONSUMER: &str = "ordered";
/// The destination the producer publishes to, the consumer's source queue.
const EVENTS: &str = "events";
/// How long the consumer keeps a message's dedup data.
const RETENTION: Duration = Duration::from_secs(3600);
/// How long a delivery in hand stays invisible: longer than any schedule, so that only
/// a failure (or a crash) gives a message back to the queue.
const IN_HAND: Duration = Duration::from_secs(24 * 3600);

/// What one in-order schedule contains.
#[derive(Debug, Clone)]
pub struct InOrderConfig {
    /// Deliveries consumed at once at most: 1 runs each to its end before the next
    /// starts (every order of delivery, and nothing more, under an exhaustive chooser).
    pub max_in_flight: usize,
    /// Most faults injected in one schedule; then the rest runs with none.
    pub fault_budget: usize,
    /// The faults each operation can meet ([`in_order_faults`] by default).
    pub faults: fn(Op) -> Vec<Fault>,
    /// The clock may move on to a waiting copy's return while other deliveries are in
    /// hand, whenever the chooser says (random runs); otherwise only when nothing else
    /// can move.
    pub advance_early: bool,
    /// Deliveries of one queue message at most before the schedule counts as a livelock.
    pub max_deliveries: u32,
    /// Steps after which the schedule counts as a livelock.
    pub max_steps: usize,
    /// Entity mode: the handler names the item it appends to as its entity, and writes
    /// nothing for `ORDER#a`'s seq 2 and for `ORDER#b` (`writes_nothing`), so that the
    /// consumer keeps the positions in the item's key, moved by its write or alone.
    pub entity: bool,
    /// The pair (`in_order_effects`): the queue holds `ORDER#a`'s seq 1 and 2
    /// alone, the handler emits one message to `out` for each it applies, and the checks
    /// add C2 to C5 (C5 at each acknowledgement) and that no kept message is left behind.
    pub pair: bool,
}

impl InOrderConfig {
    /// At most `max_in_flight` deliveries at once, `fault_budget` faults.
    pub fn new(max_in_flight: usize, fault_budget: usize) -> Self {
        Self {
            max_in_flight,
            fault_budget,
            faults: in_order_faults,
            advance_early: false,
            max_deliveries: 20,
            max_steps: 3_000,
            entity: false,
            pair: false,
        }
    }

    /// The pair ([`Self::pair`]) in the transactional mode: at most `max_in_flight`
    /// deliveries at once, one crash anywhere at most ([`pair_faults`]).
    pub fn pair(max_in_flight: usize, fault_budget: usize) -> Self {
        Self {
            pair: true,
            faults: pair_faults,
            ..Self::new(max_in_flight, fault_budget)
        }
    }

    /// As [`Self::new`], in entity mode ([`Self::entity`]).
    pub fn entity(max_in_flight: usize, fault_budget: usize) -> Self {
        Self {
            entity: true,
            ..Self::new(max_in_flight, fault_budget)
        }
    }
}

/// The faults an in-order consumer's operations can meet, beyond none: its reads fail or
/// crash it; its commit crashes it before or after, loses its reply, is refused, meets
/// contention, or times out on its way (applied later by a ghost, or lost); its mark the
/// same but late; the requeue of a waiting copy (passing the control send's gate) crashes
/// it before or after the copy is sent, or fails.
pub fn in_order_faults(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Read => vec![CrashBefore, Fail],
        Op::Commit => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Busy, Late],
        Op::Mark => vec![CrashBefore, CrashAfter, ReplyLost, Fail],
        Op::ControlSend => vec![CrashBefore, CrashAfter, Fail],
        Op::LateCommit => vec![Fail],
        _ => vec![],
    }
}

/// What the in-order schedules did, summed with [`Self::add`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InOrderCounts {
    /// Schedules run.
    pub schedules: usize,
    /// How each delivery ended: `processed`, `duplicate`, `waiting`, `failed: <kind>`,
    /// or `crashed` (the handler emits nothing, so a commit is dispatched already and a
    /// redelivery after it is a duplicate, never `resumed`).
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Deliveries whose predecessor was not applied yet: sent back to wait (`waiting`),
    /// or failed because the copy could not go back (`failed: waiting`).
    pub waits: usize,
    /// Deliveries of a message after one of it failed or crashed.
    pub redeliveries: usize,
    /// Crashes, by step and side (`commit after`, `requeue before`).
    pub crashes: BTreeMap<String, usize>,
    /// Late commits sent, and applied (the rest were refused or lost).
    pub late_commits: (usize, usize),
    /// Placed messages applied (positions moved), over all schedules.
    pub applied: usize,
    /// Entity mode: positions moved alone ([`StoreEvent::AppliedKept`]), on a live item
    /// and on a key that holds none.
    pub kept: (usize, usize),
    /// The pair: messages the handler's commits sent to `out` (copies included), and
    /// acknowledgements checked against C5.
    pub emitted: usize,
    pub acks_checked: usize,
}

impl InOrderCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &InOrderCounts) {
        self.schedules += other.schedules;
        for (name, n) in &other.outcomes {
            *self.outcomes.entry(name).or_default() += n;
        }
        for (name, n) in &other.crashes {
            *self.crashes.entry(name.clone()).or_default() += n;
        }
        self.waits += other.waits;
        self.redeliveries += other.redeliveries;
        self.late_commits.0 += other.late_commits.0;
        self.late_commits.1 += other.late_commits.1;
        self.applied += other.applied;
        self.kept.0 += other.kept.0;
        self.kept.1 += other.kept.1;
        self.emitted += other.emitted;
        self.acks_checked += other.acks_checked;
    }

    /// Deliveries that ended as `name`.
    pub fn outcome(&self, name: &str) -> usize {
        self.outcomes.get(name).copied().unwrap_or(0)
    }
}

/// What one in-order schedule did.
#[derive(Debug)]
pub struct InOrderOutcome {
    /// Scheduler steps taken.
    pub steps: usize,
    /// Faults injected.
    pub faults: usize,
    /// What happened.
    pub counts: InOrderCounts,
    /// The schedule, one line per step.
    pub trace: Vec<String>,
}

/// Deterministic ids.
pub(super) struct Ids(pub(super) AtomicU64);

impl IdSource for Ids {
    fn next_txn_id(&self, now: Timestamp) -> TxnId {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let mut random = [0u8; 10];
        random[2..].copy_from_slice(&n.to_be_bytes());
        TxnId::from_parts(now, random)
    }
}

fn events() -> DestinationName {
    EVENTS.parse().expect("valid")
}

pub(super) fn start_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)))
}

/// What `events` received from the producer (run once): the placed messages of
/// `ORDER#a` (seq 1 to 4) and `ORDER#b` (seq 1), in the order they were published.
pub fn produced() -> &'static [SendRequest] {
    static PRODUCED: OnceLock<Vec<SendRequest>> = OnceLock::new();
    PRODUCED.get_or_init(produce)
}

fn produce() -> Vec<SendRequest> {
    let clock = start_clock();
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    backend.record();
    let ports = RequestPorts {
        store: backend.store.clone(),
        control_queue: backend.control_queue.clone(),
        clock,
        ids: Arc::new(Ids(AtomicU64::new(1))),
    };
    let outbox = Outbox::new(ports, super::sim_timing(10), TransactionLimits::default())
        .with_inline_publisher(backend.publisher.clone());
    // Per transaction: its entity and how many events it emits.
    for (entity, emits) in [
        ("ORDER#a", 1),
        ("ORDER#a", 2),
        ("ORDER#a", 0),
        ("ORDER#b", 1),
        ("ORDER#a", 1),
    ] {
        let key: ItemKey = entity.parse().expect("valid key");
        let transaction = async {
            let mut txn = outbox.begin_entity(key.clone()).await?;
            let (count, expected) = match txn.get(&key).await? {
                Some(item) => (
                    item.data["count"].as_u64().unwrap_or(0) + 1,
                    ExpectedVersion::Exactly(item.version),
                ),
                None => (1, ExpectedVersion::Absent),
            };
            txn.put(key.clone(), json!({ "count": count }), expected);
            for n in 0..emits {
                let body = json!({ "entity": entity, "count": count, "n": n });
                txn.emit(Message::json(events(), &body).expect("serialisable"));
            }
            txn.commit().await
        };
        transaction
            .now_or_never()
            .expect("the embedded backend answers at once")
            .expect("the producer's transactions commit");
    }
    let queue = backend.publisher.queue(&events()).expect("events").clone();
    queue.sent().into_iter().map(|sent| sent.request).collect()
}

/// The queue's messages: what the producer published, and a second copy of `ORDER#a`'s
/// seq 2.
fn deliveries() -> Vec<SendRequest> {
    let produced = produced();
    let again = produced
        .iter()
        .find(|request| {
            Position::from_attributes(&request.attributes)
                .ok()
                .flatten()
                .is_some_and(|position| position.entity.as_str() == "ORDER#a" && position.seq == 2)
        })
        .expect("ORDER#a's seq 2 was published")
        .clone();
    produced.iter().cloned().chain([again]).collect()
}

/// The handler: appends the message's seq to `APPLIED#{chain}#{entity}` (not idempotent:
/// a message applied twice shows twice); in order. In entity mode it names that item as
/// its entity, and writes nothing for the messages of [`writes_nothing`].
struct Recording {
    entity: bool,
    /// The pair: emits one message to `out` for each message it applies.
    emits: bool,
}

/// The messages the handler writes nothing for in entity mode: `ORDER#a`'s seq 2 (its
/// item exists: seq 1 created it) and every message of `ORDER#b` (its item is never
/// written). The consumer moves their positions alone.
fn writes_nothing(position: &Position, seq: u64) -> bool {
    match position.entity.as_str() {
        "ORDER#a" => seq == 2,
        "ORDER#b" => true,
        _ => false,
    }
}

/// The item where [`Recording`] keeps the seqs it applied of `position`'s chain.
fn applied_key(position: &Position) -> ItemKey {
    format!("APPLIED#{}#{}", position.chain, position.entity)
        .parse()
        .expect("valid key")
}

#[async_trait]
impl Handler for Recording {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("an unplaced message")?;
        if self.entity && writes_nothing(&position, position.seq) {
            return Ok(());
        }
        let key = applied_key(&position);
        let read = staging.get(&key).await?;
        let mut seqs: Vec<Value> = read
            .as_ref()
            .and_then(|item| item.data["seqs"].as_array().cloned())
            .unwrap_or_default();
        seqs.push(json!(position.seq));
        if self.emits {
            let body = json!({ "entity": position.entity.as_str(), "seq": position.seq });
            staging.emit(Message::json(out(), &body).expect("serialisable"));
        }
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, json!({ "seqs": seqs }), expected);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        if !self.entity {
            return Ok(None);
        }
        let position = message.position()?.ok_or("an unplaced message")?;
        Ok(Some(applied_key(&position)))
    }

    fn in_order(&self) -> bool {
        true
    }
}

fn injected(what: &str) -> Box<dyn std::error::Error + Send + Sync> {
    format!("injected fault: {what}").into()
}

/// The consumer's way back to its queue for a waiting copy, through the control send's
/// gate: a crash before or after the copy is sent, or a failure.
pub(super) struct GatedRequeue {
    pub(super) inner: EmbeddedInbox,
    pub(super) gate: Gate,
}

#[async_trait]
impl Requeue for GatedRequeue {
    async fn requeue(
        &self,
        delivery: &Delivery,
        extra: &BTreeMap<String, String>,
        delay: Duration,
    ) -> Result<(), QueueError> {
        match self.gate.pass(Op::ControlSend).await {
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = self.inner.requeue(delivery, extra, delay).await;
                self.gate.crash().await
            }
            Fault::Fail => Err(QueueError::Unavailable(injected("requeue refused"))),
            _ => self.inner.requeue(delivery, extra, delay).await,
        }
    }
}

enum End {
    Consumed(Result<ConsumeOutcome, ConsumeError>),
    Ghost(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A delivery being consumed.
    Consumer,
    /// A commit on its way after its consumer stopped waiting.
    Ghost,
}

struct Actor {
    id: ActorId,
    kind: Kind,
    /// The delivery's receipt, and the message's place (a consumer's).
    receipt: Option<(String, String)>,
    /// The message's place (a consumer's), for the pair's C5 at its acknowledgement.
    position: Option<Position>,
    future: Pin<Box<dyn Future<Output = End>>>,
}

fn poll(actor: &mut Actor) -> Poll<End> {
    let mut context = Context::from_waker(Waker::noop());
    actor.future.as_mut().poll(&mut context)
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    queue: Arc<EmbeddedQueue>,
    inbox: EmbeddedInbox,
    gates: Gates,
    in_flight: InFlight,
    ids: Arc<Ids>,
    next_actor: ActorId,
    /// Entity mode ([`InOrderConfig::entity`]).
    entity: bool,
    /// The pair ([`InOrderConfig::pair`]).
    pair: bool,
    /// The messages on the queue at the start.
    messages: Vec<SendRequest>,
}

impl World {
    fn new(entity: bool, pair: bool) -> Self {
        let clock = start_clock();
        let backend = EmbeddedBackend::new(clock.clone(), [(events(), false), (out(), false)]);
        backend.record();
        let queue = backend.publisher.queue(&events()).expect("events").clone();
        let messages = if pair {
            in_order_effects::pair(produced())
        } else {
            deliveries()
        };
        for request in messages.clone() {
            queue.send(request).expect("the queue takes the producer's messages");
        }
        let inbox = EmbeddedInbox::new(queue.clone(), clock.clone());
        Self {
            clock,
            backend,
            queue,
            inbox,
            gates: Gates::default(),
            in_flight: InFlight::default(),
            ids: Arc::new(Ids(AtomicU64::new(1))),
            next_actor: 0,
            entity,
            pair,
            messages,
        }
    }

    fn gate(&mut self) -> (ActorId, Gate) {
        let id = self.next_actor;
        self.next_actor += 1;
        (id, self.gates.for_actor(id))
    }

    /// What the queue shows now, taken into hand.
    fn receive(&self) -> Vec<Delivery> {
        let mut taken = Vec::new();
        loop {
            let received = self.queue.receive_for(10, IN_HAND);
            if received.is_empty() {
                return taken;
            }
            taken.extend(received.into_iter().map(|message| Delivery {
                message_id: message.message_id,
                receipt: message.receipt,
                body: message.body,
                attributes: message.attributes,
                group_id: message.group_id,
                receive_count: message.receive_count,
                trace_header: None,
            }));
        }
    }

    /// An in-order consumer consuming `delivery`.
    fn consumer(&mut self, delivery: Delivery) -> Actor {
        let (id, gate) = self.gate();
        let store = plain_gated_store(self.backend.store.clone(), &gate, &self.in_flight);
        let ports = consumer_ports(
            store,
            self.backend.publisher.clone(),
            &self.clock,
            &gate,
            self.ids.clone(),
        );
        let requeue = Arc::new(GatedRequeue {
            inner: self.inbox.clone(),
            gate,
        });
        let handler = Arc::new(Recording {
            entity: self.entity,
            emits: self.pair,
        });
        let consumer = Consumer::new(CONSUMER.parse().expect("valid"), ports, handler, RETENTION).with_requeue(requeue);
        let position = Position::from_attributes(&delivery.attributes).ok().flatten();
        let place = position
            .as_ref()
            .map_or_else(|| "unplaced".to_owned(), |p| format!("{} seq {}", p.entity, p.seq));
        let receipt = Some((delivery.receipt.clone(), place));
        Actor {
            id,
            kind: Kind::Consumer,
            receipt,
            position,
            future: Box::pin(async move { End::Consumed(consumer.consume(&delivery).await) }),
        }
    }

    /// Ghosts for the commits that went on their way since the last call.
    fn ghosts(&mut self) -> Vec<Actor> {
        let requests = std::mem::take(&mut *self.in_flight.lock().expect("in-flight lock"));
        requests
            .into_iter()
            .map(|(_, late)| {
                let (id, gate) = self.gate();
                let store: Arc<dyn outbox::ports::Store> = self.backend.store.clone();
                let queue: Arc<dyn outbox::ports::ControlQueue> = self.backend.control_queue.clone();
                Actor {
                    id,
                    kind: Kind::Ghost,
                    receipt: None,
                    position: None,
                    future: Box::pin(
                        async move { End::Ghost(late_op(store, queue, gate, late, None, None, None).await) },
                    ),
                }
            })
            .collect()
    }
}

fn outcome_name(result: &Result<ConsumeOutcome, ConsumeError>) -> &'static str {
    match result {
        Ok(outcome) => outcome.as_str(),
        Err(ConsumeError::Waiting { .. }) => "failed: waiting",
        Err(ConsumeError::Read(_)) => "failed: read",
        // The handler's own read of its item failed.
        Err(ConsumeError::Handler(_)) => "failed: handler",
        Err(ConsumeError::Conflict { .. }) => "failed: conflict",
        Err(ConsumeError::Unsettled(_)) => "failed: unsettled",
        Err(ConsumeError::Mark(_)) => "failed: mark",
        Err(ConsumeError::Refused(_)) => "failed: refused",
        // Entity mode: the entry's removal after the dedup record failed.
        Err(ConsumeError::RemoveEntry(_)) => "failed: remove entry",
        Err(_) => "failed: other",
    }
}

#[derive(Clone, Copy)]
enum Action {
    /// Let the actor at this position through its gate.
    Step(usize),
    /// Start consuming the delivery in hand at this position.
    Start(usize),
    /// Move the clock to the next waiting copy's return.
    Advance(Timestamp),
}

/// Runs one in-order schedule with every decision taken from `chooser`, then checks
/// that each placed message was applied once, in chain order, none skipped; an `Err`
/// names what broke (or the livelock) and the schedule.
pub fn run_in_order_schedule(chooser: &mut dyn Chooser, config: &InOrderConfig) -> Result<InOrderOutcome, String> {
    let mut world = World::new(config.entity, config.pair);
    let mut counts = InOrderCounts {
        schedules: 1,
        ..InOrderCounts::default()
    };
    let mut trace: Vec<String> = Vec::new();
    let fail = |trace: &[String], what: String| format!("{what}\nschedule:\n  {}", trace.join("\n  "));
    let began = world.clock.now();
    let mut hand: Vec<Delivery> = Vec::new();
    let mut actors: Vec<Actor> = Vec::new();
    let (mut steps, mut faults) = (0, 0);
    loop {
        steps += 1;
        if steps > config.max_steps {
            return Err(fail(
                &trace,
                format!("liveness: no quiescence after {} steps", config.max_steps),
            ));
        }
        for delivery in world.receive() {
            if delivery.receive_count > config.max_deliveries {
                return Err(fail(
                    &trace,
                    format!(
                        "liveness: queue message {} delivered {} times",
                        delivery.message_id, delivery.receive_count
                    ),
                ));
            }
            counts.redeliveries += usize::from(delivery.receive_count > 1);
            hand.push(delivery);
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
        let consuming = actors.iter().filter(|actor| actor.kind == Kind::Consumer).count();
        if consuming < config.max_in_flight {
            options.extend((0..hand.len()).map(Action::Start));
        }
        // A waiting copy's return, not a delivery in hand coming back.
        let next_return = world
            .queue
            .next_visible_at()
            .filter(|at| *at < world.clock.now().plus(IN_HAND / 2));
        if let Some(at) = next_return.filter(|_| config.advance_early && !options.is_empty()) {
            options.push(Action::Advance(at));
        }
        if options.is_empty() {
            match next_return {
                Some(at) => {
                    world.clock.set(at);
                    trace.push(format!("t+{}s", at.since(began).as_secs()));
                    continue;
                }
                None => break,
            }
        }
        let choice = if options.len() == 1 {
            0
        } else {
            chooser.pick(options.len())
        };
        let position = match options[choice] {
            Action::Advance(at) => {
                world.clock.set(at);
                trace.push(format!("t+{}s", at.since(began).as_secs()));
                continue;
            }
            Action::Start(index) => {
                let delivery = hand.remove(index);
                let mut actor = world.consumer(delivery);
                let (_, place) = actor.receipt.clone().expect("a consumer's");
                trace.push(format!("#{} takes {place}", actor.id));
                if poll(&mut actor).is_ready() {
                    return Err(fail(&trace, "a consumer ended before its first read".into()));
                }
                actors.push(actor);
                continue;
            }
            Action::Step(position) => position,
        };
        let actor_id = actors[position].id;
        let op = world.gates.lock().waiting.remove(&actor_id).expect("waiting");
        let offered = (config.faults)(op);
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
        let step = match op {
            Op::ControlSend => "requeue",
            Op::LateCommit => "late commit",
            Op::Commit => "commit",
            Op::Mark => "mark",
            Op::Read => "read",
            Op::Publish => "publish",
            _ => "other",
        };
        match fault {
            Fault::None => {}
            Fault::CrashBefore => *counts.crashes.entry(format!("{step} before")).or_default() += 1,
            Fault::CrashAfter => *counts.crashes.entry(format!("{step} after")).or_default() += 1,
            _ => {}
        }
        trace.push(format!(
            "#{actor_id}: {step}{}",
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
                let actor = actors.swap_remove(position);
                if let Some((receipt, place)) = actor.receipt {
                    *counts.outcomes.entry("crashed").or_default() += 1;
                    trace.push(format!("    {place}: crashed, not acknowledged"));
                    world.queue.change_visibility(&receipt, Duration::ZERO);
                }
            }
            Poll::Pending => {}
            Poll::Ready(End::Consumed(result)) => {
                let actor = actors.swap_remove(position);
                let (receipt, place) = actor.receipt.expect("a consumer's");
                let name = outcome_name(&result);
                if let (true, Ok(outcome), Some(placed)) = (world.pair, &result, &actor.position) {
                    trace.push(format!("    {place}: {name}"));
                    in_order_effects::check_ack(&world.backend, CONSUMER, placed, outcome)
                        .map_err(|violation| fail(&trace, violation))?;
                    trace.pop();
                    counts.acks_checked += 1;
                }
                *counts.outcomes.entry(name).or_default() += 1;
                counts.waits += usize::from(matches!(
                    result,
                    Ok(ConsumeOutcome::Waiting { .. }) | Err(ConsumeError::Waiting { .. })
                ));
                trace.push(format!("    {place}: {name}"));
                if result.is_ok() {
                    world.queue.delete(&receipt);
                } else {
                    world.queue.change_visibility(&receipt, Duration::ZERO);
                }
            }
            Poll::Ready(End::Ghost(arrived)) => {
                actors.swap_remove(position);
                counts.late_commits.1 += usize::from(arrived);
                trace.push(format!(
                    "    late commit {}",
                    if arrived { "reached the table" } else { "lost" }
                ));
            }
        }
        for mut ghost in world.ghosts() {
            counts.late_commits.0 += 1;
            if !matches!(poll(&mut ghost), Poll::Ready(_)) {
                actors.push(ghost);
            }
        }
    }
    if config.entity {
        let (applied, kept) = check_entity(&world).map_err(|violation| fail(&trace, violation))?;
        counts.applied = applied;
        counts.kept = kept;
    } else {
        counts.applied = check(&world).map_err(|violation| fail(&trace, violation))?;
    }
    if config.pair {
        let first = world
            .messages
            .first()
            .and_then(|request| Position::from_attributes(&request.attributes).ok().flatten());
        let position = first.ok_or("the pair's queue holds no placed message")?;
        let length = world.messages.len() as u64;
        counts.emitted = in_order_effects::check_effects(&world.backend, CONSUMER, &position, length, RETENTION)
            .map_err(|violation| fail(&trace, violation))?;
    }
    Ok(InOrderOutcome {
        steps,
        faults,
        counts,
        trace,
    })
}

/// The in-order consumer's invariant: per chain and entity, the positions its commits
/// moved, in the order the history committed them, are 1, 2, ..., n, each once (every
/// placed message applied once, in chain order, none skipped), each commit carrying the
/// handler's effect for that seq; the handler's item lists 1 to n; the queue is empty.
/// Returns how many messages were applied.
fn check(world: &World) -> Result<usize, String> {
    let fail = |detail: String| Err(format!("in-order consumer violated: {detail}"));
    let mut chains: BTreeMap<ItemKey, (Position, u64)> = BTreeMap::new();
    for request in &world.messages {
        let position = Position::from_attributes(&request.attributes)
            .map_err(|error| error.to_string())?
            .ok_or("the producer published an unplaced message")?;
        let key = position_key(CONSUMER, &position);
        let length = chains.entry(key).or_insert((position.clone(), 0));
        length.1 = length.1.max(position.seq);
    }
    let mut moves: BTreeMap<&ItemKey, Vec<u64>> = BTreeMap::new();
    for event in world.backend.store.history() {
        let StoreEvent::Committed { request, .. } = event else {
            continue;
        };
        let put = |wanted: &ItemKey| {
            request.writes.iter().find_map(|write| match write {
                BusinessWrite::Put { key, data, .. } if key == wanted => Some(data.clone()),
                _ => None,
            })
        };
        for (key, (position, _)) in &chains {
            let Some(moved) = put(key) else { continue };
            let seq = moved["applied"].as_u64().unwrap_or(0);
            let effect = put(&applied_key(position))
                .and_then(|data| data["seqs"].as_array().and_then(|seqs| seqs.last()?.as_u64()));
            if effect != Some(seq) {
                return fail(format!(
                    "{} on {}: the commit that moved the position to {seq} carries the handler's effect for {effect:?}",
                    position.entity, position.chain
                ));
            }
            moves.entry(key).or_default().push(seq);
        }
    }
    let mut applied = 0;
    for (key, (position, length)) in &chains {
        let expected: Vec<u64> = (1..=*length).collect();
        let moved = moves.get(key).cloned().unwrap_or_default();
        if moved != expected {
            return fail(format!(
                "{} on {}: the positions applied, in the order they committed, are {moved:?}, not {expected:?} (each once, in chain order, none skipped)",
                position.entity, position.chain
            ));
        }
        let items = outbox::ports::Store::get_items(world.backend.store.as_ref(), &[applied_key(position)])
            .now_or_never()
            .expect("the embedded store answers at once")
            .map_err(|error| error.to_string())?;
        let seqs: Vec<u64> = items
            .values()
            .next()
            .and_then(|item| item.data["seqs"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        if seqs != expected {
            return fail(format!(
                "{} on {}: the handler applied {seqs:?}, not {expected:?}",
                position.entity, position.chain
            ));
        }
        applied += moved.len();
    }
    if !world.queue.is_empty() {
        return fail(format!(
            "liveness: {} messages left in the queue (waiting, or never acknowledged)",
            world.queue.len()
        ));
    }
    Ok(applied)
}

/// How a chain's position moved in entity mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moved {
    /// By the entity's own conditional write ([`StoreEvent::EntityCommitted`]).
    Commit,
    /// Alone ([`StoreEvent::AppliedKept`]).
    Kept,
}

/// The in-order consumer's invariant in entity mode, from the history: per chain and
/// entity, the positions kept in the entity's key moved, in the order the history made
/// the moves, to 1, 2, ..., n, each once; each entity commit that moved one to `s`
/// carries the handler's effect for `s`, and the messages the handler writes nothing for
/// ([`writes_nothing`]) moved it alone; the handler's item lists exactly the seqs it
/// wrote, the key keeps the position at n, no transaction committed and no position item
/// of the transactional mode was written; the queue is empty. Returns how many messages
/// were applied, and how many moved alone on a live item and on a key holding none.
fn check_entity(world: &World) -> Result<(usize, (usize, usize)), String> {
    let violated = |detail: String| format!("in-order consumer in entity mode violated: {detail}");
    let fail = |detail: String| Err(violated(detail));
    // Per chain, by the name its position is kept under: a message of it, and its length.
    let mut chains: BTreeMap<String, (Position, u64)> = BTreeMap::new();
    for request in produced() {
        let position = Position::from_attributes(&request.attributes)
            .map_err(|error| error.to_string())?
            .ok_or("the producer published an unplaced message")?;
        let length = chains
            .entry(applied_name(CONSUMER, &position))
            .or_insert((position.clone(), 0));
        length.1 = length.1.max(position.seq);
    }
    let position_items: Vec<ItemKey> = chains
        .values()
        .map(|(position, _)| position_key(CONSUMER, position))
        .collect();
    let chain_of = |name: &str, key: &ItemKey| -> Result<&Position, String> {
        let (position, _) = chains
            .get(name)
            .ok_or_else(|| format!("a position {name:?} that names no chain of the producer's moved"))?;
        if *key != applied_key(position) {
            return Err(format!(
                "the position of {} on {} moved in {key}, not in the handler's entity {}",
                position.entity,
                position.chain,
                applied_key(position)
            ));
        }
        Ok(position)
    };
    let mut moves: BTreeMap<String, Vec<(u64, Moved)>> = BTreeMap::new();
    // The keys an entity commit wrote so far (no item is ever deleted here): a position
    // kept on one of them was kept on a live item.
    let mut written: Vec<ItemKey> = Vec::new();
    let mut kept = (0, 0);
    for event in world.backend.store.history() {
        match event {
            StoreEvent::Committed { request, .. } => {
                let position_item = request
                    .writes
                    .iter()
                    .find(|write| position_items.contains(write.key()))
                    .map(|write| write.key().to_string());
                return fail(match position_item {
                    Some(key) => format!(
                        "transaction {} wrote the transactional mode's position item {key}",
                        request.txn_id
                    ),
                    None => format!(
                        "transaction {} committed: in entity mode the consumer commits none",
                        request.txn_id
                    ),
                });
            }
            StoreEvent::EntityCommitted { commit, .. } => {
                written.push(commit.key.clone());
                let Some((name, applied)) = &commit.applied else {
                    continue;
                };
                let position = chain_of(name, &commit.key).map_err(violated)?;
                let seq = applied.seq;
                if writes_nothing(position, seq) {
                    return fail(format!(
                        "{} on {}: an entity commit moved the position to {seq}, a message the handler writes nothing for (it moves alone)",
                        position.entity, position.chain
                    ));
                }
                let effect = commit.data["seqs"].as_array().and_then(|seqs| seqs.last()?.as_u64());
                if effect != Some(seq) {
                    return fail(format!(
                        "{} on {}: the entity commit that moved the position to {seq} carries the handler's effect for {effect:?}",
                        position.entity, position.chain
                    ));
                }
                moves.entry(name.clone()).or_default().push((seq, Moved::Commit));
            }
            StoreEvent::AppliedKept { key, name, applied } => {
                let position = chain_of(&name, &key).map_err(violated)?;
                let seq = applied.seq;
                if !writes_nothing(position, seq) {
                    return fail(format!(
                        "{} on {}: the position moved alone to {seq}, a message whose effect the handler writes",
                        position.entity, position.chain
                    ));
                }
                if written.contains(&key) {
                    kept.0 += 1;
                } else {
                    kept.1 += 1;
                }
                moves.entry(name).or_default().push((seq, Moved::Kept));
            }
            _ => {}
        }
    }
    let store = world.backend.store.as_ref();
    let mut applied = 0;
    for (name, (position, length)) in &chains {
        let expected: Vec<u64> = (1..=*length).collect();
        let moved: Vec<u64> = moves
            .get(name)
            .map(|moved| moved.iter().map(|(seq, _)| *seq).collect())
            .unwrap_or_default();
        if moved != expected {
            return fail(format!(
                "{} on {}: the positions moved, in the order the history made the moves, to {moved:?}, not {expected:?} (each once, in chain order, none skipped); the moves, by whom: {:?}",
                position.entity,
                position.chain,
                moves.get(name).cloned().unwrap_or_default()
            ));
        }
        let key = applied_key(position);
        let read = outbox::ports::Store::get_keys(store, std::slice::from_ref(&key))
            .now_or_never()
            .expect("the embedded store answers at once")
            .map_err(|error| error.to_string())?
            .remove(&key)
            .unwrap_or_default();
        let written: Vec<u64> = expected
            .iter()
            .copied()
            .filter(|seq| !writes_nothing(position, *seq))
            .collect();
        let seqs: Vec<u64> = read
            .item
            .as_ref()
            .and_then(|item| item.data["seqs"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        if seqs != written || (written.is_empty() && read.item.is_some()) {
            return fail(format!(
                "{} on {}: the handler's item {key} is {:?}, not the seqs it writes for, {written:?}",
                position.entity,
                position.chain,
                read.item.map(|item| item.data)
            ));
        }
        let held = read.applied.get(name).map(|held| held.seq);
        if held != Some(*length) {
            return fail(format!(
                "{} on {}: {key} keeps the position at {held:?}, not {length}",
                position.entity, position.chain
            ));
        }
        applied += moved.len();
    }
    let items = outbox::ports::Store::get_items(store, &position_items)
        .now_or_never()
        .expect("the embedded store answers at once")
        .map_err(|error| error.to_string())?;
    if !items.is_empty() {
        return fail(format!(
            "the transactional mode's position items {:?} exist",
            items.keys().collect::<Vec<_>>()
        ));
    }
    if !world.queue.is_empty() {
        return fail(format!(
            "liveness: {} messages left in the queue (waiting, or never acknowledged)",
            world.queue.len()
        ));
    }
    Ok((applied, kept))
}
