//! Order past the first hop: the placed messages of two transactions on one entity, as the
//! real request path published them, through a consumer that publishes (`shipping`) to an
//! in-order consumer of its messages (`billing`), each hop's source a queue that is FIFO or
//! standard, with a dead-letter queue behind it.
//!
//! The producer runs once per kind of destination, on the embedded backend with no fault:
//! two transactions in entity mode on `ORDER#a`, one event each (seq 1 and 2 on
//! `events`). What the request path's own world proves it can put on `events` is what a
//! schedule starts from ([`HopInput`]): the two in chain order; the same with seq 1 sent
//! again after seq 2 (a publish whose reply was lost, sent again by the control worker
//! after a FIFO queue's five-minute deduplication window); or seq 2 before seq 1 (a
//! producer that keeps no order, such as a consumer of a standard queue upstream).
//!
//! Each queue is the embedded one ([`EmbeddedQueue`]), which models SQS: on a FIFO queue
//! a message group yields nothing while a message of it is in flight, later messages of a
//! group wait for earlier ones, a receive counts, and a message received
//! [`MAX_RECEIVE_COUNT`] times (the template's redrive policy) moves to the queue's
//! dead-letter queue instead of being received again. A receive takes up to
//! [`HopConfig::batch`] messages, as Lambda's event source mapping does; each batch is an
//! actor consuming it with [`Consumer::consume_batch`] (a FIFO group's messages one after
//! the other, a failure failing the rest of its group), whose reads, commits, marks,
//! keeps, publishes and requeues pass gates where the [`Chooser`] picks who moves, which
//! batch in hand starts next, and which fault each operation meets. At the batch's end
//! its successes are deleted and its failures come back (Lambda's partial batch
//! response); a batch that crashed comes back whole. A delivery stays in hand for longer
//! than any schedule: the template's visibility timeout is six times each function's
//! timeout, so only a failure or a crash gives a message back, and a request still on its
//! way after its function ended is a *ghost* ([`Fault::Late`]).
//!
//! `shipping` applies each event in order: it appends the event's seq to `SHIPMENT#a`
//! and emits one message to `shipments` saying which seq it followed; `billing` appends
//! the pair (its message's seq on `shipments`, the event's seq) to `INVOICE#a`. Neither
//! handler is idempotent: a message applied twice shows twice. After the queues are empty
//! the check ([`check`]): both dead-letter queues are empty; `SHIPMENT#a` lists 1, 2;
//! what `shipments` received is placed, one chain of `SHIPMENT#a` whose seq `k` followed
//! the event of seq `k`, each message first sent in seq order on a FIFO queue; `INVOICE#a`
//! lists (1, 1), (2, 2): the last consumer applied each once, in chain order, and the
//! order of the first hop; each consumer's position is at 2; nothing is kept above it (a kept message whose
//! removal failed is left to its expiry, a duplicate if read again).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox::consumer::in_order::{applied_name, kept_keys, position_key};
use outbox::consumer::{BatchReport, ConsumeError, Consumer, Delivery, Handler, HandlerError, Incoming};
use outbox::embedded::{
    EmbeddedBackend, EmbeddedInbox, EmbeddedPublisher, EmbeddedQueue, ManualClock, QueueConfig, SendRequest,
};
use outbox::ports::{Clock, ExpectedVersion, ItemKey, KeyRead, Store};
use outbox::protocol::{DestinationName, Message, Position, MESSAGE_ID_ATTRIBUTE};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::TransactionLimits;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::in_order::{start_clock, GatedRequeue, Ids};
use super::ports::{consumer_ports, late_op, plain_gated_store, InFlight};

/// The first hop's source: where the request path publishes.
const EVENTS: &str = "events";
/// The second hop's source: where `shipping` publishes.
const SHIPMENTS: &str = "shipments";
/// The consumer that publishes.
pub const SHIPPING: &str = "shipping";
/// The last consumer.
pub const BILLING: &str = "billing";
/// The entity of the request path's transactions.
const ORDER: &str = "ORDER#a";
/// `shipping`'s item, its entity in entity mode.
const SHIPMENT: &str = "SHIPMENT#a";
/// `billing`'s item, its entity in entity mode.
const INVOICE: &str = "INVOICE#a";
/// How long each consumer keeps a message's dedup data.
const RETENTION: Duration = Duration::from_secs(3600);
/// Receives of a message before it moves to its queue's dead-letter queue (the
/// template's `maxReceiveCount` for `events` and `shipments`).
pub const MAX_RECEIVE_COUNT: u32 = 5;
/// How long a batch in hand stays invisible: longer than any schedule.
const IN_HAND: Duration = Duration::from_secs(24 * 3600);

fn destination(name: &str) -> DestinationName {
    name.parse().expect("valid")
}

/// What the request path put on `events` (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopInput {
    /// Seq 1, then seq 2.
    InOrder,
    /// Seq 1, seq 2, then seq 1 again with a deduplication id of its own (sent again
    /// after the deduplication window).
    SentAgain,
    /// Seq 2, then seq 1.
    Reversed,
}

/// What one hop schedule contains.
#[derive(Debug, Clone)]
pub struct HopConfig {
    /// What is on `events` at the start.
    pub input: HopInput,
    /// `events` is a FIFO queue (the request path groups by entity).
    pub events_fifo: bool,
    /// `shipments` is a FIFO queue.
    pub shipments_fifo: bool,
    /// `shipping` in entity mode (`SHIPMENT#a` its entity), else transactional.
    pub shipping_entity: bool,
    /// `billing` in entity mode (`INVOICE#a` its entity), else transactional.
    pub billing_entity: bool,
    /// Messages per receive at most (Lambda's `BatchSize`); above 1 only on FIFO sources,
    /// whose batches run in order.
    pub batch: usize,
    /// Batches consumed at once at most, over both hops: 1 runs each to its end before
    /// the next starts (every order of delivery, under an exhaustive chooser).
    pub max_in_flight: usize,
    /// Most faults injected in one schedule.
    pub fault_budget: usize,
    /// The faults each operation can meet ([`hop_faults`] by default).
    pub faults: fn(Op) -> Vec<Fault>,
    /// Steps after which the schedule counts as a livelock.
    pub max_steps: usize,
    /// Preemptions at most (a switch away from the actor that moved last while it could
    /// move on: to another actor, or to start a batch), or any number.
    pub max_preemptions: Option<usize>,
}

impl HopConfig {
    /// Both sources FIFO, both consumers transactional, batches of one, one at a time.
    pub fn new(input: HopInput, fault_budget: usize) -> Self {
        Self {
            input,
            events_fifo: true,
            shipments_fifo: true,
            shipping_entity: false,
            billing_entity: false,
            batch: 1,
            max_in_flight: 1,
            fault_budget,
            faults: hop_faults,
            max_steps: 3_000,
            max_preemptions: None,
        }
    }

    /// A line naming the configuration, for the counterexamples and the figures.
    pub fn name(&self) -> String {
        let source = |fifo: bool| if fifo { "FIFO" } else { "standard" };
        let mode = |entity: bool| if entity { "entity" } else { "transactional" };
        format!(
            "{:?} on {} events, {} shipments; shipping {}, billing {}; batches of {}, {} at once{}, {} fault(s)",
            self.input,
            source(self.events_fifo),
            source(self.shipments_fifo),
            mode(self.shipping_entity),
            mode(self.billing_entity),
            self.batch,
            self.max_in_flight,
            self.max_preemptions
                .map_or_else(String::new, |bound| format!(" (at most {bound} preemptions)")),
            self.fault_budget,
        )
    }
}

/// The faults a consumer's operations can meet in the hop world, beyond none: its reads
/// fail or crash it; its commit crashes it before or after, loses its reply, is refused,
/// meets contention, or times out on its way (applied later by a ghost, or lost); its
/// marks, keeps and removals crash it, lose their reply or fail; its publish crashes it,
/// loses its reply, is refused or has its first entry refused; a requeue or reminder
/// crashes it or fails. Beside these, a message received from a standard queue may come
/// twice (at-least-once delivery).
pub fn hop_faults(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Read => vec![CrashBefore, Fail],
        Op::Commit => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Busy, Late],
        Op::Mark => vec![CrashBefore, CrashAfter, ReplyLost, Fail],
        Op::Publish => vec![CrashBefore, CrashAfter, ReplyLost, Fail, FirstEntryFails],
        Op::ControlSend => vec![CrashBefore, CrashAfter, Fail],
        Op::LateCommit => vec![Fail],
        _ => vec![],
    }
}

/// What the hop schedules did, summed with [`Self::add`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HopCounts {
    /// Schedules run.
    pub schedules: usize,
    /// Steps taken, over all schedules.
    pub steps: usize,
    /// How each delivery ended, per consumer: `processed`, `duplicate`, `kept`,
    /// `waiting`, `failed: <kind>`, or `crashed` (its batch crashed).
    pub outcomes: BTreeMap<String, usize>,
    /// Faults injected, by operation and kind (`publish CrashAfter`).
    pub faults: BTreeMap<String, usize>,
    /// Deliveries of a message after one of it failed or crashed.
    pub redeliveries: usize,
    /// The most times one message was received.
    pub most_receives: u32,
    /// Late commits sent, and applied.
    pub late_commits: (usize, usize),
    /// Batches of more than one message.
    pub batches_of_many: usize,
    /// Kept messages left to their expiry after their removal failed (each a duplicate
    /// if read again).
    pub left_to_expire: usize,
}

impl HopCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &HopCounts) {
        self.schedules += other.schedules;
        self.steps += other.steps;
        for (name, n) in &other.outcomes {
            *self.outcomes.entry(name.clone()).or_default() += n;
        }
        for (name, n) in &other.faults {
            *self.faults.entry(name.clone()).or_default() += n;
        }
        self.redeliveries += other.redeliveries;
        self.most_receives = self.most_receives.max(other.most_receives);
        self.late_commits.0 += other.late_commits.0;
        self.late_commits.1 += other.late_commits.1;
        self.batches_of_many += other.batches_of_many;
        self.left_to_expire += other.left_to_expire;
    }

    /// Deliveries of `consumer` that ended as `name`.
    pub fn outcome(&self, consumer: &str, name: &str) -> usize {
        self.outcomes.get(&format!("{consumer} {name}")).copied().unwrap_or(0)
    }
}

/// What one hop schedule did.
#[derive(Debug)]
pub struct HopOutcome {
    /// Faults injected.
    pub faults: usize,
    /// What happened.
    pub counts: HopCounts,
    /// The schedule, one line per step.
    pub trace: Vec<String>,
}

/// What the request path published to `events` (run once per kind of destination): the
/// placed messages of `ORDER#a`'s two transactions, seq 1 and 2, in that order.
pub fn hop_produced(fifo: bool) -> &'static [SendRequest] {
    static FIFO: OnceLock<Vec<SendRequest>> = OnceLock::new();
    static STANDARD: OnceLock<Vec<SendRequest>> = OnceLock::new();
    if fifo {
        FIFO.get_or_init(|| produce(true))
    } else {
        STANDARD.get_or_init(|| produce(false))
    }
}

fn produce(fifo: bool) -> Vec<SendRequest> {
    let clock = start_clock();
    let backend = EmbeddedBackend::new(clock.clone(), [(destination(EVENTS), fifo)]);
    backend.record();
    let ports = RequestPorts {
        store: backend.store.clone(),
        control_queue: backend.control_queue.clone(),
        clock,
        ids: Arc::new(Ids(AtomicU64::new(1))),
    };
    let outbox = Outbox::new(ports, super::sim_timing(10), TransactionLimits::default())
        .with_inline_publisher(backend.publisher.clone());
    let key: ItemKey = ORDER.parse().expect("valid key");
    for n in 1..=2u64 {
        let transaction = async {
            let mut txn = outbox.begin_entity(key.clone()).await?;
            let expected = match txn.get(&key).await? {
                Some(item) => ExpectedVersion::Exactly(item.version),
                None => ExpectedVersion::Absent,
            };
            txn.put(key.clone(), json!({ "n": n }), expected);
            txn.emit(Message::json(destination(EVENTS), &json!({ "order": "a", "n": n })).expect("serialisable"));
            txn.commit().await
        };
        transaction
            .now_or_never()
            .expect("the embedded backend answers at once")
            .expect("the producer's transactions commit");
    }
    let queue = backend.publisher.queue(&destination(EVENTS)).expect("events").clone();
    let sent: Vec<SendRequest> = queue.sent().into_iter().map(|sent| sent.request).collect();
    let seqs: Vec<Option<u64>> = sent.iter().map(seq_of).collect();
    assert_eq!(seqs, [Some(1), Some(2)], "the producer's two events, placed, in order");
    sent
}

fn seq_of(request: &SendRequest) -> Option<u64> {
    Position::from_attributes(&request.attributes)
        .ok()
        .flatten()
        .map(|position| position.seq)
}

/// What is on `events` at the start of a schedule of `input`.
fn input_messages(input: HopInput, fifo: bool) -> Vec<SendRequest> {
    let produced = hop_produced(fifo);
    match input {
        HopInput::InOrder => produced.to_vec(),
        HopInput::Reversed => produced.iter().rev().cloned().collect(),
        HopInput::SentAgain => {
            let mut again = produced[0].clone();
            again.deduplication_id = again.deduplication_id.map(|id| format!("{id}-again"));
            produced.iter().cloned().chain([again]).collect()
        }
    }
}

/// `shipping`: applies each event of `ORDER#a` in order, appending its seq to
/// `SHIPMENT#a`, and emits one message to `shipments` naming that seq.
struct Shipping {
    entity: bool,
}

/// `billing`: applies each message of `shipments` in order, appending the pair (its seq,
/// the event's seq it names) to `INVOICE#a`.
struct Billing {
    entity: bool,
}

fn key(name: &str) -> ItemKey {
    name.parse().expect("valid key")
}

/// Reads `item`'s list `field` through the staging, appends `value` and stages the put.
async fn append(
    staging: &mut outbox::staging::Staging,
    item: &str,
    field: &str,
    value: Value,
) -> Result<(), HandlerError> {
    let item = key(item);
    let read = staging.get(&item).await?;
    let mut list: Vec<Value> = read
        .as_ref()
        .and_then(|found| found.data[field].as_array().cloned())
        .unwrap_or_default();
    list.push(value);
    let expected = read.map_or(ExpectedVersion::Absent, |found| ExpectedVersion::Exactly(found.version));
    staging.put(item, json!({ field: list }), expected);
    Ok(())
}

#[async_trait]
impl Handler for Shipping {
    async fn handle(&self, message: &Incoming, staging: &mut outbox::staging::Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("an unplaced event")?;
        append(staging, SHIPMENT, "seqs", json!(position.seq)).await?;
        let body = json!({ "order": "a", "event": position.seq });
        staging.emit(Message::json(destination(SHIPMENTS), &body)?);
        Ok(())
    }

    fn entity(&self, _message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(self.entity.then(|| key(SHIPMENT)))
    }

    fn in_order(&self) -> bool {
        true
    }
}

#[async_trait]
impl Handler for Billing {
    async fn handle(&self, message: &Incoming, staging: &mut outbox::staging::Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("an unplaced shipment message")?;
        let body: Value = message.json()?;
        append(staging, INVOICE, "applied", json!([position.seq, body["event"]])).await
    }

    fn entity(&self, _message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(self.entity.then(|| key(INVOICE)))
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// A hop: its consumer's source queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Hop {
    Shipping,
    Billing,
}

impl Hop {
    fn consumer(self) -> &'static str {
        match self {
            Hop::Shipping => SHIPPING,
            Hop::Billing => BILLING,
        }
    }
}

enum End {
    Batch(BatchReport),
    Ghost(bool),
}

struct Actor {
    id: ActorId,
    /// A batch's hop and deliveries (their receipts and places); none for a ghost.
    batch: Option<(Hop, Vec<(String, String)>)>,
    future: Pin<Box<dyn Future<Output = End>>>,
}

fn poll(actor: &mut Actor) -> Poll<End> {
    let mut context = Context::from_waker(Waker::noop());
    actor.future.as_mut().poll(&mut context)
}

struct World {
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    events: Arc<EmbeddedQueue>,
    shipments: Arc<EmbeddedQueue>,
    gates: Gates,
    in_flight: InFlight,
    ids: Arc<Ids>,
    next_actor: ActorId,
    config: HopConfig,
}

/// A queue of `name` with its dead-letter queue, as the template makes them.
fn queue_with_dead_letters(name: &str, fifo: bool, clock: &Arc<ManualClock>) -> Arc<EmbeddedQueue> {
    let config = |name: &str| {
        if fifo {
            QueueConfig::fifo(name)
        } else {
            QueueConfig::standard(name)
        }
    };
    let dead_letters = Arc::new(EmbeddedQueue::new(config(&format!("{name}-dlq")), clock.clone()));
    let queue = EmbeddedQueue::new(config(name), clock.clone()).with_dead_letter_queue(dead_letters, MAX_RECEIVE_COUNT);
    queue.record_sends();
    Arc::new(queue)
}

impl World {
    fn new(config: &HopConfig) -> Self {
        let clock = start_clock();
        let events = queue_with_dead_letters(EVENTS, config.events_fifo, &clock);
        let shipments = queue_with_dead_letters(SHIPMENTS, config.shipments_fifo, &clock);
        let mut backend = EmbeddedBackend::new(clock.clone(), []);
        backend.publisher = Arc::new(EmbeddedPublisher::new(BTreeMap::from([
            (destination(EVENTS), events.clone()),
            (destination(SHIPMENTS), shipments.clone()),
        ])));
        backend.record();
        for request in input_messages(config.input, config.events_fifo) {
            events.send(request).expect("the queue takes the producer's messages");
        }
        Self {
            clock,
            backend,
            events,
            shipments,
            gates: Gates::default(),
            in_flight: InFlight::default(),
            ids: Arc::new(Ids(AtomicU64::new(1))),
            next_actor: 0,
            config: config.clone(),
        }
    }

    fn queue(&self, hop: Hop) -> &Arc<EmbeddedQueue> {
        match hop {
            Hop::Shipping => &self.events,
            Hop::Billing => &self.shipments,
        }
    }

    fn gate(&mut self) -> (ActorId, Gate) {
        let id = self.next_actor;
        self.next_actor += 1;
        (id, self.gates.for_actor(id))
    }

    /// What `hop`'s queue shows now, taken into hand in batches.
    fn receive(&self, hop: Hop) -> Vec<Vec<Delivery>> {
        let mut batches = Vec::new();
        loop {
            let received = self.queue(hop).receive_for(self.config.batch, IN_HAND);
            if received.is_empty() {
                return batches;
            }
            batches.push(
                received
                    .into_iter()
                    .map(|message| Delivery {
                        message_id: message.message_id,
                        receipt: message.receipt,
                        body: message.body,
                        attributes: message.attributes,
                        group_id: message.group_id,
                        receive_count: message.receive_count,
                        trace_header: None,
                    })
                    .collect(),
            );
        }
    }

    /// `hop`'s consumer consuming `batch`.
    fn consumer(&mut self, hop: Hop, batch: Vec<Delivery>) -> Actor {
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
            inner: EmbeddedInbox::new(self.queue(hop).clone(), self.clock.clone()),
            gate,
        });
        let handler: Arc<dyn Handler> = match hop {
            Hop::Shipping => Arc::new(Shipping {
                entity: self.config.shipping_entity,
            }),
            Hop::Billing => Arc::new(Billing {
                entity: self.config.billing_entity,
            }),
        };
        let consumer =
            Consumer::new(hop.consumer().parse().expect("valid"), ports, handler, RETENTION).with_requeue(requeue);
        let deliveries = batch
            .iter()
            .map(|delivery| (delivery.receipt.clone(), place(delivery)))
            .collect();
        Actor {
            id,
            batch: Some((hop, deliveries)),
            future: Box::pin(async move { End::Batch(consumer.consume_batch(&batch).await) }),
        }
    }

    /// Ghosts for the commits that went on their way since the last call.
    fn ghosts(&mut self) -> Vec<Actor> {
        let requests = std::mem::take(&mut *self.in_flight.lock().expect("in-flight lock"));
        requests
            .into_iter()
            .map(|(_, late)| {
                let (id, gate) = self.gate();
                let store: Arc<dyn Store> = self.backend.store.clone();
                let queue: Arc<dyn outbox::ports::ControlQueue> = self.backend.control_queue.clone();
                Actor {
                    id,
                    batch: None,
                    future: Box::pin(
                        async move { End::Ghost(late_op(store, queue, gate, late, None, None, None).await) },
                    ),
                }
            })
            .collect()
    }
}

/// A delivery's place, for the trace: its entity and seq.
fn place(delivery: &Delivery) -> String {
    match Position::from_attributes(&delivery.attributes) {
        Ok(Some(position)) => format!("{} seq {}", position.entity, position.seq),
        _ => "an unplaced message".to_owned(),
    }
}

fn outcome_name(result: &Result<outbox::consumer::ConsumeOutcome, ConsumeError>) -> &'static str {
    match result {
        Ok(outcome) => outcome.as_str(),
        Err(ConsumeError::Waiting { .. }) => "failed: waiting",
        Err(ConsumeError::EarlierInGroupFailed) => "failed: earlier in group",
        Err(ConsumeError::KeptNotApplied { .. }) => "failed: kept not applied",
        Err(ConsumeError::Read(_)) => "failed: read",
        Err(ConsumeError::Handler(_)) => "failed: handler",
        Err(ConsumeError::Conflict { .. }) => "failed: conflict",
        Err(ConsumeError::Unsettled(_)) => "failed: unsettled",
        Err(ConsumeError::Publish { .. }) => "failed: publish",
        Err(ConsumeError::Mark(_)) => "failed: mark",
        Err(ConsumeError::Refused(_)) => "failed: refused",
        Err(ConsumeError::RemoveEntry(_)) => "failed: remove entry",
        Err(ConsumeError::NotOneItem { .. }) => "failed: not one item",
        Err(ConsumeError::Corrupt { .. }) => "failed: corrupt",
        Err(ConsumeError::Unsendable(_)) => "failed: unsendable",
        Err(ConsumeError::NoId(_)) => "failed: no id",
        Err(ConsumeError::Earlier { .. }) => "failed: earlier unsent",
        Err(ConsumeError::ChainRestarted { .. }) => "failed: chain restarted",
        Err(ConsumeError::Position(_)) => "failed: position",
        Err(_) => "failed: other",
    }
}

#[derive(Clone, Copy)]
enum Action {
    /// Let the actor at this position through its gate.
    Step(usize),
    /// Start consuming the batch in hand at this position.
    Start(usize),
}

/// Runs one hop schedule with every decision taken from `chooser`, then checks what
/// `check` checks; an `Err` names what broke (or the livelock) and the schedule.
pub fn run_hop_schedule(chooser: &mut dyn Chooser, config: &HopConfig) -> Result<HopOutcome, String> {
    assert!(
        config.batch == 1 || (config.events_fifo && config.shipments_fifo),
        "batches of more than one message run concurrently on a standard queue, where one actor's gates cannot"
    );
    let mut world = World::new(config);
    let mut counts = HopCounts {
        schedules: 1,
        ..HopCounts::default()
    };
    let mut trace: Vec<String> = Vec::new();
    let fail = |trace: &[String], what: String| format!("{what}\nschedule:\n  {}", trace.join("\n  "));
    let began = world.clock.now();
    let mut hand: Vec<(Hop, Vec<Delivery>)> = Vec::new();
    let mut actors: Vec<Actor> = Vec::new();
    let mut faults = 0;
    let (mut last, mut preemptions): (Option<ActorId>, usize) = (None, 0);
    loop {
        counts.steps += 1;
        if counts.steps > config.max_steps {
            return Err(fail(
                &trace,
                format!("liveness: no quiescence after {} steps", config.max_steps),
            ));
        }
        for hop in [Hop::Shipping, Hop::Billing] {
            let standard = !world.queue(hop).config().fifo;
            for batch in world.receive(hop) {
                for delivery in &batch {
                    counts.redeliveries += usize::from(delivery.receive_count > 1);
                    counts.most_receives = counts.most_receives.max(delivery.receive_count);
                    // A standard queue delivers at least once: a message may also come
                    // as a second copy, with no failure anywhere.
                    if standard && faults < config.fault_budget && chooser.fault(1) == 1 {
                        faults += 1;
                        *counts.faults.entry("Receive Duplicate".into()).or_default() += 1;
                        trace.push(format!("{} delivered twice: {}", hop.consumer(), place(delivery)));
                        world
                            .queue(hop)
                            .send(SendRequest {
                                body: delivery.body.clone(),
                                attributes: delivery.attributes.clone(),
                                delay: Duration::ZERO,
                                group_id: None,
                                deduplication_id: None,
                            })
                            .expect("a standard queue takes a copy");
                    }
                }
                counts.batches_of_many += usize::from(batch.len() > 1);
                hand.push((hop, batch));
            }
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
        let consuming = actors.iter().filter(|actor| actor.batch.is_some()).count();
        if consuming < config.max_in_flight {
            options.extend((0..hand.len()).map(Action::Start));
        }
        if options.is_empty() {
            // Only a copy sent back with a delay (a waiting message, a reminder) can
            // still come: the clock moves on to it.
            let next = [&world.events, &world.shipments]
                .into_iter()
                .filter_map(|queue| queue.next_visible_at())
                .filter(|at| *at < world.clock.now().plus(IN_HAND / 2))
                .min();
            match next {
                Some(at) => {
                    world.clock.set(at);
                    trace.push(format!("t+{}s", at.since(began).as_secs()));
                    continue;
                }
                None => break,
            }
        }
        // The actor that moved last, where it can move on.
        let current = last.and_then(|last| {
            options
                .iter()
                .position(|option| matches!(option, Action::Step(at) if actors[*at].id == last))
        });
        if let (Some(current), Some(bound)) = (current, config.max_preemptions) {
            if preemptions >= bound {
                options = vec![options[current]];
            }
        }
        let choice = if options.len() == 1 {
            0
        } else {
            chooser.pick(options.len())
        };
        if current.is_some_and(|current| current != choice) && options.len() > 1 {
            preemptions += 1;
        }
        let position = match options[choice] {
            Action::Start(index) => {
                let (hop, batch) = hand.remove(index);
                let mut actor = world.consumer(hop, batch);
                let (_, deliveries) = actor.batch.as_ref().expect("a batch's");
                let places: Vec<&str> = deliveries.iter().map(|(_, place)| place.as_str()).collect();
                trace.push(format!("#{} {} takes {}", actor.id, hop.consumer(), places.join(", ")));
                if poll(&mut actor).is_ready() {
                    return Err(fail(&trace, "a batch ended before its first operation".into()));
                }
                last = Some(actor.id);
                actors.push(actor);
                continue;
            }
            Action::Step(position) => position,
        };
        let actor_id = actors[position].id;
        last = Some(actor_id);
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
        if fault != Fault::None {
            *counts.faults.entry(format!("{op:?} {fault:?}")).or_default() += 1;
        }
        trace.push(format!(
            "#{actor_id}: {op:?}{}",
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
                if let Some((hop, deliveries)) = actor.batch {
                    for (receipt, place) in deliveries {
                        *counts
                            .outcomes
                            .entry(format!("{} crashed", hop.consumer()))
                            .or_default() += 1;
                        trace.push(format!("    {place}: crashed, not acknowledged"));
                        world.queue(hop).change_visibility(&receipt, Duration::ZERO);
                    }
                }
            }
            Poll::Pending => {}
            Poll::Ready(End::Batch(report)) => {
                let actor = actors.swap_remove(position);
                let (hop, deliveries) = actor.batch.expect("a batch's");
                for ((receipt, place), item) in deliveries.into_iter().zip(report.items) {
                    let name = outcome_name(&item.result);
                    *counts.outcomes.entry(format!("{} {name}", hop.consumer())).or_default() += 1;
                    trace.push(format!("    {place}: {name}"));
                    if item.result.is_ok() {
                        world.queue(hop).delete(&receipt);
                    } else {
                        world.queue(hop).change_visibility(&receipt, Duration::ZERO);
                    }
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
    counts.left_to_expire = check(&world).map_err(|violation| fail(&trace, violation))?;
    Ok(HopOutcome { faults, counts, trace })
}

/// Reads `name`'s item whole.
fn read(world: &World, name: &str) -> Result<KeyRead, String> {
    let item = key(name);
    world
        .backend
        .store
        .get_keys(std::slice::from_ref(&item))
        .now_or_never()
        .expect("the embedded store answers at once")
        .map_err(|error| error.to_string())
        .map(|mut reads| reads.remove(&item).unwrap_or_default())
}

/// The hop world's invariant, after the queues went quiet (see the module's
/// documentation).
fn check(world: &World) -> Result<usize, String> {
    let fail = |detail: String| Err(format!("order through the hop violated: {detail}"));
    for (name, queue) in [(EVENTS, &world.events), (SHIPMENTS, &world.shipments)] {
        let dead = queue.dead_letter_queue().map_or(0, |dead| dead.len());
        if dead > 0 {
            return fail(format!(
                "{dead} message(s) of {name} moved to its dead-letter queue: {:?}",
                queue.dead_letter_queue().map(|dead| dead.bodies()).unwrap_or_default()
            ));
        }
        if !queue.is_empty() {
            return fail(format!(
                "liveness: {} message(s) left on {name} (waiting, or never acknowledged)",
                queue.len()
            ));
        }
    }
    let shipment = read(world, SHIPMENT)?;
    let shipped: Vec<Value> = shipment
        .item
        .as_ref()
        .and_then(|item| item.data["seqs"].as_array().cloned())
        .unwrap_or_default();
    if shipped != [json!(1), json!(2)] {
        return fail(format!(
            "shipping applied the events {shipped:?}, not [1, 2] (each once, in chain order)"
        ));
    }
    // What shipments received, each message once (by its id), in first-send order.
    let mut seen = BTreeSet::new();
    let mut firsts: Vec<(Position, Value)> = Vec::new();
    for sent in world.shipments.sent() {
        let id = sent
            .request
            .attributes
            .get(MESSAGE_ID_ATTRIBUTE)
            .cloned()
            .unwrap_or_default();
        if !seen.insert(id.clone()) {
            continue;
        }
        let body: Value = serde_json::from_str(&sent.request.body).map_err(|error| error.to_string())?;
        let position = match Position::from_attributes(&sent.request.attributes) {
            Ok(Some(position)) => position,
            other => {
                return fail(format!(
                    "shipping's message {id} ({body}) went out without its place: {other:?}"
                ))
            }
        };
        firsts.push((position, body));
    }
    let mut by_seq: Vec<(u64, Value)> = firsts
        .iter()
        .map(|(position, body)| (position.seq, body["event"].clone()))
        .collect();
    let in_send_order: Vec<u64> = by_seq.iter().map(|(seq, _)| *seq).collect();
    by_seq.sort_by_key(|(seq, _)| *seq);
    let expected = [(1, json!(1)), (2, json!(2))];
    if by_seq != expected {
        return fail(format!(
            "shipments received (seq, event followed) {by_seq:?}, not {expected:?}: one message per event, each placed after the event before it"
        ));
    }
    if let Some((position, _)) = firsts
        .iter()
        .find(|(position, _)| position.entity.as_str() != SHIPMENT || position.chain.as_str() != SHIPMENTS)
    {
        return fail(format!(
            "shipping's message placed on {} of {}, not on {SHIPMENT} of {SHIPMENTS}",
            position.entity, position.chain
        ));
    }
    if world.config.shipments_fifo && in_send_order != [1, 2] {
        return fail(format!(
            "the FIFO queue shipments first received seq {in_send_order:?}, not [1, 2]"
        ));
    }
    let invoice = read(world, INVOICE)?;
    let billed: Vec<Value> = invoice
        .item
        .as_ref()
        .and_then(|item| item.data["applied"].as_array().cloned())
        .unwrap_or_default();
    let expected = [json!([1, 1]), json!([2, 2])];
    if billed != expected {
        return fail(format!(
            "billing applied (seq, event) {billed:?}, not {expected:?} (each once, in chain order, in the first hop's order)"
        ));
    }
    let position = firsts[0].0.clone();
    let billed_at = held(
        world,
        BILLING,
        &position,
        world.config.billing_entity.then_some(&invoice),
    )?;
    if billed_at != Some(2) {
        return fail(format!("billing's position on {SHIPMENT} is {billed_at:?}, not 2"));
    }
    let order = hop_produced(world.config.events_fifo)
        .first()
        .and_then(|request| Position::from_attributes(&request.attributes).ok().flatten())
        .ok_or("the producer's first message carries no place")?;
    let shipped_at = held(
        world,
        SHIPPING,
        &order,
        world.config.shipping_entity.then_some(&shipment),
    )?;
    if shipped_at != Some(2) {
        return fail(format!("shipping's position on {ORDER} is {shipped_at:?}, not 2"));
    }
    // A kept message whose removal failed is left to its expiry: read again it is a
    // duplicate. One above its consumer's position would be stranded.
    let mut left = 0;
    for (consumer, position, at) in [(SHIPPING, &order, shipped_at), (BILLING, &position, billed_at)] {
        for seq in 1..=3 {
            let kept_at = Position {
                seq,
                ..position.clone()
            };
            for kept in kept_keys(consumer, &kept_at, true) {
                let found = world
                    .backend
                    .store
                    .get_kept(&kept)
                    .now_or_never()
                    .expect("the embedded store answers at once")
                    .map_err(|error| error.to_string())?;
                match found {
                    Some(_) if Some(seq) > at => {
                        return fail(format!(
                            "{consumer} left a kept message above its position {at:?} behind: {kept}"
                        ))
                    }
                    Some(found) if found.expires_at > world.clock.now().plus(RETENTION) => {
                        return fail(format!("{consumer}'s kept message {kept} outlives its retention"))
                    }
                    Some(_) => left += 1,
                    None => {}
                }
            }
        }
    }
    Ok(left)
}

/// Where `consumer` holds its position on `position`'s chain and entity: in `entity`'s
/// key (entity mode), else in its position item.
fn held(world: &World, consumer: &str, position: &Position, entity: Option<&KeyRead>) -> Result<Option<u64>, String> {
    if let Some(read) = entity {
        return Ok(read.applied.get(&applied_name(consumer, position)).map(|held| held.seq));
    }
    let at = position_key(consumer, position);
    Ok(world
        .backend
        .store
        .get_items(std::slice::from_ref(&at))
        .now_or_never()
        .expect("the embedded store answers at once")
        .map_err(|error| error.to_string())?
        .remove(&at)
        .and_then(|item| item.data["applied"].as_u64()))
}
