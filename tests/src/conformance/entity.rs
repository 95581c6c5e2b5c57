//! The conformance cases of the entity mode (docs/PROTOCOL.md section 11): an item carries its
//! outbox entries, a commit is one conditional write of it, a removal touches one entry.

use std::sync::Arc;

use futures::future::join_all;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::ports::{
    BusinessWrite, Clock, CommitError, EntityCommit, ExpectedVersion, FenceOutcome, ItemKey, RandomIds,
};
use outbox::protocol::{Message, OutboxRecord, OutboxState, TxnId, MESSAGE_ID_ATTRIBUTE};
use serde_json::{json, Value};

use super::backend::{events, Backend};
use super::cases::{key, messages, put, record, request, whole_second, RETENTION};

/// Commit of message `txn`'s entry into `item` by a fresh attempt.
fn entity_commit(b: &Backend, item: &str, txn: TxnId, expected: ExpectedVersion, data: Value) -> EntityCommit {
    let now = b.clock.now();
    EntityCommit {
        key: key(item),
        data: data.clone(),
        expected,
        entry: OutboxRecord::committed(txn, messages(txn, &[data]), now, whole_second(now.plus(RETENTION)))
            .by_attempt(TxnId::new_v7()),
        checks_fence: false,
        applied: None,
    }
}

fn consumed() -> TxnId {
    TxnId::consumed("conformance", &format!("{}:0", TxnId::new_v7()))
}

/// One attempt's write applies with its entry; a repeat of it is success; a rival
/// attempt of the same message is superseded whatever version it expects; a stale
/// version is a conflict; another message's entry joins the first.
pub async fn an_entity_commit_is_one_write_won_by_one_attempt(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let (m1, m2) = (consumed(), consumed());
    let first = entity_commit(b, &item, m1, ExpectedVersion::Absent, json!({"n": 1}));
    b.store.commit_entity(&first).await.expect("the first attempt");
    b.store
        .commit_entity(&first)
        .await
        .unwrap_or_else(|error| panic!("{}: a repeat of the applied attempt is success: {error:?}", b.name));
    for expected in [ExpectedVersion::Absent, ExpectedVersion::Exactly(1)] {
        let rival = entity_commit(b, &item, m1, expected, json!({"n": 99}));
        match b.store.commit_entity(&rival).await {
            Err(CommitError::Superseded { txn_id }) => assert_eq!(txn_id, m1),
            other => panic!("{}: a rival attempt expecting {expected:?}: {other:?}", b.name),
        }
    }
    let stale = entity_commit(b, &item, m2, ExpectedVersion::Absent, json!({"n": 2}));
    assert!(
        matches!(
            b.store.commit_entity(&stale).await,
            Err(CommitError::VersionConflict { .. })
        ),
        "{}",
        b.name
    );
    let second = entity_commit(b, &item, m2, ExpectedVersion::Exactly(1), json!({"n": 2}));
    b.store.commit_entity(&second).await.expect("the second message");
    let found = b.store.get_entity(&key(&item)).await.unwrap().expect("the entity");
    assert_eq!(
        (found.item.version, found.item.data),
        (2, json!({"n": 2})),
        "{}",
        b.name
    );
    assert_eq!(found.entries.len(), 2);
    assert_eq!(
        found.entries[&m1], first.entry,
        "{}: the entry reads back as written",
        b.name
    );
    assert_eq!(found.entries[&m2], second.entry);
    let plain = b.store.get_items(&[key(&item)]).await.unwrap();
    assert_eq!(
        plain[&key(&item)].data,
        json!({"n": 2}),
        "a plain read sees the data only"
    );
}

/// A removal takes one entry out and nothing else; a commit made after the removal from
/// a read before it does not bring the entry back; removing twice, or from an item that
/// is not there, changes nothing and creates nothing.
pub async fn removing_an_entry_keeps_the_rest_and_never_brings_one_back(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let (m1, m2) = (consumed(), consumed());
    b.store
        .commit_entity(&entity_commit(b, &item, m1, ExpectedVersion::Absent, json!({"n": 1})))
        .await
        .unwrap();
    let read = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert!(read.entries.contains_key(&m1));
    b.store.remove_entry(&key(&item), m1).await.expect("the removal");
    let second = entity_commit(
        b,
        &item,
        m2,
        ExpectedVersion::Exactly(read.item.version),
        json!({"n": 2}),
    );
    b.store
        .commit_entity(&second)
        .await
        .expect("a removal does not change the version");
    let after = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert_eq!(
        after.entries.keys().copied().collect::<Vec<_>>(),
        [m2],
        "{}: the removed entry stays removed",
        b.name
    );
    b.store.remove_entry(&key(&item), m1).await.expect("removing again");
    let again = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert_eq!(again, after, "{}: nothing changed", b.name);
    // Removals and commits at once: each removal takes its entry only, and no commit or
    // removal undoes another's.
    let mut version = again.item.version;
    let mut pending = vec![m2];
    for n in 0..6 {
        let m = consumed();
        let commit = entity_commit(b, &item, m, ExpectedVersion::Exactly(version), json!({"n": n}));
        b.store.commit_entity(&commit).await.unwrap();
        version += 1;
        pending.push(m);
    }
    let (leaving, staying) = pending.split_at(4);
    let newcomer = consumed();
    let late = entity_commit(
        b,
        &item,
        newcomer,
        ExpectedVersion::Exactly(version),
        json!({"n": "late"}),
    );
    let entity = key(&item);
    let removals = join_all(leaving.iter().map(|m| b.store.remove_entry(&entity, *m)));
    let (removed, committed) = futures::join!(removals, b.store.commit_entity(&late));
    assert!(removed.iter().all(Result::is_ok), "{removed:?}");
    committed.unwrap_or_else(|error| panic!("{}: a commit beside removals: {error:?}", b.name));
    let after = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    let mut expected: Vec<TxnId> = staying.iter().copied().chain([newcomer]).collect();
    expected.sort();
    assert_eq!(
        after.entries.keys().copied().collect::<Vec<_>>(),
        expected,
        "{}: every removed entry gone, every other kept",
        b.name
    );
    let nowhere = key(&format!("ENTITY#{}", TxnId::new_v7()));
    b.store.remove_entry(&nowhere, m1).await.expect("removing from nothing");
    assert!(
        b.store.get_entity(&nowhere).await.unwrap().is_none(),
        "{}: nothing created",
        b.name
    );
}

/// An item written in the transactional mode takes its first entry; while the entry is
/// there a transactional put of the item keeps it, and a delete (which would drop the
/// entry's messages) meets contention; once the entry is removed the delete applies.
pub async fn an_item_of_the_transactional_mode_takes_entries_and_its_deletes_wait_for_them(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let txn = TxnId::new_v7();
    b.store
        .commit(&request(
            b,
            txn,
            vec![put(&item, json!({"n": 0}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .unwrap();
    let m = consumed();
    let entry = entity_commit(b, &item, m, ExpectedVersion::Exactly(1), json!({"n": 1}));
    b.store
        .commit_entity(&entry)
        .await
        .unwrap_or_else(|error| panic!("{}: the first entry of a plain item: {error:?}", b.name));
    b.store
        .commit_entity(&entry)
        .await
        .unwrap_or_else(|error| panic!("{}: its repeat: {error:?}", b.name));
    let replace = request(
        b,
        TxnId::new_v7(),
        vec![put(&item, json!({"n": 10}), ExpectedVersion::Exactly(2))],
        vec![],
    );
    b.store
        .commit(&replace)
        .await
        .unwrap_or_else(|error| panic!("{}: a transactional put over a pending entry: {error:?}", b.name));
    let kept = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert_eq!(
        (kept.item.version, kept.item.data.clone()),
        (3, json!({"n": 10})),
        "{}",
        b.name
    );
    assert_eq!(
        kept.entries.get(&m),
        Some(&entry.entry),
        "{}: the put keeps the entry",
        b.name
    );
    let delete = request(
        b,
        TxnId::new_v7(),
        vec![BusinessWrite::Delete {
            key: key(&item),
            version: 3,
        }],
        vec![],
    );
    let blocked = b.store.commit(&delete).await;
    assert!(
        matches!(blocked, Err(CommitError::Contention(_))),
        "{}: a delete over a pending entry: {blocked:?}",
        b.name
    );
    b.store.remove_entry(&key(&item), m).await.unwrap();
    b.store
        .commit(&delete)
        .await
        .unwrap_or_else(|error| panic!("{}: the delete once the entry is gone: {error:?}", b.name));
    assert!(b.store.get_entity(&key(&item)).await.unwrap().is_none(), "{}", b.name);
}

/// Copies of one message committing into one item at once: exactly one applies, and
/// every other is told nothing of it was written.
pub async fn concurrent_entity_commits_of_one_message_apply_once(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let m = consumed();
    let commits: Vec<EntityCommit> = (0..4)
        .map(|n| entity_commit(b, &item, m, ExpectedVersion::Absent, json!({"copy": n})))
        .collect();
    let results = join_all(commits.iter().map(|commit| b.store.commit_entity(commit))).await;
    let winners: Vec<usize> = (0..commits.len()).filter(|&n| results[n].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{}: {results:?}", b.name);
    for result in &results {
        assert!(
            matches!(result, Ok(()) | Err(CommitError::Superseded { .. })),
            "{}: {result:?}",
            b.name
        );
    }
    let found = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert_eq!(found.item.data, commits[winners[0]].data);
    assert_eq!(found.entries[&m], commits[winners[0]].entry);
}

/// Records each order in `ENTITY_ORDER#{order}`, in entity mode, and emits `Recorded`.
struct RecordInEntity;

fn entity_of(message: &Incoming) -> Result<ItemKey, HandlerError> {
    let order = message.json::<Value>()?["order_id"]
        .as_str()
        .ok_or("no order_id")?
        .to_owned();
    Ok(format!("ENTITY_ORDER#{order}").parse()?)
}

#[async_trait::async_trait]
impl Handler for RecordInEntity {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let item = entity_of(message)?;
        let (seen, expected) = match staging.get(&item).await? {
            Some(found) => (
                found.data["seen"].as_u64().unwrap_or(0),
                ExpectedVersion::Exactly(found.version),
            ),
            None => (0, ExpectedVersion::Absent),
        };
        staging.put(item, json!({"seen": seen + 1}), expected);
        staging.emit(Message::json(events(), &json!({"type": "Recorded", "seen": seen + 1}))?);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        entity_of(message).map(Some)
    }
}

/// A consumer in entity mode applies a message once, publishes under the derived id,
/// writes its dedup record dispatched, leaves no entry, and acknowledges a copy with
/// nothing done.
pub async fn a_consumer_in_entity_mode_processes_each_message_once(b: &Backend) {
    let order = TxnId::new_v7().to_string();
    let id = format!("{}:0", TxnId::new_v7());
    let delivery = |queue_message_id: &str| Delivery {
        message_id: queue_message_id.into(),
        receipt: String::new(),
        body: json!({"type": "OrderPlaced", "order_id": order}).to_string(),
        attributes: [(MESSAGE_ID_ATTRIBUTE.to_owned(), id.clone())].into(),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    };
    let consumer = Consumer::new(
        "conformance".parse().unwrap(),
        ConsumerPorts {
            store: b.store.clone(),
            publisher: b.publisher.clone(),
            clock: b.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(RecordInEntity),
        RETENTION,
    );
    let first = consumer.consume(&delivery("q-1")).await;
    assert_eq!(first.unwrap(), ConsumeOutcome::Processed { messages: 1 }, "{}", b.name);
    let consumed = consumer.txn_id(&id);
    let out = b.drain(&events()).await;
    assert_eq!(
        out.iter().map(|message| message.message_id.clone()).collect::<Vec<_>>(),
        [Some(format!("{consumed}:0"))],
        "{}",
        b.name
    );
    assert_eq!(
        record(b, consumed).await.expect("the dedup record").state,
        OutboxState::Dispatched
    );
    let again = consumer.consume(&delivery("q-2")).await;
    assert_eq!(again.unwrap(), ConsumeOutcome::Duplicate, "{}", b.name);
    assert!(b.drain(&events()).await.is_empty());
    let entity = b
        .store
        .get_entity(&format!("ENTITY_ORDER#{order}").parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (entity.item.version, entity.item.data),
        (1, json!({"seen": 1})),
        "{}: applied once",
        b.name
    );
    assert!(entity.entries.is_empty(), "{}: no entry left", b.name);
}

/// The request path's fence inside the entity (`docs/ENTITY_MODE.md`): one atomic write
/// raises the item's fence mark to T and puts T's tombstone record, after which neither
/// form of T's commit applies, nor an entity commit of any transaction at or below the
/// mark (one above it applies); it finds T's entry where T committed into the item, T's
/// record where T committed in the transactional form or was dispatched, and an entry
/// beside a tombstone record as a commit. A mark already above T is only checked. A key
/// without an item keeps the mark in a vacant item, which reads as absent and which a
/// create keeps; a delete keeps the mark the same way. Nothing is ever pruned.
pub async fn a_fence_in_the_entity_blocks_a_late_commit_and_finds_a_committed_one(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put(&item, json!({"n": 0}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .unwrap();
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    let entity_key = key(&item);
    let fence = |txn: TxnId, at: ItemKey| async move { b.store.fence_entity(&at, txn, now, expires_at).await };
    let request_commit = |txn: TxnId, version: u64| {
        let mut commit = entity_commit(b, &item, txn, ExpectedVersion::Exactly(version), json!({"n": version}));
        commit.entry.attempt = None;
        commit.checks_fence = true;
        commit
    };
    let mut ids: Vec<TxnId> = (0..6).map(|_| TxnId::new_v7()).collect();
    ids.sort();
    let [below, fenced, above, dispatched, beside, plain] = ids[..] else {
        unreachable!()
    };
    // Fenced (the item had no map), then again: the second finds the tombstone record.
    assert_eq!(
        fence(fenced, entity_key.clone()).await.unwrap(),
        FenceOutcome::Fenced,
        "{}",
        b.name
    );
    match fence(fenced, entity_key.clone()).await.unwrap() {
        FenceOutcome::Recorded(record) => assert_eq!(record.state, OutboxState::Tombstone, "{}", b.name),
        other => panic!("{}: a second fence: {other:?}", b.name),
    }
    let entity = b.store.get_entity(&entity_key).await.unwrap().unwrap();
    assert_eq!(entity.fence, Some(fenced), "{}: the mark", b.name);
    assert!(entity.entries.is_empty(), "{}: no slot", b.name);
    assert_eq!(entity.item.version, 1, "{}: the fence changes no version", b.name);
    for refused in [fenced, below] {
        match b.store.commit_entity(&request_commit(refused, 1)).await {
            Err(CommitError::EntityFenced { txn_id }) => assert_eq!(txn_id, refused),
            other => panic!("{}: an entity commit at or below the mark: {other:?}", b.name),
        }
    }
    let transactional = request(
        b,
        fenced,
        vec![put(&item, json!({"n": 9}), ExpectedVersion::Exactly(1))],
        vec![],
    );
    match b.store.commit(&transactional).await {
        Err(CommitError::Tombstoned { txn_id }) => assert_eq!(txn_id, fenced),
        other => panic!("{}: a transactional commit after its fence: {other:?}", b.name),
    }
    // Below the mark already: the fence checks it and writes the record only.
    assert_eq!(
        fence(below, entity_key.clone()).await.unwrap(),
        FenceOutcome::Fenced,
        "{}",
        b.name
    );
    assert_eq!(
        b.store.get_entity(&entity_key).await.unwrap().unwrap().fence,
        Some(fenced)
    );
    assert_eq!(
        record(b, below).await.map(|record| record.state),
        Some(OutboxState::Tombstone)
    );
    // Above the mark: it commits; its fence then finds the entry and writes nothing.
    let commit = request_commit(above, 1);
    b.store.commit_entity(&commit).await.expect("a commit above the mark");
    assert_eq!(
        fence(above, entity_key.clone()).await.unwrap(),
        FenceOutcome::Committed(commit.entry.clone()),
        "{}",
        b.name
    );
    assert!(
        record(b, above).await.is_none(),
        "{}: no tombstone beside a commit",
        b.name
    );
    // Dispatched, its outcome moved to its record: the fence finds the record.
    b.store.put_dispatched(dispatched, now, expires_at).await.unwrap();
    match fence(dispatched, entity_key.clone()).await.unwrap() {
        FenceOutcome::Recorded(record) => assert_eq!(record.state, OutboxState::Dispatched),
        other => panic!("{}: a fence after dispatch: {other:?}", b.name),
    }
    // An entry beside a plain tombstone record (written without the fence): a commit.
    b.store.put_tombstone(beside, now, expires_at).await.unwrap();
    let commit_beside = request_commit(beside, 2);
    b.store
        .commit_entity(&commit_beside)
        .await
        .expect("the mark is below it");
    assert_eq!(
        fence(beside, entity_key.clone()).await.unwrap(),
        FenceOutcome::Committed(commit_beside.entry.clone()),
        "{}",
        b.name
    );
    let entity = b.store.get_entity(&entity_key).await.unwrap().unwrap();
    assert_eq!(entity.item.version, 3, "{}: only the commits changed the item", b.name);
    assert_eq!(entity.fence, Some(fenced), "{}: the mark only moves up", b.name);
    // A tombstone record written without the fence, no entry: the mark is raised to it.
    b.store.put_tombstone(plain, now, expires_at).await.unwrap();
    match fence(plain, entity_key.clone()).await.unwrap() {
        FenceOutcome::Recorded(record) => assert_eq!(record.state, OutboxState::Tombstone, "{}", b.name),
        other => panic!("{}: a fence after a plain tombstone: {other:?}", b.name),
    }
    assert_eq!(
        b.store.get_entity(&entity_key).await.unwrap().unwrap().fence,
        Some(plain),
        "{}",
        b.name
    );
    // Deleted (its entries gone first) and created again: the mark stays with the key.
    for txn in [above, beside] {
        b.store.remove_entry(&entity_key, txn).await.unwrap();
    }
    let delete = request(
        b,
        TxnId::new_v7(),
        vec![BusinessWrite::Delete {
            key: entity_key.clone(),
            version: 3,
        }],
        vec![],
    );
    b.store.commit(&delete).await.expect("the delete");
    assert!(
        b.store.get_entity(&entity_key).await.unwrap().is_none(),
        "{}: deleted",
        b.name
    );
    assert!(
        b.store
            .get_items(std::slice::from_ref(&entity_key))
            .await
            .unwrap()
            .is_empty(),
        "{}",
        b.name
    );
    let create = request(
        b,
        TxnId::new_v7(),
        vec![put(&item, json!({"n": 0}), ExpectedVersion::Absent)],
        vec![],
    );
    b.store
        .commit(&create)
        .await
        .expect("created again over the vacant key");
    let again = b.store.get_entity(&entity_key).await.unwrap().unwrap();
    assert_eq!(
        (again.item.version, again.fence),
        (5, Some(plain)),
        "{}: the mark kept, the version continued (3, the delete's 4, the create's 5)",
        b.name
    );
    assert!(matches!(
        b.store.commit_entity(&request_commit(fenced, 5)).await,
        Err(CommitError::EntityFenced { .. })
    ));
    // A key without an item: the mark goes into a vacant item, read as absent, kept by the
    // item created there later.
    let nowhere_item = format!("ENTITY#{}", TxnId::new_v7());
    let nowhere = key(&nowhere_item);
    let unknown = TxnId::new_v7();
    assert_eq!(
        fence(unknown, nowhere.clone()).await.unwrap(),
        FenceOutcome::Fenced,
        "{}",
        b.name
    );
    assert!(b.store.get_entity(&nowhere).await.unwrap().is_none(), "{}", b.name);
    assert!(
        b.store
            .get_items(std::slice::from_ref(&nowhere))
            .await
            .unwrap()
            .is_empty(),
        "{}",
        b.name
    );
    assert_eq!(
        record(b, unknown).await.map(|record| record.state),
        Some(OutboxState::Tombstone)
    );
    let create = request(
        b,
        TxnId::new_v7(),
        vec![put(&nowhere_item, json!({"n": 0}), ExpectedVersion::Absent)],
        vec![],
    );
    b.store.commit(&create).await.expect("a create over the vacant key");
    assert_eq!(
        b.store.get_entity(&nowhere).await.unwrap().unwrap().fence,
        Some(unknown),
        "{}",
        b.name
    );
}

/// A transaction begun in entity mode whose messages were too big for its item committed
/// in the transactional form, its record split over parts, while its fence was on its way:
/// the fence finds the record whole (every part's messages), and so does a tombstone write
/// that meets it, so that the worker publishes all of them.
pub async fn a_fence_meeting_a_committed_split_record_finds_it_whole(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put(&item, json!({"n": 0}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .unwrap();
    let txn = TxnId::new_v7();
    let bodies: Vec<Value> = (0..9)
        .map(|n| json!({"n": n, "padding": "x".repeat(100_000)}))
        .collect();
    let commit = request(
        b,
        txn,
        vec![put(&item, json!({"n": 1}), ExpectedVersion::Exactly(1))],
        messages(txn, &bodies),
    );
    b.store.commit(&commit).await.expect("commit of 900 kB of messages");
    let now = b.clock.now();
    let expires_at = whole_second(now.plus(RETENTION));
    match b.store.fence_entity(&key(&item), txn, now, expires_at).await.unwrap() {
        FenceOutcome::Recorded(found) => assert_eq!(
            found.messages.len(),
            9,
            "{}: the fence returns the split record whole",
            b.name
        ),
        other => panic!("{}: a fence after a commit: {other:?}", b.name),
    }
    match b.store.put_tombstone(txn, now, expires_at).await.unwrap() {
        outbox::ports::TombstoneOutcome::Exists(found) => assert_eq!(found, commit.outbox, "{}", b.name),
        other => panic!("{}: a tombstone after a commit: {other:?}", b.name),
    }
    assert_eq!(
        b.store.get_entity(&key(&item)).await.unwrap().unwrap().fence,
        None,
        "{}: a fence that found the commit raises no mark",
        b.name
    );
}

/// An entry in an item is always proof of its transaction's commit: an entity commit whose
/// entry is a tombstone is refused on every backend, and nothing is written.
pub async fn an_entity_commit_of_a_tombstone_entry_is_refused(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let txn = TxnId::new_v7();
    let now = b.clock.now();
    let commit = EntityCommit {
        entry: OutboxRecord::tombstone(txn, now, whole_second(now.plus(RETENTION))),
        ..entity_commit(b, &item, txn, ExpectedVersion::Absent, json!({"n": 1}))
    };
    match b.store.commit_entity(&commit).await {
        Err(CommitError::Invalid { reason }) => assert!(reason.contains("tombstone"), "{}: {reason}", b.name),
        other => panic!("{}: a tombstone entry: {other:?}", b.name),
    }
    assert!(b.store.get_entity(&key(&item)).await.unwrap().is_none(), "{}", b.name);
}

/// A late attempt of a committed transaction never applies to a later life of its item:
/// T's attempt, held while T commits through another attempt, is settled, the item is
/// deleted and created anew, and then the attempt arrives. Versions continue across a delete, so the item is never at T's version again
/// and the attempt is a conflict: T's data does not overwrite the new item, and no second
/// entry of T (which no control message would ever publish) lands in it.
pub async fn a_late_attempt_never_applies_to_a_later_life_of_its_item(b: &Backend) {
    let item = format!("ENTITY#{}", TxnId::new_v7());
    let entity_key = key(&item);
    let create = |life: u64| {
        request(
            b,
            TxnId::new_v7(),
            vec![put(&item, json!({"life": life}), ExpectedVersion::Absent)],
            vec![],
        )
    };
    b.store.commit(&create(1)).await.expect("the first life");
    let t = TxnId::new_v7();
    let mut held = entity_commit(b, &item, t, ExpectedVersion::Exactly(1), json!({"by": "T"}));
    held.entry.attempt = None;
    held.checks_fence = true;
    b.store.commit_entity(&held).await.expect("T commits");
    let now = b.clock.now();
    b.store
        .settle_entry(&entity_key, t, now, whole_second(now.plus(RETENTION)), 4)
        .await
        .expect("T's messages went out");
    let delete = |version| BusinessWrite::Delete {
        key: entity_key.clone(),
        version,
    };
    b.store
        .commit(&request(b, TxnId::new_v7(), vec![delete(2)], vec![]))
        .await
        .expect("the delete");
    b.store.commit(&create(2)).await.expect("a new life");
    // Were versions to restart, the new life would be at version 1, the one T expected.
    match b.store.commit_entity(&held).await {
        Err(CommitError::VersionConflict { .. }) => {}
        other => panic!("{}: T's late attempt on the item's new life: {other:?}", b.name),
    }
    let version = b.store.get_items(std::slice::from_ref(&entity_key)).await.unwrap()[&entity_key].version;
    assert_eq!(
        version, 4,
        "{}: the delete and the new life continue the versions",
        b.name
    );
    let found = b.store.get_entity(&entity_key).await.unwrap().expect("the new life");
    assert_eq!(
        (found.item.data, found.entries.contains_key(&t)),
        (json!({"life": 2}), false),
        "{}: the new life is untouched",
        b.name
    );
}
