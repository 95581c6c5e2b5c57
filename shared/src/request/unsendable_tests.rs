//! A message no destination takes is refused when the transaction commits, before
//! anything is written, in both forms of commit.

use std::sync::Arc;

use serde_json::json;

use super::{Outbox, TxnError};
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{ExpectedVersion, ItemKey, Store};
use crate::protocol::{DestinationName, Message, Unsendable};
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

/// A change of `ORDER#1` whose message carries U+FFFF, which SQS refuses for good
/// (`InvalidMessageContents`), committed in entity mode or in the transactional form:
/// refused as unsendable, naming the transaction and the character; no item, no record,
/// no control message, nothing on the destination.
#[tokio::test]
async fn a_message_no_destination_takes_is_refused_before_anything_is_written() {
    for entity_mode in [false, true] {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), [(events(), true)]);
        let outbox = Outbox::new(
            backend.request_ports(clock.clone()),
            Timing::default(),
            TransactionLimits::default(),
        );
        let order: ItemKey = "ORDER#1".parse().unwrap();
        let mut txn = if entity_mode {
            outbox.begin_entity(order.clone()).await.unwrap()
        } else {
            outbox.begin().await.unwrap()
        };
        txn.put(order.clone(), json!({"name": "a\u{FFFF}"}), ExpectedVersion::Absent);
        let mut message = Message::json(events(), &json!({})).unwrap();
        message.body = "{\"name\":\"a\u{FFFF}\"}".to_owned();
        txn.emit(message);
        let txn_id = txn.id();
        let refused = txn.commit().await.map(|done| done.txn_id).unwrap_err();
        assert!(
            matches!(&refused, TxnError::Unsendable { txn_id: named, source: Unsendable::Character { code: 0xFFFF, .. } } if *named == txn_id),
            "entity mode {entity_mode}: {refused:?}"
        );
        assert!(
            backend
                .store
                .get_items(std::slice::from_ref(&order))
                .await
                .unwrap()
                .is_empty(),
            "entity mode {entity_mode}: the item is not written"
        );
        assert!(
            backend.store.get_outboxes(&[txn_id]).await.unwrap().is_empty(),
            "entity mode {entity_mode}: no record"
        );
        assert!(
            backend.control_queue.queue().is_empty(),
            "entity mode {entity_mode}: no control message"
        );
        assert!(
            backend.publisher.queue(&events()).unwrap().is_empty(),
            "entity mode {entity_mode}: nothing published"
        );
    }
}
