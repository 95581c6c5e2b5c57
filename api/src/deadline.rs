//! Every request's deadline, and an answer that names the transaction even when time
//! runs out.
//!
//! A request must be answered before its end: on Lambda the invocation's deadline (after
//! it the function is frozen and the client gets a gateway error, not an answer), locally
//! the API timeout. [`enforce`] computes that end once per request and gives the handler
//! a deadline a margin before it ([`RequestScope::deadline`]), which the outbox's commit
//! and its retries keep to. If the handler still has not answered half a margin before
//! the end (a stalled read, say), the middleware answers instead, from what the
//! handler recorded in [`RequestScope::progress`]: before the transaction began, a
//! plain timeout; after it began but before its commit was tried, a timeout that names it
//! and says nothing was written; once its commit was in flight, "outcome unknown" naming
//! it. A 503 that cannot name its transaction is thus given only before one began.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use outbox::protocol::TxnId;
use outbox::time::Timestamp;

use crate::error::ApiError;
use crate::state::AppState;

/// How long before a request's end the handler must stop working, to answer in time.
pub const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// How far a request's transaction got, for answering when time runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// No transaction yet: nothing can have been written.
    #[default]
    NotBegun,
    /// The transaction began (its control message was sent) and its commit was not
    /// tried: nothing was written, and its control message will tombstone it.
    Begun(TxnId),
    /// Its commit was tried: it may have applied.
    Committing(TxnId),
}

/// What a handler learns of its request's time, and where it records its progress.
#[derive(Debug, Clone, Default)]
pub struct RequestScope {
    /// When the handler must have finished, if the request has a deadline.
    pub deadline: Option<Timestamp>,
    progress: Arc<Mutex<Progress>>,
}

impl RequestScope {
    /// A scope with `deadline`.
    pub fn new(deadline: Option<Timestamp>) -> Self {
        Self {
            deadline,
            progress: Arc::default(),
        }
    }

    /// Records that transaction `txn_id` began.
    pub fn begun(&self, txn_id: TxnId) {
        self.set(Progress::Begun(txn_id));
    }

    /// Records that transaction `txn_id`'s commit is about to be tried.
    pub fn committing(&self, txn_id: TxnId) {
        self.set(Progress::Committing(txn_id));
    }

    /// How far the transaction got.
    pub fn progress(&self) -> Progress {
        *self.progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set(&self, progress: Progress) {
        *self.progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = progress;
    }
}

/// The scope the middleware put on the request; a request that did not pass through it
/// (a router built without the layer) has no deadline.
impl<S: Send + Sync> FromRequestParts<S> for RequestScope {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<RequestScope>().cloned().unwrap_or_default())
    }
}

/// The margin for a request that may last `timeout`: [`ANSWER_MARGIN`], or a quarter of
/// a shorter timeout.
pub fn margin(timeout: Duration) -> Duration {
    ANSWER_MARGIN.min(timeout / 4)
}

/// The instant a request that arrived at `now` must be answered by: `timeout` after it,
/// or the Lambda invocation's deadline (milliseconds since the epoch) if that is sooner.
///
/// A Lambda deadline that has already passed when the request arrives is not one: Lambda
/// never hands out an invocation after its deadline, while `cargo lambda watch` sends its
/// own timeout there (`600000`, a duration), which would make every request time out at
/// once. Such a value is ignored and the local timeout holds.
pub fn request_end(now: Timestamp, timeout: Duration, lambda_deadline_millis: Option<u64>) -> Timestamp {
    let local = now.plus(timeout);
    match lambda_deadline_millis.map(Timestamp::from_millis) {
        Some(deadline) if deadline > now => local.min(deadline),
        Some(deadline) => {
            tracing::debug!(
                lambda_deadline_millis = deadline.as_millis(),
                "the Lambda deadline had passed on arrival; using the API timeout"
            );
            local
        }
        None => local,
    }
}

fn before(instant: Timestamp, duration: Duration) -> Timestamp {
    Timestamp::from_millis(instant.as_millis().saturating_sub(duration.as_millis() as u64))
}

/// The middleware: gives the request its scope and answers for the handler when it
/// overruns.
pub async fn enforce(
    State((state, timeout)): State<(AppState, Duration)>,
    mut request: Request,
    next: Next,
) -> Response {
    let clock = state.outbox.clock().clone();
    let now = clock.now();
    let lambda_deadline = request
        .extensions()
        .get::<lambda_http::Context>()
        .map(|context| context.deadline);
    let end = request_end(now, timeout, lambda_deadline);
    let margin = margin(timeout);
    let scope = RequestScope::new(Some(before(end, margin)));
    request.extensions_mut().insert(scope.clone());
    let backstop = before(end, margin / 2).since(now);
    tokio::select! {
        response = next.run(request) => response,
        () = clock.timer(backstop) => {
            tracing::warn!(progress = ?scope.progress(), "the handler overran its deadline; answering for it");
            ApiError::Timeout(scope.progress()).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_the_sooner_of_the_timeout_and_the_lambda_deadline() {
        let now = Timestamp::from_millis(1_000_000);
        let timeout = Duration::from_secs(10);
        assert_eq!(request_end(now, timeout, None).as_millis(), 1_010_000);
        assert_eq!(request_end(now, timeout, Some(1_003_000)).as_millis(), 1_003_000);
        assert_eq!(request_end(now, timeout, Some(1_020_000)).as_millis(), 1_010_000);
        // What `cargo lambda watch` sends: its timeout, not an instant.
        assert_eq!(request_end(now, timeout, Some(600_000)).as_millis(), 1_010_000);
        assert_eq!(margin(timeout), ANSWER_MARGIN);
        assert_eq!(margin(Duration::from_secs(1)), Duration::from_millis(250));
    }
}
