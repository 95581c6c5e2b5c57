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
                Ok(ConsumeOutcome::Waiting { .. }) => waited += 1,
                Ok(ConsumeOutcome::Duplicate) => duplicates += 1,
                Ok(_) => {}
                Err(error) => panic!("{order:?}: {error}"),
            }
        }
        // What waits comes again, after its delay, until nothing is left.
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
                    Ok(ConsumeOutcome::Waiting { .. }) => waited += 1,
                    Ok(ConsumeOutcome::Duplicate) => duplicates += 1,
                    Ok(_) => {}
                    Err(error) => panic!("{order:?}: {error}"),
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

/// Without a way back (no requeue, or a FIFO queue), a waiting message fails: the queue
/// brings it back, and nothing of it was applied.
#[tokio::test]
async fn without_a_way_back_a_waiting_message_fails() {
    let (_clock, backend, consumer) = ordered_world(Arc::new(Recording));
    match consumer.consume(&placed("ORDER#a", 2)).await {
        Err(ConsumeError::Waiting { applied: 0, seq: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(applied(&backend, "ORDER#a").await.is_empty());
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    consumer.consume(&placed("ORDER#a", 2)).await.unwrap();
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

/// A waiting message's copy adds one attribute: a message that carries 9 goes back (the
/// copy carries SQS's most, 10), and so does a copy of an earlier copy that carried the
/// wait in two attributes (they are replaced, its waits counted on); one that carries 10
/// cannot, and fails, to come back with the queue's visibility timeout.
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
        ConsumeOutcome::Waiting { .. }
    ));
    clock.advance(Duration::from_secs(10));
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
        ConsumeOutcome::Waiting { .. }
    ));
    clock.advance(Duration::from_secs(10));
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
        Err(ConsumeError::Waiting { applied: 0, seq: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(queue.is_empty(), "no copy went back");
    assert!(applied(&backend, "ORDER#a").await.is_empty());
}

/// A consumer that never sees one message of a chain (a filter policy dropped it) waits
/// for it for good, visibly: the later message comes back again and again, its delay
/// growing to the longest, its copy counting its waits from the first, and it is never
/// applied nor failed (so never in the dead-letter queue): what the wait-age alarm shows.
#[tokio::test]
async fn a_message_behind_one_the_consumer_never_sees_waits_for_good_and_says_so() {
    let (clock, backend, _queue, inbox, consumer) = requeueing_world(Arc::new(Recording));
    let first_wait = crate::ports::Clock::now(clock.as_ref());
    consumer.consume(&placed("ORDER#a", 1)).await.unwrap();
    // Seq 2 was filtered away; seq 3 comes.
    let mut delays = Vec::new();
    match consumer.consume(&placed("ORDER#a", 3)).await.unwrap() {
        ConsumeOutcome::Waiting {
            applied: 1,
            seq: 3,
            delay,
        } => delays.push(delay.as_secs()),
        other => panic!("{other:?}"),
    }
    for _ in 0..12 {
        clock.advance(Duration::from_secs(901));
        let copies = inbox
            .receive(10, Duration::ZERO, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(copies.len(), 1, "the waiting message comes back");
        let (waits, since) = crate::consumer::in_order::waited(&copies[0], crate::ports::Clock::now(clock.as_ref()));
        assert_eq!(
            (waits as usize, since),
            (delays.len(), first_wait),
            "it counts its waits from the first"
        );
        match consumer.consume(&copies[0]).await.unwrap() {
            ConsumeOutcome::Waiting {
                applied: 1,
                seq: 3,
                delay,
            } => delays.push(delay.as_secs()),
            other => panic!("{other:?}"),
        }
        inbox.ack(std::slice::from_ref(&copies[0].receipt)).await.unwrap();
    }
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900, 900]);
    assert_eq!(applied(&backend, "ORDER#a").await, [1], "never applied past the gap");
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

/// A predecessor that failed to the dead-letter queue holds its successor waiting, never
/// in the dead-letter queue itself; once the handler is fixed, a redrive of the
/// dead-letter queue releases both: the predecessor applied, then the successor at its
/// next wait, each once, in chain order.
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
    // Seq 2 fails on each of its receives and moves to the dead-letter queue; seq 3
    // waits behind it, again and again, and stays in the source queue.
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
    assert!(log.iter().any(|line| line.ends_with("waiting")), "{log:?}");
    assert_eq!(queue.len(), 1, "the waiting message is in the source queue: {log:?}");

    // The handler fixed, the dead-letter queue redriven: seq 2 applies, then seq 3 when
    // its wait ends.
    handler.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dead_letters.move_all_to(&queue), 1);
    for _ in 0..12 {
        log.extend(round().await);
        clock.advance(Duration::from_secs(901));
    }
    assert_eq!(applied(&backend, "ORDER#a").await, [1, 2, 3], "{log:?}");
    assert!(queue.is_empty() && dead_letters.is_empty(), "{log:?}");
}
