//! Scenarios for what only DynamoDB does (`outbox::aws::branches`), on DynamoDB Local
//! through the fault proxy: answers the engine gives only under a race or a fault (a
//! conflict, an old item left out, a request held in the network, a write that fails),
//! each reached and held to what the protocol needs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
use outbox::aws::AwsClients;
use outbox::control::{ControlError, ControlOutcome};
use outbox::counter::{Add, CounterCommit, CounterError, Refusal};
use outbox::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, ControlDelivery, EntityCommit, ExpectedVersion, FenceOutcome,
    ItemKey, StoreError, TombstoneOutcome,
};
use outbox::protocol::{Applied, ControlMessage, Message, OutboxRecord, OutboxState, TxnId};
use outbox::request::Outbox;
use outbox::settings::Timing;
use serde_json::{json, Value};

use super::backend::{audit, events, Backend};
use super::cases::{key, messages, put, record, request, whole_second, RETENTION};
use crate::calls::ForgetToken;
use crate::emulator::emulator;
use crate::fault_proxy::{Fault, FaultProxy};

/// Faults to apply, in order: to the next `TransactWriteItems`, and to the next request
/// of a named operation (`PutItem`, `BatchGetItem`, ...). Everything else is forwarded.
#[derive(Clone, Default)]
pub struct Faults {
    transact: Arc<Mutex<VecDeque<Fault>>>,
    others: Arc<Mutex<Vec<(&'static str, Fault)>>>,
}

impl Faults {
    /// The next `TransactWriteItems` meets `fault`.
    pub fn transact(&self, fault: Fault) {
        self.transact.lock().unwrap().push_back(fault);
    }

    /// The next request of `operation` (after those already planned) meets `fault`.
    pub fn other(&self, operation: &'static str, fault: Fault) {
        self.others.lock().unwrap().push((operation, fault));
    }

    /// How many faults are still planned for `operation` (`TransactWriteItems` too): a
    /// fault no longer planned has met its request.
    pub fn planned(&self, operation: &str) -> usize {
        if operation == "TransactWriteItems" {
            return self.transact.lock().unwrap().len();
        }
        let others = self.others.lock().unwrap();
        others.iter().filter(|(planned, _)| *planned == operation).count()
    }

    /// Waits until at most `left` faults are planned for `operation` (the others met
    /// their requests); panics after ten seconds.
    pub async fn met(&self, operation: &str, left: usize) {
        let started = std::time::Instant::now();
        while self.planned(operation) > left {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the {operation} to fault never came"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Forgets every fault still planned (those a request's retries did not use).
    pub fn clear(&self) {
        self.transact.lock().unwrap().clear();
        self.others.lock().unwrap().clear();
    }

    /// The next `times` requests of `operation` fail (HTTP 500, never forwarded): more
    /// than the SDK's attempts, so that the call fails; [`Self::clear`] forgets the rest.
    pub fn fail(&self, operation: &'static str, times: usize) {
        for _ in 0..times {
            self.other(operation, Fault::Drop);
        }
    }

    fn next_transact(&self) -> Fault {
        self.transact.lock().unwrap().pop_front().unwrap_or(Fault::Forward)
    }

    fn next_other(&self, target: &str) -> Fault {
        let mut others = self.others.lock().unwrap();
        match others
            .iter()
            .position(|(operation, _)| target.rsplit('.').next() == Some(*operation))
        {
            Some(index) => others.remove(index).1,
            None => Fault::Forward,
        }
    }
}

/// A backend whose DynamoDB traffic goes through a fault proxy.
pub struct Proxied {
    /// The backend.
    pub backend: Backend,
    /// The faults to come.
    pub faults: Faults,
    /// The proxy (kept running).
    pub proxy: FaultProxy,
    /// A client straight to DynamoDB Local, for looking at items as stored.
    pub raw: aws_sdk_dynamodb::Client,
}

/// A fresh backend on DynamoDB Local behind a fault proxy that forwards everything until
/// told otherwise.
pub async fn proxied() -> Proxied {
    proxied_with(Duration::from_secs(10)).await
}

/// [`proxied`], with its SDK clients waiting up to half of `operation_timeout` for one
/// attempt (the production ratio): a scenario that holds requests in the network for
/// up to [`HOLD`] gives them a minute, so that no attempt gives up on a held request.
pub async fn proxied_with(operation_timeout: Duration) -> Proxied {
    let faults = Faults::default();
    let (transact, others) = (faults.clone(), faults.clone());
    let proxy = FaultProxy::start_with_others(
        &emulator().dynamodb_endpoint,
        move |_| transact.next_transact(),
        move |target| others.next_other(target),
    )
    .await;
    let config = emulator().sdk_config_with(operation_timeout).await;
    let clients = AwsClients {
        dynamodb: aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .endpoint_url(proxy.endpoint())
                .build(),
        ),
        ..AwsClients::new(&config)
    };
    Proxied {
        backend: Backend::aws_with(clients).await,
        faults,
        proxy,
        raw: aws_sdk_dynamodb::Client::new(&config),
    }
}

/// A fresh backend on DynamoDB Local whose commits carry no `ClientRequestToken`: past
/// DynamoDB's ten-minute window, where a repeat is answered by the record, not the token.
pub async fn without_tokens() -> Backend {
    let config = emulator().sdk_config().await;
    let clients = AwsClients {
        dynamodb: aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .interceptor(ForgetToken)
                .build(),
        ),
        ..AwsClients::new(&config)
    };
    Backend::aws_with(clients).await
}

/// Creates item `name` at version 1 in the transactional form.
async fn create(b: &Backend, name: &str) {
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put(name, json!({"n": 0}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .expect("the create");
}

fn entity_commit(b: &Backend, name: &str, txn: TxnId, expected: ExpectedVersion) -> EntityCommit {
    let now = b.clock.now();
    EntityCommit {
        key: key(name),
        data: json!({"n": 1}),
        expected,
        entry: OutboxRecord::committed(
            txn,
            messages(txn, &[json!({"n": 1})]),
            now,
            whole_second(now.plus(RETENTION)),
        ),
        checks_fence: true,
        applied: None,
    }
}

fn item_name() -> String {
    format!("ENTITY#{}", TxnId::new_v7())
}

/// A delete of an item read without a fence mark, held in the network while a fence
/// raises one: its condition fails with the item still at its version, which is
/// contention (the commit is tried again, reading the mark), not a version conflict.
pub async fn a_delete_that_meets_a_new_fence_mark_is_contention(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    create(b, &name).await;
    p.faults.transact(Fault::Late(Duration::from_millis(1500)));
    let store = b.store.clone();
    let delete = request(
        b,
        TxnId::new_v7(),
        vec![BusinessWrite::Delete {
            key: key(&name),
            version: 1,
        }],
        vec![],
    );
    let held = tokio::spawn(async move { store.commit(&delete).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = b.clock.now();
    b.store
        .fence_entity(&key(&name), TxnId::new_v7(), now, whole_second(now.plus(RETENTION)))
        .await
        .expect("the fence");
    match held.await.unwrap() {
        Err(CommitError::Contention(_)) => {}
        other => panic!("a delete that met a new fence mark: {other:?}"),
    }
    let entity = b.store.get_entity(&key(&name)).await.unwrap();
    assert!(entity.is_some(), "not deleted");
}

/// An application's native action whose condition fails: the cancellation names its
/// index and DynamoDB's code.
pub async fn a_cancelled_native_action_is_reported_with_its_index_and_code(b: &Backend) {
    let layout = b.layout.as_ref().expect("a DynamoDB layout");
    assert!(layout.sort_key.is_none(), "a dedicated table");
    let check = ConditionCheck::builder()
        .table_name(&layout.table)
        .key(&layout.partition_key, AttributeValue::S(item_name()))
        .condition_expression("attribute_exists(version)")
        .build()
        .unwrap();
    let native = TransactWriteItem::builder().condition_check(check).build();
    let txn = TxnId::new_v7();
    match b.store.commit_native(&request(b, txn, vec![], vec![]), &[native]).await {
        Err(CommitError::ActionCancelled { index, code, .. }) => {
            assert_eq!((index, code.as_str()), (0, "ConditionalCheckFailed"))
        }
        other => panic!("a native action whose condition fails: {other:?}"),
    }
    assert_eq!(record(b, txn).await, None, "nothing written");
}

/// A commit cancelled for a conflict with another transaction on its items: contention,
/// nothing written.
pub async fn a_commit_in_conflict_is_contention_with_nothing_written(p: &Proxied) {
    let b = &p.backend;
    let txn = TxnId::new_v7();
    p.faults.transact(Fault::Conflict);
    match b.store.commit(&request(b, txn, vec![], vec![])).await {
        Err(CommitError::Contention(_)) => {}
        other => panic!("a commit in conflict: {other:?}"),
    }
    assert_eq!(record(b, txn).await, None);
}

/// An entity commit whose condition fails, from an engine that leaves the old item out:
/// the item is read to judge it (here a stale version: a conflict).
pub async fn an_entity_commit_without_its_old_item_reads_the_item(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    create(b, &name).await;
    p.faults.other("UpdateItem", Fault::WithoutOldItems);
    match b
        .store
        .commit_entity(&entity_commit(b, &name, TxnId::new_v7(), ExpectedVersion::Exactly(7)))
        .await
    {
        Err(CommitError::VersionConflict { .. }) => {}
        other => panic!("a stale entity commit: {other:?}"),
    }
}

/// A settle that finds its entry gone (settled by another publisher): done, nothing
/// written.
pub async fn a_second_settle_finds_the_entry_gone(b: &Backend) {
    let name = item_name();
    create(b, &name).await;
    let txn = TxnId::new_v7();
    b.store
        .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(1)))
        .await
        .unwrap();
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    for _ in 0..2 {
        b.store
            .settle_entry(&key(&name), txn, now, expires_at, 4)
            .await
            .expect("settled");
    }
    let entity = b.store.get_entity(&key(&name)).await.unwrap().unwrap();
    assert!(entity.entries.is_empty());
    assert!(entity.sent.contains_key(&txn));
}

/// The settle of an entry in an item full of sent marks puts the record, then removes the
/// entry: when the record's put fails (a 5xx, every retry of the SDK), the entry stays for
/// the worker. Removed anyway, T would have no entry, mark or record, and its next
/// control message would fence a committed, published transaction.
pub async fn a_full_items_settle_whose_record_put_fails_keeps_the_entry(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    create(b, &name).await;
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    for version in 1..=4 {
        let txn = TxnId::new_v7();
        b.store
            .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(version)))
            .await
            .unwrap();
        b.store
            .settle_entry(&key(&name), txn, now, expires_at, 4)
            .await
            .unwrap();
    }
    let txn = TxnId::new_v7();
    b.store
        .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(5)))
        .await
        .unwrap();
    for _ in 0..5 {
        p.faults.other("PutItem", Fault::Drop);
    }
    let settled = b.store.settle_entry(&key(&name), txn, now, expires_at, 4).await;
    assert!(settled.is_err(), "the record's put failed: {settled:?}");
    let entity = b.store.get_entity(&key(&name)).await.unwrap().unwrap();
    assert!(entity.entries.contains_key(&txn), "the entry stays for the worker");
    assert_eq!(entity.sent.len(), 4, "no mark of it");
    assert_eq!(record(b, txn).await, None, "no record either");
    // The next settle, with the table answering, moves it to its record.
    p.faults.others.lock().unwrap().clear();
    b.store
        .settle_entry(&key(&name), txn, now, expires_at, 4)
        .await
        .unwrap();
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Dispatched));
    let entity = b.store.get_entity(&key(&name)).await.unwrap().unwrap();
    assert!(!entity.entries.contains_key(&txn));
}

/// A fence cancelled for a conflict with another transaction on its item: contention
/// (the worker tries again in a later check), nothing written.
pub async fn a_fence_in_conflict_is_contention_with_nothing_written(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    create(b, &name).await;
    let txn = TxnId::new_v7();
    p.faults.transact(Fault::Conflict);
    let now = b.clock.now();
    match b
        .store
        .fence_entity(&key(&name), txn, now, whole_second(now.plus(RETENTION)))
        .await
    {
        Err(StoreError::Contention(_)) => {}
        other => panic!("a fence in conflict: {other:?}"),
    }
    assert_eq!(record(b, txn).await, None);
    assert_eq!(b.store.get_entity(&key(&name)).await.unwrap().unwrap().fence, None);
}

fn big_bodies(count: usize) -> Vec<Value> {
    (0..count)
        .map(|n| json!({"n": n, "padding": "x".repeat(200_000)}))
        .collect()
}

/// A split record read while it is marked: the main item read before the mark, its parts
/// after the mark deleted them (the parts' read held in the network). The read tries
/// again and finds the record dispatched, never a record without its parts.
pub async fn a_split_record_read_across_its_mark_is_read_again(p: &Proxied) {
    let b = &p.backend;
    let txn = TxnId::new_v7();
    b.store
        .commit(&request(b, txn, vec![], messages(txn, &big_bodies(3))))
        .await
        .unwrap();
    let pending = record(b, txn).await.expect("pending");
    p.faults.other("BatchGetItem", Fault::Forward);
    p.faults.other("BatchGetItem", Fault::Late(Duration::from_millis(1500)));
    let store = b.store.clone();
    let read = tokio::spawn(async move { store.get_outboxes(&[txn]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let marked = b
        .store
        .mark_dispatched(&[pending], whole_second(b.clock.now().plus(RETENTION)))
        .await;
    assert!(marked.iter().all(Result::is_ok), "{marked:?}");
    let read = read.await.unwrap().expect("the read");
    assert_eq!(read[&txn].state, OutboxState::Dispatched, "read again after the mark");
}

/// A consumed message's split record whose mark could not delete its parts (the
/// deletes failed: they are left to expire): once the record has expired, a late copy of
/// the message commits anew, the orphan parts replaced, not taken for a tombstone.
pub async fn orphan_parts_of_an_expired_consumed_record_do_not_block_a_late_copy(p: &Proxied) {
    let b = &p.backend;
    let txn = TxnId::consumed("branches", &format!("{}:0", TxnId::new_v7()));
    let first = request(b, txn, vec![], messages(txn, &big_bodies(3)));
    let first = CommitRequest {
        outbox: first.outbox.by_attempt(TxnId::new_v7()),
        ..first
    };
    b.store.commit(&first).await.unwrap();
    let pending = record(b, txn).await.expect("pending");
    // The mark's put goes through; its deletes of the parts fail, every retry.
    p.faults.other("BatchWriteItem", Fault::Forward);
    for _ in 0..5 {
        p.faults.other("BatchWriteItem", Fault::Drop);
    }
    let soon = whole_second(b.clock.now().plus(Duration::from_secs(10)));
    let marked = b.store.mark_dispatched(&[pending], soon).await;
    assert!(marked.iter().all(Result::is_ok), "{marked:?}");
    p.faults.others.lock().unwrap().clear();
    let layout = b.layout.as_ref().expect("a DynamoDB layout");
    let part = p
        .raw
        .get_item()
        .table_name(&layout.table)
        .key(
            &layout.partition_key,
            AttributeValue::S(format!("{}#PART#1", txn.record_key())),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(part.item().is_some(), "the orphan part is there");
    b.clock.advance(Duration::from_secs(20));
    assert_eq!(record(b, txn).await, None, "expired");
    let late = request(b, txn, vec![], messages(txn, &big_bodies(3)));
    let late = CommitRequest {
        outbox: late.outbox.by_attempt(TxnId::new_v7()),
        ..late
    };
    b.store.commit(&late).await.expect("a late copy commits anew");
    assert_eq!(record(b, txn).await, Some(late.outbox));
}

/// How long a race's scenario holds a request at most ([`Fault::Late`]); it lets it go
/// sooner, when it means to ([`FaultProxy::release_next`]).
pub const HOLD: Duration = Duration::from_secs(20);

/// More requests than the SDK's attempts at one call (three), so that the call fails.
const EVERY_ATTEMPT: usize = 5;

/// The control path's timing in these scenarios: a window of two seconds, which the
/// control messages of [`past_its_window`] are past.
fn short_window() -> Timing {
    Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(1),
        max_commit_duration: Duration::from_secs(2),
        retention: RETENTION,
    }
}

/// A window of a minute, for the request path and a control path that finds its records.
fn long_window() -> Timing {
    Timing {
        max_commit_duration: Duration::from_secs(60),
        ..short_window()
    }
}

/// T's control message (in `entity`, for entity mode) as the worker receives it ten
/// seconds after T began: past its window of [`short_window`].
fn past_its_window(b: &Backend, txn: TxnId, entity: Option<ItemKey>) -> ControlDelivery {
    let message = ControlMessage {
        txn_id: txn,
        first_sent_at: b.clock.now().minus(Duration::from_secs(10)),
        attempt: 1,
        entity,
        trace: None,
        retention: None,
    };
    ControlDelivery {
        message_id: format!("control-{txn}"),
        receipt: format!("receipt-{txn}"),
        body: message.encode(),
        receive_count: 1,
    }
}

/// The item under the logical key `logical` as stored, every attribute (a dedicated
/// table), read straight from DynamoDB Local.
async fn stored(p: &Proxied, logical: &str) -> Option<HashMap<String, AttributeValue>> {
    let layout = p.backend.layout.as_ref().expect("a DynamoDB layout");
    assert!(layout.sort_key.is_none(), "a dedicated table");
    p.raw
        .get_item()
        .table_name(&layout.table)
        .key(&layout.partition_key, AttributeValue::S(logical.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("a read of the table")
        .item
}

/// The logical key of part `part` of T's split record.
fn part_key(txn: TxnId, part: usize) -> String {
    format!("{}#PART#{part}", txn.record_key())
}

/// The bodies of what reached `events`, as JSON.
fn bodies_of(delivered: &[super::backend::Delivered]) -> Vec<Value> {
    let mut bodies: Vec<Value> = delivered
        .iter()
        .map(|message| serde_json::from_str(&message.body).expect("a JSON body"))
        .collect();
    bodies.sort_by_key(|body| body["n"].as_u64());
    bodies
}

/// The worker's fence meeting a commit of a split record (the transactional form a
/// transaction begun in entity mode falls back to when its messages do not fit the item:
/// three messages over two parts) held in the network. Either order of their landing
/// keeps the protocol: the commit lands first (the fence, held longer, finds its record
/// and reads it whole: every message published, as committed, and the record marked,
/// its parts deleted), or the fence lands first (the commit, landing after it, is
/// refused by the tombstone: nothing of it written or published).
pub async fn a_fence_meeting_a_split_commit_in_flight_publishes_all_of_it_or_nothing(p: &Proxied) {
    let b = &p.backend;
    let control = b.control(short_window());
    for commit_lands_first in [true, false] {
        let name = item_name();
        create(b, &name).await;
        let txn = TxnId::new_v7();
        let bodies = big_bodies(3);
        let commit = request(
            b,
            txn,
            vec![put(&name, json!({"n": 1}), ExpectedVersion::Exactly(1))],
            messages(txn, &bodies),
        );
        // The commit held; where it lands first, the fence is held behind it.
        p.faults.transact(Fault::Late(HOLD));
        if commit_lands_first {
            p.faults.transact(Fault::Late(HOLD));
        }
        let store = b.store.clone();
        let sent = commit.clone();
        let committing = tokio::spawn(async move { store.commit(&sent).await });
        p.faults
            .met("TransactWriteItems", usize::from(commit_lands_first))
            .await;
        let (handled, committed) = if commit_lands_first {
            // The worker reads (no record yet) and sends its fence, held too.
            let fencing = {
                let (control, delivery) = (control.clone(), past_its_window(b, txn, Some(key(&name))));
                tokio::spawn(async move { control.handle(&delivery).await })
            };
            p.faults.met("TransactWriteItems", 0).await;
            assert!(p.proxy.release_next(), "the commit is still held");
            let committed = committing.await.unwrap();
            assert!(p.proxy.release_next(), "the fence is still held");
            (fencing.await.unwrap(), committed)
        } else {
            let handled = control.handle(&past_its_window(b, txn, Some(key(&name)))).await;
            assert!(p.proxy.release_next(), "the commit is still held");
            (handled, committing.await.unwrap())
        };
        p.proxy.quiesce(Duration::from_secs(10)).await;
        let delivered = b.drain(&events()).await;
        let entity = b.store.get_entity(&key(&name)).await.unwrap().expect("the item");
        if commit_lands_first {
            committed.expect("the commit landed before the fence");
            assert!(
                matches!(handled.result, Ok(ControlOutcome::Dispatched { messages: 3, .. })),
                "the fence found the record whole and the worker published it: {:?}",
                handled.result
            );
            let mut sent_bodies = bodies.clone();
            sent_bodies.sort_by_key(|body| body["n"].as_u64());
            assert_eq!(
                bodies_of(&delivered),
                sent_bodies,
                "every message of the committed transaction, as committed"
            );
            let mut ids: Vec<String> = delivered.iter().filter_map(|m| m.message_id.clone()).collect();
            ids.sort();
            let mut committed_ids: Vec<String> = commit
                .outbox
                .messages
                .iter()
                .map(|m| m.id.as_str().to_owned())
                .collect();
            committed_ids.sort();
            assert_eq!(ids, committed_ids, "each message once, under its id");
            assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Dispatched));
            assert_eq!(
                stored(p, &part_key(txn, 1)).await,
                None,
                "the parts deleted after the mark"
            );
            assert_eq!(
                (entity.item.version, entity.item.data, entity.fence),
                (2, json!({"n": 1}), None),
                "the commit applied; the fence that found it raised no mark"
            );
        } else {
            assert!(
                matches!(committed, Err(CommitError::Tombstoned { txn_id }) if txn_id == txn),
                "the commit landing after the fence is refused: {committed:?}"
            );
            assert!(
                matches!(handled.result, Ok(ControlOutcome::Tombstoned)),
                "the fence landed first: {:?}",
                handled.result
            );
            assert!(
                delivered.is_empty(),
                "nothing of an uncommitted transaction: {delivered:?}"
            );
            assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Tombstone));
            assert_eq!(
                stored(p, &part_key(txn, 1)).await,
                None,
                "no part of the refused commit"
            );
            assert_eq!(
                (entity.item.version, entity.item.data, entity.fence),
                (1, json!({"n": 0}), Some(txn)),
                "nothing of the commit applied; the mark raised"
            );
        }
    }
}

/// A settle of an entity-mode entry held in the network while another publisher settles
/// the entry and a delete vacates the item (moving the sent mark to its record), and in
/// a second round while the key is also created again, with an entry of its own: the
/// held settle, landing last, finds its entry gone and writes nothing, to the vacant key
/// or to its new life: no item brought back, no mark added, no entry touched.
pub async fn a_settle_held_across_a_delete_writes_nothing_to_the_vacant_key_or_its_new_life(p: &Proxied) {
    let b = &p.backend;
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    for created_again in [false, true] {
        let name = item_name();
        let k = key(&name);
        create(b, &name).await;
        let txn = TxnId::new_v7();
        b.store
            .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(1)))
            .await
            .unwrap();
        p.faults.other("UpdateItem", Fault::Late(HOLD));
        let held = {
            let (store, k) = (b.store.clone(), k.clone());
            tokio::spawn(async move { store.settle_entry(&k, txn, now, expires_at, 4).await })
        };
        p.faults.met("UpdateItem", 0).await;
        b.store
            .settle_entry(&k, txn, now, expires_at, 4)
            .await
            .expect("the other publisher's settle");
        let delete = BusinessWrite::Delete {
            key: k.clone(),
            version: 2,
        };
        b.store
            .commit(&request(b, TxnId::new_v7(), vec![delete], vec![]))
            .await
            .expect("the delete");
        let later = TxnId::new_v7();
        if created_again {
            b.store
                .commit_entity(&entity_commit(b, &name, later, ExpectedVersion::AbsentAt(3)))
                .await
                .expect("a new life over the vacant key");
        }
        let before = stored(p, &name).await;
        assert!(
            p.proxy.release_next(),
            "the settle is still held: the delete came first"
        );
        held.await.unwrap().expect("the held settle finds its entry gone: done");
        assert_eq!(stored(p, &name).await, before, "the held settle wrote nothing");
        assert_eq!(
            record(b, txn).await.map(|r| r.state),
            Some(OutboxState::Dispatched),
            "the delete moved T's mark to its record"
        );
        let read = b.store.get_keys(std::slice::from_ref(&k)).await.unwrap();
        let read = read.get(&k).expect("the key keeps its version");
        if created_again {
            assert_eq!(read.version, 4, "the create continued the version");
            let entity = b.store.get_entity(&k).await.unwrap().expect("the new life");
            assert_eq!(
                (entity.entries.keys().copied().collect::<Vec<_>>(), entity.sent.len()),
                (vec![later], 0),
                "the new life's entry, and no mark of the old life's transaction"
            );
        } else {
            assert!(read.item.is_none(), "still vacant");
            assert_eq!(read.version, 3);
        }
    }
}

/// Commits one change of `k` through the request path (`data`: the new data; `None`:
/// a delete), in entity mode or not, with a message tagged `tag` to the FIFO destination
/// (which keeps order: its messages are placed in `k`'s history).
async fn change(outbox: &Outbox, k: &ItemKey, data: Option<Value>, tag: Option<&str>, entity_mode: bool) -> TxnId {
    let mut txn = match entity_mode {
        true => outbox.begin_entity(k.clone()).await,
        false => outbox.begin().await,
    }
    .expect("begin");
    let read = txn.get(k).await.expect("read");
    match (data, &read) {
        (Some(data), Some(item)) => txn.put(k.clone(), data, ExpectedVersion::Exactly(item.version)),
        (Some(data), None) => txn.put(k.clone(), data, ExpectedVersion::Absent),
        (None, Some(item)) => txn.delete(k.clone(), item.version),
        (None, None) => panic!("nothing to delete"),
    }
    if let Some(tag) = tag {
        txn.emit(Message::json(audit(), &json!({ "tag": tag })).expect("a message"));
    }
    txn.commit().await.expect("the commit").txn_id
}

/// A mark of T's record (`BatchWriteItem`) held in the network while a copy of T's
/// control message publishes and marks it, the item is deleted and created again in
/// entity mode (T2, whose message follows T's on the item's chain), and T2 is published:
/// the late mark lands on T's record alone. The new life is as it was (not one attribute
/// changed), T's record says dispatched (so no later publisher sends T again), T2's entry
/// is settled, and a later transaction of the new life (T3) continues the chain and is
/// published after T2, with nothing of T after them.
pub async fn a_mark_held_across_a_delete_and_a_create_leaves_the_new_life_as_it_was(p: &Proxied) {
    let b = &p.backend;
    let outbox = b.outbox(long_window());
    let control = b.control(long_window());
    let name = item_name();
    let k = key(&name);
    change(&outbox, &k, Some(json!({"life": 1})), None, false).await;
    let t = change(&outbox, &k, Some(json!({"life": 1, "n": 1})), Some("T"), false).await;
    p.faults.other("BatchWriteItem", Fault::Late(HOLD));
    let first = {
        let (control, delivery) = (control.clone(), past_its_window(b, t, None));
        tokio::spawn(async move { control.handle(&delivery).await })
    };
    p.faults.met("BatchWriteItem", 0).await;
    let second = control.handle(&past_its_window(b, t, None)).await;
    assert!(
        matches!(second.result, Ok(ControlOutcome::Dispatched { .. })),
        "a copy of T's control message: {:?}",
        second.result
    );
    change(&outbox, &k, None, None, false).await;
    let t2 = change(&outbox, &k, Some(json!({"life": 2})), Some("T2"), true).await;
    let published = control.handle(&past_its_window(b, t2, Some(k.clone()))).await;
    assert!(
        matches!(published.result, Ok(ControlOutcome::Dispatched { .. })),
        "T2: {:?}",
        published.result
    );
    let before = stored(p, &name).await;
    assert!(p.proxy.release_next(), "the first worker's mark is still held");
    let first = first.await.unwrap();
    assert!(
        matches!(first.result, Ok(ControlOutcome::Dispatched { .. })),
        "the late mark: {:?}",
        first.result
    );
    assert_eq!(
        stored(p, &name).await,
        before,
        "the late mark changed nothing of the new life"
    );
    assert_eq!(
        record(b, t).await.map(|r| r.state),
        Some(OutboxState::Dispatched),
        "T's record after the late mark: dispatched, never brought back pending"
    );
    let t3 = change(&outbox, &k, Some(json!({"life": 2, "n": 1})), Some("T3"), true).await;
    let published = control.handle(&past_its_window(b, t3, Some(k.clone()))).await;
    assert!(
        matches!(published.result, Ok(ControlOutcome::Dispatched { .. })),
        "T3: {:?}",
        published.result
    );
    let entity = b.store.get_entity(&k).await.unwrap().expect("the new life");
    assert!(entity.entries.is_empty(), "every entry settled: {:?}", entity.entries);
    assert_eq!(
        (
            entity.item.version,
            entity.sent.contains_key(&t2),
            entity.sent.contains_key(&t3)
        ),
        (5, true, true),
        "created at 4 over the vacant key (T at 2, the delete at 3), T3 at 5, each settled into its mark"
    );
    // What the FIFO destination received, each message id once (a copy of T's is
    // deduplicated or repeats it): T, T2, T3 in that order, on one chain.
    let mut seen = Vec::new();
    let mut places = Vec::new();
    for delivered in b.drain(&audit()).await {
        let id = delivered.message_id.clone().expect("an id");
        let txn = delivered.txn_id.clone().expect("a transaction");
        if let Some(at) = seen.iter().position(|(seen_id, _)| *seen_id == id) {
            assert_eq!(at + 1, seen.len(), "a copy of T's message after a later one");
            continue;
        }
        let position = delivered.position.expect("a place in the item's history");
        places.push((position.seq, position.version, position.after));
        seen.push((id, txn));
    }
    let order: Vec<String> = seen.into_iter().map(|(_, txn)| txn).collect();
    assert_eq!(order, vec![t.to_string(), t2.to_string(), t3.to_string()]);
    assert_eq!(
        places,
        vec![(1, 2, 0), (2, 4, 2), (3, 5, 4)],
        "one chain across the lives"
    );
}

/// Entries that fit the adapter's estimate each, but not the item together: DynamoDB
/// refuses the third (a `ValidationException` on the item's size), which is too large,
/// nothing written; the request path then commits the transaction in the transactional
/// form, its messages in its record.
pub async fn an_item_full_of_entries_is_too_large_for_the_next_and_the_commit_goes_transactional(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    let now = b.clock.now();
    let big = |txn: TxnId, version: u64| EntityCommit {
        entry: OutboxRecord::committed(
            txn,
            messages(txn, &[json!({"padding": "x".repeat(150_000)})]),
            now,
            whole_second(now.plus(RETENTION)),
        ),
        ..entity_commit(b, &name, txn, ExpectedVersion::Exactly(version))
    };
    let kept: Vec<TxnId> = (0..2).map(|_| TxnId::new_v7()).collect();
    for (version, txn) in (1..).zip(&kept) {
        b.store.commit_entity(&big(*txn, version)).await.expect("it fits");
    }
    let refused = b.store.commit_entity(&big(TxnId::new_v7(), 3)).await;
    match &refused {
        Err(CommitError::TooLarge { reason }) => assert!(reason.contains("size"), "{reason}"),
        other => panic!("a third entry past the item's size: {other:?}"),
    }
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert_eq!(
        (entity.item.version, entity.entries.keys().copied().collect::<Vec<_>>()),
        (3, kept.clone()),
        "nothing written"
    );
    let outbox = b.outbox(long_window());
    let mut txn = outbox.begin_entity(k.clone()).await.expect("begin");
    let read = txn.get(&k).await.expect("read").expect("the item");
    txn.put(k.clone(), json!({"n": 9}), ExpectedVersion::Exactly(read.version));
    txn.emit(Message::json(events(), &json!({"padding": "y".repeat(150_000)})).expect("a message"));
    let committed = txn.commit().await.expect("committed in the transactional form");
    let found = record(b, committed.txn_id).await.expect("its record");
    assert_eq!((found.state, found.messages.len()), (OutboxState::Pending, 1));
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert_eq!(
        (entity.item.version, entity.entries.len()),
        (4, 2),
        "the item changed, no entry of it there"
    );
}

/// The tombstone's put fails (every attempt a 5xx): the control path's handling fails,
/// nothing written, and the next control message tombstones the transaction. And a
/// committed split record behind the put's condition (no old item came back) whose read
/// fails: the put fails too, never a tombstone nor a made-up record; once the read works
/// the put finds the record whole.
pub async fn a_tombstone_put_that_fails_writes_nothing_and_decides_nothing(p: &Proxied) {
    let b = &p.backend;
    let control = b.control(short_window());
    let txn = TxnId::new_v7();
    p.faults.fail("PutItem", EVERY_ATTEMPT);
    let handled = control.handle(&past_its_window(b, txn, None)).await;
    p.faults.clear();
    assert!(
        matches!(handled.result, Err(ControlError::Tombstone(_))),
        "the put failed: the message fails, to come back: {:?}",
        handled.result
    );
    assert_eq!(record(b, txn).await, None, "nothing written");
    let again = control.handle(&past_its_window(b, txn, None)).await;
    assert!(
        matches!(again.result, Ok(ControlOutcome::Tombstoned)),
        "{:?}",
        again.result
    );
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Tombstone));

    let txn = TxnId::new_v7();
    let commit = request(b, txn, vec![], messages(txn, &big_bodies(3)));
    b.store.commit(&commit).await.unwrap();
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    p.faults.other("PutItem", Fault::WithoutOldItems);
    p.faults.fail("BatchGetItem", EVERY_ATTEMPT);
    let put = b.store.put_tombstone(txn, now, expires_at).await;
    p.faults.clear();
    assert!(
        matches!(put, Err(StoreError::Unavailable(_))),
        "the record behind the put could not be read: {put:?}"
    );
    assert_eq!(
        record(b, txn).await,
        Some(commit.outbox.clone()),
        "the record, whole and pending"
    );
    match b.store.put_tombstone(txn, now, expires_at).await.unwrap() {
        TombstoneOutcome::Exists(found) => assert_eq!(found, commit.outbox),
        other => panic!("a tombstone put over a commit: {other:?}"),
    }
}

/// The fence's `TransactWriteItems` fails on every attempt: the fence reports the
/// failure (the worker's message comes back), never "fenced", and wrote nothing; where
/// the failures were replies lost after it applied, the next fence finds its tombstone
/// and the mark raised. And the item's read after its condition failed (no old item came
/// back) fails: the fence decides nothing, though the item holds T's entry; once the read
/// works, it finds the entry.
pub async fn a_fence_whose_requests_fail_decides_nothing(p: &Proxied) {
    let b = &p.backend;
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    let txn = TxnId::new_v7();
    for _ in 0..EVERY_ATTEMPT {
        p.faults.transact(Fault::Drop);
    }
    let fenced = b.store.fence_entity(&k, txn, now, expires_at).await;
    p.faults.clear();
    assert!(matches!(fenced, Err(StoreError::Unavailable(_))), "{fenced:?}");
    assert_eq!(record(b, txn).await, None, "nothing written");
    assert_eq!(b.store.get_entity(&k).await.unwrap().unwrap().fence, None);

    for _ in 0..EVERY_ATTEMPT {
        p.faults.transact(Fault::ReplyLost);
    }
    let fenced = b.store.fence_entity(&k, txn, now, expires_at).await;
    p.faults.clear();
    assert!(matches!(fenced, Err(StoreError::Unavailable(_))), "{fenced:?}");
    match b.store.fence_entity(&k, txn, now, expires_at).await.unwrap() {
        FenceOutcome::Recorded(found) => assert_eq!(found.state, OutboxState::Tombstone),
        other => panic!("a fence after one whose replies were lost: {other:?}"),
    }
    assert_eq!(b.store.get_entity(&k).await.unwrap().unwrap().fence, Some(txn));

    let committed = TxnId::new_v7();
    let commit = entity_commit(b, &name, committed, ExpectedVersion::Exactly(1));
    b.store.commit_entity(&commit).await.unwrap();
    p.faults.transact(Fault::WithoutOldItems);
    p.faults.fail("GetItem", EVERY_ATTEMPT);
    let fenced = b.store.fence_entity(&k, committed, now, expires_at).await;
    p.faults.clear();
    assert!(
        matches!(fenced, Err(StoreError::Unavailable(_))),
        "the item could not be read: {fenced:?}"
    );
    assert_eq!(record(b, committed).await, None, "no tombstone beside the entry");
    assert_eq!(
        b.store.fence_entity(&k, committed, now, expires_at).await.unwrap(),
        FenceOutcome::Committed(commit.entry.clone())
    );
}

/// A mark of a split record whose `BatchWriteItem` fails on every attempt, and one whose
/// put DynamoDB leaves unprocessed through every retry: the mark fails, and the record
/// stays pending and whole (its parts not deleted: a record without its parts would
/// lose its messages). Unprocessed once, the put is sent again and the record marked.
pub async fn a_mark_that_fails_leaves_the_record_pending_and_whole(p: &Proxied) {
    let b = &p.backend;
    let txn = TxnId::new_v7();
    let commit = request(b, txn, vec![], messages(txn, &big_bodies(3)));
    b.store.commit(&commit).await.unwrap();
    let expires_at = whole_second(b.clock.now().plus(RETENTION));
    p.faults.fail("BatchWriteItem", EVERY_ATTEMPT);
    let marked = b
        .store
        .mark_dispatched(std::slice::from_ref(&commit.outbox), expires_at)
        .await;
    p.faults.clear();
    assert!(matches!(marked[..], [Err(_)]), "the mark failed: {marked:?}");
    assert_eq!(record(b, txn).await, Some(commit.outbox.clone()), "pending and whole");

    for _ in 0..7 {
        p.faults.other("BatchWriteItem", Fault::Unprocessed);
    }
    let marked = b
        .store
        .mark_dispatched(std::slice::from_ref(&commit.outbox), expires_at)
        .await;
    p.faults.clear();
    assert!(matches!(marked[..], [Err(_)]), "left unprocessed: {marked:?}");
    assert_eq!(record(b, txn).await, Some(commit.outbox.clone()), "pending and whole");

    p.faults.other("BatchWriteItem", Fault::Unprocessed);
    let marked = b
        .store
        .mark_dispatched(std::slice::from_ref(&commit.outbox), expires_at)
        .await;
    assert!(matches!(marked[..], [Ok(())]), "sent again: {marked:?}");
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Dispatched));
    assert_eq!(stored(p, &part_key(txn, 1)).await, None, "the parts deleted");
}

/// A read whose keys DynamoDB leaves unprocessed through every retry fails: never "no
/// record" (the worker would take a committed transaction for an absent one). Unprocessed
/// once, the keys are read again. And a split record read across its mark (torn) whose
/// re-read fails: that record's read fails, the other record of the read is returned.
pub async fn reads_left_unprocessed_or_failing_are_errors_never_absences(p: &Proxied) {
    let b = &p.backend;
    let plain = TxnId::new_v7();
    let commit = request(b, plain, vec![], messages(plain, &[json!({"n": 0})]));
    b.store.commit(&commit).await.unwrap();
    for _ in 0..7 {
        p.faults.other("BatchGetItem", Fault::Unprocessed);
    }
    let read = b.store.get_outboxes(&[plain]).await;
    p.faults.clear();
    assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");
    p.faults.other("BatchGetItem", Fault::Unprocessed);
    assert_eq!(record(b, plain).await, Some(commit.outbox.clone()), "read again");

    let split = TxnId::new_v7();
    b.store
        .commit(&request(b, split, vec![], messages(split, &big_bodies(3))))
        .await
        .unwrap();
    let pending = record(b, split).await.expect("pending");
    p.faults.other("BatchGetItem", Fault::Forward);
    p.faults.other("BatchGetItem", Fault::Late(Duration::from_millis(1500)));
    p.faults.fail("BatchGetItem", EVERY_ATTEMPT);
    let store = b.store.clone();
    let read = tokio::spawn(async move { store.get_outboxes_each(&[split, plain]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let marked = b
        .store
        .mark_dispatched(&[pending], whole_second(b.clock.now().plus(RETENTION)))
        .await;
    assert!(marked.iter().all(Result::is_ok), "{marked:?}");
    let mut read = read.await.unwrap().expect("the first read worked");
    p.faults.clear();
    assert!(
        matches!(read.remove(&split), Some(Err(_))),
        "the torn record's re-read failed"
    );
    assert!(
        matches!(read.remove(&plain), Some(Ok(ref found)) if *found == commit.outbox),
        "the other record is returned"
    );
}

/// A position kept alone whose `UpdateItem` fails on every attempt: whether it applied
/// is unknown (ambiguous), and it did not; the next try moves it.
pub async fn a_position_kept_alone_whose_write_fails_is_ambiguous(p: &Proxied) {
    let b = &p.backend;
    let k = key(&item_name());
    let name = "shipping#events#ORDER#1";
    let at = |seq: u64| Applied {
        seq,
        version: 1,
        txn: None,
    };
    b.store
        .keep_applied(&k, ExpectedVersion::AbsentAt(0), name, at(1))
        .await
        .unwrap();
    p.faults.fail("UpdateItem", EVERY_ATTEMPT);
    let kept = b
        .store
        .keep_applied(&k, ExpectedVersion::AbsentAt(0), name, at(2))
        .await;
    p.faults.clear();
    assert!(matches!(kept, Err(CommitError::Ambiguous(_))), "{kept:?}");
    let position = |keys: std::collections::BTreeMap<ItemKey, outbox::ports::KeyRead>| {
        keys.get(&k)
            .and_then(|read| read.applied.get(name).map(|applied| applied.seq))
    };
    let read = b.store.get_keys(std::slice::from_ref(&k)).await.unwrap();
    assert_eq!(position(read), Some(1), "as it was");
    b.store
        .keep_applied(&k, ExpectedVersion::AbsentAt(0), name, at(2))
        .await
        .unwrap();
    let read = b.store.get_keys(std::slice::from_ref(&k)).await.unwrap();
    assert_eq!(position(read), Some(2));
}

/// An entity commit whose `UpdateItem` fails (a 5xx; one request, the SDK does not
/// retry it) is ambiguous, never "nothing written": dropped, nothing applied; its reply
/// lost, it applied, and the repeat finds its own entry (success). And a commit whose
/// condition failed without the old item, whose read of the item fails: ambiguous, never
/// a conflict.
pub async fn entity_commits_whose_requests_fail_are_ambiguous(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    b.store
        .commit_entity(&entity_commit(b, &name, TxnId::new_v7(), ExpectedVersion::Exactly(1)))
        .await
        .unwrap();
    let commit = entity_commit(b, &name, TxnId::new_v7(), ExpectedVersion::Exactly(2));
    p.faults.other("UpdateItem", Fault::Drop);
    let dropped = b.store.commit_entity(&commit).await;
    p.faults.clear();
    assert!(matches!(dropped, Err(CommitError::Ambiguous(_))), "{dropped:?}");
    assert_eq!(
        b.store.get_entity(&k).await.unwrap().unwrap().item.version,
        2,
        "not applied"
    );
    p.faults.other("UpdateItem", Fault::ReplyLost);
    let lost = b.store.commit_entity(&commit).await;
    p.faults.clear();
    assert!(matches!(lost, Err(CommitError::Ambiguous(_))), "{lost:?}");
    b.store
        .commit_entity(&commit)
        .await
        .expect("the repeat finds its own entry");
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert_eq!(entity.item.version, 3, "applied once");
    assert!(entity.entries.contains_key(&commit.entry.txn_id));

    p.faults.other("UpdateItem", Fault::WithoutOldItems);
    p.faults.fail("GetItem", EVERY_ATTEMPT);
    let stale = b
        .store
        .commit_entity(&entity_commit(b, &name, TxnId::new_v7(), ExpectedVersion::Exactly(2)))
        .await;
    p.faults.clear();
    assert!(matches!(stale, Err(CommitError::Ambiguous(_))), "{stale:?}");
}

/// Settles whose requests fail keep what the worker needs: a settle whose `UpdateItem`
/// fails keeps the entry (no mark); in a full item, where the record was put and the
/// entry's removal fails, the settle fails with the record dispatched and the entry still
/// there, which T's next control message removes without publishing again.
pub async fn settles_whose_requests_fail_keep_the_entry_for_the_worker(p: &Proxied) {
    let b = &p.backend;
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    let txn = TxnId::new_v7();
    b.store
        .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(1)))
        .await
        .unwrap();
    p.faults.fail("UpdateItem", EVERY_ATTEMPT);
    let settled = b.store.settle_entry(&k, txn, now, expires_at, 4).await;
    p.faults.clear();
    assert!(settled.is_err(), "{settled:?}");
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert!(
        entity.entries.contains_key(&txn) && entity.sent.is_empty(),
        "the entry kept"
    );
    b.store.settle_entry(&k, txn, now, expires_at, 4).await.unwrap();

    for version in 2..=4 {
        let txn = TxnId::new_v7();
        b.store
            .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(version)))
            .await
            .unwrap();
        b.store.settle_entry(&k, txn, now, expires_at, 4).await.unwrap();
    }
    let txn = TxnId::new_v7();
    b.store
        .commit_entity(&entity_commit(b, &name, txn, ExpectedVersion::Exactly(5)))
        .await
        .unwrap();
    p.faults.other("UpdateItem", Fault::Forward);
    p.faults.fail("UpdateItem", EVERY_ATTEMPT);
    let settled = b.store.settle_entry(&k, txn, now, expires_at, 4).await;
    p.faults.clear();
    assert!(settled.is_err(), "the entry's removal failed: {settled:?}");
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Dispatched));
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert!(entity.entries.contains_key(&txn), "the entry left for the worker");
    let handled = b
        .control(short_window())
        .handle(&past_its_window(b, txn, Some(k.clone())))
        .await;
    assert!(
        matches!(
            handled.result,
            Ok(ControlOutcome::AlreadyDone {
                state: OutboxState::Dispatched
            })
        ),
        "{:?}",
        handled.result
    );
    let entity = b.store.get_entity(&k).await.unwrap().unwrap();
    assert!(!entity.entries.contains_key(&txn), "removed by the worker");
    assert!(b.drain(&events()).await.is_empty(), "not published again");
}

/// A counter commit of `name` by `txn`, adding `add` and sending one message.
fn counter_commit(b: &Backend, name: &str, txn: TxnId, add: Add) -> CounterCommit {
    let now = b.clock.now();
    CounterCommit {
        key: key(name),
        adds: vec![add],
        entry: OutboxRecord::committed(
            txn,
            messages(txn, &[json!({"added": 1})]),
            now,
            whole_second(now.plus(RETENTION)),
        ),
        checks_fence: true,
    }
}

/// Counter commits whose requests fail are ambiguous, never a refusal, and a repeat finds
/// what applied: an `UpdateItem` dropped before DynamoDB saw it leaves the item as it
/// was; one whose reply was lost applied, and its repeat finds its entry (with the values
/// now) and, once the entry settled, its sent mark, adding nothing either time; an engine
/// that leaves the old item out of a failed condition has the item read, which judges
/// the bound.
pub async fn counter_commits_whose_requests_fail_are_ambiguous(p: &Proxied) {
    let b = &p.backend;
    let now = b.clock.now();
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    let n = || async { b.store.get_entity(&k).await.unwrap().unwrap() };
    b.store
        .commit_counter(&counter_commit(b, &name, TxnId::new_v7(), Add::give_up_to("n", 1, 10)))
        .await
        .expect("the first addition, in the ordinary form");
    let commit = counter_commit(b, &name, TxnId::new_v7(), Add::give_up_to("n", 1, 10));
    p.faults.other("UpdateItem", Fault::Drop);
    let dropped = b.store.commit_counter(&commit).await;
    p.faults.clear();
    assert!(
        matches!(dropped, Err(CounterError::Commit(CommitError::Ambiguous(_)))),
        "{dropped:?}"
    );
    assert_eq!(
        (n().await.item.version, n().await.item.data["n"].clone()),
        (2, json!(1)),
        "not applied"
    );
    p.faults.other("UpdateItem", Fault::ReplyLost);
    let lost = b.store.commit_counter(&commit).await;
    p.faults.clear();
    assert!(
        matches!(lost, Err(CounterError::Commit(CommitError::Ambiguous(_)))),
        "{lost:?}"
    );
    let again = b
        .store
        .commit_counter(&commit)
        .await
        .expect("the repeat finds its own entry");
    assert_eq!((again.version, again.values["n"]), (3, 2), "applied once");
    b.store
        .settle_entry(&k, commit.entry.txn_id, now, whole_second(now.plus(RETENTION)), 4)
        .await
        .expect("the settle");
    let settled = b
        .store
        .commit_counter(&commit)
        .await
        .expect("the repeat finds its sent mark");
    assert!(settled.messages.is_empty(), "{settled:?}");
    assert_eq!(
        (n().await.item.version, n().await.item.data["n"].clone()),
        (3, json!(2)),
        "adds nothing"
    );
    p.faults.other("UpdateItem", Fault::WithoutOldItems);
    let refused = b
        .store
        .commit_counter(&counter_commit(b, &name, TxnId::new_v7(), Add::take("n", 5)))
        .await;
    p.faults.clear();
    assert!(
        matches!(
            refused,
            Err(CounterError::Refused(Refusal::OutOfBounds { value: 2, .. }))
        ),
        "{refused:?}"
    );
}

/// A counter commit on an item with no head yet writes the ordinary form, conditioned on
/// the version it read. Held in the network while another commit moves that version, its
/// write fails and the commit starts again (still no head: the other commit placed no
/// message, so the ordinary form on the new version): applied once, on top of the other
/// commit, its message the chain's first at the version it wrote, and never answered as
/// a conflict. Five concurrent takes reach this only when two of them
/// happen to overlap; here the overlap is made.
pub async fn a_counter_whose_ordinary_write_meets_a_moved_version_starts_again(p: &Proxied) {
    let b = &p.backend;
    let name = item_name();
    let k = key(&name);
    create(b, &name).await;
    // The counter form's UpdateItem goes on (its condition fails: no head); the ordinary
    // form's is held.
    p.faults.other("UpdateItem", Fault::Forward);
    p.faults.other("UpdateItem", Fault::Late(HOLD));
    let commit = counter_commit(b, &name, TxnId::new_v7(), Add::give_up_to("n", 1, 10));
    let held = {
        let (store, commit) = (b.store.clone(), commit.clone());
        tokio::spawn(async move { store.commit_counter(&commit).await })
    };
    p.faults.met("UpdateItem", 0).await;
    b.store
        .commit_entity(&entity_commit(b, &name, TxnId::new_v7(), ExpectedVersion::Exactly(1)))
        .await
        .expect("the other commit, while the ordinary write is held");
    assert!(p.proxy.release_next(), "the ordinary write is still held");
    let done = held.await.unwrap().expect("applied after starting again");
    assert_eq!((done.version, done.values["n"]), (3, 2), "on top of the other commit");
    let position = done.messages[0].position.clone().expect("a place");
    assert_eq!(
        (position.seq, position.version, position.after),
        (1, 3, 0),
        "seq, version, after: the chain's first, at the version the second attempt wrote"
    );
    let entity = b.store.get_entity(&k).await.unwrap().expect("the item");
    assert_eq!((entity.item.version, entity.item.data.clone()), (3, json!({"n": 2})));
    assert!(entity.entries.contains_key(&commit.entry.txn_id), "its entry");
}
