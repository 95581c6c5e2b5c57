//! The entity mode's fence meeting a commit of a split record, on the real DynamoDB
//! adapter: the request path and the control path as shipped, with the real
//! [`DynamoStore`] and SDK client, over an in-process double of DynamoDB's wire protocol
//! that evaluates the conditions the race turns on.
//!
//! A request begins transaction T in entity mode on counter K, reads K and increments it,
//! and emits messages too big for K (the double refuses the entity form's `UpdateItem`
//! with DynamoDB's item-size `ValidationException`; its item limit is
//! [`ITEM_BYTES`] rather than 400 KB, as the store splits at 1 KB rather than 350 KB), so
//! the request path falls back to the transactional form: one `TransactWriteItems` of K's
//! update (conditioned on K's version), T's main record (`attribute_not_exists`, `ALL_OLD`)
//! and its parts. Meanwhile T's control message is handled by the control path past T's
//! window (its clock ahead by the window: the commit, sent inside the window, is held on
//! its way until after), which reads K and T's record and, finding neither, fences T: one
//! `TransactWriteItems` of T's tombstone (`attribute_not_exists`, `ALL_OLD`) and K's fence
//! mark (conditioned on K holding no entry or sent mark of T and on the mark below T). Who
//! wins is the race: a fence cancelled by T's record gets back T's main item without its
//! parts, and must read the record whole before publishing it.
//!
//! Every wire call is a gate, and so is every publish: the scheduler picks whose call goes
//! next, and which fault it meets. The double answers `GetItem`, `BatchGetItem`,
//! `BatchWriteItem`, `PutItem`, `UpdateItem` and `TransactWriteItems`, evaluating every
//! condition and update expression ([`super::expression`]: an expression it cannot
//! evaluate fails the schedule), returning `ALL_OLD` items in cancellation reasons and
//! conditional check failures, honouring `ClientRequestToken` (a repeat of an applied
//! transaction is answered with success and applies nothing), and refusing items over
//! its size limit. Faults: a commit timed out with its request still on its way (a
//! *ghost* applies it at a later step the scheduler picks), a reply lost after the write
//! applied, a worker crashing before a mark.
//!
//! Checked at the end (after recovery: a worker that failed or crashed has its control
//! message delivered again): if T committed, every message of every part went out exactly
//! as committed, and T's record was marked dispatched only once all of them had (I1); if
//! the fence won, nothing of T was published, K kept its version, no part of T is left,
//! and T's record is its tombstone (I2, I3); the request's answer is true to what
//! happened (I7). After every step, no main item names a part that is missing.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorFuture};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use outbox::aws::DynamoStore;
use outbox::control::{ControlOutcome, ControlPath, ControlPorts, ItemReport};
use outbox::embedded::ManualClock;
use outbox::ports::{
    BusinessWrite, Clock, CommitRequest, ControlDelivery, ControlQueue, EntryFailure, ExpectedVersion, IdSource,
    ItemKey, PublishError, Publisher, QueueError, Store,
};
use outbox::protocol::{ControlMessage, DestinationName, Message, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use outbox::request::{Committed, Outbox, RequestPorts, TxnError};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::chooser::Chooser;
use super::expression::{item_bytes, Expression, Item};
use super::gate::{ActorId, Fault, Gate, Gates, Op};
use super::ports::GatedClock;
use super::split::{answer, check_whole, now_or_never, store_over, Table, TABLE};
use super::world::sim_timing;

/// The double's item limit: DynamoDB's 400 KB, scaled as the store's part size is (1 KB
/// for 350 KB), so that an entry of a few KB does not fit its item.
pub const ITEM_BYTES: usize = 1_500;

/// The counter T increments.
const COUNTER: &str = "COUNTER#0";

/// The destination T's messages go to.
const EVENTS: &str = "events";

/// T's commit window, in seconds.
const WINDOW_SECONDS: u64 = 3;

/// What one schedule contains.
#[derive(Debug, Clone)]
pub struct FenceSplitConfig {
    /// Control workers handling T's control message at once (2: a duplicate delivery).
    pub workers: usize,
    /// T's messages, each big enough to take a part of its own.
    pub messages: usize,
    /// Most faults injected in one schedule.
    pub fault_budget: usize,
    /// The faults each operation may meet.
    pub faults: fn(Op) -> Vec<Fault>,
    /// Bounds the interleavings as [`super::SimConfig::preemption_bound`] does; `None`
    /// for every interleaving.
    pub preemption_bound: Option<usize>,
}

/// The faults of the default exploration: T's transactional commit timed out with its
/// request on its way (applied later, at any step), or applied with its reply lost; its
/// entity form's write with its reply lost (refused for its size wherever it lands, a late
/// one is no different); the fence applied with its reply lost; a worker crashing before a
/// mark.
pub fn fence_split_faults(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::Late, Fault::ReplyLost],
        Op::EntityWrite => vec![Fault::ReplyLost],
        Op::Tombstone => vec![Fault::ReplyLost],
        Op::Mark => vec![Fault::CrashBefore],
        _ => vec![],
    }
}

/// What the double saw, summed over schedules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceSplitCounts {
    /// Schedules in which T committed.
    pub committed: usize,
    /// Schedules in which T was fenced.
    pub fenced: usize,
    /// Fences cancelled by T's split record, its main item (naming its parts) returned in
    /// the cancellation reason.
    pub fence_met_split_record: usize,
    /// Commits of T cancelled by its tombstone (the fence got there first).
    pub commits_refused_by_fence: usize,
    /// Late commits (ghosts) that reached the table, and of those the ones that applied.
    pub late_commits: (usize, usize),
    /// Repeats of an applied commit answered with success under its token.
    pub token_repeats: usize,
    /// Entity-form writes refused for the item's size (each fell back to the
    /// transactional form).
    pub entity_form_too_large: usize,
    /// Control messages delivered again in recovery (a worker failed or crashed).
    pub redeliveries: usize,
}

impl FenceSplitCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &FenceSplitCounts) {
        self.committed += other.committed;
        self.fenced += other.fenced;
        self.fence_met_split_record += other.fence_met_split_record;
        self.commits_refused_by_fence += other.commits_refused_by_fence;
        self.late_commits.0 += other.late_commits.0;
        self.late_commits.1 += other.late_commits.1;
        self.token_repeats += other.token_repeats;
        self.entity_form_too_large += other.entity_form_too_large;
        self.redeliveries += other.redeliveries;
    }
}

/// What one schedule did.
#[derive(Debug)]
pub struct FenceSplitOutcome {
    /// Scheduler steps taken.
    pub steps: usize,
    /// Faults injected.
    pub faults: usize,
    /// How the request was answered.
    pub answer: &'static str,
    /// How each worker's handling of T's control message ended.
    pub workers: Vec<&'static str>,
    /// What the double saw.
    pub counts: FenceSplitCounts,
}

/// What happened on the wire and at the destinations, in order.
#[derive(Debug, Clone)]
enum Event {
    /// Messages accepted by a destination.
    Published(Vec<OutgoingMessage>),
    /// A main outbox item put in state `dispatched` (its partition key).
    Marked(String),
}

#[derive(Debug, Default)]
struct Shared {
    items: Table,
    /// Applied transactions' tokens, with what they carried.
    tokens: BTreeMap<String, Value>,
    events: Vec<Event>,
    /// Writes on their way after their caller stopped waiting: operation and body.
    in_flight: Vec<(String, Value)>,
    /// T's items as its commit put them (main item and parts).
    committed: Option<Table>,
    /// Whether T's tombstone was put.
    fenced: bool,
    /// Control messages sent.
    control: Vec<ControlMessage>,
    /// What the double could not evaluate.
    unsupported: Vec<String>,
    counts: FenceSplitCounts,
    /// What each call did, in order: the schedule as a failure prints it.
    trace: Vec<String>,
}

type SharedState = Arc<Mutex<Shared>>;

/// The DynamoDB double, as one actor's connection (or ungated: setup, recovery, checks).
#[derive(Debug, Clone)]
struct Double {
    shared: SharedState,
    gate: Option<Gate>,
    /// The request path's connection: its single writes are commits.
    request: bool,
    /// Whose connection, for the trace.
    who: String,
}

fn pk_of(key_or_item: &Value) -> Result<String, String> {
    key_or_item["pk"]["S"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no pk in {key_or_item}"))
}

fn error(status: u16, kind: &str, message: &str) -> HttpResponse {
    answer(
        status,
        json!({ "__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"), "message": message }),
    )
}

fn too_large() -> HttpResponse {
    error(
        400,
        "ValidationException",
        "Item size has exceeded the maximum allowed size",
    )
}

fn object(value: &Value) -> Item {
    value.as_object().cloned().unwrap_or_default()
}

/// Whether `body` (a `TransactWriteItems`) is a fence: a tombstone put, or a check of one.
fn is_fence(body: &Value) -> bool {
    body["TransactItems"].as_array().is_some_and(|actions| {
        actions.iter().any(|action| {
            action["Put"]["Item"]["state"]["S"] == "tombstone"
                || action["ConditionCheck"]["ConditionExpression"]
                    .as_str()
                    .is_some_and(|condition| condition.contains(":tombstone"))
        })
    })
}

/// The condition of `action` (a `Put`, `Update`, `ConditionCheck` or `Delete`) on `item`.
fn holds(action: &Value, item: Option<&Item>) -> Result<bool, String> {
    match action["ConditionExpression"].as_str() {
        None => Ok(true),
        Some(text) => Expression::new(
            text,
            &action["ExpressionAttributeNames"],
            &action["ExpressionAttributeValues"],
        )?
        .condition(item),
    }
}

fn all_old(action: &Value) -> bool {
    action["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD" || action["ReturnValues"] == "ALL_OLD"
}

impl Shared {
    /// The item `action` writes, as it would be after it (`None`: deleted, or unchanged
    /// for a check), or an error the double cannot evaluate.
    fn after(&self, kind: &str, action: &Value) -> Result<(String, Option<Option<Item>>), String> {
        match kind {
            "Put" => {
                let item = object(&action["Item"]);
                Ok((pk_of(&action["Item"])?, Some(Some(item))))
            }
            "Update" => {
                let pk = pk_of(&action["Key"])?;
                let mut item = self
                    .items
                    .get(&pk)
                    .map(object)
                    .unwrap_or_else(|| object(&action["Key"]));
                Expression::new(
                    action["UpdateExpression"].as_str().unwrap_or_default(),
                    &action["ExpressionAttributeNames"],
                    &action["ExpressionAttributeValues"],
                )?
                .update(&mut item)?;
                Ok((pk, Some(Some(item))))
            }
            "Delete" => Ok((pk_of(&action["Key"])?, Some(None))),
            "ConditionCheck" => Ok((pk_of(&action["Key"])?, None)),
            other => Err(format!("the double does not answer a {other} action")),
        }
    }

    fn get_item(&self, body: &Value) -> Result<HttpResponse, String> {
        let pk = pk_of(&body["Key"])?;
        Ok(answer(
            200,
            match self.items.get(&pk) {
                Some(item) => json!({ "Item": item }),
                None => json!({}),
            },
        ))
    }

    fn batch_get(&self, body: &Value) -> Result<HttpResponse, String> {
        let mut found = Vec::new();
        for key in body["RequestItems"][TABLE]["Keys"].as_array().ok_or("no keys")? {
            if let Some(item) = self.items.get(&pk_of(key)?) {
                found.push(item.clone());
            }
        }
        Ok(answer(
            200,
            json!({ "Responses": { TABLE: found }, "UnprocessedKeys": {} }),
        ))
    }

    fn batch_write(&mut self, body: &Value) -> Result<HttpResponse, String> {
        for request in body["RequestItems"][TABLE].as_array().ok_or("no requests")? {
            if let Some(put) = request.get("PutRequest") {
                let item = object(&put["Item"]);
                if item_bytes(&item) > ITEM_BYTES {
                    return Ok(too_large());
                }
                let pk = pk_of(&put["Item"])?;
                if pk.starts_with("TXN#") && !pk.contains("#PART#") && item["state"]["S"] == "dispatched" {
                    self.events.push(Event::Marked(pk.clone()));
                }
                self.items.insert(pk, Value::Object(item));
            } else {
                self.items.remove(&pk_of(&request["DeleteRequest"]["Key"])?);
            }
        }
        Ok(answer(200, json!({ "UnprocessedItems": {} })))
    }

    /// `PutItem`, `UpdateItem`, `DeleteItem`: the size, then the condition, then the
    /// write.
    fn write(&mut self, kind: &str, body: &Value) -> Result<HttpResponse, String> {
        let pk = match kind {
            "Put" => pk_of(&body["Item"])?,
            _ => pk_of(&body["Key"])?,
        };
        let before = self.items.get(&pk).map(object);
        // An item that would be over the limit is refused before anything is evaluated.
        let values = body["ExpressionAttributeValues"].as_object().map_or(0, item_bytes);
        let put_bytes = body["Item"].as_object().map_or(0, item_bytes);
        if before.as_ref().map_or(0, item_bytes) + values > ITEM_BYTES || put_bytes > ITEM_BYTES {
            // Only the entity form updates an item with a value this big.
            if kind == "Update" {
                self.counts.entity_form_too_large += 1;
            }
            return Ok(too_large());
        }
        if !holds(body, before.as_ref())? {
            let mut failure = json!({
                "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "message": "The conditional request failed",
            });
            if let (true, Some(old)) = (all_old(body), &before) {
                failure["Item"] = Value::Object(old.clone());
            }
            return Ok(answer(400, failure));
        }
        let after = match self.after(kind, body) {
            Ok((_, after)) => after,
            // DynamoDB's answer to a SET into a map that is not there.
            Err(invalid) if invalid.contains("document path") => {
                return Ok(error(400, "ValidationException", &invalid));
            }
            Err(unsupported) => return Err(unsupported),
        };
        match after.expect("a write changes its item") {
            Some(item) if item_bytes(&item) > ITEM_BYTES => return Ok(too_large()),
            Some(item) => self.items.insert(pk, Value::Object(item)),
            None => self.items.remove(&pk),
        };
        Ok(answer(200, json!({})))
    }

    fn transact(&mut self, body: &Value, txn: TxnId) -> Result<HttpResponse, String> {
        let actions = body["TransactItems"].as_array().ok_or("no actions")?;
        let token = body["ClientRequestToken"].as_str().map(str::to_owned);
        if let Some(seen) = token.as_ref().and_then(|token| self.tokens.get(token)) {
            if *seen == body["TransactItems"] {
                self.counts.token_repeats += 1;
                return Ok(answer(200, json!({})));
            }
            return Ok(error(
                400,
                "IdempotentParameterMismatchException",
                "the token was used with other parameters",
            ));
        }
        let fence = is_fence(body);
        let mut reasons = Vec::new();
        let mut writes = Vec::new();
        let mut cancelled = false;
        for action in actions {
            let (kind, inner) = action
                .as_object()
                .and_then(|action| action.iter().next())
                .ok_or("an empty action")?;
            let (pk, after) = self.after(kind, inner)?;
            if writes.iter().any(|(other, _)| *other == pk) {
                return Ok(error(
                    400,
                    "ValidationException",
                    "Transaction request cannot include multiple operations on one item",
                ));
            }
            let before = self.items.get(&pk).map(object);
            if holds(inner, before.as_ref())? {
                reasons.push(json!({ "Code": "None" }));
            } else {
                cancelled = true;
                let mut reason =
                    json!({ "Code": "ConditionalCheckFailed", "Message": "The conditional request failed" });
                if let (true, Some(old)) = (all_old(inner), &before) {
                    reason["Item"] = Value::Object(old.clone());
                }
                reasons.push(reason);
            }
            if let Some(Some(item)) = &after {
                if item_bytes(item) > ITEM_BYTES {
                    return Ok(too_large());
                }
            }
            writes.push((pk, after));
        }
        let record = format!("TXN#{txn}");
        if cancelled {
            let failed_on_record = writes
                .iter()
                .zip(&reasons)
                .find(|((pk, _), _)| *pk == record)
                .map(|(_, reason)| reason.clone());
            if let Some(reason) = failed_on_record.filter(|reason| reason["Code"] == "ConditionalCheckFailed") {
                if fence && reason["Item"]["parts"]["N"].is_string() {
                    self.counts.fence_met_split_record += 1;
                }
                if !fence && reason["Item"]["state"]["S"] == "tombstone" {
                    self.counts.commits_refused_by_fence += 1;
                }
            }
            let codes: Vec<&str> = reasons
                .iter()
                .map(|reason| reason["Code"].as_str().unwrap_or("None"))
                .collect();
            return Ok(answer(
                400,
                json!({
                    "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                    "Message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{}]", codes.join(", ")),
                    "CancellationReasons": reasons,
                }),
            ));
        }
        let mut own = Table::new();
        for (pk, after) in writes {
            match after {
                Some(Some(item)) => {
                    if pk == record && item["state"]["S"] == "tombstone" {
                        self.fenced = true;
                    }
                    if pk == record || pk.starts_with(&format!("{record}#PART#")) {
                        own.insert(pk.clone(), Value::Object(item.clone()));
                    }
                    self.items.insert(pk, Value::Object(item));
                }
                Some(None) => {
                    self.items.remove(&pk);
                }
                None => {}
            }
        }
        if !fence && own.get(&record).is_some_and(|main| main["state"]["S"] == "pending") {
            self.committed = Some(own);
        }
        if let Some(token) = token {
            self.tokens.insert(token, body["TransactItems"].clone());
        }
        Ok(answer(200, json!({})))
    }
}

impl Double {
    /// Answers one call, ungated (the gate was passed).
    fn apply(&self, operation: &str, body: &Value) -> HttpResponse {
        let mut shared = self.shared.lock().expect("double");
        let repeat = body["ClientRequestToken"]
            .as_str()
            .is_some_and(|token| shared.tokens.contains_key(token));
        let response = self.respond(&mut shared, operation, body);
        let line = format!(
            "{} {operation}: {}",
            self.who,
            summary(operation, body, &response, repeat)
        );
        shared.trace.push(line);
        response
    }

    fn respond(&self, shared: &mut Shared, operation: &str, body: &Value) -> HttpResponse {
        let txn = txn_of_t();
        let result = match operation {
            "GetItem" => shared.get_item(body),
            "BatchGetItem" => shared.batch_get(body),
            "BatchWriteItem" => shared.batch_write(body),
            "PutItem" => shared.write("Put", body),
            "UpdateItem" => shared.write("Update", body),
            "DeleteItem" => shared.write("Delete", body),
            "TransactWriteItems" => shared.transact(body, txn),
            other => Err(format!("the double does not answer {other}")),
        };
        result.unwrap_or_else(|unsupported| {
            shared.unsupported.push(format!("{operation}: {unsupported}"));
            error(400, "ValidationException", &unsupported)
        })
    }

    async fn handle(self, operation: String, body: Value) -> Result<HttpResponse, ConnectorError> {
        let Some(gate) = self.gate.clone() else {
            return Ok(self.apply(&operation, &body));
        };
        let op = match operation.as_str() {
            "GetItem" | "BatchGetItem" => Op::Read,
            "TransactWriteItems" if is_fence(&body) => Op::Tombstone,
            "TransactWriteItems" => Op::Commit,
            "PutItem" | "UpdateItem" | "DeleteItem" if self.request => Op::EntityWrite,
            _ => Op::Mark,
        };
        let fault = gate.pass(op).await;
        let lost = |what: &str| ConnectorError::timeout(format!("injected: {what}").into());
        match fault {
            Fault::CrashBefore => {
                let line = format!("{} crashes before its {operation}", self.who);
                self.shared.lock().expect("double").trace.push(line);
                return gate.crash().await;
            }
            Fault::Fail => {
                return Ok(error(500, "InternalServerError", "injected"));
            }
            Fault::Late => {
                let mut shared = self.shared.lock().expect("double");
                let line = format!("{} {operation}: timed out, the request still on its way", self.who);
                shared.trace.push(line);
                shared.in_flight.push((operation, body));
                return Err(lost("timed out with the request on its way"));
            }
            _ => {}
        }
        let response = self.apply(&operation, &body);
        match fault {
            Fault::CrashAfter => gate.crash().await,
            Fault::ReplyLost => {
                let line = format!("{} {operation}: the reply is lost", self.who);
                self.shared.lock().expect("double").trace.push(line);
                Err(lost("the reply was lost"))
            }
            _ => Ok(response),
        }
    }
}

/// An item in a few words: its key, and its state, parts or version where it has them.
fn describe(item: &Value) -> String {
    let mut text = item["pk"]["S"].as_str().unwrap_or("?").to_owned();
    let mut about = Vec::new();
    if let Some(state) = item["state"]["S"].as_str() {
        about.push(state.to_owned());
    }
    if let Some(parts) = item["parts"]["N"].as_str() {
        about.push(format!(
            "naming {} parts",
            parts.parse::<usize>().unwrap_or(1).saturating_sub(1)
        ));
    }
    if let Some(version) = item["version"]["N"].as_str() {
        about.push(format!("version {version}"));
    }
    if !about.is_empty() {
        text.push_str(&format!(" ({})", about.join(", ")));
    }
    text
}

/// What a call did, in a few words, from its request and its response.
fn summary(operation: &str, body: &Value, response: &HttpResponse, repeat: bool) -> String {
    let answered: Value = response
        .body()
        .bytes()
        .and_then(|bytes| serde_json::from_slice(bytes).ok())
        .unwrap_or_default();
    let ok = response.status().is_success();
    let failure = || {
        let kind = answered["__type"]
            .as_str()
            .unwrap_or("?")
            .rsplit('#')
            .next()
            .unwrap_or("?");
        let message = answered["message"]
            .as_str()
            .or(answered["Message"].as_str())
            .unwrap_or("");
        format!("{kind} ({message})")
    };
    let keys = |values: &[Value]| values.iter().map(describe).collect::<Vec<_>>().join(", ");
    match operation {
        "GetItem" => format!(
            "{} -> {}",
            body["Key"]["pk"]["S"].as_str().unwrap_or("?"),
            if answered["Item"].is_object() {
                describe(&answered["Item"])
            } else {
                "absent".into()
            }
        ),
        "BatchGetItem" => {
            let asked = body["RequestItems"][TABLE]["Keys"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let found = answered["Responses"][TABLE].as_array().cloned().unwrap_or_default();
            format!(
                "{} -> found {}",
                keys(&asked),
                if found.is_empty() {
                    "nothing".into()
                } else {
                    keys(&found)
                }
            )
        }
        "BatchWriteItem" => {
            let requests = body["RequestItems"][TABLE].as_array().cloned().unwrap_or_default();
            let done: Vec<String> = requests
                .iter()
                .map(|request| match request.get("PutRequest") {
                    Some(put) => format!("put {}", describe(&put["Item"])),
                    None => format!("delete {}", describe(&request["DeleteRequest"]["Key"])),
                })
                .collect();
            format!("{}{}", done.join(", "), if ok { "" } else { " -> refused" })
        }
        "TransactWriteItems" => {
            let actions: Vec<String> = body["TransactItems"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|action| action.as_object().and_then(|action| action.iter().next()))
                .map(|(kind, inner)| match kind.as_str() {
                    "Put" => format!("put {}", describe(&inner["Item"])),
                    other => format!("{} {}", other.to_lowercase(), describe(&inner["Key"])),
                })
                .collect();
            let what = if is_fence(body) { "the fence" } else { "the commit" };
            let outcome = if repeat {
                "a repeat under its token: answered success, applied nothing".to_owned()
            } else if ok {
                "applied".to_owned()
            } else if let Some(reasons) = answered["CancellationReasons"].as_array() {
                let reasons: Vec<String> = reasons
                    .iter()
                    .map(|reason| match reason["Item"].is_object() {
                        true => format!(
                            "{} with ALL_OLD {}",
                            reason["Code"].as_str().unwrap_or("?"),
                            describe(&reason["Item"])
                        ),
                        false => reason["Code"].as_str().unwrap_or("?").to_owned(),
                    })
                    .collect();
                format!("cancelled [{}]", reasons.join("; "))
            } else {
                failure()
            };
            format!("{what} [{}] -> {outcome}", actions.join(", "))
        }
        _ => {
            let key = if body["Key"].is_object() {
                &body["Key"]
            } else {
                &body["Item"]
            };
            format!(
                "{} -> {}",
                describe(key),
                if ok { "applied".to_owned() } else { failure() }
            )
        }
    }
}

impl HttpConnector for Double {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request.headers().get("x-amz-target").unwrap_or_default().to_owned();
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        let body: Value = request
            .body()
            .bytes()
            .and_then(|bytes| serde_json::from_slice(bytes).ok())
            .unwrap_or_default();
        let double = self.clone();
        HttpConnectorFuture::new(async move { double.handle(operation, body).await })
    }
}

/// The destinations: what each publish sent goes into the events, in order.
#[derive(Debug)]
struct RecordingPublisher {
    shared: SharedState,
    gate: Option<Gate>,
    who: String,
}

#[async_trait]
impl Publisher for RecordingPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let fault = match &self.gate {
            Some(gate) => gate.pass(Op::Publish).await,
            None => Fault::None,
        };
        match fault {
            Fault::CrashBefore => return self.gate.as_ref().expect("gated").crash().await,
            Fault::Fail => {
                return Err(PublishError::Unavailable {
                    destination: destination.clone(),
                    source: "injected".into(),
                })
            }
            _ => {}
        }
        {
            let mut shared = self.shared.lock().expect("double");
            let ids: Vec<&str> = messages.iter().map(|message| message.id.as_str()).collect();
            let line = format!(
                "{} publishes {} message(s) to {destination}: {}",
                self.who,
                ids.len(),
                ids.join(", ")
            );
            shared.trace.push(line);
            shared.events.push(Event::Published(messages.to_vec()));
        }
        if fault == Fault::CrashAfter {
            return self.gate.as_ref().expect("gated").crash().await;
        }
        Ok(Vec::new())
    }
}

/// The control queue: keeps what is sent.
#[derive(Debug)]
struct RecordingQueue(SharedState);

#[async_trait]
impl ControlQueue for RecordingQueue {
    async fn send(&self, message: &ControlMessage, _delay: Duration) -> Result<(), QueueError> {
        self.0.lock().expect("double").control.push(message.clone());
        Ok(())
    }
}

/// The request path's ids: T, always.
struct FixedIds;

impl IdSource for FixedIds {
    fn next_txn_id(&self, _now: Timestamp) -> TxnId {
        txn_of_t()
    }
}

fn start() -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000)
}

/// T's id.
fn txn_of_t() -> TxnId {
    TxnId::from_parts(start(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 7])
}

/// A clock whose sleeps return at once (recovery and setup, ungated).
struct StillClock(Timestamp);

#[async_trait]
impl Clock for StillClock {
    fn now(&self) -> Timestamp {
        self.0
    }

    async fn sleep(&self, _duration: Duration) {}

    async fn timer(&self, _duration: Duration) {
        std::future::pending::<()>().await;
    }
}

fn timing() -> Timing {
    sim_timing(WINDOW_SECONDS)
}

/// The worker's clock: past T's window at its first check.
fn worker_skew() -> i64 {
    (WINDOW_SECONDS as i64 + 1) * 1000
}

/// The table every schedule starts from: K at version 1 (count 1), written by the real
/// store's commit and mark, once.
fn initial_table() -> &'static Table {
    static TABLE_AT_START: OnceLock<Table> = OnceLock::new();
    TABLE_AT_START.get_or_init(|| {
        let shared = SharedState::default();
        let double = Double {
            shared: shared.clone(),
            gate: None,
            request: false,
            who: "setup".into(),
        };
        let store = store_over(double, Arc::new(StillClock(start())));
        let seed = TxnId::from_parts(start(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let expires_at = start().plus(Duration::from_secs(3600));
        let record = OutboxRecord::committed(seed, vec![], start(), expires_at);
        let request = CommitRequest {
            txn_id: seed,
            writes: vec![BusinessWrite::Put {
                key: COUNTER.parse().expect("a valid key"),
                data: json!({ "count": 1 }),
                expected: ExpectedVersion::Absent,
            }],
            outbox: record.clone(),
            idempotency: None,
        };
        now_or_never(store.commit(&request)).expect("the double takes the seed");
        for result in now_or_never(store.mark_dispatched(&[record], expires_at)) {
            result.expect("the double marks the seed");
        }
        let items = shared.lock().expect("double").items.clone();
        assert!(shared.lock().expect("double").unsupported.is_empty());
        items
    })
}

enum End {
    Request(Result<Committed, TxnError>),
    Worker(ItemReport),
    Ghost,
}

enum Kind {
    Request,
    Worker,
    Ghost,
}

struct Actor {
    id: ActorId,
    kind: Kind,
    future: Pin<Box<dyn Future<Output = End>>>,
}

fn poll(actor: &mut Actor) -> Poll<End> {
    actor.future.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// The request: T in entity mode on K, its control message sent before its read (as a
/// handler that will write for sure sends it, [`outbox::request::Transaction::send_control`]:
/// the workers have it to handle from the start), read, incremented, `messages` big
/// messages emitted, committed.
async fn request(outbox: Outbox, messages: usize) -> Result<Committed, TxnError> {
    let key: ItemKey = COUNTER.parse().expect("a valid key");
    let mut txn = outbox.begin_entity(key.clone()).await?;
    txn.send_control().await?;
    let current = txn.get(&key).await?.expect("the counter exists");
    let count = current.data["count"].as_u64().expect("a count") + 1;
    txn.put(
        key,
        json!({ "count": count }),
        ExpectedVersion::Exactly(current.version),
    );
    let events: DestinationName = EVENTS.parse().expect("valid");
    for n in 0..messages {
        let body = json!({ "count": count, "n": n, "padding": "x".repeat(600) });
        txn.emit(Message::json(events.clone(), &body).expect("serialisable"));
    }
    txn.commit().await
}

fn answer_name(result: Option<&Result<Committed, TxnError>>) -> &'static str {
    match result {
        None => "crashed",
        Some(Ok(_)) => "committed",
        Some(Err(TxnError::CommitWindowExpired { .. })) => "refused: fenced (commit window expired)",
        Some(Err(TxnError::Fenced { .. })) => "unknown outcome, settled by its own fence",
        Some(Err(TxnError::Ambiguous { .. })) => "outcome unknown",
        Some(Err(_)) => "other failure",
    }
}

fn report_name(report: &ItemReport) -> &'static str {
    match &report.result {
        Ok(ControlOutcome::Dispatched { .. }) => "dispatched",
        Ok(ControlOutcome::Tombstoned) => "fenced",
        Ok(ControlOutcome::AlreadyDone {
            state: OutboxState::Dispatched,
        }) => "found dispatched",
        Ok(ControlOutcome::AlreadyDone { .. }) => "found fenced",
        Ok(ControlOutcome::Deferred { .. }) => "deferred",
        Ok(_) => "other",
        Err(_) => "failed",
    }
}

fn delivery(control: &ControlMessage, receive_count: u32) -> ControlDelivery {
    ControlDelivery {
        message_id: format!("control-{receive_count}"),
        receipt: format!("receipt-{receive_count}"),
        body: control.encode(),
        receive_count,
    }
}

fn control_path(
    store: DynamoStore,
    shared: &SharedState,
    gate: Option<Gate>,
    clock: Arc<dyn Clock>,
    who: &str,
) -> ControlPath {
    ControlPath::new(
        ControlPorts {
            store: Arc::new(store),
            control_queue: Arc::new(RecordingQueue(shared.clone())),
            publisher: Arc::new(RecordingPublisher {
                shared: shared.clone(),
                gate,
                who: who.to_owned(),
            }),
            clock,
        },
        timing(),
    )
}

/// Runs one schedule to its end with every decision from `chooser`.
pub fn run_fence_split_schedule(
    chooser: &mut dyn Chooser,
    config: &FenceSplitConfig,
) -> Result<FenceSplitOutcome, String> {
    let clock = Arc::new(ManualClock::new(start()));
    let gates = Gates::default();
    let shared = SharedState::default();
    shared.lock().expect("double").items = initial_table().clone();
    let double = |gate: Option<Gate>, request: bool, who: &str| Double {
        shared: shared.clone(),
        gate,
        request,
        who: who.to_owned(),
    };
    let actor_clock = |gate: &Gate, skew_millis: i64| -> Arc<dyn Clock> {
        Arc::new(GatedClock {
            inner: clock.clone(),
            skew_millis,
            gate: gate.clone(),
            timers_fire: false,
        })
    };
    let mut next_id: ActorId = 0;
    let mut actors: Vec<Actor> = Vec::new();

    // The request, run to its first gate: its control message is sent by then.
    let gate = gates.for_actor(next_id);
    let outbox = Outbox::new(
        RequestPorts {
            store: Arc::new(store_over(
                double(Some(gate.clone()), true, "request"),
                actor_clock(&gate, 0),
            )),
            control_queue: Arc::new(RecordingQueue(shared.clone())),
            clock: actor_clock(&gate, 0),
            ids: Arc::new(FixedIds),
        },
        timing(),
        TransactionLimits::default(),
    );
    let messages = config.messages;
    actors.push(Actor {
        id: next_id,
        kind: Kind::Request,
        future: Box::pin(async move { End::Request(request(outbox, messages).await) }),
    });
    next_id += 1;
    if poll(&mut actors[0]).is_ready() {
        return Err("the request ended without a call".into());
    }
    let control = shared
        .lock()
        .expect("double")
        .control
        .first()
        .cloned()
        .ok_or("the request sent no control message")?;

    // The workers, each handling T's control message past T's window.
    for worker in 1..=config.workers {
        let gate = gates.for_actor(next_id);
        let clock = actor_clock(&gate, worker_skew());
        let who = if config.workers == 1 {
            "worker".to_owned()
        } else {
            format!("worker {worker}")
        };
        let path = control_path(
            store_over(double(Some(gate.clone()), false, &who), clock.clone()),
            &shared,
            Some(gate),
            clock,
            &who,
        );
        let delivery = delivery(&control, 1);
        let mut actor = Actor {
            id: next_id,
            kind: Kind::Worker,
            future: Box::pin(async move { End::Worker(path.handle(&delivery).await) }),
        };
        next_id += 1;
        if poll(&mut actor).is_ready() {
            return Err("a worker ended without a call".into());
        }
        actors.push(actor);
    }

    let mut answered: Option<Result<Committed, TxnError>> = None;
    let mut reports: Vec<&'static str> = Vec::new();
    let mut redeliver = false;
    let (mut steps, mut faults, mut preemptions) = (0, 0, 0);
    let mut last_moved: Option<ActorId> = None;
    let max_steps = 400;
    loop {
        // Commits on their way become ghosts, each applying at a step of its own.
        let late = std::mem::take(&mut shared.lock().expect("double").in_flight);
        for (operation, body) in late {
            let gate = gates.for_actor(next_id);
            let ghost = double(Some(gate.clone()), true, "the request's late");
            let shared = shared.clone();
            let mut actor = Actor {
                id: next_id,
                kind: Kind::Ghost,
                future: Box::pin(async move {
                    gate.pass(Op::LateCommit).await;
                    let applied_before = shared.lock().expect("double").committed.is_some();
                    ghost.apply(&operation, &body);
                    let mut shared = shared.lock().expect("double");
                    shared.counts.late_commits.0 += 1;
                    if !applied_before && shared.committed.is_some() {
                        shared.counts.late_commits.1 += 1;
                    }
                    End::Ghost
                }),
            };
            next_id += 1;
            if poll(&mut actor).is_pending() {
                actors.push(actor);
            }
        }
        if actors.is_empty() {
            break;
        }
        steps += 1;
        if steps > max_steps {
            return Err(format!("no end after {max_steps} steps"));
        }
        let waiting = gates.lock().waiting.clone();
        let mut options: Vec<usize> = Vec::new();
        for (position, actor) in actors.iter().enumerate() {
            if !waiting.contains_key(&actor.id) {
                return Err(format!("actor {} is neither finished nor at a gate", actor.id));
            }
            options.push(position);
        }
        // With a preemption bound, the actor that moved last goes first while it can
        // move on; once the bound is used up, it alone does.
        let mut can_continue = false;
        if let Some(bound) = config.preemption_bound {
            if let Some(continues) = options
                .iter()
                .position(|position| Some(actors[*position].id) == last_moved)
            {
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
        let position = options[choice];
        let actor_id = actors[position].id;
        last_moved = Some(actor_id);
        let op = gates
            .lock()
            .waiting
            .remove(&actor_id)
            .ok_or_else(|| format!("actor {actor_id} is not at a gate"))?;
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
        gates.lock().granted.insert(actor_id, fault);
        let polled = poll(&mut actors[position]);
        let crashed = gates.lock().crashed.remove(&actor_id);
        match polled {
            Poll::Ready(End::Request(result)) => {
                let line = format!("request answered: {}", answer_name(Some(&result)));
                shared.lock().expect("double").trace.push(line);
                answered = Some(result);
                actors.swap_remove(position);
            }
            Poll::Ready(End::Worker(report)) => {
                redeliver |= report.result.is_err();
                reports.push(report_name(&report));
                let line = format!("a worker's handling ended: {}", report_name(&report));
                shared.lock().expect("double").trace.push(line);
                actors.swap_remove(position);
            }
            Poll::Ready(End::Ghost) => {
                actors.swap_remove(position);
            }
            Poll::Pending if crashed => {
                gates.lock().waiting.remove(&actor_id);
                if let Kind::Worker = actors[position].kind {
                    reports.push("crashed");
                    redeliver = true;
                }
                actors.swap_remove(position);
            }
            Poll::Pending => {}
        }
        let unsupported = shared.lock().expect("double").unsupported.first().cloned();
        if let Some(unsupported) = unsupported {
            return Err(with_trace(&shared, format!("after step {steps}: {unsupported}")));
        }
        let whole = check_whole(&shared.lock().expect("double").items);
        whole.map_err(|error| with_trace(&shared, format!("after step {steps}: {error}")))?;
    }

    // Recovery: a control message whose handling failed (or whose worker crashed) comes
    // back, and is handled until it succeeds.
    let late_clock: Arc<dyn Clock> = Arc::new(StillClock(
        start().plus(Duration::from_millis(worker_skew() as u64 * 2)),
    ));
    let mut receive_count = 1;
    while redeliver {
        receive_count += 1;
        if receive_count > 5 {
            return Err("T's control message failed 4 redeliveries".into());
        }
        shared.lock().expect("double").counts.redeliveries += 1;
        let path = control_path(
            store_over(double(None, false, "worker (redelivered)"), late_clock.clone()),
            &shared,
            None,
            late_clock.clone(),
            "worker (redelivered)",
        );
        let report = now_or_never(path.handle(&delivery(&control, receive_count)));
        redeliver = report.result.is_err();
        let line = format!(
            "the redelivered control message's handling ended: {}",
            report_name(&report)
        );
        shared.lock().expect("double").trace.push(line);
    }

    check_end(&shared, answered.as_ref()).map_err(|error| with_trace(&shared, error))?;
    let mut counts = shared.lock().expect("double").counts;
    let shared = shared.lock().expect("double");
    counts.committed = usize::from(shared.committed.is_some());
    counts.fenced = usize::from(shared.fenced);
    Ok(FenceSplitOutcome {
        steps,
        faults,
        answer: answer_name(answered.as_ref()),
        workers: reports,
        counts,
    })
}

/// `error`, followed by the schedule as the double saw it.
fn with_trace(shared: &SharedState, error: String) -> String {
    let trace = &shared.lock().expect("double").trace;
    let steps: Vec<String> = trace
        .iter()
        .enumerate()
        .map(|(n, line)| format!("  {:>2}. {line}", n + 1))
        .collect();
    format!("{error}\nthe schedule, as the double saw it:\n{}", steps.join("\n"))
}

/// T's record as it was committed, read through the real store from the items its
/// commit put.
fn committed_record(committed: &Table) -> Result<OutboxRecord, String> {
    let shared = SharedState::default();
    shared.lock().expect("double").items = committed.clone();
    let store = store_over(
        Double {
            shared,
            gate: None,
            request: false,
            who: "check".into(),
        },
        Arc::new(StillClock(start())),
    );
    now_or_never(store.get_outboxes(&[txn_of_t()]))
        .map_err(|error| error.to_string())?
        .remove(&txn_of_t())
        .ok_or_else(|| "T's committed items do not read as its record".into())
}

/// The checks at the end of a schedule.
fn check_end(shared: &SharedState, answer: Option<&Result<Committed, TxnError>>) -> Result<(), String> {
    let shared = shared.lock().expect("double");
    let txn = txn_of_t();
    let main_pk = format!("TXN#{txn}");
    let main = shared.items.get(&main_pk);
    let state = main.and_then(|main| main["state"]["S"].as_str()).unwrap_or("absent");
    let counter = &shared.items[COUNTER];
    let version = counter["version"]["N"].as_str().unwrap_or_default();
    let published: Vec<&OutgoingMessage> = shared
        .events
        .iter()
        .filter_map(|event| match event {
            Event::Published(messages) => Some(messages),
            Event::Marked(_) => None,
        })
        .flatten()
        .filter(|message| message.txn_id == txn)
        .collect();
    let committed = shared.committed.as_ref().map(committed_record).transpose()?;
    // I7: the answer is true to what happened.
    match (answer, &committed) {
        (Some(Ok(_)), None) => return Err("I7: the request was told T committed; it did not".into()),
        (Some(Err(error)), Some(_)) if error.is_definite() => {
            return Err(format!("I7: the request was told T did not commit ({error}); it did"))
        }
        _ => {}
    }
    let Some(record) = committed else {
        // The fence won: nothing of T went out, K kept its version, no part of T is
        // left, and T's record is its tombstone.
        if let Some(message) = published.first() {
            return Err(format!(
                "I2: message {} of T was published, and T never committed",
                message.id
            ));
        }
        if version != "1" {
            return Err(format!("T never committed, and K is at version {version}"));
        }
        if let Some(part) = shared
            .items
            .keys()
            .find(|pk| pk.starts_with(&format!("{main_pk}#PART#")))
        {
            return Err(format!("T never committed, and {part} is in the table"));
        }
        if state != "tombstone" {
            return Err(format!(
                "I3: T never committed, and its record is {state}, not its tombstone"
            ));
        }
        return Ok(());
    };
    // T committed: K moved with it, its record is dispatched, every message of every
    // part went out as committed, and before the record was marked.
    if shared.fenced {
        return Err("I3: T committed and was fenced".into());
    }
    if version != "2" {
        return Err(format!("T committed, and K is at version {version}"));
    }
    if state != "dispatched" {
        return Err(format!("I1: T committed, and its record is {state} after recovery"));
    }
    for message in &published {
        match record.messages.iter().find(|committed| committed.id == message.id) {
            Some(committed) if committed.body == message.body && committed.destination == message.destination => {}
            Some(_) => return Err(format!("I4: message {} was published unlike its commit", message.id)),
            None => {
                return Err(format!(
                    "I2: message {} of T was published, and T never committed it",
                    message.id
                ))
            }
        }
    }
    let mut sent_so_far: Vec<&str> = Vec::new();
    let mut marked_once = false;
    for event in &shared.events {
        match event {
            Event::Published(messages) => {
                sent_so_far.extend(messages.iter().map(|message| message.id.as_str()));
            }
            Event::Marked(pk) if *pk == main_pk && !marked_once => {
                marked_once = true;
                let missing: Vec<&str> = record
                    .messages
                    .iter()
                    .map(|message| message.id.as_str())
                    .filter(|id| !sent_so_far.contains(id))
                    .collect();
                if !missing.is_empty() {
                    return Err(format!(
                        "I1: T's record was marked dispatched with {} of its {} messages published; never published before the mark: {}",
                        record.messages.len() - missing.len(),
                        record.messages.len(),
                        missing.join(", ")
                    ));
                }
            }
            Event::Marked(_) => {}
        }
    }
    if let Some(lost) = record
        .messages
        .iter()
        .find(|message| !sent_so_far.contains(&message.id.as_str()))
    {
        return Err(format!("I1: message {} of committed T was never published", lost.id));
    }
    Ok(())
}
