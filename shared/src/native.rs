//! Native DynamoDB actions in the request path: the application's own
//! [`TransactWriteItem`](aws_sdk_dynamodb::types::TransactWriteItem)s (`Put`, `Update`
//! with `SET`/`ADD`/`REMOVE`, `Delete`, `ConditionCheck`; any table, any key schema,
//! their own conditions) committed in one `TransactWriteItems` with the outbox's records.
//!
//! Only the DynamoDB store runs them, and the types say so: a [`NativeOutbox`] can only be
//! built over a store that does ([`NativeOutbox::new`] refuses any other, once, at
//! start-up), and only its [`NativeTransaction`]s take native actions. The portable form
//! ([`Transaction::put`] and friends) works on every backend, this one included.
//!
//! Reads stay the application's own: its DynamoDB client, its keys, `ConsistentRead` for
//! what the decision depends on, and a condition on each native action for what must
//! still hold at commit (the read's version, `attribute_not_exists`, a counter's bound).
//!
//! ```no_run
//! # async fn example(outbox: &outbox::native::NativeOutbox, dynamodb: &aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
//! use outbox::protocol::Message;
//!
//! let mut txn = outbox.begin().await?;
//! let sku = AttributeValue::S("SKU#1".into());
//! let stock = dynamodb.get_item().table_name("shop").key("PK", sku.clone()).key("SK", sku.clone())
//!     .consistent_read(true).send().await?;
//! # let _ = stock;
//! let reserve = Update::builder().table_name("shop").key("PK", sku.clone()).key("SK", sku)
//!     .update_expression("ADD reserved :one")
//!     .condition_expression("attribute_exists(PK)")
//!     .expression_attribute_values(":one", AttributeValue::N("1".into()))
//!     .build()?;
//! let index = txn.action(TransactWriteItem::builder().update(reserve).build());
//! txn.emit(Message::json("events".parse()?, &serde_json::json!({"type": "Reserved"}))?);
//! match txn.commit().await {
//!     Err(outbox::request::TxnError::ActionCancelled { index: failed, .. }) if failed == index => { /* no such SKU */ }
//!     other => { other?; }
//! }
//! # Ok(()) }
//! ```

use std::ops::{Deref, DerefMut};

use crate::ports::NativeAction;
use crate::protocol::{IdempotencySlot, StoredResponse, TxnId};
use crate::request::{Committable, Committed, Outbox, Transaction, TxnError};
use crate::time::Timestamp;

/// The store under an outbox cannot run native actions (it is not the DynamoDB store).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("native DynamoDB actions need the outbox to be built on the DynamoDB store (outbox::aws::DynamoStore)")]
pub struct NativeUnsupported;

/// An [`Outbox`] whose store runs native DynamoDB actions. Build one per process and
/// share it.
#[derive(Clone)]
pub struct NativeOutbox {
    outbox: Outbox,
}

impl NativeOutbox {
    /// `outbox`, if its store runs native actions.
    pub fn new(outbox: Outbox) -> Result<Self, NativeUnsupported> {
        if outbox.store().runs_native_actions() {
            Ok(Self { outbox })
        } else {
            Err(NativeUnsupported)
        }
    }

    /// The outbox, for status look-ups and portable transactions.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Begins a transaction (see [`Outbox::begin`]).
    pub async fn begin(&self) -> Result<NativeTransaction, TxnError> {
        Ok(NativeTransaction {
            inner: self.outbox.begin().await?,
        })
    }

    /// Begins a transaction that must be answered by `deadline` (see
    /// [`Outbox::begin_within`]).
    pub async fn begin_within(&self, deadline: Timestamp) -> Result<NativeTransaction, TxnError> {
        Ok(NativeTransaction {
            inner: self.outbox.begin_within(deadline).await?,
        })
    }
}

/// A [`Transaction`] that also takes the application's native DynamoDB actions. Every
/// method of [`Transaction`] works on it (emit, remember_response, the portable writes).
pub struct NativeTransaction {
    inner: Transaction,
}

impl Deref for NativeTransaction {
    type Target = Transaction;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for NativeTransaction {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl NativeTransaction {
    /// Adds one of the application's actions to the commit, after those added before.
    /// Returns its index: the one [`TxnError::ActionCancelled`] names if its condition
    /// fails. Ask for the old item with
    /// `return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)`.
    ///
    /// One `TransactWriteItems` holds 100 actions and 4 MB; the outbox's records take one
    /// action, one more per 350 kB of messages beyond the first, and one for an
    /// idempotency record. A commit over the budget fails before it is sent, saying how
    /// much the outbox took. No two actions may touch one item.
    pub fn action(&mut self, action: NativeAction) -> usize {
        self.inner.staging.action(action)
    }

    /// The native actions added so far.
    pub fn actions(&self) -> &[NativeAction] {
        self.inner.staging.actions()
    }

    /// Commits the native actions, the portable writes and the messages atomically with
    /// the outbox record (see [`Transaction::commit`]).
    pub async fn commit(self) -> Result<Committed, TxnError> {
        self.inner.commit().await
    }

    /// See [`Transaction::abandon`].
    pub async fn abandon(self) -> crate::request::Settlement {
        self.inner.abandon().await
    }
}

impl Committable for NativeTransaction {
    fn id(&self) -> TxnId {
        self.inner.id()
    }

    fn remember_response(&mut self, slot: IdempotencySlot, fingerprint: String, response: StoredResponse) {
        self.inner.remember_response(slot, fingerprint, response);
    }

    fn commit(self) -> impl std::future::Future<Output = Result<Committed, TxnError>> + Send {
        NativeTransaction::commit(self)
    }
}
