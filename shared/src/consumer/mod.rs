//! Message handlers that process each incoming message exactly once in effect: the outbox
//! driven by the incoming message (docs/PROTOCOL.md section 10).
//!
//! A consumer (a Lambda function triggered by a queue, or a local poller) hands each
//! message to the application's [`Handler`], which reads (strongly consistent) and stages
//! business writes and outgoing messages on a [`Staging`], as a request does. The library
//! does the rest, for one message `m`:
//!
//! ```text
//! read IN#(consumer, m) ── dispatched ─► acknowledge (a duplicate)
//!   │                  └─ pending ────► publish its stored messages ─► mark ─► acknowledge
//!   │ absent
//! run the handler ─► commit its writes + the record `pending`, in one TransactWriteItems
//!   ├── applied ─► publish ─► mark dispatched (TTL = now + retention) ─► acknowledge
//!   ├── another copy's record is there ─► read it, publish *its* messages (never ours)
//!   ├── a business condition failed ─► run the handler again on fresh reads (bounded)
//!   └── outcome unknown ─► read again: the record says whether any attempt applied
//! ```
//!
//! Every copy of `m` names the same record and the same outgoing ids (both derive from
//! the consumer's name and `m`, [`crate::protocol::TxnId::consumed`]); the record's
//! `attribute_not_exists` condition lets exactly one attempt's writes apply, and an
//! attempt still in flight when another has won is cancelled by that same condition, so
//! no fence is needed. A message is acknowledged only after its messages went out (C5),
//! and one without a usable id fails ([`MessageIds`]).
//!
//! The modules: [`incoming`] reads a delivery and its id; `consume` processes one
//! message; `batch` a batch (FIFO groups in order, the rest concurrently); `lambda`
//! (feature `consumer`) the SQS event handler; `poller` the local poller; `retention`
//! the dedup data's lifetime (C4); `serve` (feature `consumer`) a consumer's process
//! from its settings, on Lambda or as a local poller; [`state`] what an in-order consumer
//! did with one entity's chain, for whoever operates it.

mod batch;
mod consume;
mod entity;
pub mod in_order;
pub mod incoming;
#[cfg(feature = "consumer")]
pub mod lambda;
mod name;
mod poller;
mod retention;
#[cfg(feature = "consumer")]
mod serve;
mod settings;
pub mod state;
#[cfg(test)]
mod tests;

use async_trait::async_trait;

pub use crate::ports::{Delivery, Inbox, Requeue};
pub use batch::{BatchReport, ItemReport};
pub use consume::{ConsumeError, ConsumeOutcome, Consumer, ConsumerPorts, HANDLER_RUNS, ROUNDS};
pub use incoming::{Incoming, IncomingId, MessageIds, NoId, Source};
pub use name::{ConsumerName, InvalidConsumerName};
pub use poller::{poll_once, run as run_poller};
pub use retention::{Retention, RetentionError};
#[cfg(feature = "consumer")]
pub use serve::{serve, ServeError, Setup, CONSUMER_USAGE, LONG_POLL_WAIT};
pub use settings::{consumer_vars, ConsumerBackend, ConsumerSettings};

pub use crate::staging::Staging;

/// Why a handler gave up on a message: anything it can say. The message fails, nothing
/// of this run is written, and the queue delivers it again.
pub type HandlerError = crate::ports::BoxError;

/// The application's handler for one consumer's messages.
///
/// It reads what it needs through `staging` (strongly consistent) and stages writes and
/// messages on it; it must not write or send anything itself, since it may run more than
/// once for one message (a business condition that failed, a copy processed
/// concurrently), and only one run's staging is ever committed. Whatever it decides is
/// applied once, with its messages published, or not at all.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles `message`, staging its effects on `staging`.
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError>;

    /// The one item `message` changes, where the handler changes only that item: the
    /// message is then processed in entity mode (docs/PROTOCOL.md section 11, `docs/ENTITY_MODE.md`),
    /// its outbox entry inside the item and its commit one conditional write: 3 write
    /// units instead of the transactional mode's 5, about a quarter less per message
    /// (`docs/BENCHMARKS.md`).
    ///
    /// The handler must then stage a put of that item, or only messages (where the item
    /// exists), or nothing, and no other write; anything more fails the message
    /// ([`ConsumeError::NotOneItem`]), never a silent change of guarantees. The entry
    /// must fit in the item (DynamoDB's 400 KB). What guards against a late attempt of a
    /// message is the item's version, which never restarts: a create of an item deleted
    /// before expects the version its delete left. `None`, the default, is the
    /// transactional mode.
    fn entity(&self, message: &Incoming) -> Result<Option<crate::ports::ItemKey>, HandlerError> {
        let _ = message;
        Ok(None)
    }

    /// Whether the consumer applies each source entity's messages in the order their
    /// entity committed them ([`in_order`]): a message whose predecessor in its chain was
    /// not applied yet is kept ([`crate::ports::KeptMessage`]) and applied right after its
    /// predecessor, by whichever delivery applies that one; one at or below the last
    /// applied is a duplicate. `false`, the default, applies
    /// messages as they come. Messages without a position ([`Incoming::position`]) are
    /// applied as they come either way. With [`Self::entity`], the chain's position is kept
    /// in that entity's key and moved by its own write (no write more); without, the
    /// message commits in the transactional mode and the position is an item of its own.
    fn in_order(&self) -> bool {
        false
    }
}
