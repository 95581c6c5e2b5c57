//! The conformance case of kept messages ([`outbox::ports::KeptMessage`]): what an in-order
//! consumer keeps until it has applied a message's predecessor, one item per message,
//! written and read whole, replaced by a later keep, removed harmlessly, and absent once
//! expired.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use outbox::consumer::in_order::kept_key;
use outbox::consumer::Delivery;
use outbox::ports::{Clock, KeptMessage};
use outbox::protocol::{Position, TxnId};
use outbox::time::Timestamp;

use super::backend::Backend;
use super::cases::whole_second;

/// How long the case keeps its messages (a consumer keeps them for its retention).
const KEPT_FOR: Duration = Duration::from_secs(4 * 24 * 3600);

/// Message `seq` of `entity`'s chain on `events`.
fn position(entity: &str, seq: u64) -> Position {
    Position {
        producer: None,
        entity: entity.parse().expect("a valid key"),
        chain: "events".parse().expect("a valid name"),
        seq,
        version: seq + 1,
        after: seq,
        previous: None,
    }
}

/// Message `seq` of `entity` as the consumer keeps it: its queue id `queue_id`, its body,
/// its position and id (`seq` of transaction `txn`) among its attributes, and, where `whole`, a FIFO group and a trace
/// header too; kept at `kept_at`, to expire at `expires_at`.
fn kept(
    txn: TxnId,
    entity: &str,
    seq: u64,
    queue_id: &str,
    whole: bool,
    kept_at: Timestamp,
    expires_at: Timestamp,
) -> KeptMessage {
    let position = position(entity, seq);
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert("outbox-message-id".into(), format!("{txn}:{seq}"));
    attributes.insert(
        "traceparent".into(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
    );
    KeptMessage {
        key: kept_key("ordered", &position, seq),
        delivery: Delivery {
            message_id: queue_id.to_owned(),
            receipt: String::new(),
            body: format!(r#"{{"entity":"{entity}","seq":{seq},"text":"a kept message, é and ✓"}}"#),
            attributes,
            group_id: whole.then(|| entity.replace('#', "-")),
            receive_count: 1,
            trace_header: whole.then(|| "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1".to_owned()),
        },
        kept_at,
        expires_at,
    }
}

async fn read(b: &Backend, key: &str) -> Option<KeptMessage> {
    b.store
        .get_kept(key)
        .await
        .unwrap_or_else(|error| panic!("{}: reading kept message {key}: {error:?}", b.name))
}

async fn keep(b: &Backend, message: &KeptMessage) {
    b.store
        .keep_message(message)
        .await
        .unwrap_or_else(|error| panic!("{}: keeping {}: {error:?}", b.name, message.key));
}

async fn remove(b: &Backend, key: &str) {
    b.store
        .remove_kept(key)
        .await
        .unwrap_or_else(|error| panic!("{}: removing {key}: {error:?}", b.name));
}

/// Kept messages ([`outbox::ports::Store::keep_message`]): a message never kept reads as
/// absent; one kept reads back whole at once (its queue id, body, attributes, FIFO group,
/// trace header, the millisecond it was kept and its expiry); two messages of one chain are
/// items of their own, neither touched by the other's keep or removal; a second keep of
/// the same message (another copy, kept later) replaces the first whole, leaving nothing
/// of it (not its group nor its trace header), and two copies kept at once leave one of
/// them whole; a removal leaves it absent, and removing it again, or one never kept, is
/// harmless. A kept message reads as absent once its expiry passed, and a keep before
/// then sets its expiry anew (a reminder's, which keeps it alive); one kept again after it
/// expired reads again.
pub async fn kept_messages_are_kept_whole_replaced_by_a_later_keep_and_removed_harmlessly(b: &Backend) {
    let entity = format!("ORDER#{}", TxnId::new_v7());
    let txn = TxnId::new_v7();
    let now = b.clock.now();
    // Kept at a time with milliseconds (the wait's age is measured from it); expiring on
    // a whole second, as DynamoDB's TTL keeps it.
    let kept_at = Timestamp::from_millis(whole_second(now).as_millis() + 123);
    let expires_at = whole_second(now.plus(KEPT_FOR));

    // Never kept: absent.
    let second = kept(txn, &entity, 2, "queue-id-2a", true, kept_at, expires_at);
    assert_eq!(read(b, &second.key).await, None, "{}: a message never kept", b.name);

    // Kept: read back whole, at once.
    keep(b, &second).await;
    assert_eq!(
        read(b, &second.key).await,
        Some(second.clone()),
        "{}: read back",
        b.name
    );

    // Another message of the chain is an item of its own.
    let third = kept(txn, &entity, 3, "queue-id-3", false, kept_at, expires_at);
    assert_ne!(third.key, second.key);
    assert_eq!(read(b, &third.key).await, None, "{}: seq 3 before its keep", b.name);
    keep(b, &third).await;
    assert_eq!(read(b, &third.key).await, Some(third.clone()), "{}: seq 3", b.name);
    assert_eq!(
        read(b, &second.key).await,
        Some(second.clone()),
        "{}: seq 2 after seq 3 was kept",
        b.name
    );

    // The same message kept again (a producer's re-send: another queue id, no group nor
    // trace header, kept later) replaces the first whole.
    let later = now.plus(Duration::from_secs(60));
    let copy = kept(
        txn,
        &entity,
        2,
        "queue-id-2b",
        false,
        later,
        whole_second(later.plus(KEPT_FOR)),
    );
    assert_eq!(copy.key, second.key);
    keep(b, &copy).await;
    assert_eq!(
        read(b, &copy.key).await,
        Some(copy.clone()),
        "{}: a second keep of seq 2 replaces the first whole",
        b.name
    );
    // The very same copy kept once more is harmless.
    keep(b, &copy).await;
    assert_eq!(read(b, &copy.key).await, Some(copy.clone()), "{}: kept twice", b.name);

    // Two copies kept at once: one of them, whole.
    let racing: Vec<KeptMessage> = ["queue-id-2c", "queue-id-2d"]
        .into_iter()
        .map(|queue_id| kept(txn, &entity, 2, queue_id, true, kept_at, expires_at))
        .collect();
    join_all(racing.iter().map(|message| keep(b, message))).await;
    let found = read(b, &second.key).await.expect("one of the copies");
    assert!(
        racing.contains(&found),
        "{}: two copies kept at once left neither whole: {found:?}",
        b.name
    );

    // Removed: absent; seq 3 stays. Removing it again, or one never kept, is harmless.
    remove(b, &second.key).await;
    assert_eq!(read(b, &second.key).await, None, "{}: seq 2 after its removal", b.name);
    assert_eq!(
        read(b, &third.key).await,
        Some(third.clone()),
        "{}: seq 3 after seq 2 was removed",
        b.name
    );
    remove(b, &second.key).await;
    let never = kept(txn, &entity, 9, "queue-id-9", false, kept_at, expires_at);
    remove(b, &never.key).await;
    assert_eq!(read(b, &never.key).await, None, "{}: a removal keeps nothing", b.name);
    assert_eq!(read(b, &second.key).await, None, "{}: seq 2 removed twice", b.name);

    // Expiry: seq 3 reads until its expiry; kept anew before then (as its reminder keeps
    // it), it reads after the first expiry, until its new one.
    keep(b, &second).await;
    b.clock.set(expires_at.minus(Duration::from_secs(2)));
    assert_eq!(
        read(b, &third.key).await,
        Some(third.clone()),
        "{}: seq 3 just before its expiry",
        b.name
    );
    let renewed_expiry = whole_second(b.clock.now().plus(KEPT_FOR));
    let renewed = KeptMessage {
        expires_at: renewed_expiry,
        ..third.clone()
    };
    keep(b, &renewed).await;
    b.clock.set(expires_at.plus(Duration::from_secs(2)));
    assert_eq!(
        read(b, &second.key).await,
        None,
        "{}: seq 2 after its expiry reads as absent",
        b.name
    );
    assert_eq!(
        read(b, &third.key).await,
        Some(renewed.clone()),
        "{}: seq 3, kept anew, after its first expiry",
        b.name
    );
    // Expired, it can be kept again (and reads), and removed again harmlessly.
    let again = KeptMessage {
        expires_at: renewed_expiry,
        ..second.clone()
    };
    keep(b, &again).await;
    assert_eq!(
        read(b, &again.key).await,
        Some(again.clone()),
        "{}: kept after expiry",
        b.name
    );
    remove(b, &again.key).await;
    remove(b, &again.key).await;
    assert_eq!(read(b, &again.key).await, None, "{}: removed after expiry", b.name);
    b.clock.set(renewed_expiry.plus(Duration::from_secs(2)));
    assert_eq!(
        read(b, &third.key).await,
        None,
        "{}: seq 3 after its new expiry",
        b.name
    );
    remove(b, &third.key).await;
}
