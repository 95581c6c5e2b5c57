//! The request path (docs/PROTOCOL.md section 3): a transactional session that stages
//! business writes and messages, sends the delayed control message when the transaction
//! first needs it, and commits them with the outbox record in one atomic write.
//!
//! ```text
//! begin ── pick the id (nothing sent, nothing written)
//!   ├── reads (strongly consistent), business logic: put / delete / check / emit
//!   ▼
//! commit ── send control message (delay) ──► acknowledged?  no ─► ControlSend (nothing written)
//!   │ yes
//!   ├── one atomic write: business writes (versioned) + outbox record + idempotency record
//!   ├── applied: publish the messages, mark the record dispatched (inline publishing)
//!   └── refused, or outcome unknown: write the tombstone (settles it; decides an unknown)
//! abandon (no commit) ── nothing, if the control message was not sent; else write the tombstone
//! ```
//!
//! The modules: [`Outbox`] begins transactions ([`watch_begins`] lets a request scope see
//! each); a [`Transaction`] stages reads, writes and messages, sends its control message
//! when first needed (`control_send`), and its commit is tried and settled (`commit`,
//! `settle`); `inline` publishes a committed transaction's messages, before the answer or,
//! through [`after_answer`], right after it; [`TxnError`] says why a transaction did not
//! commit.

pub mod after_answer;
mod commit;
mod control_send;
#[cfg(test)]
mod counter_tests;
mod counters;
#[cfg(test)]
mod entity_tests;
mod error;
mod inline;
mod live;
#[cfg(test)]
mod unsendable_tests;
#[cfg(feature = "axum")]
pub(crate) use live::Abandoned;
mod outbox;
mod settle;
mod transaction;
mod turns;
mod watch;

pub use after_answer::AfterAnswer;
pub use commit::COMMIT_ATTEMPTS;
pub use error::TxnError;
pub use inline::InlineDispatch;
pub use outbox::{Outbox, RequestPorts, TxnStatus, CONFLICT_RETRY_PAUSE, DEFAULT_SERVICE};
pub use settle::{settle_bound, Settlement, SETTLE_ATTEMPTS, SETTLE_RESERVE};
pub use transaction::{Committable, Committed, Transaction};
pub use watch::{watch_begins, BeginWatch};
