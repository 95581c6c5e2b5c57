//! Why a transaction did not commit, or that its outcome is unknown.

use crate::ports::{CommitError, ItemKey, QueueError, StoreError};
use crate::protocol::{IdempotencySlot, TxnId};

/// Why a transaction did not commit, or that its outcome is unknown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// The control message could not be sent (at the commit, or when the handler sent it
    /// early, [`crate::request::Transaction::send_control`]); nothing was written.
    #[error("transaction {txn_id}: the control message could not be sent")]
    ControlSend {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: QueueError,
    },
    /// A read failed; nothing was written.
    #[error("transaction {txn_id}: a read failed")]
    Read {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The commit window had passed (or a tombstone was found): nothing was written,
    /// and this transaction can never commit. Starting again is safe.
    #[error("transaction {txn_id}: the commit window has expired")]
    CommitWindowExpired {
        /// The transaction.
        txn_id: TxnId,
    },
    /// The request's deadline came before the commit was tried; nothing was written,
    /// and this transaction can never commit now (if its control message was sent, the
    /// request path or that message tombstones it; if not, nothing of it was sent).
    #[error("transaction {txn_id}: the request's deadline passed before the commit")]
    DeadlineExceeded {
        /// The transaction.
        txn_id: TxnId,
    },
    /// A business item changed since it was read; nothing was written.
    #[error("transaction {txn_id}: item {key} changed concurrently")]
    VersionConflict {
        /// The transaction.
        txn_id: TxnId,
        /// The item.
        key: ItemKey,
    },
    /// An addition to a counter of the transaction's entity ([`crate::request::Transaction::add`])
    /// would take it out of its bounds, or the field holds no whole number: the business
    /// rule refused the change, and nothing was written.
    #[error("transaction {txn_id}: {refusal}")]
    Refused {
        /// The transaction.
        txn_id: TxnId,
        /// Which bound, and what the field holds.
        refusal: crate::counter::Refusal,
    },
    /// The item the transaction adds to ([`crate::request::Transaction::add`]) is not
    /// there; nothing was written.
    #[error("transaction {txn_id}: item {key} does not exist")]
    NoSuchItem {
        /// The transaction.
        txn_id: TxnId,
        /// The item.
        key: ItemKey,
    },
    /// One of the application's native actions was cancelled (its condition failed, or
    /// DynamoDB refused it); nothing was written. See [`crate::native`].
    #[error("transaction {txn_id}: the application's action {index} was cancelled ({code})")]
    ActionCancelled {
        /// The transaction.
        txn_id: TxnId,
        /// The action's index, as [`crate::native::NativeTransaction::action`] returned it.
        index: usize,
        /// DynamoDB's cancellation code (`ConditionalCheckFailed`, ...).
        code: String,
        /// The item as it was, when the action asked for it (`ALL_OLD`).
        item: Option<crate::ports::NativeItem>,
    },
    /// The idempotency key was used by a transaction that committed; nothing was written.
    /// Read its record and replay the stored response.
    #[error("transaction {txn_id}: idempotency key {slot} is already used")]
    IdempotencyKeyUsed {
        /// The transaction.
        txn_id: TxnId,
        /// The key.
        slot: IdempotencySlot,
    },
    /// The transaction carries more than one commit can; nothing was written.
    #[error("transaction {txn_id} is too large: {reason}")]
    TooLarge {
        /// The transaction.
        txn_id: TxnId,
        /// Which limit.
        reason: String,
    },
    /// A message the transaction emitted would be refused for good by every destination
    /// (a character queues refuse, a reserved attribute name, ...); nothing was written.
    #[error("transaction {txn_id}: a message cannot be sent")]
    Unsendable {
        /// The transaction.
        txn_id: TxnId,
        /// Which message, and why.
        #[source]
        source: crate::protocol::Unsendable,
    },
    /// The store could not take the commit (contention, throttling, unavailable, or
    /// refused as invalid); nothing was written.
    #[error("transaction {txn_id}: the store did not take the commit")]
    NotCommitted {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: CommitError,
    },
    /// The commit's outcome was unknown (`source` says why), and the request path then
    /// settled it: it wrote the transaction's tombstone (or found the control worker's),
    /// so no attempt applied and none still in flight ever can. Nothing was written;
    /// starting again is safe.
    #[error("transaction {txn_id}: the commit's outcome was unknown; its tombstone now stops it")]
    Fenced {
        /// The transaction.
        txn_id: TxnId,
        /// The error of the attempt whose outcome was unknown.
        #[source]
        source: CommitError,
    },
    /// A second transaction was begun in a request that had begun one already
    /// (`txn_id`, which the answer names): a request is one transaction, with one answer
    /// and one idempotency record, even when the first was refused or abandoned (to try
    /// again, the client sends the request again). The second was refused before its
    /// control message; nothing of it was written. The first stands as it is. Stage
    /// every change of the request in one transaction.
    #[error("a second transaction in the request of transaction {txn_id}")]
    SecondInRequest {
        /// The request's first transaction.
        txn_id: TxnId,
    },
    /// The transaction was abandoned ([`crate::request::Outbox::abandon`], or the HTTP
    /// glue settling a request answered without it) before its commit began: the commit
    /// was refused (and its control message too, if it had not been sent), and nothing
    /// was written. A handler that commits after its request was answered (a spawned
    /// task) meets this.
    #[error("transaction {txn_id} was abandoned before its commit")]
    Abandoned {
        /// The transaction.
        txn_id: TxnId,
    },
    /// Nobody knows whether the commit applied: it could not be settled before the
    /// deadline. The control worker settles it; the transaction's status tells the
    /// outcome later.
    #[error("transaction {txn_id}: the commit's outcome is unknown")]
    Ambiguous {
        /// The transaction.
        txn_id: TxnId,
        /// The last error seen.
        #[source]
        source: CommitError,
    },
}

impl TxnError {
    /// The transaction concerned.
    pub fn txn_id(&self) -> TxnId {
        match self {
            Self::ControlSend { txn_id, .. }
            | Self::Read { txn_id, .. }
            | Self::CommitWindowExpired { txn_id }
            | Self::DeadlineExceeded { txn_id }
            | Self::VersionConflict { txn_id, .. }
            | Self::Refused { txn_id, .. }
            | Self::NoSuchItem { txn_id, .. }
            | Self::ActionCancelled { txn_id, .. }
            | Self::IdempotencyKeyUsed { txn_id, .. }
            | Self::TooLarge { txn_id, .. }
            | Self::Unsendable { txn_id, .. }
            | Self::NotCommitted { txn_id, .. }
            | Self::Fenced { txn_id, .. }
            | Self::SecondInRequest { txn_id }
            | Self::Abandoned { txn_id }
            | Self::Ambiguous { txn_id, .. } => *txn_id,
        }
    }

    /// Whether the transaction it names certainly did not commit: every variant but
    /// `Ambiguous`, and `SecondInRequest`, which names the request's first transaction
    /// (that one may well have committed).
    pub fn is_definite(&self) -> bool {
        !matches!(self, Self::Ambiguous { .. } | Self::SecondInRequest { .. })
    }
}
