//! The embedded store: one map of items with DynamoDB's semantics for what the protocol
//! uses: atomic conditional multi-item commits with a reason per failed condition,
//! strongly consistent reads, conditional puts, and TTL read as "gone once expired".
//!
//! An expired item is treated as deleted the instant it expires, for reads and for
//! conditions alike: the most eager deletion DynamoDB's TTL could perform, so tests see
//! the worst case. Each write also sweeps the items that have expired (through an index
//! by expiry), so that a long-running process holds only live records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

mod entity;

use crate::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, EntityCommit, EntityItem, ExpectedVersion, FenceOutcome, ItemKey,
    Store, StoreError, TombstoneOutcome, VersionedItem,
};
use crate::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, TxnId};
use crate::time::Timestamp;

/// DynamoDB's limit of actions in one `TransactWriteItems`.
const MAX_TRANSACTION_ACTIONS: usize = 100;
/// DynamoDB's 4 MB limit of one `TransactWriteItems`, less the margin the DynamoDB
/// adapter keeps for attribute names and overhead.
const MAX_TRANSACTION_BYTES: usize = 4_000_000 - 64 * 1024;

/// An item as held: a business item's data as JSON text (a JSON value in memory takes
/// several times its text, and a long-running server holds every order), the records
/// boxed so that the map's nodes stay small.
#[derive(Debug, Clone)]
enum Item {
    /// The entity mode's outbox entries ride along (docs/PROTOCOL.md section 11); an empty map
    /// allocates nothing.
    /// `fence` is its fence mark and `sent` its sent marks (entity mode), kept by every
    /// write of the item.
    Business {
        version: u64,
        json: Box<str>,
        entries: BTreeMap<TxnId, OutboxRecord>,
        fence: Option<TxnId>,
        sent: BTreeMap<TxnId, Timestamp>,
    },
    /// A business key without an item that keeps a fence mark: the fence found no item,
    /// or the item was deleted. Read as absent; a create keeps the mark.
    Vacant {
        fence: TxnId,
    },
    Outbox(Box<OutboxRecord>),
    Idempotency(Box<IdempotencyRecord>),
}

impl Item {
    fn is_expired(&self, now: Timestamp) -> bool {
        match self {
            Self::Business { .. } | Self::Vacant { .. } => false,
            Self::Outbox(record) => record.is_expired(now),
            Self::Idempotency(record) => record.is_expired(now),
        }
    }

    fn expires_at(&self) -> Option<Timestamp> {
        match self {
            Self::Business { .. } | Self::Vacant { .. } => None,
            Self::Outbox(record) => record.expires_at,
            Self::Idempotency(record) => Some(record.expires_at),
        }
    }
}

/// Something the store did, for tests that check invariants against what really
/// happened rather than against what callers were told.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreEvent {
    /// A commit applied.
    Committed {
        /// What was committed.
        request: Box<CommitRequest>,
        /// When.
        at: Timestamp,
    },
    /// A tombstone was written.
    Tombstoned {
        /// For which transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
    /// A record was marked dispatched.
    MarkedDispatched {
        /// Which transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
    /// A transaction was fenced in its item (entity mode): the item's fence mark is at or
    /// above it, and its tombstone record is written.
    Fenced {
        /// The item.
        key: ItemKey,
        /// The transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
    /// A commit in entity mode applied.
    EntityCommitted {
        /// What was committed.
        commit: Box<EntityCommit>,
        /// When.
        at: Timestamp,
    },
    /// An entry left its item with its messages sent, the item keeping its sent mark
    /// ([`Store::settle_entry`]).
    EntrySettled {
        /// The item.
        key: ItemKey,
        /// The entry's transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
    /// Sent marks left their item past their time ([`Store::forget_marks`]).
    MarksForgotten {
        /// The item.
        key: ItemKey,
        /// The marks dropped, each with the time it was kept until.
        forgotten: Vec<(TxnId, Timestamp)>,
        /// When.
        at: Timestamp,
    },
    /// An entry was removed from its item.
    EntryRemoved {
        /// The item.
        key: ItemKey,
        /// The entry's transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
}

#[derive(Debug, Default)]
struct State {
    items: BTreeMap<String, Item>,
    /// Each item with a TTL by its expiry, for the sweep (an entry whose item has since
    /// been replaced is skipped when its time comes).
    expiries: BTreeSet<(Timestamp, String)>,
    /// What the store did, when a test asked for it ([`EmbeddedStore::record_history`]).
    history: Option<Vec<StoreEvent>>,
}

impl State {
    fn insert(&mut self, key: String, item: Item) {
        if let Some(at) = item.expires_at() {
            self.expiries.insert((at, key.clone()));
        }
        self.items.insert(key, item);
    }

    fn record(&mut self, event: impl FnOnce() -> StoreEvent) {
        if let Some(history) = &mut self.history {
            history.push(event());
        }
    }

    /// Removes the items expired at `now` (reads treat them as gone already).
    fn sweep(&mut self, now: Timestamp) {
        while let Some((at, key)) = self.expiries.first().cloned() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            if self.items.get(&key).is_some_and(|item| item.is_expired(now)) {
                self.items.remove(&key);
            }
        }
    }
}

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
}

fn outbox_key(txn_id: TxnId) -> String {
    txn_id.record_key()
}

fn idempotency_key(slot: &IdempotencySlot) -> String {
    format!("IDEM#{slot}")
}

impl EmbeddedStore {
    /// An empty table whose TTL follows `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
        }
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

/// The first failed condition of a commit, in the order the protocol wants them
/// reported: a used idempotency key (the request may be a repeat, to replay), then a
/// tombstone, then a business conflict.
fn first_failure(reasons: Vec<CommitError>) -> Option<CommitError> {
    let rank = |error: &CommitError| match error {
        CommitError::IdempotencyKeyUsed { .. } => 0,
        CommitError::Tombstoned { .. } | CommitError::Superseded { .. } => 1,
        _ => 2,
    };
    reasons.into_iter().min_by_key(rank)
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.sweep(now);
        let outbox_key = outbox_key(request.txn_id);
        let idem_key = request.idempotency.as_ref().map(|record| idempotency_key(&record.slot));

        let actions = request.writes.len() + 1 + usize::from(idem_key.is_some());
        if actions > MAX_TRANSACTION_ACTIONS {
            return Err(CommitError::TooLarge {
                reason: format!("{actions} actions, at most {MAX_TRANSACTION_ACTIONS}"),
            });
        }
        let bytes: usize = request
            .outbox
            .messages
            .iter()
            .map(|m| serde_json::to_string(m).map_or(0, |json| json.len()))
            .sum::<usize>()
            + request
                .writes
                .iter()
                .map(|write| match write {
                    BusinessWrite::Put { data, .. } => data.to_string().len(),
                    _ => 0,
                })
                .sum::<usize>();
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(CommitError::TooLarge {
                reason: format!("about {bytes} bytes, at most {MAX_TRANSACTION_BYTES}"),
            });
        }
        let mut keys: Vec<&str> = request.writes.iter().map(|write| write.key().as_str()).collect();
        keys.push(&outbox_key);
        keys.extend(idem_key.as_deref());
        keys.sort_unstable();
        if keys.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(CommitError::Invalid {
                reason: "two actions on one item".into(),
            });
        }

        let mut reasons = Vec::new();
        match Self::live(&state, &outbox_key, now) {
            None => {}
            // This transaction's own record: an earlier attempt applied. The commit is
            // atomic, so that attempt wrote everything; report success.
            Some(Item::Outbox(record)) if request.outbox.is_own(record) => return Ok(()),
            // A rival attempt's (a consumed message's record, written by another copy).
            Some(Item::Outbox(record)) if record.state != OutboxState::Tombstone => {
                reasons.push(CommitError::Superseded { txn_id: request.txn_id })
            }
            Some(_) => reasons.push(CommitError::Tombstoned { txn_id: request.txn_id }),
        }
        for write in &request.writes {
            let (current, holds_entries) = match Self::live(&state, write.key().as_str(), now) {
                Some(Item::Business { version, entries, .. }) => (Some(*version), !entries.is_empty()),
                _ => (None, false),
            };
            let expected = match write {
                BusinessWrite::Put { expected, .. } | BusinessWrite::Check { expected, .. } => *expected,
                BusinessWrite::Delete { version, .. } => ExpectedVersion::Exactly(*version),
            };
            // A delete would drop the entries of commits in entity mode that are still to
            // be dispatched: it waits until they are removed, and is tried again (a put
            // keeps them).
            if holds_entries && matches!(write, BusinessWrite::Delete { .. }) {
                return Err(CommitError::Contention(
                    "the item holds outbox entries still to be dispatched".into(),
                ));
            }
            let holds = match expected {
                ExpectedVersion::Absent => current.is_none(),
                ExpectedVersion::Exactly(version) => current == Some(version),
            };
            if !holds {
                reasons.push(CommitError::VersionConflict {
                    key: write.key().clone(),
                });
            }
        }
        if let (Some(key), Some(record)) = (&idem_key, &request.idempotency) {
            if Self::live(&state, key, now).is_some() {
                reasons.push(CommitError::IdempotencyKeyUsed {
                    slot: record.slot.clone(),
                });
            }
        }
        if let Some(error) = first_failure(reasons) {
            return Err(error);
        }

        for write in &request.writes {
            match write {
                BusinessWrite::Put { key, data, expected } => {
                    // An update of an existing item keeps its entries and its fence mark;
                    // a create keeps the mark a vacant key held.
                    let (entries, fence, sent) = match state.items.remove(key.as_str()) {
                        Some(Item::Business {
                            entries, fence, sent, ..
                        }) => (entries, fence, sent),
                        Some(Item::Vacant { fence }) => (BTreeMap::new(), Some(fence), BTreeMap::new()),
                        _ => (BTreeMap::new(), None, BTreeMap::new()),
                    };
                    let item = Item::Business {
                        version: expected.next(),
                        json: data.to_string().into_boxed_str(),
                        entries,
                        fence,
                        sent,
                    };
                    state.insert(key.as_str().to_owned(), item);
                }
                // A deleted item's fence mark stays with its key: a late commit of a
                // transaction fenced in it meets the mark again if the item is created
                // anew. Its sent marks move to their transactions' records, in the same
                // commit, so that no proof of a commit leaves with the item.
                BusinessWrite::Delete { key, .. } => {
                    if let Some(Item::Business { fence, sent, .. }) = state.items.remove(key.as_str()) {
                        if let Some(fence) = fence {
                            state.insert(key.as_str().to_owned(), Item::Vacant { fence });
                        }
                        for (txn_id, expires_at) in sent {
                            let record = OutboxRecord::committed(txn_id, Vec::new(), now, expires_at);
                            state.insert(txn_id.record_key(), Item::Outbox(Box::new(record)));
                            state.record(|| StoreEvent::MarkedDispatched { txn_id, at: now });
                        }
                    }
                }
                BusinessWrite::Check { .. } => {}
            }
        }
        state.insert(outbox_key, Item::Outbox(Box::new(request.outbox.clone())));
        if let (Some(key), Some(record)) = (idem_key, &request.idempotency) {
            state.insert(key, Item::Idempotency(Box::new(record.clone())));
        }
        state.record(|| StoreEvent::Committed {
            request: Box::new(request.clone()),
            at: now,
        });
        Ok(())
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
}

#[cfg(test)]
mod tests;
