//! An in-order consumer in the transactional mode reads a message's dedup record, then its
//! chain's position, in two reads: a rival copy of the message can commit between them.

use std::sync::Mutex;

use futures_util::future::BoxFuture;

use crate::embedded::EmbeddedStore;
use crate::ports::{CommitRequest, KeyRead, Store, StoreError, TombstoneOutcome, VersionedItem};
use crate::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, Position, TxnId};

use super::*;

/// The embedded store, running a hook (once) right after a read of records: what a rival
/// copy does between a copy's read of its dedup record and its read of the position.
struct AfterRecordRead {
    inner: Arc<EmbeddedStore>,
    hook: Mutex<Option<BoxFuture<'static, ()>>>,
}

#[async_trait]
impl Store for AfterRecordRead {
    fn producer(&self) -> Option<crate::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), crate::ports::CommitError> {
        self.inner.commit(request).await
    }
    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        self.inner.get_items(keys).await
    }
    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        self.inner.get_keys(keys).await
    }
    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        let read = self.inner.get_outboxes(txn_ids).await;
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook.await;
        }
        read
    }
    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.get_idempotency(slot).await
    }
    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        self.inner.put_tombstone(txn_id, now, expires_at).await
    }
    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        self.inner.mark_dispatched(records, expires_at).await
    }
}

/// Applies each placed message (counts it in `APPLIED#{entity}`) and emits one message
/// to `events` for it.
struct ApplyAndEmit;

#[async_trait]
impl Handler for ApplyAndEmit {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("no position")?;
        let key: ItemKey = format!("APPLIED#{}", position.entity).parse()?;
        let read = staging.get(&key).await?;
        let count = read.as_ref().and_then(|item| item.data["count"].as_u64()).unwrap_or(0);
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, json!({ "count": count + 1 }), expected);
        staging.emit(Message::json(events(), &json!({"applied": position.seq}))?);
        Ok(())
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// Message `seq` 1 of `ORDER#a`'s chain on `inbox`, as the queue delivers it.
fn first_of_chain(queue_message_id: &str) -> Delivery {
    let position = Position {
        producer: None,
        entity: "ORDER#a".parse().unwrap(),
        chain: "inbox".parse().unwrap(),
        seq: 1,
        version: 1,
        after: 0,
        previous: None,
    };
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), "ORDER#a:1".to_owned());
    Delivery {
        message_id: queue_message_id.into(),
        receipt: String::new(),
        body: json!({ "seq": 1 }).to_string(),
        attributes,
        group_id: None,
        receive_count: 1,
        trace_header: None,
    }
}

/// A copy reads no dedup record; before it reads the chain's position, a rival copy of
/// the same message commits (the record pending, the position moved to the message) and
/// stops before its publish. The copy then finds the message applied by the position, a
/// duplicate by that read alone; acknowledged on it, nothing would ever send the rival's
/// messages (C5). It reads the record again and sends them, then acknowledges (Resumed).
#[tokio::test]
async fn a_rival_copy_committing_between_the_record_and_the_position_is_sent_before_the_acknowledgement() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    // The rival: straight on the store, its publish failing (it stops before its messages
    // went out).
    let mut rival_ports = backend.consumer_ports(clock.clone());
    rival_ports.publisher = Arc::new(Flaky {
        inner: backend.publisher.clone(),
        failures: AtomicU32::new(u32::MAX),
        clock: clock.clone(),
    });
    let rival = Arc::new(
        Consumer::new(
            "ordered".parse().unwrap(),
            rival_ports,
            Arc::new(ApplyAndEmit),
            RETENTION,
        )
        .with_retry_policy(crate::publish::RetryPolicy {
            attempts: 1,
            ..Default::default()
        }),
    );
    let store = Arc::new(AfterRecordRead {
        inner: backend.store.clone(),
        hook: Mutex::new(None),
    });
    let between = Arc::clone(&rival);
    *store.hook.lock().unwrap() = Some(Box::pin(async move {
        let failed = between.consume(&first_of_chain("q-rival")).await;
        assert!(matches!(failed, Err(ConsumeError::Publish { .. })), "{failed:?}");
    }));
    let mut ports = backend.consumer_ports(clock.clone());
    ports.store = store;
    let copy = Consumer::new("ordered".parse().unwrap(), ports, Arc::new(ApplyAndEmit), RETENTION);
    let outcome = copy.consume(&first_of_chain("q-copy")).await.unwrap();
    assert_eq!(outcome, ConsumeOutcome::Resumed { messages: 1 });
    let txn_id = copy.txn_id("ORDER#a:1");
    let queue = backend.publisher.queue(&events()).unwrap();
    let sent: Vec<String> = queue
        .receive(10)
        .into_iter()
        .map(|message| message.attributes[MESSAGE_ID_ATTRIBUTE].clone())
        .collect();
    assert_eq!(sent, [format!("{txn_id}:0")], "the rival's message went out");
    let record = backend
        .store
        .outbox_records()
        .into_iter()
        .find(|record| record.txn_id == txn_id)
        .expect("the record");
    assert_eq!(record.state, OutboxState::Dispatched);
}
