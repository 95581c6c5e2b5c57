//! A fault-injecting HTTP proxy on loopback, in front of the emulator's DynamoDB: it
//! forwards every request unchanged, except `TransactWriteItems`, which a plan may turn
//! into a commit whose outcome the client cannot know (applied with its reply lost, held
//! and forwarded after the client gave up, or dropped), and any other operation that a
//! second plan, by operation, names (a `PutItem` dropped, a `BatchGetItem` held, an
//! `UpdateItem`'s failed condition without its old item, a `BatchWriteItem` left
//! unprocessed). An operation's replies may also be rewritten on their way back
//! ([`FaultProxy::rewrite_replies`]: a `DescribeTable` answer given the `Replicas` a
//! global table has, which no emulator makes), for the real client to read.
//!
//! The server side is axum (HTTP/1.1 with keep-alive, as the SDK's client speaks it). The
//! forwarding side is a plain blocking `std::net::TcpStream` per request on tokio's
//! blocking pool, sending `Connection: close` and reading the reply by its
//! `Content-Length` (or chunks, or to the end): DynamoDB's JSON protocol is a POST with a
//! body and a reply with a body, so this is all it takes, and it needs no HTTP client
//! crate beyond what the tests crate already declares. Requests reach the engine (DynamoDB
//! Local; moto under `OUTBOX_TEST_DYNAMODB=moto`) one at a time, so that a late forward
//! never overlaps the next transaction's calls, and so that the run holds on moto too,
//! whose `TransactWriteItems` is not isolated under concurrent requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;

/// The `X-Amz-Target` of the commit.
pub const TRANSACT_WRITE_ITEMS: &str = "DynamoDB_20120810.TransactWriteItems";

/// Longest request body the proxy takes (DynamoDB's own limit on a transaction is 4 MB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// How long one exchange with the emulator may take before the proxy gives up on it.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy does with one `TransactWriteItems`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// (a) Forward it and pass the emulator's reply on.
    Forward,
    /// (b) Forward it, wait for the emulator's reply, then answer HTTP 500
    /// `InternalServerError` instead: applied (if the emulator took it), reply lost.
    ReplyLost,
    /// (c) Answer nothing, and forward it this long after it arrived, when the client
    /// has given up: a commit still in flight after its caller stopped waiting. Or
    /// sooner, when [`FaultProxy::release_next`] lets it go.
    Late(Duration),
    /// (d) Answer HTTP 500 `InternalServerError` without forwarding: it never applies.
    Drop,
    /// (e) Forward it and pass the reply on without the old items in its
    /// `CancellationReasons`: an engine that does not return `ALL_OLD`.
    WithoutOldItems,
    /// (f) Answer `TransactionCanceledException` with `TransactionConflict` for its first
    /// action and `None` for the rest, without forwarding: another transaction on the
    /// same item was under way (a busy item). Nothing applies.
    Conflict,
    /// (g) A `BatchGetItem` or `BatchWriteItem` answered, without forwarding, with every
    /// key or item of the request left unprocessed (`UnprocessedKeys`,
    /// `UnprocessedItems`), as DynamoDB answers when a partition's capacity ran out.
    /// Nothing applies. Any other request is forwarded.
    Unprocessed,
}

impl Fault {
    /// Whether the client cannot tell from the answer whether the commit applied: every
    /// fault but [`Fault::Forward`] (a 500 `InternalServerError`, or no answer at all).
    pub fn hides_outcome(self) -> bool {
        !matches!(
            self,
            Self::Forward | Self::WithoutOldItems | Self::Conflict | Self::Unprocessed
        )
    }

    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::ReplyLost => "reply_lost",
            Self::Late(_) => "late",
            Self::Drop => "drop",
            Self::WithoutOldItems => "without_old_items",
            Self::Conflict => "conflict",
            Self::Unprocessed => "unprocessed",
        }
    }
}

/// The emulator's reply to a forwarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Its HTTP status.
    pub status: u16,
    /// The error's `__type` after its `#`, if the reply is an error.
    pub error_type: Option<String>,
    /// Its body, as text.
    pub body: String,
}

impl Upstream {
    /// Whether the emulator applied the request (answered 200).
    pub fn applied(&self) -> bool {
        self.status == 200
    }
}

/// One `TransactWriteItems` the proxy intercepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intercepted {
    /// Its `ClientRequestToken` (the outbox sends the transaction id).
    pub token: Option<String>,
    /// What the plan chose.
    pub fault: Fault,
    /// What the emulator answered, once forwarded: never for [`Fault::Drop`], and for
    /// [`Fault::Late`] only once its delay has passed. `Err` when the exchange failed.
    pub upstream: Option<Result<Upstream, String>>,
}

/// The plan: what to do with each `TransactWriteItems`, given its `ClientRequestToken`.
pub type Plan = Box<dyn FnMut(Option<&str>) -> Fault + Send>;

/// The plan for every other operation, given its `X-Amz-Target` (such as
/// `DynamoDB_20120810.PutItem`): [`Fault::Conflict`] is a transaction's alone and is
/// forwarded here.
pub type OthersPlan = Box<dyn FnMut(&str) -> Fault + Send>;

/// A change made to a forwarded reply's JSON body before the client gets it.
pub type Rewrite = Arc<dyn Fn(&mut serde_json::Value) + Send + Sync>;

struct Shared {
    /// The emulator's `host:port`.
    upstream: String,
    plan: Mutex<Plan>,
    others_plan: Mutex<OthersPlan>,
    intercepted: Mutex<Vec<Intercepted>>,
    /// Replies to every other forwarded request: (target, reply).
    others: Mutex<Vec<(String, Result<Upstream, String>)>>,
    /// Held for each exchange with the emulator: one request at a time.
    one_at_a_time: Mutex<()>,
    /// Forwards scheduled or running, late ones included.
    in_flight: AtomicUsize,
    /// The late requests still held, oldest first: sending lets one go at once.
    held: Mutex<std::collections::VecDeque<tokio::sync::oneshot::Sender<()>>>,
    /// Rewrites of the replies to other operations forwarded, by `X-Amz-Target`.
    rewrites: Mutex<Vec<(String, Rewrite)>>,
}

/// Where a forwarded request's reply is recorded.
#[derive(Clone)]
enum Record {
    Intercepted(usize),
    Other(String),
}

/// Header names and raw values, as read off the wire.
type Headers = Vec<(String, Vec<u8>)>;

/// A reply as read off the wire.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Headers,
    body: Vec<u8>,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    endpoint: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (an endpoint URL
    /// such as `http://127.0.0.1:5000`), applying `plan` to each `TransactWriteItems`.
    pub async fn start(upstream: &str, plan: impl FnMut(Option<&str>) -> Fault + Send + 'static) -> Self {
        Self::start_with_others(upstream, plan, |_| Fault::Forward).await
    }

    /// [`Self::start`], with `others` applied to every request but `TransactWriteItems`.
    pub async fn start_with_others(
        upstream: &str,
        plan: impl FnMut(Option<&str>) -> Fault + Send + 'static,
        others: impl FnMut(&str) -> Fault + Send + 'static,
    ) -> Self {
        let authority = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_owned();
        let shared = Arc::new(Shared {
            upstream: authority,
            plan: Mutex::new(Box::new(plan)),
            others_plan: Mutex::new(Box::new(others)),
            intercepted: Mutex::new(Vec::new()),
            others: Mutex::new(Vec::new()),
            one_at_a_time: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            held: Mutex::new(std::collections::VecDeque::new()),
            rewrites: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the fault proxy");
        let endpoint = format!("http://{}", listener.local_addr().expect("a bound address"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the fault proxy serves");
        });
        Self {
            endpoint,
            shared,
            server,
        }
    }

    /// Its endpoint URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// From now on, the reply to every forwarded request with `X-Amz-Target` `target`
    /// (`DynamoDB_20120810.DescribeTable`, ...) reaches the client with its JSON body
    /// changed by `rewrite` (its checksum dropped, as for a body it no longer has), a
    /// successful one or an error alike. A second rewrite of one target replaces the first.
    pub fn rewrite_replies(&self, target: &str, rewrite: impl Fn(&mut serde_json::Value) + Send + Sync + 'static) {
        let mut rewrites = self.shared.rewrites.lock().expect("proxy lock");
        rewrites.retain(|(seen, _)| seen != target);
        rewrites.push((target.to_owned(), Arc::new(rewrite)));
    }

    /// Every `TransactWriteItems` intercepted so far, in arrival order.
    pub fn intercepted(&self) -> Vec<Intercepted> {
        self.shared.intercepted.lock().expect("proxy lock").clone()
    }

    /// The emulator's replies to the other requests with `X-Amz-Target` `target`
    /// (`DynamoDB_20120810.PutItem`, ...), in order.
    pub fn replies(&self, target: &str) -> Vec<Result<Upstream, String>> {
        let others = self.shared.others.lock().expect("proxy lock");
        others
            .iter()
            .filter(|(seen, _)| seen == target)
            .map(|(_, reply)| reply.clone())
            .collect()
    }

    /// Lets the oldest request still held by [`Fault::Late`] go on to the emulator now,
    /// before its delay ends; false when none is held (each went on when its delay
    /// ended). A scenario holds a request as long as it needs, whatever the machine's
    /// speed, and lets it land exactly when it means to.
    pub fn release_next(&self) -> bool {
        let mut held = self.shared.held.lock().expect("proxy lock");
        while let Some(release) = held.pop_front() {
            if release.send(()).is_ok() {
                return true;
            }
        }
        false
    }

    /// Forwards scheduled or running now, late ones included.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no forward is scheduled or running (every late one has reached the
    /// emulator and been answered), polling; panics after `limit`.
    pub async fn quiesce(&self, limit: Duration) {
        let started = std::time::Instant::now();
        while self.in_flight() > 0 {
            assert!(
                started.elapsed() < limit,
                "{} forwards still in flight after {limit:?}",
                self.in_flight()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(error) => return injected(StatusCode::BAD_REQUEST, &format!("proxy: unreadable body: {error}")),
    };
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let raw = encode_request(&parts, &body);
    if target != TRANSACT_WRITE_ITEMS {
        let fault = match (shared.others_plan.lock().expect("proxy lock"))(&target) {
            Fault::Conflict => Fault::Forward,
            fault => fault,
        };
        if fault == Fault::Unprocessed {
            if let Some(answer) = unprocessed(&target, &body) {
                return answer;
            }
        }
        let rewrite = (shared.rewrites.lock().expect("proxy lock"))
            .iter()
            .find(|(seen, _)| *seen == target)
            .map(|(_, rewrite)| rewrite.clone());
        if let (Fault::Forward, Some(rewrite)) = (fault, rewrite) {
            let reply = start_forward(&shared, raw, Record::Other(target)).await;
            return respond(reply.map(|reply| rewritten(reply, rewrite.as_ref())));
        }
        return apply(&shared, fault, raw, &body, Record::Other(target)).await;
    }
    let token = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|request| {
            request
                .get("ClientRequestToken")
                .and_then(|token| token.as_str())
                .map(str::to_owned)
        });
    let fault = match (shared.plan.lock().expect("proxy lock"))(token.as_deref()) {
        Fault::Unprocessed => Fault::Forward,
        fault => fault,
    };
    let index = {
        let mut intercepted = shared.intercepted.lock().expect("proxy lock");
        intercepted.push(Intercepted {
            token,
            fault,
            upstream: None,
        });
        intercepted.len() - 1
    };
    apply(&shared, fault, raw, &body, Record::Intercepted(index)).await
}

/// Does what `fault` says with the request `raw` (whose body is `body`).
async fn apply(shared: &Arc<Shared>, fault: Fault, raw: Vec<u8>, body: &[u8], record: Record) -> Response {
    match fault {
        Fault::Forward => respond(start_forward(shared, raw, record).await),
        Fault::ReplyLost => {
            // Whatever the emulator did, the client hears only that something failed.
            let _ = start_forward(shared, raw, record).await;
            injected(StatusCode::INTERNAL_SERVER_ERROR, "injected: reply lost")
        }
        Fault::Drop => injected(StatusCode::INTERNAL_SERVER_ERROR, "injected: dropped, never forwarded"),
        Fault::WithoutOldItems => respond(start_forward(shared, raw, record).await.map(without_old_items)),
        Fault::Conflict => conflict(body),
        // Answered in `handle` where the operation is a batch; forwarded otherwise.
        Fault::Unprocessed => respond(start_forward(shared, raw, record).await),
        Fault::Late(delay) => {
            // Counted from now, so that `quiesce` waits for the delay too. The task runs
            // on even when the client has gone and this handler is dropped.
            shared.in_flight.fetch_add(1, Ordering::SeqCst);
            let (release, released) = tokio::sync::oneshot::channel();
            shared.held.lock().expect("proxy lock").push_back(release);
            let late = {
                let shared = shared.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = released => {}
                    }
                    let forwarded = start_forward(&shared, raw, record);
                    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                    forwarded.await
                })
            };
            // Nobody is normally listening any more when this answers.
            match late.await {
                Ok(reply) => respond(reply),
                Err(error) => injected(StatusCode::INTERNAL_SERVER_ERROR, &format!("proxy: {error}")),
            }
        }
    }
}

/// Starts forwarding `raw` to the emulator on the blocking pool, counted in flight until
/// its reply is recorded. It runs to its end even if the returned handle is dropped.
fn start_forward(
    shared: &Arc<Shared>,
    raw: Vec<u8>,
    record: Record,
) -> impl std::future::Future<Output = Result<Reply, String>> {
    shared.in_flight.fetch_add(1, Ordering::SeqCst);
    let shared = shared.clone();
    let exchange = tokio::task::spawn_blocking(move || {
        let reply = {
            let _one = shared
                .one_at_a_time
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            exchange(&shared.upstream, &raw).map_err(|error| format!("proxy: forwarding failed: {error}"))
        };
        let seen = reply.as_ref().map(upstream_of).map_err(Clone::clone);
        match record {
            Record::Intercepted(index) => {
                shared.intercepted.lock().expect("proxy lock")[index].upstream = Some(seen);
            }
            Record::Other(target) => shared.others.lock().expect("proxy lock").push((target, seen)),
        }
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        reply
    });
    async move { exchange.await.map_err(|error| format!("proxy: {error}"))? }
}

/// DynamoDB's cancellation of the transaction `body` for a conflict with another one on
/// its first action's item: one reason per action, in request order.
fn conflict(body: &[u8]) -> Response {
    let actions = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|request| request.get("TransactItems")?.as_array().map(Vec::len))
        .unwrap_or(1);
    let reasons: Vec<serde_json::Value> = (0..actions)
        .map(|index| {
            if index == 0 {
                serde_json::json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"})
            } else {
                serde_json::json!({"Code": "None"})
            }
        })
        .collect();
    let body = serde_json::json!({
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict]",
        "CancellationReasons": reasons,
    });
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

/// The answer of a `BatchGetItem` or `BatchWriteItem` (`target`) whose request `body`
/// was left wholly unprocessed: its `RequestItems` returned as they came, nothing read or
/// written. `None` for any other operation, or a body that cannot be read.
fn unprocessed(target: &str, body: &[u8]) -> Option<Response> {
    let request = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    let items = request.get("RequestItems")?.clone();
    let answer = match target.rsplit('.').next()? {
        "BatchGetItem" => serde_json::json!({"Responses": {}, "UnprocessedKeys": items}),
        "BatchWriteItem" => serde_json::json!({"UnprocessedItems": items}),
        _ => return None,
    };
    Some(
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
            .body(Body::from(answer.to_string()))
            .expect("a valid response"),
    )
}

/// `reply` with no `Item` in any of its `CancellationReasons`, nor in a failed
/// condition's answer (`ConditionalCheckFailedException`), and no checksum of the body it
/// no longer has.
fn without_old_items(mut reply: Reply) -> Reply {
    let Ok(mut body) = serde_json::from_slice::<serde_json::Value>(&reply.body) else {
        return reply;
    };
    let mut changed = false;
    if let Some(reasons) = body
        .get_mut("CancellationReasons")
        .and_then(|reasons| reasons.as_array_mut())
    {
        for reason in reasons {
            if let Some(reason) = reason.as_object_mut() {
                reason.remove("Item");
            }
        }
        changed = true;
    }
    let failed_condition = body
        .get("__type")
        .and_then(|kind| kind.as_str())
        .is_some_and(|kind| kind.ends_with("ConditionalCheckFailedException"));
    if failed_condition {
        if let Some(error) = body.as_object_mut() {
            changed |= error.remove("Item").is_some();
        }
    }
    if changed {
        reply.body = serde_json::to_vec(&body).expect("JSON");
        reply
            .headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case("x-amz-crc32"));
    }
    reply
}

/// `reply` with its JSON body changed by `rewrite`, and no checksum of the body it no
/// longer has; unchanged when its body is not JSON.
fn rewritten(mut reply: Reply, rewrite: &(dyn Fn(&mut serde_json::Value) + Send + Sync)) -> Reply {
    let Ok(mut body) = serde_json::from_slice::<serde_json::Value>(&reply.body) else {
        return reply;
    };
    rewrite(&mut body);
    reply.body = serde_json::to_vec(&body).expect("JSON");
    reply
        .headers
        .retain(|(name, _)| !name.eq_ignore_ascii_case("x-amz-crc32"));
    reply
}

fn upstream_of(reply: &Reply) -> Upstream {
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    let error_type = (reply.status != 200)
        .then(|| serde_json::from_str::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|error| {
            let kind = error.get("__type")?.as_str()?;
            Some(kind.rsplit('#').next().unwrap_or(kind).to_owned())
        });
    Upstream {
        status: reply.status,
        error_type,
        body,
    }
}

/// An answer in DynamoDB's wire format for errors.
fn injected(status: StatusCode, message: &str) -> Response {
    let kind = if status == StatusCode::INTERNAL_SERVER_ERROR {
        "InternalServerError"
    } else {
        "ValidationException"
    };
    let body = serde_json::json!({
        "__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"),
        "message": message,
    });
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

/// The emulator's reply passed on (hop-by-hop and framing headers dropped: the server
/// frames the body itself), or a 500 when the exchange failed.
fn respond(reply: Result<Reply, String>) -> Response {
    let reply = match reply {
        Ok(reply) => reply,
        Err(error) => return injected(StatusCode::INTERNAL_SERVER_ERROR, &error),
    };
    let mut response = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        if is_framing(name) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value)) {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from(reply.body))
        .unwrap_or_else(|error| injected(StatusCode::INTERNAL_SERVER_ERROR, &format!("proxy: {error}")))
}

/// Headers about one connection or the body's framing, which a proxy does not pass on.
fn is_framing(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

/// The request as HTTP/1.1 bytes, unchanged but for its framing: `Content-Length` and
/// `Connection: close` (one exchange per connection).
fn encode_request(parts: &axum::http::request::Parts, body: &[u8]) -> Vec<u8> {
    let target = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut raw = format!("{} {target} HTTP/1.1\r\n", parts.method).into_bytes();
    for (name, value) in &parts.headers {
        if is_framing(name.as_str()) {
            continue;
        }
        raw.extend_from_slice(name.as_str().as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value.as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
    raw.extend_from_slice(body);
    raw
}

/// One request and its reply on a fresh connection to `authority`.
fn exchange(authority: &str, raw: &[u8]) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(UPSTREAM_TIMEOUT))?;
    stream.set_write_timeout(Some(UPSTREAM_TIMEOUT))?;
    stream.set_nodelay(true)?;
    stream.write_all(raw)?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..read]);
        if complete(&bytes) {
            break;
        }
    }
    parse_reply(&bytes)
}

fn invalid(reason: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unreadable reply: {reason}"))
}

fn header_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// The reply's status line and headers, and where its body starts.
fn head(bytes: &[u8]) -> Option<(u16, Headers, usize)> {
    let end = header_end(bytes)?;
    let text = &bytes[..end - 4];
    let mut lines = text
        .split(|byte| *byte == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let status_line = std::str::from_utf8(lines.next()?).ok()?;
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| {
            let colon = line.iter().position(|byte| *byte == b':')?;
            let name = std::str::from_utf8(&line[..colon]).ok()?.trim().to_owned();
            let value = line[colon + 1..].trim_ascii().to_vec();
            Some((name, value))
        })
        .collect();
    Some((status, headers, end))
}

fn header_value<'h>(headers: &'h Headers, name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|(seen, _)| seen.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_slice())
}

fn content_length(headers: &Headers) -> Option<usize> {
    std::str::from_utf8(header_value(headers, "content-length")?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn is_chunked(headers: &Headers) -> bool {
    header_value(headers, "transfer-encoding")
        .is_some_and(|value| String::from_utf8_lossy(value).to_ascii_lowercase().contains("chunked"))
}

/// Whether `bytes` hold a whole reply (else reading goes on to the end of the stream).
fn complete(bytes: &[u8]) -> bool {
    let Some((_, headers, start)) = head(bytes) else {
        return false;
    };
    if is_chunked(&headers) {
        return decode_chunked(&bytes[start..]).is_some();
    }
    content_length(&headers).is_some_and(|length| bytes.len() >= start + length)
}

fn decode_chunked(mut bytes: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = bytes.windows(2).position(|window| window == b"\r\n")?;
        let size_text = std::str::from_utf8(&bytes[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        bytes = &bytes[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        if bytes.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

fn parse_reply(bytes: &[u8]) -> std::io::Result<Reply> {
    let (status, headers, start) = head(bytes).ok_or_else(|| invalid("no status line and headers"))?;
    let rest = &bytes[start..];
    let body = if is_chunked(&headers) {
        decode_chunked(rest).ok_or_else(|| invalid("a truncated chunked body"))?
    } else {
        match content_length(&headers) {
            Some(length) if rest.len() >= length => rest[..length].to_vec(),
            Some(_) => return Err(invalid("a body shorter than its Content-Length")),
            None => rest.to_vec(),
        }
    };
    Ok(Reply { status, headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_by_length_by_chunks_or_to_the_end() {
        let sized = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-amz-crc32: 1\r\n\r\n{}";
        assert!(complete(sized));
        let reply = parse_reply(sized).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"{}"[..]));
        assert_eq!(header_value(&reply.headers, "X-Amz-Crc32"), Some(&b"1"[..]));

        let chunked = b"HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert!(complete(chunked));
        assert_eq!(parse_reply(chunked).unwrap().body, b"abcde");
        assert!(!complete(&chunked[..chunked.len() - 5]));

        let closed = b"HTTP/1.0 500 Oops\r\n\r\nbody";
        assert!(!complete(closed), "no framing: read to the end");
        assert_eq!(parse_reply(closed).unwrap().body, b"body");
    }

    #[test]
    fn errors_name_their_type() {
        let reply = Reply {
            status: 400,
            headers: vec![],
            body: br#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"x"}"#
                .to_vec(),
        };
        let upstream = upstream_of(&reply);
        assert_eq!(upstream.error_type.as_deref(), Some("TransactionCanceledException"));
        assert!(!upstream.applied());
    }
}
