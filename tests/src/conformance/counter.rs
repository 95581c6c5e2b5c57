//! The conformance cases of counters under bounds ([`outbox::counter`]): one write that
//! reads nothing first, never conflicts, and stamps its messages' places in the write; at
//! the store, and through the request path.

use std::time::Duration;

use futures::future::join_all;
use outbox::counter::{Add, CounterCommit, CounterError, Refusal};
use outbox::ports::{Clock, CommitError, EntityCommit, ExpectedVersion, FenceOutcome, ItemKey};
use outbox::protocol::{
    DestinationName, IdempotencyKey, IdempotencySlot, Message, OutboxRecord, StoredResponse, TxnId,
};
use outbox::request::{InlineDispatch, Outbox, Transaction, TxnError};
use outbox::settings::Timing;
use serde_json::json;

use super::backend::{audit, events, Backend};
use super::cases::{key, messages, record, whole_second, RETENTION};

/// A counter commit of `item` by transaction `txn`, sending one message to `events`.
fn counter(b: &Backend, item: &str, txn: TxnId, add: Add) -> CounterCommit {
    let now = b.clock.now();
    CounterCommit {
        key: key(item),
        adds: vec![add],
        entry: OutboxRecord::committed(
            txn,
            messages(txn, &[json!({"took": 1})]),
            now,
            whole_second(now.plus(RETENTION)),
        ),
        checks_fence: true,
    }
}

/// Five takes of one unit race over a stock of three: three apply and two are refused by
/// the bound, none conflicts; the three messages take seq 1, 2, 3 on the item's chain
/// with each one's `after` the version of the one before (the first meets no head yet,
/// the others count on from it), and the entries read back carry the same places. A
/// repeat of an applied commit takes nothing more (even with room under its bound); a
/// commit after its fence is refused; an absent item is missing.
pub async fn counters_under_a_bound_never_conflict_and_keep_their_place(b: &Backend) {
    let item = format!("STOCK#{}", TxnId::new_v7());
    let now = b.clock.now();
    let create = TxnId::new_v7();
    b.store
        .commit_entity(&EntityCommit {
            key: key(&item),
            data: json!({"stock": 3, "name": "lamp"}),
            expected: ExpectedVersion::Absent,
            entry: OutboxRecord::committed(create, Vec::new(), now, whole_second(now.plus(RETENTION))),
            checks_fence: true,
            applied: None,
        })
        .await
        .expect("the item");
    let commits: Vec<CounterCommit> = (0..5)
        .map(|_| counter(b, &item, TxnId::new_v7(), Add::take("stock", 1)))
        .collect();
    let results = join_all(commits.iter().map(|commit| b.store.commit_counter(commit))).await;
    let mut applied = Vec::new();
    let mut refused = 0;
    for (commit, result) in commits.iter().zip(results) {
        match result {
            Ok(done) => applied.push((commit, done)),
            Err(CounterError::Refused(Refusal::OutOfBounds { field, value })) => {
                assert_eq!((field.as_str(), value), ("stock", 0), "{}", b.name);
                refused += 1;
            }
            Err(other) => panic!("{}: a take of one unit: {other:?}", b.name),
        }
    }
    assert_eq!((applied.len(), refused), (3, 2), "{}: applied and refused", b.name);
    applied.sort_by_key(|(_, done)| done.version);
    let places: Vec<(u64, u64, u64)> = applied
        .iter()
        .map(|(_, done)| {
            let position = done.messages[0].position.clone().expect("a place");
            (position.seq, position.version, position.after)
        })
        .collect();
    assert_eq!(
        places,
        vec![(1, 2, 0), (2, 3, 2), (3, 4, 3)],
        "{}: seq, version, after",
        b.name
    );
    let stocks: Vec<i64> = applied.iter().map(|(_, done)| done.values["stock"]).collect();
    assert_eq!(stocks, vec![2, 1, 0], "{}: the stock each answer reports", b.name);
    let entity = b.store.get_entity(&key(&item)).await.unwrap().expect("the item");
    assert_eq!(entity.item.version, 4, "{}: each take moves the version", b.name);
    assert_eq!(entity.item.data, json!({"stock": 0, "name": "lamp"}), "{}", b.name);
    for (commit, done) in &applied {
        let entry = entity.entries.get(&commit.entry.txn_id).expect("the entry");
        assert_eq!(
            entry.messages, done.messages,
            "{}: the entry read back keeps its place",
            b.name
        );
    }
    // A repeat of an applied commit (a retried request) finds its entry: nothing more taken.
    let (first, first_done) = &applied[0];
    let again = b.store.commit_counter(first).await.expect("a repeat");
    assert_eq!(again.messages, first_done.messages, "{}", b.name);
    assert_eq!(b.store.get_entity(&key(&item)).await.unwrap().unwrap().item.version, 4);
    // After its fence, a late commit is refused, whatever its bounds say.
    let late = TxnId::new_v7();
    let fenced = b
        .store
        .fence_entity(&key(&item), late, now, whole_second(now.plus(RETENTION)))
        .await
        .unwrap();
    assert_eq!(fenced, FenceOutcome::Fenced, "{}", b.name);
    match b
        .store
        .commit_counter(&counter(b, &item, late, Add::give_up_to("stock", 1, 10)))
        .await
    {
        Err(CounterError::Commit(CommitError::EntityFenced { txn_id })) => assert_eq!(txn_id, late),
        other => panic!("{}: a counter commit after its fence: {other:?}", b.name),
    }
    // A give within its cap applies on top (its chain has a head now).
    let give_commit = counter(b, &item, TxnId::new_v7(), Add::give_up_to("stock", 2, 10));
    let give = b.store.commit_counter(&give_commit).await.expect("a give");
    assert_eq!(give.values["stock"], 2, "{}", b.name);
    let position = give.messages[0].position.clone().unwrap();
    assert_eq!(
        (position.seq, position.version, position.after),
        (4, 5, 4),
        "{}",
        b.name
    );
    // Its repeat, with room under the cap, still adds nothing: it finds its entry.
    let again = b
        .store
        .commit_counter(&give_commit)
        .await
        .expect("a repeat of the give");
    assert_eq!(again.messages, give.messages, "{}", b.name);
    let entity = b.store.get_entity(&key(&item)).await.unwrap().unwrap();
    assert_eq!(
        (entity.item.version, entity.item.data["stock"].as_i64()),
        (5, Some(2)),
        "{}: a repeat adds nothing",
        b.name
    );
    let missing = format!("STOCK#{}", TxnId::new_v7());
    match b
        .store
        .commit_counter(&counter(b, &missing, TxnId::new_v7(), Add::take("stock", 1)))
        .await
    {
        Err(CounterError::Missing { .. }) => {}
        other => panic!("{}: a counter commit of no item: {other:?}", b.name),
    }
}

/// Begins a transaction on `item` that takes `add` and emits `n` to `events`.
async fn take(outbox: &Outbox, item: &ItemKey, add: Add, n: u64) -> Transaction {
    take_to(outbox, item, add, n, events()).await
}

/// Begins a transaction on `item` that takes `add` and emits `n` to `destination`.
async fn take_to(outbox: &Outbox, item: &ItemKey, add: Add, n: u64, destination: DestinationName) -> Transaction {
    let mut txn = outbox.begin_entity(item.clone()).await.expect("begin");
    txn.add(add);
    txn.emit(Message::json(destination, &json!({"n": n})).expect("a message"));
    txn
}

/// Through the request path ([`Transaction::add`]): six takes of one unit race over a
/// stock of three, each its own transaction with an event; three commit and three are
/// refused by the bound ([`TxnError::Refused`]), none meets a version conflict. Their
/// events go out inline with seq 1, 2, 3 on the item's chain. A take committed while an
/// earlier transaction's entry waits in the item sends that one's event too (the write
/// found it). With an idempotency record the additions commit as a read-modify-write,
/// and their refusal costs the read alone (no control message, no tombstone). A missing
/// item and a put of the item beside additions are refused, writing nothing.
pub async fn a_busy_counter_through_the_request_path_answers_by_its_bound_and_keeps_its_place(b: &Backend) {
    let timing = Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(1),
        max_commit_duration: Duration::from_secs(60),
        retention: RETENTION,
    };
    let outbox = b.outbox(timing);
    let inline = b.outbox(timing).with_inline_publisher(b.publisher.clone());
    let control = b.control(timing);
    let item = key(&format!("STOCK#{}", TxnId::new_v7()));
    let mut create = outbox.begin().await.expect("begin");
    create.put(
        item.clone(),
        json!({"stock": 3, "name": "lamp"}),
        ExpectedVersion::Absent,
    );
    let created = create.commit().await.expect("the create");
    b.handle_until_settled(&control, created.txn_id, timing.first_check_delay, |_| {})
        .await;

    let mut takes = Vec::new();
    for n in 0..6 {
        takes.push(take(&inline, &item, Add::take("stock", 1), n).await);
    }
    let results = join_all(takes.into_iter().map(Transaction::commit)).await;
    let mut committed = Vec::new();
    let mut refused = 0;
    for result in results {
        match result {
            Ok(done) => {
                assert_eq!(done.inline, InlineDispatch::Dispatched, "{}", b.name);
                committed.push(done.txn_id.to_string());
            }
            Err(TxnError::Refused {
                refusal: Refusal::OutOfBounds { field, value },
                ..
            }) => {
                assert_eq!((field.as_str(), value), ("stock", 0), "{}", b.name);
                refused += 1;
            }
            Err(other) => panic!("{}: a take of one unit through the request path: {other:?}", b.name),
        }
    }
    assert_eq!((committed.len(), refused), (3, 3), "{}: committed and refused", b.name);
    let mut delivered = b.drain(&events()).await;
    delivered.sort_by_key(|message| message.position.as_ref().map(|position| position.seq));
    let seqs: Vec<Option<u64>> = delivered
        .iter()
        .map(|message| message.position.as_ref().map(|position| position.seq))
        .collect();
    assert_eq!(seqs, vec![Some(1), Some(2), Some(3)], "{}: the places sent", b.name);
    let mut senders: Vec<String> = delivered.iter().filter_map(|message| message.txn_id.clone()).collect();
    senders.sort();
    committed.sort();
    assert_eq!(senders, committed, "{}: each committed take's event, once", b.name);
    let entity = b.store.get_entity(&item).await.unwrap().expect("the item");
    assert_eq!(
        (entity.item.version, entity.item.data.clone()),
        (4, json!({"stock": 0, "name": "lamp"})),
        "{}",
        b.name
    );
    assert!(entity.entries.is_empty(), "{}: {:?}", b.name, entity.entries);
    b.settle(timing).await;
    assert!(b.drain(&events()).await.is_empty(), "{}: each sent once", b.name);

    // An entry left in the item (inline publishing off) goes out before the next take's
    // where order is kept (the FIFO destination).
    let give = take_to(&outbox, &item, Add::give_up_to("stock", 2, 10), 10, audit())
        .await
        .commit()
        .await
        .expect("a give");
    assert_eq!(give.inline, InlineDispatch::Off, "{}", b.name);
    let after = take_to(&inline, &item, Add::take("stock", 1), 11, audit())
        .await
        .commit()
        .await
        .expect("a take after it");
    assert_eq!(after.inline, InlineDispatch::Dispatched, "{}", b.name);
    let delivered = b.drain(&audit()).await;
    let sent: Vec<(Option<String>, Option<u64>)> = delivered
        .iter()
        .map(|message| {
            (
                message.txn_id.clone(),
                message.position.as_ref().map(|position| position.seq),
            )
        })
        .collect();
    assert_eq!(
        sent,
        vec![
            (Some(give.txn_id.to_string()), Some(1)),
            (Some(after.txn_id.to_string()), Some(2))
        ],
        "{}: the earlier entry first, in order",
        b.name
    );
    let entity = b.store.get_entity(&item).await.unwrap().expect("the item");
    assert_eq!(entity.item.data["stock"], json!(1), "{}", b.name);
    assert_eq!(
        entity.entries.keys().copied().collect::<Vec<_>>(),
        [give.txn_id],
        "{}: the earlier entry stays for its own publisher",
        b.name
    );
    // Its own control message publishes it and settles it; the FIFO copy is a duplicate
    // (dropped by SQS within its window and by the embedded queue, kept by moto).
    b.settle(timing).await;
    let copies: Vec<Option<String>> = b.drain(&audit()).await.into_iter().map(|m| m.txn_id).collect();
    assert!(
        copies.iter().all(|txn| txn == &Some(give.txn_id.to_string())),
        "{}: only a copy of the earlier one: {copies:?}",
        b.name
    );
    assert!(
        b.store
            .get_entity(&item)
            .await
            .unwrap()
            .expect("the item")
            .entries
            .is_empty(),
        "{}: settled",
        b.name
    );

    // Under an idempotency key: a read-modify-write, refused on what it read.
    let slot = |name: &str| IdempotencySlot::new("stock.take", &name.parse::<IdempotencyKey>().unwrap());
    let response = StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: "{}".into(),
    };
    let mut keyed = take(&inline, &item, Add::take("stock", 2), 12).await;
    keyed.remember_response(slot("key-1"), "f".into(), response.clone());
    let refused_id = keyed.id();
    match keyed.commit().await {
        Err(TxnError::Refused { txn_id, .. }) => assert_eq!(txn_id, refused_id, "{}", b.name),
        other => panic!("{}: a take of two of one unit under a key: {other:?}", b.name),
    }
    assert!(
        record(b, refused_id).await.is_none(),
        "{}: refused on its read, it wrote no tombstone",
        b.name
    );
    let mut keyed = take(&inline, &item, Add::take("stock", 1), 13).await;
    keyed.remember_response(slot("key-2"), "f".into(), response);
    keyed.commit().await.expect("a take under a key");
    let entity = b.store.get_entity(&item).await.unwrap().expect("the item");
    assert_eq!(entity.item.data["stock"], json!(0), "{}", b.name);
    let delivered = b.drain(&events()).await;
    assert_eq!(
        delivered
            .iter()
            .map(|message| message.position.as_ref().map(|position| position.seq))
            .collect::<Vec<_>>(),
        vec![Some(4)],
        "{}: the read-modify-write keeps the place too",
        b.name
    );

    // Refusals that write nothing.
    let missing = key(&format!("STOCK#{}", TxnId::new_v7()));
    match take(&inline, &missing, Add::take("stock", 1), 14).await.commit().await {
        Err(TxnError::NoSuchItem { key, .. }) => assert_eq!(key, missing, "{}", b.name),
        other => panic!("{}: a take of no item: {other:?}", b.name),
    }
    let mut both = take(&inline, &item, Add::give_up_to("stock", 1, 10), 15).await;
    both.put(item.clone(), json!({"stock": 9}), ExpectedVersion::Exactly(8));
    match both.commit().await {
        Err(TxnError::NotCommitted {
            source: CommitError::Invalid { .. },
            ..
        }) => {}
        other => panic!("{}: a put of the item beside additions to it: {other:?}", b.name),
    }
    assert_eq!(
        b.store.get_entity(&item).await.unwrap().expect("the item").item.data["stock"],
        json!(0),
        "{}",
        b.name
    );
    assert!(b.drain(&events()).await.is_empty(), "{}", b.name);
}
