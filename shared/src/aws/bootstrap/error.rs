//! What can go wrong while the bootstrap creates a resource.

use crate::ports::BoxError;
use crate::protocol::DestinationName;

/// A resource that could not be created, or read.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The layout names attributes that cannot work.
    #[error(transparent)]
    Layout(#[from] crate::settings::LayoutError),
    /// The table exists with another key schema or TTL attribute than the layout names.
    #[error("table {table} does not fit the layout: {problem}")]
    Mismatch {
        /// Its name.
        table: String,
        /// What differs.
        problem: String,
    },
    /// The existing table is one the outbox must not write from here: replicated to
    /// other Regions without `OUTBOX_WRITE_REGION` naming this one, strongly consistent
    /// across Regions, or named to be written from another Region.
    #[error(transparent)]
    Regions(#[from] crate::aws::RegionError),
    /// Creating or describing the table failed.
    #[error("creating table {table} failed")]
    Table {
        /// Its name.
        table: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Creating a queue, or reading its ARN, failed.
    #[error("creating queue {queue} failed")]
    Queue {
        /// Its name.
        queue: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Reading how long a queue keeps a message failed.
    #[error("reading the retention of queue {queue_url} failed")]
    Retention {
        /// Its URL.
        queue_url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A destination the consumer reads is not among the stack's.
    #[error("the stack has no destination {destination} for the consumer to read")]
    NoDestination {
        /// Its name.
        destination: DestinationName,
    },
    /// Creating a topic or its subscription failed.
    #[error("creating topic {topic} failed")]
    Topic {
        /// Its name.
        topic: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Creating a bus or its rule failed.
    #[error("creating bus {bus} failed")]
    Bus {
        /// Its name.
        bus: String,
        /// Why.
        #[source]
        source: BoxError,
    },
}
