//! Scenarios for what only DynamoDB does (`outbox::aws::branches`), on DynamoDB Local
//! through the fault proxy: answers the engine gives only under a race or a fault (a
//! conflict, an old item left out, a request held in the network, a write that fails),
//! each reached and held to what the protocol needs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
use outbox::aws::AwsClients;
use outbox::ports::{BusinessWrite, Clock, CommitError, CommitRequest, EntityCommit, ExpectedVersion, StoreError};
use outbox::protocol::{OutboxRecord, OutboxState, TxnId};
use serde_json::{json, Value};

use super::backend::Backend;
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
    let faults = Faults::default();
    let (transact, others) = (faults.clone(), faults.clone());
    let proxy = FaultProxy::start_with_others(
        &emulator().dynamodb_endpoint,
        move |_| transact.next_transact(),
        move |target| others.next_other(target),
    )
    .await;
    let config = emulator().sdk_config().await;
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
