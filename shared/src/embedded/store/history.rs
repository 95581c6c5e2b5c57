//! What the embedded store did, kept for tests that check invariants against it: the
//! [`StoreEvent`].

use std::collections::BTreeMap;

use crate::ports::{CommitRequest, EntityCommit, ItemKey};
use crate::protocol::{Applied, TxnId};
use crate::time::Timestamp;

/// Something the store did, for tests that check invariants against what really
/// happened rather than against what callers were told.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreEvent {
    /// A commit applied.
    Committed {
        /// What was committed.
        request: Box<CommitRequest>,
        /// The version each item it put or deleted is at after it (a deleted item's key
        /// stays at the version its delete left).
        versions: BTreeMap<ItemKey, u64>,
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
        /// The version the item is at after it.
        version: u64,
        /// When.
        at: Timestamp,
    },
    /// A position an in-order consumer keeps in a key was moved alone, the key's version
    /// left ([`Store::keep_applied`](crate::ports::Store::keep_applied)); only where it
    /// moved: a call that found the position at or above it wrote nothing.
    AppliedKept {
        /// The key.
        key: ItemKey,
        /// The position's name ([`crate::consumer::in_order::applied_name`]).
        name: String,
        /// Where it moved to.
        applied: Applied,
    },
    /// An entry left its item with its messages sent, the item keeping its sent mark
    /// ([`Store::settle_entry`](crate::ports::Store::settle_entry)).
    EntrySettled {
        /// The item.
        key: ItemKey,
        /// The entry's transaction.
        txn_id: TxnId,
        /// When.
        at: Timestamp,
    },
    /// Sent marks left their item past their time
    /// ([`Store::forget_marks`](crate::ports::Store::forget_marks)).
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
