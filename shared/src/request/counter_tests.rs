//! Counter commits through the request path whose outcome is unknown, on the embedded
//! backend: the write is sent once, and the settling write decides.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use super::{Outbox, TxnError};
use crate::counter::{Add, CounterCommit, CounterCommitted, CounterError};
use crate::embedded::{EmbeddedBackend, EmbeddedStore, ManualClock};
use crate::ports::{Clock, CommitError, EntityCommit, ExpectedVersion, ItemKey, Store, StoreError};
use crate::protocol::{DestinationName, Message, OutboxRecord, TxnId};
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn stock() -> ItemKey {
    "STOCK#1".parse().unwrap()
}

/// The embedded store whose first counter commit applies and then loses its reply; with
/// `settled_meanwhile`, the entry it wrote leaves the item into its record before the
/// answer comes back (a worker that handled the control message meanwhile, the item full
/// of sent marks), so that nothing in the item remembers the write.
struct FirstReplyLost {
    inner: Arc<EmbeddedStore>,
    counter_commits: AtomicUsize,
    settled_meanwhile: bool,
}

#[async_trait::async_trait]
impl Store for FirstReplyLost {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &crate::ports::CommitRequest) -> Result<(), CommitError> {
        self.inner.commit(request).await
    }
    async fn get_items(
        &self,
        keys: &[ItemKey],
    ) -> Result<std::collections::BTreeMap<ItemKey, crate::ports::VersionedItem>, StoreError> {
        self.inner.get_items(keys).await
    }
    async fn get_keys(
        &self,
        keys: &[ItemKey],
    ) -> Result<std::collections::BTreeMap<ItemKey, crate::ports::KeyRead>, StoreError> {
        self.inner.get_keys(keys).await
    }
    async fn get_outboxes(
        &self,
        txn_ids: &[TxnId],
    ) -> Result<std::collections::BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.inner.get_outboxes(txn_ids).await
    }
    async fn get_idempotency(
        &self,
        slot: &crate::protocol::IdempotencySlot,
    ) -> Result<Option<crate::protocol::IdempotencyRecord>, StoreError> {
        self.inner.get_idempotency(slot).await
    }
    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<crate::ports::TombstoneOutcome, StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }
    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }
    async fn get_entity(&self, key: &ItemKey) -> Result<Option<crate::ports::EntityItem>, StoreError> {
        self.inner.get_entity(key).await
    }
    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        self.inner.commit_entity(commit).await
    }
    async fn commit_counter(&self, commit: &CounterCommit) -> Result<CounterCommitted, CounterError> {
        let result = self.inner.commit_counter(commit).await;
        if self.counter_commits.fetch_add(1, Ordering::SeqCst) > 0 {
            return result;
        }
        result.expect("the first counter commit applies");
        if self.settled_meanwhile {
            let now = commit.entry.created_at;
            self.inner
                .settle_entry(
                    &commit.key,
                    commit.entry.txn_id,
                    now,
                    now.plus(Timing::default().retention),
                    0,
                )
                .await
                .expect("the entry settles into its record");
        }
        Err(CommitError::Ambiguous("the reply was lost".into()).into())
    }
    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        self.inner.settle_entry(key, txn_id, now, expires_at, max_marks).await
    }
    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.inner.remove_entry(key, txn_id).await
    }
    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<crate::ports::FenceOutcome, StoreError> {
        self.inner.fence_entity(key, txn_id, now, expires_at).await
    }
    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        self.inner.put_dispatched(txn_id, now, expires_at).await
    }
}

/// A take of one unit of a stock of five whose first write applied and lost its reply:
/// the answer, the stock left, and how many counter writes were sent.
async fn take_with_the_first_reply_lost(settled_meanwhile: bool) -> (Result<TxnId, String>, i64, usize) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let plain = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let mut create = plain.begin().await.unwrap();
    create.put(stock(), json!({"stock": 5}), ExpectedVersion::Absent);
    create.commit().await.unwrap();
    let store = Arc::new(FirstReplyLost {
        inner: backend.store.clone(),
        counter_commits: AtomicUsize::new(0),
        settled_meanwhile,
    });
    let ports = super::RequestPorts {
        store: store.clone(),
        ..backend.request_ports(clock.clone())
    };
    let outbox = Outbox::new(ports, Timing::default(), TransactionLimits::default());
    let mut txn = outbox.begin_entity(stock()).await.unwrap();
    txn.add(Add::take("stock", 1));
    txn.emit(Message::json(events(), &json!({"took": 1})).unwrap());
    let answer = txn
        .commit()
        .await
        .map(|done| done.txn_id)
        .map_err(|error| format!("{error:?}"));
    let left = backend.store.get_entity(&stock()).await.unwrap().unwrap().item.data["stock"]
        .as_i64()
        .unwrap();
    (answer, left, store.counter_commits.load(Ordering::SeqCst))
}

/// A counter write whose reply was lost is not sent again: the settling write finds its
/// entry, and the transaction answers committed, one unit taken, one write sent.
#[tokio::test]
async fn a_counter_write_of_unknown_outcome_is_settled_not_sent_again() {
    let (answer, left, writes) = take_with_the_first_reply_lost(false).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!((left, writes), (4, 1));
}

/// Even when the entry left the item meanwhile (into its record, leaving no sent mark),
/// which a second write of the same transaction would not see: the settling write finds
/// the record, and one unit is taken, never two.
#[tokio::test]
async fn a_counter_write_whose_entry_left_the_item_meanwhile_is_never_applied_twice() {
    let (answer, left, writes) = take_with_the_first_reply_lost(true).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!((left, writes), (4, 1), "one unit taken, one write sent");
}

/// A counter write still on its way when its transaction was fenced can never land, and
/// the transaction's commit after the fence answers that nothing was written.
#[tokio::test]
async fn a_counter_write_lost_on_its_way_is_fenced() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let plain = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let mut create = plain.begin().await.unwrap();
    create.put(stock(), json!({"stock": 5}), ExpectedVersion::Absent);
    create.commit().await.unwrap();
    let store = Arc::new(FirstReplyLost {
        inner: backend.store.clone(),
        counter_commits: AtomicUsize::new(1),
        settled_meanwhile: false,
    });
    // The write, held back in the network, arrives after its transaction was fenced.
    let mut txn = plain.begin_entity(stock()).await.unwrap();
    let txn_id = txn.id();
    txn.add(Add::take("stock", 1));
    let fenced = backend
        .store
        .fence_entity(
            &stock(),
            txn_id,
            clock.now(),
            clock.now().plus(Timing::default().retention),
        )
        .await
        .unwrap();
    assert_eq!(fenced, crate::ports::FenceOutcome::Fenced);
    let late = CounterCommit {
        key: stock(),
        adds: vec![Add::take("stock", 1)],
        entry: OutboxRecord::committed(txn_id, vec![], clock.now(), clock.now()),
        checks_fence: true,
    };
    assert!(matches!(
        store.commit_counter(&late).await,
        Err(CounterError::Commit(CommitError::EntityFenced { .. }))
    ));
    assert!(matches!(txn.commit().await, Err(TxnError::CommitWindowExpired { .. })));
}
