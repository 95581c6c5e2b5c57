//! The entity mode on the embedded table: an item's outbox entries live in the item, a
//! commit is one conditional write of it, a removal touches only its entry, a settling
//! leaves a sent mark in its place, and a fence raises the item's fence mark.

use std::collections::BTreeMap;

use super::state::MAX_ITEM_BYTES;
use super::{EmbeddedStore, Item, State, StoreEvent};
use crate::ports::{CommitError, EntityCommit, EntityItem, ExpectedVersion, ItemKey, VersionedItem};
use crate::protocol::{advance_chain, Applied, AppliedPositions, ChainHeads, OutboxRecord, TxnId};
use crate::time::Timestamp;

/// Item `key` with its entries, as stored at `now`.
pub(super) fn read(state: &State, key: &ItemKey, now: Timestamp) -> Option<EntityItem> {
    match EmbeddedStore::live(state, key.as_str(), now) {
        Some(Item::Business {
            version,
            json,
            entries,
            fence,
            sent,
            applied,
            ..
        }) => Some(EntityItem {
            item: VersionedItem {
                key: key.clone(),
                version: *version,
                data: serde_json::from_str(json).expect("the store wrote this JSON itself"),
            },
            entries: entries.clone(),
            fence: *fence,
            sent: sent.clone(),
            applied: applied.clone(),
        }),
        _ => None,
    }
}

/// One conditional write: the entry where the item holds none for its transaction, the
/// data where the version is as expected; the other entries kept.
pub(super) fn commit(state: &mut State, commit: &EntityCommit, now: Timestamp) -> Result<(), CommitError> {
    let key = commit.key.as_str();
    let txn_id = commit.entry.txn_id;
    commit.check_entry()?;
    let (live, version, mut entries, fence, sent, mut heads, mut applied) = match EmbeddedStore::live(state, key, now) {
        Some(Item::Business {
            version,
            entries,
            fence,
            sent,
            heads,
            applied,
            ..
        }) => (
            true,
            *version,
            entries.clone(),
            *fence,
            sent.clone(),
            heads.clone(),
            applied.clone(),
        ),
        Some(Item::Vacant {
            fence,
            version,
            heads,
            applied,
        }) => (
            false,
            *version,
            BTreeMap::new(),
            *fence,
            BTreeMap::new(),
            heads.clone(),
            applied.clone(),
        ),
        _ => (
            false,
            0,
            BTreeMap::new(),
            None,
            BTreeMap::new(),
            ChainHeads::new(),
            AppliedPositions::new(),
        ),
    };
    if let Some(found) = entries.get(&txn_id) {
        return if commit.entry.is_own(found) {
            Ok(())
        } else {
            Err(CommitError::Superseded { txn_id })
        };
    }
    if commit.checks_fence && fence.is_some_and(|fence| fence >= txn_id) {
        return Err(CommitError::EntityFenced { txn_id });
    }
    if !commit.expected.holds(live, version) {
        return Err(CommitError::VersionConflict {
            key: commit.key.clone(),
        });
    }
    // A position only moves up: one at or above the commit's was moved by another copy
    // meanwhile (without changing the version), and the message was applied.
    if let Some((name, position)) = &commit.applied {
        if applied.get(name).is_some_and(|held| held.seq >= position.seq) {
            return Err(CommitError::VersionConflict {
                key: commit.key.clone(),
            });
        }
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
    advance_chain(&mut heads, &commit.key, &commit.entry.messages);
    if let Some((name, position)) = &commit.applied {
        applied.insert(name.clone(), *position);
    }
    let item = Item::Business {
        version: version + 1,
        json: json.into_boxed_str(),
        entries,
        fence,
        sent,
        heads,
        applied,
    };
    state.insert(key.to_owned(), item);
    state.record(|| StoreEvent::EntityCommitted {
        commit: Box::new(commit.clone()),
        version: version + 1,
        at: now,
    });
    Ok(())
}

/// Sets position `name` of key `key` to `applied` where the key is as `expected` and the
/// position below it; nothing else changes (see [`crate::ports::Store::keep_applied`]).
pub(super) fn keep_applied(
    state: &mut State,
    key: &ItemKey,
    expected: ExpectedVersion,
    name: &str,
    applied: Applied,
) -> Result<(), CommitError> {
    let (live, version, positions) = match state.items.get_mut(key.as_str()) {
        Some(Item::Business { version, applied, .. }) => (true, *version, Some(applied)),
        Some(Item::Vacant { version, applied, .. }) => (false, *version, Some(applied)),
        _ => (false, 0, None),
    };
    if positions
        .as_ref()
        .and_then(|positions| positions.get(name))
        .is_some_and(|held| held.seq >= applied.seq)
    {
        return Ok(());
    }
    if !expected.holds(live, version) {
        return Err(CommitError::VersionConflict { key: key.clone() });
    }
    match positions {
        Some(positions) => {
            positions.insert(name.to_owned(), applied);
        }
        None => {
            let vacant = Item::Vacant {
                fence: None,
                version: 0,
                heads: ChainHeads::new(),
                applied: AppliedPositions::from([(name.to_owned(), applied)]),
            };
            state.insert(key.as_str().to_owned(), vacant);
        }
    }
    state.record(|| StoreEvent::AppliedKept {
        key: key.clone(),
        name: name.to_owned(),
        applied,
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

/// Transaction `txn_id`'s committed entry in item `key`, if it is there.
pub(super) fn entry(state: &State, key: &ItemKey, txn_id: TxnId) -> Option<OutboxRecord> {
    match state.items.get(key.as_str()) {
        Some(Item::Business { entries, .. }) => entries.get(&txn_id).cloned(),
        _ => None,
    }
}

/// Raises item `key`'s fence mark to `txn_id` where it is below (the caller checked that
/// the item holds no entry of it); a key without an item keeps the mark in a vacant item.
pub(super) fn raise_fence(state: &mut State, key: &ItemKey, txn_id: TxnId) {
    match state.items.get_mut(key.as_str()) {
        Some(Item::Business { fence, .. }) => {
            *fence = (*fence).max(Some(txn_id));
        }
        Some(Item::Vacant { fence, .. }) => *fence = (*fence).max(Some(txn_id)),
        _ => {
            let vacant = Item::Vacant {
                fence: Some(txn_id),
                version: 0,
                heads: ChainHeads::new(),
                applied: AppliedPositions::new(),
            };
            state.insert(key.as_str().to_owned(), vacant);
        }
    }
}

/// Whether item `key` holds transaction `txn_id`'s sent mark.
pub(super) fn has_sent_mark(state: &State, key: &ItemKey, txn_id: TxnId) -> bool {
    match state.items.get(key.as_str()) {
        Some(Item::Business { sent, .. }) => sent.contains_key(&txn_id),
        _ => false,
    }
}

/// Moves `txn_id`'s entry out of item `key` and leaves its sent mark, if the entry is
/// there and the item holds fewer than `max_marks` (one write: nothing else of the item
/// changes). False where the entry is there but the item is full: the caller takes the
/// two writes.
pub(super) fn settle(
    state: &mut State,
    key: &ItemKey,
    txn_id: TxnId,
    expires_at: Timestamp,
    max_marks: usize,
    now: Timestamp,
) -> bool {
    match state.items.get_mut(key.as_str()) {
        Some(Item::Business { entries, sent, .. }) if entries.contains_key(&txn_id) => {
            if sent.len() >= max_marks {
                return false;
            }
            entries.remove(&txn_id);
            sent.insert(txn_id, expires_at);
            state.record(|| StoreEvent::EntrySettled {
                key: key.clone(),
                txn_id,
                at: now,
            });
            true
        }
        _ => true,
    }
}

/// Drops the sent marks of `forgotten` from item `key`, where they are.
pub(super) fn drop_marks(state: &mut State, key: &ItemKey, forgotten: &[TxnId], now: Timestamp) {
    let Some(Item::Business { sent, .. }) = state.items.get_mut(key.as_str()) else {
        return;
    };
    let forgotten: Vec<(TxnId, Timestamp)> = forgotten
        .iter()
        .filter_map(|txn_id| sent.remove(txn_id).map(|until| (*txn_id, until)))
        .collect();
    if !forgotten.is_empty() {
        state.record(|| StoreEvent::MarksForgotten {
            key: key.clone(),
            forgotten,
            at: now,
        });
    }
}
