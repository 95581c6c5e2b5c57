//! How far a request's transaction got, which the request scope records and the answer
//! given when time runs out depends on.

use crate::protocol::TxnId;

/// How far a request's transaction got, for answering when time runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// No transaction yet: nothing can have been written.
    #[default]
    NotBegun,
    /// The transaction began and its commit was not tried: nothing was written. If its
    /// control message was sent, the middleware tombstones it before answering (or, if
    /// that fails, its control message does); if not, nothing of it left the process.
    Begun(TxnId),
    /// Its commit was tried: it may have applied.
    Committing(TxnId),
}
