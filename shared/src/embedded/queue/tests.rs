//! The embedded queue's tests: SQS's delays, visibility, redrive, FIFO and limits.

use super::*;
use crate::embedded::ManualClock;

fn setup(config: QueueConfig) -> (Arc<ManualClock>, EmbeddedQueue) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let queue = EmbeddedQueue::new(config, clock.clone());
    queue.record_sends();
    (clock, queue)
}

#[test]
fn a_bounded_queue_drops_its_oldest() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let queue = EmbeddedQueue::new(QueueConfig::standard("q").holding_at_most(2), clock);
    for text in ["a", "b", "c"] {
        queue.send(body(text)).unwrap();
    }
    assert_eq!(queue.bodies(), vec!["b", "c"]);
    assert_eq!(queue.dropped(), 1);
}

/// Reading a log nobody asked for is a test's mistake, said loudly.
#[test]
#[should_panic(expected = "call record_sends() before reading sent()")]
fn nothing_is_logged_unless_asked() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let queue = EmbeddedQueue::new(QueueConfig::standard("q"), clock);
    queue.send(body("a")).unwrap();
    queue.sent();
}

fn body(text: &str) -> SendRequest {
    SendRequest {
        body: text.into(),
        ..SendRequest::default()
    }
}

#[test]
fn a_delayed_message_is_invisible_until_its_delay_passes() {
    let (clock, queue) = setup(QueueConfig::standard("q"));
    queue
        .send(SendRequest {
            delay: Duration::from_secs(5),
            ..body("later")
        })
        .unwrap();
    assert!(queue.receive(10).is_empty());
    assert_eq!(queue.next_visible_at(), Some(Timestamp::from_millis(1_005_000)));
    clock.advance(Duration::from_secs(5));
    assert_eq!(queue.receive(10)[0].body, "later");
}

#[test]
fn an_unacknowledged_message_returns_after_the_visibility_timeout() {
    let (clock, queue) = setup(QueueConfig::standard("q"));
    queue.send(body("m")).unwrap();
    let first = queue.receive(10);
    assert_eq!(first[0].receive_count, 1);
    assert!(queue.receive(10).is_empty(), "invisible while in flight");
    clock.advance(Duration::from_secs(30));
    let second = queue.receive(10);
    assert_eq!(second[0].receive_count, 2);
    assert!(!queue.delete(&first[0].receipt), "a stale receipt deletes nothing");
    assert!(queue.delete(&second[0].receipt));
    assert!(queue.is_empty());
}

#[test]
fn a_message_received_too_often_moves_to_the_dead_letter_queue() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
    let dlq = Arc::new(EmbeddedQueue::new(QueueConfig::standard("dlq"), clock.clone()));
    let queue = EmbeddedQueue::new(QueueConfig::standard("q"), clock.clone()).with_dead_letter_queue(dlq.clone(), 2);
    queue.send(body("poison")).unwrap();
    for _ in 0..2 {
        assert_eq!(queue.receive(1).len(), 1);
        clock.advance(Duration::from_secs(30));
    }
    assert!(queue.receive(1).is_empty(), "the third receive moves it instead");
    assert_eq!(dlq.bodies(), ["poison"]);
    assert_eq!(dlq.move_all_to(&queue), 1);
    assert_eq!(
        queue.receive(1)[0].receive_count,
        1,
        "a redriven message starts counting again"
    );
}

#[test]
fn fifo_queues_deduplicate_within_five_minutes_and_refuse_delays() {
    let (clock, queue) = setup(QueueConfig::fifo("f"));
    let send = |id: &str| SendRequest {
        group_id: Some("g".into()),
        deduplication_id: Some(id.into()),
        ..body("x")
    };
    let first = queue.send(send("a")).unwrap();
    assert_eq!(queue.send(send("a")).unwrap(), first);
    assert_eq!(queue.len(), 1);
    clock.advance(DEDUPLICATION_WINDOW);
    queue.send(send("a")).unwrap();
    assert_eq!(queue.len(), 2, "after the window the id is forgotten");
    assert!(queue
        .send(SendRequest {
            delay: Duration::from_secs(1),
            ..send("b")
        })
        .is_err());
    assert!(queue.send(body("no group")).is_err());
}

#[test]
fn fifo_groups_deliver_in_order_one_in_flight_at_a_time() {
    let (_clock, queue) = setup(QueueConfig::fifo("f"));
    for (group, id) in [("g1", "1"), ("g1", "2"), ("g2", "3")] {
        queue
            .send(SendRequest {
                group_id: Some(group.into()),
                deduplication_id: Some(id.into()),
                ..body(id)
            })
            .unwrap();
    }
    let first = queue.receive(1);
    assert_eq!(first[0].body, "1");
    let next = queue.receive(10);
    assert_eq!(
        next.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
        ["3"],
        "g1 waits for message 1"
    );
    queue.delete(&first[0].receipt);
    assert_eq!(queue.receive(10)[0].body, "2");
}

#[test]
fn sqs_limits_are_enforced() {
    let (_clock, queue) = setup(QueueConfig::standard("q"));
    assert!(queue
        .send(SendRequest {
            delay: Duration::from_secs(901),
            ..body("x")
        })
        .is_err());
    assert!(queue.send(body(&"x".repeat(MAX_MESSAGE_BYTES + 1))).is_err());
    assert!(queue.send(body("")).is_err());
}

/// What comes due within a horizon: a message visible now, one whose delay ends within
/// it, and one a receiver holds (invisible for its timeout) count; one whose delay ends
/// later (a reminder due in 15 minutes) does not, until the clock nears it.
#[test]
fn due_within_counts_what_a_receive_takes_within_the_horizon_or_a_receiver_holds() {
    let (clock, queue) = setup(QueueConfig::standard("q"));
    let delayed = |text: &str, secs: u64| SendRequest {
        delay: Duration::from_secs(secs),
        ..body(text)
    };
    queue.send(body("held")).unwrap();
    assert_eq!(queue.receive_for(1, Duration::from_secs(600)).len(), 1);
    queue.send(body("now")).unwrap();
    queue.send(delayed("soon", 1)).unwrap();
    queue.send(delayed("reminder", 900)).unwrap();
    let horizon = Duration::from_secs(20);
    assert_eq!((queue.len(), queue.due_within(horizon)), (4, 3));
    clock.advance(Duration::from_secs(890));
    assert_eq!(queue.due_within(horizon), 4);
}
