//! What goes out before a transaction's messages where a destination keeps order: the
//! earlier committed transactions of its entity that are still unsent.
//!
//! They are found in two places. The entity's pending entries (entity mode) are in the
//! item, which the transaction read. A transaction committed in the transactional form
//! (an idempotency record, native actions, an entry too big for the item) has its record
//! beside the item instead; the item's chain heads name it, so each positioned message
//! names the transaction before it on its chain ([`Position::previous`]), and a publisher
//! reads that record and, where it is still pending, the records it names in turn.
//!
//! [`Position::previous`]: crate::protocol::Position::previous

use std::collections::BTreeSet;

use crate::ports::{ItemKey, Store, StoreError};
use crate::protocol::{commit_order, DestinationName, OutboxRecord, OutboxState, TxnId};

/// The records one search reads at most. Beyond, the transaction is not published now
/// ([`EarlierError::TooMany`]): the oldest of the run go first, through their own control
/// messages, and the run drains in order.
pub(crate) const MAX_RECORDS_READ: usize = 16;

/// Why the earlier transactions still unsent could not all be found.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EarlierError {
    /// A read failed: whether an earlier transaction is unsent is unknown.
    #[error("reading the entity's earlier transactions failed")]
    Read(#[source] StoreError),
    /// More earlier transactions are unsent than one search reads.
    #[error("more than {MAX_RECORDS_READ} earlier transactions of entity {entity} are unsent")]
    TooMany {
        /// The entity.
        entity: ItemKey,
    },
}

/// An earlier transaction of the entity whose messages are still unsent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Earlier {
    /// Its entry in the entity (entity mode).
    Entry(ItemKey, OutboxRecord),
    /// Its record (the transactional form).
    Record(OutboxRecord),
}

impl Earlier {
    /// What it committed.
    pub(crate) fn record(&self) -> &OutboxRecord {
        match self {
            Self::Entry(_, record) | Self::Record(record) => record,
        }
    }
}

/// The pending entries of `entries` of transactions other than `txn_id`, in commit order
/// ([`commit_order`]). A consumer's entry (its attempt named) is left out: it is the
/// consumer's to publish and settle, after its dedup record.
pub(crate) fn pending_entries<'a>(
    entries: impl IntoIterator<Item = &'a OutboxRecord>,
    txn_id: TxnId,
) -> Vec<OutboxRecord> {
    let mut pending: Vec<OutboxRecord> = entries
        .into_iter()
        .filter(|entry| entry.txn_id != txn_id && entry.state == OutboxState::Pending && entry.attempt.is_none())
        .cloned()
        .collect();
    pending.sort_by_key(commit_order);
    pending
}

/// The [`pending_entries`] of `entries` that come before `record` in commit order.
pub(crate) fn entries_before<'a>(
    entries: impl IntoIterator<Item = &'a OutboxRecord>,
    record: &OutboxRecord,
) -> Vec<OutboxRecord> {
    let before = commit_order(record);
    let mut earlier = pending_entries(entries, record.txn_id);
    earlier.retain(|entry| commit_order(entry) < before);
    earlier
}

/// The transactions `record`'s messages to destinations that keep order name as their
/// chains' previous ones.
fn previous(record: &OutboxRecord, keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync)) -> Vec<TxnId> {
    record
        .messages
        .iter()
        .filter(|message| keeps_order(&message.destination))
        .filter_map(|message| message.position.as_ref().and_then(|position| position.previous))
        .collect()
}

/// Whether any of `record`'s messages has its place in an entity's history on a
/// destination that keeps order: only then can an earlier transaction have to go first.
pub(crate) fn is_ordered(record: &OutboxRecord, keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync)) -> bool {
    record
        .messages
        .iter()
        .any(|message| message.position.is_some() && keeps_order(&message.destination))
}

/// The entity `key`'s transactions before `record` that are still unsent, in commit
/// order: its `entries` (pending entries of `key` before `record`, [`entries_before`])
/// and the pending records their chains and `record`'s name before them, read from
/// `store`. A record found dispatched, or gone, was sent (a pending record never
/// expires); so was a transaction `sent_whole` names (every message of it went out, after
/// the transactions before it), and so were the entries before it: what comes before it
/// is not looked for. An error leaves the question open: the caller publishes nothing of
/// `record` now and leaves it to a later try.
pub(crate) async fn unsent_before(
    store: &dyn Store,
    keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync),
    key: &ItemKey,
    entries: Vec<OutboxRecord>,
    record: &OutboxRecord,
    sent_whole: &(dyn Fn(TxnId) -> bool + Sync),
) -> Result<Vec<Earlier>, EarlierError> {
    // The entries are in commit order: those up to the newest one sent whole went out
    // before it (its publisher sent them first, or they were sent before it read them).
    let mut known: BTreeSet<TxnId> = entries.iter().map(|entry| entry.txn_id).collect();
    known.insert(record.txn_id);
    let mut entries = entries;
    if let Some(newest) = entries.iter().rposition(|entry| sent_whole(entry.txn_id)) {
        entries.drain(..=newest);
    }
    let mut to_read: Vec<TxnId> = previous(record, keeps_order);
    for entry in &entries {
        to_read.extend(previous(entry, keeps_order));
    }
    let mut found: Vec<Earlier> = entries
        .into_iter()
        .map(|entry| Earlier::Entry(key.clone(), entry))
        .collect();
    let mut reads = 0;
    while let Some(txn_id) = to_read.pop() {
        if !known.insert(txn_id) || sent_whole(txn_id) {
            continue;
        }
        if reads == MAX_RECORDS_READ {
            return Err(EarlierError::TooMany { entity: key.clone() });
        }
        reads += 1;
        let mut records = store.get_outboxes_each(&[txn_id]).await.map_err(EarlierError::Read)?;
        match records.remove(&txn_id) {
            Some(Ok(earlier)) if earlier.state == OutboxState::Pending && earlier.attempt.is_none() => {
                to_read.extend(previous(&earlier, keeps_order));
                found.push(Earlier::Record(earlier));
            }
            Some(Err(error)) => return Err(EarlierError::Read(error)),
            _ => {}
        }
    }
    found.sort_by_key(|earlier| commit_order(earlier.record()));
    Ok(found)
}
