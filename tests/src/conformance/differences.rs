//! Where the embedded store and DynamoDB differ in what a caller of the `Store` port can
//! observe, each named and tested on both sides: the simulation runs on the embedded
//! store, so what it proves holds on DynamoDB only where the two agree, or where the
//! difference is one the protocol never meets.
//!
//! Each case runs on every backend and asserts what *that* backend does
//! ([`Backend::is_embedded`]); a DynamoDB side that needs an engine or a window the
//! emulator does not give by itself (an old item left out of a failed condition, a
//! commit past the ten-minute token window, a busy item) builds it on DynamoDB Local
//! through the fault proxy or an interceptor.
//!
//! | What | Embedded | DynamoDB | Kept, or made the same | Case |
//! |---|---|---|---|---|
//! | A position kept again ([`Store::keep_applied`](outbox::ports::Store::keep_applied)) where the engine leaves the old item out of a failed condition | `Ok`: the position is held already | `Ok` where the old item comes back (DynamoDB, DynamoDB Local); `VersionConflict` where it does not | Kept: the consumer reads the key again after a conflict and finds the position held | [`a_position_kept_again_is_ok_unless_the_engine_leaves_the_old_item_out`] |
//! | Chain heads of a commit placed from another key's read at the same version (`Transaction::note_read`) | Each head *set* to the commit's highest position | `SET chain:<destination>` | Made the same: both set the head, never keep a higher one | [`a_commit_placed_from_another_keys_read_sets_the_heads_it_stamped`] |
//! | A business item over the 400 KB item limit | Refused, counting the data's JSON and the item's entries | Refused, counting attribute names and values, the chain heads and marks | Made the same for what is clearly over or under; within a few KB of the limit the two counts may disagree | [`items_beyond_the_item_limit_are_refused_by_both`] |
//! | Actions of a commit whose record is split over parts (over 350 KB of messages) | One action for the record | One action per part | Kept: the embedded store never splits a record; a commit near 100 actions with large messages is refused only on DynamoDB | [`a_split_record_takes_actions_of_its_own_only_on_dynamodb`] |
//! | An expired record (TTL passed) | Gone at once, for reads and for conditions | Absent to reads, but still there for conditions until TTL deletes it (within days) | Kept: the embedded store is the earliest deletion DynamoDB may make; a put of a tombstone or a commit over an expired record is refused on DynamoDB until then. The protocol meets neither: a control message older than the retention is stale | [`an_expired_record_blocks_conditions_until_dynamodb_deletes_it`] |
//! | A record's expiry instant | Kept to the millisecond | Whole seconds, rounded up (the TTL attribute) | Kept: a record lives up to a second longer on DynamoDB, never shorter | [`expiry_is_kept_in_whole_seconds_on_dynamodb`] |
//! | The application's native actions ([`Store::commit_native`](outbox::ports::Store::commit_native)) | `NativeUnsupported`, nothing written | Run in the commit's transaction | Kept: native actions are DynamoDB's own | [`native_actions_run_only_on_dynamodb`] |
//! | A commit repeated after it applied, past the ten-minute token window, deleting an item that was created again since and holds entries | `Ok`: its own record is found first | `Contention` (the delete's condition fails on the entries, read before the record) | Kept: the request path repeats a commit only within its commit window, well inside the token window, where DynamoDB answers `Ok` too | [`a_repeated_delete_past_the_token_window_meets_the_new_lifes_entries`] |
//! | Two transactions on one item at once | The loser finds the winner's write: `VersionConflict` | DynamoDB may cancel either with `TransactionConflict`: `Contention`, nothing written | Kept: the embedded store runs one write at a time; callers treat `Contention` as "try again" | [`a_busy_item_is_contention_only_on_dynamodb`] |
//!
//! Behaviours once different and now the same, with the cases that show it: a mark of a
//! record dispatched is an unconditional put on both
//! (`a_late_mark_puts_the_dispatched_record_back_and_nothing_more`); an entry in an item
//! is always a commit, and both refuse an entity commit of a tombstone entry
//! (`an_entity_commit_of_a_tombstone_entry_is_refused`), so no settle meets a fence in a
//! slot.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
use outbox::ports::{BusinessWrite, Clock, CommitError, EntityCommit, ExpectedVersion, ItemKey, TombstoneOutcome};
use outbox::protocol::{Applied, ChainHead, Message, OutboxRecord, OutboxState, TxnId};
use outbox::settings::SortKeyValue;
use serde_json::json;

use super::backend::{events, Backend};
use super::cases::{key, messages, put, record, request, whole_second, RETENTION};
use super::chain::timing;
use super::dynamodb_only::{proxied, without_tokens};
use crate::fault_proxy::Fault;

fn fresh(prefix: &str) -> ItemKey {
    key(&format!("{prefix}#{}", TxnId::new_v7()))
}

/// Creates `name` at version 1 in the transactional form.
async fn create(b: &Backend, name: &ItemKey) {
    b.store
        .commit(&request(
            b,
            TxnId::new_v7(),
            vec![put(name.as_str(), json!({"n": 0}), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .expect("the create");
}

/// A position kept alone, and kept again (a second copy of the message): `Ok` both times
/// wherever the failed condition's old item tells that the position is held. An engine
/// that leaves the old item out (through the fault proxy) answers the repeat with a
/// version conflict; the position stays as it was.
pub async fn a_position_kept_again_is_ok_unless_the_engine_leaves_the_old_item_out(b: &Backend) {
    async fn keep_twice(b: &Backend, fault: Option<&super::dynamodb_only::Faults>) -> Result<(), CommitError> {
        let name = fresh("SHIPMENT");
        create(b, &name).await;
        let applied = Applied {
            seq: 3,
            version: 1,
            txn: None,
        };
        b.store
            .keep_applied(&name, ExpectedVersion::Exactly(1), "c", applied)
            .await
            .expect("the first keep");
        if let Some(faults) = fault {
            faults.other("UpdateItem", Fault::WithoutOldItems);
        }
        let again = b
            .store
            .keep_applied(&name, ExpectedVersion::Exactly(1), "c", applied)
            .await;
        let read = b.store.get_keys(std::slice::from_ref(&name)).await.unwrap();
        assert_eq!(
            read[&name].applied.get("c"),
            Some(&applied),
            "{}: the position held",
            b.name
        );
        assert_eq!(read[&name].version, 1, "{}: the version left", b.name);
        again
    }
    // Both stores, as they are: the repeat is done.
    let again = keep_twice(b, None).await;
    assert!(again.is_ok(), "{}: a position kept again: {again:?}", b.name);
    if b.is_embedded() {
        return;
    }
    // DynamoDB, from an engine that leaves the old item out: a conflict.
    let p = proxied().await;
    match keep_twice(&p.backend, Some(&p.faults)).await {
        Err(CommitError::VersionConflict { .. }) => {}
        other => panic!("a position kept again, no old item: {other:?}"),
    }
}

/// A transaction handed the read of another key at the same version
/// (`Transaction::note_read`) stamps its messages from that key's heads, and its commit
/// (conditioned on the version only, which matches) applies. Both stores then *set* the
/// item's heads to what the commit stamped, lower than the heads it held: a head is never
/// kept because it was higher. In both forms of the commit.
pub async fn a_commit_placed_from_another_keys_read_sets_the_heads_it_stamped(b: &Backend) {
    let outbox = b.outbox(timing());
    for entity_mode in [false, true] {
        let (high, low) = (fresh("ORDER"), fresh("ORDER"));
        for (order, sent) in [(&high, 3), (&low, 1)] {
            let mut txn = match entity_mode {
                true => outbox.begin_entity(order.clone()).await.expect("begin"),
                false => outbox.begin().await.expect("begin"),
            };
            assert!(txn.get(order).await.expect("read").is_none());
            txn.put(order.clone(), json!({"n": 1}), ExpectedVersion::Absent);
            for _ in 0..sent {
                txn.emit(Message::json(events(), &json!({})).unwrap());
            }
            txn.commit().await.expect("the create");
        }
        let reads = b.store.get_keys(&[high.clone(), low.clone()]).await.unwrap();
        assert_eq!((reads[&high].version, reads[&low].version), (1, 1));
        assert_eq!(reads[&high].heads[&events()].seq, 3);
        let mut txn = match entity_mode {
            true => outbox.begin_entity(high.clone()).await.expect("begin"),
            false => outbox.begin().await.expect("begin"),
        };
        txn.note_read(high.clone(), reads[&low].clone());
        txn.put(high.clone(), json!({"n": 2}), ExpectedVersion::Exactly(1));
        txn.emit(Message::json(events(), &json!({})).unwrap());
        let txn_id = txn.commit().await.expect("the commit").txn_id;
        let heads = b.store.get_keys(std::slice::from_ref(&high)).await.unwrap()[&high]
            .heads
            .clone();
        assert_eq!(
            heads.get(&events()),
            Some(&ChainHead {
                seq: 2,
                version: 2,
                txn: Some(txn_id)
            }),
            "{} (entity mode: {entity_mode}): the head the commit stamped",
            b.name
        );
    }
}

/// A business item well under 400 KB is written; one well over is refused, in either
/// form of the commit, and nothing is written.
pub async fn items_beyond_the_item_limit_are_refused_by_both(b: &Backend) {
    let data = |bytes: usize| json!({ "pad": "x".repeat(bytes) });
    let under = fresh("BIG");
    let txn = TxnId::new_v7();
    b.store
        .commit(&request(
            b,
            txn,
            vec![put(under.as_str(), data(300_000), ExpectedVersion::Absent)],
            vec![],
        ))
        .await
        .unwrap_or_else(|error| panic!("{}: 300 KB: {error:?}", b.name));

    let over = fresh("BIG");
    let txn = TxnId::new_v7();
    let refused = b
        .store
        .commit(&request(
            b,
            txn,
            vec![put(over.as_str(), data(450_000), ExpectedVersion::Absent)],
            vec![],
        ))
        .await;
    assert!(
        matches!(refused, Err(CommitError::Invalid { .. })),
        "{}: 450 KB in the transactional form: {refused:?}",
        b.name
    );
    assert_eq!(record(b, txn).await, None, "{}: no record", b.name);

    let txn = TxnId::new_v7();
    let now = b.clock.now();
    let commit = EntityCommit {
        key: over.clone(),
        data: data(450_000),
        expected: ExpectedVersion::Absent,
        entry: OutboxRecord::committed(txn, vec![], now, whole_second(now.plus(RETENTION))),
        checks_fence: true,
        applied: None,
    };
    let refused = b.store.commit_entity(&commit).await;
    assert!(
        matches!(refused, Err(CommitError::TooLarge { .. })),
        "{}: 450 KB in entity form: {refused:?}",
        b.name
    );
    assert!(
        b.store.get_items(&[over]).await.unwrap().is_empty(),
        "{}: nothing written",
        b.name
    );
}

/// 99 business writes and a record of 400 KB of messages: 100 actions on the embedded
/// store, which never splits a record; 101 on DynamoDB, whose record takes a part item
/// beyond its main one, so it refuses the commit before sending it.
pub async fn a_split_record_takes_actions_of_its_own_only_on_dynamodb(b: &Backend) {
    let txn = TxnId::new_v7();
    let writes: Vec<BusinessWrite> = (0..99)
        .map(|n| put(&format!("MANY#{txn}#{n}"), json!({ "n": n }), ExpectedVersion::Absent))
        .collect();
    let bodies = [json!({"pad": "x".repeat(200_000)}), json!({"pad": "y".repeat(200_000)})];
    let result = b.store.commit(&request(b, txn, writes, messages(txn, &bodies))).await;
    if b.is_embedded() {
        assert!(result.is_ok(), "embedded: {result:?}");
        assert_eq!(record(b, txn).await.expect("the record").messages.len(), 2);
    } else {
        match result {
            Err(CommitError::TooLarge { reason }) => assert!(reason.contains("101 actions"), "{reason}"),
            other => panic!("{}: 101 actions: {other:?}", b.name),
        }
        assert_eq!(record(b, txn).await, None, "nothing written");
    }
}

/// A record past its expiry reads as absent on both. Its key is free again at once on
/// the embedded store: a tombstone put over it is written, and a commit over an expired
/// tombstone applies. On DynamoDB the item stays until TTL deletes it, and conditions
/// still see it: the tombstone finds the record, and the commit is tombstoned.
pub async fn an_expired_record_blocks_conditions_until_dynamodb_deletes_it(b: &Backend) {
    let hour = Duration::from_secs(3600);
    let now = b.clock.now();
    // A committed record, expiring in an hour.
    let committed = TxnId::new_v7();
    let mut commit = request(b, committed, vec![], vec![]);
    commit.outbox = OutboxRecord::committed(committed, vec![], now, whole_second(now.plus(hour)));
    b.store.commit(&commit).await.expect("the commit");
    // A tombstone, expiring in an hour.
    let tombstoned = TxnId::new_v7();
    let written = b
        .store
        .put_tombstone(tombstoned, now, whole_second(now.plus(hour)))
        .await
        .unwrap();
    assert_eq!(written, TombstoneOutcome::Written);

    b.clock.advance(2 * hour);
    let later = b.clock.now();
    assert_eq!(record(b, committed).await, None, "{}: expired reads as absent", b.name);
    assert_eq!(record(b, tombstoned).await, None, "{}: expired reads as absent", b.name);

    let over_record = b
        .store
        .put_tombstone(committed, later, whole_second(later.plus(hour)))
        .await
        .unwrap();
    let over_tombstone = b.store.commit(&request(b, tombstoned, vec![], vec![])).await;
    if b.is_embedded() {
        assert_eq!(over_record, TombstoneOutcome::Written, "embedded: the key is free");
        assert!(over_tombstone.is_ok(), "embedded: the key is free: {over_tombstone:?}");
    } else {
        match over_record {
            TombstoneOutcome::Exists(found) => {
                assert_ne!(found.state, OutboxState::Tombstone, "{}: the commit", b.name)
            }
            other => panic!("{}: a tombstone over an expired record: {other:?}", b.name),
        }
        assert!(
            matches!(over_tombstone, Err(CommitError::Tombstoned { .. })),
            "{}: a commit over an expired tombstone: {over_tombstone:?}",
            b.name
        );
        assert_eq!(record(b, tombstoned).await, None, "{}: nothing written", b.name);
    }
}

/// A tombstone expiring half a second past a whole second: the embedded store keeps the
/// instant and lets it go then; DynamoDB keeps the TTL in whole seconds, rounded up, and
/// reads it as live until the next whole second.
pub async fn expiry_is_kept_in_whole_seconds_on_dynamodb(b: &Backend) {
    let now = b.clock.now();
    let base = whole_second(now).plus(Duration::from_secs(10));
    let expires_at = base.plus(Duration::from_millis(500));
    let rounded_up = base.plus(Duration::from_secs(1));
    let txn = TxnId::new_v7();
    let written = b.store.put_tombstone(txn, now, expires_at).await.unwrap();
    assert_eq!(written, TombstoneOutcome::Written);
    let read = record(b, txn).await.expect("the tombstone");
    let expected = if b.is_embedded() { expires_at } else { rounded_up };
    assert_eq!(read.expires_at, Some(expected), "{}: its expiry as kept", b.name);

    b.clock.set(base.plus(Duration::from_millis(700)));
    let between = record(b, txn).await;
    assert_eq!(
        between.is_some(),
        !b.is_embedded(),
        "{}: between its instant and the next second",
        b.name
    );
    b.clock.set(rounded_up);
    assert_eq!(record(b, txn).await, None, "{}: at the next second", b.name);
}

/// A commit with a native action (a condition check that holds): the embedded store
/// refuses it whole; DynamoDB runs it in the commit's transaction.
pub async fn native_actions_run_only_on_dynamodb(b: &Backend) {
    let txn = TxnId::new_v7();
    let native = |layout: &outbox::settings::TableLayout| {
        let logical = format!("NATIVE#{txn}");
        let mut check = ConditionCheck::builder()
            .table_name(&layout.table)
            .key(&layout.partition_key, AttributeValue::S(logical.clone()))
            .condition_expression("attribute_not_exists(version)");
        if let Some(sort_key) = &layout.sort_key {
            let value = match &sort_key.value {
                SortKeyValue::SameAsPartitionKey => logical.clone(),
                SortKeyValue::Constant(value) => value.clone(),
                other => panic!("a sort key this case does not build: {other:?}"),
            };
            check = check.key(&sort_key.attribute, AttributeValue::S(value));
        }
        TransactWriteItem::builder()
            .condition_check(check.build().unwrap())
            .build()
    };
    let layout = b
        .layout
        .clone()
        .unwrap_or_else(|| outbox::settings::TableLayout::dedicated("embedded"));
    let result = b
        .store
        .commit_native(&request(b, txn, vec![], vec![]), &[native(&layout)])
        .await;
    assert_eq!(b.store.runs_native_actions(), !b.is_embedded(), "{}", b.name);
    if b.is_embedded() {
        assert!(
            matches!(result, Err(CommitError::NativeUnsupported)),
            "embedded: {result:?}"
        );
        assert_eq!(record(b, txn).await, None, "embedded: nothing written");
    } else {
        assert!(result.is_ok(), "{}: {result:?}", b.name);
        assert!(record(b, txn).await.is_some(), "{}: committed", b.name);
    }
}

/// T deletes an item; the item is created again in entity mode and holds an entry; T's
/// commit is repeated (its reply lost). The embedded store finds T's own record and
/// answers `Ok`; so does DynamoDB within the token window (the token answers). Past it,
/// DynamoDB reads the delete's failed condition first: the entries of the new life make
/// it contention.
pub async fn a_repeated_delete_past_the_token_window_meets_the_new_lifes_entries(b: &Backend) {
    async fn repeat(b: &Backend) -> Result<(), CommitError> {
        let name = fresh("ORDER");
        create(b, &name).await;
        let txn = TxnId::new_v7();
        let delete = request(
            b,
            txn,
            vec![BusinessWrite::Delete {
                key: name.clone(),
                version: 1,
            }],
            vec![],
        );
        b.store.commit(&delete).await.expect("the delete");
        let now = b.clock.now();
        let created = TxnId::new_v7();
        b.store
            .commit_entity(&EntityCommit {
                key: name.clone(),
                data: json!({"n": 2}),
                expected: ExpectedVersion::AbsentAt(2),
                entry: OutboxRecord::committed(
                    created,
                    messages(created, &[json!({})]),
                    now,
                    whole_second(now.plus(RETENTION)),
                ),
                checks_fence: true,
                applied: None,
            })
            .await
            .expect("the create in entity mode");
        let again = b.store.commit(&delete).await;
        let item = b.store.get_entity(&name).await.unwrap().expect("the new life");
        assert_eq!((item.item.version, item.entries.len()), (3, 1), "{}: untouched", b.name);
        again
    }
    let again = repeat(b).await;
    assert!(again.is_ok(), "{}: within the token window: {again:?}", b.name);
    if b.is_embedded() {
        return;
    }
    match repeat(&without_tokens().await).await {
        Err(CommitError::Contention(_)) => {}
        other => panic!("past the token window: {other:?}"),
    }
}

/// Two commits of one item racing: on the embedded store, which runs one write at a time,
/// the loser always finds the winner's write (a version conflict). DynamoDB may cancel a
/// commit that meets another transaction on its item (`TransactionConflict`, given here
/// by the fault proxy): contention, nothing written, whatever the versions say.
pub async fn a_busy_item_is_contention_only_on_dynamodb(b: &Backend) {
    if b.is_embedded() {
        let name = fresh("ORDER");
        create(b, &name).await;
        let commits: Vec<_> = (0..2)
            .map(|n| {
                request(
                    b,
                    TxnId::new_v7(),
                    vec![put(name.as_str(), json!({ "n": n }), ExpectedVersion::Exactly(1))],
                    vec![],
                )
            })
            .collect();
        let results = futures::future::join_all(commits.iter().map(|commit| b.store.commit(commit))).await;
        assert_eq!(results.iter().filter(|result| result.is_ok()).count(), 1, "{results:?}");
        assert!(
            results
                .iter()
                .any(|result| matches!(result, Err(CommitError::VersionConflict { .. }))),
            "embedded: the loser conflicts: {results:?}"
        );
        return;
    }
    let p = proxied().await;
    let b = &p.backend;
    let name = fresh("ORDER");
    create(b, &name).await;
    p.faults.transact(Fault::Conflict);
    let txn = TxnId::new_v7();
    let result = b
        .store
        .commit(&request(
            b,
            txn,
            vec![put(name.as_str(), json!({"n": 1}), ExpectedVersion::Exactly(1))],
            vec![],
        ))
        .await;
    assert!(matches!(result, Err(CommitError::Contention(_))), "{result:?}");
    assert_eq!(record(b, txn).await, None, "nothing written");
    assert_eq!(
        b.store.get_items(std::slice::from_ref(&name)).await.unwrap()[&name].version,
        1
    );
}
