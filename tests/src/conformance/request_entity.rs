//! The conformance case of the request path in entity mode (docs/PROTOCOL.md section 11), end to
//! end through `Outbox` and `ControlPath`: a change to one existing item is committed into
//! it with one conditional write, dispatched by the control path or inline, and fenced
//! past its window so that a late commit of it fails; and a transaction refused after
//! its reads, which sends and writes nothing.

use std::time::Duration;

use outbox::control::ControlPath;
use outbox::ports::{Clock, ExpectedVersion, FenceOutcome, ItemKey};
use outbox::protocol::sent_marks::{FORGET_MARGIN, MAX_SENT_MARKS};
use outbox::protocol::{Message, OutboxState, TxnId};
use outbox::request::{AfterAnswer, InlineDispatch, Outbox, Settlement, Transaction, TxnError, TxnStatus};
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
/// no record yet, no `TransactWriteItems` on the wire); the control path publishes it once
/// and settles the entry into its sent mark (no record); inline publishing does all that
/// in the request; past the window the control path fences the item, after which a commit of the
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
    settled_into_its_mark(b, &outbox, &order, txn_id).await;

    // Inline on: published and settled before the answer; the control message finds it
    // done.
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
    // so its commit goes to the table, which refuses it. Its control message was sent
    // early (it goes out with the commit otherwise), so that the worker has it to handle.
    let short = self::timing(Duration::from_secs(2));
    let late = add_line(&outbox, &order).await;
    let late_id = late.id();
    late.send_control().await.expect("the control message");
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
    settled_into_its_mark(b, &b.outbox(timing), order, txn_id).await;
    b.handle_until_settled(control, txn_id, timing.first_check_delay, |_| {})
        .await;
    assert!(b.drain(&events()).await.is_empty(), "{}: published once", b.name);
}

/// `txn_id`'s entry has left `order` in one write that left its sent mark there, and no
/// record: a status read given the item finds it dispatched.
async fn settled_into_its_mark(b: &Backend, outbox: &Outbox, order: &ItemKey, txn_id: TxnId) {
    let entity = b.store.get_entity(order).await.unwrap().expect("the order");
    assert!(entity.entries.is_empty(), "{}: {:?}", b.name, entity.entries);
    assert!(
        entity.sent.contains_key(&txn_id),
        "{}: the sent mark of {txn_id} in {:?}",
        b.name,
        entity.sent
    );
    assert!(record(b, txn_id).await.is_none(), "{}: no record written", b.name);
    assert_eq!(
        outbox.status_in(txn_id, order).await.expect("a status read"),
        TxnStatus::Dispatched,
        "{}",
        b.name
    );
}

/// A sent mark is its transaction's proof of commit while it is in its item: a fence
/// finds it and writes nothing. An item holds at most `MAX_SENT_MARKS`: in a full one an
/// entry settles into its record instead (two writes); the control path drops the marks
/// past their time from a full item; a delete of the item moves its marks to their
/// records in its commit. A status read finds each where it is.
pub async fn sent_marks_prove_their_commits_while_they_are_kept(b: &Backend) {
    let timing = timing(Duration::from_secs(60));
    let outbox = b.outbox(timing);
    let inline = b.outbox(timing).with_inline_publisher(b.publisher.clone());
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let mut create = outbox.begin().await.expect("begin");
    create.put(order.clone(), json!({"lines": 1}), ExpectedVersion::Absent);
    create.commit().await.expect("the create");
    let add = || async {
        add_line(&inline, &order)
            .await
            .commit()
            .await
            .expect("the commit")
            .txn_id
    };

    // A fence of a transaction whose mark the item holds finds it and changes nothing.
    let first = add().await;
    settled_into_its_mark(b, &inline, &order, first).await;
    let now = b.clock.now();
    let fenced = b
        .store
        .fence_entity(&order, first, now, now.plus(RETENTION))
        .await
        .expect("the fence");
    assert_eq!(fenced, FenceOutcome::Dispatched, "{}", b.name);
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(entity.fence, None, "{}: no mark raised", b.name);
    assert!(record(b, first).await.is_none(), "{}: no tombstone", b.name);

    // Full, the item takes no more marks: the next entry settles into its record.
    while b.store.get_entity(&order).await.unwrap().expect("the order").sent.len() < MAX_SENT_MARKS {
        add().await;
    }
    let recorded = add().await;
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(entity.sent.len(), MAX_SENT_MARKS, "{}", b.name);
    assert!(
        !entity.sent.contains_key(&recorded) && entity.entries.is_empty(),
        "{}",
        b.name
    );
    assert_eq!(
        record(b, recorded).await.map(|record| record.state),
        Some(OutboxState::Dispatched),
        "{}: a full item's entry settles into its record",
        b.name
    );
    assert_eq!(
        outbox.status_in(recorded, &order).await.expect("a status read"),
        TxnStatus::Dispatched,
        "{}",
        b.name
    );
    assert_eq!(b.drain(&events()).await.len(), MAX_SENT_MARKS + 1, "{}", b.name);
    b.wait(timing.first_check_delay).await;
    b.settle(timing).await;

    // Past their time, the control path drops the marks of a full item when it reads it.
    b.clock.advance(RETENTION + FORGET_MARGIN + Duration::from_secs(1));
    let late = add().await;
    b.wait(timing.first_check_delay).await;
    b.settle(timing).await;
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert!(entity.sent.is_empty(), "{}: {:?}", b.name, entity.sent);
    assert_eq!(
        record(b, late).await.map(|record| record.state),
        Some(OutboxState::Dispatched),
        "{}: settled while the item was full",
        b.name
    );
    let marked = add().await;
    settled_into_its_mark(b, &inline, &order, marked).await;
    b.drain(&events()).await;

    // A delete through the outbox moves the marks left to their records in its commit.
    let mut delete = outbox.begin().await.expect("begin");
    let read = delete.get(&order).await.expect("read").expect("the order");
    delete.delete(order.clone(), read.version);
    delete.commit().await.expect("the delete");
    assert!(
        b.store.get_entity(&order).await.unwrap().is_none(),
        "{}: deleted",
        b.name
    );
    assert_eq!(
        record(b, marked).await.map(|record| record.state),
        Some(OutboxState::Dispatched),
        "{}: the mark moved to its record with the delete",
        b.name
    );
    assert_eq!(
        outbox.status_in(marked, &order).await.expect("a status read"),
        TxnStatus::Dispatched,
        "{}",
        b.name
    );
    let now = b.clock.now();
    let fenced = b
        .store
        .fence_entity(&order, marked, now, now.plus(RETENTION))
        .await
        .expect("the fence");
    assert!(
        matches!(&fenced, FenceOutcome::Recorded(record) if record.state == OutboxState::Dispatched),
        "{}: {fenced:?}",
        b.name
    );
}

/// A transaction refused after its reads (a 404, 409 or 412 its reads decide), in both
/// forms: begun, its item read, abandoned. Nothing of it was sent, so nothing is: no control
/// message comes, and nothing is written (no tombstone record, no fence, the item as it
/// was); on AWS the reads alone reach the wire. A commit of one, tried after it was
/// abandoned (a task the handler gave it to), is refused and sends nothing either.
pub async fn a_refusal_after_the_reads_sends_nothing_and_writes_nothing(b: &Backend) {
    let timing = timing(Duration::from_secs(60));
    let outbox = b.outbox(timing);
    let order = key(&format!("ORDER#{}", TxnId::new_v7()));
    let mut create = outbox.begin().await.expect("begin");
    create.put(order.clone(), json!({"lines": 1}), ExpectedVersion::Absent);
    let created = create.commit().await.expect("the create");
    b.handle_until_settled(&b.control(timing), created.txn_id, timing.first_check_delay, |_| {})
        .await;
    let before = b.wire.as_ref().map(|wire| wire.counts());

    let mut refused: Vec<TxnId> = Vec::new();
    for entity in [false, true] {
        let txn = match entity {
            true => outbox.begin_entity(order.clone()).await,
            false => outbox.begin().await,
        }
        .expect("begin");
        let read = txn.get(&order).await.expect("read").expect("the order exists");
        // `If-Match: "7"`, say: the version read is another one, and the handler refuses.
        assert_ne!(read.version, 7, "{}", b.name);
        refused.push(txn.id());
        assert_eq!(txn.abandon().await, Settlement::NothingSent, "{}", b.name);
    }
    let late = add_line(&outbox, &order).await;
    let late_id = late.id();
    refused.push(late_id);
    assert_eq!(
        outbox.abandon(late_id, None).await,
        Settlement::NothingSent,
        "{}",
        b.name
    );
    let refused_commit = late.commit().await;
    assert!(
        matches!(refused_commit, Err(TxnError::Abandoned { txn_id }) if txn_id == late_id),
        "{}: {refused_commit:?}",
        b.name
    );

    if let (Some(wire), Some(before)) = (&b.wire, before) {
        let mut made = wire.counts();
        for (operation, count) in before {
            if let Some(now) = made.get_mut(&operation) {
                *now -= count;
            }
        }
        made.retain(|_, count| *count > 0);
        let reads: usize = made.values().sum();
        assert!(
            made.keys()
                .all(|operation| operation == "BatchGetItem" || operation == "GetItem")
                && reads == 3,
            "{}: the three reads and nothing else on the wire: {made:?}",
            b.name
        );
    }
    b.wait(timing.first_check_delay).await;
    let deliveries = b
        .inbox
        .receive(10, Duration::from_secs(1), b.visibility_timeout)
        .await
        .expect("receive");
    assert!(deliveries.is_empty(), "{}: no control message: {deliveries:?}", b.name);
    for txn_id in refused {
        assert!(record(b, txn_id).await.is_none(), "{}: no record of {txn_id}", b.name);
    }
    let entity = b.store.get_entity(&order).await.unwrap().expect("the order");
    assert_eq!(entity.item.version, 1, "{}", b.name);
    assert!(entity.entries.is_empty() && entity.fence.is_none(), "{}", b.name);
}
