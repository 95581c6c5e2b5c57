//! The embedded store's own tests (the conformance suite tests it with the DynamoDB store).

use std::time::Duration;

use super::*;
use crate::embedded::ManualClock;
use crate::ports::{BusinessWrite, ExpectedVersion};

/// Expired records leave memory at the next write; live ones and business items stay.
#[tokio::test]
async fn a_write_sweeps_the_records_that_have_expired() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let store = EmbeddedStore::new(clock.clone());
    let txn = |n: u8| TxnId::from_parts(clock.now(), [n; 10]);
    let expiring = clock.now().plus(Duration::from_secs(60));
    store.put_tombstone(txn(1), clock.now(), expiring).await.unwrap();
    let key: ItemKey = "ORDER#1".parse().unwrap();
    let order = CommitRequest {
        txn_id: txn(2),
        writes: vec![BusinessWrite::Put {
            key: key.clone(),
            data: serde_json::json!({"lines": [1, 2]}),
            expected: ExpectedVersion::Absent,
        }],
        outbox: OutboxRecord::committed(txn(2), vec![], clock.now(), clock.now().plus(Duration::from_secs(600))),
        idempotency: None,
    };
    store.commit(&order).await.unwrap();
    assert_eq!(
        store.sizes(),
        StoreSizes {
            business_items: 1,
            records: 2
        }
    );

    clock.advance(Duration::from_secs(61));
    // Read as gone at once; still held until a write.
    assert!(store.get_outboxes(&[txn(1)]).await.unwrap().is_empty());
    assert_eq!(store.sizes().records, 2);
    store
        .put_tombstone(txn(3), clock.now(), clock.now().plus(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        store.sizes(),
        StoreSizes {
            business_items: 1,
            records: 2
        },
        "txn 1's tombstone swept, 3's added"
    );
    let items = store.get_items(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(
        items[&key].data,
        serde_json::json!({"lines": [1, 2]}),
        "the item reads back as written"
    );
}
