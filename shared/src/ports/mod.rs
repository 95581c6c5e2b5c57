//! The ports: one trait per outside capability, drawn around atomicity rather than CRUD
//! verbs. Each has an embedded implementation (`crate::embedded`) and an AWS one, and
//! both must pass the one conformance suite in `tests/`.

mod clock;
mod control_queue;
mod inbox;
mod publisher;
mod store;

pub use clock::{Clock, IdSource, RandomIds, SystemClock};
pub use control_queue::{ControlDelivery, ControlInbox, ControlQueue, QueueError, CONTROL_MAX_RECEIVE_COUNT};
pub use inbox::{requeued_attributes, Delivery, Inbox, Requeue};
pub use publisher::{EntryFailure, PublishError, Publisher};
pub use store::{
    BusinessWrite, CommitError, CommitRequest, EntityCommit, EntityItem, ExpectedVersion, FenceOutcome, InvalidItemKey,
    ItemKey, KeptMessage, KeyRead, NativeAction, NativeItem, OutboxReads, Store, StoreError, TombstoneOutcome,
    VersionedItem,
};

/// An error from outside this crate (an SDK, a socket), kept whole as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
