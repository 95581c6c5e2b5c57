//! A busy item: N requests at once, each reserving 1 unit of one product with N/2 in
//! stock (the inventory example, whose reservations retry version conflicts), on the
//! embedded backend and on DynamoDB Local, from one process and from several (request
//! paths of their own over the same table, as Lambda environments are). Exactly N/2 are
//! made and N/2 refused as out of stock, none refused for a concurrent change, each
//! within its request's deadline; the counts and the latencies are printed.
//!
//! Small here (`HOT_ITEM_REQUESTS`, default 20; `HOT_ITEM_PROCESSES`, default 4);
//! `scripts/hot-item` runs it large on a release build.
//!
//! What spreads the contenders of several processes is checked apart, where it can be
//! seen: the pauses of a step that meets a conflict at every round, on a clock that
//! moves only by them, drawn at random up to a ceiling that doubles to the cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use outbox::http::{enforce_deadline, Deadlines};
use outbox::ports::{ItemKey, RandomIds, SystemClock};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::{Timing, TransactionLimits};
use outbox_tests::conformance::Backend;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The local request timeout of the service (the API's default).
const TIMEOUT: Duration = Duration::from_secs(10);

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|text| text.parse().unwrap_or_else(|_| panic!("{name}: a count, not {text:?}")))
        .unwrap_or(default)
}

/// What the requests were answered.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    made: usize,
    out_of_stock: usize,
    version_conflict: usize,
    other: Vec<(u16, String)>,
}

/// The inventory's routes behind the deadline middleware, over `outbox`.
fn app(outbox: Outbox) -> Router {
    inventory::router().route_layer(axum::middleware::from_fn_with_state(
        Deadlines::new(outbox, TIMEOUT),
        enforce_deadline,
    ))
}

async fn post(app: &Router, uri: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs the busy item on `backend`: `requests` at once over `processes` request paths.
async fn run(backend: &Backend, requests: usize, processes: usize) {
    let ports = RequestPorts {
        store: backend.store.clone(),
        control_queue: backend.control_queue.clone(),
        clock: Arc::new(SystemClock),
        ids: Arc::new(RandomIds),
    };
    let first = Outbox::new(ports, Timing::default(), TransactionLimits::default());
    let apps: Vec<Router> = (0..processes)
        .map(|index| match index {
            0 => app(first.clone()),
            _ => app(first.as_another_process()),
        })
        .collect();
    let stock = requests / 2;
    let product = outbox_tests::emulator::unique_name("hot");
    let (status, body) = post(&apps[0], "/products", json!({"product_id": product, "stock": stock})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let start = Arc::new(tokio::sync::Barrier::new(requests));
    let uri = format!("/products/{product}/reservations");
    let calls = (0..requests).map(|index| {
        let (app, start, uri) = (apps[index % processes].clone(), start.clone(), uri.clone());
        tokio::spawn(async move {
            start.wait().await;
            let began = Instant::now();
            let (status, body) = post(&app, &uri, json!({"quantity": 1})).await;
            (status, body, began.elapsed())
        })
    });
    let answers: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();

    let mut counts = Counts::default();
    let mut latencies: Vec<Duration> = Vec::with_capacity(requests);
    for (status, body, took) in &answers {
        latencies.push(*took);
        match (*status, body["type"].as_str()) {
            (StatusCode::CREATED, _) => counts.made += 1,
            (StatusCode::CONFLICT, Some("/problems/out-of-stock")) => counts.out_of_stock += 1,
            (StatusCode::CONFLICT, Some("/problems/version-conflict")) => counts.version_conflict += 1,
            (status, kind) => counts
                .other
                .push((status.as_u16(), kind.unwrap_or_default().to_owned())),
        }
    }
    latencies.sort();
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    println!(
        "hot item on {}: {requests} requests, stock {stock}, {processes} process(es): 201 x {}, out-of-stock x {}, \
         version-conflict x {}, other x {} {:?}; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        backend.engine(),
        counts.made,
        counts.out_of_stock,
        counts.version_conflict,
        counts.other.len(),
        counts.other,
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(*latencies.last().expect("at least one request")),
    );

    // What the product holds: every unit sold once, none twice.
    let key: ItemKey = format!("PRODUCT#{product}").parse().unwrap();
    let items = backend.store.get_items(std::slice::from_ref(&key)).await.unwrap();
    let left = items[&key].data["stock"].as_u64();
    assert_eq!(
        (counts, left),
        (
            Counts {
                made: stock,
                out_of_stock: requests - stock,
                version_conflict: 0,
                other: Vec::new(),
            },
            Some(0)
        ),
        "each answered by the business rule, the stock sold out exactly"
    );
    let slowest = *latencies.last().unwrap();
    assert!(
        slowest < TIMEOUT,
        "every answer within its request's timeout: {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_item_on_the_embedded_backend_is_answered_by_the_stock_alone() {
    let backend = Backend::embedded();
    let requests = knob("HOT_ITEM_REQUESTS", 20);
    run(&backend, requests, 1).await;
    run(&backend, requests, knob("HOT_ITEM_PROCESSES", 4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_item_on_dynamodb_local_is_answered_by_the_stock_alone() {
    let backend = Backend::aws().await;
    let requests = knob("HOT_ITEM_REQUESTS", 20);
    run(&backend, requests, 1).await;
    run(&backend, requests, knob("HOT_ITEM_PROCESSES", 4)).await;
}

/// A clock that moves only by the pauses slept on it, and keeps them.
struct PauseRecorder {
    clock: outbox::embedded::ManualClock,
    pauses: std::sync::Mutex<Vec<Duration>>,
}

#[async_trait::async_trait]
impl outbox::ports::Clock for PauseRecorder {
    fn now(&self) -> outbox::time::Timestamp {
        self.clock.now()
    }

    async fn sleep(&self, duration: Duration) {
        self.pauses.lock().unwrap().push(duration);
        self.clock.sleep(duration).await;
    }

    async fn timer(&self, duration: Duration) {
        self.clock.timer(duration).await;
    }
}

/// Why contenders of several processes come back apart: a step that meets a conflict
/// at every commit (a rival of another process changes the item between its read and
/// its commit, each time), through `retry_conflicts` to its deadline, pauses before each
/// round for a time drawn at random up to a ceiling that doubles from the first pause
/// (10 ms) up to the cap (500 ms), spread evenly below it: never the ceiling itself each
/// time (contenders that met would meet again, all of them, after the same pause), nor
/// nothing. The clock moves only by the pauses, so 20 s of them take no time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_keeps_meeting_conflicts_pauses_at_random_up_to_a_doubling_ceiling() {
    use outbox::http::{Answer, HttpError, RequestScope};
    use outbox::ports::{Clock, ExpectedVersion};

    let backend = Backend::embedded();
    let recorder = Arc::new(PauseRecorder {
        clock: outbox::embedded::ManualClock::new(SystemClock.now()),
        pauses: std::sync::Mutex::default(),
    });
    let ports = RequestPorts {
        store: backend.store.clone(),
        control_queue: backend.control_queue.clone(),
        clock: recorder.clone(),
        ids: Arc::new(RandomIds),
    };
    let outbox = Outbox::new(ports, Timing::default(), TransactionLimits::default());
    let rival = outbox.as_another_process();
    // More than the rounds 20 s of pauses allow: a request whose pauses took no time
    // would otherwise never end.
    const RIVAL_WRITES: usize = 400;
    let ceilings = |round: usize| Duration::from_millis(10 << round.min(6)).min(Duration::from_millis(500));
    let (mut at_cap, mut statuses) = (Vec::new(), Vec::new());
    for request in 0..3 {
        let key: ItemKey = format!("COUNTER#jitter-{request}").parse().unwrap();
        let mut txn = outbox.begin().await.unwrap();
        txn.put(key.clone(), json!({"n": 0}), ExpectedVersion::Absent);
        txn.commit().await.unwrap();
        recorder.pauses.lock().unwrap().clear();
        let rival_writes = std::sync::atomic::AtomicUsize::new(0);
        let deadline = recorder.now().plus(Duration::from_secs(20));
        let scope = RequestScope::new(outbox.clone(), Some(deadline));
        let answer = scope
            .retry_conflicts(Some(key.clone()), None, |mut txn| {
                let (key, rival, rival_writes) = (key.clone(), rival.clone(), &rival_writes);
                async move {
                    let item = txn.get(&key).await?.expect("the counter exists");
                    if rival_writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < RIVAL_WRITES {
                        let mut theirs = rival.begin_entity(key.clone()).await?;
                        let current = theirs.get(&key).await?.expect("the counter exists");
                        let n = current.data["n"].as_u64().unwrap();
                        theirs.put(
                            key.clone(),
                            json!({"n": n + 1}),
                            ExpectedVersion::Exactly(current.version),
                        );
                        theirs.commit().await?;
                    }
                    let n = item.data["n"].as_u64().unwrap();
                    txn.put(key, json!({"n": n + 1}), ExpectedVersion::Exactly(item.version));
                    Ok::<_, HttpError>((txn, Answer::json(StatusCode::OK, &json!({"n": n + 1}))))
                }
            })
            .await;
        let status = match answer {
            Ok(response) => response.status(),
            Err(error) => axum::response::IntoResponse::into_response(error).status(),
        };
        let pauses = recorder.pauses.lock().unwrap().clone();
        for (round, pause) in pauses.iter().enumerate() {
            assert!(
                *pause <= ceilings(round),
                "request {request}, pause {round}: {pause:?} over its ceiling {:?}: {pauses:?}",
                ceilings(round)
            );
        }
        at_cap.extend(pauses.iter().skip(6).copied());
        statuses.push((status, pauses.len()));
    }
    let cap = Duration::from_millis(500);
    let mean = at_cap.iter().sum::<Duration>() / at_cap.len().max(1) as u32;
    let longest = at_cap.iter().max().copied().unwrap_or_default();
    let of_the_ceiling = at_cap.iter().filter(|pause| **pause == cap).count();
    let of_nothing = at_cap.iter().filter(|pause| pause.is_zero()).count();
    println!(
        "retry pauses at the cap: {} (mean {mean:?}, longest {longest:?}, {of_the_ceiling} of the ceiling, {of_nothing} of nothing); answers and pauses per request: {statuses:?}",
        at_cap.len()
    );
    assert!(
        mean >= cap.mul_f64(0.3) && mean <= cap.mul_f64(0.7),
        "the pauses at the cap average {mean:?}, not about half of {cap:?}"
    );
    assert!(
        of_the_ceiling * 10 < at_cap.len() && of_nothing * 10 < at_cap.len(),
        "of {} pauses, {of_the_ceiling} were the ceiling and {of_nothing} nothing",
        at_cap.len()
    );
    assert!(
        longest >= cap.mul_f64(0.8),
        "the ceiling never reached the cap: {longest:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|(status, rounds)| *status == StatusCode::SERVICE_UNAVAILABLE && *rounds >= 20),
        "each request retried until its deadline, then answered 503: {statuses:?}"
    );
}
