//! The transactions a request path has begun and not yet finished, so that abandoning one
//! refuses a commit of it that has not started and fences one that may have (entity mode),
//! whoever holds the transaction: a task spawned past the answer, a channel. Abandoning one
//! whose control message was not sent refuses that send too: nothing of it ever leaves the
//! process, so nothing needs settling.
//!
//! A transaction is forgotten when it is dropped, unless its commit was cut off midway
//! (its future dropped: a timeout, an aborted task, a client gone) with an attempt perhaps
//! on its way: that one stays, so that abandoning it later still fences it, until
//! abandoned or until its commit window has passed (by the request path's clock; the
//! worker fences it then, so forgetting it costs nothing but that: memory, not safety).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ports::ItemKey;
use crate::protocol::TxnId;
use crate::time::Timestamp;

/// The live transactions of one request path (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Live(Mutex<HashMap<TxnId, LiveTxn>>);

#[derive(Debug, Clone)]
struct LiveTxn {
    /// The item it commits into, in entity mode.
    entity: Option<ItemKey>,
    /// Whether its control message's send began and did not fail: the message is on its
    /// way, or out.
    sent: bool,
    /// Whether its commit began: an attempt may be on its way to the table.
    committing: bool,
    /// When its commit window ends (its control message fences it after), once its
    /// control message's send began; before that it has no window.
    window_end: Option<Timestamp>,
}

/// What abandoning a transaction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// Neither its control message nor its commit had been sent, and now neither ever
    /// will be: nothing of it exists outside the process, and nothing needs settling.
    Unsent,
    /// Its control message may be out, its commit had not begun and now never will
    /// (nothing of it can land): the tombstone record settles it.
    BeforeCommit,
    /// Its commit began: an attempt may land, into this item in entity mode (`None`:
    /// the transactional form, which the tombstone record blocks).
    WhileCommitting(Option<ItemKey>),
    /// Not a transaction of this request path still alive (finished, begun elsewhere).
    Unknown,
}

impl Live {
    fn lock(&self) -> MutexGuard<'_, HashMap<TxnId, LiveTxn>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Transaction `txn_id` began at `now`, committing into `entity` in entity mode; it
    /// is forgotten when the returned guard drops (its commit ended, or it was dropped).
    /// Commits cut off midway whose window has passed are forgotten here.
    pub(super) fn begun(self: &Arc<Self>, txn_id: TxnId, entity: Option<ItemKey>, now: Timestamp) -> LiveGuard {
        let mut live = self.lock();
        live.retain(|_, txn| !(txn.committing && txn.window_end.is_some_and(|end| end < now)));
        live.insert(
            txn_id,
            LiveTxn {
                entity,
                sent: false,
                committing: false,
                window_end: None,
            },
        );
        drop(live);
        LiveGuard {
            live: Arc::clone(self),
            txn_id,
        }
    }

    /// Its control message's send begins, its commit window ending at `window_end`:
    /// `false` if it was abandoned (the message must not be sent).
    pub(super) fn start_send(&self, txn_id: TxnId, window_end: Timestamp) -> bool {
        match self.lock().get_mut(&txn_id) {
            Some(txn) => {
                txn.sent = true;
                txn.window_end.get_or_insert(window_end);
                true
            }
            None => false,
        }
    }

    /// Its control message's send failed (or was cut short): as if it had never begun,
    /// since the transaction can no longer commit and a message that got through anyway
    /// only tombstones it.
    pub(super) fn send_failed(&self, txn_id: TxnId) {
        if let Some(txn) = self.lock().get_mut(&txn_id) {
            txn.sent = false;
        }
    }

    /// Its commit begins: `false` if it was abandoned (the commit must not be tried).
    pub(super) fn start_commit(&self, txn_id: TxnId) -> bool {
        match self.lock().get_mut(&txn_id) {
            Some(txn) => {
                txn.committing = true;
                true
            }
            None => false,
        }
    }

    /// Its commit ran to its end (answered; settled where it failed, or left to its
    /// control message where even that could not be written): it is forgotten (its guard
    /// may have dropped already), and an abandon of it is left to the control message.
    pub(super) fn finish_commit(&self, txn_id: TxnId) {
        self.lock().remove(&txn_id);
    }

    /// Abandons it: from now on its commit is refused, if it has not begun, and so is the
    /// send of its control message.
    pub(super) fn abandon(&self, txn_id: TxnId) -> Abandoned {
        match self.lock().remove(&txn_id) {
            Some(LiveTxn {
                sent: false,
                committing: false,
                ..
            }) => Abandoned::Unsent,
            Some(LiveTxn { committing: false, .. }) => Abandoned::BeforeCommit,
            Some(LiveTxn { entity, .. }) => Abandoned::WhileCommitting(entity),
            None => Abandoned::Unknown,
        }
    }
}

/// Forgets its transaction when dropped.
#[derive(Debug)]
pub(super) struct LiveGuard {
    live: Arc<Live>,
    txn_id: TxnId,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut live = self.live.lock();
        // A commit that began and has not finished (cut off midway, or finishing right
        // now, which then forgets it) may have an attempt on its way: kept for its abandon.
        if !live.get(&self.txn_id).is_some_and(|txn| txn.committing) {
            live.remove(&self.txn_id);
        }
    }
}
