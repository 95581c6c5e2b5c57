//! The embedded table's items as held, and the state that holds them: the items by key,
//! the index by expiry that the sweep of expired records follows, and the history when a
//! test asked for it.

use std::collections::{BTreeMap, BTreeSet};

use super::history::StoreEvent;
use crate::ports::KeptMessage;
use crate::protocol::{AppliedPositions, ChainHeads, IdempotencyRecord, IdempotencySlot, OutboxRecord, TxnId};
use crate::time::Timestamp;

/// DynamoDB's 400 KB item limit, counted on the data's JSON text and the item's outbox
/// entries (DynamoDB counts attribute names and values: within a few KB of the limit the
/// two may disagree).
pub(super) const MAX_ITEM_BYTES: usize = 400 * 1024;

/// An item as held: a business item's data as JSON text (a JSON value in memory takes
/// several times its text, and a long-running server holds every order), the records
/// boxed so that the map's nodes stay small.
#[derive(Debug, Clone)]
pub(super) enum Item {
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
        /// Its chains' heads ([`crate::protocol::Position`]), which its key keeps.
        heads: ChainHeads,
        /// The positions in-order consumers keep in it, which its key keeps.
        applied: AppliedPositions,
    },
    /// A business key without an item: the item was deleted (the key keeps its version,
    /// which a create continues), or a fence found no item (version 0). Read as absent; a
    /// create keeps the fence mark.
    Vacant {
        fence: Option<TxnId>,
        version: u64,
        heads: ChainHeads,
        applied: AppliedPositions,
    },
    Outbox(Box<OutboxRecord>),
    Idempotency(Box<IdempotencyRecord>),
    /// A message an in-order consumer keeps until its predecessor is applied.
    Kept(Box<KeptMessage>),
}

impl Item {
    /// Whether it holds a business item, and the version of its key (0: a key never
    /// written); `None` for a record.
    pub(super) fn key_version(&self) -> Option<(bool, u64)> {
        self.key_state().map(|(live, version, _)| (live, version))
    }

    /// [`Self::key_version`] with the key's chain heads.
    pub(super) fn key_state(&self) -> Option<(bool, u64, &ChainHeads)> {
        match self {
            Self::Business { version, heads, .. } => Some((true, *version, heads)),
            Self::Vacant { version, heads, .. } => Some((false, *version, heads)),
            Self::Outbox(_) | Self::Idempotency(_) | Self::Kept(_) => None,
        }
    }

    pub(super) fn is_expired(&self, now: Timestamp) -> bool {
        match self {
            Self::Business { .. } | Self::Vacant { .. } => false,
            Self::Outbox(record) => record.is_expired(now),
            Self::Idempotency(record) => record.is_expired(now),
            Self::Kept(kept) => kept.expires_at <= now,
        }
    }

    pub(super) fn expires_at(&self) -> Option<Timestamp> {
        match self {
            Self::Business { .. } | Self::Vacant { .. } => None,
            Self::Outbox(record) => record.expires_at,
            Self::Idempotency(record) => Some(record.expires_at),
            Self::Kept(kept) => Some(kept.expires_at),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) items: BTreeMap<String, Item>,
    /// Each item with a TTL by its expiry, for the sweep (an entry whose item has since
    /// been replaced is skipped when its time comes).
    pub(super) expiries: BTreeSet<(Timestamp, String)>,
    /// What the store did, when a test asked for it
    /// ([`EmbeddedStore::record_history`](super::EmbeddedStore::record_history)).
    pub(super) history: Option<Vec<StoreEvent>>,
}

impl State {
    pub(super) fn insert(&mut self, key: String, item: Item) {
        if let Some(at) = item.expires_at() {
            self.expiries.insert((at, key.clone()));
        }
        self.items.insert(key, item);
    }

    pub(super) fn record(&mut self, event: impl FnOnce() -> StoreEvent) {
        if let Some(history) = &mut self.history {
            history.push(event());
        }
    }

    /// Removes the items expired at `now` (reads treat them as gone already).
    pub(super) fn sweep(&mut self, now: Timestamp) {
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

pub(super) fn outbox_key(txn_id: TxnId) -> String {
    txn_id.record_key()
}

pub(super) fn idempotency_key(slot: &IdempotencySlot) -> String {
    format!("IDEM#{slot}")
}
