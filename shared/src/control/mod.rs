//! The control path (docs/PROTOCOL.md section 4): settle transactions named by control
//! messages, a batch at a time.
//!
//! For each transaction: read its outbox record (one consistent batched read for the
//! batch); `pending` → publish its messages and mark it dispatched; `dispatched` or
//! `tombstone` → nothing to do; absent within the commit window → send a new, later
//! control message; absent after it → write a tombstone, and if a record appeared
//! meanwhile, handle that record instead. A transaction in entity mode (its control
//! message names its entity) has its outcome in the entity, read first: its sent mark
//! (done), or its entry, which is published and settled into a sent mark; its record is
//! read only where the entity does not tell. After the window its fence goes into the
//! entity with its record's tombstone. [`crate::protocol::sent_marks`] says how many sent
//! marks an item keeps.
//!
//! - [`ControlPath`] handles a batch; [`poller`] receives and acknowledges control messages
//!   outside Lambda; [`redelivery`] brings failed ones back in seconds.
//! - `worker` (feature `worker`): the control worker as a Lambda SQS handler and a local
//!   poller, set up from the settings.

#[cfg(test)]
mod entity_race_tests;
#[cfg(test)]
mod entity_tests;
pub mod lease;
mod outcome;
mod path;
pub mod poller;
pub mod redelivery;
#[cfg(all(test, feature = "worker"))]
mod release_tests;
#[cfg(feature = "worker")]
pub mod worker;

pub use outcome::{BatchReport, ControlError, ControlOutcome, ItemReport};
pub use path::{ControlPath, ControlPorts, ReleaseError, MAX_ATTEMPTS};
