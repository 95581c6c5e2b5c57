//! The transactions a request path has begun and not yet finished, so that abandoning one
//! refuses a commit of it that has not started and fences one that may have (entity mode),
//! whoever holds the transaction: a task spawned past the answer, a channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ports::ItemKey;
use crate::protocol::TxnId;

/// The live transactions of one request path (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Live(Mutex<HashMap<TxnId, LiveTxn>>);

#[derive(Debug, Clone)]
struct LiveTxn {
    /// The item it commits into, in entity mode.
    entity: Option<ItemKey>,
    /// Whether its commit began: an attempt may be on its way to the table.
    committing: bool,
}

/// What abandoning a transaction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Abandoned {
    /// Its commit had not begun, and now never will (nothing of it can land): the
    /// tombstone record settles it.
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

    /// Transaction `txn_id` began, committing into `entity` in entity mode; it is
    /// forgotten when the returned guard drops (its commit ended, or it was dropped).
    pub(super) fn begun(self: &Arc<Self>, txn_id: TxnId, entity: Option<ItemKey>) -> LiveGuard {
        self.lock().insert(
            txn_id,
            LiveTxn {
                entity,
                committing: false,
            },
        );
        LiveGuard {
            live: Arc::clone(self),
            txn_id,
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

    /// Abandons it: from now on its commit is refused, if it has not begun.
    pub(super) fn abandon(&self, txn_id: TxnId) -> Abandoned {
        match self.lock().remove(&txn_id) {
            Some(LiveTxn {
                committing: false, ..
            }) => Abandoned::BeforeCommit,
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
        self.live.lock().remove(&self.txn_id);
    }
}
