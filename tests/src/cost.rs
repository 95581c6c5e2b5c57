//! Capacity and billed requests of the AWS calls that reach the wire, for the cost model
//! (`cargo run -p outbox-tests --bin cost-model`).
//!
//! DynamoDB only reports consumed capacity when a request sets `ReturnConsumedCapacity`,
//! which the adapters do not, and the emulator's figures are not size-based; so the
//! [`WireMeter`] *computes* capacity from the items on the wire with DynamoDB's published
//! rules: a write is 1 unit per started KB of the larger of the old and new item (2 in a
//! transaction), a strongly consistent read 1 unit per started 4 KB of each item (2 in a
//! transaction, half when eventually consistent), a read of an absent item the minimum.
//! The old size of an item is what this meter saw written last (the meter sees every
//! write of a run on a fresh table). SQS requests are billed per started 64 KB of payload.

use crate::calls::operation_of;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use aws_config::SdkConfig;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use outbox::aws::AwsClients;
use serde_json::Value;

use crate::calls::CallCounter;

/// What one operation cost, summed over the calls made.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Calls made.
    pub calls: f64,
    /// DynamoDB write request units.
    pub wru: f64,
    /// DynamoDB read request units.
    pub rru: f64,
    /// SQS billed requests (64 KB chunks of payload, at least one per call).
    pub sqs_billed: f64,
}

impl Usage {
    /// `self + other`.
    pub fn add(&mut self, other: Usage) {
        self.calls += other.calls;
        self.wru += other.wru;
        self.rru += other.rru;
        self.sqs_billed += other.sqs_billed;
    }

    /// Every figure times `factor`.
    pub fn scaled(self, factor: f64) -> Usage {
        Usage {
            calls: self.calls * factor,
            wru: self.wru * factor,
            rru: self.rru * factor,
            sqs_billed: self.sqs_billed * factor,
        }
    }
}

/// Usage by operation name (`TransactWriteItems`, `SendMessage`, ...).
pub type Bill = BTreeMap<String, Usage>;

/// Adds `other` into `bill`.
pub fn merge(bill: &mut Bill, other: &Bill) {
    for (operation, usage) in other {
        bill.entry(operation.clone()).or_default().add(*usage);
    }
}

/// One item written, as the meter saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Its partition key value.
    pub key: String,
    /// Its size by DynamoDB's rules, in bytes.
    pub bytes: usize,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<&'static str, VecDeque<(String, Vec<u8>)>>,
    bill: Bill,
    written: Vec<Written>,
    sizes: HashMap<String, usize>,
    dynamodb_responses: usize,
    with_consumed_capacity: usize,
    reported: BTreeMap<String, f64>,
}

/// An SDK interceptor that meters every call: its operation, the capacity it consumes
/// (computed, see the module) and its SQS billed requests.
#[derive(Debug, Clone)]
pub struct WireMeter {
    state: Arc<Mutex<State>>,
    key_attribute: &'static str,
    service: &'static str,
}

impl Default for WireMeter {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            key_attribute: "pk",
            service: "",
        }
    }
}

impl WireMeter {
    /// The usage so far, by operation.
    pub fn bill(&self) -> Bill {
        self.lock().bill.clone()
    }

    /// The items written so far (puts), in order.
    pub fn written(&self) -> Vec<Written> {
        self.lock().written.clone()
    }

    /// Forgets the usage and the items written so far (not the item sizes it knows).
    pub fn reset(&self) {
        let mut state = self.lock();
        state.bill.clear();
        state.written.clear();
    }

    /// DynamoDB responses seen, how many of them carried `ConsumedCapacity` unasked, and
    /// the capacity units they reported by operation (since the start, not reset).
    pub fn consumed_capacity_seen(&self) -> (usize, usize, BTreeMap<String, f64>) {
        let state = self.lock();
        (
            state.dynamodb_responses,
            state.with_consumed_capacity,
            state.reported.clone(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("meter lock")
    }

    /// Both clients, counting through `counter` and metering through this meter.
    pub fn clients(&self, counter: &CallCounter, config: &SdkConfig) -> AwsClients {
        // One meter per client: the calls of one client are sequential in the flows
        // measured, so a response answers the oldest request its client sent.
        let counted = counter.clients(config);
        let on = |service| Self {
            service,
            ..self.clone()
        };
        AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                counted
                    .dynamodb
                    .config()
                    .to_builder()
                    .interceptor(on("dynamodb"))
                    .build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(counted.sqs.config().to_builder().interceptor(on("sqs")).build()),
            // The cost model publishes to SQS only; these two count but are not metered.
            sns: counted.sns,
            eventbridge: counted.eventbridge,
        }
    }

    fn record(&self, operation: &str, request: &[u8], response: Option<&[u8]>) {
        let request: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
        let response: Value = response
            .and_then(|body| serde_json::from_slice(body).ok())
            .unwrap_or(Value::Null);
        let mut state = self.lock();
        let mut usage = Usage {
            calls: 1.0,
            ..Usage::default()
        };
        if self.service == "sqs" {
            usage.sqs_billed = sqs_billed(&request);
        } else {
            state.dynamodb_responses += 1;
            if let Some(reported) = response.get("ConsumedCapacity") {
                state.with_consumed_capacity += 1;
                let units: f64 = match reported {
                    Value::Array(tables) => tables.iter().filter_map(|table| table["CapacityUnits"].as_f64()).sum(),
                    table => table["CapacityUnits"].as_f64().unwrap_or(0.0),
                };
                *state.reported.entry(operation.to_owned()).or_default() += units;
            }
            self.dynamodb(&mut state, operation, &request, &response, &mut usage);
        }
        state.bill.entry(operation.to_owned()).or_default().add(usage);
    }

    fn key_of(&self, table: &str, item: &Value) -> String {
        let key = item
            .get(self.key_attribute)
            .and_then(|value| value.get("S"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        format!("{table}/{key}")
    }

    fn write(&self, state: &mut State, table: &str, item: &Value) -> f64 {
        let key = self.key_of(table, item);
        let bytes = item_size(item);
        let old = state.sizes.insert(key.clone(), bytes).unwrap_or(0);
        state.written.push(Written {
            key: key.rsplit('/').next().unwrap_or_default().to_owned(),
            bytes,
        });
        write_units(bytes.max(old))
    }

    fn touch(&self, state: &mut State, table: &str, key: &Value, delete: bool) -> f64 {
        let key = self.key_of(table, key);
        let old = if delete {
            state.sizes.remove(&key)
        } else {
            state.sizes.get(&key).copied()
        };
        // An item this meter never saw written counts as the minimum.
        write_units(old.unwrap_or(0))
    }

    fn dynamodb(&self, state: &mut State, operation: &str, request: &Value, response: &Value, usage: &mut Usage) {
        let table_of = |value: &Value| value.get("TableName").and_then(Value::as_str).unwrap_or("?").to_owned();
        match operation {
            "PutItem" => usage.wru += self.write(state, &table_of(request), &request["Item"]),
            "UpdateItem" | "DeleteItem" => {
                usage.wru += self.touch(state, &table_of(request), &request["Key"], operation == "DeleteItem");
            }
            "TransactWriteItems" => {
                for action in request["TransactItems"].as_array().into_iter().flatten() {
                    let units = if let Some(put) = action.get("Put") {
                        self.write(state, &table_of(put), &put["Item"])
                    } else if let Some(delete) = action.get("Delete") {
                        self.touch(state, &table_of(delete), &delete["Key"], true)
                    } else if let Some(update) = action.get("Update") {
                        self.touch(state, &table_of(update), &update["Key"], false)
                    } else if let Some(check) = action.get("ConditionCheck") {
                        self.touch(state, &table_of(check), &check["Key"], false)
                    } else {
                        0.0
                    };
                    usage.wru += 2.0 * units;
                }
            }
            "BatchWriteItem" => {
                for (table, requests) in request["RequestItems"].as_object().into_iter().flatten() {
                    for write in requests.as_array().into_iter().flatten() {
                        if let Some(put) = write.get("PutRequest") {
                            usage.wru += self.write(state, table, &put["Item"]);
                        } else if let Some(delete) = write.get("DeleteRequest") {
                            usage.wru += self.touch(state, table, &delete["Key"], true);
                        }
                    }
                }
            }
            "BatchGetItem" => {
                for (table, wanted) in request["RequestItems"].as_object().into_iter().flatten() {
                    let factor = if wanted["ConsistentRead"].as_bool() == Some(true) {
                        1.0
                    } else {
                        0.5
                    };
                    let keys = wanted["Keys"].as_array().map_or(0, Vec::len);
                    let unprocessed = response["UnprocessedKeys"][table]["Keys"]
                        .as_array()
                        .map_or(0, Vec::len);
                    let found: Vec<&Value> = response["Responses"][table].as_array().into_iter().flatten().collect();
                    let absent = keys.saturating_sub(unprocessed + found.len());
                    let found_units: f64 = found.iter().map(|item| read_units(item_size(item))).sum();
                    usage.rru += factor * (found_units + absent as f64);
                }
            }
            "GetItem" => {
                let factor = if request["ConsistentRead"].as_bool() == Some(true) {
                    1.0
                } else {
                    0.5
                };
                usage.rru += factor * response.get("Item").map_or(1.0, |item| read_units(item_size(item)));
            }
            _ => {}
        }
    }
}

/// DynamoDB write units for an item of `bytes` (at least one).
pub fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// DynamoDB strongly consistent read units for an item of `bytes` (at least one).
pub fn read_units(bytes: usize) -> f64 {
    bytes.div_ceil(4096).max(1) as f64
}

/// The size of an item in DynamoDB JSON, by DynamoDB's rules: each attribute's name
/// plus its value (strings and binaries by length, numbers about one byte per two
/// digits plus one, booleans and nulls one byte, lists and maps 3 bytes plus one byte
/// per element).
pub fn item_size(item: &Value) -> usize {
    item.as_object()
        .map(|attributes| {
            attributes
                .iter()
                .map(|(name, value)| name.len() + value_size(value))
                .sum()
        })
        .unwrap_or(0)
}

fn number_size(digits: &str) -> usize {
    let significant = digits.chars().filter(char::is_ascii_digit).count();
    significant.div_ceil(2) + 1
}

fn binary_size(base64: &str) -> usize {
    let padding = base64.chars().rev().take_while(|c| *c == '=').count();
    (base64.len() / 4 * 3).saturating_sub(padding)
}

fn value_size(value: &Value) -> usize {
    let Some((kind, inner)) = value.as_object().and_then(|object| object.iter().next()) else {
        return 0;
    };
    let strings = || inner.as_array().into_iter().flatten().filter_map(Value::as_str);
    match kind.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(0, number_size),
        "B" => inner.as_str().map_or(0, binary_size),
        "BOOL" | "NULL" => 1,
        "SS" => strings().map(str::len).sum(),
        "NS" => strings().map(number_size).sum(),
        "BS" => strings().map(binary_size).sum(),
        "L" => {
            3 + inner
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| 1 + value_size(v))
                .sum::<usize>()
        }
        "M" => {
            3 + inner
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, v)| 1 + name.len() + value_size(v))
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// SQS billed requests of one call: one per started 64 KB of its messages' payload
/// (bodies and attributes), at least one.
fn sqs_billed(request: &Value) -> f64 {
    let message = |message: &Value| -> usize {
        let body = message["MessageBody"].as_str().map_or(0, str::len);
        let attributes: usize = message["MessageAttributes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, attribute)| {
                name.len()
                    + attribute["DataType"].as_str().map_or(0, str::len)
                    + attribute["StringValue"].as_str().map_or(0, str::len)
                    + attribute["BinaryValue"].as_str().map_or(0, binary_size)
            })
            .sum();
        body + attributes
    };
    let payload: usize = match request.get("Entries").and_then(Value::as_array) {
        Some(entries) => entries.iter().map(message).sum(),
        None => message(request),
    };
    payload.div_ceil(64 * 1024).max(1) as f64
}

impl Intercept for WireMeter {
    fn name(&self) -> &'static str {
        "WireMeter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let operation = operation_of(request.headers().get("x-amz-target"));
        let body = request.body().bytes().unwrap_or_default().to_vec();
        self.lock()
            .pending
            .entry(self.service)
            .or_default()
            .push_back((operation, body));
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let pending = self.lock().pending.get_mut(self.service).and_then(VecDeque::pop_front);
        let Some((operation, request)) = pending else {
            return Ok(());
        };
        self.record(&operation, &request, context.response().body().bytes());
        Ok(())
    }
}
