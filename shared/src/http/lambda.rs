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

use axum::Router;
use lambda_extension::{service_fn, Extension, LambdaEvent as ExtensionEvent, NextEvent};
use lambda_http::request::LambdaRequest;
use lambda_http::LambdaEvent;
use tokio::sync::Notify;

use crate::request::AfterAnswer;

/// Whether spans are exported (feature `otel`, and the `OTEL_*` variables turn it on).
fn traces_exported() -> bool {
    #[cfg(feature = "otel")]
    {
        crate::telemetry::export::enabled()
    }
    #[cfg(not(feature = "otel"))]
    {
        false
    }
}

/// Sends the spans buffered so far (feature `otel`).
async fn flush_traces() {
    #[cfg(feature = "otel")]
    crate::telemetry::export::flush_blocking().await;
}

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

/// Marks its invocation answered when dropped: when the answer is made, and also when
/// the handler panics, its event cannot be read, or its future is dropped.
struct MarkOnDrop {
    answered: Answered,
    request_id: String,
}

impl Drop for MarkOnDrop {
    fn drop(&mut self) {
        self.answered.mark(std::mem::take(&mut self.request_id));
    }
}

/// The router as the Lambda runtime's handler (what `lambda_http::run` makes of it),
/// marking each invocation answered once its answer is made, whatever it is: every
/// transaction it committed has handed its publishing over by then.
#[derive(Clone)]
struct Marked {
    app: Router,
    answered: Answered,
}

impl lambda_http::Service<LambdaEvent<serde_json::Value>> for Marked {
    type Response = serde_json::Value;
    type Error = lambda_http::Error;
    // Not `Send`: the adapter's future holds the answer's body, which is not `Sync`, and
    // the runtime polls its handler's future in place.
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<serde_json::Value, lambda_http::Error>>>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: LambdaEvent<serde_json::Value>) -> Self::Future {
        let LambdaEvent { payload, context } = event;
        let marked = MarkOnDrop {
            answered: self.answered.clone(),
            request_id: context.request_id.clone(),
        };
        let app = self.app.clone();
        Box::pin(async move {
            let _marked = marked;
            let request: LambdaRequest = serde_json::from_value(payload)?;
            let mut adapter = lambda_http::Adapter::from(app);
            let response = match adapter.call(LambdaEvent::new(request, context)).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(serde_json::to_value(response)?)
        })
    }
}

/// How long before the invocation's deadline the extension stops holding: asking for the
/// next event after it would make Lambda count the invocation as timed out and reset the
/// environment.
pub const HOLD_MARGIN: Duration = Duration::from_millis(200);

/// Serves `app` on Lambda. With `after` (the outbox's [`AfterAnswer`], when it publishes
/// after the answer) an internal extension holds each invocation's environment until
/// that invocation has answered and `after` has no work left, at most until
/// [`HOLD_MARGIN`] before the invocation's deadline. With feature `otel` and spans
/// exported, the extension also flushes them after each invocation, after the answer
/// (and what was published after it). Without either, this is `lambda_http::run(app)`.
pub async fn run(app: Router, after: Option<AfterAnswer>) -> Result<(), LambdaError> {
    let flush = cfg!(feature = "otel") && traces_exported();
    if after.is_none() && !flush {
        return lambda_http::run(app).await.map_err(LambdaError::Runtime);
    }
    let answered = Answered::default();
    let handler = Marked {
        app,
        answered: answered.clone(),
    };
    let hold = service_fn(move |event: ExtensionEvent| {
        let (answered, after) = (answered.clone(), after.clone());
        async move {
            if let NextEvent::Invoke(invoke) = event.next {
                let until = UNIX_EPOCH + Duration::from_millis(invoke.deadline_ms) - HOLD_MARGIN;
                let left = || until.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                if tokio::time::timeout(left(), answered.wait_for(&invoke.request_id))
                    .await
                    .is_err()
                {
                    tracing::warn!(request_id = %invoke.request_id, "the invocation's deadline came before its handler answered");
                } else if let Some(after) = &after {
                    if !after.idle_within(left()).await {
                        tracing::warn!(
                            request_id = %invoke.request_id,
                            running = after.running(),
                            "the invocation's deadline came before publishing after the answer was done; the control worker publishes the rest"
                        );
                    }
                }
                // The invocation's spans, the publishing's after the answer included, go
                // out before the environment may freeze.
                if flush {
                    let _ = tokio::time::timeout(left(), flush_traces()).await;
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
        result = lambda_http::lambda_runtime::run(handler) => result.map_err(LambdaError::Runtime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation(request_id: &str, payload: serde_json::Value) -> LambdaEvent<serde_json::Value> {
        let mut context = lambda_http::Context::default();
        context.request_id = request_id.into();
        LambdaEvent::new(payload, context)
    }

    /// Every invocation is marked answered: one the router answered, one whose event it
    /// could not read, and one whose handler panicked.
    #[tokio::test]
    async fn every_invocation_is_marked_answered_whatever_became_of_it() {
        use lambda_http::Service as _;
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" })).route(
            "/panic",
            axum::routing::get(|| async { panic!("a handler bug") as &'static str }),
        );
        let answered = Answered::default();
        let mut marked = Marked {
            app,
            answered: answered.clone(),
        };
        let event = |path: &str| {
            serde_json::json!({
                "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
                "headers": {"host": "x"}, "isBase64Encoded": false,
                "requestContext": {
                    "accountId": "1", "apiId": "a", "domainName": "x", "domainPrefix": "x",
                    "requestId": "r", "routeKey": "$default", "stage": "$default",
                    "time": "26/Nov/2026:00:00:00 +0000", "timeEpoch": 0,
                    "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "t"}
                }
            })
        };
        let answer = marked.call(invocation("served", event("/"))).await.expect("an answer");
        assert_eq!(answer["statusCode"], 200, "{answer}");
        assert!(answered.take("served"));
        assert!(marked
            .call(invocation("unreadable", serde_json::json!({})))
            .await
            .is_err());
        assert!(
            answered.take("unreadable"),
            "an event the router never saw is marked too"
        );
        let panicking = marked.call(invocation("panicked", event("/panic")));
        let panicked = tokio::task::LocalSet::new()
            .run_until(async move { tokio::task::spawn_local(panicking).await })
            .await;
        assert!(panicked.is_err(), "the handler panicked");
        assert!(answered.take("panicked"), "a handler that panicked is marked too");
    }

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
