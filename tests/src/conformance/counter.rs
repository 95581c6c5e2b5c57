//! The conformance case of counters under bounds ([`outbox::counter`]): one write that
//! reads nothing first, never conflicts, and stamps its messages' places in the write.

use futures::future::join_all;
use outbox::counter::{Add, CounterCommit, CounterError, Refusal};
use outbox::ports::{Clock, CommitError, EntityCommit, ExpectedVersion, FenceOutcome};
use outbox::protocol::{OutboxRecord, TxnId};
use serde_json::json;

use super::backend::Backend;
use super::cases::{key, messages, whole_second, RETENTION};

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
