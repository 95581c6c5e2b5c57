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
//! A consumer that publishes is a producer like any other: its commits (an entry in the
//! entity in entity mode, a record of its own otherwise, each naming the consumer's
//! attempt) take their place in the chain, and the search follows the chain through them
//! as through the request path's and the worker's. Every publisher sends the entity's
//! earlier unsent transactions before its own, so a record found dispatched means that
//! everything before it went out, whoever published it. What differs is who may settle a
//! consumer's commit: only its consumer, after its dedup record (settled by another, a
//! copy of the message would apply again, or its dedup record would expire too early). A
//! consumer publishing finds them and sends them first ([`Consumers::Send`]); the request
//! path and the worker, which settle what they send first, wait for them instead
//! ([`Consumers::Wait`]).
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

/// What a search does with an earlier commit of a consumer (its attempt named) that is
/// still unsent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consumers {
    /// Finds it, to be sent first and left to its consumer to settle: the search of a
    /// consumer, which never settles an earlier transaction.
    Send,
    /// Where it goes to a destination that keeps order before the transaction published,
    /// the transaction waits ([`EarlierError::Read`] with [`StoreError::Contention`]): the
    /// search of the request path and the worker, which settle what they send first. The
    /// consumer sends it (and what is before it), and then the transaction can go.
    Wait,
}

/// Whether `record` is a consumer's commit (its attempt named).
fn is_consumers(record: &OutboxRecord) -> bool {
    record.attempt.is_some()
}

/// The pending entries of `entries` of transactions other than `txn_id`, in commit order
/// ([`commit_order`]), a consumer's (its attempt named) among them: each is an earlier
/// commit of the entity ([`unsent_before`] says what becomes of a consumer's).
pub(crate) fn pending_entries<'a>(
    entries: impl IntoIterator<Item = &'a OutboxRecord>,
    txn_id: TxnId,
) -> Vec<OutboxRecord> {
    let mut pending: Vec<OutboxRecord> = entries
        .into_iter()
        .filter(|entry| entry.txn_id != txn_id && entry.state == OutboxState::Pending)
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
/// `store`, through commits of every kind (the request path's, the worker's, a
/// consumer's). A record found dispatched, or gone, was sent (a pending record never
/// expires), and so was everything before it (every publisher sends an entity's earlier
/// transactions before its own); so was a transaction `sent_whole` names (every message
/// of it went out, after the transactions before it), and so were the entries before it:
/// what comes before it is not looked for. An error leaves the question open: the caller
/// publishes nothing of `record` now and leaves it to a later try.
///
/// This is the search of the request path and the worker, which settle what they send
/// first: a consumer's unsent commit on a destination that keeps order makes `record`
/// wait for its consumer ([`Consumers::Wait`]).
pub(crate) async fn unsent_before(
    store: &dyn Store,
    keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync),
    key: &ItemKey,
    entries: Vec<OutboxRecord>,
    record: &OutboxRecord,
    sent_whole: &(dyn Fn(TxnId) -> bool + Sync),
) -> Result<Vec<Earlier>, EarlierError> {
    search(store, keeps_order, key, entries, record, sent_whole, Consumers::Wait).await
}

/// [`unsent_before`], with a consumer's unsent commits found as the others are
/// ([`Consumers::Send`]): the search of a consumer publishing its own commit, which sends
/// what it finds first and settles none of it.
pub(crate) async fn unsent_before_sending(
    store: &dyn Store,
    keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync),
    key: &ItemKey,
    entries: Vec<OutboxRecord>,
    record: &OutboxRecord,
) -> Result<Vec<Earlier>, EarlierError> {
    search(store, keeps_order, key, entries, record, &|_| false, Consumers::Send).await
}

/// Where `consumers` says [`Consumers::Wait`], whether `earlier`, a consumer's unsent
/// commit, holds `record` back: it goes to a destination that keeps order, as `record`
/// does. Then the error that says so.
fn waits_for(
    consumers: Consumers,
    keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync),
    key: &ItemKey,
    earlier: &OutboxRecord,
    record: &OutboxRecord,
) -> Option<EarlierError> {
    let holds_back = consumers == Consumers::Wait
        && is_consumers(earlier)
        && is_ordered(earlier, keeps_order)
        && is_ordered(record, keeps_order);
    holds_back.then(|| {
        EarlierError::Read(StoreError::Contention(
            format!(
                "transaction {} of entity {key}, committed by a consumer before {}, is still unsent: its consumer sends it (and what is before it) first",
                earlier.txn_id, record.txn_id
            )
            .into(),
        ))
    })
}

async fn search(
    store: &dyn Store,
    keeps_order: &(dyn Fn(&DestinationName) -> bool + Sync),
    key: &ItemKey,
    entries: Vec<OutboxRecord>,
    record: &OutboxRecord,
    sent_whole: &(dyn Fn(TxnId) -> bool + Sync),
    consumers: Consumers,
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
        if let Some(wait) = waits_for(consumers, keeps_order, key, entry, record) {
            return Err(wait);
        }
    }
    // Where the search waits for consumers, theirs that it does not wait for (nothing of
    // them keeps order, or nothing of `record`) are left to them: the chains they name
    // are followed all the same.
    let mut found: Vec<Earlier> = entries
        .into_iter()
        .filter(|entry| consumers == Consumers::Send || !is_consumers(entry))
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
            Some(Ok(earlier)) if earlier.state == OutboxState::Pending => {
                if let Some(wait) = waits_for(consumers, keeps_order, key, &earlier, record) {
                    return Err(wait);
                }
                // A consumer's pending record is followed as any other: the transactions
                // before it may be unsent too (its consumer had not sent them yet).
                to_read.extend(previous(&earlier, keeps_order));
                if consumers == Consumers::Send || !is_consumers(&earlier) {
                    found.push(Earlier::Record(earlier));
                }
            }
            Some(Err(error)) => return Err(EarlierError::Read(error)),
            _ => {}
        }
    }
    found.sort_by_key(|earlier| commit_order(earlier.record()));
    Ok(found)
}
