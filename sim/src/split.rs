//! Split outbox records (a main item and parts) in the simulation: the real [`DynamoStore`] reading
//! and marking them while others do the same, through the real SDK client, over an
//! in-process DynamoDB double that answers the wire protocol (`BatchGetItem`,
//! `BatchWriteItem`; `TransactWriteItems` to commit the records first).
//!
//! Every `BatchGetItem` and `BatchWriteItem` is a gate: the scheduler picks which actor's
//! call goes next, so a reader's read of main items and its read of their parts can fall
//! on either side of a marker's writes. A `BatchWriteItem` may meet a fault: the first of
//! its requests left unprocessed (DynamoDB's partial batch), refused (a 500), or the
//! marker crashing before or after it. After every step a consistent read checks that no
//! main item names a part that is missing; at the end, each reader's and each marker's
//! answers are checked against what the table holds.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, IdentityCache, Region, StalledStreamProtectionConfig};
use aws_smithy_runtime_api::client::http::{http_client_fn, HttpConnector, HttpConnectorFuture, SharedHttpConnector};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::RetryConfig;
use outbox::aws::DynamoStore;
use outbox::embedded::ManualClock;
use outbox::ports::{Clock, CommitRequest, OutboxReads, Store, StoreError};
use outbox::protocol::{Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::ports::GatedClock;

pub(super) const TABLE: &str = "outbox";

/// Message bytes per item: small, so that records split without megabytes per schedule
/// (the store's threshold is 350 KB; only the figure differs).
pub(super) const PART_BYTES: usize = 1_000;

/// The table: items in DynamoDB's JSON, by partition key.
pub(super) type Table = BTreeMap<String, Value>;
type Items = Arc<Mutex<Table>>;

/// What the double saw, for the counts a run prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitCounts {
    /// Reads of parts that found a part missing (a torn read, read again).
    pub torn_reads: usize,
    /// `BatchWriteItem` calls answered with a request left unprocessed.
    pub partial_batches: usize,
    /// Marks that reported a record failed because DynamoDB kept its write unprocessed
    /// through every retry.
    pub exhausted: usize,
    /// `BatchWriteItem` calls refused.
    pub refused_batches: usize,
    /// Markers that crashed inside a mark.
    pub crashed_markers: usize,
    /// Parts left behind by a mark (no longer named; they expire).
    pub orphaned_parts: usize,
}

impl SplitCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &SplitCounts) {
        self.torn_reads += other.torn_reads;
        self.partial_batches += other.partial_batches;
        self.exhausted += other.exhausted;
        self.refused_batches += other.refused_batches;
        self.crashed_markers += other.crashed_markers;
        self.orphaned_parts += other.orphaned_parts;
    }
}

/// What one marker's `BatchWriteItem` calls met: the main items (puts) left unprocessed,
/// and whether a call that carried puts was refused.
#[derive(Debug, Default)]
struct MarkerFaults {
    unprocessed_puts: BTreeSet<String>,
    refused_puts: bool,
}

/// The DynamoDB double, as one actor's (or the checker's, ungated) connection.
#[derive(Debug, Clone)]
struct Double {
    items: Items,
    gate: Option<Gate>,
    counts: Arc<Mutex<SplitCounts>>,
    marker_faults: Arc<Mutex<BTreeMap<ActorId, MarkerFaults>>>,
}

fn pk_of(key_or_item: &Value) -> String {
    key_or_item["pk"]["S"]
        .as_str()
        .expect("items are keyed by pk")
        .to_owned()
}

pub(super) fn answer(status: u16, body: Value) -> HttpResponse {
    let mut response = HttpResponse::new(
        status.try_into().expect("a valid status"),
        SdkBody::from(body.to_string()),
    );
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    response
}

impl Double {
    fn batch_get(&self, body: &Value) -> Value {
        let items = self.items.lock().expect("items");
        let mut found = Vec::new();
        for key in body["RequestItems"][TABLE]["Keys"].as_array().expect("keys") {
            let pk = pk_of(key);
            match items.get(&pk) {
                Some(item) => found.push(item.clone()),
                None if self.gate.is_some() && pk.contains("#PART#") => {
                    self.counts.lock().expect("counts").torn_reads += 1;
                }
                None => {}
            }
        }
        json!({ "Responses": { TABLE: found }, "UnprocessedKeys": {} })
    }

    /// Applies `requests` but those left `unprocessed`.
    fn batch_write(&self, requests: &[Value], unprocessed: usize) -> Value {
        let mut items = self.items.lock().expect("items");
        for request in &requests[unprocessed..] {
            if let Some(item) = request.get("PutRequest") {
                items.insert(pk_of(&item["Item"]), item["Item"].clone());
            } else {
                items.remove(&pk_of(&request["DeleteRequest"]["Key"]));
            }
        }
        json!({ "UnprocessedItems": if unprocessed == 0 { json!({}) } else { json!({ TABLE: requests[..unprocessed] }) } })
    }

    /// The puts of a commit (conditions are not evaluated: records are committed once,
    /// before the actors start).
    fn transact(&self, body: &Value) -> Value {
        let mut items = self.items.lock().expect("items");
        for action in body["TransactItems"].as_array().expect("actions") {
            if let Some(put) = action.get("Put") {
                items.insert(pk_of(&put["Item"]), put["Item"].clone());
            }
        }
        json!({})
    }

    async fn handle(self, target: String, body: Value) -> HttpResponse {
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        match operation.as_str() {
            "BatchGetItem" => {
                if let Some(gate) = &self.gate {
                    gate.pass(Op::Read).await;
                }
                answer(200, self.batch_get(&body))
            }
            "BatchWriteItem" => {
                let requests = body["RequestItems"][TABLE].as_array().expect("requests").clone();
                let Some(gate) = self.gate.clone() else {
                    return answer(200, self.batch_write(&requests, 0));
                };
                let fault = gate.pass(Op::Mark).await;
                let puts: Vec<String> = requests
                    .iter()
                    .filter_map(|request| request.get("PutRequest").map(|put| pk_of(&put["Item"])))
                    .collect();
                let note = |update: &dyn Fn(&mut MarkerFaults)| {
                    let mut faults = self.marker_faults.lock().expect("faults");
                    update(faults.entry(gate.actor()).or_default());
                };
                match fault {
                    Fault::FirstEntryFails => {
                        self.counts.lock().expect("counts").partial_batches += 1;
                        if let Some(first) = puts.first() {
                            note(&|faults| {
                                faults.unprocessed_puts.insert(first.clone());
                            });
                        }
                        answer(200, self.batch_write(&requests, 1))
                    }
                    Fault::Fail => {
                        self.counts.lock().expect("counts").refused_batches += 1;
                        if !puts.is_empty() {
                            note(&|faults| faults.refused_puts = true);
                        }
                        answer(
                            500,
                            json!({ "__type": "com.amazonaws.dynamodb.v20120810#InternalServerError", "message": "injected" }),
                        )
                    }
                    Fault::CrashBefore => gate.crash().await,
                    Fault::CrashAfter => {
                        self.batch_write(&requests, 0);
                        gate.crash().await
                    }
                    _ => answer(200, self.batch_write(&requests, 0)),
                }
            }
            "TransactWriteItems" => answer(200, self.transact(&body)),
            other => answer(
                400,
                json!({ "__type": "com.amazonaws.dynamodb.v20120810#ValidationException", "message": format!("the double does not answer {other}") }),
            ),
        }
    }
}

impl HttpConnector for Double {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request.headers().get("x-amz-target").unwrap_or_default().to_owned();
        let body: Value = request
            .body()
            .bytes()
            .and_then(|bytes| serde_json::from_slice(bytes).ok())
            .unwrap_or_default();
        let double = self.clone();
        HttpConnectorFuture::new(async move { Ok(double.handle(target, body).await) })
    }
}

/// A [`DynamoStore`] whose client talks to `double`, with the SDK's retries off (the
/// store retries unprocessed items itself, through `clock`).
fn store(double: Double, clock: Arc<dyn Clock>) -> DynamoStore {
    store_over(double, clock)
}

/// A [`DynamoStore`] whose client talks to `connector` (a double of DynamoDB's wire
/// protocol), with the SDK's retries off, splitting records at [`PART_BYTES`].
pub(super) fn store_over(connector: impl HttpConnector + Clone + 'static, clock: Arc<dyn Clock>) -> DynamoStore {
    let client = http_client_fn(move |_, _| SharedHttpConnector::new(connector.clone()));
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("sim", "sim", None, None, "sim"))
        .identity_cache(IdentityCache::no_cache())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .retry_config(RetryConfig::disabled())
        .endpoint_url("http://dynamodb.sim")
        .http_client(client)
        .build();
    DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), TABLE, clock).with_part_bytes(PART_BYTES)
}

/// What one split-records schedule contains.
#[derive(Debug, Clone)]
pub struct SplitConfig {
    /// Markers marking every record at once (the worker's and the inline path's).
    pub markers: usize,
    /// Readers reading every record twice.
    pub readers: usize,
    /// Most faults injected in one schedule.
    pub fault_budget: usize,
    /// The faults a `BatchWriteItem` may meet.
    pub faults: Vec<Fault>,
}

/// What a split-records schedule did.
#[derive(Debug)]
pub struct SplitOutcome {
    /// Scheduler steps taken.
    pub steps: usize,
    /// Faults injected.
    pub faults: usize,
    /// What the double saw.
    pub counts: SplitCounts,
}

enum Role {
    Reader,
    Marker,
}

enum Done {
    Read(Vec<OutboxReads>),
    Marked(Vec<Result<(), StoreError>>),
}

struct Actor {
    id: ActorId,
    role: Role,
    future: Pin<Box<dyn Future<Output = Done>>>,
}

fn poll(actor: &mut Actor) -> Poll<Done> {
    actor.future.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls `future` to its end: the checker's calls never park.
pub(super) fn now_or_never<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("an ungated call of the double parked"),
    }
}

/// The records every schedule starts from, committed through `store`: two split records
/// (three items and two) and, between them, a small one, all pending.
fn commit_records_once(store: &DynamoStore, now: Timestamp) -> Vec<OutboxRecord> {
    let shapes: [&[usize]; 3] = [&[400, 400, 400], &[50], &[400, 400]];
    shapes
        .iter()
        .enumerate()
        .map(|(n, sizes)| {
            let txn_id = TxnId::from_parts(now, [0, 0, 0, 0, 0, 0, 0, 0, 0, n as u8 + 1]);
            let messages: Vec<OutgoingMessage> = sizes
                .iter()
                .enumerate()
                .map(|(position, size)| {
                    let body = json!({ "n": position, "padding": "x".repeat(*size) });
                    let message = Message::json("events".parse().expect("valid"), &body).expect("serialisable");
                    OutgoingMessage::new(txn_id, position as u32, message)
                })
                .collect();
            let request = CommitRequest {
                txn_id,
                writes: vec![],
                outbox: OutboxRecord::committed(txn_id, messages, now, now.plus(Duration::from_secs(3600))),
                idempotency: None,
            };
            now_or_never(store.commit(&request)).expect("the double takes the commit");
            request.outbox
        })
        .collect()
}

/// The table after the commit of the records, and the records: committed once, through
/// the SDK, and copied into each schedule.
fn committed_table(now: Timestamp) -> &'static (Table, Vec<OutboxRecord>) {
    static TABLE_AFTER_COMMIT: OnceLock<(Table, Vec<OutboxRecord>)> = OnceLock::new();
    TABLE_AFTER_COMMIT.get_or_init(|| {
        let double = Double {
            items: Items::default(),
            gate: None,
            counts: Arc::default(),
            marker_faults: Arc::default(),
        };
        let records = commit_records_once(&store(double.clone(), Arc::new(ManualClock::new(now))), now);
        let items = double.items.lock().expect("items").clone();
        (items, records)
    })
}

/// The invariant at every moment: no main item names a part that is missing.
pub(super) fn check_whole(items: &Table) -> Result<(), String> {
    for (pk, item) in items.iter().filter(|(pk, _)| !pk.contains("#PART#")) {
        let parts: usize = item["parts"]["N"]
            .as_str()
            .map_or(Ok(1), str::parse)
            .map_err(|_| format!("{pk}: bad parts"))?;
        if let Some(missing) = (1..parts).find(|part| !items.contains_key(&format!("{pk}#PART#{part}"))) {
            return Err(format!("{pk} names part {missing}, which is missing"));
        }
    }
    Ok(())
}

/// Checks a read of the records against what was committed: each is there, whole and
/// pending as committed, or dispatched.
fn check_read(reads: &OutboxReads, committed: &[OutboxRecord], who: &str) -> Result<(), String> {
    for record in committed {
        match reads.get(&record.txn_id) {
            Some(Ok(read)) if read.state == OutboxState::Dispatched => {}
            Some(Ok(read)) if read.state == OutboxState::Pending && read.messages == record.messages => {}
            Some(Ok(read)) => {
                return Err(format!(
                    "{who} read {} as {:?}, not as committed",
                    record.txn_id, read.state
                ))
            }
            Some(Err(error)) => return Err(format!("{who} could not read {}: {error}", record.txn_id)),
            None => return Err(format!("{who} found no record of {}", record.txn_id)),
        }
    }
    Ok(())
}

/// Runs one split-records schedule to its end with every decision from `chooser`.
pub fn run_split_schedule(chooser: &mut dyn Chooser, config: &SplitConfig) -> Result<SplitOutcome, String> {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let gates = Gates::default();
    let (table, committed) = committed_table(clock.now());
    let items: Items = Arc::new(Mutex::new(table.clone()));
    let counts: Arc<Mutex<SplitCounts>> = Arc::default();
    let marker_faults: Arc<Mutex<BTreeMap<ActorId, MarkerFaults>>> = Arc::default();
    let double = |gate: Option<Gate>| Double {
        items: items.clone(),
        gate,
        counts: counts.clone(),
        marker_faults: marker_faults.clone(),
    };
    let checker = store(double(None), clock.clone());
    let ids: Vec<TxnId> = committed.iter().map(|record| record.txn_id).collect();
    let expires_at = clock.now().plus(Duration::from_secs(3600));

    let mut actors = Vec::new();
    for n in 0..config.markers + config.readers {
        let gate = gates.for_actor(n);
        let actor_clock = Arc::new(GatedClock {
            inner: clock.clone(),
            skew_millis: 0,
            gate: gate.clone(),
            timers_fire: false,
        });
        let store = store(double(Some(gate)), actor_clock);
        let (role, future): (Role, Pin<Box<dyn Future<Output = Done>>>) = if n < config.markers {
            let records = committed.clone();
            (
                Role::Marker,
                Box::pin(async move { Done::Marked(store.mark_dispatched(&records, expires_at).await) }),
            )
        } else {
            let ids = ids.clone();
            (
                Role::Reader,
                Box::pin(async move {
                    let mut reads = Vec::new();
                    for _ in 0..2 {
                        reads.push(store.get_outboxes_each(&ids).await.unwrap_or_default());
                    }
                    Done::Read(reads)
                }),
            )
        };
        actors.push(Actor { id: n, role, future });
    }
    for actor in &mut actors {
        if poll(actor).is_ready() {
            return Err(format!("actor {} finished without a call", actor.id));
        }
    }

    let (mut steps, mut faults) = (0, 0);
    let mut marked: BTreeMap<ActorId, Vec<Result<(), StoreError>>> = BTreeMap::new();
    while !actors.is_empty() {
        steps += 1;
        if steps > 500 {
            return Err("no end after 500 steps".into());
        }
        let choice = chooser.pick(actors.len());
        let actor_id = actors[choice].id;
        let op = gates
            .lock()
            .waiting
            .remove(&actor_id)
            .ok_or_else(|| format!("actor {actor_id} is neither finished nor at a gate"))?;
        let offered: &[Fault] = match op {
            Op::Mark => &config.faults,
            _ => &[],
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
        gates.lock().granted.insert(actor_id, fault);
        let polled = poll(&mut actors[choice]);
        let crashed = gates.lock().crashed.remove(&actor_id);
        match polled {
            Poll::Ready(Done::Read(reads)) => {
                for read in &reads {
                    check_read(read, committed, &format!("reader {actor_id}"))?;
                }
                actors.swap_remove(choice);
            }
            Poll::Ready(Done::Marked(results)) => {
                marked.insert(actor_id, results);
                actors.swap_remove(choice);
            }
            Poll::Pending if crashed => {
                gates.lock().waiting.remove(&actor_id);
                if let Role::Marker = actors[choice].role {
                    counts.lock().expect("counts").crashed_markers += 1;
                }
                actors.swap_remove(choice);
            }
            Poll::Pending => {}
        }
        // No main item ever names a part that is missing: a consistent read at any
        // moment finds every record whole.
        check_whole(&items.lock().expect("items")).map_err(|error| format!("after step {steps}: {error}"))?;
    }

    // What each marker was told holds: a record reported marked is dispatched, and a
    // record reported failed had its own write refused or left unprocessed, never a
    // neighbour's.
    let end = now_or_never(checker.get_outboxes_each(&ids)).map_err(|error| error.to_string())?;
    let marker_faults = marker_faults.lock().expect("faults");
    for (marker, results) in &marked {
        let met = marker_faults.get(marker);
        for (record, result) in committed.iter().zip(results) {
            let dispatched = matches!(end.get(&record.txn_id), Some(Ok(read)) if read.state == OutboxState::Dispatched);
            match result {
                Ok(()) if !dispatched => {
                    return Err(format!(
                        "marker {marker} was told {} is marked; it is not",
                        record.txn_id
                    ))
                }
                Ok(()) => {}
                Err(error) => {
                    let own = met.is_some_and(|met| {
                        met.refused_puts || met.unprocessed_puts.contains(&format!("TXN#{}", record.txn_id))
                    });
                    if !own {
                        return Err(format!(
                            "marker {marker} was told {} failed ({error}), though its write was neither refused nor left unprocessed",
                            record.txn_id
                        ));
                    }
                    if met.is_some_and(|met| !met.refused_puts) {
                        counts.lock().expect("counts").exhausted += 1;
                    }
                }
            }
        }
    }
    let mut counts = *counts.lock().expect("counts");
    counts.orphaned_parts = items
        .lock()
        .expect("items")
        .keys()
        .filter(|pk| pk.contains("#PART#"))
        .filter(|pk| {
            let txn = pk.trim_start_matches("TXN#").split('#').next().unwrap_or_default();
            ids.iter().any(|id| {
                id.to_string() == txn && matches!(end.get(id), Some(Ok(read)) if read.state == OutboxState::Dispatched)
            })
        })
        .count();
    Ok(SplitOutcome { steps, faults, counts })
}
