//! The dispatch lag on a virtual clock: how long after its commit is acknowledged a
//! transaction's message is on its destination queue, for several configurations of the
//! protocol (docs/PROTOCOL.md sections 3 and 4; docs/HOW_IT_WORKS.md "Settling in the request path").
//!
//! Everything runs the real code over the embedded backend: the request path
//! ([`Outbox`]: begin with its control message sent beside the read
//! (`Transaction::send_control`), as a handler that will write for sure does, then commit, and with inline publishing its publish and mark) and the
//! control path ([`ControlPath`] behind [`outbox::control::poller::acknowledge`], as the local
//! poller runs it). Every port call takes a modelled AWS latency in virtual time
//! ([`ports`]), and a discrete-event executor ([`executor`]) interleaves the requests
//! and the workers in time order, so that a control message with a 0 s delay really
//! meets a request that is still committing and is deferred.
//!
//! The model:
//!
//! - Requests arrive as a Poisson process, each creating one new item and emitting one
//!   event to a standard queue (no conflicts, no faults).
//! - The event source mapping: a control message that becomes visible is handed to an
//!   invocation [`model::Latencies::receive_ms`] later (a long poll returning; batching
//!   window 0), together with whatever else is visible then (up to 10); `workers`
//!   pollers invoke concurrently.
//! - The lag of a transaction: the `sent_at` of its message on the destination queue
//!   (when the queue accepted it) less the instant the request path heard its
//!   `TransactWriteItems` succeed. A write takes effect [`model::Latencies::reply_ms`]
//!   before its caller hears so, so a worker can, rarely, publish a hair before the
//!   acknowledgement: a lag of -1 ms.
//!
//! # Layout
//!
//! - [`executor`]: the virtual-time executor, its sleeps, and the workers' wake-up signal.
//! - [`model`]: the latencies, the load, the command line.
//! - [`ports`]: the slowed ports and what they observe.
//! - [`report`]: percentiles, the table and the JSON.

pub mod executor;
pub mod model;
pub mod ports;
pub mod report;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::control::lease::LEASE;
use outbox::control::poller::{acknowledge, MAX_BATCH};
use outbox::control::{ControlPath, ControlPorts};
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::ports::{Clock, ControlInbox, ControlQueue, ExpectedVersion, IdSource, ItemKey, Publisher, Store};
use outbox::protocol::{DestinationName, Message, TxnId, TXN_ID_ATTRIBUTE};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use serde_json::json;

use self::executor::{join2, Task, VirtualTime};
use self::model::{Call, Config, Draws};
use self::ports::{CrashingPublisher, Env, SimControlQueue, SimPublisher, SimStore};
use self::report::Outcome;

/// One configuration of the protocol to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Its name in the table and the JSON.
    pub name: String,
    /// The first control message's delay.
    pub first_check_delay: Duration,
    /// Whether the request path publishes and marks before answering.
    pub inline: bool,
    /// Share of requests whose API process crashes just after the commit.
    pub crash_fraction: f64,
    /// Entity mode: each request changes an existing item of its own
    /// (`Outbox::begin_entity`), so that its commit is one conditional write carrying its
    /// entry, and the worker reads the item, publishes, records and removes the entry.
    pub entity: bool,
}

/// The configurations compared: inline publishing off with first check delays 0, 1 and
/// 5 s; on (first check 1 s); and on with `config.crash_fraction` of the requests
/// crashing after their commit, which leaves their messages to the first check.
pub fn scenarios(config: &Config) -> Vec<Scenario> {
    let off = |seconds: u64| Scenario {
        name: format!("inline off, first check {seconds} s"),
        first_check_delay: Duration::from_secs(seconds),
        inline: false,
        crash_fraction: 0.0,
        entity: false,
    };
    vec![
        off(0),
        off(1),
        off(5),
        Scenario {
            name: "entity mode, inline off, first check 1 s".into(),
            entity: true,
            ..off(1)
        },
        Scenario {
            name: "inline on, first check 1 s".into(),
            first_check_delay: Duration::from_secs(1),
            inline: true,
            crash_fraction: 0.0,
            entity: false,
        },
        Scenario {
            name: format!(
                "inline on, {}% crash after commit",
                report::trim_float(config.crash_fraction * 100.0)
            ),
            first_check_delay: Duration::from_secs(1),
            inline: true,
            crash_fraction: config.crash_fraction,
            entity: false,
        },
    ]
}

/// Runs every configuration.
pub fn run(config: &Config) -> Vec<Outcome> {
    scenarios(config)
        .into_iter()
        .map(|scenario| simulate(config, scenario))
        .collect()
}

/// Transaction ids in order, so that a run repeats exactly.
struct SeqIds(AtomicU64);

impl IdSource for SeqIds {
    fn next_txn_id(&self, now: Timestamp) -> TxnId {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let mut random = [0u8; 10];
        random[2..].copy_from_slice(&n.to_be_bytes());
        TxnId::from_parts(now, random)
    }
}

/// What the tasks of one run count.
#[derive(Debug, Default)]
struct Tally {
    /// Requests whose transaction failed (none are expected).
    failed: usize,
    /// Commits by their inline dispatch result.
    inline: BTreeMap<&'static str, usize>,
    /// Worker invocations (batches).
    invocations: usize,
    /// Their handling time summed (receive to acknowledgement), in virtual milliseconds:
    /// what a Lambda worker is billed for.
    handling_ms: u64,
    /// Control messages handled, by outcome.
    outcomes: BTreeMap<&'static str, usize>,
    /// Control messages whose handling failed.
    control_errors: usize,
}

const START: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// Simulates `config.transactions` requests and the workers under `scenario`.
pub fn simulate(config: &Config, scenario: Scenario) -> Outcome {
    let clock = Arc::new(ManualClock::new(START));
    let time = VirtualTime::new(clock.clone());
    let env = Env::new(time.clone(), Draws::new(config.latencies.clone(), config.seed));
    let events: DestinationName = "events".parse().expect("a valid destination name");
    let backend = EmbeddedBackend::new(clock.clone(), [(events.clone(), false)]);
    if scenario.entity {
        seed(&backend, clock.now(), config.transactions);
    }
    backend.record();
    let store: Arc<dyn Store> = Arc::new(SimStore {
        inner: backend.store.clone(),
        env: env.clone(),
    });
    let control_queue: Arc<dyn ControlQueue> = Arc::new(SimControlQueue {
        inner: backend.control_queue.clone(),
        env: env.clone(),
    });
    let publisher: Arc<dyn Publisher> = Arc::new(SimPublisher {
        inner: backend.publisher.clone(),
        env: env.clone(),
    });
    let timing = Timing {
        first_check_delay: scenario.first_check_delay,
        ..Timing::default()
    };
    let clock_port: Arc<dyn Clock> = clock.clone();
    let outbox = Outbox::new(
        RequestPorts {
            store: store.clone(),
            control_queue: control_queue.clone(),
            clock: clock_port.clone(),
            ids: Arc::new(SeqIds(AtomicU64::new(1))),
        },
        timing,
        TransactionLimits::default(),
    );
    let control = ControlPath::new(
        ControlPorts {
            store,
            control_queue,
            publisher: publisher.clone(),
            clock: clock_port,
        },
        timing,
    );

    let tally = Rc::new(RefCell::new(Tally::default()));
    let mut tasks: Vec<Task> = Vec::new();

    // The requests: Poisson arrivals, a share of them crashing after their commit.
    let mut rng = fastrand::Rng::with_seed(config.seed ^ 0x5eed_a771_7a15);
    let mut at_ms = 0.0;
    for index in 0..config.transactions {
        at_ms += -(1.0 - rng.f64()).ln() / config.rate * 1000.0;
        let arrival = START.plus(Duration::from_millis(at_ms.round() as u64));
        let crashes = rng.f64() < scenario.crash_fraction;
        let outbox = if crashes {
            outbox
                .clone()
                .with_inline_publisher(Arc::new(CrashingPublisher { env: env.clone() }))
        } else if scenario.inline {
            outbox.clone().with_inline_publisher(publisher.clone())
        } else {
            outbox.clone()
        };
        let (time, tally, events) = (time.clone(), tally.clone(), events.clone());
        let entity = scenario.entity;
        tasks.push(Box::pin(async move {
            time.sleep_until(arrival).await;
            if let Err(error) = request(&outbox, index, events, entity, &tally).await {
                eprintln!("dispatch-lag-sim: request {index} failed: {error}");
                tally.borrow_mut().failed += 1;
            }
        }));
    }

    // The event source mapping's pollers: one of them at a time waits for a visible
    // message's invocation; the others wait for a message or for that one to take it.
    let claimed = Rc::new(Cell::new(false));
    for _ in 0..config.workers {
        let (env, time, tally, claimed) = (env.clone(), time.clone(), tally.clone(), claimed.clone());
        let (inbox, control) = (backend.control_queue.clone(), control.clone());
        tasks.push(Box::pin(async move {
            let queue = inbox.queue().clone();
            loop {
                let seen = env.signal.generation();
                if queue.has_visible() && !claimed.get() {
                    claimed.set(true);
                    time.sleep(env.draws.latency(Call::Receive)).await;
                    let deliveries = inbox.receive(MAX_BATCH, Duration::ZERO, LEASE).await;
                    claimed.set(false);
                    env.signal.notify();
                    let deliveries = deliveries.expect("the embedded queue receives");
                    if deliveries.is_empty() {
                        continue;
                    }
                    // The poller's handling and acknowledgement; its lease renewal keeps
                    // tokio's time, not this virtual clock, and a batch here never
                    // outlasts a lease.
                    let started = time.now();
                    let report = control.handle_batch(&deliveries).await;
                    let report = acknowledge(inbox.as_ref(), &deliveries, report, control.clock())
                        .await
                        .expect("the embedded queue acknowledges");
                    let mut tally = tally.borrow_mut();
                    tally.invocations += 1;
                    tally.handling_ms += time.now().since(started).as_millis() as u64;
                    for item in &report.items {
                        match &item.result {
                            Ok(outcome) => *tally.outcomes.entry(outcome.as_str()).or_default() += 1,
                            Err(_) => tally.control_errors += 1,
                        }
                    }
                    drop(tally);
                    env.signal.notify();
                    continue;
                }
                let deadline = queue.next_visible_at().map(|at| time.sleep_until(at));
                env.signal.wait(seen, deadline).await;
            }
        }));
    }

    executor::run(&time, tasks);

    let observed = env.snapshot();
    let mut first_sent: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut duplicates = 0;
    let destination = backend.publisher.queue(&events).expect("the events queue");
    for sent in destination.sent().into_iter().filter(|sent| !sent.deduplicated) {
        let txn = sent
            .request
            .attributes
            .get(TXN_ID_ATTRIBUTE)
            .cloned()
            .unwrap_or_default();
        match first_sent.get(&txn) {
            Some(_) => duplicates += 1,
            None => {
                first_sent.insert(txn, sent.sent_at);
            }
        }
    }
    let mut lags_ms = Vec::with_capacity(observed.acks.len());
    let mut unpublished = 0;
    for (txn_id, acked_at) in &observed.acks {
        match first_sent.get(&txn_id.to_string()) {
            Some(sent_at) => lags_ms.push(sent_at.as_millis() as i64 - acked_at.as_millis() as i64),
            None => unpublished += 1,
        }
    }
    let tally = tally.borrow();
    let outcome = |name: &str| tally.outcomes.get(name).copied().unwrap_or(0);
    Outcome {
        committed: observed.acks.len(),
        failed: tally.failed,
        lags_ms,
        unpublished,
        duplicates,
        control_messages: backend.control_queue.queue().sent().len(),
        deferrals: outcome("deferred"),
        checks: tally.outcomes.values().sum::<usize>() + tally.control_errors,
        worker_dispatches: outcome("dispatched"),
        inline_dispatches: tally.inline.get("dispatched").copied().unwrap_or(0),
        crashed: observed.crashed.len(),
        tombstones: outcome("tombstoned"),
        invocations: tally.invocations,
        handling_ms: tally.handling_ms,
        control_errors: tally.control_errors,
        left_in_control_queue: backend.control_queue.queue().len(),
        scenario,
    }
}

/// Writes items `0..count` (no latency, no control message): the items entity-mode
/// requests change.
fn seed(backend: &EmbeddedBackend, now: Timestamp, count: usize) {
    use futures_util::FutureExt;
    use outbox::ports::{BusinessWrite, CommitRequest};
    use outbox::protocol::OutboxRecord;
    let ids = SeqIds(AtomicU64::new(u64::MAX / 2));
    for index in 0..count {
        let txn_id = ids.next_txn_id(now);
        let request = CommitRequest {
            txn_id,
            writes: vec![BusinessWrite::Put {
                key: order_key(index),
                data: json!({ "order": index }),
                expected: ExpectedVersion::Absent,
            }],
            outbox: OutboxRecord::committed(txn_id, Vec::new(), now, now.plus(Duration::from_secs(3600))),
            idempotency: None,
        };
        backend
            .store
            .commit(&request)
            .now_or_never()
            .expect("the embedded store answers at once")
            .expect("a new item");
    }
}

fn order_key(index: usize) -> ItemKey {
    format!("ORDER#{index:06}").parse().expect("a valid key")
}

/// One request: begin and the control send overlapped with the read, as a handler that
/// will write for sure does; one new item (in entity mode, a change to an existing one, begun naming it); one
/// event; commit (with inline publishing, publish and mark).
async fn request(
    outbox: &Outbox,
    index: usize,
    events: DestinationName,
    entity: bool,
    tally: &RefCell<Tally>,
) -> Result<(), Box<dyn std::error::Error>> {
    let key = order_key(index);
    let begin = async {
        let txn = if entity {
            outbox.begin_entity(key.clone()).await?
        } else {
            outbox.begin().await?
        };
        txn.send_control().await?;
        Ok::<_, outbox::request::TxnError>(txn)
    };
    let (txn, items) = join2(begin, outbox.store().get_items(std::slice::from_ref(&key))).await;
    let (mut txn, items) = (txn?, items?);
    let expected = match items.get(&key) {
        Some(item) => ExpectedVersion::Exactly(item.version),
        None => ExpectedVersion::Absent,
    };
    txn.put(key, json!({ "order": index }), expected);
    txn.emit(Message::json(
        events,
        &json!({ "type": "OrderPlaced", "order": index }),
    )?);
    let committed = txn.commit().await?;
    *tally.borrow_mut().inline.entry(committed.inline.as_str()).or_default() += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Config {
        Config {
            transactions: 100,
            ..Config::default()
        }
    }

    fn scenario(config: &Config, name_start: &str) -> Scenario {
        scenarios(config)
            .into_iter()
            .find(|scenario| scenario.name.starts_with(name_start))
            .expect("a scenario")
    }

    #[test]
    fn every_commit_is_published_once_and_the_lag_follows_the_first_check_delay() {
        let config = small();
        let off = simulate(&config, scenario(&config, "inline off, first check 1 s"));
        assert_eq!(
            (off.committed, off.failed, off.unpublished, off.duplicates),
            (100, 0, 0, 0)
        );
        assert_eq!(off.left_in_control_queue, 0);
        assert_eq!(off.worker_dispatches, 100);
        let summary = off.summary();
        assert!(summary.p50 > 900 && summary.p50 < 1100, "{summary:?}");

        let inline = simulate(&config, scenario(&config, "inline on, first check 1 s"));
        assert_eq!((inline.committed, inline.unpublished, inline.duplicates), (100, 0, 0));
        assert_eq!(inline.inline_dispatches, 100);
        assert_eq!(inline.worker_dispatches, 0);
        assert!(inline.summary().max < 20, "{:?}", inline.summary());
    }

    #[test]
    fn a_first_check_without_delay_defers_requests_still_running() {
        let config = small();
        let zero = simulate(&config, scenario(&config, "inline off, first check 0 s"));
        assert_eq!((zero.committed, zero.unpublished), (100, 0));
        assert!(zero.deferrals > 0, "{zero:?}");
        assert!(zero.control_messages > 100);
    }

    #[test]
    fn a_crash_after_commit_falls_back_to_the_first_check() {
        let config = Config {
            crash_fraction: 0.2,
            ..small()
        };
        let crash = simulate(&config, scenario(&config, "inline on, 20%"));
        assert!(crash.crashed > 0);
        assert_eq!((crash.committed, crash.unpublished), (100, 0));
        assert_eq!(crash.worker_dispatches, crash.crashed);
        assert!(crash.summary().max >= 900, "{:?}", crash.summary());
    }
}
