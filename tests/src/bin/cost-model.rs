//! The cost model: AWS requests, capacity units and dollars per million transactions,
//! for this outbox (counted on the wire on the emulators; the transactional request path
//! and, issue 21, entity mode's change to an existing item and its create of a new one
//! whose key it read) and, derived from their
//! documented call patterns, NServiceBus's transactional session on DynamoDB and a
//! DynamoDB Streams relay.
//!
//! `cargo run -p outbox-tests --bin cost-model [-- --batch-size N] [--traced]` (`--traced`:
//! every message stores its trace context, as with span export on)
//!
//! Exits non-zero if a count on the wire differs from the code's call pattern.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use outbox::consumer::in_order::{applied_name, position_key};
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::control::{ControlPath, MAX_ATTEMPTS};
use outbox::ports::{ExpectedVersion, ItemKey, RandomIds};
use outbox::protocol::{Message, Position, TxnId, MESSAGE_ID_ATTRIBUTE};
use outbox::request::{Committed, InlineDispatch, Outbox, Settlement};
use outbox::settings::Timing;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::Backend;
use outbox_tests::cost::{item_size, merge, read_units, write_units, Bill, Usage, WireMeter, Written};
use outbox_tests::emulator::emulator;
use serde_json::{json, Value};

/// us-east-1 list prices (USD), free tiers ignored.
const PRICES_AS_OF: &str = "list prices as of 2026-03 (unchanged since DynamoDB's on-demand price cut of \
     2024-11-01), from aws.amazon.com/dynamodb/pricing/on-demand, aws.amazon.com/sqs/pricing and \
     aws.amazon.com/lambda/pricing (as quoted in stored copies: airbyte.com 'DynamoDB pricing', \
     cloudburn.io 'Amazon SQS Pricing (2026)', cloudchipr.com 'AWS Lambda pricing'); free tiers ignored";
const PER_MILLION_WRU: f64 = 0.625;
const PER_MILLION_RRU: f64 = 0.125;
const PER_MILLION_SQS: f64 = 0.40;
const PER_MILLION_LAMBDA: f64 = 0.20;
const PER_GB_SECOND_ARM: f64 = 0.000_013_333_4;

/// Issue 21's goal: a committed transaction with one message in entity mode costs at most
/// this many dollars per million (worker batch 1 and 10 both shown).
const GOAL_ENTITY_DOLLARS: f64 = 3.0;

/// Modelled, not measured: function memory (template.yaml: both functions 256 MB, arm64)
/// and durations. The API's are the request-path benchmark's p50 at AWS-modelled latencies
/// (38.7 ms inline off, 56.6 ms inline on, when this model was made); the peers' are the same latencies
/// summed for their calls plus the same 5.7 ms of overhead (NServiceBus: read 5 +
/// SendMessage 8 + TransactWriteItems 25, sequential; Streams relay: read 5 + PutItem 8).
const MEMORY_GB: f64 = 0.25;
const API_MS_INLINE_OFF: f64 = 38.7;
const API_MS_INLINE_ON: f64 = 56.6;
/// Entity mode (issue 21): the request-path benchmark's p50 of (f) outbox-entity (inline
/// off: the control send overlapped with the read, one UpdateItem) and (g)
/// outbox-entity-inline (inline on: + SendMessageBatch, PutItem, UpdateItem), release build
/// without LTO, 2026-11-26 (docs/BENCHMARKS.md, "Request path"; three runs 15.80, 15.81,
/// 15.80 and 42.09, 42.11, 42.05 ms). Kept since the dispatch settles in one write instead
/// of the PutItem and the UpdateItem (issue 29): an overestimate of the GB-seconds, which
/// the invocation holds until the dispatch ends, after the answer too.
const API_MS_ENTITY_INLINE_OFF: f64 = 15.8;
const API_MS_ENTITY_INLINE_ON: f64 = 42.1;
const API_MS_NSERVICEBUS: f64 = 43.7;
/// A request refused after its read, with nothing of its transaction sent: the read (5)
/// plus the same 5.7 ms of overhead.
const API_MS_REFUSED: f64 = 10.7;
const API_MS_STREAMS: f64 = 18.7;
const WORKER_MS_PER_BATCH: f64 = 20.0;
/// A consumed message's handling, modelled the same way (the same latencies summed, plus
/// 5.7 ms): ours reads its record (5 ms) and the item (5), TransactWriteItems (25),
/// SendMessageBatch (8), BatchWriteItem (8); NServiceBus's outbox Query (5), read (5),
/// TransactWriteItems (25), send (8), SetAsDispatched (8), delete operations (8);
/// Powertools' lock PutItem (8), read (5), the business PutItem (8), send (8), the
/// record's completion (8).
const CONSUMER_MS: f64 = 56.7;
const CONSUMER_MS_NSERVICEBUS: f64 = 64.7;
const CONSUMER_MS_POWERTOOLS: f64 = 42.7;
/// A copy: its record's read 5 + 5.7.
const CONSUMER_MS_COPY: f64 = 10.7;
/// Entity mode: the entity's GetItem (5) and the dedup record's read (5), the entity's
/// PutItem (8), SendMessageBatch (8), the dedup record's PutItem (8), the entry's
/// UpdateItem (8), plus 5.7.
const CONSUMER_MS_ENTITY: f64 = 47.7;
/// A copy in entity mode: its two reads 5 + 5 + 5.7.
const CONSUMER_MS_ENTITY_COPY: f64 = 15.7;
/// In order (`Handler::in_order`), the transactional mode: [`CONSUMER_MS`] and the
/// gate's read of the position item (5).
const CONSUMER_MS_IN_ORDER: f64 = 61.7;
/// In order in entity mode, a message that writes nothing: the entity's GetItem (5), the
/// dedup record's read (5), the position's UpdateItem (8), the dedup record's PutItem (8),
/// plus 5.7. (In order in entity mode, a message that writes makes the calls of
/// [`CONSUMER_MS_ENTITY`].)
const CONSUMER_MS_IN_ORDER_ALONE: f64 = 31.7;
/// Powertools' idempotency record: its key hash, status, expiry and the stored result
/// (an assumption, like NServiceBus's headers).
const POWERTOOLS_RECORD_BYTES: usize = 300;

/// NServiceBus transport headers stored with each outgoing operation (message id,
/// conversation and correlation ids, enclosed types, time sent, ...): an assumption.
const NSERVICEBUS_HEADER_BYTES: usize = 700;

/// Calls by operation, as the counter reports them (operations not called left out).
/// What a copy of a consumed message reads: its dedup record, and in entity mode its
/// entity first.
fn copy_reads(entity: bool) -> BTreeMap<String, usize> {
    if entity {
        counts(&[("BatchGetItem", 1), ("GetItem", 1)])
    } else {
        counts(&[("BatchGetItem", 1)])
    }
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(name, count)| ((*name).to_owned(), *count))
        .collect()
}

struct Rig {
    backend: Backend,
    counter: CallCounter,
    meter: WireMeter,
    /// A client on the same table that is neither counted nor metered: reads items as
    /// stored, to size them.
    raw: aws_sdk_dynamodb::Client,
}

/// Sizes (bytes, by DynamoDB's rules, read as stored) of the order an entity-mode change
/// is measured on, and the write units DynamoDB charges its `UpdateItem` calls for them.
#[derive(Debug, Clone, Copy)]
struct EntitySizes {
    /// Before the change: the order, with its `outbox` map empty.
    before: usize,
    /// Just after the commit: the order changed, the transaction's entry in its map. Read
    /// inline off; inline on (the entry is gone before the commit returns), the size after
    /// plus the entry the commit's request carried (inline off checks that the two agree).
    with_entry: usize,
    /// After the entry settled: its sent mark in the item instead.
    after: usize,
    /// The metered write units of the flow's `UpdateItem` calls, before any correction.
    metered_wru: f64,
}

impl EntitySizes {
    /// DynamoDB's rule for `UpdateItem`: the larger of the item's size before and after.
    fn commit_wru(&self) -> f64 {
        write_units(self.before.max(self.with_entry))
    }

    fn removal_wru(&self) -> f64 {
        write_units(self.with_entry.max(self.after))
    }
}

/// What one flow cost on the wire.
struct Flow {
    request: Bill,
    control: Bill,
    checks: usize,
    written: Vec<Written>,
}

impl Rig {
    fn snapshot(&self) -> (BTreeMap<String, usize>, Bill) {
        (self.counter.counts(), self.meter.bill())
    }

    fn reset(&self) {
        self.counter.reset();
        self.meter.reset();
    }

    /// Runs the control path on `txn_id`'s control messages as they come due until it is
    /// settled; returns the calls and usage of the control path (the receives and deletes,
    /// which the event source mapping makes, left out) and the control messages handled.
    async fn settle(
        &self,
        control: &ControlPath,
        txn_id: TxnId,
        first_check: Duration,
    ) -> (BTreeMap<String, usize>, Bill, usize) {
        let mut calls: BTreeMap<String, usize> = BTreeMap::new();
        let mut bill = Bill::new();
        let handled = self
            .backend
            .handle_until_settled(control, txn_id, first_check, |before| {
                if before {
                    self.reset();
                } else {
                    let (seen, used) = self.snapshot();
                    for (operation, count) in seen {
                        *calls.entry(operation).or_default() += count;
                    }
                    merge(&mut bill, &used);
                }
            })
            .await;
        (calls, bill, handled)
    }

    /// A committed transaction: one read of an absent order, its put, `messages` events.
    async fn commit(&self, outbox: &Outbox, control: &ControlPath, messages: usize, inline: bool, n: usize) -> Flow {
        self.reset();
        let mut txn = outbox.begin().await.expect("begin");
        let key = format!("ORDER#{n}").parse().unwrap();
        assert!(txn.get(&key).await.expect("read").is_none());
        txn.put(key, order(n), ExpectedVersion::Absent);
        for position in 0..messages {
            txn.emit(Message::json("events".parse().unwrap(), &event(n, position)).unwrap());
        }
        let committed = txn.commit().await.expect("commit");
        let (request_calls, request) = self.snapshot();
        let written = self.meter.written();
        let (control_calls, control_bill, checks) = self
            .settle(control, committed.txn_id, Timing::default().first_check_delay)
            .await;
        let mut expected_request = vec![("BatchGetItem", 1), ("SendMessage", 1), ("TransactWriteItems", 1)];
        if inline {
            assert_eq!(committed.inline, InlineDispatch::Dispatched);
            expected_request.extend([("BatchWriteItem", 1), ("SendMessageBatch", 1)]);
            assert_eq!(control_calls, counts(&[("BatchGetItem", 1)]), "control path, inline on");
        } else {
            assert_eq!(
                control_calls,
                counts(&[("BatchGetItem", 1), ("BatchWriteItem", 1), ("SendMessageBatch", 1)]),
                "control path, inline off"
            );
        }
        assert_eq!(
            request_calls,
            counts(&expected_request),
            "request path, inline {inline}"
        );
        assert_eq!(checks, 1, "one control message");
        assert_eq!(
            self.backend.drain(&"events".parse().unwrap()).await.len(),
            messages,
            "events published"
        );
        Flow {
            request,
            control: control_bill,
            checks,
            written,
        }
    }

    /// A transaction abandoned after `begin` and its reads (a 404, 409 or 412 they
    /// decided). By default its control message goes out with the commit, so nothing of
    /// it was sent: the abandon writes nothing and nothing reaches the control path. Sent
    /// early (`send_control`, as every `begin` did before), its tombstone is written in
    /// the request path and its control message finds it settled.
    async fn abandon(&self, outbox: &Outbox, control: &ControlPath, sent_early: bool) -> Flow {
        self.reset();
        let txn = outbox.begin().await.expect("begin");
        let id = txn.id();
        if !sent_early {
            assert_eq!(txn.abandon().await, Settlement::NothingSent);
            let (request_calls, request) = self.snapshot();
            assert_eq!(request_calls, counts(&[]), "refused after its reads: request path");
            return Flow {
                request,
                control: Bill::new(),
                checks: 0,
                written: self.meter.written(),
            };
        }
        txn.send_control().await.expect("the control message");
        assert_eq!(txn.abandon().await, Settlement::Tombstoned);
        let (request_calls, request) = self.snapshot();
        let written = self.meter.written();
        let (control_calls, control_bill, checks) = self.settle(control, id, Timing::default().first_check_delay).await;
        assert_eq!(
            request_calls,
            counts(&[("PutItem", 1), ("SendMessage", 1)]),
            "abandoned: request path"
        );
        assert_eq!(control_calls, counts(&[("BatchGetItem", 1)]), "abandoned: control path");
        assert_eq!(checks, 1);
        Flow {
            request,
            control: control_bill,
            checks,
            written,
        }
    }

    /// Entity mode (issue 28): a transaction begun on an existing order, its control
    /// message sent, and abandoned before its commit began (`settled`: the request path
    /// writes its tombstone record, no fence, since its commit is refused from then on),
    /// or one whose commit may be under way (a commit of unknown outcome, modelled by
    /// `Outbox::abandon_in` naming the order for a transaction the request path no longer
    /// holds): the fence, one `TransactWriteItems` of two actions. The worker then reads
    /// the record, and the order for an entry beside the tombstone; nothing is pruned
    /// later. (Abandoned before its control message was sent, as a refusal decided by the
    /// reads is by default, it costs nothing: see [`Rig::abandon`].)
    async fn abandon_in_entity(&self, outbox: &Outbox, control: &ControlPath, fenced: bool, n: usize) -> Flow {
        let key: ItemKey = format!("ORDER#{n}").parse().unwrap();
        let first_check = Timing::default().first_check_delay;
        let mut create = outbox.begin().await.expect("begin");
        create.put(key.clone(), order(n), ExpectedVersion::Absent);
        let created = create.commit().await.expect("the create");
        self.backend
            .handle_until_settled(control, created.txn_id, first_check, |_| {})
            .await;
        self.reset();
        let txn = outbox.begin_entity(key.clone()).await.expect("begin in entity mode");
        let id = txn.id();
        txn.send_control().await.expect("the control message");
        let settlement = if fenced {
            drop(txn);
            outbox.abandon_in(id, Some(&key), None).await
        } else {
            txn.abandon().await
        };
        assert_eq!(settlement, Settlement::Tombstoned);
        let (request_calls, request) = self.snapshot();
        let written = self.meter.written();
        let (control_calls, control_bill, checks) = self.settle(control, id, first_check).await;
        let write = if fenced { "TransactWriteItems" } else { "PutItem" };
        assert_eq!(
            request_calls,
            counts(&[(write, 1), ("SendMessage", 1)]),
            "entity mode, abandoned (fenced: {fenced}): request path"
        );
        assert_eq!(
            control_calls,
            counts(&[("BatchGetItem", 1), ("GetItem", 1)]),
            "entity mode, abandoned (fenced: {fenced}): control path"
        );
        Flow {
            request,
            control: control_bill,
            checks,
            written,
        }
    }

    /// A transaction dropped after its control message was sent (a crash), left to that
    /// message.
    async fn drop_txn(&self, outbox: &Outbox, control: &ControlPath, timing: Timing) -> Flow {
        self.reset();
        let txn = outbox.begin().await.expect("begin");
        txn.send_control().await.expect("the control message");
        let id = txn.id();
        drop(txn);
        let (request_calls, request) = self.snapshot();
        let (control_calls, control_bill, checks) = self.settle(control, id, timing.first_check_delay).await;
        let written = self.meter.written();
        let (expected_checks, deferrals) = checks_for(control, timing);
        assert_eq!(request_calls, counts(&[("SendMessage", 1)]), "dropped: request path");
        assert_eq!(
            control_calls,
            counts(&[
                ("BatchGetItem", expected_checks),
                ("PutItem", 1),
                ("SendMessage", deferrals)
            ]),
            "dropped: control path"
        );
        assert_eq!(checks, expected_checks);
        Flow {
            request,
            control: control_bill,
            checks,
            written,
        }
    }
}

impl Rig {
    /// `key`'s item as stored, read with the raw client (not counted, not metered).
    async fn stored_item(&self, key: &ItemKey) -> HashMap<String, AttributeValue> {
        let layout = self.backend.layout.as_ref().expect("on AWS");
        let output = self
            .raw
            .get_item()
            .table_name(&layout.table)
            .key(&layout.partition_key, AttributeValue::S(key.as_str().to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("a raw read");
        output.item.expect("the item exists")
    }

    /// The size of `key`'s item as stored, by DynamoDB's rules.
    async fn stored_size(&self, key: &ItemKey) -> usize {
        let item = self.stored_item(key).await;
        item_size(&Value::Object(
            item.iter()
                .map(|(name, value)| (name.clone(), dynamodb_json(value)))
                .collect(),
        ))
    }

    /// What transaction `txn_id`'s sent mark adds to `key`'s item as stored: one element
    /// of the `outbox_sent` map, its name (the transaction id) and its value.
    async fn mark_bytes(&self, key: &ItemKey, txn_id: TxnId) -> usize {
        let item = self.stored_item(key).await;
        let mark = item
            .get("outbox_sent")
            .and_then(|sent| sent.as_m().ok())
            .and_then(|sent| sent.get(&txn_id.to_string()))
            .expect("the transaction's sent mark");
        1 + item_size(&json!({ txn_id.to_string(): dynamodb_json(mark) }))
    }

    /// What the entry of the `UpdateItem` commit just sent adds to its item: one map
    /// element, its name (the transaction id) and its value, by DynamoDB's rules. A change
    /// sends the entry into the item's map (`:entry`); a create sends the map with the
    /// entry its one element (`:map`).
    fn entry_bytes(&self) -> usize {
        let commits: Vec<Value> = self
            .counter
            .bodies("UpdateItem")
            .iter()
            .filter_map(|body| serde_json::from_slice::<Value>(body).ok())
            .filter(|body| {
                let values = &body["ExpressionAttributeValues"];
                values.get(":entry").is_some() || values.get(":map").is_some()
            })
            .collect();
        assert_eq!(commits.len(), 1, "one entity-mode commit carrying its entry");
        let body = &commits[0];
        let values = &body["ExpressionAttributeValues"];
        let (name, entry) = match values.get(":entry") {
            Some(entry) => (
                body["ExpressionAttributeNames"]["#txn"]
                    .as_str()
                    .expect("the entry's name")
                    .to_owned(),
                entry.clone(),
            ),
            None => {
                let map = values[":map"]["M"].as_object().expect("the create's outbox map");
                assert_eq!(map.len(), 1, "the create's map holds its entry alone");
                let (name, entry) = map.iter().next().expect("one entry");
                (name.clone(), entry.clone())
            }
        };
        1 + item_size(&json!({ name: entry }))
    }

    /// The request path changing an existing order in entity mode, as the orders API's
    /// "add a line" does: `begin_entity(order)`, the read, a put at the version read,
    /// `messages` events, the commit.
    async fn add_line(&self, outbox: &Outbox, key: &ItemKey, n: usize, messages: usize) -> Committed {
        let mut txn = outbox.begin_entity(key.clone()).await.expect("begin in entity mode");
        let read = txn.get(key).await.expect("read").expect("the order exists");
        let mut data = read.data;
        data["items"]
            .as_array_mut()
            .expect("the order's lines")
            .push(json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 499}));
        data["total_cents"] = json!(data["total_cents"].as_u64().expect("a total") + 499);
        txn.put(key.clone(), data, ExpectedVersion::Exactly(read.version));
        for position in 0..messages {
            txn.emit(Message::json("events".parse().unwrap(), &line_added(n, position)).unwrap());
        }
        txn.commit().await.expect("commit")
    }

    /// A committed transaction in entity mode (issue 21, docs/ENTITY_MODE.md): a change to
    /// an existing order, in its steady state. The order is created in the transactional
    /// form (a plain `begin` and a blind create; a create begun in entity mode commits in
    /// one write, [`Rig::create_in_entity`]) and settled; one entity-mode
    /// change is made and settled first, because the first entity commit of an item
    /// written in the transactional form takes two `UpdateItem` (the item has no `outbox`
    /// map yet: the first form's condition fails, the second sets the map); the next change
    /// is measured. Any `TransactWriteItems` (a fallback to the transactional form) fails the
    /// call-count assertions.
    async fn commit_in_entity(
        &self,
        outbox: &Outbox,
        control: &ControlPath,
        messages: usize,
        inline: bool,
        n: usize,
    ) -> (Flow, EntitySizes) {
        let key: ItemKey = format!("ORDER#{n}").parse().unwrap();
        let events = "events".parse().unwrap();
        let first_check = Timing::default().first_check_delay;
        let mut create = outbox.begin().await.expect("begin");
        create.put(key.clone(), order(n), ExpectedVersion::Absent);
        let created = create.commit().await.expect("the create");
        self.backend
            .handle_until_settled(control, created.txn_id, first_check, |_| {})
            .await;

        self.reset();
        let first = self.add_line(outbox, &key, n, messages).await;
        let first_calls = self.counter.counts();
        assert_eq!(
            first_calls.get("UpdateItem").copied(),
            Some(2 + usize::from(inline)),
            "entity mode, the first change of an item written in the transactional form: two UpdateItem \
             (no map, then the map){}: {first_calls:?}",
            if inline { ", then the entry's removal" } else { "" }
        );
        assert!(!first_calls.contains_key("TransactWriteItems"), "{first_calls:?}");
        self.backend
            .handle_until_settled(control, first.txn_id, first_check, |_| {})
            .await;
        assert_eq!(self.backend.drain(&events).await.len(), messages, "events published");

        let before = self.stored_size(&key).await;
        self.reset();
        let committed = self.add_line(outbox, &key, n, messages).await;
        let (request_calls, mut request) = self.snapshot();
        let written = self.meter.written();
        let entry = self.entry_bytes();
        let read_with_entry = if inline {
            None
        } else {
            Some(self.stored_size(&key).await)
        };
        let (control_calls, mut control_bill, checks) = self.settle(control, committed.txn_id, first_check).await;
        let after = self.stored_size(&key).await;
        // Settled, the entry left and the transaction's sent mark stayed.
        let with_entry = after + entry - self.mark_bytes(&key, committed.txn_id).await;
        if let Some(read) = read_with_entry {
            assert_eq!(read, with_entry, "the entry's size, read and derived");
        }
        let mut expected_request = vec![("BatchGetItem", 1), ("SendMessage", 1), ("UpdateItem", 1)];
        if inline {
            assert_eq!(committed.inline, InlineDispatch::Dispatched);
            expected_request = vec![
                ("BatchGetItem", 1),
                ("SendMessage", 1),
                ("SendMessageBatch", 1),
                ("UpdateItem", 2),
            ];
            assert_eq!(
                control_calls,
                counts(&[("GetItem", 1)]),
                "entity mode, control path, inline on: the entity read, its sent mark found"
            );
        } else {
            assert_eq!(committed.inline, InlineDispatch::Off);
            assert_eq!(
                control_calls,
                counts(&[
                    ("BatchGetItem", 1),
                    ("GetItem", 1),
                    ("SendMessageBatch", 1),
                    ("UpdateItem", 1)
                ]),
                "entity mode, control path, inline off: the entity read (its entry), the record read (a tombstone \
                 beside it?), publish, the entry settled into its sent mark"
            );
        }
        assert_eq!(
            request_calls,
            counts(&expected_request),
            "entity mode, request path, inline {inline}"
        );
        assert_eq!(checks, 1, "one control message");
        assert_eq!(self.backend.drain(&events).await.len(), messages, "events published");

        // DynamoDB charges an UpdateItem by the larger of the item's size before and after
        // it; the meter charges the size it last saw put (the order's create). The commit
        // is in the request; the removal is in the request inline, in the control path
        // otherwise.
        let mut sizes = EntitySizes {
            before,
            with_entry,
            after,
            metered_wru: 0.0,
        };
        let (commit_wru, removal_wru) = (sizes.commit_wru(), sizes.removal_wru());
        let updates = |bill: &mut Bill| bill.get_mut("UpdateItem").map(|usage| std::mem::take(&mut usage.wru));
        sizes.metered_wru = updates(&mut request).unwrap_or(0.0) + updates(&mut control_bill).unwrap_or(0.0);
        if inline {
            request.get_mut("UpdateItem").expect("the commit").wru = commit_wru + removal_wru;
        } else {
            request.get_mut("UpdateItem").expect("the commit").wru = commit_wru;
            control_bill.get_mut("UpdateItem").expect("the removal").wru = removal_wru;
        }
        (
            Flow {
                request,
                control: control_bill,
                checks,
                written,
            },
            sizes,
        )
    }
}

impl Rig {
    /// A create in entity mode: `begin_entity` on a new order; with `read`, the read of
    /// its key (no item) and its put with `ExpectedVersion::Absent`, which the read pins
    /// to the key's version; without, its put expecting a key never written
    /// (`ExpectedVersion::AbsentAt(0)`, as the orders API places an order under a fresh
    /// id); one event, the commit: one conditional `UpdateItem` creating the order with
    /// its outbox entry inside, no `TransactWriteItems` (the call counts fail on one). The
    /// order is new, so this is every create's cost, not a steady state.
    async fn create_in_entity(
        &self,
        outbox: &Outbox,
        control: &ControlPath,
        inline: bool,
        read: bool,
        n: usize,
    ) -> (Flow, EntitySizes) {
        let key: ItemKey = format!("ORDER#{n}").parse().unwrap();
        let events = "events".parse().unwrap();
        let first_check = Timing::default().first_check_delay;
        self.reset();
        let mut txn = outbox.begin_entity(key.clone()).await.expect("begin in entity mode");
        let expected = if read {
            assert!(txn.get(&key).await.expect("read").is_none(), "the order is new");
            ExpectedVersion::Absent
        } else {
            ExpectedVersion::AbsentAt(0)
        };
        txn.put(key.clone(), order(n), expected);
        txn.emit(Message::json("events".parse().unwrap(), &event(n, 0)).unwrap());
        let committed = txn.commit().await.expect("commit");
        let (request_calls, mut request) = self.snapshot();
        let written = self.meter.written();
        let entry = self.entry_bytes();
        let read_with_entry = if inline {
            None
        } else {
            Some(self.stored_size(&key).await)
        };
        let (control_calls, mut control_bill, checks) = self.settle(control, committed.txn_id, first_check).await;
        let after = self.stored_size(&key).await;
        let with_entry = after + entry - self.mark_bytes(&key, committed.txn_id).await;
        if let Some(read) = read_with_entry {
            assert_eq!(read, with_entry, "the entry's size, read and derived");
        }
        if inline {
            assert_eq!(committed.inline, InlineDispatch::Dispatched);
            assert_eq!(
                request_calls,
                counts(&[
                    ("BatchGetItem", usize::from(read)),
                    ("SendMessage", 1),
                    ("SendMessageBatch", 1),
                    ("UpdateItem", 2)
                ]),
                "entity mode, a create (read first: {read}), request path, inline on: the read, the commit, the \
                 publish, the settle"
            );
            assert_eq!(
                control_calls,
                counts(&[("GetItem", 1)]),
                "entity mode, a create, control path, inline on: the entity read, its sent mark found"
            );
        } else {
            assert_eq!(committed.inline, InlineDispatch::Off);
            assert_eq!(
                request_calls,
                counts(&[
                    ("BatchGetItem", usize::from(read)),
                    ("SendMessage", 1),
                    ("UpdateItem", 1)
                ]),
                "entity mode, a create (read first: {read}), request path, inline off"
            );
            assert_eq!(
                control_calls,
                counts(&[
                    ("BatchGetItem", 1),
                    ("GetItem", 1),
                    ("SendMessageBatch", 1),
                    ("UpdateItem", 1)
                ]),
                "entity mode, a create, control path, inline off"
            );
        }
        assert_eq!(checks, 1, "one control message");
        assert_eq!(self.backend.drain(&events).await.len(), 1, "the event published");

        // The meter never saw the order put (an UpdateItem created it), so it charges
        // both UpdateItem the minimum; DynamoDB's rule: the commit by the order with its
        // entry (nothing before it), the settle by the larger of that and the order after.
        let mut sizes = EntitySizes {
            before: 0,
            with_entry,
            after,
            metered_wru: 0.0,
        };
        let (commit_wru, removal_wru) = (sizes.commit_wru(), sizes.removal_wru());
        let updates = |bill: &mut Bill| bill.get_mut("UpdateItem").map(|usage| std::mem::take(&mut usage.wru));
        sizes.metered_wru = updates(&mut request).unwrap_or(0.0) + updates(&mut control_bill).unwrap_or(0.0);
        if inline {
            request.get_mut("UpdateItem").expect("the commit").wru = commit_wru + removal_wru;
        } else {
            request.get_mut("UpdateItem").expect("the commit").wru = commit_wru;
            control_bill.get_mut("UpdateItem").expect("the settle").wru = removal_wru;
        }
        (
            Flow {
                request,
                control: control_bill,
                checks,
                written,
            },
            sizes,
        )
    }
}

/// An attribute value in DynamoDB JSON (`{"S": ...}`), as `item_size` reads it.
fn dynamodb_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(text) => json!({ "S": text }),
        AttributeValue::N(number) => json!({ "N": number }),
        AttributeValue::B(blob) => json!({ "B": aws_smithy_types::base64::encode(blob.as_ref()) }),
        AttributeValue::Bool(flag) => json!({ "BOOL": flag }),
        AttributeValue::Null(flag) => json!({ "NULL": flag }),
        AttributeValue::Ss(texts) => json!({ "SS": texts }),
        AttributeValue::Ns(numbers) => json!({ "NS": numbers }),
        AttributeValue::Bs(blobs) => json!({
            "BS": blobs.iter().map(|blob| aws_smithy_types::base64::encode(blob.as_ref())).collect::<Vec<_>>()
        }),
        AttributeValue::L(values) => json!({ "L": values.iter().map(dynamodb_json).collect::<Vec<_>>() }),
        AttributeValue::M(values) => json!({
            "M": values
                .iter()
                .map(|(name, value)| (name.clone(), dynamodb_json(value)))
                .collect::<serde_json::Map<String, Value>>()
        }),
        other => panic!("an attribute value this model does not size: {other:?}"),
    }
}

/// The handler of the consumer rows: one read of an absent item, its put, one message;
/// in entity mode when `entity`, the shipment being its entity; in order when `in_order`.
struct Ship {
    entity: bool,
    in_order: bool,
}

fn shipment_of(message: &Incoming) -> Result<(String, outbox::ports::ItemKey), HandlerError> {
    let order = message.json::<serde_json::Value>()?["order_id"]
        .as_str()
        .ok_or("no order")?
        .to_owned();
    let key = format!("SHIPMENT#{order}").parse()?;
    Ok((order, key))
}

#[async_trait::async_trait]
impl Handler for Ship {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let (order, key) = shipment_of(message)?;
        assert!(staging.get(&key).await?.is_none());
        staging.put(
            key,
            json!({"order_id": order, "items": 2, "status": "requested"}),
            ExpectedVersion::Absent,
        );
        staging.emit(Message::json(
            "events".parse()?,
            &json!({"type": "ShipmentRequested", "order_id": order, "items": 2}),
        )?);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<outbox::ports::ItemKey>, HandlerError> {
        Ok(self
            .entity
            .then(|| shipment_of(message))
            .transpose()?
            .map(|(_, key)| key))
    }

    fn in_order(&self) -> bool {
        self.in_order
    }
}

/// The handler of the in-order row that writes nothing: in entity mode, in order, it
/// reads its shipment, finds it requested already, and writes and sends nothing.
struct AlreadyRequested;

#[async_trait::async_trait]
impl Handler for AlreadyRequested {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let (_, key) = shipment_of(message)?;
        assert!(staging.get(&key).await?.is_some(), "the shipment requested already");
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(Some(shipment_of(message)?.1))
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// Message `seq` of `entity`'s chain on `events` with `body`, as the queue delivers it:
/// with its id and the position attributes the producer stamps (each transaction of the
/// entity sending one message to `events`: the entity at version `seq` after it, at
/// `seq - 1` after the previous one).
fn placed(entity: &ItemKey, seq: u64, body: &Value) -> (Position, Delivery) {
    let position = Position {
        producer: None,
        entity: entity.clone(),
        chain: "events".parse().unwrap(),
        seq,
        version: seq,
        after: seq - 1,
        previous: None,
    };
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{}:0", TxnId::new_v7()));
    let delivery = Delivery {
        message_id: format!("sqs-{entity}-{seq}"),
        receipt: String::new(),
        body: serde_json::to_string(body).unwrap(),
        attributes,
        group_id: None,
        receive_count: 1,
        trace_header: None,
    };
    (position, delivery)
}

/// What the in-order rows cost on the wire.
struct InOrder {
    /// Seq 1 of an order consumed: the handler of the consumer rows.
    processed: Bill,
    /// In entity mode, seq 2 of the same order consumed by [`AlreadyRequested`]: the
    /// position moves alone.
    alone: Option<Bill>,
    /// In entity mode, the shipment's sizes (bytes, by DynamoDB's rules): with its entry
    /// and the position, after the entry's removal, after seq 2's position.
    shipment: Option<[usize; 3]>,
}

impl Rig {
    /// One incoming event consumed, then a copy of it: the consumer's calls and usage on
    /// the wire for each, in the transactional mode or in entity mode.
    async fn consume(&self, entity: bool) -> (Bill, Bill) {
        let consumer = Consumer::new(
            "shipping".parse().unwrap(),
            ConsumerPorts {
                store: self.backend.store.clone(),
                publisher: self.backend.publisher.clone(),
                clock: self.backend.clock.clone(),
                ids: Arc::new(RandomIds),
            },
            Arc::new(Ship {
                entity,
                in_order: false,
            }),
            Duration::from_secs(19 * 24 * 3600),
        );
        let delivery = Delivery {
            message_id: "sqs-1".into(),
            receipt: String::new(),
            body: serde_json::to_string(&event(if entity { 10 } else { 9 }, 0)).unwrap(),
            attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{}:0", TxnId::new_v7()))]),
            group_id: None,
            receive_count: 1,
            trace_header: None,
        };
        self.reset();
        let first = consumer.consume(&delivery).await.expect("consumed");
        assert_eq!(first, ConsumeOutcome::Processed { messages: 1 });
        let (calls, processed) = self.snapshot();
        if entity {
            assert_eq!(
                calls,
                counts(&[
                    ("BatchGetItem", 2),
                    ("GetItem", 1),
                    ("PutItem", 1),
                    ("SendMessageBatch", 1),
                    ("UpdateItem", 2)
                ]),
                "entity mode: the entity's read, the dedup record's read, the missing entity's key read \
                 across its lives (the handler creates it), the entity's write (an UpdateItem, which keeps \
                 a vacant key's fence mark), the send, the dedup record's put, the entry's removal"
            );
        } else {
            assert_eq!(
                calls,
                counts(&[
                    ("BatchGetItem", 2),
                    ("BatchWriteItem", 1),
                    ("SendMessageBatch", 1),
                    ("TransactWriteItems", 1)
                ]),
                "a consumed message: its record read, the handler's read, the commit, the send, the mark"
            );
        }
        self.reset();
        assert_eq!(
            consumer.consume(&delivery).await.expect("a copy"),
            ConsumeOutcome::Duplicate
        );
        let (calls, duplicate) = self.snapshot();
        let copy_reads = copy_reads(entity);
        assert_eq!(calls, copy_reads, "a copy: its reads");
        assert_eq!(
            self.backend.drain(&"events".parse().unwrap()).await.len(),
            1,
            "published once"
        );
        (processed, duplicate)
    }

    /// The in-order consumer (`Handler::in_order`): seq 1 of an order's chain consumed by
    /// the handler of the consumer rows, then a copy of it; in entity mode, then seq 2
    /// of the same order, whose handler writes nothing. The calls and usage on the wire
    /// of seq 1 and (entity mode) of seq 2.
    async fn consume_in_order(&self, entity: bool) -> InOrder {
        let n = if entity { 24 } else { 23 };
        let consumer_of = |handler: Arc<dyn Handler>| {
            Consumer::new(
                "shipping".parse().unwrap(),
                ConsumerPorts {
                    store: self.backend.store.clone(),
                    publisher: self.backend.publisher.clone(),
                    clock: self.backend.clock.clone(),
                    ids: Arc::new(RandomIds),
                },
                handler,
                Duration::from_secs(19 * 24 * 3600),
            )
        };
        let consumer = consumer_of(Arc::new(Ship { entity, in_order: true }));
        let order: ItemKey = format!("ORDER#{n}").parse().unwrap();
        let (position, delivery) = placed(&order, 1, &event(n, 0));
        let shipment: ItemKey = format!("SHIPMENT#order-{n}").parse().unwrap();
        self.reset();
        let first = consumer.consume(&delivery).await.expect("consumed in order");
        assert_eq!(first, ConsumeOutcome::Processed { messages: 1 });
        let (calls, processed) = self.snapshot();
        let store = &self.backend.store;
        let mut sizes = [0; 3];
        let position_item = store
            .get_items(std::slice::from_ref(&position_key("shipping", &position)))
            .await
            .expect("a read of the position item");
        if entity {
            assert!(
                !calls.contains_key("TransactWriteItems"),
                "in order in entity mode: no transaction, got {calls:?}"
            );
            assert_eq!(
                calls,
                counts(&[
                    ("BatchGetItem", 3),
                    ("GetItem", 2),
                    ("PutItem", 1),
                    ("SendMessageBatch", 1),
                    ("UpdateItem", 2)
                ]),
                "in order, entity mode: the calls of the entity-mode consumer (the position read with the \
                 missing entity's key, moved by the entity's write), for a chain's first message in the \
                 key the position item a chain of the transactional mode continues from, and the look for \
                 a kept successor"
            );
            assert!(position_item.is_empty(), "in entity mode, no position item");
            let kept = store
                .get_entity(&shipment)
                .await
                .expect("a read of the shipment")
                .expect("the shipment")
                .applied;
            assert_eq!(
                kept.get(&applied_name("shipping", &position))
                    .map(|applied| applied.seq),
                Some(1),
                "the position kept in the shipment's key"
            );
            // The meter charges each UpdateItem on a key it never saw written the
            // minimum, 1 write unit: DynamoDB's figure too while the shipment with its
            // entry and its position stays within 1 KB.
            let settled = self.stored_size(&shipment).await;
            let with_entry = settled + self.entry_bytes();
            sizes = [with_entry, settled, 0];
            assert!(
                with_entry <= 1024,
                "the shipment with its entry and position, {with_entry} B, within 1 KB"
            );
        } else {
            assert_eq!(
                calls,
                counts(&[
                    ("BatchGetItem", 3),
                    ("BatchWriteItem", 1),
                    ("GetItem", 1),
                    ("SendMessageBatch", 1),
                    ("TransactWriteItems", 1)
                ]),
                "in order: its record read, the gate's read of the position item, the handler's read, the \
                 commit (the position moved in it), the send, the mark, and the look for a kept successor \
                 to apply next (none here)"
            );
            let applied = position_item
                .values()
                .next()
                .and_then(|item| item.data["applied"].as_u64());
            assert_eq!(applied, Some(1), "the position item moved by the commit");
        }
        self.reset();
        assert_eq!(
            consumer.consume(&delivery).await.expect("a copy"),
            ConsumeOutcome::Duplicate
        );
        let (calls, _) = self.snapshot();
        let mut copy_reads = copy_reads(entity);
        // A copy of an applied message looks for a kept successor too, as its first
        // delivery did.
        *copy_reads.entry("GetItem".to_owned()).or_default() += 1;
        assert_eq!(
            calls, copy_reads,
            "in order, a copy: the reads of a copy out of order (its record before the gate), and the look \
             for a kept successor"
        );
        let alone = if entity {
            let (second, delivery) = placed(&order, 2, &line_added(n, 1));
            self.reset();
            let outcome = consumer_of(Arc::new(AlreadyRequested))
                .consume(&delivery)
                .await
                .expect("seq 2 consumed in order");
            assert_eq!(outcome, ConsumeOutcome::Processed { messages: 0 });
            let (calls, alone) = self.snapshot();
            assert_eq!(
                calls,
                counts(&[("BatchGetItem", 1), ("GetItem", 2), ("PutItem", 1), ("UpdateItem", 1)]),
                "in order, entity mode, nothing written: the entity's read, the dedup record's read, the position \
                 moved alone (Store::keep_applied), the dedup record's put, the look for a kept successor"
            );
            let kept = store
                .get_entity(&shipment)
                .await
                .expect("a read of the shipment")
                .expect("the shipment");
            assert_eq!(
                kept.applied
                    .get(&applied_name("shipping", &second))
                    .map(|applied| applied.seq),
                Some(2),
                "the position moved alone"
            );
            let size = self.stored_size(&shipment).await;
            assert!(size <= 1024, "the shipment with its position, {size} B, within 1 KB");
            sizes[2] = size;
            Some(alone)
        } else {
            None
        };
        assert_eq!(
            self.backend.drain(&"events".parse().unwrap()).await.len(),
            1,
            "published once"
        );
        InOrder {
            processed,
            alone,
            shipment: entity.then_some(sizes),
        }
    }
}

fn nservicebus_consumed(sizes: &Sizes, batch: f64) -> Cost {
    let metadata = 200;
    let operation = sizes.message_body + NSERVICEBUS_HEADER_BYTES + 150;
    let mut cost = Cost::default();
    cost.consumer(batch, CONSUMER_MS_NSERVICEBUS)
        .modelled("Query (outbox record)", 1.0, 0.0, read_units(metadata))
        .modelled("GetItem (business read)", 1.0, 0.0, sizes.business_read_rru)
        .modelled(
            "TransactWriteItems",
            1.0,
            2.0 * (write_units(sizes.business_item) + write_units(metadata) + write_units(operation)),
            0.0,
        )
        .modelled("SendMessageBatch", 1.0, 0.0, 0.0)
        .modelled("UpdateItem (SetAsDispatched)", 1.0, write_units(metadata), 0.0)
        .modelled("BatchWriteItem (delete operations)", 1.0, write_units(operation), 0.0);
    cost
}

fn powertools_consumed(sizes: &Sizes, batch: f64) -> Cost {
    let mut cost = Cost::default();
    cost.consumer(batch, CONSUMER_MS_POWERTOOLS)
        .modelled(
            "PutItem (idempotency record, INPROGRESS)",
            1.0,
            write_units(POWERTOOLS_RECORD_BYTES),
            0.0,
        )
        .modelled("GetItem (business read)", 1.0, 0.0, sizes.business_read_rru)
        .modelled("PutItem (business write)", 1.0, write_units(sizes.business_item), 0.0)
        .modelled("SendMessage (the handler's own send)", 1.0, 0.0, 0.0)
        .modelled(
            "UpdateItem (idempotency record, COMPLETED)",
            1.0,
            write_units(POWERTOOLS_RECORD_BYTES),
            0.0,
        );
    cost
}

fn order(n: usize) -> serde_json::Value {
    json!({
        "id": format!("order-{n}"),
        "customer_id": "c-1",
        "status": "placed",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1299}],
        "total_cents": 2598
    })
}

/// The event of an entity-mode change: a line added to order `n` (about the size of
/// [`event`]).
fn line_added(n: usize, position: usize) -> serde_json::Value {
    json!({
        "type": "OrderLineAdded",
        "order_id": format!("order-{n}"),
        "position": position,
        "customer_id": "c-1",
        "line": {"sku": "SKU-2", "quantity": 1, "unit_price_cents": 499},
        "total_cents": 3097
    })
}

fn event(n: usize, position: usize) -> serde_json::Value {
    json!({
        "type": "OrderPlaced",
        "order_id": format!("order-{n}"),
        "position": position,
        "customer_id": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1299}],
        "total_cents": 2598
    })
}

/// Checks and deferrals of a transaction left to its control message under `timing`:
/// the first check at the first check delay, then `deferral_delay` until the window is
/// over (checks assumed to run when due), then the tombstone.
fn checks_for(control: &ControlPath, timing: Timing) -> (usize, usize) {
    let mut at = timing.first_check_delay;
    let mut attempt = 1;
    let mut checks = 0;
    loop {
        checks += 1;
        if at < timing.max_commit_duration && attempt < MAX_ATTEMPTS {
            at += control.deferral_delay(attempt, timing.max_commit_duration - at);
            attempt += 1;
        } else {
            return (checks, checks - 1);
        }
    }
}

/// One line of a cost: an operation, its usage per transaction, counted or modelled.
#[derive(Clone)]
struct Line {
    operation: String,
    usage: Usage,
    modelled: bool,
}

#[derive(Clone, Default)]
struct Cost {
    lines: Vec<Line>,
    invocations: f64,
    gb_seconds: f64,
}

const SQS_OPERATIONS: [&str; 5] = [
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
];

fn is_sqs(operation: &str) -> bool {
    SQS_OPERATIONS.contains(&operation.split(' ').next().unwrap_or(operation))
}

impl Cost {
    fn counted(&mut self, bill: &Bill) -> &mut Self {
        for (operation, usage) in bill {
            self.lines.push(Line {
                operation: operation.clone(),
                usage: *usage,
                modelled: false,
            });
        }
        self
    }

    fn modelled(&mut self, operation: &str, calls: f64, wru: f64, rru: f64) -> &mut Self {
        let sqs_billed = if is_sqs(operation) { calls } else { 0.0 };
        self.lines.push(Line {
            operation: operation.to_owned(),
            usage: Usage {
                calls,
                wru,
                rru,
                sqs_billed,
            },
            modelled: true,
        });
        self
    }

    fn lambda(&mut self, invocations: f64, milliseconds: f64) -> &mut Self {
        self.invocations += invocations;
        self.gb_seconds += invocations * MEMORY_GB * milliseconds / 1000.0;
        self
    }

    /// The event source mapping's receive and delete for `messages` control messages in
    /// batches of `batch`, and the worker's invocations.
    fn worker(&mut self, messages: f64, batch: f64) -> &mut Self {
        self.modelled("ReceiveMessage (ESM)", messages / batch, 0.0, 0.0)
            .modelled("DeleteMessageBatch (ESM)", messages / batch, 0.0, 0.0)
            .lambda(messages / batch, WORKER_MS_PER_BATCH)
    }

    /// The event source mapping's receive and delete for one consumed message in batches
    /// of `batch`, and its invocation's share: `ms` per message.
    fn consumer(&mut self, batch: f64, ms: f64) -> &mut Self {
        self.modelled("ReceiveMessage (ESM)", 1.0 / batch, 0.0, 0.0)
            .modelled("DeleteMessageBatch (ESM)", 1.0 / batch, 0.0, 0.0)
            .lambda(1.0 / batch, ms * batch)
    }

    fn merged(&self) -> BTreeMap<String, (Usage, bool)> {
        let mut merged: BTreeMap<String, (Usage, bool)> = BTreeMap::new();
        for line in &self.lines {
            let entry = merged
                .entry(line.operation.clone())
                .or_insert((Usage::default(), line.modelled));
            entry.0.add(line.usage);
            entry.1 &= line.modelled;
        }
        merged
    }

    fn total(&self) -> Usage {
        let mut total = Usage::default();
        for line in &self.lines {
            total.add(line.usage);
        }
        total
    }

    /// Dollars per million transactions: DynamoDB, SQS, Lambda, total.
    fn dollars(&self) -> (f64, f64, f64, f64) {
        let total = self.total();
        let dynamodb = total.wru * PER_MILLION_WRU + total.rru * PER_MILLION_RRU;
        let sqs = total.sqs_billed * PER_MILLION_SQS;
        let lambda = self.invocations * PER_MILLION_LAMBDA + self.gb_seconds * 1e6 * PER_GB_SECOND_ARM;
        (dynamodb, sqs, lambda, dynamodb + sqs + lambda)
    }

    /// Dollars per million by operation (and Lambda), largest first.
    fn print_breakdown(&self, batch: f64) {
        let mut parts: Vec<(String, f64)> = self
            .merged()
            .into_iter()
            .map(|(operation, (usage, modelled))| {
                let dollars =
                    usage.wru * PER_MILLION_WRU + usage.rru * PER_MILLION_RRU + usage.sqs_billed * PER_MILLION_SQS;
                let mark = if modelled { "*" } else { "" };
                let mut units = String::new();
                if usage.wru > 0.0 {
                    units += &format!(" {} WRU", usage.wru);
                }
                if usage.rru > 0.0 {
                    units += &format!(" {} RRU", usage.rru);
                }
                (format!("{operation}{mark} {:.2}{units}", usage.calls), dollars)
            })
            .collect();
        parts.push((
            format!("Lambda* {:.2} invocations", self.invocations),
            self.invocations * PER_MILLION_LAMBDA,
        ));
        parts.push((
            format!("Lambda GB-s* {:.0}", self.gb_seconds * 1e6),
            self.gb_seconds * 1e6 * PER_GB_SECOND_ARM,
        ));
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shown: Vec<String> = parts
            .iter()
            .map(|(what, dollars)| format!("{what}: ${dollars:.3}"))
            .collect();
        println!("  batch {batch}: {}", shown.join("; "));
    }

    fn print(&self, name: &str) {
        println!("  {name}");
        let (mut dynamodb, mut sqs) = (Vec::new(), Vec::new());
        for (operation, (usage, modelled)) in self.merged() {
            let mark = if modelled { "*" } else { "" };
            let text = format!("{operation}{mark} {:.2}M", usage.calls);
            if is_sqs(&operation) || operation.starts_with("GetRecords") {
                sqs.push(text);
            } else {
                dynamodb.push(text);
            }
        }
        let total = self.total();
        let (d, s, l, t) = self.dollars();
        println!("    DynamoDB requests: {}", dynamodb.join(", "));
        println!("    SQS/stream requests: {}", sqs.join(", "));
        println!(
            "    units: WRU {:.2}M, RRU {:.2}M, SQS billed requests {:.2}M, Lambda invocations {:.2}M*, GB-s {:.0}*",
            total.wru,
            total.rru,
            total.sqs_billed,
            self.invocations,
            self.gb_seconds * 1e6
        );
        println!("    dollars: DynamoDB ${d:.3} + SQS ${s:.3} + Lambda ${l:.3} = ${t:.3}");
    }
}

/// Sizes measured on the wire that the peers' models reuse.
struct Sizes {
    business_item: usize,
    message_body: usize,
    business_read_rru: f64,
}

fn sum(bills: &[&Bill]) -> Bill {
    let mut total = Bill::new();
    for bill in bills {
        merge(&mut total, bill);
    }
    total
}

/// A committed transaction of ours: its calls counted, its control messages' receives,
/// deletes and worker time, and the API's invocation of `api_ms`.
fn ours_committed(flow: &Flow, api_ms: f64, batch: f64) -> Cost {
    let mut cost = Cost::default();
    cost.counted(&sum(&[&flow.request, &flow.control]))
        .worker(flow.checks as f64, batch)
        .lambda(1.0, api_ms);
    cost
}

fn nservicebus_committed(sizes: &Sizes, messages: usize, batch: f64) -> Cost {
    let n = messages as f64;
    let metadata = 200;
    let operation = sizes.message_body + NSERVICEBUS_HEADER_BYTES + 150;
    let mut cost = Cost::default();
    cost.modelled("GetItem (business read)", 1.0, 0.0, sizes.business_read_rru)
        .modelled("SendMessage (control)", 1.0, 0.0, 0.0)
        .modelled(
            "TransactWriteItems",
            1.0,
            2.0 * (write_units(sizes.business_item) + write_units(metadata) + n * write_units(operation)),
            0.0,
        )
        .lambda(1.0, API_MS_NSERVICEBUS)
        .worker(1.0, batch)
        .modelled("DeleteMessage (NServiceBus.AwsLambda.SQS)", 1.0, 0.0, 0.0)
        .modelled(
            "Query (outbox record)",
            1.0,
            0.0,
            read_units(metadata + messages * operation),
        )
        .modelled(
            "SendMessageBatch",
            n.div_euclid(10.0) + f64::from(messages % 10 != 0),
            0.0,
            0.0,
        )
        .modelled("UpdateItem (SetAsDispatched)", 1.0, write_units(metadata), 0.0)
        .modelled(
            "BatchWriteItem (delete operations)",
            (n / 25.0).ceil(),
            n * write_units(operation),
            0.0,
        );
    cost
}

fn streams_committed(sizes: &Sizes, messages: usize, batch: f64) -> Cost {
    let mut cost = Cost::default();
    cost.modelled("GetItem (business read)", 1.0, 0.0, sizes.business_read_rru)
        .modelled("PutItem", 1.0, write_units(sizes.business_item), 0.0)
        .lambda(1.0, API_MS_STREAMS)
        .modelled("GetRecords (stream, free to Lambda)", 1.0 / batch, 0.0, 0.0)
        .modelled("SendMessageBatch", (messages as f64 / 10.0).ceil(), 0.0, 0.0)
        .lambda(1.0 / batch, WORKER_MS_PER_BATCH);
    cost
}

fn main() {
    let batch_size: f64 = std::env::args()
        .skip_while(|arg| arg != "--batch-size")
        .nth(1)
        .map(|value| value.parse().expect("--batch-size takes a number"))
        .unwrap_or(1.0);
    let traced = std::env::args().any(|arg| arg == "--traced");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // `--traced`: every transaction runs in a sampled span, so that each message stores
    // its trace context, as it does with export on (docs/PROTOCOL.md section 14).
    let _provider = traced.then(trace_every_transaction);
    let _root = traced.then(|| tracing::info_span!("cost-model").entered());
    if traced {
        println!("traced: every message stores its trace context");
    }
    runtime.block_on(run(batch_size));
}

/// Makes `tracing` spans OpenTelemetry spans (sampled, exported nowhere) for the process.
fn trace_every_transaction() -> opentelemetry_sdk::trace::SdkTracerProvider {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("cost-model"))
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).expect("one subscriber");
    provider
}

async fn run(batch_size: f64) {
    let started = std::time::Instant::now();
    let counter = CallCounter::default();
    let meter = WireMeter::default();
    let config = emulator().sdk_config().await;
    let backend = Backend::aws_with(meter.clients(&counter, &config)).await;
    let rig = Rig {
        backend,
        counter,
        meter,
        raw: aws_sdk_dynamodb::Client::new(&config),
    };
    let timing = Timing::default();
    let plain = rig.backend.outbox(timing);
    let inline = rig
        .backend
        .outbox(timing)
        .with_inline_publisher(rig.backend.publisher.clone());
    let control = rig.backend.control(timing);

    let off1 = rig.commit(&plain, &control, 1, false, 1).await;
    let off5 = rig.commit(&plain, &control, 5, false, 2).await;
    let on1 = rig.commit(&inline, &control, 1, true, 3).await;
    let on5 = rig.commit(&inline, &control, 5, true, 4).await;
    let (entity_off1, entity_sizes_off1) = rig.commit_in_entity(&plain, &control, 1, false, 11).await;
    let (entity_off5, entity_sizes_off5) = rig.commit_in_entity(&plain, &control, 5, false, 12).await;
    let (entity_on1, entity_sizes_on1) = rig.commit_in_entity(&inline, &control, 1, true, 13).await;
    let (entity_on5, entity_sizes_on5) = rig.commit_in_entity(&inline, &control, 5, true, 14).await;
    let (create_on1, create_sizes_on1) = rig.create_in_entity(&inline, &control, true, true, 15).await;
    let (create_off1, create_sizes_off1) = rig.create_in_entity(&plain, &control, false, true, 16).await;
    let (fresh_on1, fresh_sizes_on1) = rig.create_in_entity(&inline, &control, true, false, 17).await;
    let abandoned = rig.abandon(&plain, &control, true).await;
    let refused = rig.abandon(&plain, &control, false).await;
    let entity_abandoned = rig.abandon_in_entity(&plain, &control, false, 21).await;
    let entity_fenced = rig.abandon_in_entity(&plain, &control, true, 22).await;
    // Left to its control message: measured with a 3 s window (2 checks), and the
    // derivation that gives 2 checks there gives the default window's count.
    let short = Timing {
        max_commit_duration: Duration::from_secs(3),
        ..timing
    };
    let dropped = rig
        .drop_txn(&rig.backend.outbox(short), &rig.backend.control(short), short)
        .await;
    let (default_checks, default_deferrals) = checks_for(&control, timing);
    assert_eq!(
        (default_checks, default_deferrals),
        (6, 5),
        "the count docs/HOW_IT_WORKS.md gives at the 30 s window"
    );
    let (consumed, duplicate) = rig.consume(false).await;
    let (entity_consumed, entity_duplicate) = rig.consume(true).await;
    let in_order = rig.consume_in_order(false).await;
    let entity_in_order = rig.consume_in_order(true).await;
    let (responses, with_capacity, reported) = rig.meter.consumed_capacity_seen();

    // The order as its create stored it (an update now, which the meter cannot size),
    // less the fence mark's reserved room (`outbox_fence`, 12 + 36 bytes), which the
    // other systems' items do not carry.
    let business_bytes = rig.stored_size(&"ORDER#1".parse().unwrap()).await - ("outbox_fence".len() + 36);
    let sizes = Sizes {
        business_item: business_bytes,
        message_body: serde_json::to_string(&event(1, 0)).unwrap().len(),
        business_read_rru: off1.request.get("BatchGetItem").map_or(1.0, |usage| usage.rru),
    };
    let txn_record = |flow: &Flow| {
        flow.written
            .iter()
            .filter(|written| written.key.starts_with("TXN#"))
            .map(|written| written.bytes)
            .max()
            .unwrap_or(0)
    };

    println!("COST MODEL (per million transactions; us-east-1)");
    println!("{PRICES_AS_OF}:");
    println!(
        "  DynamoDB on-demand ${PER_MILLION_WRU}/M write request units, ${PER_MILLION_RRU}/M read request units; \
         SQS standard ${PER_MILLION_SQS}/M requests (per 64 KB chunk); Lambda ${PER_MILLION_LAMBDA}/M requests, \
         arm64 ${PER_GB_SECOND_ARM}/GB-s"
    );
    println!(
        "counted on the wire on the emulators (SDK interceptor; DynamoDB on {engine}): requests by operation; \
         capacity units COMPUTED from the item sizes on the wire with DynamoDB's rules ({engine} returned \
         ConsumedCapacity in {with_capacity} of {responses} DynamoDB responses unasked: {reported:?} over the \
         whole run; the adapter does not set ReturnConsumedCapacity)",
        engine = emulator().dynamodb_engine.as_str(),
    );
    println!(
        "sizes on the wire: order item {} B, event body {} B, TXN record {} B (1 message) / {} B (5 messages)",
        sizes.business_item,
        sizes.message_body,
        txn_record(&off1),
        txn_record(&off5)
    );
    println!(
        "entity mode (a change to an existing order, measured in its steady state: the order created \
         transactionally, then one entity-mode change made and settled first, since the first entity commit of \
         an item written in the transactional form takes two UpdateItem, the item having no outbox map yet):"
    );
    for (name, sizes) in [
        ("1 message, inline off", &entity_sizes_off1),
        ("5 messages, inline off", &entity_sizes_off5),
        ("1 message, inline on", &entity_sizes_on1),
        ("5 messages, inline on", &entity_sizes_on5),
    ] {
        println!(
            "  {name}: order {} B before the change, {} B with its entry, {} B after the entry's removal; \
             UpdateItem by DynamoDB's rule (the larger of before and after): commit {} WRU + removal {} WRU \
             (the meter, which charges the size it last saw put: {} WRU{})",
            sizes.before,
            sizes.with_entry,
            sizes.after,
            sizes.commit_wru(),
            sizes.removal_wru(),
            sizes.metered_wru,
            if sizes.metered_wru == sizes.commit_wru() + sizes.removal_wru() {
                ", the same"
            } else {
                "; the rule's figure is used"
            }
        );
    }
    println!("entity mode, a create (a new order: one UpdateItem creates it with its entry):");
    for (name, sizes) in [
        ("its key read first, 1 message, inline off", &create_sizes_off1),
        ("its key read first, 1 message, inline on", &create_sizes_on1),
        ("a fresh key, not read, 1 message, inline on", &fresh_sizes_on1),
    ] {
        println!(
            "  {name}: order {} B with its entry, {} B after the entry settled; UpdateItem by DynamoDB's rule: \
             commit {} WRU (nothing before it) + settle {} WRU (the meter, which never saw the order put: {} WRU{})",
            sizes.with_entry,
            sizes.after,
            sizes.commit_wru(),
            sizes.removal_wru(),
            sizes.metered_wru,
            if sizes.metered_wru == sizes.commit_wru() + sizes.removal_wru() {
                ", the same"
            } else {
                "; the rule's figure is used"
            }
        );
    }
    if let Some([with_entry, settled, moved]) = entity_in_order.shipment {
        println!(
            "in order, entity mode: the shipment {with_entry} B with its entry and position, {settled} B after the \
             entry's removal, {moved} B once seq 2's position moved alone: each UpdateItem 1 WRU (the meter's \
             minimum, the same)"
        );
    }
    println!(
        "* = modelled, not counted: ESM ReceiveMessage + DeleteMessageBatch per batch of control messages, \
         Lambda invocations (API 1 per request; worker 1 per batch) and GB-s at 256 MB (API p50 {API_MS_INLINE_OFF} ms \
         inline off / {API_MS_INLINE_ON} ms inline on, in entity mode {API_MS_ENTITY_INLINE_OFF} / \
         {API_MS_ENTITY_INLINE_ON} ms, from the request-path benchmark; worker {WORKER_MS_PER_BATCH} ms per batch), \
         the peers' calls"
    );

    let scenarios = |batch: f64| -> Vec<(String, Vec<(String, Cost)>)> {
        let mut out = Vec::new();
        for (messages, off, on, entity_off, entity_on) in [
            (1, &off1, &on1, &entity_off1, &entity_on1),
            (5, &off5, &on5, &entity_off5, &entity_on5),
        ] {
            out.push((
                format!(
                    "committed transactions, {messages} message{}",
                    if messages == 1 { "" } else { "s" }
                ),
                vec![
                    (
                        "this outbox, inline publishing on (default)".to_owned(),
                        ours_committed(on, API_MS_INLINE_ON, batch),
                    ),
                    (
                        "this outbox, inline publishing off".to_owned(),
                        ours_committed(off, API_MS_INLINE_OFF, batch),
                    ),
                    (
                        "this outbox in entity mode, inline on (a change to an existing order, steady state)"
                            .to_owned(),
                        ours_committed(entity_on, API_MS_ENTITY_INLINE_ON, batch),
                    ),
                    (
                        "this outbox in entity mode, inline off (a change to an existing order, steady state)"
                            .to_owned(),
                        ours_committed(entity_off, API_MS_ENTITY_INLINE_OFF, batch),
                    ),
                ],
            ));
            let rows = &mut out.last_mut().expect("just pushed").1;
            if messages == 1 {
                rows.extend([
                    (
                        "this outbox in entity mode, inline on (a create of a new order, its key read first)"
                            .to_owned(),
                        ours_committed(&create_on1, API_MS_ENTITY_INLINE_ON, batch),
                    ),
                    (
                        "this outbox in entity mode, inline off (a create of a new order, its key read first)"
                            .to_owned(),
                        ours_committed(&create_off1, API_MS_ENTITY_INLINE_OFF, batch),
                    ),
                    (
                        "this outbox in entity mode, inline on (a create under a fresh key, not read: AbsentAt(0))"
                            .to_owned(),
                        ours_committed(&fresh_on1, API_MS_ENTITY_INLINE_ON, batch),
                    ),
                ]);
            }
            rows.extend([
                (
                    "NServiceBus transactional session, DynamoDB persistence".to_owned(),
                    nservicebus_committed(&sizes, messages, batch),
                ),
                (
                    "DynamoDB Streams relay".to_owned(),
                    streams_committed(&sizes, messages, batch),
                ),
            ]);
        }
        let read = sizes.business_read_rru;
        let mut in_request = Cost::default();
        in_request
            .modelled("GetItem (business read)", 1.0, 0.0, read)
            .counted(&sum(&[&abandoned.request, &abandoned.control]))
            .worker(abandoned.checks as f64, batch)
            .lambda(1.0, API_MS_INLINE_OFF);
        // The default: nothing of the transaction was sent, so the read and the
        // invocation, as long as the read, are the whole bill (no worker invocation
        // either).
        let mut refused_cost = Cost::default();
        refused_cost
            .modelled("GetItem (business read)", 1.0, 0.0, read)
            .counted(&sum(&[&refused.request, &refused.control]))
            .lambda(1.0, API_MS_REFUSED);
        let in_entity = |flow: &Flow| {
            let mut cost = Cost::default();
            cost.modelled("GetItem (business read)", 1.0, 0.0, read)
                .counted(&sum(&[&flow.request, &flow.control]))
                .worker(flow.checks as f64, batch)
                .lambda(1.0, API_MS_INLINE_OFF);
            cost
        };
        let entity_settled = in_entity(&entity_abandoned);
        let entity_fence = in_entity(&entity_fenced);
        // The default window: the short run's per-check read, deferral and tombstone,
        // times the default window's checks and deferrals.
        let short_checks = dropped.checks as f64;
        let per_check = dropped
            .control
            .get("BatchGetItem")
            .copied()
            .unwrap_or_default()
            .scaled(1.0 / short_checks);
        let per_deferral = dropped.control.get("SendMessage").copied().unwrap_or_default();
        let mut left = Cost::default();
        left.modelled("GetItem (business read)", 1.0, 0.0, read)
            .counted(&dropped.request)
            .counted(&BTreeMap::from([
                ("BatchGetItem".to_owned(), per_check.scaled(default_checks as f64)),
                ("SendMessage".to_owned(), per_deferral.scaled(default_deferrals as f64)),
                ("PutItem".to_owned(), dropped.control["PutItem"]),
            ]))
            .worker(default_checks as f64, batch)
            .lambda(1.0, API_MS_INLINE_OFF);
        let mut nsb_disposed = Cost::default();
        nsb_disposed
            .modelled("GetItem (business read)", 1.0, 0.0, read)
            .lambda(1.0, API_MS_NSERVICEBUS);
        // Refused at commit: the control message comes back until the 15 s maximum commit
        // duration is spent (delays 4, 8, 3 s: 4 receipts, 3 deferrals), then the outbox
        // stores the tombstone record and marks it dispatched. The failed commit itself
        // is left out here as on our side.
        let mut nsb_refused = Cost::default();
        nsb_refused
            .modelled("GetItem (business read)", 1.0, 0.0, read)
            .modelled("SendMessage (control)", 1.0, 0.0, 0.0)
            .lambda(1.0, API_MS_NSERVICEBUS)
            .worker(4.0, batch)
            .modelled("DeleteMessage (NServiceBus.AwsLambda.SQS)", 4.0, 0.0, 0.0)
            .modelled("Query (outbox record)", 4.0, 0.0, 4.0)
            .modelled("SendMessage (deferral)", 3.0, 0.0, 0.0)
            .modelled("TransactWriteItems (tombstone)", 1.0, 2.0, 0.0)
            .modelled("UpdateItem (SetAsDispatched)", 1.0, 1.0, 0.0);
        let mut streams = Cost::default();
        streams
            .modelled("GetItem (business read)", 1.0, 0.0, read)
            .lambda(1.0, API_MS_STREAMS);
        // A consumed message: the event source mapping's receive and delete and one
        // invocation per batch, the handler's time per message.
        let mut ours_consumed = Cost::default();
        ours_consumed.counted(&consumed).consumer(batch, CONSUMER_MS);
        let mut ours_copy = Cost::default();
        ours_copy.counted(&duplicate).consumer(batch, CONSUMER_MS_COPY);
        let mut ours_entity = Cost::default();
        ours_entity
            .counted(&entity_consumed)
            .consumer(batch, CONSUMER_MS_ENTITY);
        let mut ours_entity_copy = Cost::default();
        ours_entity_copy
            .counted(&entity_duplicate)
            .consumer(batch, CONSUMER_MS_ENTITY_COPY);
        let mut ours_in_order = Cost::default();
        ours_in_order
            .counted(&in_order.processed)
            .consumer(batch, CONSUMER_MS_IN_ORDER);
        let mut ours_entity_in_order = Cost::default();
        ours_entity_in_order
            .counted(&entity_in_order.processed)
            .consumer(batch, CONSUMER_MS_ENTITY);
        let mut ours_in_order_alone = Cost::default();
        ours_in_order_alone
            .counted(entity_in_order.alone.as_ref().expect("measured in entity mode"))
            .consumer(batch, CONSUMER_MS_IN_ORDER_ALONE);
        out.push((
            "consumed messages (1 incoming event: 1 read, 1 write, 1 outgoing message)".to_owned(),
            vec![
                ("this outbox's consumer (outbox::consumer)".to_owned(), ours_consumed),
                (
                    "this outbox's consumer, a copy (duplicate) of a consumed message".to_owned(),
                    ours_copy,
                ),
                (
                    "this outbox's consumer in entity mode (one item: no transaction)".to_owned(),
                    ours_entity,
                ),
                (
                    "this outbox's consumer in entity mode, a copy (duplicate)".to_owned(),
                    ours_entity_copy,
                ),
                (
                    "this outbox's consumer, in order (its position item read, and moved in the transaction)"
                        .to_owned(),
                    ours_in_order,
                ),
                (
                    "this outbox's consumer in entity mode, in order (its position in the entity's key: no \
                     transaction)"
                        .to_owned(),
                    ours_entity_in_order,
                ),
                (
                    "this outbox's consumer in entity mode, in order, a message that writes nothing (the position \
                     moves alone)"
                        .to_owned(),
                    ours_in_order_alone,
                ),
                (
                    "NServiceBus Outbox, DynamoDB persistence".to_owned(),
                    nservicebus_consumed(&sizes, batch),
                ),
                (
                    "Powertools idempotency + a separate business write and send (not atomic)".to_owned(),
                    powertools_consumed(&sizes, batch),
                ),
            ],
        ));
        out.push((
            "abandoned transactions (decided by the reads: 404/409/412)".to_owned(),
            vec![
                (
                    "this outbox, refused after its reads (now: nothing sent, nothing written)".to_owned(),
                    refused_cost,
                ),
                (
                    "this outbox, its control message sent at begin, settled in the request path (before: every \
                     begin sent it; now only Transaction::send_control)"
                        .to_owned(),
                    in_request,
                ),
                (
                    "this outbox in entity mode, its control message sent, settled in the request path (its commit \
                     had not begun)"
                        .to_owned(),
                    entity_settled,
                ),
                (
                    "this outbox in entity mode, fenced in its item (a commit of unknown outcome)".to_owned(),
                    entity_fence,
                ),
                (
                    format!(
                        "this outbox, dropped and left to its control message (30 s window: {default_checks} checks, \
                         {default_deferrals} deferrals, measured at a 3 s window: {} checks, and scaled)",
                        dropped.checks
                    ),
                    left,
                ),
                ("NServiceBus, session disposed without commit".to_owned(), nsb_disposed),
                (
                    "NServiceBus, commit refused (control message to its tombstone)".to_owned(),
                    nsb_refused,
                ),
                ("DynamoDB Streams relay".to_owned(), streams),
            ],
        ));
        out
    };

    for (title, costs) in scenarios(batch_size) {
        println!("\n== per million {title}; worker batch size {batch_size} ==");
        for (name, cost) in &costs {
            cost.print(name);
        }
    }

    println!("\n== summary: dollars per million transactions, by worker batch size ==");
    let low = scenarios(1.0);
    let high = scenarios(10.0);
    for ((title, costs), (_, costs_high)) in low.iter().zip(&high) {
        println!("{title}");
        for ((name, cost), (_, cost_high)) in costs.iter().zip(costs_high) {
            println!(
                "  {:>8.3} (batch 1) {:>8.3} (batch 10)  {name}",
                cost.dollars().3,
                cost_high.dollars().3
            );
        }
    }

    // A refused request (404/409/412 decided by the reads), before and after its control
    // message moved to the commit: the row of each in the abandoned transactions' table.
    let refusal = |scenarios: &[(String, Vec<(String, Cost)>)], prefix: &str| -> f64 {
        scenarios
            .iter()
            .find(|(title, _)| title.starts_with("abandoned transactions"))
            .and_then(|(_, rows)| rows.iter().find(|(name, _)| name.starts_with(prefix)))
            .map(|(_, cost)| cost.dollars().3)
            .expect("the row")
    };
    let (before, now) = (
        "this outbox, its control message sent at begin",
        "this outbox, refused after its reads",
    );
    println!(
        "\nrefused request (404/409/412 decided by the reads), per million: before (its control message sent at \
         begin, its tombstone written at the answer, the worker's check) ${:.2} (worker batch 1) / ${:.2} (batch 10); \
         now (nothing sent, nothing written: the read and the invocation) ${:.2} / ${:.2}",
        refusal(&low, before),
        refusal(&high, before),
        refusal(&low, now),
        refusal(&high, now)
    );

    let ours = ours_committed(&on1, API_MS_INLINE_ON, 1.0).dollars().3;
    let ours_off = ours_committed(&off1, API_MS_INLINE_OFF, 1.0).dollars().3;
    let nsb = nservicebus_committed(&sizes, 1, 1.0).dollars().3;
    let relay = streams_committed(&sizes, 1, 1.0).dollars().3;
    println!(
        "\nidle: each SQS event source mapping long-polls (20 s) with 2 to 5 pollers at low traffic: 6 to 15 \
         ReceiveMessage a minute, about $0.10 to $0.26 a month per queue (this outbox: the control queue; \
         NServiceBus: its endpoint queue; a Streams relay polls its stream at no request charge)"
    );
    println!(
        "\ncost per million committed transactions (1 message): outbox ${ours:.2} vs NServiceBus ${nsb:.2}: {}",
        if ours < nsb { "below" } else { "not below" }
    );
    println!(
        "  (inline publishing off: ${ours_off:.2}, {}); gap to the DynamoDB Streams relay (${relay:.2}): \
         +${:.2} ({:.1}x): the relay writes the business item alone with a standard PutItem and gets its change \
         from the stream free of request charges, while the outbox pays the transaction's double write units for \
         the item and its outbox record, the control message's send, receive and delete, the dispatch mark and \
         the check's read",
        if ours_off < nsb { "below" } else { "not below" },
        ours - relay,
        ours / relay
    );
    for (name, flow, api_ms) in [
        ("inline on", &entity_on1, API_MS_ENTITY_INLINE_ON),
        ("inline off", &entity_off1, API_MS_ENTITY_INLINE_OFF),
    ] {
        let (low, high) = (
            ours_committed(flow, api_ms, 1.0).dollars().3,
            ours_committed(flow, api_ms, 10.0).dollars().3,
        );
        println!(
            "\nentity mode, {name}: ${low:.2} (worker batch 1) / ${high:.2} (batch 10) per million committed \
             transactions (1 message), goal <= ${GOAL_ENTITY_DOLLARS:.1}: {}",
            match (low <= GOAL_ENTITY_DOLLARS, high <= GOAL_ENTITY_DOLLARS) {
                (true, _) => "met".to_owned(),
                (false, true) => "met at batch 10 only".to_owned(),
                (false, false) => format!("not met (${:.2} over at batch 10)", high - GOAL_ENTITY_DOLLARS),
            }
        );
        for batch in [1.0, 10.0] {
            ours_committed(flow, api_ms, batch).print_breakdown(batch);
        }
    }
    // A create in entity mode against the same create in the transactional form
    // (`Rig::commit`: the read, the put, the transaction).
    for (name, flow, api_ms, transactional, transactional_ms) in [
        (
            "its key read first, inline on",
            &create_on1,
            API_MS_ENTITY_INLINE_ON,
            &on1,
            API_MS_INLINE_ON,
        ),
        (
            "its key read first, inline off",
            &create_off1,
            API_MS_ENTITY_INLINE_OFF,
            &off1,
            API_MS_INLINE_OFF,
        ),
        (
            "a fresh key, not read (AbsentAt(0)), inline on",
            &fresh_on1,
            API_MS_ENTITY_INLINE_ON,
            &on1,
            API_MS_INLINE_ON,
        ),
    ] {
        let (low, high) = (
            ours_committed(flow, api_ms, 1.0).dollars().3,
            ours_committed(flow, api_ms, 10.0).dollars().3,
        );
        let (was_low, was_high) = (
            ours_committed(transactional, transactional_ms, 1.0).dollars().3,
            ours_committed(transactional, transactional_ms, 10.0).dollars().3,
        );
        println!(
            "\nentity mode, a create ({name}): ${low:.2} (worker batch 1) / ${high:.2} (batch 10) \
             per million committed transactions (1 message), goal <= ${GOAL_ENTITY_DOLLARS:.1}: {}; the same create \
             in the transactional form: ${was_low:.2} / ${was_high:.2}",
            match (low <= GOAL_ENTITY_DOLLARS, high <= GOAL_ENTITY_DOLLARS) {
                (true, _) => "met".to_owned(),
                (false, true) => "met at batch 10 only".to_owned(),
                (false, false) => format!("not met (${:.2} over at batch 10)", high - GOAL_ENTITY_DOLLARS),
            }
        );
        for batch in [1.0, 10.0] {
            ours_committed(flow, api_ms, batch).print_breakdown(batch);
        }
    }
    rig.counter_costs().await;
    println!("(measured in {:.1} s)", started.elapsed().as_secs_f64());
}

impl Rig {
    /// A take of one unit of stock under its bound, with one message: the request path's
    /// DynamoDB calls only (the control message, the dispatch and the settling are those of
    /// any entity-mode commit, and the same for both), as a counter commit (one `UpdateItem`
    /// that reads nothing, [`outbox::counter`]) and as the read-modify-write of today (a
    /// consistent `GetItem`, then the `UpdateItem` at the version read). Write units by
    /// DynamoDB's rule for `UpdateItem` (the larger of the item before and after), read
    /// units by the item read; a conflict under contention costs the read-modify-write one
    /// more read and one more (failed, still charged) write per retry, and the counter none.
    async fn counter_costs(&self) {
        use outbox::counter::{Add, CounterCommit};
        use outbox::ports::{Clock, EntityCommit};
        use outbox::protocol::{stamp_chain, OutboxRecord, OutgoingMessage};

        let store = &self.backend.store;
        let key: ItemKey = format!("STOCK#{}", TxnId::new_v7()).parse().expect("a key");
        let now = self.backend.clock.now();
        let expires = now.plus(Duration::from_secs(7 * 24 * 3600));
        let message = |txn: TxnId| {
            let body = Message::json(
                "events".parse().expect("a destination"),
                &json!({"type": "StockTaken", "sku": key.as_str(), "quantity": 1}),
            )
            .expect("serialisable");
            vec![OutgoingMessage::new(txn, 0, body)]
        };
        let data = json!({"name": "Desk lamp, brass", "price_cents": 4_990, "stock": 1_000});
        store
            .commit_entity(&EntityCommit {
                key: key.clone(),
                data: data.clone(),
                expected: ExpectedVersion::Absent,
                entry: OutboxRecord::committed(TxnId::new_v7(), Vec::new(), now, expires),
                checks_fence: true,
                applied: None,
            })
            .await
            .expect("the item");
        let take = |txn: TxnId| CounterCommit {
            key: key.clone(),
            adds: vec![Add::take("stock", 1)],
            entry: OutboxRecord::committed(txn, message(txn), now, expires),
            checks_fence: true,
        };
        // The first message of the item's chain takes the ordinary form: its head is made.
        store
            .commit_counter(&take(TxnId::new_v7()))
            .await
            .expect("a first take");
        let before_counter = self.stored_size(&key).await;
        self.reset();
        store.commit_counter(&take(TxnId::new_v7())).await.expect("a take");
        let (counter_calls, _) = self.snapshot();
        let after_counter = self.stored_size(&key).await;
        let counter_wru = write_units(before_counter.max(after_counter));

        let before = self.stored_size(&key).await;
        self.reset();
        let read = store.get_keys(std::slice::from_ref(&key)).await.expect("a read");
        let read = &read[&key];
        let live = read.item.as_ref().expect("live");
        let txn = TxnId::new_v7();
        let mut messages = message(txn);
        stamp_chain(&mut messages, &key, read.version + 1, &read.heads);
        let mut data = live.data.clone();
        data["stock"] = json!(data["stock"].as_i64().expect("stock") - 1);
        store
            .commit_entity(&EntityCommit {
                key: key.clone(),
                data,
                expected: ExpectedVersion::Exactly(read.version),
                entry: OutboxRecord::committed(txn, messages, now, expires),
                checks_fence: true,
                applied: None,
            })
            .await
            .expect("a read-modify-write");
        let (rmw_calls, _) = self.snapshot();
        let after_rmw = self.stored_size(&key).await;
        let rmw_wru = write_units(before.max(after_rmw));
        let rmw_rru = read_units(before);
        let dollars = |wru: f64, rru: f64| wru * PER_MILLION_WRU + rru * PER_MILLION_RRU;
        println!("\n== a counter under a bound (take 1 unit, 1 message), request path's DynamoDB calls ==");
        println!(
            "counter commit: calls {counter_calls:?}; item {before_counter} -> {after_counter} bytes; {counter_wru} WRU, 0 RRU: \
             ${:.3} per million, and the same under contention (no conflict, no retry)",
            dollars(counter_wru, 0.0)
        );
        println!(
            "read-modify-write: calls {rmw_calls:?}; item {before} -> {after_rmw} bytes; {rmw_wru} WRU, {rmw_rru} RRU: \
             ${:.3} per million uncontended, + ${:.3} per million per conflict retried",
            dollars(rmw_wru, rmw_rru),
            dollars(rmw_wru, rmw_rru)
        );
    }
}
