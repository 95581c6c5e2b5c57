//! An axum router on Lambda, with publishing after the answer: `lambda_http`'s adapter
//! under `lambda_runtime::run_concurrent`, and what follows each invocation's answer.
//!
//! On Lambda (default), one invocation at a time: Lambda returns a function's response as
//! soon as its handler completes, and freezes the environment once the runtime and every
//! extension have asked for the next event. The internal extension registered here asks
//! only when the invocation's handler has answered and no work handed to the
//! [`AfterAnswer`] is left (or the invocation's deadline has come): the client has its
//! answer while the messages go out. A freeze stops every task of the process, so the
//! hold waits for all the work after an answer in the environment, not only the
//! invocation's own: what an earlier invocation left at its deadline, and what a task the
//! handler spawned handed over (not counted as the invocation's), are not frozen halfway.
//!
//! On Lambda Managed Instances ([`managed_instances`]; `AWS_LAMBDA_MAX_CONCURRENCY` above
//! 1 runs several invocations at once), invocations run in parallel in one process, the environment is never frozen, and a timed-out
//! invocation's code keeps running. Lambda accepts no extension's registration for
//! `INVOKE` events there, and there is no freeze to hold off: no extension is registered,
//! and a task per invocation watches the work it handed over to its end instead, warning
//! when the deadline comes first and flushing the spans after it.
//!
//! Either way, work cut off (a deadline before a freeze, a shutdown, a crash) is the
//! control worker's, as any failure of inline publishing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use lambda_extension::{service_fn, Extension, LambdaEvent as ExtensionEvent, NextEvent};
use lambda_http::request::LambdaRequest;
use lambda_http::{Context, LambdaEvent};
use tokio::sync::Notify;

use crate::request::after_answer::Invocation;
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

/// How many invocations Lambda runs at once in this environment:
/// `AWS_LAMBDA_MAX_CONCURRENCY` on Lambda Managed Instances, 1 elsewhere (the rule
/// `run_concurrent` follows).
pub fn max_concurrency() -> u32 {
    std::env::var("AWS_LAMBDA_MAX_CONCURRENCY")
        .ok()
        .and_then(|value| value.trim().parse::<u32>().ok())
        .filter(|&concurrency| concurrency > 0)
        .unwrap_or(1)
}

/// Whether this environment is Lambda Managed Instances': `AWS_LAMBDA_INITIALIZATION_TYPE`
/// is `lambda-managed-instances` there, and only there can [`max_concurrency`] be above 1.
/// Its environments are never frozen, and no extension may register for `INVOKE` events.
pub fn managed_instances() -> bool {
    max_concurrency() > 1
        || std::env::var("AWS_LAMBDA_INITIALIZATION_TYPE").is_ok_and(|kind| kind == "lambda-managed-instances")
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

/// What follows an invocation's answer.
#[derive(Clone)]
enum Then {
    /// Nothing: no work after the answer, no spans to flush.
    Nothing,
    /// Lambda (default): the answer is marked for the extension, which holds the
    /// environment until no work after an answer is left in it.
    Mark(Answered),
    /// Managed Instances: a task watches the invocation's own work to its end.
    Watch { after: Option<AfterAnswer>, flush: bool },
}

/// Does what follows the answer when dropped: when the answer is made, and also when
/// the handler panics, its event cannot be read, or its future is dropped.
struct FollowOnDrop {
    then: Then,
    invocation: Invocation,
    deadline: Option<SystemTime>,
}

impl Drop for FollowOnDrop {
    fn drop(&mut self) {
        match &self.then {
            Then::Nothing => {}
            Then::Mark(answered) => answered.mark(self.invocation.id().to_owned()),
            Then::Watch { after, flush } => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(watch(after.clone(), self.invocation.clone(), self.deadline, *flush));
                }
            }
        }
    }
}

/// The earliest deadline taken for one: an emulator (`cargo lambda watch`) sends 0, or a
/// duration, where Lambda sends a time since the epoch.
const EARLIEST_DEADLINE_MS: u64 = 1_577_836_800_000; // 2020-01-01

/// The invocation's deadline, if Lambda gave one.
fn deadline_of(context: &Context) -> Option<SystemTime> {
    (context.deadline >= EARLIEST_DEADLINE_MS).then(|| UNIX_EPOCH + Duration::from_millis(context.deadline))
}

/// Until when the extension holds an invocation whose event says `deadline_ms`: the
/// deadline less [`HOLD_MARGIN`], or `None` without one. Only an emulator sends none
/// (`cargo lambda watch`, which never freezes a process, and hands every function's
/// INVOKE events to every extension, so that an event may not even be this process's).
fn hold_until(deadline_ms: u64) -> Option<SystemTime> {
    (deadline_ms >= EARLIEST_DEADLINE_MS).then(|| UNIX_EPOCH + Duration::from_millis(deadline_ms) - HOLD_MARGIN)
}

/// What is left until `until`.
fn left(until: SystemTime) -> Duration {
    until.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO)
}

/// On Managed Instances, after an invocation's answer: waits for the work it handed over
/// (never for another invocation's) to its end, which nothing cuts at the deadline there,
/// warning when the deadline comes first; then sends the spans.
async fn watch(after: Option<AfterAnswer>, invocation: Invocation, deadline: Option<SystemTime>, flush: bool) {
    if let Some(after) = &after {
        if !after.idle_for(&invocation, deadline.map_or(Duration::MAX, left)).await {
            tracing::warn!(
                request_id = %invocation,
                running = after.running_for(&invocation),
                "the invocation's deadline came before publishing after the answer was done; it goes on (Managed Instances do not freeze the environment)"
            );
            after.idle_for(&invocation, Duration::MAX).await;
        }
        tracing::debug!(request_id = %invocation, "the invocation's work after the answer is done");
    }
    if flush {
        flush_traces().await;
    }
}

/// The router's answer to one event, as the runtime posts it. `lambda_http`'s adapter
/// answers with a body that is not `Sync`, which `run_concurrent` needs of a response:
/// the answer is made JSON here, and the adapter is gone before it is awaited (it is not
/// `Send`), so that the whole future is `Send`.
async fn answer(
    app: Router,
    payload: serde_json::Value,
    context: Context,
) -> Result<serde_json::Value, lambda_http::Error> {
    use lambda_http::Service as _;
    let request: LambdaRequest = serde_json::from_value(payload)?;
    let answering = lambda_http::Adapter::from(app).call(LambdaEvent::new(request, context));
    let response = match answering.await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    Ok(serde_json::to_value(response)?)
}

/// The router as the Lambda runtime's handler, each invocation's answer in that
/// invocation's scope (the work it hands to an [`AfterAnswer`] is counted as its own),
/// and followed, once made, whatever it is, by what [`Then`] says: every transaction it
/// committed has handed its publishing over by then.
#[derive(Clone)]
struct Marked {
    app: Router,
    then: Then,
}

impl lambda_http::Service<LambdaEvent<serde_json::Value>> for Marked {
    type Response = serde_json::Value;
    type Error = lambda_http::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<serde_json::Value, lambda_http::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: LambdaEvent<serde_json::Value>) -> Self::Future {
        let LambdaEvent { payload, context } = event;
        let invocation = Invocation::new(&context.request_id);
        let deadline = deadline_of(&context);
        let follow = FollowOnDrop {
            then: self.then.clone(),
            invocation: invocation.clone(),
            deadline,
        };
        // On Lambda (default) the extension tells a late answer; on Managed Instances, this.
        let tell_late = matches!(self.then, Then::Watch { .. });
        // Its control messages carry its own X-Ray header, never another's running beside it.
        let trace = crate::aws::InvocationTrace::new(context.xray_trace_id.as_deref());
        let answering = trace.scope(invocation.clone().scope(answer(self.app.clone(), payload, context)));
        Box::pin(async move {
            let _follow = follow;
            let Some(deadline) = deadline.filter(|_| tell_late) else {
                return answering.await;
            };
            tokio::pin!(answering);
            match tokio::time::timeout(left(deadline), &mut answering).await {
                Ok(answered) => answered,
                Err(_) => {
                    tracing::warn!(
                        request_id = %invocation,
                        "the invocation's deadline came before its handler answered; Lambda reports a timeout while the handler goes on"
                    );
                    answering.await
                }
            }
        })
    }
}

/// How long before the invocation's deadline the extension stops holding: asking for the
/// next event after it would make Lambda count the invocation as timed out and reset the
/// environment.
pub const HOLD_MARGIN: Duration = Duration::from_millis(200);

/// Serves `app` on Lambda, [`max_concurrency`] invocations at once (several on Lambda
/// Managed Instances, one elsewhere), refusing paths that the front door and the function
/// could route apart ([`super::paths`]).
///
/// With `after` (the outbox's [`AfterAnswer`], when it publishes after the answer), on
/// Lambda (default) an internal extension holds each invocation's environment until that
/// invocation has answered and no work handed to `after` is left, at most until
/// [`HOLD_MARGIN`] before its deadline; on Managed Instances ([`managed_instances`]: no
/// freeze, and no extension may register for invocations) a task per invocation watches
/// that work to its end instead, and warns when the deadline comes first. With feature `otel` and spans exported, each
/// invocation's spans are flushed after it (and what was published after its answer).
pub async fn run(app: Router, after: Option<AfterAnswer>) -> Result<(), LambdaError> {
    // Whatever the router, no path that the front door and the function route apart.
    let app = app.layer(axum::middleware::from_fn(super::paths::refuse_ambiguous_paths));
    let flush = cfg!(feature = "otel") && traces_exported();
    let serve = |then| async move {
        lambda_http::lambda_runtime::run_concurrent(Marked { app, then })
            .await
            .map_err(LambdaError::Runtime)
    };
    if after.is_none() && !flush {
        return serve(Then::Nothing).await;
    }
    if managed_instances() {
        return serve(Then::Watch { after, flush }).await;
    }
    let answered = Answered::default();
    let hold = service_fn({
        let answered = answered.clone();
        move |event: ExtensionEvent| {
            let (answered, after) = (answered.clone(), after.clone());
            async move {
                if let NextEvent::Invoke(invoke) = event.next {
                    hold(&answered, after.as_ref(), &invoke.request_id, invoke.deadline_ms, flush).await;
                }
                Ok::<(), lambda_extension::Error>(())
            }
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
        result = serve(Then::Mark(answered)) => result,
    }
}

/// On Lambda (default), the extension's part in invocation `request_id`: it returns (and the
/// extension asks for the next event, letting the environment freeze) once the
/// invocation has answered and no work after an answer is left in the environment, or
/// [`HOLD_MARGIN`] before its deadline. A freeze stops every task of the process: the
/// hold waits for all of them, the work an earlier invocation left at its deadline and
/// the work a task the handler spawned handed over included (it is not counted as this
/// invocation's), so that none is frozen halfway.
async fn hold(answered: &Answered, after: Option<&AfterAnswer>, request_id: &str, deadline_ms: u64, flush: bool) {
    let Some(until) = hold_until(deadline_ms) else {
        // An emulator's event: nothing freezes, nothing to hold; the spans go out.
        tracing::debug!(request_id = %request_id, deadline_ms, "an INVOKE event without a deadline (an emulator's): not held");
        if flush {
            flush_traces().await;
        }
        return;
    };
    if tokio::time::timeout(left(until), answered.wait_for(request_id))
        .await
        .is_err()
    {
        tracing::warn!(request_id = %request_id, "the invocation's deadline came before its handler answered");
    } else if let Some(after) = after {
        if after.idle_within(left(until)).await {
            tracing::debug!(request_id = %request_id, "the work after the answers is done");
        } else {
            tracing::warn!(
                request_id = %request_id,
                running = after.running(),
                own = after.running_for(&Invocation::new(request_id)),
                "the invocation's deadline came before publishing after the answer was done; the control worker publishes the rest"
            );
        }
    }
    // The invocation's spans, the publishing's after the answer included, go out before
    // the environment may freeze.
    if flush {
        let _ = tokio::time::timeout(left(until), flush_traces()).await;
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

    fn event(path: &str) -> serde_json::Value {
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
    }

    /// Every invocation is marked answered: one the router answered, one whose event it
    /// could not read, and one whose handler panicked. The handler's future is `Send`, as
    /// `run_concurrent` needs.
    #[tokio::test]
    async fn every_invocation_is_marked_answered_whatever_became_of_it() {
        use lambda_http::Service as _;
        fn send<T: Send>(value: T) -> T {
            value
        }
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" })).route(
            "/panic",
            axum::routing::get(|| async { panic!("a handler bug") as &'static str }),
        );
        let answered = Answered::default();
        let mut marked = Marked {
            app,
            then: Then::Mark(answered.clone()),
        };
        let answer = send(marked.call(invocation("served", event("/"))))
            .await
            .expect("an answer");
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
        let panicked = tokio::spawn(marked.call(invocation("panicked", event("/panic")))).await;
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

    /// The extension lets the environment freeze only with no work after an answer left
    /// in it: an invocation is held for the work an earlier one left at its deadline too,
    /// which a freeze would stop halfway, though that work is counted as the earlier
    /// one's; an event without a deadline (an emulator's, maybe another function's) is
    /// not held.
    #[tokio::test]
    async fn the_extension_holds_an_invocation_until_no_work_is_left_in_the_environment() {
        use lambda_http::Service as _;
        let after = AfterAnswer::on_tokio();
        let (release, released) = tokio::sync::watch::channel(false);
        let app = Router::new().route(
            "/",
            axum::routing::get({
                let after = after.clone();
                move || {
                    let (after, mut released) = (after.clone(), released.clone());
                    async move {
                        after.run(async move {
                            let _ = released.wait_for(|released| *released).await;
                        });
                        "ok"
                    }
                }
            }),
        );
        let answered = Answered::default();
        let mut marked = Marked {
            app,
            then: Then::Mark(answered.clone()),
        };
        marked.call(invocation("first", event("/"))).await.expect("an answer");
        assert_eq!(after.running_for(&Invocation::new("first")), 1);
        let far = SystemTime::now() + Duration::from_secs(60);
        let deadline_ms = |at: SystemTime| at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        // The first one's deadline comes with its work still running.
        let soon = SystemTime::now() + HOLD_MARGIN + Duration::from_millis(100);
        // The deadline as the event carries it: whole milliseconds.
        let soon_ms = UNIX_EPOCH + Duration::from_millis(deadline_ms(soon));
        hold(&answered, Some(&after), "first", deadline_ms(soon), false).await;
        assert!(SystemTime::now() >= soon_ms - HOLD_MARGIN, "held until its deadline");
        // The second one hands nothing over, but the first one's work still runs: a
        // freeze would stop it halfway, so the second one is held until it is done too.
        answered.mark("second".into());
        let holding = tokio::spawn({
            let (answered, after) = (answered.clone(), after.clone());
            async move { hold(&answered, Some(&after), "second", deadline_ms(far), false).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!holding.is_finished(), "released with the first one's work running");
        assert_eq!(
            after.running_for(&Invocation::new("second")),
            0,
            "none of it the second's"
        );
        release.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), holding)
            .await
            .expect("released once no work is left")
            .unwrap();
        assert_eq!(after.running(), 0);
        // An emulator's event (a deadline of 0, which `cargo lambda watch` sends, and
        // hands to every function's extension): not held, since nothing freezes there.
        let (_release, released) = tokio::sync::watch::channel(false);
        after.run(async move {
            let mut released = released;
            let _ = released.wait_for(|released| *released).await;
        });
        tokio::time::timeout(
            Duration::from_secs(5),
            hold(&answered, Some(&after), "someone-elses", 0, false),
        )
        .await
        .expect("an event without a deadline is not held");
    }
}
