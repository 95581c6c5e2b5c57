//! What a request scope is told of the transactions begun while it runs.

use std::sync::Arc;

use super::{Outbox, Transaction, TxnError};
use crate::protocol::TxnId;

/// What a request scope (the HTTP glue's) is told of the transactions begun while it
/// runs on this task, however they are begun: through it, or with [`Outbox::begin`]
/// directly. Installed with [`watch_begins`].
pub trait BeginWatch: Send + Sync {
    /// Before a transaction begins: an error refuses it. Admitting one holds the
    /// request's place until [`Self::started`], which follows at once.
    fn admit(&self, txn_id: TxnId) -> Result<(), TxnError>;
    /// Once it began (nothing of it sent yet): record it, and hook its control send and
    /// its commit.
    fn started(&self, outbox: &Outbox, txn: &mut Transaction);
}

tokio::task_local! {
    pub(super) static BEGIN_WATCH: Arc<dyn BeginWatch>;
}

/// Runs `future` with `watch` told of every transaction begun in it on this task.
pub async fn watch_begins<F: std::future::Future>(watch: Arc<dyn BeginWatch>, future: F) -> F::Output {
    BEGIN_WATCH.scope(watch, future).await
}
