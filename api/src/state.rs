//! What every handler shares.

use std::sync::Arc;

use outbox::protocol::DestinationName;
use outbox::request::Outbox;

/// The application state: the request path, and where the domain's events go.
#[derive(Clone)]
pub struct AppState {
    /// The request path.
    pub outbox: Arc<Outbox>,
    /// The destination of order events.
    pub events: DestinationName,
}
