//! The conformance case of the chain (docs/PROTOCOL.md): every message of a transaction
//! that changes one entity it read has its place in that entity's history, per
//! destination, in commit order with no gap and no fork, across a delete and a re-create,
//! and every destination kind carries it.

use std::time::Duration;

use outbox::ports::{Clock, ControlDelivery, ExpectedVersion, ItemKey};
use outbox::protocol::{fifo_group_of, ControlMessage, DestinationName, FifoGrouping, Message, Place, Position, TxnId};
use outbox::request::{Outbox, TxnError};
use outbox::settings::Timing;
use serde_json::json;

use super::backend::{audit, bus, events, fanout, Backend};
use super::cases::{key, RETENTION};

/// The timing of the chain's and the differences' cases.
pub(super) fn timing() -> Timing {
    Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(1),
        max_commit_duration: Duration::from_secs(60),
        retention: RETENTION,
    }
}

/// One transaction on `order`, begun in entity mode: it reads the order, writes `data` (a
/// delete where `None`), and emits one message to each of `to`, in order.
async fn change(outbox: &Outbox, order: &ItemKey, data: Option<serde_json::Value>, to: &[DestinationName]) -> TxnId {
    change_in(outbox, order, data, to, true).await
}

/// [`change`], begun in entity mode (its commit an entry in the item) or not (the
/// transactional form: a record of its own beside the item).
async fn change_in(
    outbox: &Outbox,
    order: &ItemKey,
    data: Option<serde_json::Value>,
    to: &[DestinationName],
    entity_mode: bool,
) -> TxnId {
    let mut txn = match entity_mode {
        true => outbox.begin_entity(order.clone()).await.expect("begin"),
        false => outbox.begin().await.expect("begin"),
    };
    let read = txn.get(order).await.expect("read");
    match (data, &read) {
        (Some(data), Some(item)) => txn.put(order.clone(), data, ExpectedVersion::Exactly(item.version)),
        (Some(data), None) => txn.put(order.clone(), data, ExpectedVersion::Absent),
        (None, Some(item)) => txn.delete(order.clone(), item.version),
        (None, None) => panic!("nothing to delete"),
    }
    for (index, destination) in to.iter().enumerate() {
        let message = Message::json(destination.clone(), &json!({ "index": index }))
            .expect("a message")
            .with_event("com.example.orders", "OrderChanged");
        txn.emit(message);
    }
    txn.commit().await.expect("the commit").txn_id
}

fn place(seq: u64, version: u64, after: u64) -> Place {
    Place { seq, version, after }
}

/// The places of what `destination` received from `order`, in the order they came; on
/// the FIFO destination (audit), each in the order's group.
async fn received(b: &Backend, destination: &DestinationName, order: &ItemKey) -> Vec<Place> {
    b.drain(destination)
        .await
        .into_iter()
        .map(|delivered| {
            let position: Position = delivered.position.unwrap_or_else(|| panic!("{}: no position", b.name));
            assert_eq!(&position.entity, order, "{}", b.name);
            if destination == &audit() {
                assert_eq!(
                    delivered.group_id,
                    Some(fifo_group_of(order)),
                    "{}: grouped by entity",
                    b.name
                );
            }
            position.place()
        })
        .collect()
}

/// Creates, changes, a change that sends nothing, a delete and a re-create of one order,
/// each publishing inline: each destination receives the order's messages with their
/// places counting on per destination (seq), each naming the order's version after its
/// transaction and the version of the last one that sent there (after), across the
/// delete. Two transactions that read the same version cannot both commit: the chain has
/// no fork.
pub async fn messages_carry_their_place_in_their_entitys_history(b: &Backend) {
    let outbox = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    // 1: created, two to events, one to audit (and one to the bus).
    change(
        &outbox,
        &order,
        Some(json!({"n": 1})),
        &[events(), audit(), events(), bus()],
    )
    .await;
    // 2: events and the topic; 3: nothing; 4: audit only.
    change(&outbox, &order, Some(json!({"n": 2})), &[events(), fanout()]).await;
    change(&outbox, &order, Some(json!({"n": 3})), &[]).await;
    change(&outbox, &order, Some(json!({"n": 4})), &[audit()]).await;
    // 5: deleted, with an event; 6: created again.
    change(&outbox, &order, None, &[events()]).await;
    change(&outbox, &order, Some(json!({"n": 6})), &[events(), audit()]).await;
    assert_eq!(
        received(b, &events(), &order).await,
        [
            place(1, 1, 0),
            place(2, 1, 0),
            place(3, 2, 1),
            place(4, 5, 2),
            place(5, 6, 5)
        ],
        "{}: events",
        b.name
    );
    assert_eq!(
        received(b, &audit(), &order).await,
        [place(1, 1, 0), place(2, 4, 1), place(3, 6, 4)],
        "{}: audit",
        b.name
    );
    assert_eq!(
        received(b, &bus(), &order).await,
        [place(1, 1, 0)],
        "{}: the bus",
        b.name
    );
    assert_eq!(
        received(b, &fanout(), &order).await,
        [place(1, 2, 0)],
        "{}: the topic",
        b.name
    );

    // Two transactions read version 6; the second to commit is refused, and its retry
    // stamps from the heads the first moved.
    let mut first = outbox.begin_entity(order.clone()).await.unwrap();
    let mut second = outbox.begin_entity(order.clone()).await.unwrap();
    for txn in [&mut first, &mut second] {
        let read = txn.get(&order).await.unwrap().expect("the order");
        txn.put(order.clone(), json!({"n": 7}), ExpectedVersion::Exactly(read.version));
        txn.emit(Message::json(events(), &json!({})).unwrap());
    }
    first.commit().await.expect("the first");
    assert!(
        matches!(second.commit().await, Err(TxnError::VersionConflict { .. })),
        "{}",
        b.name
    );
    change(&outbox, &order, Some(json!({"n": 8})), &[events()]).await;
    assert_eq!(
        received(b, &events(), &order).await,
        [place(6, 7, 6), place(7, 8, 7)],
        "{}: one chain",
        b.name
    );

    // Grouped by transaction where chosen: the place is kept, the group is the
    // transaction's.
    let by_transaction = b
        .outbox(timing())
        .with_inline_publisher(b.publisher.clone())
        .with_fifo_groups(FifoGrouping::Transaction);
    let txn_id = change(&by_transaction, &order, Some(json!({"n": 9})), &[audit()]).await;
    let delivered = b.drain(&audit()).await;
    assert_eq!(
        delivered
            .iter()
            .map(|delivered| (
                delivered.group_id.clone(),
                delivered.position.as_ref().map(Position::place)
            ))
            .collect::<Vec<_>>(),
        [(Some(txn_id.to_string()), Some(place(4, 9, 6)))],
        "{}",
        b.name
    );
}

/// A transaction that changes several items, or creates one it did not read, has no
/// entity to be placed in: its messages carry no position.
pub async fn messages_of_no_one_entity_carry_no_position(b: &Backend) {
    let outbox = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let (one, two) = (
        key(&format!("ORDER#{}", TxnId::new_v7())),
        key(&format!("ORDER#{}", TxnId::new_v7())),
    );
    let mut txn = outbox.begin().await.unwrap();
    txn.put(one.clone(), json!({}), ExpectedVersion::Absent);
    txn.put(two.clone(), json!({}), ExpectedVersion::Absent);
    txn.emit(Message::json(events(), &json!({"two": true})).unwrap());
    txn.commit().await.expect("two items");
    let mut blind = outbox.begin().await.unwrap();
    blind.put(
        key(&format!("ORDER#{}", TxnId::new_v7())),
        json!({}),
        ExpectedVersion::Absent,
    );
    blind.emit(Message::json(events(), &json!({"blind": true})).unwrap());
    blind.commit().await.expect("a blind create");
    let delivered = b.drain(&events()).await;
    assert_eq!(delivered.len(), 2, "{}", b.name);
    assert!(
        delivered.iter().all(|delivered| delivered.position.is_none()),
        "{}: {delivered:?}",
        b.name
    );
}

/// The control message of `txn_id`, begun in entity mode on `order`, as the control path
/// receives it (not through the queue: the test picks which comes first).
fn control_message(b: &Backend, txn_id: TxnId, order: &ItemKey) -> ControlDelivery {
    control_message_in(b, txn_id, Some(order))
}

/// The control message of `txn_id`, begun in entity mode on `entity` where it is named.
fn control_message_in(b: &Backend, txn_id: TxnId, entity: Option<&ItemKey>) -> ControlDelivery {
    let first = ControlMessage::first(txn_id, b.clock.now());
    let message = match entity {
        Some(order) => first.with_entity(order.clone()),
        None => first,
    };
    ControlDelivery {
        message_id: format!("test-{txn_id}"),
        receipt: format!("test-{txn_id}"),
        body: message.encode(),
        receive_count: 1,
    }
}

/// No publisher sends a transaction's messages before those of an earlier transaction of
/// the same entity still waiting in it, on a destination that keeps order: committed with
/// nobody publishing (a crash between a commit and its publish), the earlier one's FIFO
/// messages go out first, under their own ids, when the request path publishes the later
/// one; its entry stays for its own publisher (on a standard queue, which keeps no order,
/// nothing is sent twice). The control path, handed the later control message first,
/// publishes the earlier entry first and settles it. On the FIFO destination the order is
/// the entity's commit order.
pub async fn a_publisher_sends_the_entitys_earlier_transactions_first(b: &Backend) {
    let silent = b.outbox(timing());
    let publishing = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let first = change(&silent, &order, Some(json!({"n": 1})), &[audit(), events()]).await;
    let second = change(&publishing, &order, Some(json!({"n": 2})), &[audit(), events()]).await;
    let from = |delivered: Vec<super::backend::Delivered>| -> Vec<Option<String>> {
        delivered.into_iter().map(|delivered| delivered.txn_id).collect()
    };
    assert_eq!(
        from(b.drain(&audit()).await),
        [Some(first.to_string()), Some(second.to_string())],
        "{}: the FIFO destination, in commit order",
        b.name
    );
    assert_eq!(
        from(b.drain(&events()).await),
        [Some(second.to_string())],
        "{}: the standard queue, nothing sent twice",
        b.name
    );
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(
        entity.entries.keys().copied().collect::<Vec<_>>(),
        [first],
        "{}: the earlier entry stays for its own publisher",
        b.name
    );
    assert!(entity.sent.contains_key(&second), "{}: the later one settled", b.name);
    // The earlier one's own control message publishes it all and settles it; its FIFO
    // copy is dropped as a duplicate within the deduplication window.
    let control = b.control(timing());
    let report = control.handle(&control_message(b, first, &order)).await;
    assert!(
        matches!(report.result, Ok(outbox::control::ControlOutcome::Dispatched { .. })),
        "{}: {report:?}",
        b.name
    );
    assert_eq!(from(b.drain(&events()).await), [Some(first.to_string())], "{}", b.name);
    // SQS drops the copy within its deduplication window; moto keeps it: a copy under
    // the earlier one's own id, never a later message.
    let copies = from(b.drain(&audit()).await);
    assert!(
        copies.iter().all(|txn| txn == &Some(first.to_string())),
        "{}: only a copy of the earlier one: {copies:?}",
        b.name
    );
    if b.name == "embedded" {
        assert!(copies.is_empty(), "deduplicated");
    }

    // The control path, handed the later transaction's control message first.
    let third = change(&silent, &order, Some(json!({"n": 3})), &[audit()]).await;
    let fourth = change(&silent, &order, Some(json!({"n": 4})), &[audit()]).await;
    let report = control.handle(&control_message(b, fourth, &order)).await;
    assert!(
        matches!(report.result, Ok(outbox::control::ControlOutcome::Dispatched { .. })),
        "{}: {report:?}",
        b.name
    );
    let delivered: Vec<(Option<String>, Option<Place>)> = b
        .drain(&audit())
        .await
        .into_iter()
        .map(|delivered| (delivered.txn_id, delivered.position.map(|position| position.place())))
        .collect();
    assert_eq!(
        delivered,
        [
            (Some(third.to_string()), Some(place(3, 3, 2))),
            (Some(fourth.to_string()), Some(place(4, 4, 3)))
        ],
        "{}",
        b.name
    );
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert!(entity.entries.is_empty(), "{}: {:?}", b.name, entity.entries.keys());
    // The earlier one's own control message then finds it done.
    let report = control.handle(&control_message(b, third, &order)).await;
    assert!(
        matches!(report.result, Ok(outbox::control::ControlOutcome::AlreadyDone { .. })),
        "{}: {report:?}",
        b.name
    );
    assert!(b.drain(&audit()).await.is_empty(), "{}", b.name);
}

/// What a FIFO destination (audit) received: each message's transaction, in order.
async fn audit_order(b: &Backend) -> Vec<Option<String>> {
    b.drain(&audit())
        .await
        .into_iter()
        .map(|delivered| delivered.txn_id)
        .collect()
}

/// The order of publishing holds across the two forms a commit takes: a transaction
/// committed in the transactional form (its record beside the item, not an entry in it)
/// and still unsent goes out first on a destination that keeps order, found through the
/// chain, which names each transaction's predecessor. Request path and control path,
/// each with the earlier one in either form.
pub async fn a_publisher_sends_an_earlier_commit_of_either_form_first(b: &Backend) {
    let silent = b.outbox(timing());
    let publishing = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let control = b.control(timing());
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let s = |txn: TxnId| Some(txn.to_string());
    let dispatched = |report: &outbox::control::ItemReport| {
        matches!(report.result, Ok(outbox::control::ControlOutcome::Dispatched { .. }))
    };

    // The request path, behind a record: the record's FIFO message goes first, the record
    // stays for its own publisher.
    let first = change_in(&silent, &order, Some(json!({"n": 1})), &[audit(), events()], false).await;
    let second = change_in(&publishing, &order, Some(json!({"n": 2})), &[audit()], true).await;
    assert_eq!(
        audit_order(b).await,
        [s(first), s(second)],
        "{}: request path, behind a record",
        b.name
    );
    assert!(
        b.drain(&events()).await.is_empty(),
        "{}: nothing sent twice where order is not kept",
        b.name
    );
    let report = control.handle(&control_message_in(b, first, None)).await;
    assert!(dispatched(&report), "{}: {report:?}", b.name);
    assert_eq!(b.drain(&events()).await.len(), 1, "{}", b.name);
    let copies = audit_order(b).await;
    assert!(copies.iter().all(|txn| txn == &s(first)), "{}: {copies:?}", b.name);

    // The request path of a transactional commit, behind an entry.
    let third = change_in(&silent, &order, Some(json!({"n": 3})), &[audit()], true).await;
    let fourth = change_in(&publishing, &order, Some(json!({"n": 4})), &[audit()], false).await;
    assert_eq!(
        audit_order(b).await,
        [s(third), s(fourth)],
        "{}: request path, behind an entry",
        b.name
    );

    // The control path of a transactional commit, behind an entry and a record: handed the
    // latest's control message first, it publishes them all in commit order, and settles
    // the earlier ones.
    let report = control.handle(&control_message(b, third, &order)).await;
    assert!(dispatched(&report), "{}: {report:?}", b.name);
    let _ = b.drain(&audit()).await;
    let fifth = change_in(&silent, &order, Some(json!({"n": 5})), &[audit()], true).await;
    let sixth = change_in(&silent, &order, Some(json!({"n": 6})), &[audit()], false).await;
    let seventh = change_in(&silent, &order, Some(json!({"n": 7})), &[audit()], false).await;
    let report = control.handle(&control_message_in(b, seventh, None)).await;
    assert!(dispatched(&report), "{}: {report:?}", b.name);
    assert_eq!(
        audit_order(b).await,
        [s(fifth), s(sixth), s(seventh)],
        "{}: control path, behind an entry and a record",
        b.name
    );
    for (earlier, entity) in [(fifth, Some(&order)), (sixth, None)] {
        let report = control.handle(&control_message_in(b, earlier, entity)).await;
        assert!(
            matches!(report.result, Ok(outbox::control::ControlOutcome::AlreadyDone { .. })),
            "{}: {earlier} was settled by the later one's publisher: {report:?}",
            b.name
        );
    }
    assert!(b.drain(&audit()).await.is_empty(), "{}", b.name);
}

/// An in-order consumer in entity mode keeps its chains' positions in its entity's key:
/// a commit into the entity moves one under its condition on the version; a message that
/// changes nothing moves one alone, where the key is as read (holding an item or not),
/// never down, and without changing the version; the key keeps them across a delete and
/// a re-create, as it keeps its chain heads.
pub async fn positions_applied_live_in_the_key_across_its_lives(b: &Backend) {
    use outbox::ports::{CommitError, EntityCommit};
    use outbox::protocol::{Applied, OutboxRecord};
    let outbox = b.outbox(timing());
    let shipment = key(&format!("SHIPMENT#{}", TxnId::new_v7()));
    let name = format!("shipping#events#ORDER#{}", TxnId::new_v7());
    // The consumer's transaction that applied it, kept beside the seq for whoever looks.
    let txn = TxnId::new_v7();
    let at = |seq: u64| Applied {
        seq,
        version: seq + 1,
        txn: Some(txn),
    };
    let kept = |keys: std::collections::BTreeMap<ItemKey, outbox::ports::KeyRead>| {
        let read = keys.get(&shipment).cloned().unwrap_or_default();
        (
            read.item.is_some(),
            read.version,
            read.applied.get(&name).map(|applied| applied.seq),
        )
    };
    let read = || async { kept(b.store.get_keys(std::slice::from_ref(&shipment)).await.unwrap()) };

    // A key never written: the position alone, the key still without an item.
    b.store
        .keep_applied(&shipment, ExpectedVersion::AbsentAt(0), &name, at(1))
        .await
        .unwrap_or_else(|error| panic!("{}: {error}", b.name));
    assert_eq!(read().await, (false, 0, Some(1)), "{}", b.name);
    let stored = b.store.get_keys(std::slice::from_ref(&shipment)).await.unwrap();
    assert_eq!(
        stored[&shipment].applied.get(&name),
        Some(&at(1)),
        "{}: the position as kept, its transaction too",
        b.name
    );
    // As far already (another copy): done; below: never moves down.
    b.store
        .keep_applied(&shipment, ExpectedVersion::AbsentAt(0), &name, at(1))
        .await
        .unwrap();
    b.store
        .keep_applied(&shipment, ExpectedVersion::AbsentAt(0), &name, at(2))
        .await
        .unwrap();
    b.store
        .keep_applied(&shipment, ExpectedVersion::AbsentAt(0), &name, at(1))
        .await
        .unwrap();
    assert_eq!(read().await, (false, 0, Some(2)), "{}", b.name);
    // Blind (no item, whatever the version), as a consumer whose read of the key failed
    // would: as far already, done.
    b.store
        .keep_applied(&shipment, ExpectedVersion::Absent, &name, at(2))
        .await
        .unwrap_or_else(|error| panic!("{}: {error}", b.name));
    // Not as read: a conflict, nothing written.
    let conflict = b
        .store
        .keep_applied(&shipment, ExpectedVersion::Exactly(1), &name, at(3))
        .await;
    assert!(
        matches!(conflict, Err(CommitError::VersionConflict { .. })),
        "{}: {conflict:?}",
        b.name
    );

    // A create carrying the next position, in its one write.
    let now = b.clock.now();
    let txn = TxnId::consumed("conformance", &format!("{}:0", TxnId::new_v7()));
    let create = EntityCommit {
        key: shipment.clone(),
        data: json!({"lines": 1}),
        expected: ExpectedVersion::AbsentAt(0),
        entry: OutboxRecord::committed(txn, Vec::new(), now, now.plus(super::cases::RETENTION))
            .by_attempt(TxnId::new_v7()),
        checks_fence: false,
        applied: Some((name.clone(), at(3))),
    };
    b.store
        .commit_entity(&create)
        .await
        .unwrap_or_else(|error| panic!("{}: {error}", b.name));
    b.store.remove_entry(&shipment, txn).await.unwrap();
    assert_eq!(read().await, (true, 1, Some(3)), "{}", b.name);
    let entity = b.store.get_entity(&shipment).await.unwrap().expect("created");
    assert_eq!(
        entity.applied.get(&name).map(|applied| applied.seq),
        Some(3),
        "{}",
        b.name
    );
    // Alone, on the live item at its version: the version stays.
    b.store
        .keep_applied(&shipment, ExpectedVersion::Exactly(1), &name, at(4))
        .await
        .unwrap();
    assert_eq!(read().await, (true, 1, Some(4)), "{}", b.name);
    // A commit of another copy of that message, at the version it read: the position
    // moved meanwhile, without the version, and only moves up: refused.
    let late = EntityCommit {
        expected: ExpectedVersion::Exactly(1),
        entry: OutboxRecord::committed(txn, Vec::new(), now, now.plus(super::cases::RETENTION))
            .by_attempt(TxnId::new_v7()),
        applied: Some((name.clone(), at(4))),
        ..create.clone()
    };
    let refused = b.store.commit_entity(&late).await;
    assert!(
        matches!(refused, Err(CommitError::VersionConflict { .. })),
        "{}: {refused:?}",
        b.name
    );
    assert_eq!(read().await, (true, 1, Some(4)), "{}", b.name);

    // Deleted and created again: the position stays with the key.
    change_in(&outbox, &shipment, None, &[], false).await;
    assert_eq!(read().await, (false, 2, Some(4)), "{}: kept by the vacant key", b.name);
    b.store
        .keep_applied(&shipment, ExpectedVersion::AbsentAt(2), &name, at(5))
        .await
        .unwrap();
    change_in(&outbox, &shipment, Some(json!({"lines": 0})), &[], false).await;
    assert_eq!(read().await, (true, 3, Some(5)), "{}: continued by the create", b.name);
}

/// More earlier transactions of an entity still unsent than one search reads (17 records,
/// its publishers crashed): a later transaction is not published ahead of them, by the
/// request path or the control path, whose try fails, to come again; the oldest one's
/// own control message publishes it, and the run drains in commit order.
pub async fn a_run_of_unsent_transactions_longer_than_a_search_drains_oldest_first(b: &Backend) {
    let silent = b.outbox(timing());
    let publishing = b.outbox(timing()).with_inline_publisher(b.publisher.clone());
    let control = b.control(timing());
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let mut unsent = Vec::new();
    for n in 0..17 {
        unsent.push(change_in(&silent, &order, Some(json!({ "n": n })), &[audit()], false).await);
    }
    let last = change_in(&publishing, &order, Some(json!({ "n": 17 })), &[audit()], true).await;
    assert!(
        audit_order(b).await.is_empty(),
        "{}: nothing sent ahead of 17 unsent",
        b.name
    );
    let report = control.handle(&control_message(b, last, &order)).await;
    assert!(
        matches!(report.result, Err(outbox::control::ControlError::EarlierUnsent { .. })),
        "{}: {report:?}",
        b.name
    );
    assert!(audit_order(b).await.is_empty(), "{}", b.name);
    // The oldest go first, each through its own control message; then the latest finds
    // its earlier ones within a search (15 unsent, and the 16th record read was sent).
    for oldest in &unsent[..2] {
        let report = control.handle(&control_message_in(b, *oldest, None)).await;
        assert!(
            matches!(report.result, Ok(outbox::control::ControlOutcome::Dispatched { .. })),
            "{}: {report:?}",
            b.name
        );
    }
    let report = control.handle(&control_message(b, last, &order)).await;
    assert!(
        matches!(report.result, Ok(outbox::control::ControlOutcome::Dispatched { .. })),
        "{}: {report:?}",
        b.name
    );
    let expected: Vec<Option<String>> = unsent.iter().chain([&last]).map(|txn| Some(txn.to_string())).collect();
    assert_eq!(audit_order(b).await, expected, "{}: in commit order", b.name);
}
