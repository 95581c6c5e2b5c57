//! Why a service could not start, or stopped.

use std::net::SocketAddr;

use crate::consumer::InvalidConsumerName;
use crate::settings::SettingsError;

/// Why a service could not start, or stopped. Its `Debug` form is its message and its
/// causes, so that `main` can return it.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A setting is wrong.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A consumer's name breaks the rule of consumer names.
    #[error("consumer name {name:?}")]
    ConsumerName {
        /// The name given.
        name: String,
        /// The rule.
        #[source]
        source: InvalidConsumerName,
    },
    /// A consumer's source is not a destination name.
    #[error("{name:?} is not a destination name")]
    Destination {
        /// The name given.
        name: String,
    },
    /// A second consumer was registered on one destination.
    #[error(
        "consumer {first} reads {destination} already: a destination is one queue, whose messages two consumers would share; give each its own destination"
    )]
    SourceTaken {
        /// The destination.
        destination: String,
        /// The consumer registered on it first.
        first: String,
    },
    /// `OUTBOX_LISTEN_ADDR` is not an address.
    #[error("{}: {text:?} is not an address such as 127.0.0.1:3000", super::LISTEN_ADDR)]
    ListenAddr {
        /// The value.
        text: String,
    },
    /// The address cannot be listened on.
    #[error("cannot listen on {address}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The local server failed.
    #[error("the server failed")]
    Serve(#[source] std::io::Error),
    /// The Lambda runtime failed.
    #[error(transparent)]
    Lambda(crate::http::lambda::LambdaError),
    /// The process ran as one of the service's consumers, which failed
    /// ([`super::Service::serve`]).
    #[error("the consumer failed")]
    Consumer(#[source] crate::consumer::ServeError),
    /// `OUTBOX_CONSUMER_NAME` names a consumer the service does not register.
    #[error(
        "{}={name} names no consumer of this service (it registers: {}); unset it to serve the routes",
        crate::consumer::consumer_vars::NAME,
        registered.join(", ")
    )]
    NotAConsumer {
        /// The name the setting gives.
        name: String,
        /// The consumers the service registers.
        registered: Vec<String>,
    },
    /// The table is one this process must not write (replicated to other Regions, or
    /// written from another Region), or could not be described.
    #[error(transparent)]
    Table(#[from] crate::aws::RegionError),
}

impl std::fmt::Debug for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
