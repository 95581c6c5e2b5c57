//! The conformance case of the request path in entity mode (docs/PROTOCOL.md section 11), end to
//! end through `Outbox` and `ControlPath`: a change to one existing item is committed into
//! it with one conditional write, dispatched by the control path or inline, and fenced
//! past its window so that a late commit of it fails.

use std::time::Duration;

use outbox::control::ControlPath;
use outbox::ports::{ExpectedVersion, ItemKey};
use outbox::protocol::{Message, OutboxState, TxnId};
use outbox::request::{AfterAnswer, InlineDispatch, Outbox, Transaction, TxnError};
use outbox::settings::Timing;
use serde_json::json;

use super::backend::{events, Backend};
use super::cases::{key, record, RETENTION};

/// Short checks, so that the emulator's queues (which keep real time) come due quickly.
fn timing(window: Duration) -> Timing {
    Timing {
        first_check_delay: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(1),
        max_commit_duration: window,
        retention: RETENTION,
    }
}

/// Begins a transaction in entity mode on `order` and stages one more line, read at its
/// version, with a `LineAdded` event.
async fn add_line(outbox: &Outbox, order: &ItemKey) -> Transaction {
    let mut txn = outbox.begin_entity(order.clone()).await.expect("begin");
    let read = txn.get(order).await.expect("read").expect("the order exists");
    let lines = read.data["lines"].as_u64().expect("lines");
    txn.put(
        order.clone(),
        json!({"lines": lines + 1}),
        ExpectedVersion::Exactly(read.version),
    );
    txn.emit(Message::json(events(), &json!({"type": "LineAdded", "lines": lines + 1})).expect("a message"));
    txn
}

/// `TransactWriteItems` calls on the wire so far (AWS only).
fn transactions_on_the_wire(b: &Backend) -> Option<usize> {
    b.wire
        .as_ref()
        .map(|wire| wire.counts().get("TransactWriteItems").copied().unwrap_or(0))
}

/// Begun naming the item, a change to it commits into the item itself (its entry there,
/// no record yet, no `TransactWriteItems` on the wire); the control path publishes it once,
/// records it dispatched and removes the entry; inline publishing does all that in the
/// request; past the window the control path fences the item, after which a commit of the
/// transaction, from a request path whose clock still has it in its window, fails and
/// changes nothing.
pub async fn the_request_path_in_entity_mode_commits_into_the_item_and_dispatches_once(b: &Backend) {
    let timing = timing(Duration::from_secs(60));
    let outbox = b.outbox(timing);
    let control = b.control(timing);
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    // The order is created in the transactional form (a create has nothing to fence).
    let mut create = outbox.begin().await.expect("begin");
    create.put(order.clone(), json!({"lines": 1}), ExpectedVersion::Absent);
    let created = create.commit().await.expect("the create");
    b.handle_until_settled(&control, created.txn_id, timing.first_check_delay, |_| {})
        .await;

    // Inline off: the entry waits in the item for the control path.
    let before = transactions_on_the_wire(b);
    let committed = add_line(&outbox, &order).await.commit().await.expect("the commit");
    let txn_id = committed.txn_id;
    assert_eq!(
        transactions_on_the_wire(b),
        before,
        "{}: no TransactWriteItems for a change to one item",
        b.name
    );
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(entity.item.version, 2, "{}", b.name);
    assert_eq!(entity.item.data, json!({"lines": 2}), "{}", b.name);
    assert_eq!(
        entity.entries.get(&txn_id).map(|entry| entry.state),
        Some(OutboxState::Pending),
        "{}: the entry is in the item",
        b.name
    );
    assert!(
        record(b, txn_id).await.is_none(),
        "{}: no record before dispatch",
        b.name
    );
    b.handle_until_settled(&control, txn_id, timing.first_check_delay, |_| {})
        .await;
    let delivered = b.drain(&events()).await;
    assert_eq!(delivered.len(), 1, "{}: {delivered:?}", b.name);
    assert_eq!(delivered[0].txn_id, Some(txn_id.to_string()), "{}", b.name);
    assert_eq!(
        record(b, txn_id).await.map(|record| record.state),
        Some(OutboxState::Dispatched),
        "{}",
        b.name
    );
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert!(entity.entries.is_empty(), "{}: {:?}", b.name, entity.entries);

    // Inline on: published, recorded and removed before the answer; the control message
    // finds it done.
    let inline = b.outbox(timing).with_inline_publisher(b.publisher.clone());
    let before = transactions_on_the_wire(b);
    let committed = add_line(&inline, &order).await.commit().await.expect("the commit");
    assert_eq!(committed.inline, InlineDispatch::Dispatched, "{}", b.name);
    assert_eq!(transactions_on_the_wire(b), before, "{}", b.name);
    dispatched_by_the_request_path(b, &control, timing, &order, committed.txn_id, 3).await;

    // After the answer: the commit returns with the publish handed over; once it is
    // done, the same as before the answer.
    let after = AfterAnswer::on_tokio();
    let answering = b
        .outbox(timing)
        .with_publishing_after_answer(b.publisher.clone(), after.clone());
    let committed = add_line(&answering, &order).await.commit().await.expect("the commit");
    assert_eq!(committed.inline, InlineDispatch::AfterAnswer, "{}", b.name);
    assert!(
        after.idle_within(Duration::from_secs(30)).await,
        "{}: the dispatch ended",
        b.name
    );
    dispatched_by_the_request_path(b, &control, timing, &order, committed.txn_id, 4).await;

    // Late: the worker's window (two seconds) ends before the commit is tried; it fences
    // the order. The request path's own window is a minute (a clock behind the worker's),
    // so its commit goes to the table, which refuses it.
    let short = self::timing(Duration::from_secs(2));
    let late = add_line(&outbox, &order).await;
    let late_id = late.id();
    let settled = b
        .handle_until_settled(&b.control(short), late_id, short.first_check_delay, |_| {})
        .await;
    assert!(settled >= 2, "{}: deferred, then fenced ({settled} checks)", b.name);
    let fenced = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(fenced.fence, Some(late_id), "{}: the order's fence mark", b.name);
    assert!(fenced.entries.is_empty(), "{}: {:?}", b.name, fenced.entries);
    let refused = late.commit().await;
    assert!(
        matches!(refused, Err(TxnError::CommitWindowExpired { txn_id }) if txn_id == late_id),
        "{}: a commit after the fence: {refused:?}",
        b.name
    );
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(entity.item.version, 4, "{}: nothing applied", b.name);
    assert_eq!(
        record(b, late_id).await.map(|record| record.state),
        Some(OutboxState::Tombstone),
        "{}",
        b.name
    );
    assert!(b.drain(&events()).await.is_empty(), "{}: nothing published", b.name);
}

/// What the request path's own dispatch of `txn_id` leaves: its one event out, its entry
/// gone from `order` (at `version`), its record dispatched, and its control message
/// finding it done (the event published once).
async fn dispatched_by_the_request_path(
    b: &Backend,
    control: &ControlPath,
    timing: Timing,
    order: &ItemKey,
    txn_id: TxnId,
    version: u64,
) {
    let delivered = b.drain(&events()).await;
    assert_eq!(delivered.len(), 1, "{}: {delivered:?}", b.name);
    assert_eq!(delivered[0].txn_id, Some(txn_id.to_string()), "{}", b.name);
    let entity = b.store.get_entity(order).await.unwrap().expect("the order");
    assert_eq!(entity.item.version, version, "{}", b.name);
    assert!(entity.entries.is_empty(), "{}: {:?}", b.name, entity.entries);
    assert_eq!(
        record(b, txn_id).await.map(|record| record.state),
        Some(OutboxState::Dispatched),
        "{}",
        b.name
    );
    b.handle_until_settled(control, txn_id, timing.first_check_delay, |_| {})
        .await;
    assert!(b.drain(&events()).await.is_empty(), "{}: published once", b.name);
}
