//! What can go wrong while the bootstrap creates a resource.

use crate::ports::BoxError;

/// A resource that could not be created.
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
