//! An operator's release of a parked transaction: one whose message a destination
//! refuses for good, which holds back it and, where order is kept, every later
//! transaction of its entity. The release publishes what its destinations take, skips
//! (and logs) what they refuse for good, and settles the transaction, so its entity's
//! chain moves on. Order is never skipped without a person deciding.

use super::ControlPath;
use crate::control::{ControlError, ControlOutcome};
use crate::ports::{ControlDelivery, ItemKey, StoreError};
use crate::protocol::{ControlMessage, OutboxState, TxnId};

/// Why a release did not settle its transaction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// Reading the transaction's record (or its entity) failed.
    #[error("reading transaction {txn_id} failed")]
    Read {
        /// The transaction.
        txn_id: TxnId,
        /// What failed.
        #[source]
        source: StoreError,
    },
    /// No pending record or entry of the transaction: nothing is parked.
    #[error("transaction {txn_id} has nothing pending to release ({found})")]
    NothingPending {
        /// The transaction.
        txn_id: TxnId,
        /// What was found instead.
        found: String,
    },
    /// Its dispatch failed for another reason than a refusal (a destination unavailable,
    /// the mark): nothing was skipped that could go; try again.
    #[error("releasing transaction {txn_id} failed")]
    Dispatch {
        /// The transaction.
        txn_id: TxnId,
        /// What failed.
        #[source]
        source: ControlError,
    },
}

impl ControlPath {
    /// Releases transaction `txn_id` (committed into `entity` in entity mode): its pending
    /// record, or entry, is dispatched as the worker would, except that a message a
    /// destination refuses for good is skipped ([`ControlPath::releasing_refused`]);
    /// each skipped message is logged at error. Refused where nothing of it is pending.
    pub async fn release(&self, txn_id: TxnId, entity: Option<ItemKey>) -> Result<ControlOutcome, ReleaseError> {
        let store = &self.ports.store;
        let read = |source| ReleaseError::Read { txn_id, source };
        let record = match &entity {
            Some(key) => store
                .get_entity(key)
                .await
                .map_err(read)?
                .and_then(|item| item.entries.get(&txn_id).cloned()),
            None => None,
        };
        let record = match record {
            Some(entry) => entry,
            None => store
                .get_outboxes(&[txn_id])
                .await
                .map_err(read)?
                .remove(&txn_id)
                .ok_or_else(|| ReleaseError::NothingPending {
                    txn_id,
                    found: "no record".into(),
                })?,
        };
        if record.state != OutboxState::Pending {
            return Err(ReleaseError::NothingPending {
                txn_id,
                found: format!("its record is {:?}", record.state),
            });
        }
        let mut message = ControlMessage::first(txn_id, record.created_at);
        if let Some(key) = entity {
            message = message.with_entity(key);
        }
        let delivery = ControlDelivery {
            message_id: format!("release-{txn_id}"),
            receipt: String::new(),
            body: message.encode(),
            receive_count: 1,
        };
        let releasing = self.clone().releasing_refused();
        releasing
            .handle(&delivery)
            .await
            .result
            .map_err(|source| ReleaseError::Dispatch { txn_id, source })
    }
}
