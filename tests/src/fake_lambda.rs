//! A fake Lambda service on loopback: the Runtime API a function's runtime polls for its
//! invocations and answers through, and the Extensions API its internal extensions
//! register with, behaving as Lambda (default) or Lambda Managed Instances do; and the
//! function's process, started from the test binary itself.
//!
//! - [`Model::OneAtATime`] (Lambda default): one invocation at a time. The next one is
//!   delivered only once the runtime has answered the current one and asked for the next,
//!   and every extension registered for `INVOKE` has asked for its next event after the
//!   current one's (until then Lambda would freeze the environment, not deliver).
//! - [`Model::ManagedInstances`]: every `next` the runtime's workers hold gets an
//!   invocation as soon as one is queued, any number in flight at once; an extension's
//!   registration for `INVOKE` is refused, as Lambda Managed Instances refuse it.
//!
//! Everything it sees goes into one timeline of [`Event`]s, the function's standard error
//! lines included ([`FakeLambda::start_function`]), which a test waits on
//! ([`FakeLambda::wait_for`]) and reads back. The function's handlers reach the test
//! through three calls of their own ([`call`]): `/test/gate/{name}/{count}` returns once
//! `count` callers are inside gate `name`; `/test/hold/{key}` returns once the test
//! [`FakeLambda::release`]s `key`; `/test/mark/{label}` notes `label` in the timeline.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// How the fake delivers invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Lambda (default): one at a time, each held until the runtime and every extension
    /// registered for `INVOKE` asked for the next event after it.
    OneAtATime,
    /// Lambda Managed Instances: as many at once as the runtime asks for; no extension
    /// may register for `INVOKE`.
    ManagedInstances,
}

/// What the fake saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The runtime received invocation `request_id`.
    Delivered(String),
    /// The runtime posted its response.
    Answered(String, Value),
    /// The runtime posted an error.
    Failed(String, Value),
    /// An extension registered for these events.
    Registered(String, Vec<String>),
    /// An extension's registration was refused.
    Refused(String, Vec<String>),
    /// An extension asked for its next event after invocation `request_id`'s: it let the
    /// invocation end.
    Released(String),
    /// A handler came into a gate.
    Entered(String),
    /// A piece of work waits for the test to release its key.
    Held(String),
    /// The test released a key.
    Freed(String),
    /// A handler noted a label.
    Mark(String),
    /// A line the function wrote on its standard error.
    Output(String),
}

/// One thing seen, and when.
#[derive(Debug, Clone)]
pub struct Event {
    /// When.
    pub at: Instant,
    /// What.
    pub seen: Seen,
}

/// One invocation to deliver.
#[derive(Debug, Clone)]
pub struct Invoke {
    /// Its request id.
    pub request_id: String,
    /// Its event.
    pub payload: Value,
    /// Its deadline, from its delivery.
    pub timeout: Duration,
}

impl Invoke {
    /// An SQS event with no records.
    pub fn sqs(request_id: &str, timeout: Duration) -> Self {
        Self {
            request_id: request_id.to_owned(),
            payload: json!({"Records": []}),
            timeout,
        }
    }

    /// An API Gateway HTTP API (v2) event: `GET` of `path_and_query`.
    pub fn http_get(request_id: &str, path_and_query: &str, timeout: Duration) -> Self {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        Self {
            request_id: request_id.to_owned(),
            payload: json!({
                "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": query,
                "headers": {"host": "fake-lambda"}, "isBase64Encoded": false,
                "requestContext": {
                    "accountId": "123456789012", "apiId": "fake", "domainName": "fake-lambda",
                    "domainPrefix": "fake", "requestId": request_id, "routeKey": "$default",
                    "stage": "$default", "time": "01/Jan/2026:00:00:00 +0000", "timeEpoch": 0,
                    "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "fake-lambda"}
                }
            }),
            timeout,
        }
    }
}

/// The invocation the runtime holds, one at a time.
struct Current {
    request_id: String,
    answered: bool,
    /// Extensions registered for `INVOKE` that have not asked for their next event since.
    held_by: HashSet<String>,
}

struct Extension {
    invoke: bool,
    /// Events to hand over, oldest first.
    pending: VecDeque<Value>,
    /// The invocation whose event it has, until it asks for the next.
    has: Option<String>,
}

#[derive(Default)]
struct Ledger {
    queue: VecDeque<Invoke>,
    current: Option<Current>,
    extensions: HashMap<String, Extension>,
    gates: HashMap<String, usize>,
    released: HashSet<String>,
    timeline: Vec<Event>,
}

impl Ledger {
    fn note(&mut self, seen: Seen) {
        self.timeline.push(Event {
            at: Instant::now(),
            seen,
        });
    }
}

struct Shared {
    model: Model,
    state: Mutex<Ledger>,
    changed: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Ledger> {
        self.state.lock().expect("fake Lambda state")
    }

    fn note(&self, seen: Seen) {
        self.change(|ledger| ledger.note(seen));
    }

    /// Changes the ledger (and notes what was seen in the same breath, so that the
    /// timeline never shows a change after what it allowed), then wakes every waiter.
    fn change<T>(&self, change: impl FnOnce(&mut Ledger) -> T) -> T {
        let changed = change(&mut self.state());
        self.changed.notify_waiters();
        changed
    }

    /// Waits until `ready` gives a value, looking again after each change.
    async fn until<T>(&self, mut ready: impl FnMut(&mut Ledger) -> Option<T>) -> T {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(value) = ready(&mut self.state()) {
                self.changed.notify_waiters();
                return value;
            }
            changed.await;
        }
    }
}

/// The fake service, serving until dropped.
pub struct FakeLambda {
    address: SocketAddr,
    shared: Arc<Shared>,
    started: Instant,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeLambda {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The function's process: killed when dropped.
pub struct Function {
    child: Child,
    /// Says when the process's standard error was read to its end.
    output_read: std::sync::mpsc::Receiver<()>,
}

impl Function {
    /// Kills the process and waits (at most `within`) until every line it wrote to its
    /// standard error is in the timeline: a line written before an answer may still be
    /// in the pipe when the answer is seen.
    ///
    /// # Panics
    ///
    /// If its standard error is still open after `within` (something it started holds it).
    pub fn stop(mut self, within: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.output_read
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("the function's standard error was still open {within:?} after it stopped"));
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl FakeLambda {
    /// Serves on a free loopback port.
    pub async fn start(model: Model) -> Self {
        let shared = Arc::new(Shared {
            model,
            state: Mutex::default(),
            changed: Notify::new(),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next_invocation))
            .route("/2018-06-01/runtime/invocation/{id}/response", post(answered))
            .route("/2018-06-01/runtime/invocation/{id}/error", post(failed))
            .route("/2020-01-01/extension/register", post(register))
            .route("/2020-01-01/extension/event/next", get(next_event))
            .route("/test/gate/{name}/{count}", get(gate))
            .route("/test/hold/{key}", get(hold))
            .route("/test/mark/{label}", get(mark))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("its address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the fake Lambda serves");
        });
        Self {
            address,
            shared,
            started: Instant::now(),
            server,
        }
    }

    /// `AWS_LAMBDA_RUNTIME_API`: host and port.
    pub fn runtime_api(&self) -> String {
        self.address.to_string()
    }

    /// When it started, the origin of the figures tests print.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Queues an invocation.
    pub fn invoke(&self, invoke: Invoke) {
        self.shared.change(|ledger| ledger.queue.push_back(invoke));
    }

    /// Lets the work held on `key` go on.
    pub fn release(&self, key: &str) {
        self.shared.change(|ledger| {
            ledger.released.insert(key.to_owned());
            ledger.note(Seen::Freed(key.to_owned()));
        });
    }

    /// Everything seen so far.
    pub fn timeline(&self) -> Vec<Event> {
        self.shared.state().timeline.clone()
    }

    /// The first event `matches` picks, waiting for it at most `within`; `Err` with the
    /// timeline so far otherwise.
    pub async fn wait_for(&self, within: Duration, matches: impl Fn(&Seen) -> bool) -> Result<Event, String> {
        let found = self
            .shared
            .until(|state| state.timeline.iter().find(|event| matches(&event.seen)).cloned());
        tokio::time::timeout(within, found).await.map_err(|_| self.describe())
    }

    /// The timeline, one event a line, times from the start.
    pub fn describe(&self) -> String {
        self.timeline()
            .iter()
            .map(|event| format!("{:>7.1} ms {:?}", self.ms(event.at), event.seen))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Milliseconds from the start to `at`.
    pub fn ms(&self, at: Instant) -> f64 {
        at.duration_since(self.started).as_secs_f64() * 1000.0
    }

    /// Starts test `test` of this test binary, alone, as the function's process:
    /// `AWS_LAMBDA_RUNTIME_API` pointing here, the function's variables Lambda sets (its
    /// `AWS_LAMBDA_INITIALIZATION_TYPE` the model's), `AWS_LAMBDA_MAX_CONCURRENCY` as given
    /// (unset: Lambda default), `RUST_LOG` as given, and `OUTBOX_TESTS_LAMBDA_FUNCTION` set
    /// to `role`, for the test to know it is the function, and which. Its standard error
    /// lines join the timeline.
    pub fn start_function(&self, test: &str, role: &str, max_concurrency: Option<u32>, rust_log: &str) -> Function {
        let binary = std::env::current_exe().expect("the test binary");
        let mut command = Command::new(binary);
        command
            .args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("OUTBOX_TESTS_LAMBDA_FUNCTION", role)
            .env("AWS_LAMBDA_RUNTIME_API", self.runtime_api())
            .env("AWS_LAMBDA_FUNCTION_NAME", "fake-function")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "2048")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env(
                "AWS_LAMBDA_INITIALIZATION_TYPE",
                match self.shared.model {
                    Model::OneAtATime => "on-demand",
                    Model::ManagedInstances => "lambda-managed-instances",
                },
            )
            .env("RUST_LOG", rust_log)
            .env_remove("AWS_LAMBDA_MAX_CONCURRENCY")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_TRACES_EXPORTER")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(concurrency) = max_concurrency {
            command.env("AWS_LAMBDA_MAX_CONCURRENCY", concurrency.to_string());
        }
        let mut child = command.spawn().expect("the function's process starts");
        let stderr = child.stderr.take().expect("its standard error");
        let shared = self.shared.clone();
        let (read, output_read) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                shared.note(Seen::Output(line));
            }
            let _ = read.send(());
        });
        Function { child, output_read }
    }
}

/// Milliseconds since the epoch.
fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).expect("after the epoch").as_millis() as u64
}

async fn next_invocation(State(shared): State<Arc<Shared>>) -> Response {
    let model = shared.model;
    let invoke = shared
        .until(|state| {
            if model == Model::OneAtATime {
                if let Some(current) = &state.current {
                    // This call is the runtime's next after its answer: the invocation
                    // ends once every extension has asked for its next event too.
                    if !current.answered || !current.held_by.is_empty() {
                        return None;
                    }
                }
            }
            let invoke = state.queue.pop_front()?;
            let deadline_ms = epoch_ms(SystemTime::now() + invoke.timeout);
            let event = json!({
                "eventType": "INVOKE", "deadlineMs": deadline_ms, "requestId": invoke.request_id,
                "invokedFunctionArn": "arn:aws:lambda:us-east-1:123456789012:function:fake-function",
                "tracing": {"type": "X-Amzn-Trace-Id", "value": trace_id(&invoke.request_id)}
            });
            let mut held_by = HashSet::new();
            for (id, extension) in state.extensions.iter_mut().filter(|(_, extension)| extension.invoke) {
                extension.pending.push_back(event.clone());
                held_by.insert(id.clone());
            }
            state.current = Some(Current {
                request_id: invoke.request_id.clone(),
                answered: false,
                held_by,
            });
            state.note(Seen::Delivered(invoke.request_id.clone()));
            Some((invoke, deadline_ms))
        })
        .await;
    let (invoke, deadline_ms) = invoke;
    (
        [
            ("Lambda-Runtime-Aws-Request-Id", invoke.request_id.clone()),
            ("Lambda-Runtime-Deadline-Ms", deadline_ms.to_string()),
            (
                "Lambda-Runtime-Invoked-Function-Arn",
                "arn:aws:lambda:us-east-1:123456789012:function:fake-function".to_owned(),
            ),
            ("Lambda-Runtime-Trace-Id", trace_id(&invoke.request_id)),
            ("Content-Type", "application/json".to_owned()),
        ],
        Json(invoke.payload),
    )
        .into_response()
}

fn trace_id(request_id: &str) -> String {
    let digits: String = request_id
        .bytes()
        .map(|byte| format!("{:x}", byte % 16))
        .chain(std::iter::repeat("0".to_owned()))
        .take(24)
        .collect();
    format!("Root=1-00000000-{digits};Parent=0000000000000001;Sampled=1")
}

fn body_json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
}

async fn answered(State(shared): State<Arc<Shared>>, Path(id): Path<String>, body: String) -> StatusCode {
    shared.change(|ledger| {
        settle(ledger, &id);
        ledger.note(Seen::Answered(id, body_json(&body)));
    });
    StatusCode::ACCEPTED
}

async fn failed(State(shared): State<Arc<Shared>>, Path(id): Path<String>, body: String) -> StatusCode {
    shared.change(|ledger| {
        settle(ledger, &id);
        ledger.note(Seen::Failed(id, body_json(&body)));
    });
    StatusCode::ACCEPTED
}

fn settle(ledger: &mut Ledger, request_id: &str) {
    if let Some(current) = ledger
        .current
        .as_mut()
        .filter(|current| current.request_id == request_id)
    {
        current.answered = true;
    }
}

async fn register(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let name = headers
        .get("Lambda-Extension-Name")
        .and_then(|name| name.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let events: Vec<String> = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|body| serde_json::from_value(body["events"].clone()).ok())
        .unwrap_or_default();
    let invoke = events.iter().any(|event| event == "INVOKE");
    if invoke && shared.model == Model::ManagedInstances {
        shared.note(Seen::Refused(name, events));
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({
                "errorMessage": "Lambda Managed Instances deliver no INVOKE events to extensions",
                "errorType": "Extension.InvalidEventType"
            })),
        )
            .into_response();
    }
    let id = format!("extension-{name}");
    shared.change(|ledger| {
        ledger.extensions.insert(
            id.clone(),
            Extension {
                invoke,
                pending: VecDeque::new(),
                has: None,
            },
        );
        ledger.note(Seen::Registered(name, events));
    });
    (
        [("Lambda-Extension-Identifier", id)],
        Json(json!({"functionName": "fake-function", "functionVersion": "1", "handler": "bootstrap"})),
    )
        .into_response()
}

async fn next_event(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(id) = headers
        .get("Lambda-Extension-Identifier")
        .and_then(|id| id.to_str().ok())
        .map(str::to_owned)
    else {
        return StatusCode::FORBIDDEN.into_response();
    };
    // Asking for the next event ends its part in the invocation whose event it has.
    shared.change(|ledger| {
        if let Some(request_id) = ledger
            .extensions
            .get_mut(&id)
            .and_then(|extension| extension.has.take())
        {
            if let Some(current) = ledger
                .current
                .as_mut()
                .filter(|current| current.request_id == request_id)
            {
                current.held_by.remove(&id);
            }
            ledger.note(Seen::Released(request_id));
        }
    });
    let event = shared
        .until(|state| {
            let extension = state.extensions.get_mut(&id)?;
            let event = extension.pending.pop_front()?;
            extension.has = event["requestId"].as_str().map(str::to_owned);
            Some(event)
        })
        .await;
    Json(event).into_response()
}

async fn gate(State(shared): State<Arc<Shared>>, Path((name, count)): Path<(String, usize)>) -> StatusCode {
    shared.change(|ledger| {
        *ledger.gates.entry(name.clone()).or_default() += 1;
        ledger.note(Seen::Entered(name.clone()));
    });
    shared
        .until(|state| (state.gates.get(&name).copied().unwrap_or(0) >= count).then_some(()))
        .await;
    StatusCode::NO_CONTENT
}

async fn hold(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> StatusCode {
    shared.note(Seen::Held(key.clone()));
    shared.until(|state| state.released.contains(&key).then_some(())).await;
    StatusCode::NO_CONTENT
}

async fn mark(State(shared): State<Arc<Shared>>, Path(label): Path<String>) -> StatusCode {
    shared.note(Seen::Mark(label));
    StatusCode::NO_CONTENT
}

/// From the function's side: `GET` of `path` on the fake at `runtime_api` (host and
/// port), on tokio's blocking pool; its status.
pub async fn call(runtime_api: &str, path: &str) -> std::io::Result<u16> {
    let (address, request) = (
        runtime_api.to_owned(),
        format!("GET {path} HTTP/1.1\r\nHost: {runtime_api}\r\nConnection: close\r\n\r\n"),
    );
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(address)?;
        stream.write_all(request.as_bytes())?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        reply
            .split(' ')
            .nth(1)
            .and_then(|status| status.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP reply: {reply:?}")))
    })
    .await
    .map_err(std::io::Error::other)?
}
