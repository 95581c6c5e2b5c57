//! A busy item: N requests at once, each reserving 1 unit of one product with N/2 in
//! stock (the inventory example, whose reservations retry version conflicts), on the
//! embedded backend and on DynamoDB Local, from one process and from several (request
//! paths of their own over the same table, as Lambda environments are). Exactly N/2 are
//! made and N/2 refused as out of stock, none refused for a concurrent change, each
//! within its request's deadline; the counts and the latencies are printed.
//!
//! Small here (`HOT_ITEM_REQUESTS`, default 20; `HOT_ITEM_PROCESSES`, default 4);
//! `scripts/hot-item` runs it large on a release build.

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
