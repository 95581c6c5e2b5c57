//! The entity mode on the embedded table: an item's outbox entries live in the item, a
//! commit is one conditional write of it, and a removal touches only its entry.

use std::collections::BTreeMap;

use super::{EmbeddedStore, Item, State, StoreEvent};
use crate::ports::{CommitError, EntityCommit, EntityItem, ExpectedVersion, FenceOutcome, ItemKey, VersionedItem};
use crate::protocol::{OutboxRecord, OutboxState, TxnId};
use crate::time::Timestamp;

/// DynamoDB's 400 KB item limit.
const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Item `key` with its entries, as stored at `now`.
pub(super) fn read(state: &State, key: &ItemKey, now: Timestamp) -> Option<EntityItem> {
    match EmbeddedStore::live(state, key.as_str(), now) {
        Some(Item::Business { version, json, entries }) => Some(EntityItem {
            item: VersionedItem {
                key: key.clone(),
                version: *version,
                data: serde_json::from_str(json).expect("the store wrote this JSON itself"),
            },
            entries: entries.clone(),
        }),
        _ => None,
    }
}

/// One conditional write: the entry where the item holds none for its transaction, the
/// data where the version is as expected; the other entries kept.
pub(super) fn commit(state: &mut State, commit: &EntityCommit, now: Timestamp) -> Result<(), CommitError> {
    let key = commit.key.as_str();
    let txn_id = commit.entry.txn_id;
    let (current, mut entries) = match EmbeddedStore::live(state, key, now) {
        Some(Item::Business { version, entries, .. }) => (Some(*version), entries.clone()),
        _ => (None, BTreeMap::new()),
    };
    if let Some(found) = entries.get(&txn_id) {
        return if commit.entry.is_own(found) {
            Ok(())
        } else if found.state == OutboxState::Tombstone {
            Err(CommitError::Tombstoned { txn_id })
        } else {
            Err(CommitError::Superseded { txn_id })
        };
    }
    let holds = match commit.expected {
        ExpectedVersion::Absent => current.is_none(),
        ExpectedVersion::Exactly(version) => current == Some(version),
    };
    if !holds {
        return Err(CommitError::VersionConflict {
            key: commit.key.clone(),
        });
    }
    entries.insert(txn_id, commit.entry.clone());
    let json = commit.data.to_string();
    let bytes = json.len()
        + entries
            .values()
            .map(|entry| serde_json::to_string(entry).map_or(0, |json| json.len()))
            .sum::<usize>();
    if bytes > MAX_ITEM_BYTES {
        return Err(CommitError::TooLarge {
            reason: format!(
                "item {key} would be about {bytes} bytes with its outbox entries, at most {MAX_ITEM_BYTES}"
            ),
        });
    }
    let item = Item::Business {
        version: commit.expected.next(),
        json: json.into_boxed_str(),
        entries,
    };
    state.insert(key.to_owned(), item);
    state.record(|| StoreEvent::EntityCommitted {
        commit: Box::new(commit.clone()),
        at: now,
    });
    Ok(())
}

/// Drops `txn_id`'s entry from item `key`, if both are there.
pub(super) fn remove(state: &mut State, key: &ItemKey, txn_id: TxnId, now: Timestamp) {
    let removed = match state.items.get_mut(key.as_str()) {
        Some(Item::Business { entries, .. }) => entries.remove(&txn_id).is_some(),
        _ => false,
    };
    if removed {
        state.record(|| StoreEvent::EntryRemoved {
            key: key.clone(),
            txn_id,
            at: now,
        });
    }
}

/// A tombstone in `txn_id`'s entry slot of item `key`, where the slot is empty (the caller
/// checked that the transaction has no record).
pub(super) fn fence(
    state: &mut State,
    key: &ItemKey,
    txn_id: TxnId,
    now: Timestamp,
    expires_at: Timestamp,
    clock_now: Timestamp,
) -> FenceOutcome {
    let Some(Item::Business { entries, .. }) = state.items.get_mut(key.as_str()) else {
        return FenceOutcome::NoItem;
    };
    match entries.get(&txn_id) {
        Some(found) if found.state == OutboxState::Tombstone => FenceOutcome::Fenced,
        Some(found) => FenceOutcome::Committed(found.clone()),
        None => {
            entries.insert(txn_id, OutboxRecord::tombstone(txn_id, now, expires_at));
            state.record(|| StoreEvent::Tombstoned { txn_id, at: clock_now });
            FenceOutcome::Fenced
        }
    }
}
