//! The in-order mode on the embedded backend, explored exhaustively over small schedules:
//! every order of delivery of an entity's messages, with a duplicate and another entity's
//! message mixed in, applies each message once, in its chain's order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::super::*;
use crate::embedded::{EmbeddedBackend, EmbeddedInbox, EmbeddedQueue, ManualClock};
use crate::ports::{ExpectedVersion, Inbox, ItemKey};
use crate::protocol::{Position, MESSAGE_ID_ATTRIBUTE};
use crate::time::Timestamp;

/// Appends each message's `seq` to `APPLIED#{entity}`: the order the consumer applied
/// them in, each application once.
struct Recording;

#[async_trait]
impl Handler for Recording {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        let key: ItemKey = format!("APPLIED#{}", position.entity).parse()?;
        let read = staging.get(&key).await?;
        let mut applied: Vec<Value> = read
            .as_ref()
            .and_then(|item| item.data["seqs"].as_array().cloned())
            .unwrap_or_default();
        applied.push(json!(position.seq));
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, json!({ "seqs": applied }), expected);
        Ok(())
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// Message `seq` of `entity`'s chain on `events`, as the queue delivers it.
fn placed(entity: &str, seq: u64) -> Delivery {
    let position = Position {
        producer: None,
        entity: entity.parse().unwrap(),
        chain: "events".parse().unwrap(),
        seq,
        version: seq + 1,
        after: seq,
        previous: None,
    };
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{entity}:{seq}"));
    Delivery {
        message_id: format!("q-{entity}-{seq}"),
        receipt: String::new(),
        body: json!({ "seq": seq }).to_string(),
        attributes,
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// A clock, an embedded backend with the destination `inbox`, and consumer `ordered` of
/// `handler` on them, with no way back for a waiting message.
fn ordered_world(handler: Arc<dyn Handler>) -> (Arc<ManualClock>, EmbeddedBackend, Consumer) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [("inbox".parse().unwrap(), false)]);
    let consumer = Consumer::new(
        "ordered".parse().unwrap(),
        backend.consumer_ports(clock.clone()),
        handler,
        Duration::from_secs(3600),
    );
    (clock, backend, consumer)
}

/// [`ordered_world`] with a way back for a waiting message: the embedded inbox of
/// `inbox`, whose queue it returns too.
fn requeueing_world(
    handler: Arc<dyn Handler>,
) -> (
    Arc<ManualClock>,
    EmbeddedBackend,
    Arc<EmbeddedQueue>,
    EmbeddedInbox,
    Consumer,
) {
    let (clock, backend, consumer) = ordered_world(handler);
    let queue = backend.publisher.queue(&"inbox".parse().unwrap()).unwrap().clone();
    let inbox = EmbeddedInbox::new(queue.clone(), clock.clone());
    let consumer = consumer.with_requeue(Arc::new(inbox.clone()));
    (clock, backend, queue, inbox, consumer)
}

fn permutations(items: &[Delivery]) -> Vec<Vec<Delivery>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for (index, first) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(index);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            all.push(tail);
        }
    }
    all
}

async fn applied(backend: &EmbeddedBackend, entity: &str) -> Vec<u64> {
    let key: ItemKey = format!("APPLIED#{entity}").parse().unwrap();
    let items = crate::ports::Store::get_items(backend.store.as_ref(), std::slice::from_ref(&key))
        .await
        .unwrap();
    items.get(&key).map_or_else(Vec::new, |item| {
        item.data["seqs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|seq| seq.as_u64().unwrap())
            .collect()
    })
}

/// [`Recording`] in entity mode: `APPLIED#{entity}` is the handler's entity, which keeps
/// the chain's position too. Seq 2 of `ORDER#a` and everything of `ORDER#b` write
/// nothing: their positions move alone, in a live item and in a key never written.
struct RecordingInEntity;

#[async_trait]
impl Handler for RecordingInEntity {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        if position.seq == 2 || position.entity.as_str() == "ORDER#b" {
            return Ok(());
        }
        Recording.handle(message, staging).await
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        Ok(Some(format!("APPLIED#{}", position.entity).parse()?))
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// Runs every order of `deliveries` through a fresh consumer of `handler` on a fresh
/// backend, each waiting copy coming again after its delay until nothing is left; a wait
/// is never a failure. Each schedule's deliveries (their queue ids) and backend, with the
/// waits and duplicates met.
async fn explore(
    deliveries: &[Delivery],
    handler: Arc<dyn Handler>,
) -> (Vec<(Vec<String>, EmbeddedBackend)>, usize, usize) {
    let (mut waited, mut duplicates) = (0, 0);
    let mut explored = Vec::new();
    for schedule in permutations(deliveries) {
        let (clock, backend, queue, inbox, consumer) = requeueing_world(handler.clone());
        let order: Vec<String> = schedule.iter().map(|d| d.message_id.clone()).collect();
        for delivery in &schedule {
            match consumer.consume(delivery).await {
                Ok(ConsumeOutcome::Kept { .. }) => waited += 1,
                Ok(ConsumeOutcome::Duplicate) => duplicates += 1,
                Ok(_) => {}
                Err(error) => panic!("{order:?}: {error}"),
            }
        }
        // Nothing stalls: every message is applied once its predecessor is, by whichever
        // delivery applied that one, before any reminder comes.
        for (entity, last) in [("ORDER#a", 3), ("ORDER#b", 1)] {
            let position = Position::from_attributes(&placed(entity, last).attributes)
                .unwrap()
                .unwrap();
            let key: ItemKey = format!("APPLIED#{entity}").parse().unwrap();
            assert_eq!(
                consumer.applied_now(&position, Some(&key)).await.unwrap(),
                last,
                "{order:?}: {entity} applied to its last message with no wait"
            );
            for seq in 1..=last {
                let key = crate::consumer::in_order::kept_key("ordered", &position, seq);
                assert!(
                    crate::ports::Store::get_kept(backend.store.as_ref(), &key)
                        .await
                        .unwrap()
                        .is_none(),
                    "{order:?}: {key} applied and no longer kept"
                );
            }
        }
        // The reminders come, after their delay, as duplicates.
        for _ in 0..20 {
            clock.advance(Duration::from_secs(1000));
            let copies = inbox
                .receive(10, Duration::ZERO, Duration::from_secs(30))
                .await
                .unwrap();
            if copies.is_empty() {
                break;
            }
            for copy in &copies {
                match consumer.consume(copy).await {
                    Ok(ConsumeOutcome::Duplicate) => duplicates += 1,
                    other => panic!("{order:?}: a reminder of a message applied: {other:?}"),
                }
                inbox.ack(std::slice::from_ref(&copy.receipt)).await.unwrap();
            }
        }
        assert!(queue.is_empty(), "{order:?}: nothing left waiting");
        explored.push((order, backend));
    }
    (explored, waited, duplicates)
}

/// Seq 1, 2, 3 of one entity, a second copy of seq 2, seq 1 of another.
fn five_deliveries() -> [Delivery; 5] {
    [
        placed("ORDER#a", 1),
        placed("ORDER#a", 2),
        placed("ORDER#a", 3),
        placed("ORDER#a", 2),
        placed("ORDER#b", 1),
    ]
}

/// Every order of five deliveries ([`five_deliveries`]), each delivered as the schedule
/// says; a waiting one goes back to the queue and comes again after its delay: each
/// entity's messages are applied once each, in seq order; nothing is left waiting; a
/// wait is never a failure.
#[tokio::test]
async fn every_delivery_order_applies_each_message_once_in_chain_order() {
    let (explored, waited, duplicates) = explore(&five_deliveries(), Arc::new(Recording)).await;
    for (order, backend) in &explored {
        assert_eq!(applied(backend, "ORDER#a").await, [1, 2, 3], "{order:?}");
        assert_eq!(applied(backend, "ORDER#b").await, [1], "{order:?}");
    }
    println!(
        "in order: {} delivery orders explored, {waited} waits, {duplicates} duplicates",
        explored.len()
    );
    assert_eq!(explored.len(), 120);
    assert!(waited > 0 && duplicates > 0, "both paths reached");
}

/// The same in entity mode ([`RecordingInEntity`]): the position lives in the handler's
/// entity, moved by the entity's own write or, where a message writes nothing, alone;
/// no position item of its own is ever written.
#[tokio::test]
async fn in_entity_mode_every_delivery_order_applies_each_message_once_in_chain_order() {
    let (explored, waited, duplicates) = explore(&five_deliveries(), Arc::new(RecordingInEntity)).await;
    for (order, backend) in &explored {
        assert_eq!(
            applied(backend, "ORDER#a").await,
            [1, 3],
            "{order:?}: seq 2 writes nothing"
        );
        assert!(applied(backend, "ORDER#b").await.is_empty(), "{order:?}");
        for (entity, seq) in [("ORDER#a", 3), ("ORDER#b", 1)] {
            let position = crate::protocol::Position::from_attributes(&placed(entity, seq).attributes)
                .unwrap()
                .unwrap();
            let key: ItemKey = format!("APPLIED#{entity}").parse().unwrap();
            let keys = crate::ports::Store::get_keys(backend.store.as_ref(), std::slice::from_ref(&key))
                .await
                .unwrap();
            let kept = keys[&key].applied[&crate::consumer::in_order::applied_name("ordered", &position)];
            assert_eq!(kept.seq, seq, "{order:?}: the position {entity}'s key keeps");
            let own = crate::consumer::in_order::position_key("ordered", &position);
            let items = crate::ports::Store::get_items(backend.store.as_ref(), std::slice::from_ref(&own))
                .await
                .unwrap();
            assert!(items.is_empty(), "{order:?}: no position item of its own");
        }
    }
    println!(
        "in order, entity mode: {} delivery orders explored, {waited} waits, {duplicates} duplicates",
        explored.len()
    );
    assert_eq!(explored.len(), 120);
    assert!(waited > 0 && duplicates > 0, "both paths reached");
}

/// Without a way back (no requeue, or a FIFO queue), a message ahead of its predecessor
/// is kept all the same, and applied by the delivery of its predecessor.
#[tokio::test]
async fn without_a_way_back_a_message_ahead_is_kept_and_applied_after_its_predecessor() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    match consumer.consume(&placed("ORDER#a", 3)).await {
        Ok(ConsumeOutcome::Kept { applied: 0, seq: 3 }) => {}
        other => panic!("{other:?}"),
    }
    match consumer.consume(&placed("ORDER#a", 2)).await {
        Ok(ConsumeOutcome::Kept { applied: 0, seq: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(applied(&backend, "ORDER#a").await.is_empty());
    assert!(matches!(
        consumer.consume(&placed("ORDER#a", 1)).await.unwrap(),
        ConsumeOutcome::Processed { .. }
    ));
    assert_eq!(
        applied(&backend, "ORDER#a").await,
        [1, 2, 3],
        "applied by seq 1's delivery"
    );
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 2)).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
}

/// Each message's log line names its entity, chain and seq beside its outcome: kept,
/// processed, a duplicate; and it is written before the message is handed on to be
/// acknowledged, so that a consumer killed mid-batch has logged whatever it acknowledged.
#[tokio::test]
async fn each_consumed_message_is_logged_with_its_entity_and_seq() {
    let logged = crate::test_log::Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_env_filter("info")
        .finish();
    crate::test_log::keep_callsites_interested();
    let _guard = tracing::subscriber::set_default(subscriber);
    let (_clock, _backend, consumer) = ordered_world(Arc::new(Recording));
    for seq in [2, 1, 2] {
        let report = consumer.consume_batch(&[placed("ORDER#a", seq)]).await;
        assert!(report.items[0].result.is_ok(), "{report:?}");
    }
    let lines: Vec<String> = logged
        .text()
        .lines()
        .filter(|line| line.contains("message consumed"))
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (line, (outcome, seq)) in lines.iter().zip([("kept", 2), ("processed", 1), ("duplicate", 2)]) {
        for field in [
            format!("outcome=\"{outcome}\""),
            "entity=\"ORDER#a\"".to_owned(),
            "chain=\"events\"".to_owned(),
            format!("seq={seq}"),
        ] {
            assert!(line.contains(&field), "{field} not in {line}");
        }
    }
    let count = || logged.text().matches("message consumed").count();
    let at_done = std::sync::Mutex::new(Vec::new());
    consumer
        .consume_batch_with(&[placed("ORDER#a", 3), placed("ORDER#a", 4)], |_, _| {
            at_done.lock().unwrap().push(count());
        })
        .await;
    assert_eq!(
        *at_done.lock().unwrap(),
        [4, 5],
        "lines written when each message was done"
    );
}

/// A message too large to keep ([`crate::consumer::in_order::MAX_KEPT_BYTES`]) waits on
/// its queue as before: sent back with a delay that grows, or, without a way back, failed,
/// to come back with the queue's visibility timeout. Nothing of it was applied.
#[tokio::test]
async fn a_message_too_large_to_keep_waits_on_its_queue() {
    let heavy = || {
        let mut delivery = placed("ORDER#a", 2);
        delivery.body = json!({ "seq": 2, "pad": "x".repeat(crate::consumer::in_order::MAX_KEPT_BYTES) }).to_string();
        delivery
    };
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    match consumer.consume(&heavy()).await {
        Err(ConsumeError::Waiting { applied: 0, seq: 2 }) => {}
        other => panic!("{other:?}"),
    }
    let (_clock, _backend, queue, _inbox, requeueing) = requeueing_world(Arc::new(Recording));
    match requeueing.consume(&heavy()).await {
        Ok(ConsumeOutcome::Waiting {
            applied: 0,
            seq: 2,
            delay,
        }) => assert_eq!(delay, Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(queue.len(), 1, "its copy went back");
    assert!(applied(&backend, "ORDER#a").await.is_empty());
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    consumer.consume(&heavy()).await.unwrap();
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2]);
}

/// A copy that comes after the message's dedup data expired (a redrive from a dead-letter
/// queue kept longer) is a duplicate all the same: the chain's position outlives it.
#[tokio::test]
async fn the_position_outlives_the_dedup_data() {
    let (clock, backend, consumer) = ordered_world(Arc::new(Recording));
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    clock.advance(Duration::from_secs(7200));
    assert!(
        consumer.read(consumer.txn_id("ORDER#a:1")).await.unwrap().is_none(),
        "the dedup record expired"
    );
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 1)).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
    assert_eq!(applied(&backend, "ORDER#a").await, [1]);
}

/// Emits one message for each it applies, writing nothing else: its commit's only
/// change is the library's own position item.
struct Forwarding;

#[async_trait]
impl Handler for Forwarding {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let seq = message.position()?.ok_or("no position")?.seq;
        staging.emit(crate::protocol::Message::json(
            "inbox".parse()?,
            &json!({ "forwarded": seq }),
        )?);
        Ok(())
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// An in-order handler that only emits: its messages are placed in no entity (the chain's
/// position item is the library's, not an entity of the application's), and its record
/// reads back, so that a copy of the message is a duplicate.
#[tokio::test]
async fn the_position_item_is_no_entity_to_place_messages_in() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Forwarding));
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    let queue = backend.publisher.queue(&"inbox".parse().unwrap()).unwrap();
    let sent = queue.receive(10);
    assert_eq!(sent.len(), 1);
    assert!(
        Position::from_attributes(&sent[0].attributes).unwrap().is_none(),
        "{:?}",
        sent[0].attributes
    );
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 1)).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
}

/// Message `seq` of `entity`'s chain on `events`, sent by a transaction that took the
/// entity to `version`, with an id of its own.
fn placed_at(entity: &str, seq: u64, version: u64) -> Delivery {
    let mut delivery = placed(entity, seq);
    delivery.attributes.insert(
        crate::protocol::POSITION_ATTRIBUTE.to_owned(),
        format!("chain=events;seq={seq};version={version};after={}", version - 1),
    );
    delivery
        .attributes
        .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{entity}:v{version}:{seq}"));
    delivery.message_id = format!("q-{entity}-v{version}-{seq}");
    delivery
}

/// A message at or below the chain's position from a later version of its entity than
/// the one applied last is no copy of an earlier message: its chain restarted (the
/// entity's heads lost, its table restored from an old backup). It fails, saying so,
/// rather than being acknowledged as a duplicate; a real copy is still a duplicate.
#[tokio::test]
async fn a_restarted_chain_fails_instead_of_passing_for_a_duplicate() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    consumer.consume(&placed_at("ORDER#a", 1, 2)).await.unwrap();
    consumer.consume(&placed_at("ORDER#a", 2, 3)).await.unwrap();
    // A copy of seq 1 whose dedup record is out of reach: its version is below.
    let mut copy = placed_at("ORDER#a", 1, 2);
    copy.attributes
        .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), "ORDER#a:another-id".to_owned());
    assert_eq!(consumer.consume(&copy).await.unwrap(), ConsumeOutcome::Duplicate);
    // The chain counted from 1 again, at later versions.
    match consumer.consume(&placed_at("ORDER#a", 1, 9)).await {
        Err(
            error @ ConsumeError::ChainRestarted {
                seq: 1,
                version: 9,
                applied: 2,
                applied_version: 3,
            },
        ) => {
            let said = error.to_string();
            assert!(said.contains("chain restarted"), "{said}");
            assert!(said.contains("not a duplicate"), "{said}");
        }
        other => panic!("{other:?}"),
    }
    // The next seq of the restarted chain does not follow the message applied last (its
    // `after` is not that one's version): restarted too, not applied after it.
    match consumer.consume(&placed_at("ORDER#a", 3, 10)).await {
        Err(ConsumeError::ChainRestarted {
            seq: 3,
            applied: 2,
            applied_version: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2], "nothing of it applied");
    // The chain's own next message still applies.
    consumer.consume(&placed_at("ORDER#a", 3, 4)).await.unwrap();
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3]);
}

/// A consumer that applied a chain in the transactional mode (its position an item of its
/// own) and now runs in entity mode continues the chain from that item: its next message
/// applies, an earlier one is a duplicate, and from then on the entity's key keeps the
/// position.
#[tokio::test]
async fn in_entity_mode_a_chain_continues_from_its_position_item() {
    let (clock, backend, consumer) = ordered_world(Arc::new(Recording));
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    consumer.consume(&placed("ORDER#a", 2)).await.unwrap();
    let in_entity = Consumer::new(
        "ordered".parse().unwrap(),
        backend.consumer_ports(clock.clone()),
        Arc::new(RecordingInEntity),
        Duration::from_secs(3600),
    );
    assert!(matches!(
        in_entity.consume(&placed("ORDER#a", 3)).await.unwrap(),
        ConsumeOutcome::Processed { .. }
    ));
    let mut copy = placed("ORDER#a", 1);
    copy.attributes
        .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), "ORDER#a:another-id".to_owned());
    assert_eq!(in_entity.consume(&copy).await.unwrap(), ConsumeOutcome::Duplicate);
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3]);
    let key: ItemKey = "APPLIED#ORDER#a".parse().unwrap();
    let keys = crate::ports::Store::get_keys(backend.store.as_ref(), std::slice::from_ref(&key))
        .await
        .unwrap();
    let position = Position::from_attributes(&placed("ORDER#a", 3).attributes)
        .unwrap()
        .unwrap();
    assert_eq!(
        keys[&key].applied[&crate::consumer::in_order::applied_name("ordered", &position)].seq,
        3
    );
}

/// A kept message's reminder adds one attribute: a message that carries 9 gets one (the
/// copy carries SQS's most, 10), and so does a copy of an earlier copy that carried the
/// wait in two attributes (they are replaced, its waits counted on); one that carries 10
/// gets none, and is kept all the same.
#[tokio::test]
async fn a_waiting_copy_keeps_within_ten_attributes() {
    use crate::consumer::in_order::{WAITING_SINCE_ATTRIBUTE, WAITS_ATTRIBUTE, WAIT_ATTRIBUTE};
    let (clock, backend, queue, inbox, consumer) = requeueing_world(Arc::new(Recording));
    let with_own = |seq: u64, own: usize| {
        let mut delivery = placed("ORDER#a", seq);
        for index in 0..own {
            delivery.attributes.insert(format!("own-{index}"), "x".to_owned());
        }
        delivery
    };
    // Three of the protocol's and six of its own.
    let nine = with_own(2, 6);
    assert_eq!(nine.attributes.len(), 9);
    assert!(matches!(
        consumer.consume(&nine).await.unwrap(),
        ConsumeOutcome::Kept { .. }
    ));
    clock.advance(Duration::from_secs(901));
    let copies = inbox
        .receive(10, Duration::ZERO, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].attributes.len(), 10, "{:?}", copies[0].attributes);
    assert_eq!(
        copies[0].attributes[WAIT_ATTRIBUTE], "1;1700000000000",
        "one wait, since the first"
    );
    inbox.ack(std::slice::from_ref(&copies[0].receipt)).await.unwrap();

    // A copy sent before the wait took one attribute.
    let mut earlier = with_own(3, 4);
    earlier.attributes.insert(WAITS_ATTRIBUTE.to_owned(), "2".to_owned());
    earlier
        .attributes
        .insert(WAITING_SINCE_ATTRIBUTE.to_owned(), "1600000000000".to_owned());
    assert_eq!(earlier.attributes.len(), 9);
    assert!(matches!(
        consumer.consume(&earlier).await.unwrap(),
        ConsumeOutcome::Kept { .. }
    ));
    clock.advance(Duration::from_secs(901));
    let copies = inbox
        .receive(10, Duration::ZERO, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].attributes[WAIT_ATTRIBUTE], "3;1600000000000");
    assert!(!copies[0].attributes.contains_key(WAITS_ATTRIBUTE));
    assert!(!copies[0].attributes.contains_key(WAITING_SINCE_ATTRIBUTE));
    assert_eq!(copies[0].attributes.len(), 8);
    inbox.ack(std::slice::from_ref(&copies[0].receipt)).await.unwrap();

    let ten = with_own(2, 7);
    assert_eq!(ten.attributes.len(), 10);
    match consumer.consume(&ten).await {
        Ok(ConsumeOutcome::Kept { applied: 0, seq: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(queue.is_empty(), "no reminder went back");
    assert!(applied(&backend, "ORDER#a").await.is_empty());
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    assert_eq!(
        applied(&backend, "ORDER#a").await,
        [1, 2, 3],
        "kept all the same, seq 3 too"
    );
}

/// A consumer that never sees one message of a chain (a filter policy dropped it) keeps
/// the later message for good, visibly: its reminder comes back every
/// [`crate::consumer::in_order::REMINDER_DELAY`], counting its waits from the first (the
/// wait-age alarm), and it is never applied nor failed (so never in the dead-letter queue).
#[tokio::test]
async fn a_message_behind_one_the_consumer_never_sees_waits_for_good_and_says_so() {
    let (clock, backend, _queue, inbox, consumer) = requeueing_world(Arc::new(Recording));
    let first_wait = crate::ports::Clock::now(clock.as_ref());
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    // Seq 2 was filtered away; seq 3 comes.
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 3)).await.unwrap(),
        ConsumeOutcome::Kept { applied: 1, seq: 3 }
    );
    for round in 1..=12 {
        clock.advance(Duration::from_secs(899));
        let early = inbox
            .receive(10, Duration::ZERO, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(early.is_empty(), "a reminder comes after 900 s, not before");
        clock.advance(Duration::from_secs(2));
        let copies = inbox
            .receive(10, Duration::ZERO, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(copies.len(), 1, "the reminder comes back");
        let (waits, since) = crate::consumer::in_order::waited(&copies[0], crate::ports::Clock::now(clock.as_ref()));
        assert_eq!(
            (waits, since),
            (round, first_wait),
            "it counts its waits from the first"
        );
        assert_eq!(
            consumer.consume(&copies[0]).await.unwrap(),
            ConsumeOutcome::Kept { applied: 1, seq: 3 }
        );
        inbox.ack(std::slice::from_ref(&copies[0].receipt)).await.unwrap();
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1], "never applied past the gap");
}

/// A kept message outlives the consumer's retention while it waits: each reminder keeps
/// it anew, its expiry from then. So when its predecessor comes, later than the retention
/// after the first keep, the predecessor's delivery applies it right away (not a reminder
/// up to [`crate::consumer::in_order::REMINDER_DELAY`] later), and the reminder still on
/// its way comes as a duplicate.
#[tokio::test]
async fn a_kept_message_outlives_the_retention_while_its_reminders_come() {
    let (clock, backend, _queue, inbox, consumer) = requeueing_world(Arc::new(Recording));
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 3)).await.unwrap(),
        ConsumeOutcome::Kept { applied: 1, seq: 3 }
    );
    let retention = consumer.retention();
    let kept_since = crate::ports::Clock::now(clock.as_ref());
    // Its reminders, as a poller takes them, until the retention has passed since it was
    // first kept, and one more round.
    let mut reminders = 0;
    while crate::ports::Clock::now(clock.as_ref()).since(kept_since) <= retention + Duration::from_secs(901) {
        clock.advance(Duration::from_secs(901));
        for copy in inbox
            .receive(10, Duration::ZERO, Duration::from_secs(30))
            .await
            .unwrap()
        {
            reminders += 1;
            assert_eq!(
                consumer.consume(&copy).await.unwrap(),
                ConsumeOutcome::Kept { applied: 1, seq: 3 }
            );
            inbox.ack(std::slice::from_ref(&copy.receipt)).await.unwrap();
        }
    }
    let position = Position::from_attributes(&placed("ORDER#a", 3).attributes)
        .unwrap()
        .unwrap();
    let key = crate::consumer::in_order::kept_key("ordered", &position, 3);
    let kept = crate::ports::Store::get_kept(backend.store.as_ref(), &key)
        .await
        .unwrap();
    assert!(
        kept.is_some(),
        "seq 3 is kept still, {:?} after it was first kept (the retention is {retention:?}), after {reminders} reminders",
        crate::ports::Clock::now(clock.as_ref()).since(kept_since)
    );
    assert!(matches!(
        consumer.consume(&placed("ORDER#a", 2)).await.unwrap(),
        ConsumeOutcome::Processed { .. }
    ));
    assert_eq!(
        applied(&backend, "ORDER#a").await,
        [1, 2, 3],
        "the predecessor's delivery applies the kept message"
    );
    clock.advance(Duration::from_secs(901));
    let copies = inbox
        .receive(10, Duration::ZERO, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(copies.len(), 1, "the last reminder");
    assert_eq!(consumer.consume(&copies[0]).await.unwrap(), ConsumeOutcome::Duplicate);
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3]);
}

/// [`Recording`], but the handler fails `seq` 2 while `failing` is set: a poison message
/// that reaches the dead-letter queue until it is fixed.
struct FailingSecond {
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Handler for FailingSecond {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let seq = message.position()?.ok_or("no position")?.seq;
        if seq == 2 && self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("seq 2 cannot be applied yet".into());
        }
        Recording.handle(message, staging).await
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// A predecessor that failed to the dead-letter queue holds its successor kept, never in
/// the dead-letter queue itself; once the handler is fixed, a redrive of the dead-letter
/// queue releases both: the predecessor applied, and the successor right after it, by the
/// same delivery, each once, in chain order.
#[tokio::test]
async fn a_redrive_of_the_predecessor_releases_the_message_waiting_for_it() {
    const MAX_RECEIVES: u32 = 3;
    let handler = Arc::new(FailingSecond { failing: true.into() });
    let (clock, backend, consumer) = ordered_world(handler.clone());
    let dead_letters = Arc::new(EmbeddedQueue::new(
        crate::embedded::QueueConfig::standard("inbox-dlq"),
        clock.clone(),
    ));
    let queue = Arc::new(
        EmbeddedQueue::new(crate::embedded::QueueConfig::standard("inbox"), clock.clone())
            .with_dead_letter_queue(dead_letters.clone(), MAX_RECEIVES),
    );
    let inbox = EmbeddedInbox::new(queue.clone(), clock.clone());
    let consumer = consumer.with_requeue(Arc::new(inbox.clone()));
    for seq in 1..=3 {
        let delivery = placed("ORDER#a", seq);
        queue
            .send(crate::embedded::SendRequest {
                body: delivery.body,
                attributes: delivery.attributes,
                delay: Duration::ZERO,
                group_id: None,
                deduplication_id: None,
            })
            .unwrap();
    }
    // Deliveries as a poller makes them: acknowledged when consumed, left to come back
    // with the visibility timeout when failed. Returns each outcome's name, in order.
    let round = || async {
        let mut outcomes = Vec::new();
        for delivery in inbox
            .receive(10, Duration::ZERO, Duration::from_secs(30))
            .await
            .unwrap()
        {
            let seq = delivery.body.clone();
            match consumer.consume(&delivery).await {
                Ok(outcome) => {
                    outcomes.push(format!("{seq} {}", outcome.as_str()));
                    inbox.ack(std::slice::from_ref(&delivery.receipt)).await.unwrap();
                }
                Err(_) => outcomes.push(format!("{seq} failed")),
            }
        }
        outcomes
    };
    let mut log = Vec::new();
    // Seq 2 fails on each of its receives and moves to the dead-letter queue; seq 3 is
    // kept behind it, its reminder in the source queue.
    for _ in 0..8 {
        log.extend(round().await);
        clock.advance(Duration::from_secs(31));
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1], "{log:?}");
    assert_eq!(
        dead_letters.len(),
        1,
        "only the failed predecessor is dead-lettered: {log:?}"
    );
    assert!(log.iter().any(|line| line.ends_with("kept")), "{log:?}");
    assert_eq!(
        queue.len(),
        1,
        "the kept message's reminder is in the source queue: {log:?}"
    );

    // The handler fixed, the dead-letter queue redriven: seq 2 applies, and seq 3 with it.
    handler.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dead_letters.move_all_to(&queue), 1);
    log.extend(round().await);
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3], "{log:?}");
    for _ in 0..12 {
        log.extend(round().await);
        clock.advance(Duration::from_secs(901));
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3], "{log:?}");
    assert!(queue.is_empty() && dead_letters.is_empty(), "{log:?}");
}

/// The embedded store, running a hook (once) right before it keeps a message: what
/// another invocation does between the keeper's read of the position and its keep.
struct KeepHook {
    inner: Arc<crate::embedded::EmbeddedStore>,
    hook: std::sync::Mutex<Option<futures_util::future::BoxFuture<'static, ()>>>,
}

#[async_trait]
impl crate::ports::Store for KeepHook {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &crate::ports::CommitRequest) -> Result<(), crate::ports::CommitError> {
        self.inner.commit(request).await
    }
    async fn get_items(
        &self,
        keys: &[ItemKey],
    ) -> Result<BTreeMap<ItemKey, crate::ports::VersionedItem>, crate::ports::StoreError> {
        self.inner.get_items(keys).await
    }
    async fn get_keys(
        &self,
        keys: &[ItemKey],
    ) -> Result<BTreeMap<ItemKey, crate::ports::KeyRead>, crate::ports::StoreError> {
        self.inner.get_keys(keys).await
    }
    async fn get_outboxes(
        &self,
        txn_ids: &[crate::protocol::TxnId],
    ) -> Result<BTreeMap<crate::protocol::TxnId, crate::protocol::OutboxRecord>, crate::ports::StoreError> {
        self.inner.get_outboxes(txn_ids).await
    }
    async fn get_idempotency(
        &self,
        slot: &crate::protocol::IdempotencySlot,
    ) -> Result<Option<crate::protocol::IdempotencyRecord>, crate::ports::StoreError> {
        self.inner.get_idempotency(slot).await
    }
    async fn put_tombstone(
        &self,
        txn_id: crate::protocol::TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<crate::ports::TombstoneOutcome, crate::ports::StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }
    async fn mark_dispatched(
        &self,
        records: &[crate::protocol::OutboxRecord],
        expires_at: Timestamp,
    ) -> Vec<Result<(), crate::ports::StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }
    async fn keep_message(&self, kept: &crate::ports::KeptMessage) -> Result<(), crate::ports::StoreError> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook.await;
        }
        self.inner.keep_message(kept).await
    }
    async fn get_kept(&self, key: &str) -> Result<Option<crate::ports::KeptMessage>, crate::ports::StoreError> {
        self.inner.get_kept(key).await
    }
    async fn remove_kept(&self, key: &str) -> Result<(), crate::ports::StoreError> {
        self.inner.remove_kept(key).await
    }
}

/// Two invocations at once: one keeps seq 2 while the other applies seq 1 and looks for
/// seq 2 before it is kept, finding none. The keeper reads the position again after its
/// keep, finds seq 1 applied, and applies seq 2 itself: nothing is stranded.
#[tokio::test]
async fn a_message_kept_while_its_predecessor_is_applied_is_not_stranded() {
    let (clock, backend, applier) = ordered_world(Arc::new(Recording));
    let applier = Arc::new(applier);
    let store = Arc::new(KeepHook {
        inner: backend.store.clone(),
        hook: std::sync::Mutex::new(None),
    });
    let hooked = {
        let applier = applier.clone();
        Box::pin(async move {
            assert!(matches!(
                applier.consume(&placed("ORDER#a", 1)).await.unwrap(),
                ConsumeOutcome::Processed { .. }
            ));
        })
    };
    *store.hook.lock().unwrap() = Some(hooked);
    let mut ports = backend.consumer_ports(clock.clone());
    ports.store = store;
    let keeper = Consumer::new(
        "ordered".parse().unwrap(),
        ports,
        Arc::new(Recording),
        Duration::from_secs(3600),
    );
    let outcome = keeper.consume(&placed("ORDER#a", 2)).await.unwrap();
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2], "{outcome:?}");
    assert!(matches!(outcome, ConsumeOutcome::Processed { .. }), "{outcome:?}");
    let position = Position::from_attributes(&placed("ORDER#a", 2).attributes)
        .unwrap()
        .unwrap();
    let key = crate::consumer::in_order::kept_key("ordered", &position, 2);
    assert!(
        crate::ports::Store::get_kept(backend.store.as_ref(), &key)
            .await
            .unwrap()
            .is_none(),
        "applied, and no longer kept"
    );
}

/// Copies of a kept message are kept in one place and applied once.
#[tokio::test]
async fn copies_of_a_kept_message_are_applied_once() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    for _ in 0..3 {
        assert_eq!(
            consumer.consume(&placed("ORDER#a", 2)).await.unwrap(),
            ConsumeOutcome::Kept { applied: 0, seq: 2 }
        );
    }
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 2)).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2]);
}

/// A kept message whose handler fails once its predecessor is applied is handed back to
/// its queue as a message of its own (in a second), to be tried and to fail as any message
/// does; the predecessor's delivery succeeds. Fixed, the copy applies it, and its kept
/// message goes.
#[tokio::test]
async fn a_kept_message_that_fails_after_its_predecessor_is_handed_back_to_its_queue() {
    let handler = Arc::new(FailingSecond { failing: true.into() });
    let (clock, backend, queue, inbox, consumer) = requeueing_world(handler.clone());
    assert!(matches!(
        consumer.consume(&placed("ORDER#a", 2)).await.unwrap(),
        ConsumeOutcome::Kept { .. }
    ));
    assert_eq!(queue.len(), 1, "its reminder");
    assert!(matches!(
        consumer.consume(&placed("ORDER#a", 1)).await.unwrap(),
        ConsumeOutcome::Processed { .. }
    ));
    assert_eq!(applied(&backend, "ORDER#a").await, [1]);
    assert_eq!(queue.len(), 2, "handed back beside its reminder");
    clock.advance(Duration::from_secs(1));
    let copies = inbox
        .receive(10, Duration::ZERO, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(copies.len(), 1, "the copy handed back comes in a second");
    assert!(
        matches!(consumer.consume(&copies[0]).await, Err(ConsumeError::Handler(_))),
        "it fails as any message does, toward the dead-letter queue"
    );
    handler.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        consumer.consume(&copies[0]).await.unwrap(),
        ConsumeOutcome::Processed { .. }
    ));
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2]);
    let position = Position::from_attributes(&placed("ORDER#a", 2).attributes)
        .unwrap()
        .unwrap();
    let key = crate::consumer::in_order::kept_key("ordered", &position, 2);
    assert!(crate::ports::Store::get_kept(backend.store.as_ref(), &key)
        .await
        .unwrap()
        .is_none());
}

/// Where a failing kept message cannot be handed back (no way back, or a FIFO source), the
/// predecessor's delivery fails in its stead, saying so: it comes back, a duplicate, and
/// tries the kept message again; nothing is lost.
#[tokio::test]
async fn without_a_way_back_a_failing_kept_message_fails_its_predecessors_delivery() {
    let handler = Arc::new(FailingSecond { failing: true.into() });
    let (_clock, backend, consumer) = ordered_world(handler.clone());
    consumer.consume(&placed("ORDER#a", 2)).await.unwrap();
    match consumer.consume(&placed("ORDER#a", 1)).await {
        Err(error @ ConsumeError::KeptNotApplied { seq: 2, .. }) => {
            assert!(error.to_string().contains("seq 2"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1]);
    handler.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        consumer.consume(&placed("ORDER#a", 1)).await.unwrap(),
        ConsumeOutcome::Duplicate
    );
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2]);
}

/// On a FIFO source, a message ahead of its predecessor in its group (a consumer upstream
/// published them out of order, or a redrive brought the predecessor back later) is kept,
/// not failed: it does not take its group toward the dead-letter queue, and it is applied
/// by its predecessor's delivery, in the same batch.
#[tokio::test]
async fn on_a_fifo_source_a_message_ahead_of_its_predecessor_is_kept_not_failed() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    let grouped = |seq: u64| {
        let mut delivery = placed("ORDER#a", seq);
        delivery.group_id = Some("ORDER#a".into());
        delivery
    };
    let report = consumer.consume_batch(&[grouped(3), grouped(2), grouped(1)]).await;
    assert!(report.failed_message_ids().is_empty(), "{report:?}");
    let outcomes: Vec<&str> = report
        .items
        .iter()
        .map(|item| item.result.as_ref().unwrap().as_str())
        .collect();
    assert_eq!(outcomes, ["kept", "kept", "processed"]);
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3]);
}

/// Message `seq` of `entity`'s chain on `events`, as `producer` stamped it (`None`: a
/// producer that names none, as before producers were named), with an id of its own.
fn placed_by(producer: Option<&str>, entity: &str, seq: u64) -> Delivery {
    let mut delivery = placed(entity, seq);
    let mut position = Position::from_attributes(&delivery.attributes).unwrap().unwrap();
    position.producer = producer.map(|name| name.parse().unwrap());
    for (name, value) in position.attributes() {
        delivery.attributes.insert(name.to_owned(), value);
    }
    let tag = producer.unwrap_or("-");
    delivery
        .attributes
        .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{tag}:{entity}:{seq}"));
    delivery.message_id = format!("q-{tag}-{entity}-{seq}");
    delivery
}

/// Appends each message's `seq` to `APPLIED#{entity}`, under its producer's name (`-`:
/// none): the order the consumer applied each chain in. In entity mode that item is the
/// handler's entity, and keeps the positions too.
struct ByProducer {
    entity_mode: bool,
}

#[async_trait]
impl Handler for ByProducer {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        let key: ItemKey = format!("APPLIED#{}", position.entity).parse()?;
        let read = staging.get(&key).await?;
        let mut data = read.as_ref().map_or_else(|| json!({}), |item| item.data.clone());
        let producer = position.producer.as_ref().map_or("-", |producer| producer.as_str());
        data.as_object_mut()
            .ok_or("an object")?
            .entry(producer)
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("a list")?
            .push(json!(position.seq));
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, data, expected);
        Ok(())
    }

    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        Ok(self
            .entity_mode
            .then(|| format!("APPLIED#{}", position.entity).parse())
            .transpose()?)
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// What [`ByProducer`] applied of `entity`, by producer.
async fn applied_by(backend: &EmbeddedBackend, entity: &str) -> Value {
    let key: ItemKey = format!("APPLIED#{entity}").parse().unwrap();
    let items = crate::ports::Store::get_items(backend.store.as_ref(), std::slice::from_ref(&key))
        .await
        .unwrap();
    items.get(&key).map_or_else(|| json!({}), |item| item.data.clone())
}

/// Two services (two tables) that publish to one destination about entities whose keys
/// look alike keep two chains at an in-order consumer: each one's seq 1 applies, and each
/// chain waits for its own predecessors only, in both modes.
#[tokio::test]
async fn two_producers_on_one_destination_keep_two_chains() {
    for entity_mode in [false, true] {
        let (_clock, backend, consumer) = ordered_world(Arc::new(ByProducer { entity_mode }));
        let consume = |delivery: Delivery| {
            let consumer = &consumer;
            async move { consumer.consume(&delivery).await.unwrap() }
        };
        assert!(matches!(
            consume(placed_by(Some("orders"), "CUSTOMER#42", 1)).await,
            ConsumeOutcome::Processed { .. }
        ));
        assert!(
            matches!(
                consume(placed_by(Some("billing"), "CUSTOMER#42", 1)).await,
                ConsumeOutcome::Processed { .. }
            ),
            "entity mode: {entity_mode}: the second producer's seq 1 is no duplicate of the first's"
        );
        assert_eq!(
            consume(placed_by(Some("billing"), "CUSTOMER#42", 3)).await,
            ConsumeOutcome::Kept { applied: 1, seq: 3 }
        );
        assert!(matches!(
            consume(placed_by(Some("orders"), "CUSTOMER#42", 2)).await,
            ConsumeOutcome::Processed { .. }
        ));
        assert!(matches!(
            consume(placed_by(Some("billing"), "CUSTOMER#42", 2)).await,
            ConsumeOutcome::Processed { .. }
        ));
        assert_eq!(
            applied_by(&backend, "CUSTOMER#42").await,
            json!({"orders": [1, 2], "billing": [1, 2, 3]}),
            "entity mode: {entity_mode}"
        );
    }
}

/// A chain of a producer that names itself is no continuation of another producer's
/// chain kept unnamed under the same destination and entity (by a producer that names
/// none): its seq 2 before its seq 1 waits, though the unnamed chain is at 3 (a duplicate
/// there), and its seq 4 does not follow the unnamed chain's 3 (a restart there).
#[tokio::test]
async fn a_named_chain_is_not_taken_for_another_producers_unnamed_chain() {
    for entity_mode in [false, true] {
        let (_clock, backend, consumer) = ordered_world(Arc::new(ByProducer { entity_mode }));
        for seq in 1..=3 {
            consumer.consume(&placed_by(None, "CUSTOMER#42", seq)).await.unwrap();
        }
        assert_eq!(
            consumer
                .consume(&placed_by(Some("billing"), "CUSTOMER#42", 2))
                .await
                .unwrap(),
            ConsumeOutcome::Kept { applied: 0, seq: 2 },
            "entity mode: {entity_mode}"
        );
        let mut elsewhere = placed_by(Some("billing"), "CUSTOMER#42", 4);
        elsewhere.attributes.insert(
            crate::protocol::POSITION_ATTRIBUTE.to_owned(),
            "producer=billing;chain=events;seq=4;version=12;after=11".to_owned(),
        );
        assert_eq!(
            consumer.consume(&elsewhere).await.unwrap(),
            ConsumeOutcome::Kept { applied: 0, seq: 4 },
            "entity mode: {entity_mode}"
        );
        assert!(matches!(
            consumer
                .consume(&placed_by(Some("billing"), "CUSTOMER#42", 1))
                .await
                .unwrap(),
            ConsumeOutcome::Processed { .. }
        ));
        assert_eq!(
            applied_by(&backend, "CUSTOMER#42").await,
            json!({"-": [1, 2, 3], "billing": [1, 2]}),
            "entity mode: {entity_mode}"
        );
    }
}

/// A producer that starts naming itself continues its chains: the consumer kept them
/// unnamed, with the keys it always had, and a named message whose chain has no position
/// of its own continues from the unnamed one. The next seq applies (and from then on the
/// named position is kept), a copy of an unnamed message applied is still a duplicate, and
/// a named message ahead of its predecessor is kept and applied after it.
#[tokio::test]
async fn a_producer_that_names_itself_continues_its_chains() {
    for entity_mode in [false, true] {
        let (clock, backend, consumer) = ordered_world(Arc::new(ByProducer { entity_mode }));
        for seq in 1..=2 {
            consumer.consume(&placed_by(None, "CUSTOMER#42", seq)).await.unwrap();
        }
        let unnamed = Position::from_attributes(&placed_by(None, "CUSTOMER#42", 2).attributes)
            .unwrap()
            .unwrap();
        let named = Position::from_attributes(&placed_by(Some("orders"), "CUSTOMER#42", 2).attributes)
            .unwrap()
            .unwrap();
        // The keys of an unnamed chain are as they always were.
        assert_eq!(
            crate::consumer::in_order::position_key("ordered", &unnamed).as_str(),
            "IN#AT#ordered#events#CUSTOMER#42"
        );
        assert_eq!(
            crate::consumer::in_order::applied_name("ordered", &unnamed),
            "ordered#events#CUSTOMER#42"
        );
        assert_eq!(
            crate::consumer::in_order::kept_key("ordered", &unnamed, 3),
            "IN#KEPT#ordered#events#CUSTOMER#42#3"
        );
        assert_eq!(
            crate::consumer::in_order::position_key("ordered", &named).as_str(),
            "IN#AT#ordered#events@orders#CUSTOMER#42"
        );
        let entity: ItemKey = "APPLIED#CUSTOMER#42".parse().unwrap();
        let entity = entity_mode.then_some(&entity);
        assert_eq!(consumer.applied_now(&unnamed, entity).await.unwrap(), 2);
        // A copy of unnamed seq 2 whose dedup record expired: the unnamed position says
        // it is a duplicate.
        clock.advance(Duration::from_secs(7200));
        let mut copy = placed_by(None, "CUSTOMER#42", 2);
        copy.attributes
            .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), "CUSTOMER#42:another-id".to_owned());
        assert_eq!(consumer.consume(&copy).await.unwrap(), ConsumeOutcome::Duplicate);
        // Named seq 4 before named seq 3: kept; seq 3 applies, then 4.
        assert_eq!(
            consumer
                .consume(&placed_by(Some("orders"), "CUSTOMER#42", 4))
                .await
                .unwrap(),
            ConsumeOutcome::Kept { applied: 2, seq: 4 },
            "entity mode: {entity_mode}"
        );
        assert!(matches!(
            consumer
                .consume(&placed_by(Some("orders"), "CUSTOMER#42", 3))
                .await
                .unwrap(),
            ConsumeOutcome::Processed { .. }
        ));
        assert_eq!(
            applied_by(&backend, "CUSTOMER#42").await,
            json!({"-": [1, 2], "orders": [3, 4]}),
            "entity mode: {entity_mode}"
        );
        assert_eq!(consumer.applied_now(&named, entity).await.unwrap(), 4);
        assert_eq!(
            consumer.applied_now(&unnamed, entity).await.unwrap(),
            2,
            "left as it was"
        );
        // A copy of named seq 3 whose dedup record expired: the named position says it
        // is a duplicate.
        clock.advance(Duration::from_secs(7200));
        let mut copy = placed_by(Some("orders"), "CUSTOMER#42", 3);
        copy.attributes
            .insert(MESSAGE_ID_ATTRIBUTE.to_owned(), "CUSTOMER#42:yet-another-id".to_owned());
        assert_eq!(consumer.consume(&copy).await.unwrap(), ConsumeOutcome::Duplicate);
    }
}

/// Every order of an upgrade in mid-chain: unnamed seq 1 and 2 (and a copy of 2), then
/// named seq 3 and 4 of the same producer, delivered in any order, each waiting copy
/// coming again after its delay. Each message is applied once, in seq order, whoever
/// applies whom (an unnamed predecessor's drain finds a named successor kept under the
/// unnamed key, a named one under its own), and nothing is left waiting, in both modes.
#[tokio::test]
async fn every_order_of_an_upgrade_in_mid_chain_applies_each_message_once_in_order() {
    let deliveries = [
        placed_by(None, "CUSTOMER#42", 1),
        placed_by(None, "CUSTOMER#42", 2),
        placed_by(Some("orders"), "CUSTOMER#42", 3),
        placed_by(Some("orders"), "CUSTOMER#42", 4),
        placed_by(None, "CUSTOMER#42", 2),
    ];
    for entity_mode in [false, true] {
        let mut waited = 0;
        for schedule in permutations(&deliveries) {
            let (clock, backend, queue, inbox, consumer) = requeueing_world(Arc::new(ByProducer { entity_mode }));
            let order: Vec<String> = schedule.iter().map(|d| d.message_id.clone()).collect();
            for delivery in &schedule {
                match consumer.consume(delivery).await {
                    Ok(ConsumeOutcome::Kept { .. }) => waited += 1,
                    Ok(_) => {}
                    Err(error) => panic!("{order:?}: {error}"),
                }
            }
            assert_eq!(
                applied_by(&backend, "CUSTOMER#42").await,
                json!({"-": [1, 2], "orders": [3, 4]}),
                "{order:?}, entity mode: {entity_mode}: applied with no wait"
            );
            // Every message kept is gone once applied, under both keys a named one may
            // have been kept under, before any reminder comes.
            for delivery in &deliveries {
                let position = Position::from_attributes(&delivery.attributes).unwrap().unwrap();
                for key in crate::consumer::in_order::kept_keys(consumer.name().as_str(), &position, true) {
                    assert_eq!(
                        crate::ports::Store::get_kept(backend.store.as_ref(), &key)
                            .await
                            .unwrap()
                            .map(|kept| kept.key),
                        None,
                        "{order:?}, entity mode: {entity_mode}: a kept message left behind"
                    );
                }
            }
            for _ in 0..20 {
                clock.advance(Duration::from_secs(1000));
                let copies = inbox
                    .receive(10, Duration::ZERO, Duration::from_secs(30))
                    .await
                    .unwrap();
                if copies.is_empty() {
                    break;
                }
                for copy in &copies {
                    match consumer.consume(copy).await {
                        Ok(ConsumeOutcome::Duplicate) => {}
                        other => panic!("{order:?}: a reminder of a message applied: {other:?}"),
                    }
                    inbox.ack(std::slice::from_ref(&copy.receipt)).await.unwrap();
                }
            }
            assert!(queue.is_empty(), "{order:?}: nothing left waiting");
        }
        assert!(waited > 0, "entity mode: {entity_mode}: waits reached");
    }
}

/// What the consumer did with a chain, as `consumer::state` reads it for whoever operates
/// it, in both modes: nothing at first; then the seq applied last with the transaction
/// that applied it, and a message kept waiting for its predecessor with how long it has
/// waited; once the predecessor came, the last seq and nothing kept.
#[tokio::test]
async fn the_chain_state_shows_the_seq_applied_its_transaction_and_what_waits() {
    use crate::consumer::state::{chain_state, ChainQuery};
    let modes: [(Arc<dyn Handler>, Option<&str>); 2] = [
        (Arc::new(Recording), None),
        (Arc::new(RecordingInEntity), Some("APPLIED#ORDER#a")),
    ];
    for (handler, item) in modes {
        let mode = item.map_or("transactional", |_| "entity");
        let (clock, backend, consumer) = ordered_world(handler);
        let mut query = ChainQuery::new(
            "ordered".parse().unwrap(),
            "events".parse().unwrap(),
            "ORDER#a".parse().unwrap(),
        );
        if let Some(item) = item {
            query = query.applied_in(item.parse().unwrap());
        }
        let state = || chain_state(backend.store.as_ref(), clock.as_ref(), &query);
        let before = state().await.unwrap();
        assert_eq!((before.applied, before.kept.len()), (None, 0), "{mode}");

        consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
        let kept = consumer.consume(&placed("ORDER#a", 3)).await.unwrap();
        assert!(matches!(kept, ConsumeOutcome::Kept { .. }), "{mode}: {kept:?}");
        clock.advance(Duration::from_secs(90));
        let waiting = state().await.unwrap();
        let applied = waiting.applied.clone().expect("seq 1 applied");
        assert_eq!(applied.seq, 1, "{mode}");
        assert_eq!(
            applied.transaction_id,
            Some(consumer.txn_id("ORDER#a:1").to_string()),
            "{mode}: the transaction that applied it"
        );
        assert_eq!(
            applied.kept_in,
            item.unwrap_or("IN#AT#ordered#events#ORDER#a"),
            "{mode}"
        );
        let kept: Vec<_> = waiting
            .kept
            .iter()
            .map(|kept| (kept.seq, kept.queue_message_id.as_str(), kept.waiting_s))
            .collect();
        assert_eq!(kept, [(3, "q-ORDER#a-3", 90)], "{mode}: seq 3 waits for seq 2");
        assert_eq!((waiting.chain.as_str(), waiting.entity.as_str()), ("events", "ORDER#a"));

        consumer.consume(&placed("ORDER#a", 2)).await.unwrap();
        let after = state().await.unwrap();
        let applied = after.applied.expect("seq 3 applied");
        assert_eq!(applied.seq, 3, "{mode}");
        assert_eq!(
            applied.transaction_id,
            Some(consumer.txn_id("ORDER#a:3").to_string()),
            "{mode}"
        );
        assert!(after.kept.is_empty(), "{mode}: nothing waits: {:?}", after.kept);
        assert_eq!(after.looked_through, 3 + crate::consumer::state::KEPT_LOOKAHEAD);
    }
}

/// A chain its producer names, with no position of its own yet, stands where the unnamed
/// chain does (what the consumer applied before the producer named itself), as the
/// consumer continues it: the state reads it there, not as nothing applied.
#[tokio::test]
async fn the_chain_state_of_a_newly_named_chain_is_where_the_unnamed_one_stands() {
    use crate::consumer::state::{chain_state, ChainQuery};
    let (clock, backend, consumer) = ordered_world(Arc::new(Recording));
    for seq in [1, 2] {
        consumer.consume(&placed("ORDER#a", seq)).await.unwrap();
    }
    let query = ChainQuery::new(
        "ordered".parse().unwrap(),
        "events".parse().unwrap(),
        "ORDER#a".parse().unwrap(),
    )
    .producer("orders".parse().unwrap());
    let state = chain_state(backend.store.as_ref(), clock.as_ref(), &query)
        .await
        .unwrap();
    assert_eq!(state.chain, "events@orders");
    let applied = state.applied.expect("the unnamed chain's place");
    assert_eq!(
        (applied.seq, applied.kept_in.as_str()),
        (2, "IN#AT#ordered#events#ORDER#a")
    );
    assert_eq!(state.looked_through, 2 + crate::consumer::state::KEPT_LOOKAHEAD);
}
