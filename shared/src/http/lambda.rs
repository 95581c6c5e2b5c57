//! An axum router on Lambda, with publishing after the answer: `lambda_http` beside an
//! internal extension that holds the execution environment until what the request path
//! left for after the answer is done.
//!
//! Lambda returns a function's response as soon as its handler completes, and freezes the
//! environment once the runtime and every extension have asked for the next event. The
//! extension registered here asks only when the invocation's handler has answered and
//! the [`AfterAnswer`] it watches has no work left (or the invocation's deadline has
//! come): the client has its answer while the messages go out. Work cut off by the
//! deadline or a crash is the control worker's, as any failure of inline publishing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use lambda_extension::{service_fn, Extension, LambdaEvent, NextEvent};
use lambda_http::RequestExt;
use tokio::sync::Notify;

use crate::request::AfterAnswer;

/// The extension's name, as Lambda lists it.
pub const EXTENSION_NAME: &str = "outbox-after-answer";

/// Invocations whose handler answered lately, by request id, newest last.
const ANSWERED_KEPT: usize = 256;

/// Why the function could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LambdaError {
    /// The extension could not register with the Extensions API.
    #[error("registering the internal extension {EXTENSION_NAME} failed: {0}")]
    Register(#[source] lambda_extension::Error),
    /// The extension's event loop stopped.
    #[error("the internal extension {EXTENSION_NAME} stopped: {0}")]
    Extension(#[source] lambda_extension::Error),
    /// The runtime's loop stopped.
    #[error("the Lambda runtime stopped: {0}")]
    Runtime(#[source] lambda_http::Error),
}

/// The request ids of invocations whose handler has answered.
#[derive(Clone, Default)]
struct Answered {
    ids: Arc<Mutex<VecDeque<String>>>,
    changed: Arc<Notify>,
}

impl Answered {
    fn mark(&self, request_id: String) {
        let mut ids = self.ids.lock().expect("answered lock");
        ids.push_back(request_id);
        if ids.len() > ANSWERED_KEPT {
            ids.pop_front();
        }
        self.changed.notify_waiters();
    }

    fn take(&self, request_id: &str) -> bool {
        let mut ids = self.ids.lock().expect("answered lock");
        match ids.iter().position(|id| id == request_id) {
            Some(index) => {
                ids.remove(index);
                true
            }
            None => false,
        }
    }

    async fn wait_for(&self, request_id: &str) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.take(request_id) {
                return;
            }
            changed.await;
        }
    }
}

/// Records the invocation's request id once the handler's answer is made, whatever it
/// is: every transaction it committed has handed its publishing over by then.
async fn mark_answered(State(answered): State<Answered>, request: Request, next: Next) -> Response {
    let request_id = request.lambda_context_ref().map(|context| context.request_id.clone());
    let response = next.run(request).await;
    if let Some(request_id) = request_id {
        answered.mark(request_id);
    }
    response
}

/// Serves `app` on Lambda. With `after` (the outbox's [`AfterAnswer`], when it publishes
/// after the answer) an internal extension holds each invocation's environment until
/// that invocation has answered and `after` has no work left, bounded by the
/// invocation's deadline; without it, this is `lambda_http::run(app)`.
pub async fn run(app: Router, after: Option<AfterAnswer>) -> Result<(), LambdaError> {
    let Some(after) = after else {
        return lambda_http::run(app).await.map_err(LambdaError::Runtime);
    };
    let answered = Answered::default();
    let app = app.layer(axum::middleware::from_fn_with_state(answered.clone(), mark_answered));
    let hold = service_fn(move |event: LambdaEvent| {
        let (answered, after) = (answered.clone(), after.clone());
        async move {
            if let NextEvent::Invoke(invoke) = event.next {
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |now| u64::try_from(now.as_millis()).unwrap_or(u64::MAX));
                let left = Duration::from_millis(invoke.deadline_ms.saturating_sub(now_ms));
                let done = tokio::time::timeout(left, async {
                    answered.wait_for(&invoke.request_id).await;
                    after.idle().await;
                })
                .await;
                if done.is_err() {
                    tracing::warn!(
                        request_id = %invoke.request_id,
                        running = after.running(),
                        "the invocation's deadline came before publishing after the answer was done; the control worker publishes the rest"
                    );
                }
            }
            Ok::<(), lambda_extension::Error>(())
        }
    });
    // Registered before the runtime asks for its first event, as Lambda requires of an
    // internal extension.
    let extension = Extension::new()
        .with_extension_name(EXTENSION_NAME)
        .with_events(&["INVOKE"])
        .with_events_processor(hold)
        .register()
        .await
        .map_err(LambdaError::Register)?;
    tokio::select! {
        result = extension.run() => result.map_err(LambdaError::Extension),
        result = lambda_http::run(app) => result.map_err(LambdaError::Runtime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_extension_waits_for_its_own_invocations_answer() {
        let answered = Answered::default();
        answered.mark("other".into());
        let waiting = tokio::spawn({
            let answered = answered.clone();
            async move { answered.wait_for("mine").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "another invocation's answer released it");
        answered.mark("mine".into());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("released by its own answer")
            .unwrap();
        assert!(
            answered.take("other"),
            "the other invocation's answer is kept for its own wait"
        );
    }
}
