//! The embedded store: one map of items with DynamoDB's semantics for what the protocol
//! uses: atomic conditional multi-item commits with a reason per failed condition,
//! strongly consistent reads, conditional puts, and TTL read as "gone once expired".
//!
//! An expired item is treated as deleted the instant it expires, for reads and for
//! conditions alike: the most eager deletion DynamoDB's TTL could perform, so tests see
//! the worst case. Each write also sweeps the items that have expired (through an index
//! by expiry), so that a long-running process holds only live records.
//!
//! - `state`: the items as held and their sweep; `history`: the [`StoreEvent`]s a test
//!   asks for; `commit`: a commit of the transactional mode; `entity`: the entity mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

mod commit;
mod counter;
mod entity;
mod history;
mod state;

pub use history::StoreEvent;
use state::{idempotency_key, outbox_key, Item, State};

use crate::ports::{
    Clock, CommitError, CommitRequest, EntityCommit, EntityItem, ExpectedVersion, FenceOutcome, ItemKey, KeptMessage,
    KeyRead, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use crate::protocol::{
    Applied, AppliedPositions, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, Producer, TxnId,
};
use crate::time::Timestamp;

/// What an embedded table holds, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreSizes {
    /// The application's items: they stay until deleted.
    pub business_items: usize,
    /// The protocol's records: they expire after the retention.
    pub records: usize,
}

/// The embedded table.
pub struct EmbeddedStore {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// The producer it names in its messages' positions ([`Store::producer`]).
    producer: Producer,
}

/// The producer an embedded table names unless told another ([`EmbeddedStore::named`]).
pub const EMBEDDED_PRODUCER: &str = "embedded";

impl EmbeddedStore {
    /// An empty table whose TTL follows `clock`, producer [`EMBEDDED_PRODUCER`].
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
            producer: EMBEDDED_PRODUCER.parse().expect("a valid producer"),
        }
    }

    /// This table, naming itself `producer` in its messages' positions: two embedded
    /// tables whose messages reach one in-order consumer must be named apart.
    pub fn named(mut self, producer: Producer) -> Self {
        self.producer = producer;
        self
    }

    // A std mutex: no lock is held across an await, and every operation is short.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps what the store does from now on, for [`Self::history`]: for tests (a
    /// long-running process would hold every commit it ever made).
    pub fn record_history(&self) {
        self.lock().history.get_or_insert_with(Vec::new);
    }

    /// Everything the store has done since [`Self::record_history`], in order.
    ///
    /// # Panics
    ///
    /// If the history is not recorded: a test that reads it must ask for it.
    pub fn history(&self) -> Vec<StoreEvent> {
        self.lock()
            .history
            .clone()
            .expect("call record_history() before reading history()")
    }

    /// How many items it holds: business items, and the protocol's records (outbox and
    /// idempotency records, expired ones not yet swept included).
    pub fn sizes(&self) -> StoreSizes {
        let state = self.lock();
        let business_items = state
            .items
            .values()
            .filter(|item| matches!(item, Item::Business { .. } | Item::Vacant { .. }))
            .count();
        StoreSizes {
            business_items,
            records: state.items.len() - business_items,
        }
    }

    /// Every outbox record physically present, expired or not (what a table scan would
    /// show before TTL deletion; the next write sweeps the expired ones).
    pub fn outbox_records(&self) -> Vec<OutboxRecord> {
        self.lock()
            .items
            .values()
            .filter_map(|item| match item {
                Item::Outbox(record) => Some(record.as_ref().clone()),
                _ => None,
            })
            .collect()
    }

    /// Every idempotency record physically present, expired or not.
    pub fn idempotency_records(&self) -> Vec<IdempotencyRecord> {
        self.lock()
            .items
            .values()
            .filter_map(|item| match item {
                Item::Idempotency(record) => Some(record.as_ref().clone()),
                _ => None,
            })
            .collect()
    }

    fn live<'a>(state: &'a State, key: &str, now: Timestamp) -> Option<&'a Item> {
        state.items.get(key).filter(|item| !item.is_expired(now))
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        commit::apply(&mut state, request, now)
    }

    fn producer(&self) -> Option<Producer> {
        Some(self.producer.clone())
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        Ok(keys
            .iter()
            .filter_map(|key| match Self::live(&state, key.as_str(), now) {
                Some(Item::Business { version, json, .. }) => Some((
                    key.clone(),
                    VersionedItem {
                        key: key.clone(),
                        version: *version,
                        data: serde_json::from_str(json).expect("the store wrote this JSON itself"),
                    },
                )),
                _ => None,
            })
            .collect())
    }

    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        Ok(keys
            .iter()
            .filter_map(|key| {
                let held = Self::live(&state, key.as_str(), now)?;
                let (_, version, heads) = held.key_state()?;
                let (item, entries, applied) = match held {
                    Item::Business {
                        json, entries, applied, ..
                    } => (
                        Some(VersionedItem {
                            key: key.clone(),
                            version,
                            data: serde_json::from_str(json).expect("the store wrote this JSON itself"),
                        }),
                        entries.clone(),
                        applied.clone(),
                    ),
                    Item::Vacant { applied, .. } => (None, BTreeMap::new(), applied.clone()),
                    _ => (None, BTreeMap::new(), AppliedPositions::new()),
                };
                let heads = heads.clone();
                let read = KeyRead {
                    item,
                    version,
                    heads,
                    entries,
                    applied,
                };
                Some((key.clone(), read))
            })
            .collect())
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        Ok(txn_ids
            .iter()
            .filter_map(|txn_id| match Self::live(&state, &outbox_key(*txn_id), now) {
                Some(Item::Outbox(record)) => Some((*txn_id, record.as_ref().clone())),
                _ => None,
            })
            .collect())
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        Ok(match Self::live(&state, &idempotency_key(slot), now) {
            Some(Item::Idempotency(record)) => Some(record.as_ref().clone()),
            _ => None,
        })
    }

    async fn put_idempotency(&self, record: &IdempotencyRecord) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = self.clock.now();
        let key = idempotency_key(&record.slot);
        let mut state = self.lock();
        if let Some(Item::Idempotency(first)) = Self::live(&state, &key, now) {
            return Ok(Some(first.as_ref().clone()));
        }
        state.insert(key, Item::Idempotency(Box::new(record.clone())));
        Ok(None)
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        let clock_now = self.clock.now();
        let mut state = self.lock();
        state.sweep(clock_now);
        let key = outbox_key(txn_id);
        match Self::live(&state, &key, clock_now) {
            Some(Item::Outbox(record)) => Ok(TombstoneOutcome::Exists(record.as_ref().clone())),
            Some(_) => Err(StoreError::Corrupt {
                key,
                reason: "not an outbox record".into(),
            }),
            None => {
                state.insert(
                    key,
                    Item::Outbox(Box::new(OutboxRecord::tombstone(txn_id, now, expires_at))),
                );
                state.record(|| StoreEvent::Tombstoned { txn_id, at: clock_now });
                Ok(TombstoneOutcome::Written)
            }
        }
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        // As on DynamoDB: an unconditional put of the dispatched form of the record as
        // read (pending, so committed), whatever the key holds now. A mark that arrives
        // late (a worker frozen between its publish and its mark) puts the record back
        // after it expired, dispatched and due to expire again. It never meets T's
        // tombstone: T committed, and a committed transaction gets none (I3, which the
        // simulation checks on this very behaviour). A known limit: a consumed message's
        // key (`IN#`) can hold a newer attempt's record once the old one expired, and a
        // mark delayed past the consumer's retention would replace it (on DynamoDB and
        // delete its parts too).
        records
            .iter()
            .map(|read| {
                let txn_id = &read.txn_id;
                let key = outbox_key(*txn_id);
                state.insert(key, Item::Outbox(Box::new(read.dispatched(expires_at))));
                state.record(|| StoreEvent::MarkedDispatched {
                    txn_id: *txn_id,
                    at: now,
                });
                Ok(())
            })
            .collect()
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        let now = self.clock.now();
        Ok(entity::read(&self.lock(), key, now))
    }

    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        entity::commit(&mut state, commit, now)
    }

    async fn commit_counter(
        &self,
        commit: &crate::counter::CounterCommit,
    ) -> Result<crate::counter::CounterCommitted, crate::counter::CounterError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        counter::commit(&mut state, commit, now, &self.producer)
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        entity::keep_applied(&mut state, key, expected, name, applied)
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        entity::remove(&mut state, key, txn_id, now);
        Ok(())
    }

    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        let clock_now = self.clock.now();
        let mut state = self.lock();
        state.sweep(clock_now);
        // A committed record speaks for T; an entry in the item is proof of the commit
        // where T's record is a tombstone (written without the fence).
        let record = match Self::live(&state, &outbox_key(txn_id), clock_now) {
            Some(Item::Outbox(record)) => Some(record.as_ref().clone()),
            _ => None,
        };
        match (record, entity::entry(&state, key, txn_id)) {
            (Some(record), _) if record.state != OutboxState::Tombstone => return Ok(FenceOutcome::Recorded(record)),
            (_, Some(entry)) => return Ok(FenceOutcome::Committed(entry)),
            _ if entity::has_sent_mark(&state, key, txn_id) => return Ok(FenceOutcome::Dispatched),
            // A tombstone written without the fence: the mark is raised all the same.
            (Some(tombstone), None) => {
                entity::raise_fence(&mut state, key, txn_id);
                state.record(|| StoreEvent::Fenced {
                    key: key.clone(),
                    txn_id,
                    at: clock_now,
                });
                return Ok(FenceOutcome::Recorded(tombstone));
            }
            (None, None) => {}
        }
        entity::raise_fence(&mut state, key, txn_id);
        let tombstone = OutboxRecord::tombstone(txn_id, now, expires_at);
        state.insert(outbox_key(txn_id), Item::Outbox(Box::new(tombstone)));
        state.record(|| StoreEvent::Fenced {
            key: key.clone(),
            txn_id,
            at: clock_now,
        });
        state.record(|| StoreEvent::Tombstoned { txn_id, at: clock_now });
        Ok(FenceOutcome::Fenced)
    }

    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        let clock_now = self.clock.now();
        let settled = {
            let mut state = self.lock();
            state.sweep(clock_now);
            entity::settle(&mut state, key, txn_id, expires_at, max_marks, clock_now)
        };
        if settled {
            return Ok(());
        }
        // A full item: the proof goes to the record (two writes on DynamoDB).
        self.put_dispatched(txn_id, now, expires_at).await?;
        self.remove_entry(key, txn_id).await
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        let clock_now = self.clock.now();
        let mut state = self.lock();
        state.sweep(clock_now);
        entity::drop_marks(&mut state, key, forget, clock_now);
        Ok(())
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        let clock_now = self.clock.now();
        let mut state = self.lock();
        state.sweep(clock_now);
        let record = OutboxRecord::committed(txn_id, Vec::new(), now, expires_at);
        state.insert(outbox_key(txn_id), Item::Outbox(Box::new(record)));
        state.record(|| StoreEvent::MarkedDispatched { txn_id, at: clock_now });
        Ok(())
    }

    async fn keep_message(&self, kept: &KeptMessage) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        state.insert(kept.key.clone(), Item::Kept(Box::new(kept.clone())));
        Ok(())
    }

    async fn get_kept(&self, key: &str) -> Result<Option<KeptMessage>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        Ok(match Self::live(&state, key, now) {
            Some(Item::Kept(kept)) => Some(kept.as_ref().clone()),
            _ => None,
        })
    }

    async fn remove_kept(&self, key: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        if matches!(state.items.get(key), Some(Item::Kept(_))) {
            state.items.remove(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
