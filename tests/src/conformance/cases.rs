//! The conformance cases: each states one behaviour every backend must have.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery, Handler, HandlerError, Incoming, Staging};
use outbox::ports::Clock;
use outbox::ports::RandomIds;
use outbox::ports::{BusinessWrite, CommitError, CommitRequest, ExpectedVersion, ItemKey, TombstoneOutcome};
use outbox::protocol::{
    ControlMessage, IdempotencyKey, IdempotencyRecord, IdempotencySlot, Message, OutboxRecord, OutboxState,
    OutgoingMessage, StoredResponse, TraceContext, TxnId,
};
use outbox::time::Timestamp;
use serde_json::{json, Value};

use super::backend::{audit, bus, events, fanout, Backend};
pub use super::chain::*;
pub use super::consumer_hop::*;
pub use super::counter::*;
pub use super::differences::*;
pub use super::entity::*;
pub use super::kept::*;
pub use super::producers::*;
pub use super::request_entity::*;

pub(super) const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

pub(super) fn key(text: &str) -> ItemKey {
    text.parse().expect("valid key")
}

/// An instant on a whole second, so that TTLs (kept in seconds by DynamoDB) read back
/// exactly.
pub(super) fn whole_second(at: Timestamp) -> Timestamp {
    Timestamp::from_millis(at.as_millis() / 1000 * 1000)
}

pub(super) fn put(name: &str, data: Value, expected: ExpectedVersion) -> BusinessWrite {
    BusinessWrite::Put {
        key: key(name),
        data,
        expected,
    }
}

pub(super) fn messages(txn_id: TxnId, bodies: &[Value]) -> Vec<OutgoingMessage> {
    bodies
        .iter()
        .enumerate()
        .map(|(position, body)| {
            let message = Message::json(events(), body)
                .expect("serialisable")
                .with_attribute("type", "Test");
            OutgoingMessage::new(txn_id, position as u32, message)
        })
        .collect()
}

pub(super) fn request(
    backend: &Backend,
    txn_id: TxnId,
    writes: Vec<BusinessWrite>,
    messages: Vec<OutgoingMessage>,
) -> CommitRequest {
    let now = backend.clock.now();
    CommitRequest {
        txn_id,
        writes,
        outbox: OutboxRecord::committed(txn_id, messages, now, whole_second(now.plus(RETENTION))),
        idempotency: None,
    }
}

fn idempotency(backend: &Backend, txn_id: TxnId, key_text: &str) -> IdempotencyRecord {
    let key: IdempotencyKey = key_text.parse().expect("valid key");
    let now = backend.clock.now();
    IdempotencyRecord {
        slot: IdempotencySlot::new("conformance", &key),
        fingerprint: "fp".into(),
        txn_id,
        response: StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: "{\"ok\":true}".into(),
        },
        created_at: now,
        expires_at: whole_second(now.plus(RETENTION)),
    }
}

async fn tombstone(backend: &Backend, txn_id: TxnId) -> TombstoneOutcome {
    let now = backend.clock.now();
    backend
        .store
        .put_tombstone(txn_id, now, whole_second(now.plus(RETENTION)))
        .await
        .expect("tombstone put")
}

pub(super) async fn record(backend: &Backend, txn_id: TxnId) -> Option<OutboxRecord> {
    backend
        .store
        .get_outboxes(&[txn_id])
        .await
        .expect("outbox read")
        .remove(&txn_id)
}

/// A commit writes business items, the outbox record and the idempotency record, and
/// consistent reads return them exactly.
pub async fn commit_then_read_everything_back(b: &Backend) {
    let txn = TxnId::new_v7();
    let data = json!({"name": "a", "amount": 12.5, "tags": ["x", "y"], "nested": {"flag": true, "none": null}});
    let mut commit = request(
        b,
        txn,
        vec![put("ITEM#1", data.clone(), ExpectedVersion::Absent)],
        messages(txn, &[json!({"n": 1}), json!({"n": 2})]),
    );
    let idem = idempotency(b, txn, "key-1");
    commit.idempotency = Some(idem.clone());
    b.store.commit(&commit).await.expect("commit");

    let items = b.store.get_items(&[key("ITEM#1")]).await.expect("item read");
    assert_eq!(items[&key("ITEM#1")].version, 1);
    assert_eq!(items[&key("ITEM#1")].data, data);
    assert_eq!(record(b, txn).await, Some(commit.outbox.clone()));
    assert_eq!(
        b.store.get_idempotency(&idem.slot).await.expect("idempotency read"),
        Some(idem)
    );
}

/// Once a tombstone exists, the transaction's commit fails as tombstoned and writes
/// nothing at all.
pub async fn a_commit_after_a_tombstone_is_rejected_with_nothing_written(b: &Backend) {
    let txn = TxnId::new_v7();
    assert_eq!(tombstone(b, txn).await, TombstoneOutcome::Written);
    let mut commit = request(
        b,
        txn,
        vec![put("ITEM#1", json!({"n": 1}), ExpectedVersion::Absent)],
        messages(txn, &[json!(1)]),
    );
    commit.idempotency = Some(idempotency(b, txn, "key-1"));
    match b.store.commit(&commit).await {
        Err(CommitError::Tombstoned { txn_id }) => assert_eq!(txn_id, txn),
        other => panic!("{}: expected Tombstoned, got {other:?}", b.name),
    }
    assert!(
        b.store.get_items(&[key("ITEM#1")]).await.unwrap().is_empty(),
        "business write applied"
    );
    assert_eq!(
        b.store
            .get_idempotency(&commit.idempotency.unwrap().slot)
            .await
            .unwrap(),
        None
    );
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Tombstone));
}

/// Once a transaction committed, a tombstone for it is refused, and the refusal shows
/// the committed record so that the worker can dispatch it.
pub async fn a_tombstone_after_a_commit_is_refused_and_shows_the_record(b: &Backend) {
    let txn = TxnId::new_v7();
    let commit = request(b, txn, vec![], messages(txn, &[json!({"n": 1})]));
    b.store.commit(&commit).await.expect("commit");
    match tombstone(b, txn).await {
        TombstoneOutcome::Exists(found) => assert_eq!(found, commit.outbox),
        other => panic!("{}: expected the committed record, got {other:?}", b.name),
    }
    assert_eq!(record(b, txn).await.map(|r| r.state), Some(OutboxState::Pending));
}

/// Several transactions creating one item at once: exactly one wins; the others are
/// told nothing was written.
pub async fn concurrent_commits_of_one_item_exactly_one_wins(b: &Backend) {
    let commits: Vec<CommitRequest> = (0..5)
        .map(|n| {
            let txn = TxnId::new_v7();
            request(
                b,
                txn,
                vec![put("ITEM#1", json!({"writer": n}), ExpectedVersion::Absent)],
                messages(txn, &[json!(n)]),
            )
        })
        .collect();
    let results = join_all(commits.iter().map(|commit| b.store.commit(commit))).await;
    let winners: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_ok())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(winners.len(), 1, "{}: {results:?}", b.name);
    for result in &results {
        assert!(
            matches!(
                result,
                Ok(()) | Err(CommitError::VersionConflict { .. } | CommitError::Contention(_))
            ),
            "{}: a loser must be told nothing was written: {result:?}",
            b.name
        );
    }
    let item = &b.store.get_items(&[key("ITEM#1")]).await.unwrap()[&key("ITEM#1")];
    assert_eq!((item.version, item.data.clone()), (1, json!({"writer": winners[0]})));
    for (index, commit) in commits.iter().enumerate() {
        assert_eq!(
            record(b, commit.txn_id).await.is_some(),
            index == winners[0],
            "only the winner's outbox record exists"
        );
    }
}

/// Each committed put advances the version; a put from a stale version conflicts.
pub async fn versions_advance_and_stale_versions_conflict(b: &Backend) {
    let write = |expected, n: u64| {
        let txn = TxnId::new_v7();
        request(b, txn, vec![put("ITEM#1", json!({"n": n}), expected)], vec![])
    };
    b.store
        .commit(&write(ExpectedVersion::Absent, 1))
        .await
        .expect("create");
    b.store
        .commit(&write(ExpectedVersion::Exactly(1), 2))
        .await
        .expect("update");
    for stale in [
        ExpectedVersion::Exactly(1),
        ExpectedVersion::Absent,
        ExpectedVersion::Exactly(3),
    ] {
        match b.store.commit(&write(stale, 9)).await {
            Err(CommitError::VersionConflict { key: conflict }) => assert_eq!(conflict, key("ITEM#1")),
            other => panic!("{}: {stale:?} should conflict, got {other:?}", b.name),
        }
    }
    let item = &b.store.get_items(&[key("ITEM#1")]).await.unwrap()[&key("ITEM#1")];
    assert_eq!((item.version, item.data.clone()), (2, json!({"n": 2})));
}

/// Deletes and checks hold only at the expected version.
pub async fn deletes_and_checks_are_conditioned_on_versions(b: &Backend) {
    let commit = |writes| request(b, TxnId::new_v7(), writes, vec![]);
    b.store
        .commit(&commit(vec![put("ITEM#1", json!({}), ExpectedVersion::Absent)]))
        .await
        .expect("create");
    let check = |version| BusinessWrite::Check {
        key: key("ITEM#1"),
        expected: ExpectedVersion::Exactly(version),
    };
    assert!(matches!(
        b.store
            .commit(&commit(vec![
                check(2),
                put("ITEM#2", json!({}), ExpectedVersion::Absent)
            ]))
            .await,
        Err(CommitError::VersionConflict { .. })
    ));
    assert!(
        b.store.get_items(&[key("ITEM#2")]).await.unwrap().is_empty(),
        "a failed check writes nothing"
    );
    b.store
        .commit(&commit(vec![
            check(1),
            put("ITEM#2", json!({}), ExpectedVersion::Absent),
        ]))
        .await
        .expect("check holds");
    let delete = |version| BusinessWrite::Delete {
        key: key("ITEM#1"),
        version,
    };
    assert!(matches!(
        b.store.commit(&commit(vec![delete(2)])).await,
        Err(CommitError::VersionConflict { .. })
    ));
    b.store.commit(&commit(vec![delete(1)])).await.expect("delete");
    assert_eq!(
        b.store.get_items(&[key("ITEM#1"), key("ITEM#2")]).await.unwrap().len(),
        1
    );
}

/// An idempotency record put on its own (a refusal kept as its key's answer) is written
/// where the key holds no live record, and otherwise leaves the one there and returns it:
/// the key's first answer stays. A commit under the key then meets it, as it meets a
/// record another commit wrote; once it expires, a put writes again.
pub async fn an_idempotency_record_put_alone_keeps_the_first_answer(b: &Backend) {
    let mut refusal = idempotency(b, TxnId::new_v7(), "alone");
    refusal.response = StoredResponse {
        status: 409,
        headers: vec![("content-type".into(), "application/problem+json".into())],
        body: "{\"type\":\"/problems/out-of-stock\"}".into(),
    };
    assert_eq!(
        b.store.put_idempotency(&refusal).await.expect("put"),
        None,
        "{}: written where the key holds none",
        b.name
    );
    let slot = refusal.slot.clone();
    assert_eq!(b.store.get_idempotency(&slot).await.unwrap(), Some(refusal.clone()));
    let later = idempotency(b, TxnId::new_v7(), "alone");
    assert_eq!(
        b.store.put_idempotency(&later).await.expect("put"),
        Some(refusal.clone()),
        "{}: the first answer is returned",
        b.name
    );
    assert_eq!(
        b.store.get_idempotency(&slot).await.unwrap(),
        Some(refusal.clone()),
        "{}: and stays",
        b.name
    );
    let txn = later.txn_id;
    let mut commit = request(
        b,
        txn,
        vec![put("ITEM#alone", json!({}), ExpectedVersion::Absent)],
        vec![],
    );
    commit.idempotency = Some(later.clone());
    match b.store.commit(&commit).await {
        Err(CommitError::IdempotencyKeyUsed { slot: used }) => assert_eq!(used, slot),
        other => panic!("{}: expected IdempotencyKeyUsed, got {other:?}", b.name),
    }
    assert!(b.store.get_items(&[key("ITEM#alone")]).await.unwrap().is_empty());
    b.clock.advance(RETENTION + Duration::from_secs(2));
    let mut again = idempotency(b, TxnId::new_v7(), "alone");
    again.fingerprint = "another".into();
    assert_eq!(
        b.store.put_idempotency(&again).await.expect("put"),
        None,
        "{}: an expired record no longer holds its key",
        b.name
    );
    assert_eq!(b.store.get_idempotency(&slot).await.unwrap(), Some(again));
}

/// A second transaction with a used idempotency key is refused and writes nothing; once
/// the key's record expires, the key can be used again.
pub async fn an_idempotency_key_commits_once(b: &Backend) {
    let first = TxnId::new_v7();
    let mut commit = request(b, first, vec![], vec![]);
    commit.idempotency = Some(idempotency(b, first, "once"));
    b.store.commit(&commit).await.expect("first use");

    let second = TxnId::new_v7();
    let mut repeat = request(
        b,
        second,
        vec![put("ITEM#1", json!({}), ExpectedVersion::Absent)],
        vec![],
    );
    repeat.idempotency = Some(idempotency(b, second, "once"));
    match b.store.commit(&repeat).await {
        Err(CommitError::IdempotencyKeyUsed { slot }) => assert_eq!(slot, commit.idempotency.as_ref().unwrap().slot),
        other => panic!("{}: expected IdempotencyKeyUsed, got {other:?}", b.name),
    }
    assert!(b.store.get_items(&[key("ITEM#1")]).await.unwrap().is_empty());
    let stored = b
        .store
        .get_idempotency(&repeat.idempotency.as_ref().unwrap().slot)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(stored.txn_id, first, "the first use's response is kept");

    b.clock.advance(RETENTION + Duration::from_secs(2));
    let third = TxnId::new_v7();
    let mut later = request(b, third, vec![], vec![]);
    later.idempotency = Some(idempotency(b, third, "once"));
    b.store.commit(&later).await.expect("an expired key is free again");
}

/// Committing the same request again (a retry after a lost reply) finds the
/// transaction's own record and reports success without writing twice.
pub async fn a_retried_commit_finds_its_own_record_and_succeeds(b: &Backend) {
    let txn = TxnId::new_v7();
    let mut commit = request(
        b,
        txn,
        vec![put("ITEM#1", json!({"n": 1}), ExpectedVersion::Absent)],
        messages(txn, &[json!(1)]),
    );
    commit.idempotency = Some(idempotency(b, txn, "retried"));
    b.store.commit(&commit).await.expect("first attempt");
    b.store.commit(&commit).await.expect("the retry reports the commit");
    let pending = record(b, txn).await.expect("record");
    assert_eq!(
        b.store
            .mark_dispatched(
                std::slice::from_ref(&pending),
                whole_second(b.clock.now().plus(RETENTION))
            )
            .await
            .len(),
        1
    );
    b.store
        .commit(&commit)
        .await
        .expect("a retry after dispatch still reports the commit");
    assert_eq!(
        b.store.get_items(&[key("ITEM#1")]).await.unwrap()[&key("ITEM#1")].version,
        1,
        "written once"
    );
}

/// Records whose TTL has passed read as absent, whether or not they are deleted yet.
pub async fn an_expired_record_reads_as_absent(b: &Backend) {
    let committed = TxnId::new_v7();
    b.store
        .commit(&request(b, committed, vec![], vec![]))
        .await
        .expect("commit");
    let tombstoned = TxnId::new_v7();
    tombstone(b, tombstoned).await;
    let found = b.store.get_outboxes(&[committed, tombstoned]).await.unwrap();
    assert_eq!(
        found[&committed].state,
        OutboxState::Dispatched,
        "a commit without messages is recorded dispatched"
    );
    assert_eq!(found[&tombstoned].state, OutboxState::Tombstone);
    b.clock.advance(RETENTION + Duration::from_secs(2));
    assert!(
        b.store.get_outboxes(&[committed, tombstoned]).await.unwrap().is_empty(),
        "{}: expired records still read",
        b.name
    );
}

/// A record whose messages exceed one item round-trips whole and in order, and is
/// marked dispatched like any other.
pub async fn a_split_outbox_round_trips_and_is_marked_dispatched(b: &Backend) {
    let txn = TxnId::new_v7();
    let bodies: Vec<Value> = (0..9)
        .map(|n| json!({"n": n, "padding": "x".repeat(100_000)}))
        .collect();
    let commit = request(b, txn, vec![], messages(txn, &bodies));
    b.store.commit(&commit).await.expect("commit of 900 kB of messages");
    let found = record(b, txn).await.expect("record");
    assert_eq!(found, commit.outbox, "{}: the split record reads back whole", b.name);
    let expires_at = whole_second(b.clock.now().plus(RETENTION));
    let results = b.store.mark_dispatched(&[found], expires_at).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let dispatched = record(b, txn).await.expect("record");
    assert_eq!(
        (dispatched.state, dispatched.messages.len(), dispatched.expires_at),
        (OutboxState::Dispatched, 0, Some(expires_at))
    );
}

/// More than one transaction can carry is refused as too large, and nothing is written.
pub async fn beyond_one_transaction_the_commit_is_refused(b: &Backend) {
    let txn = TxnId::new_v7();
    let writes = (0..101)
        .map(|n| put(&format!("ITEM#{n}"), json!({}), ExpectedVersion::Absent))
        .collect();
    assert!(matches!(
        b.store.commit(&request(b, txn, writes, vec![])).await,
        Err(CommitError::TooLarge { .. })
    ));
    let txn = TxnId::new_v7();
    let bodies: Vec<Value> = (0..45)
        .map(|n| json!({"n": n, "padding": "x".repeat(100_000)}))
        .collect();
    assert!(matches!(
        b.store.commit(&request(b, txn, vec![], messages(txn, &bodies))).await,
        Err(CommitError::TooLarge { .. })
    ));
    assert_eq!(record(b, txn).await, None);
    assert!(b.store.get_items(&[key("ITEM#0")]).await.unwrap().is_empty());
}

/// Reads of more keys than one batch call takes still return every item found.
pub async fn batched_reads_beyond_one_call_return_everything(b: &Backend) {
    let writes: Vec<BusinessWrite> = (0..20)
        .map(|n| put(&format!("ITEM#{n}"), json!({"n": n}), ExpectedVersion::Absent))
        .collect();
    b.store
        .commit(&request(b, TxnId::new_v7(), writes, vec![]))
        .await
        .expect("commit");
    let keys: Vec<ItemKey> = (0..150).map(|n| key(&format!("ITEM#{n}"))).collect();
    let found = b.store.get_items(&keys).await.expect("read");
    assert_eq!(found.len(), 20);
    assert_eq!(found[&key("ITEM#7")].data, json!({"n": 7}));

    let committed: Vec<TxnId> = (0..3).map(|_| TxnId::new_v7()).collect();
    for txn in &committed {
        b.store.commit(&request(b, *txn, vec![], vec![])).await.expect("commit");
    }
    let mut asked: Vec<TxnId> = (0..117).map(|_| TxnId::new_v7()).collect();
    asked.extend(&committed);
    let records = b.store.get_outboxes(&asked).await.expect("read");
    assert_eq!(records.keys().copied().collect::<Vec<_>>(), {
        let mut c = committed.clone();
        c.sort();
        c
    });
}

/// A control message sent with a delay is invisible until the delay has passed, and
/// gone once acknowledged.
pub async fn a_delayed_control_message_arrives_after_its_delay(b: &Backend) {
    // With the trace context of the request that began its transaction, which the
    // worker's span links.
    let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    let message = ControlMessage::first(TxnId::new_v7(), b.clock.now()).with_trace(Some(trace));
    b.control_queue
        .send(&message, Duration::from_secs(2))
        .await
        .expect("send");
    assert!(
        b.inbox
            .receive(10, Duration::ZERO, b.visibility_timeout)
            .await
            .expect("receive")
            .is_empty(),
        "{}: visible before its delay",
        b.name
    );
    b.wait(Duration::from_secs(2)).await;
    let received = b
        .inbox
        .receive(10, Duration::from_secs(1), b.visibility_timeout)
        .await
        .expect("receive");
    assert_eq!(received.len(), 1, "{}", b.name);
    assert_eq!(ControlMessage::decode(&received[0].body).expect("decodes"), message);
    assert_eq!(received[0].receive_count, 1);
    b.inbox.ack(&[received[0].receipt.clone()]).await.expect("ack");
    b.wait(b.visibility_timeout).await;
    assert!(
        b.inbox
            .receive(10, Duration::ZERO, b.visibility_timeout)
            .await
            .unwrap()
            .is_empty(),
        "{}: an acknowledged message came back",
        b.name
    );
}

/// A control message received and not acknowledged comes back after the visibility
/// timeout, with its receive count raised.
pub async fn an_unacknowledged_control_message_comes_back(b: &Backend) {
    let message = ControlMessage::first(TxnId::new_v7(), b.clock.now());
    b.control_queue.send(&message, Duration::ZERO).await.expect("send");
    let first = b
        .inbox
        .receive(10, Duration::from_secs(1), b.visibility_timeout)
        .await
        .expect("receive");
    assert_eq!(first.len(), 1);
    assert!(
        b.inbox
            .receive(10, Duration::ZERO, b.visibility_timeout)
            .await
            .unwrap()
            .is_empty(),
        "invisible while in flight"
    );
    b.wait(b.visibility_timeout).await;
    let second = b
        .inbox
        .receive(10, Duration::from_secs(1), b.visibility_timeout)
        .await
        .expect("receive");
    assert_eq!(second.len(), 1, "{}", b.name);
    assert_eq!(
        (second[0].body.as_str(), second[0].receive_count),
        (first[0].body.as_str(), 2)
    );
    b.inbox.ack(&[second[0].receipt.clone()]).await.expect("ack");
}

/// Published messages arrive with their bodies, stable ids and transaction ids.
pub async fn published_messages_carry_their_ids(b: &Backend) {
    let txn = TxnId::new_v7();
    let sent = messages(txn, &[json!({"n": 0}), json!({"n": 1}), json!({"n": 2})]);
    let failures = b.publisher.send_batch(&events(), &sent).await.expect("send");
    assert!(failures.is_empty(), "{failures:?}");
    let mut delivered = b.drain(&events()).await;
    delivered.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    assert_eq!(delivered.len(), 3, "{}", b.name);
    for (message, arrived) in sent.iter().zip(&delivered) {
        assert_eq!(arrived.body, message.body);
        assert_eq!(arrived.message_id.as_deref(), Some(message.id.as_str()));
        assert_eq!(arrived.txn_id, Some(txn.to_string()));
    }
}

/// Every destination delivers the trace context a message was emitted in: a queue, a
/// FIFO queue and a topic as `traceparent` and `tracestate` attributes, a bus in the
/// event's `detail.metadata`; a message emitted outside a trace carries none.
pub async fn published_messages_carry_their_trace_context(b: &Backend) {
    let context = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .unwrap()
        .with_tracestate(Some("congo=t61rcWkgMzE"));
    for destination in [events(), audit(), fanout(), bus()] {
        let txn = TxnId::new_v7();
        let traced = OutgoingMessage::new(txn, 0, Message::json(destination.clone(), &json!({"n": 0})).unwrap())
            .with_trace(Some(context.clone()));
        let untraced = OutgoingMessage::new(txn, 1, Message::json(destination.clone(), &json!({"n": 1})).unwrap());
        let failures = b
            .publisher
            .send_batch(&destination, &[traced.clone(), untraced.clone()])
            .await
            .expect("send");
        assert!(failures.is_empty(), "{failures:?}");
        let mut delivered = b.drain(&destination).await;
        delivered.sort_by(|a, b| a.message_id.cmp(&b.message_id));
        let traces: Vec<_> = delivered
            .iter()
            .map(|arrived| (arrived.message_id.clone().unwrap_or_default(), arrived.trace.clone()))
            .collect();
        assert_eq!(
            traces,
            [
                (traced.id.to_string(), Some(context.clone())),
                (untraced.id.to_string(), None)
            ],
            "{}: {destination}",
            b.name
        );
    }
}

/// Sending the same messages to a FIFO destination again (a redelivered control message
/// dispatching again) delivers each of them once.
pub async fn a_redelivered_dispatch_to_a_fifo_destination_is_deduplicated(b: &Backend) {
    let txn = TxnId::new_v7();
    let sent: Vec<OutgoingMessage> = [json!({"n": 0}), json!({"n": 1})]
        .iter()
        .enumerate()
        .map(|(n, body)| OutgoingMessage::new(txn, n as u32, Message::json(audit(), body).unwrap()))
        .collect();
    for _ in 0..2 {
        let failures = b.publisher.send_batch(&audit(), &sent).await.expect("send");
        assert!(failures.is_empty(), "{failures:?}");
    }
    let delivered = b.drain(&audit()).await;
    let ids: Vec<_> = delivered
        .iter()
        .map(|d| d.message_id.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        ids,
        [sent[0].id.to_string(), sent[1].id.to_string()],
        "{}: once each, in order",
        b.name
    );
}

/// A message for a destination nobody configured is refused, not lost.
pub async fn an_unknown_destination_is_refused(b: &Backend) {
    let txn = TxnId::new_v7();
    let stray = OutgoingMessage::new(txn, 0, Message::json("nowhere".parse().unwrap(), &json!({})).unwrap());
    let result = b.publisher.send_batch(&"nowhere".parse().unwrap(), &[stray]).await;
    assert!(
        matches!(result, Err(outbox::ports::PublishError::UnknownDestination { .. })),
        "{result:?}"
    );
    assert_eq!(b.destination_depth(&events()).await, 0);
}

/// Messages published to a topic arrive on its subscribed queue with their bodies, their
/// own attributes, stable ids and transaction ids.
pub async fn messages_to_a_topic_arrive_with_their_ids(b: &Backend) {
    let txn = TxnId::new_v7();
    let sent: Vec<OutgoingMessage> = [json!({"n": 0}), json!({"n": 1})]
        .iter()
        .enumerate()
        .map(|(n, body)| {
            let message = Message::json(fanout(), body).unwrap().with_attribute("type", "Fanned");
            OutgoingMessage::new(txn, n as u32, message)
        })
        .collect();
    let failures = b.publisher.send_batch(&fanout(), &sent).await.expect("publish");
    assert!(failures.is_empty(), "{failures:?}");
    let mut delivered = b.drain(&fanout()).await;
    delivered.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    assert_eq!(delivered.len(), 2, "{}", b.name);
    for (message, arrived) in sent.iter().zip(&delivered) {
        assert_eq!(arrived.body, message.body, "{}: raw message delivery", b.name);
        assert_eq!(arrived.message_id.as_deref(), Some(message.id.as_str()));
        assert_eq!(arrived.txn_id, Some(txn.to_string()));
        assert_eq!(arrived.event, None);
    }
}

/// Events put on a bus reach its rule's queue as events: `source` and `detail-type` the
/// message's (or the defaults), the body under `detail.data`, and the stable id and
/// transaction id under `detail.metadata`.
pub async fn events_on_a_bus_arrive_with_their_ids_and_type(b: &Backend) {
    let txn = TxnId::new_v7();
    let named = Message::json(bus(), &json!({"order_id": "o-1"}))
        .unwrap()
        .with_event("com.example.orders", "OrderPlaced");
    let unnamed = Message::json(bus(), &json!(["a", 1])).unwrap();
    let sent = vec![
        OutgoingMessage::new(txn, 0, named),
        OutgoingMessage::new(txn, 1, unnamed),
    ];
    let failures = b.publisher.send_batch(&bus(), &sent).await.expect("put events");
    assert!(failures.is_empty(), "{failures:?}");
    let mut delivered = b.drain(&bus()).await;
    delivered.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    assert_eq!(delivered.len(), 2, "{}", b.name);
    let expected = [
        ("com.example.orders", "OrderPlaced", json!({"order_id": "o-1"})),
        ("outbox", "outbox-message", json!(["a", 1])),
    ];
    for ((message, arrived), (source, detail_type, data)) in sent.iter().zip(&delivered).zip(expected) {
        assert_eq!(arrived.message_id.as_deref(), Some(message.id.as_str()), "{}", b.name);
        assert_eq!(arrived.txn_id, Some(txn.to_string()));
        let event = arrived.event.as_ref().expect("an event");
        assert_eq!(
            (event.source.as_str(), event.detail_type.as_str(), &event.data),
            (source, detail_type, &data),
            "{}",
            b.name
        );
    }
}

/// How long [`acknowledged_commits_survive_cancelled_transactions_racing_them`] races:
/// `OUTBOX_RACE_SECONDS`, else 3 s.
fn race_duration() -> Duration {
    let seconds = std::env::var("OUTBOX_RACE_SECONDS")
        .ok()
        .map(|text| text.parse::<f64>().expect("OUTBOX_RACE_SECONDS is a number of seconds"))
        .unwrap_or(3.0);
    Duration::from_secs_f64(seconds)
}

/// At most this many commits per racer, so that a fast backend stays small.
const RACE_COMMITS_PER_RACER: usize = 400;
/// Racers of each kind.
const RACERS: usize = 4;

/// Commits racing transactions that are cancelled, on one table: every commit the store
/// acknowledged is there afterwards, item and record, and nothing of a cancelled one.
/// DynamoDB isolates transactions; moto does not (a cancelled `TransactWriteItems`
/// restores copies of the tables it took before, dropping what other requests wrote
/// meanwhile), so this fails there.
pub async fn acknowledged_commits_survive_cancelled_transactions_racing_them(b: &Backend) {
    // Every cancelled transaction expects this item absent.
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put("RACE#BLOCK", json!({}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .expect("the blocking item");
    let deadline = std::time::Instant::now() + race_duration();
    let committer = |racer: usize| async move {
        let mut acknowledged = Vec::new();
        let mut refused = 0;
        for n in 0..RACE_COMMITS_PER_RACER {
            if std::time::Instant::now() >= deadline {
                break;
            }
            let txn = TxnId::new_v7();
            let name = format!("RACE#{racer}#{n}");
            let commit = request(
                b,
                txn,
                vec![put(&name, json!({"n": n}), ExpectedVersion::Absent)],
                messages(txn, &[json!(n)]),
            );
            match b.store.commit(&commit).await {
                Ok(()) => acknowledged.push((key(&name), txn)),
                // Throttled, held by another transaction, or failed in the engine: not
                // acknowledged, so nothing to find.
                Err(CommitError::Contention(_) | CommitError::Ambiguous(_) | CommitError::Unavailable(_)) => {
                    refused += 1
                }
                Err(other) => panic!("{}: a commit of a fresh item: {other:?}", b.name),
            }
        }
        (acknowledged, refused)
    };
    let canceller = |racer: usize| async move {
        let mut cancelled = Vec::new();
        let mut failed = 0;
        for n in 0..RACE_COMMITS_PER_RACER {
            if std::time::Instant::now() >= deadline {
                break;
            }
            let txn = TxnId::new_v7();
            let name = format!("CANCELLED#{racer}#{n}");
            let commit = request(
                b,
                txn,
                vec![
                    put(&name, json!({}), ExpectedVersion::Absent),
                    put("RACE#BLOCK", json!({}), ExpectedVersion::Absent),
                ],
                messages(txn, &[json!(n)]),
            );
            match b.store.commit(&commit).await {
                // Definitely nothing written.
                Err(CommitError::VersionConflict { .. } | CommitError::Contention(_)) => {
                    cancelled.push((key(&name), txn))
                }
                // The engine failed the request: no definite answer, so nothing to check.
                Err(CommitError::Ambiguous(_) | CommitError::Unavailable(_)) => failed += 1,
                other => panic!(
                    "{}: a transaction expecting the blocking item absent: {other:?}",
                    b.name
                ),
            }
        }
        (cancelled, failed)
    };
    let (committed, cancelled) = futures::future::join(
        join_all((0..RACERS).map(committer)),
        join_all((0..RACERS).map(canceller)),
    )
    .await;
    let refused: usize = committed.iter().map(|(_, refused)| refused).sum();
    let acknowledged: Vec<(ItemKey, TxnId)> = committed
        .into_iter()
        .flat_map(|(acknowledged, _)| acknowledged)
        .collect();
    let failed: usize = cancelled.iter().map(|(_, failed)| failed).sum();
    let cancelled: Vec<(ItemKey, TxnId)> = cancelled.into_iter().flat_map(|(cancelled, _)| cancelled).collect();

    let keys: Vec<ItemKey> = acknowledged.iter().map(|(key, _)| key.clone()).collect();
    let txns: Vec<TxnId> = acknowledged.iter().map(|(_, txn)| *txn).collect();
    let items = b.store.get_items(&keys).await.expect("read the items");
    let records = b.store.get_outboxes(&txns).await.expect("read the records");
    let lost: Vec<String> = acknowledged
        .iter()
        .filter(|(key, txn)| !items.contains_key(key) || !records.contains_key(txn))
        .map(|(key, txn)| {
            format!(
                "{key} (item {}, record {})",
                if items.contains_key(key) { "present" } else { "lost" },
                if records.contains_key(txn) { "present" } else { "lost" }
            )
        })
        .collect();
    let cancelled_keys: Vec<ItemKey> = cancelled.iter().map(|(key, _)| key.clone()).collect();
    let cancelled_txns: Vec<TxnId> = cancelled.iter().map(|(_, txn)| *txn).collect();
    let phantom_items = b.store.get_items(&cancelled_keys).await.expect("read").len();
    let phantom_records = b.store.get_outboxes(&cancelled_txns).await.expect("read").len();
    println!(
        "race on {}: {} commits acknowledged ({refused} not acknowledged) while {} transactions were cancelled \
         ({failed} more failed in the engine); {} acknowledged commits lost, {} writes of cancelled ones present",
        b.engine(),
        acknowledged.len(),
        cancelled.len(),
        lost.len(),
        phantom_items + phantom_records
    );
    assert!(
        !acknowledged.is_empty() && !cancelled.is_empty(),
        "{}: the race must have both kinds",
        b.name
    );
    assert!(
        lost.is_empty(),
        "{} ({}): acknowledged commits lost to the race: {lost:?}",
        b.name,
        b.engine()
    );
    assert_eq!(
        (phantom_items, phantom_records),
        (0, 0),
        "{}: nothing of a cancelled transaction",
        b.name
    );
}

/// A commit repeated under its token (`ClientRequestToken` is the transaction id) after
/// it applied, as after a lost reply, reports success, and nothing of it applies again,
/// though its item changed meanwhile. On AWS the engine itself answers the repeat with
/// success (DynamoDB keeps a token for ten minutes); moto ignores the token and answers
/// with a cancellation, so this fails there.
pub async fn a_commit_repeated_under_its_token_after_it_applied_reports_success(b: &Backend) {
    let txn = TxnId::new_v7();
    let commit = request(
        b,
        txn,
        vec![put("ITEM#1", json!({"by": "first"}), ExpectedVersion::Absent)],
        messages(txn, &[json!(1)]),
    );
    b.store.commit(&commit).await.expect("the first attempt");
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put("ITEM#1", json!({"by": "second"}), ExpectedVersion::Exactly(1))],
            vec![],
        ))
        .await
        .expect("a later change of the item");

    let replies_before = b.wire.as_ref().map(|wire| wire.replies("TransactWriteItems").len());
    b.store.commit(&commit).await.expect("the repeat reports the commit");
    if let (Some(wire), Some(before)) = (&b.wire, replies_before) {
        assert_eq!(
            wire.replies("TransactWriteItems")[before..],
            [200],
            "{} ({}): the engine answers the repeat of an applied commit under its token with success",
            b.name,
            b.engine()
        );
    }
    let item = &b.store.get_items(&[key("ITEM#1")]).await.unwrap()[&key("ITEM#1")];
    assert_eq!(
        (item.version, item.data.clone()),
        (2, json!({"by": "second"})),
        "{}: the repeat applied nothing",
        b.name
    );
    let stored = record(b, txn).await.expect("the record");
    assert_eq!(stored, commit.outbox, "{}: the record as first committed", b.name);
}

/// A consumed message's record (`IN#…`, its id derived from consumer and incoming id)
/// is won by one attempt: a repeat of that attempt's request reports the commit, while a
/// rival attempt (another copy of the message) is told it was superseded, with nothing
/// of its own written, before the record is dispatched and after.
pub async fn a_consumed_messages_record_is_won_by_one_attempt(b: &Backend) {
    let txn = TxnId::consumed("conformance", &format!("{}:0", TxnId::new_v7()));
    let attempt = |n: u8, item: &str| {
        let mut commit = request(
            b,
            txn,
            vec![put(item, json!({"attempt": n}), ExpectedVersion::Absent)],
            messages(txn, &[json!({"attempt": n})]),
        );
        commit.outbox = commit.outbox.by_attempt(TxnId::new_v7());
        commit
    };
    let winner = attempt(1, "SHIPMENT#1");
    let rival = attempt(2, "SHIPMENT#2");
    b.store.commit(&winner).await.expect("the first attempt commits");
    b.store
        .commit(&winner)
        .await
        .expect("a repeat of the winning attempt reports the commit");
    let found = record(b, txn).await.expect("the record");
    assert_eq!(
        found, winner.outbox,
        "{}: the winner's record, with its attempt",
        b.name
    );
    for stage in ["pending", "dispatched"] {
        match b.store.commit(&rival).await {
            Err(CommitError::Superseded { txn_id }) => assert_eq!(txn_id, txn),
            other => panic!("{}: a rival attempt ({stage}) must be superseded: {other:?}", b.name),
        }
        if stage == "pending" {
            let marked = b
                .store
                .mark_dispatched(
                    std::slice::from_ref(&found),
                    whole_second(b.clock.now().plus(RETENTION)),
                )
                .await;
            assert!(marked.iter().all(Result::is_ok), "{marked:?}");
        }
    }
    let items = b
        .store
        .get_items(&[key("SHIPMENT#1"), key("SHIPMENT#2")])
        .await
        .unwrap();
    assert_eq!(
        items.keys().cloned().collect::<Vec<_>>(),
        [key("SHIPMENT#1")],
        "{}: nothing of the rival",
        b.name
    );
    let dispatched = record(b, txn).await.expect("the record");
    assert_eq!(
        (dispatched.state, dispatched.attempt),
        (OutboxState::Dispatched, winner.outbox.attempt),
        "the mark keeps the attempt"
    );
}

/// Copies of one message committing at once: exactly one attempt's writes apply, and
/// every other is told so (superseded) or to try again (contention), never success.
pub async fn concurrent_copies_of_a_consumed_message_commit_once(b: &Backend) {
    let txn = TxnId::consumed("conformance", &format!("{}:0", TxnId::new_v7()));
    let commits: Vec<CommitRequest> = (0..4)
        .map(|n| {
            let mut commit = request(
                b,
                txn,
                vec![put(&format!("COPY#{n}"), json!({"copy": n}), ExpectedVersion::Absent)],
                messages(txn, &[json!({"copy": n})]),
            );
            commit.outbox = commit.outbox.by_attempt(TxnId::new_v7());
            commit
        })
        .collect();
    let results = join_all(commits.iter().map(|commit| b.store.commit(commit))).await;
    let winners: Vec<usize> = (0..commits.len()).filter(|&n| results[n].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{}: {results:?}", b.name);
    for result in &results {
        assert!(
            matches!(
                result,
                Ok(()) | Err(CommitError::Superseded { .. } | CommitError::Contention(_))
            ),
            "{}: a losing copy is told nothing of it was written: {result:?}",
            b.name
        );
    }
    let keys: Vec<ItemKey> = (0..commits.len()).map(|n| key(&format!("COPY#{n}"))).collect();
    let items = b.store.get_items(&keys).await.unwrap();
    assert_eq!(items.keys().cloned().collect::<Vec<_>>(), [keys[winners[0]].clone()]);
    assert_eq!(record(b, txn).await.expect("the record"), commits[winners[0]].outbox);
}

/// Records each order once and emits `Recorded`, naming the run.
struct RecordOnce;

#[async_trait::async_trait]
impl Handler for RecordOnce {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let order = message.json::<Value>()?["order_id"]
            .as_str()
            .ok_or("no order_id")?
            .to_owned();
        let item = key(&format!("RECORDED#{order}"));
        let expected = match staging.get(&item).await? {
            Some(found) => ExpectedVersion::Exactly(found.version),
            None => ExpectedVersion::Absent,
        };
        staging.put(item, json!({"order_id": order}), expected);
        staging.emit(Message::json(
            events(),
            &json!({"type": "Recorded", "order_id": order}),
        )?);
        Ok(())
    }
}

/// A consumer takes an event as the bus's rule delivers it, applies it once, publishes
/// what it emitted under ids derived from its name and the event's id, and acknowledges
/// a second copy without doing anything.
pub async fn a_consumer_processes_each_message_once_and_publishes_before_acknowledging(b: &Backend) {
    let txn = TxnId::new_v7();
    let placed = OutgoingMessage::new(
        txn,
        0,
        Message::json(bus(), &json!({"type": "OrderPlaced", "order_id": "o-1"}))
            .unwrap()
            .with_event("com.example.orders", "OrderPlaced"),
    );
    let failures = b
        .publisher
        .send_batch(&bus(), std::slice::from_ref(&placed))
        .await
        .expect("send");
    assert!(failures.is_empty(), "{failures:?}");
    let arrived = b.drain(&bus()).await;
    assert_eq!(arrived.len(), 1, "{}", b.name);
    let delivery = |queue_message_id: &str| Delivery {
        message_id: queue_message_id.into(),
        receipt: String::new(),
        body: arrived[0].body.clone(),
        attributes: Default::default(),
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
        Arc::new(RecordOnce),
        RETENTION,
    );
    let first = consumer.consume(&delivery("q-1")).await;
    assert_eq!(first.unwrap(), ConsumeOutcome::Processed { messages: 1 }, "{}", b.name);
    let consumed = consumer.txn_id(placed.id.as_str());
    let out = b.drain(&events()).await;
    assert_eq!(
        out.iter().map(|message| message.message_id.clone()).collect::<Vec<_>>(),
        [Some(format!("{consumed}:0"))],
        "{}",
        b.name
    );
    let dispatched = record(b, consumed).await.expect("the consumer's record");
    assert_eq!(dispatched.state, OutboxState::Dispatched);
    // A copy (a producer's re-send): acknowledged, nothing applied or sent again.
    let again = consumer.consume(&delivery("q-2")).await;
    assert_eq!(again.unwrap(), ConsumeOutcome::Duplicate, "{}", b.name);
    assert!(b.drain(&events()).await.is_empty());
    let recorded = b.store.get_items(&[key("RECORDED#o-1")]).await.unwrap();
    assert_eq!(recorded[&key("RECORDED#o-1")].version, 1, "applied once");
}

/// A consumed message's record whose retention has passed no longer blocks a new attempt,
/// though the table may still hold it (TTL deletes lazily): a late copy is new again, as
/// every read of the record already says.
pub async fn an_expired_consumed_record_does_not_block_a_new_attempt(b: &Backend) {
    let txn = TxnId::consumed("conformance", &format!("{}:0", TxnId::new_v7()));
    let now = b.clock.now();
    let mut old = request(b, txn, vec![], vec![]);
    old.outbox = OutboxRecord::committed(txn, vec![], now, whole_second(now.plus(Duration::from_secs(60))))
        .by_attempt(TxnId::new_v7());
    b.store.commit(&old).await.expect("the first copy, long ago");
    b.clock.advance(Duration::from_secs(120));
    assert!(record(b, txn).await.is_none(), "{}: read as gone once expired", b.name);
    let mut late = request(
        b,
        txn,
        vec![put("LATE#1", json!({"late": true}), ExpectedVersion::Absent)],
        vec![],
    );
    late.outbox = late.outbox.by_attempt(TxnId::new_v7());
    b.store
        .commit(&late)
        .await
        .unwrap_or_else(|error| panic!("{}: a late copy after the retention must commit: {error:?}", b.name));
    assert_eq!(
        record(b, txn).await.expect("the new record").attempt,
        late.outbox.attempt
    );
}

/// Marking a record dispatched is an unconditional put of its dispatched form, on every
/// backend: a mark that arrives late (a worker frozen between its publish and its mark),
/// after the record was marked and expired, puts it back dispatched, due to expire again.
/// It says what is true (the transaction committed and its messages went out) and never
/// brings back the messages.
pub async fn a_late_mark_puts_the_dispatched_record_back_and_nothing_more(b: &Backend) {
    let txn = TxnId::new_v7();
    let commit = request(b, txn, vec![], messages(txn, &[json!({"n": 1})]));
    b.store.commit(&commit).await.expect("commit");
    let read = record(b, txn).await.expect("the pending record");
    let soon = whole_second(b.clock.now().plus(Duration::from_secs(10)));
    let marked = b.store.mark_dispatched(std::slice::from_ref(&read), soon).await;
    assert!(marked.iter().all(Result::is_ok), "{marked:?}");
    b.clock.advance(Duration::from_secs(20));
    assert_eq!(record(b, txn).await, None, "{}: expired", b.name);
    let later = whole_second(b.clock.now().plus(RETENTION));
    let late = b.store.mark_dispatched(&[read], later).await;
    assert!(late.iter().all(Result::is_ok), "{}: {late:?}", b.name);
    let back = record(b, txn).await.expect("put back");
    assert_eq!(
        (back.state, back.messages.len(), back.expires_at),
        (OutboxState::Dispatched, 0, Some(later)),
        "{}",
        b.name
    );
}
