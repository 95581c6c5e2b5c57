//! The REST API through its router (`tower::ServiceExt::oneshot`, no server) on the
//! embedded backend: every route and every error status; the same requests as API
//! Gateway HTTP API and Lambda function URL events through `lambda_http`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::app::{router, HttpConfig};
use api::state::AppState;
use async_trait::async_trait;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use outbox::control::poller::poll_once;
use outbox::control::ControlPath;
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::http::Authentication;
use outbox::ports::{Clock, ControlQueue, QueueError, Store};
use outbox::protocol::{ControlMessage, DestinationName};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use outbox_tests::odd_store::{CommitStall, OddStore};
use serde_json::{json, Value};
use tower::ServiceExt;

struct TestApp {
    router: Router,
    clock: Arc<ManualClock>,
    backend: EmbeddedBackend,
    control: ControlPath,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn config() -> HttpConfig {
    HttpConfig {
        timeout: Duration::from_secs(5),
        max_body_bytes: 4096,
        cors_origins: vec!["https://shop.example".into()],
        authentication: Authentication::Off,
    }
}

fn app_with(ports: impl FnOnce(&EmbeddedBackend, Arc<ManualClock>) -> RequestPorts) -> TestApp {
    app_with_config(ports, config())
}

fn app_with_config(
    ports: impl FnOnce(&EmbeddedBackend, Arc<ManualClock>) -> RequestPorts,
    config: HttpConfig,
) -> TestApp {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    backend.record();
    let outbox = Outbox::new(
        ports(&backend, clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let state = AppState {
        outbox: Arc::new(outbox),
        events: events(),
    };
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    TestApp {
        router: router(state, &config),
        clock,
        backend,
        control,
    }
}

fn app() -> TestApp {
    app_with(|backend, clock| backend.request_ports(clock))
}

fn json_request(method: Method, uri: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn empty(method: Method, uri: &str) -> Request<Body> {
    Request::builder().method(method).uri(uri).body(Body::empty()).unwrap()
}

fn new_order() -> Value {
    json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1299}]})
}

impl TestApp {
    async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Reply { status, headers, body }
    }

    async fn create(&self) -> Reply {
        self.send(json_request(Method::POST, "/orders", &new_order())).await
    }

    /// Runs the control worker until the control queue is empty.
    async fn settle(&self) {
        let queue = self.backend.control_queue.queue();
        for _ in 0..100 {
            if queue.is_empty() {
                return;
            }
            if let Some(at) = queue.next_visible_at().filter(|_| !queue.has_visible()) {
                self.clock.set(at);
            }
            poll_once(self.backend.control_queue.as_ref(), &self.control, Duration::ZERO)
                .await
                .unwrap();
        }
        panic!("the control queue did not drain");
    }

    /// The events published so far: (message id, body).
    fn published(&self) -> Vec<(String, Value)> {
        self.backend
            .publisher
            .queue(&events())
            .unwrap()
            .sent()
            .into_iter()
            .map(|sent| {
                (
                    sent.request.attributes["outbox-message-id"].clone(),
                    serde_json::from_str(&sent.request.body).unwrap(),
                )
            })
            .collect()
    }
}

fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a str> {
    reply.headers.get(name).and_then(|v| v.to_str().ok())
}

fn assert_problem(reply: &Reply, status: StatusCode, kind: &str) {
    assert_eq!(reply.status, status, "{:?}", reply.body);
    assert_eq!(header(reply, "content-type"), Some("application/problem+json"));
    assert_eq!(reply.body["status"], status.as_u16());
    assert!(
        reply.body["type"].as_str().unwrap_or_default().ends_with(kind),
        "{:?}",
        reply.body
    );
}

#[tokio::test]
async fn creating_an_order_answers_201_and_publishes_order_placed_with_its_stable_id() {
    let app = app();
    let reply = app.create().await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let id = reply.body["id"].as_str().unwrap().to_owned();
    assert_eq!(header(&reply, "location"), Some(format!("/orders/{id}").as_str()));
    assert_eq!(header(&reply, "etag"), Some("\"1\""));
    assert_eq!(
        (
            reply.body["status"].clone(),
            reply.body["version"].clone(),
            reply.body["total_cents"].clone()
        ),
        (json!("placed"), json!(1), json!(2598))
    );
    let txn = header(&reply, "x-transaction-id").unwrap().to_owned();
    assert!(
        app.published().is_empty(),
        "nothing is published before the control worker runs"
    );
    app.settle().await;
    let published = app.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].0, format!("{txn}:0"));
    assert_eq!(published[0].1["type"], "OrderPlaced");
    assert_eq!(published[0].1["order_id"], id.as_str());

    // The create committed into the new order (entity mode): its status is read through
    // the link the answer gave, which names the order.
    assert!(
        status_link(&reply).contains("?item=ORDER%23"),
        "{}",
        status_link(&reply)
    );
    let status = app.send(empty(Method::GET, &status_link(&reply))).await;
    assert_eq!(status.body, json!({"transaction_id": txn, "status": "dispatched"}));
}

#[tokio::test]
async fn reading_an_order_gives_its_etag_and_unknown_or_malformed_ids_are_refused() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let reply = app.send(empty(Method::GET, &format!("/orders/{id}"))).await;
    assert_eq!((reply.status, header(&reply, "etag")), (StatusCode::OK, Some("\"1\"")));
    assert_eq!(reply.body["items"][0]["sku"], "SKU-1");
    assert_problem(
        &app.send(empty(Method::GET, "/orders/018bcfe5-6800-7000-8000-000000000000"))
            .await,
        StatusCode::NOT_FOUND,
        "not-found",
    );
    let bad = app.send(empty(Method::GET, "/orders/not-a-uuid")).await;
    assert_problem(&bad, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(bad.body["errors"][0]["field"], "id");
}

#[tokio::test]
async fn changes_emit_events_only_when_the_order_really_changes() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let add = |quantity: u32| {
        json_request(
            Method::POST,
            &format!("/orders/{id}/items"),
            &json!({"sku": "SKU-2", "quantity": quantity, "unit_price_cents": 500}),
        )
    };
    let added = app.send(add(1)).await;
    assert_eq!(
        (
            added.status,
            added.body["version"].clone(),
            added.body["total_cents"].clone()
        ),
        (StatusCode::OK, json!(2), json!(3098))
    );
    let again = app.send(add(1)).await;
    assert_eq!(
        (again.status, again.body["version"].clone()),
        (StatusCode::OK, json!(2))
    );
    assert!(
        header(&again, "x-transaction-id").is_none(),
        "no change: nothing of its transaction was sent, and the answer names none"
    );
    let changed = app.send(add(3)).await;
    assert_eq!(changed.body["items"][1]["quantity"], 3);
    let removed = app
        .send(empty(Method::DELETE, &format!("/orders/{id}/items/SKU-1")))
        .await;
    assert_eq!(removed.body["items"].as_array().unwrap().len(), 1);
    let absent = app
        .send(empty(Method::DELETE, &format!("/orders/{id}/items/SKU-9")))
        .await;
    assert_eq!(
        (absent.status, absent.body["version"].clone()),
        (StatusCode::OK, json!(4))
    );
    let cancelled = app.send(empty(Method::POST, &format!("/orders/{id}/cancel"))).await;
    assert_eq!(cancelled.body["status"], "cancelled");
    let twice = app.send(empty(Method::POST, &format!("/orders/{id}/cancel"))).await;
    assert_eq!(
        (twice.status, twice.body["version"].clone()),
        (StatusCode::OK, json!(5))
    );
    assert_problem(&app.send(add(1)).await, StatusCode::CONFLICT, "conflict");
    assert_problem(
        &app.send(empty(Method::DELETE, &format!("/orders/{id}/items/sku-lower")))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation",
    );

    app.settle().await;
    // One batch settles all five; across transactions the protocol orders by commit time,
    // which this test's clock does not move, so compare as a set.
    let mut kinds: Vec<String> = app
        .published()
        .into_iter()
        .map(|(_, body)| body["type"].as_str().unwrap().to_owned())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["ItemAdded", "ItemAdded", "ItemRemoved", "OrderCancelled", "OrderPlaced"]
    );
}

#[tokio::test]
async fn if_match_is_honoured() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let cancel = |tag: &str| {
        Request::builder()
            .method(Method::POST)
            .uri(format!("/orders/{id}/cancel"))
            .header("if-match", tag)
            .body(Body::empty())
            .unwrap()
    };
    assert_problem(
        &app.send(cancel("\"7\"")).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition-failed",
    );
    assert_problem(
        &app.send(cancel("seven")).await,
        StatusCode::BAD_REQUEST,
        "invalid-header",
    );
    assert_eq!(app.send(cancel("\"1\"")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_lost_version_race_is_409_or_412_under_if_match() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let racing = app_with(|backend, clock| RequestPorts {
        store: Arc::new(OddStore {
            stale: true,
            ..OddStore::around(backend.store.clone())
        }),
        ..backend.request_ports(clock)
    });
    // Share the first app's data: put the order in the racing app's store too.
    let order = app
        .backend
        .store
        .get_items(&[format!("ORDER#{id}").parse().unwrap()])
        .await
        .unwrap();
    let item = order.values().next().unwrap().clone();
    let put = outbox::ports::BusinessWrite::Put {
        key: item.key.clone(),
        data: item.data.clone(),
        expected: outbox::ports::ExpectedVersion::Absent,
    };
    let txn = outbox::protocol::TxnId::new_v7();
    let record = outbox::protocol::OutboxRecord::committed(
        txn,
        vec![],
        racing.clock.now(),
        racing.clock.now().plus(Duration::from_secs(60)),
    );
    racing
        .backend
        .store
        .commit(&outbox::ports::CommitRequest {
            txn_id: txn,
            writes: vec![put],
            outbox: record,
            idempotency: None,
        })
        .await
        .unwrap();
    racing
        .backend
        .store
        .commit(&outbox::ports::CommitRequest {
            txn_id: outbox::protocol::TxnId::new_v7(),
            writes: vec![outbox::ports::BusinessWrite::Put {
                key: item.key.clone(),
                data: item.data.clone(),
                expected: outbox::ports::ExpectedVersion::Exactly(1),
            }],
            outbox: outbox::protocol::OutboxRecord::committed(
                outbox::protocol::TxnId::new_v7(),
                vec![],
                racing.clock.now(),
                racing.clock.now().plus(Duration::from_secs(60)),
            ),
            idempotency: None,
        })
        .await
        .expect("the second version of the order");

    assert_problem(
        &racing.send(empty(Method::POST, &format!("/orders/{id}/cancel"))).await,
        StatusCode::CONFLICT,
        "version-conflict",
    );
    let with_precondition = Request::builder()
        .method(Method::POST)
        .uri(format!("/orders/{id}/cancel"))
        .header("if-match", "\"1\"")
        .body(Body::empty())
        .unwrap();
    assert_problem(
        &racing.send(with_precondition).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition-failed",
    );
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_answer_and_refuses_another_request() {
    let app = app();
    let keyed = |body: &Value, key: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let first = app.send(keyed(&new_order(), "key-1")).await;
    let repeat = app.send(keyed(&new_order(), "key-1")).await;
    assert_eq!(
        (first.status, repeat.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_eq!(repeat.body, first.body);
    assert_eq!(header(&repeat, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&repeat, "location"), header(&first, "location"));
    assert_eq!(header(&first, "idempotent-replayed"), None);
    let other = json!({"customer_id": "c-2", "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 1}]});
    assert_problem(
        &app.send(keyed(&other, "key-1")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reused",
    );
    assert_problem(
        &app.send(keyed(&new_order(), "")).await,
        StatusCode::BAD_REQUEST,
        "invalid-header",
    );

    // Two concurrent requests with one key: one executes, the other replays.
    let (a, b) = tokio::join!(
        app.send(keyed(&new_order(), "key-2")),
        app.send(keyed(&new_order(), "key-2"))
    );
    assert_eq!((a.status, b.status), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(a.body["id"], b.body["id"], "both answers name the one order created");
    let replayed = [&a, &b]
        .iter()
        .filter(|r| header(r, "idempotent-replayed") == Some("true"))
        .count();
    assert_eq!(replayed, 1);
    app.settle().await;
    assert_eq!(app.published().len(), 2, "two orders placed, for two keys");
}

#[tokio::test]
async fn bad_input_gets_a_problem_and_writes_nothing() {
    let app = app();
    let malformed = Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header("content-type", "application/json")
        .body(Body::from("{\"customer_id\":"))
        .unwrap();
    assert_problem(&app.send(malformed).await, StatusCode::BAD_REQUEST, "malformed-body");
    let wrong_type = app
        .send(json_request(
            Method::POST,
            "/orders",
            &json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": "two", "unit_price_cents": 1}]}),
        ))
        .await;
    assert_problem(&wrong_type, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(wrong_type.body["errors"][0]["field"], "items[0].quantity");
    let invalid = app
        .send(json_request(
            Method::POST,
            "/orders",
            &json!({"customer_id": "", "items": []}),
        ))
        .await;
    let fields: Vec<&str> = invalid.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["customer_id", "items"]);
    let not_json = Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header("content-type", "text/plain")
        .body(Body::from("hello"))
        .unwrap();
    assert_problem(
        &app.send(not_json).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    );
    let huge = json!({"customer_id": "c-1", "items": [], "padding": "x".repeat(5000)});
    assert_problem(
        &app.send(json_request(Method::POST, "/orders", &huge)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
    );
    assert_problem(
        &app.send(empty(Method::GET, "/nowhere")).await,
        StatusCode::NOT_FOUND,
        "not-found",
    );
    assert_problem(
        &app.send(empty(Method::GET, "/orders")).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
    );
    assert_problem(
        &app.send(empty(Method::GET, "/transactions/42")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation",
    );
    assert!(
        app.backend.store.outbox_records().is_empty(),
        "no bad request reached the request path"
    );
}

/// A control queue that refuses every send.
struct DownQueue;

#[async_trait]
impl ControlQueue for DownQueue {
    async fn send(&self, _: &ControlMessage, _: Duration) -> Result<(), QueueError> {
        Err(QueueError::Unavailable("the control queue is down".into()))
    }
}

#[tokio::test]
async fn a_control_queue_failure_is_503_with_retry_after_and_writes_nothing() {
    let app = app_with(|backend, clock| RequestPorts {
        control_queue: Arc::new(DownQueue),
        ..backend.request_ports(clock)
    });
    let reply = app.create().await;
    assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, "control-queue-unavailable");
    assert_eq!(header(&reply, "retry-after"), Some("1"));
    assert!(reply.body["transaction_id"].is_string());
    assert!(
        !reply.body.to_string().contains("down"),
        "no internals: {:?}",
        reply.body
    );
    assert!(app.backend.store.outbox_records().is_empty());
}

/// A clock that jumps 20 s every time it is read: every commit comes after its window.
struct SlowClock(Arc<ManualClock>, AtomicU64);

#[async_trait]
impl Clock for SlowClock {
    fn now(&self) -> Timestamp {
        let reads = self.1.fetch_add(1, Ordering::Relaxed);
        self.0.now().plus(Duration::from_secs(20 * reads))
    }
    async fn sleep(&self, duration: Duration) {
        self.0.sleep(duration).await;
    }
}

#[tokio::test]
async fn a_commit_after_its_window_is_503_commit_window_expired() {
    let app = app_with(|backend, clock| RequestPorts {
        clock: Arc::new(SlowClock(clock.clone(), AtomicU64::new(0))),
        ..backend.request_ports(clock)
    });
    let reply = app.create().await;
    assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, "commit-window-expired");
    assert_eq!(header(&reply, "retry-after"), Some("1"));
    assert_eq!(
        header(&reply, "x-transaction-id"),
        reply.body["transaction_id"].as_str()
    );
}

#[tokio::test]
async fn an_internal_error_says_nothing_about_internals() {
    let app = app();
    let id = "018bcfe5-6800-7000-8000-0000000000aa";
    let txn = outbox::protocol::TxnId::new_v7();
    let corrupt = outbox::ports::BusinessWrite::Put {
        key: format!("ORDER#{id}").parse().unwrap(),
        data: json!({"secret": "table layout"}),
        expected: outbox::ports::ExpectedVersion::Absent,
    };
    let record = outbox::protocol::OutboxRecord::committed(
        txn,
        vec![],
        app.clock.now(),
        app.clock.now().plus(Duration::from_secs(60)),
    );
    app.backend
        .store
        .commit(&outbox::ports::CommitRequest {
            txn_id: txn,
            writes: vec![corrupt],
            outbox: record,
            idempotency: None,
        })
        .await
        .unwrap();
    let reply = app.send(empty(Method::GET, &format!("/orders/{id}"))).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.body,
        json!({"type": "about:blank", "title": "Internal Server Error", "status": 500})
    );
}

#[tokio::test]
async fn transactions_report_their_status() {
    let app = app();
    let unknown = outbox::protocol::TxnId::new_v7();
    let reply = app.send(empty(Method::GET, &format!("/transactions/{unknown}"))).await;
    assert_eq!(reply.body["status"], "unknown");
    let created = app.create().await;
    let txn = header(&created, "x-transaction-id").unwrap().to_owned();
    assert_eq!(app.status_of(&created).await, "pending");
    assert_eq!(
        app.transaction_status(&txn).await,
        "unknown",
        "a create commits into its order: its bare id finds no record"
    );
    assert!(
        header(&created, "x-transaction-item").is_some(),
        "a create commits into its order, which the answer names"
    );

    // A change of one order commits into it (entity mode): the answer names the item, and
    // once dispatched the transaction's proof is its sent mark there, not a record.
    let id = created.body["id"].as_str().unwrap().to_owned();
    app.settle().await;
    let added = app
        .send(json_request(
            Method::POST,
            &format!("/orders/{id}/items"),
            &json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 500}),
        ))
        .await;
    assert_eq!(added.status, StatusCode::OK);
    let change = header(&added, "x-transaction-id").unwrap().to_owned();
    let item = header(&added, "x-transaction-item").unwrap().to_owned();
    assert_eq!(item, format!("ORDER%23{id}"));
    assert!(
        api::rules::TRANSACTION_ITEM_HEADER.allows(&item),
        "the header the document states"
    );
    let status_in = |item: &str| format!("/transactions/{change}?item={item}");
    assert_eq!(
        app.send(empty(Method::GET, &status_in(&item))).await.body["status"],
        "pending"
    );
    app.settle().await;
    assert_eq!(
        app.send(empty(Method::GET, &status_in(&item))).await.body["status"],
        "dispatched"
    );
    assert_eq!(
        app.send(empty(Method::GET, &format!("/transactions/{change}")))
            .await
            .body["status"],
        "unknown",
        "without the item nothing tells"
    );
    for bad in ["TXN%23x", "ORDER%23not-an-id", "%FF"] {
        let reply = app.send(empty(Method::GET, &status_in(bad))).await;
        assert!(
            matches!(reply.status, StatusCode::UNPROCESSABLE_ENTITY | StatusCode::BAD_REQUEST),
            "{bad}: {} {}",
            reply.status,
            reply.body
        );
    }
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let app = app();
    let reply = app.send(empty(Method::GET, "/openapi.json")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.body["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        reply.body["openapi"]
    );
    let paths: Vec<&str> = reply.body["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected = [
        "/orders",
        "/orders/{id}",
        "/orders/{id}/cancel",
        "/orders/{id}/items",
        "/orders/{id}/items/{sku}",
        "/transactions/{id}",
    ];
    assert_eq!(paths, expected, "sorted");
    assert!(reply.body["components"]["schemas"]["Problem"].is_object());
}

#[tokio::test]
async fn request_ids_cors_and_compression_are_in_place() {
    let app = app();
    let generated = app.send(empty(Method::GET, "/openapi.json")).await;
    assert_eq!(header(&generated, "x-request-id").map(str::len), Some(36));
    let given = Request::builder()
        .uri("/openapi.json")
        .header("x-request-id", "req-123")
        .header("accept-encoding", "gzip")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(given).await.unwrap();
    assert_eq!(response.headers()["x-request-id"], "req-123");
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let preflight = Request::builder()
        .method(Method::OPTIONS)
        .uri("/orders")
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(preflight).await.unwrap();
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    let stranger = Request::builder()
        .uri("/openapi.json")
        .header("origin", "https://evil.example")
        .body(Body::empty())
        .unwrap();
    assert!(app
        .router
        .clone()
        .oneshot(stranger)
        .await
        .unwrap()
        .headers()
        .get("access-control-allow-origin")
        .is_none());
}

#[tokio::test]
async fn api_gateway_and_function_url_events_go_through_lambda_http() {
    let app = app();
    let event = include_str!("../fixtures/apigw_v2_create_order.json");
    let request = lambda_http::request::from_str(event).expect("an API Gateway HTTP API v2 event");
    let response = app
        .router
        .clone()
        .oneshot(request.map(|body| Body::from(body.to_vec())))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let id = body["id"].as_str().unwrap();

    let event = include_str!("../fixtures/function_url_add_item.json").replace("ORDER_ID", id);
    let request = lambda_http::request::from_str(&event).expect("a Lambda function URL event");
    let response = app
        .router
        .clone()
        .oneshot(request.map(|body| Body::from(body.to_vec())))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        (body["version"].clone(), body["items"][1]["sku"].clone()),
        (json!(2), json!("SKU-2"))
    );
}

#[tokio::test]
async fn a_request_over_the_timeout_is_a_503_problem() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let ports = RequestPorts {
        store: Arc::new(OddStore {
            read_delay: Duration::from_secs(1),
            ..OddStore::around(backend.store.clone())
        }),
        ..backend.request_ports(clock)
    };
    let outbox = Outbox::new(ports, Timing::default(), TransactionLimits::default());
    let config = HttpConfig {
        timeout: Duration::from_millis(100),
        ..config()
    };
    let router = router(
        AppState {
            outbox: Arc::new(outbox),
            events: events(),
        },
        &config,
    );
    let response = router
        .oneshot(empty(Method::GET, "/orders/018bcfe5-6800-7000-8000-000000000000"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(
        response.headers().get("x-transaction-id").is_none(),
        "a read, no transaction began"
    );
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["type"], "/problems/timeout");
}

/// An app whose store misbehaves as `odd` says, with a 2 s request timeout.
fn app_with_odd_store(odd: impl FnOnce(OddStore) -> OddStore) -> TestApp {
    let config = HttpConfig {
        timeout: Duration::from_secs(2),
        ..config()
    };
    app_with_config(
        |backend, clock| RequestPorts {
            store: Arc::new(odd(OddStore::around(backend.store.clone()))),
            ..backend.request_ports(clock)
        },
        config,
    )
}

impl TestApp {
    async fn transaction_status(&self, txn: &str) -> String {
        let reply = self.send(empty(Method::GET, &format!("/transactions/{txn}"))).await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.body["status"].as_str().unwrap().to_owned()
    }

    /// The status of the transaction `reply` names, read where its `Link` (rel="status")
    /// points, as a client does: with the item, for a transaction begun on one.
    async fn status_of(&self, reply: &Reply) -> String {
        let link = status_link(reply);
        let status = self.send(empty(Method::GET, &link)).await;
        assert_eq!(status.status, StatusCode::OK, "{link}");
        status.body["status"].as_str().unwrap().to_owned()
    }
}

/// Where `reply`'s `Link` (rel="status") points.
fn status_link(reply: &Reply) -> String {
    let link = header(reply, "link").expect("a link to the transaction's status");
    link.strip_prefix('<')
        .and_then(|rest| rest.split_once(">; rel=\"status\""))
        .map(|(target, _)| target.to_owned())
        .unwrap_or_else(|| panic!("not a status link: {link}"))
}

/// A commit stalled past the deadline is settled by its tombstone before the answer: a
/// 503 that says nothing was written, naming the transaction, already tombstoned.
#[tokio::test(start_paused = true)]
async fn a_commit_stalled_past_the_deadline_is_fenced_a_503_naming_its_transaction_which_reads_tombstoned() {
    let app = app_with_odd_store(|odd| OddStore {
        commit: CommitStall::Forever,
        ..odd
    });
    let started = tokio::time::Instant::now();
    let reply = app.create().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered within the request's time: {:?}",
        started.elapsed()
    );
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["type"], "/problems/unavailable");
    assert!(reply.body["detail"].as_str().unwrap().contains("nothing was written"));
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(app.status_of(&reply).await, "tombstoned", "settled before the answer");
    app.settle().await;
    assert!(app.published().is_empty());
}

/// When the tombstone cannot be written either, the answer is "outcome unknown", and the
/// control worker settles the transaction later.
#[tokio::test(start_paused = true)]
async fn a_commit_that_cannot_be_settled_in_time_is_a_503_outcome_unknown() {
    let app = app_with_odd_store(|odd| OddStore {
        commit: CommitStall::Forever,
        tombstones_stall: true,
        ..odd
    });
    let reply = app.create().await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["type"], "/problems/outcome-unknown");
    assert_eq!(app.status_of(&reply).await, "unknown", "not settled yet");
}

/// A commit still on its way at the deadline is fenced: when it reaches the table it is
/// refused, and nothing is ever published.
#[tokio::test(start_paused = true)]
async fn a_commit_that_would_land_after_the_deadline_is_fenced_and_refused_when_it_lands() {
    let app = app_with_odd_store(|odd| OddStore {
        commit: CommitStall::AppliesAfter(Duration::from_secs(5)),
        ..odd
    });
    let reply = app.create().await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["type"], "/problems/unavailable");
    // The request reaches the table after its answer was sent, and is refused.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(app.status_of(&reply).await, "tombstoned");
    app.settle().await;
    assert!(app.published().is_empty());
}

/// Without the tombstone (its write stalls), the same late commit was answered "outcome
/// unknown", and it does commit and publish.
#[tokio::test(start_paused = true)]
async fn a_commit_that_lands_after_an_unsettled_deadline_is_a_503_outcome_unknown_which_later_reads_dispatched() {
    let app = app_with_odd_store(|odd| OddStore {
        commit: CommitStall::AppliesAfter(Duration::from_secs(5)),
        tombstones_stall: true,
        ..odd
    });
    let reply = app.create().await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["type"], "/problems/outcome-unknown");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(app.status_of(&reply).await, "pending", "it did commit");
    app.settle().await;
    assert_eq!(app.status_of(&reply).await, "dispatched");
    assert_eq!(app.published().len(), 1, "its event was published");
}

/// A read that stalls after begin: the middleware answers in time, a plain timeout that
/// names no transaction, since nothing of it was sent (its control message goes out with
/// the commit); nothing is written or sent for it, then or later.
#[tokio::test(start_paused = true)]
async fn a_read_stalled_after_begin_is_answered_in_time_with_nothing_sent_or_written() {
    let app = app_with_odd_store(|odd| OddStore {
        read_delay: Duration::from_secs(30),
        ..odd
    });
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let started = tokio::time::Instant::now();
    let reply = app
        .send(json_request(
            Method::POST,
            &format!("/orders/{id}/items"),
            &json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 500}),
        ))
        .await;
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["type"], "/problems/timeout");
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert_eq!(header(&reply, "x-transaction-id"), None, "nothing of it was sent");
    assert_eq!(reply.body["detail"], "nothing was written; retry the request");
    app.settle().await;
    let sent = app.backend.control_queue.queue().sent().len();
    assert_eq!(sent, 1, "the create's control message alone");
    let records = app.backend.store.outbox_records();
    assert!(
        records
            .iter()
            .all(|record| record.state != outbox::protocol::OutboxState::Tombstone),
        "no tombstone: {records:?}"
    );
    assert_eq!(app.published().len(), 1, "only the order's creation");
}

/// Refusals decided by the reads (no such order, another caller's, an `If-Match` that
/// does not match, a cancelled order) and a change that changes nothing cost the reads
/// alone: no control message is sent, nothing is written (no tombstone, no fence), and no
/// answer names a transaction, since none exists outside the process.
#[tokio::test]
async fn refusals_decided_by_the_reads_send_nothing_and_write_nothing() {
    let app = app();
    let alice = |method: Method, path: &str, body: Option<&Value>| signed_in(Some("alice"), method, path, body);
    let placed = app.send(alice(Method::POST, "/orders", Some(&new_order()))).await;
    let id = placed.body["id"].as_str().unwrap().to_owned();
    let other = app.send(alice(Method::POST, "/orders", Some(&new_order()))).await;
    let other = other.body["id"].as_str().unwrap().to_owned();
    let cancel = app
        .send(alice(Method::POST, &format!("/orders/{other}/cancel"), None))
        .await;
    assert_eq!(cancel.status, StatusCode::OK, "{}", cancel.body);
    app.settle().await;
    let queue = app.backend.control_queue.queue();
    let (sent_before, written_before) = (queue.sent().len(), app.backend.store.history().len());

    let line = json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 500});
    let items = format!("/orders/{id}/items");
    let mut stale = alice(Method::POST, &items, Some(&line));
    stale.headers_mut().insert("if-match", "\"7\"".parse().unwrap());
    let refusals = [
        (
            alice(
                Method::POST,
                "/orders/018bcfe5-6800-7000-8000-0000000000ff/items",
                Some(&line),
            ),
            StatusCode::NOT_FOUND,
            "not-found",
        ),
        (
            signed_in(Some("bob"), Method::POST, &items, Some(&line)),
            StatusCode::NOT_FOUND,
            "not-found",
        ),
        (stale, StatusCode::PRECONDITION_FAILED, "precondition-failed"),
        (
            alice(Method::POST, &format!("/orders/{other}/items"), Some(&line)),
            StatusCode::CONFLICT,
            "conflict",
        ),
    ];
    for (request, status, kind) in refusals {
        let target = format!("{} {}", request.method(), request.uri());
        let reply = app.send(request).await;
        assert_problem(&reply, status, kind);
        assert_eq!(
            header(&reply, "x-transaction-id"),
            None,
            "{target}: names no transaction"
        );
        assert_eq!(reply.body["transaction_id"], Value::Null, "{target}");
    }
    // The line it holds already: a success that changes nothing, and commits nothing.
    let same = json!({"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1299});
    let unchanged = app.send(alice(Method::POST, &items, Some(&same))).await;
    assert_eq!(
        (unchanged.status, unchanged.body["version"].clone()),
        (StatusCode::OK, json!(1))
    );
    assert_eq!(header(&unchanged, "x-transaction-id"), None);

    assert_eq!(queue.sent().len(), sent_before, "no control message was sent");
    assert!(queue.is_empty());
    let written: Vec<_> = app.backend.store.history().into_iter().skip(written_before).collect();
    assert!(written.is_empty(), "nothing was written: {written:?}");
}

#[tokio::test]
async fn a_path_parameter_that_is_not_utf8_is_a_400_problem_on_every_route_that_takes_one() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let line = json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 500});
    let requests = [
        empty(Method::GET, "/orders/%FF"),
        json_request(Method::POST, "/orders/%FF/items", &line),
        empty(Method::DELETE, "/orders/%FF/items/SKU-1"),
        empty(Method::DELETE, &format!("/orders/{id}/items/%FF")),
        empty(Method::POST, "/orders/%C3/cancel"),
        empty(Method::GET, "/transactions/%C3"),
    ];
    for request in requests {
        let uri = request.uri().clone();
        let reply = app.send(request).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "/problems/invalid-path");
        assert!(reply.body["detail"].as_str().is_some(), "{uri}: {:?}", reply.body);
    }
    assert!(
        app.backend.store.outbox_records().is_empty(),
        "the creation committed into its order, and nothing else was written"
    );
}

#[tokio::test]
async fn object_bodies_sent_as_json_arrays_are_refused_at_any_depth_and_write_nothing() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let cases = [
        ("/orders".to_owned(), json!(["c-1", [["SKU-1", 2, 1299]]]), "body"),
        (
            "/orders".to_owned(),
            json!({"customer_id": "c-1", "items": [["SKU-1", 2, 1299]]}),
            "items[0]",
        ),
        (
            "/orders".to_owned(),
            json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1}, ["SKU-2", 1, 1]]}),
            "items[1]",
        ),
        (format!("/orders/{id}/items"), json!(["SKU-2", 1, 500]), "body"),
        (format!("/orders/{id}/items"), json!("SKU-2"), "body"),
    ];
    for (uri, body, field) in cases {
        let reply = app.send(json_request(Method::POST, &uri, &body)).await;
        assert_problem(&reply, StatusCode::UNPROCESSABLE_ENTITY, "/problems/validation");
        assert_eq!(reply.body["errors"][0]["field"], field, "{body}");
    }
    assert!(
        app.backend.store.outbox_records().is_empty(),
        "the creation committed into its order, and nothing else was written"
    );
    let order = app.send(empty(Method::GET, &format!("/orders/{id}"))).await;
    assert_eq!(
        (
            order.body["version"].clone(),
            order.body["items"].as_array().map(Vec::len)
        ),
        (json!(1), Some(1)),
        "the order is as it was created"
    );
}

#[tokio::test]
async fn integers_written_with_a_zero_fraction_are_the_integers_the_document_allows() {
    // JSON Schema's `integer` admits 2.0 and 1e3; serde's integers alone would not.
    let app = app();
    let reply = app
        .send(json_request(
            Method::POST,
            "/orders",
            &serde_json::from_str::<Value>(
                r#"{"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 2.0, "unit_price_cents": 1e3}]}"#,
            )
            .unwrap(),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    assert_eq!(
        reply.body["items"][0],
        json!({"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1000})
    );
    let fraction = app
        .send(json_request(
            Method::POST,
            "/orders",
            &json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 2.5, "unit_price_cents": 1}]}),
        ))
        .await;
    assert_problem(&fraction, StatusCode::UNPROCESSABLE_ENTITY, "/problems/validation");
    assert_eq!(fraction.body["errors"][0]["field"], "items[0].quantity");
}

#[tokio::test]
async fn headers_are_read_exactly_as_the_document_states_them() {
    let app = app();
    let id = app.create().await.body["id"].as_str().unwrap().to_owned();
    let cancel = |name: &str, value: &str| {
        Request::builder()
            .method(Method::POST)
            .uri(format!("/orders/{id}/cancel"))
            .header(name, value)
            .body(Body::empty())
            .unwrap()
    };
    for refused in ["3", "\"+1\"", "\"1\" ", "W/1", "\"99999999999999999999\""] {
        let reply = app.send(cancel("if-match", refused)).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "/problems/invalid-header");
        assert!(!api::rules::IF_MATCH.allows(refused), "{refused}");
    }
    let long = "k".repeat(256);
    for refused in [long.as_str(), "k\t", " k"] {
        let reply = app.send(cancel("idempotency-key", refused)).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "/problems/invalid-header");
        assert!(!api::rules::IDEMPOTENCY_KEY.allows(refused), "{refused:?}");
    }
    // `"k"` and `k` are one key: the second is a replay of the first.
    let first = app.send(cancel("idempotency-key", "\"k-1\"")).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    let again = app.send(cancel("idempotency-key", "k-1")).await;
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    // A replay keeps every header of the first answer: its transaction and its item.
    for name in ["x-transaction-id", "x-transaction-item"] {
        assert!(header(&first, name).is_some(), "the first answer names {name}");
        assert_eq!(header(&again, name), header(&first, name), "{name}");
    }
}

/// The schema `reference` points to in `document`, or `schema` itself.
fn resolved<'a>(document: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference.trim_start_matches("#/components/schemas/");
            &document["components"]["schemas"][name]
        }
        None => schema,
    }
}

#[tokio::test]
async fn the_openapi_document_states_the_contract_the_code_enforces() {
    use api::rules;
    let signed_in = HttpConfig {
        authentication: Authentication::Jwt,
        ..config()
    };
    let app = app_with_config(|backend, clock| backend.request_ports(clock), signed_in);
    let document = app.send(empty(Method::GET, "/openapi.json")).await.body;
    // With sign-in off, nobody needs a token: the document says so, and keeps the rest.
    let open = self::app().send(empty(Method::GET, "/openapi.json")).await.body;
    assert_eq!(
        open["components"].get("securitySchemes"),
        None,
        "{}",
        open["components"]
    );
    for (path, item) in open["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            assert!(operation.get("security").is_none(), "{method} {path}");
            assert!(
                !responses.contains_key("401") && !responses.contains_key("403"),
                "{method} {path}"
            );
            assert!(
                responses.contains_key("429"),
                "{method} {path}: a stage throttles either way"
            );
        }
    }
    let operation = |path: &str, method: &str| document["paths"][path][method].clone();
    let operations = [
        ("/orders", "post", &[201, 400, 413, 415, 422, 503][..]),
        ("/orders/{id}", "get", &[200, 400, 404, 422, 503]),
        (
            "/orders/{id}/items",
            "post",
            &[200, 400, 404, 409, 412, 413, 415, 422, 503],
        ),
        (
            "/orders/{id}/items/{sku}",
            "delete",
            &[200, 400, 404, 409, 412, 422, 503],
        ),
        ("/orders/{id}/cancel", "post", &[200, 400, 404, 409, 412, 422, 503]),
        ("/transactions/{id}", "get", &[200, 400, 422, 503]),
    ];
    for (path, method, statuses) in operations {
        let responses = operation(path, method)["responses"].clone();
        let listed: Vec<u16> = responses
            .as_object()
            .unwrap_or_else(|| panic!("{method} {path}: no responses"))
            .keys()
            .map(|status| status.parse().unwrap())
            .collect();
        for status in statuses {
            assert!(
                listed.contains(status),
                "{method} {path} lists {listed:?}, not {status}"
            );
        }
        // API Gateway answers these before the API runs, with its own JSON; every other
        // error is the API's problem+json (a 401 can be either).
        for status in [401, 403, 429] {
            assert!(
                listed.contains(&status),
                "{method} {path} lists {listed:?}, not {status}"
            );
            let content = &responses[status.to_string()]["content"];
            assert_eq!(
                content["application/json"]["schema"]["required"],
                json!(["message"]),
                "{method} {path} {status}: API Gateway's answer"
            );
        }
        for status in listed
            .iter()
            .filter(|status| **status >= 400 && ![403, 429].contains(*status))
        {
            let content = &responses[status.to_string()]["content"];
            assert!(
                content["application/problem+json"]["schema"]["$ref"]
                    .as_str()
                    .is_some_and(|r| r.ends_with("/Problem")),
                "{method} {path} {status}: {content}"
            );
        }
        let scope = if method == "get" { "orders/read" } else { "orders/write" };
        assert_eq!(
            operation(path, method)["security"],
            json!([{"bearer": [scope]}]),
            "{method} {path}: a bearer token with its scope"
        );
        assert!(
            responses["503"]["headers"]["Retry-After"].is_object(),
            "{method} {path}: 503 without Retry-After"
        );
        for parameter in operation(path, method)["parameters"].as_array().into_iter().flatten() {
            if parameter["in"] == "path" && parameter["name"] == "id" {
                assert_eq!(parameter["schema"]["format"], "uuid", "{method} {path}");
                let rule = if path.starts_with("/transactions") {
                    &rules::TRANSACTION_ID
                } else {
                    &rules::ORDER_ID
                };
                assert_eq!(parameter["schema"]["pattern"], rule.pattern(), "{method} {path}");
            }
        }
        if method != "get" {
            let headers: Vec<(String, String)> = operation(path, method)["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|parameter| parameter["in"] == "header")
                .map(|parameter| {
                    assert_eq!(parameter["required"], false, "{method} {path}: {parameter}");
                    let name = parameter["name"].as_str().unwrap().to_owned();
                    (name, parameter["schema"]["pattern"].as_str().unwrap().to_owned())
                })
                .collect();
            let idempotency = (
                "Idempotency-Key".to_owned(),
                rules::IDEMPOTENCY_KEY.pattern().to_owned(),
            );
            assert!(headers.contains(&idempotency), "{method} {path}: {headers:?}");
            if path != "/orders" {
                let if_match = ("If-Match".to_owned(), rules::IF_MATCH.pattern().to_owned());
                assert!(headers.contains(&if_match), "{method} {path}: {headers:?}");
            }
        }
    }
    let created = &operation("/orders", "post")["responses"]["201"]["headers"];
    for name in ["Location", "ETag", "x-transaction-id"] {
        assert!(created[name]["schema"].is_object(), "201 without {name}: {created}");
    }
    assert_eq!(created["x-transaction-id"]["schema"]["format"], "uuid");

    let schemas = &document["components"]["schemas"];
    let state = resolved(&document, &schemas["TransactionStatus"]["properties"]["status"]);
    assert_eq!(state["enum"], json!(["pending", "dispatched", "tombstoned", "unknown"]));
    assert_eq!(
        schemas["TransactionStatus"]["properties"]["transaction_id"]["pattern"],
        rules::TRANSACTION_ID.pattern()
    );

    let text = |schema: &Value, rule: &rules::Text| {
        assert_eq!(schema["type"], "string", "{schema}");
        assert_eq!(schema["pattern"], rule.pattern(), "{schema}");
        assert_eq!(schema["minLength"], *rule.length().start(), "{schema}");
        assert_eq!(schema["maxLength"], *rule.length().end(), "{schema}");
    };
    let create = &schemas["CreateOrder"];
    text(&create["properties"]["customer_id"], &rules::CUSTOMER_ID);
    let items = &create["properties"]["items"];
    assert_eq!(
        (items["minItems"].clone(), items["maxItems"].clone()),
        (json!(rules::LINE_ITEMS.start()), json!(rules::LINE_ITEMS.end()))
    );
    assert_eq!(create["additionalProperties"], false);
    let line = resolved(&document, &items["items"]);
    assert_eq!(line, &schemas["LineItem"]);
    text(&line["properties"]["sku"], &rules::SKU);
    let bounds = |schema: &Value| {
        (
            schema["type"].clone(),
            schema["minimum"].clone(),
            schema["maximum"].clone(),
        )
    };
    assert_eq!(
        bounds(&line["properties"]["quantity"]),
        (
            json!("integer"),
            json!(rules::QUANTITY.start()),
            json!(rules::QUANTITY.end())
        )
    );
    assert_eq!(
        bounds(&line["properties"]["unit_price_cents"]),
        (
            json!("integer"),
            json!(rules::UNIT_PRICE_CENTS.start()),
            json!(rules::UNIT_PRICE_CENTS.end())
        )
    );
    assert_eq!(line["additionalProperties"], false);
    assert_eq!(
        (rules::QUANTITY, rules::UNIT_PRICE_CENTS, rules::LINE_ITEMS),
        (1..=999, 0..=10_000_000, 1..=50),
        "the rules the issue names"
    );
}

/// A router with only the library's deadline middleware around `handler`, over a store
/// whose commits and tombstone writes never answer (so nothing can settle a commit), with
/// a 2 s timeout.
fn stalled_commit_app<H, T>(handler: H) -> Router
where
    H: axum::handler::Handler<T, Arc<Outbox>>,
    T: 'static,
{
    deadline_app(CommitStall::Forever, true, handler)
}

/// A router with only the library's deadline middleware around `handler`, over a store
/// whose commits behave as `commit` says and whose tombstone writes stall if
/// `tombstones_stall`, with a 2 s timeout.
fn deadline_app<H, T>(commit: CommitStall, tombstones_stall: bool, handler: H) -> Router
where
    H: axum::handler::Handler<T, Arc<Outbox>>,
    T: 'static,
{
    use outbox::http::{enforce_deadline, Deadlines};
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let ports = RequestPorts {
        store: Arc::new(OddStore {
            commit,
            tombstones_stall,
            ..OddStore::around(backend.store.clone())
        }),
        ..backend.request_ports(clock.clone())
    };
    let outbox = Arc::new(Outbox::new(ports, Timing::default(), TransactionLimits::default()));
    Router::new()
        .route("/", axum::routing::post(handler))
        .route_layer(axum::middleware::from_fn_with_state(
            Deadlines::new(outbox.as_ref().clone(), Duration::from_secs(2)),
            enforce_deadline,
        ))
        .with_state(outbox)
}

/// Sends a request to a [`stalled_commit_app`] and checks the middleware's answer: in
/// time, 503 outcome unknown, naming the transaction.
async fn assert_answered_outcome_unknown(app: Router) {
    // Tokio's (paused) time: the manual clock moves by each timer that fires.
    let started = tokio::time::Instant::now();
    let response = app.oneshot(empty(Method::POST, "/")).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered before the request's end"
    );
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let txn = response.headers()["x-transaction-id"].to_str().unwrap().to_owned();
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["type"], "/problems/outcome-unknown");
    assert_eq!(body["transaction_id"], txn.as_str());
}

/// The library's glue on its own, in a handler that begins its transaction without the
/// request's deadline (so nothing cuts its commit short): the deadline middleware still
/// answers in time, and since the scope recorded that the commit was tried, it answers
/// "outcome unknown", naming the transaction.
#[tokio::test(start_paused = true)]
async fn the_deadline_middleware_answers_for_a_stalled_commit_with_outcome_unknown_naming_it() {
    use axum::extract::State;
    use axum::response::Response;
    use outbox::http::{Answer, HttpError, RequestScope};

    async fn handler(State(outbox): State<Arc<Outbox>>, scope: RequestScope) -> Result<Response, HttpError> {
        let txn = outbox.begin().await?;
        scope.begun(txn.id());
        let answer = Answer::json(StatusCode::CREATED, &json!({"ok": true}));
        scope.commit(txn, answer).await
    }
    assert_answered_outcome_unknown(stalled_commit_app(handler)).await;
}

/// A transaction begun through the scope and committed directly (not through
/// `scope.commit`) tells the scope itself when its commit is tried: a handler that then
/// overruns (here, slow work after a commit the deadline cut short) is answered "outcome
/// unknown", never "nothing was written".
#[tokio::test(start_paused = true)]
async fn a_transaction_begun_through_the_scope_records_its_commit_however_it_is_committed() {
    use outbox::http::{HttpError, RequestScope};

    async fn handler(scope: RequestScope) -> Result<StatusCode, HttpError> {
        let outbox::http::Begun::Started(txn) = scope.begin(None).await? else {
            unreachable!("no key, no replay")
        };
        let committed = txn.commit().await;
        // Whatever the handler does next takes longer than the request may.
        tokio::time::sleep(Duration::from_secs(10)).await;
        committed?;
        Ok(StatusCode::CREATED)
    }
    assert_answered_outcome_unknown(stalled_commit_app(handler)).await;
}

/// `cargo run -p api` with its destination set to an EventBridge bus runs on the embedded
/// backend unchanged: each order's event lands as a rule's queue target would get it,
/// with the orders' `source`, its name as `detail-type`, and its stable id in the detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_api_runs_with_an_eventbridge_destination_and_names_its_events() {
    use outbox::settings::{vars, Settings};

    let settings =
        Settings::from_lookup(|name| (name == vars::DESTINATIONS).then(|| "events=eventbridge:orders".to_owned()))
            .expect("valid settings");
    let parts = api::runtime::start(&settings, std::future::pending())
        .await
        .expect("the embedded backend starts");
    let embedded = parts.embedded.clone().expect("the embedded backend");
    embedded.record();
    let after = parts
        .state
        .outbox
        .after_answer()
        .cloned()
        .expect("publishing after the answer, the default");
    let router = router(parts.state, &api::runtime::http_config(&settings));
    let response = router
        .oneshot(json_request(Method::POST, "/orders", &new_order()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let txn = response.headers()["x-transaction-id"].to_str().unwrap().to_owned();
    let queue = embedded
        .publisher
        .queue(&events())
        .expect("the events destination")
        .clone();
    // Published inline right after the answer (the default); the worker is the safety net.
    assert!(after.idle_within(std::time::Duration::from_secs(5)).await);
    let sent = queue.sent();
    assert_eq!(sent.len(), 1, "one event");
    let event: Value = serde_json::from_str(&sent[0].request.body).unwrap();
    assert_eq!(event["source"], api::orders::handlers::EVENT_SOURCE);
    assert_eq!(event["detail-type"], "OrderPlaced");
    assert_eq!(event["detail"]["metadata"]["outbox-message-id"], format!("{txn}:0"));
    assert_eq!(event["detail"]["metadata"]["event-type"], "OrderPlaced");
    assert_eq!(event["detail"]["data"]["type"], "OrderPlaced");
    parts.worker.expect("the in-process worker").abort();
}

/// A transaction begun with `Outbox::begin` directly (the guide's own example), never
/// shown to the scope, is still seen by the deadline middleware: a handler that commits
/// and then overruns is answered "outcome unknown" naming it (its answer is lost, its
/// change is not), never "nothing was written".
#[tokio::test(start_paused = true)]
async fn a_transaction_begun_without_the_scope_is_seen_by_the_middleware() {
    use axum::extract::State;

    async fn handler(State(outbox): State<Arc<Outbox>>) -> StatusCode {
        let txn = outbox.begin().await.expect("begin");
        txn.commit().await.expect("the commit applies");
        // Whatever the handler does next takes longer than the request may.
        tokio::time::sleep(Duration::from_secs(10)).await;
        StatusCode::CREATED
    }
    assert_answered_outcome_unknown(deadline_app(CommitStall::None, false, handler)).await;
}

/// A hook of the handler's own on the transaction adds to the scope's, instead of
/// replacing it: both are told when the commit begins.
#[tokio::test(start_paused = true)]
async fn a_commit_hook_of_the_handler_adds_to_the_scopes() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use outbox::http::{HttpError, RequestScope};

    static TOLD: AtomicBool = AtomicBool::new(false);
    async fn handler(scope: RequestScope) -> Result<StatusCode, HttpError> {
        let outbox::http::Begun::Started(mut txn) = scope.begin(None).await? else {
            unreachable!("no key, no replay")
        };
        txn.on_commit_attempt(|_| TOLD.store(true, Ordering::SeqCst));
        let committed = txn.commit().await;
        // Whatever the handler does next takes longer than the request may.
        tokio::time::sleep(Duration::from_secs(10)).await;
        committed?;
        Ok(StatusCode::CREATED)
    }
    // Were the scope's hook replaced, the scope would think the commit never began, and,
    // with no tombstone to settle it, answer "nothing was written".
    assert_answered_outcome_unknown(stalled_commit_app(handler)).await;
    assert!(TOLD.load(Ordering::SeqCst), "the handler's hook was told too");
}

/// A second transaction in one request is refused before its control message, naming
/// the request's first transaction, which the middleware then settles as it would alone.
#[tokio::test(start_paused = true)]
async fn a_second_transaction_in_one_request_is_refused_naming_the_first() {
    use axum::extract::State;
    use outbox::http::{HttpError, RequestScope};
    use outbox::request::TxnError;

    static FIRST: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    async fn handler(State(outbox): State<Arc<Outbox>>, scope: RequestScope) -> Result<StatusCode, HttpError> {
        let outbox::http::Begun::Started(first) = scope.begin(None).await? else {
            unreachable!("no key, no replay")
        };
        *FIRST.lock().unwrap() = Some(first.id().to_string());
        match outbox.begin().await {
            Err(error @ TxnError::SecondInRequest { txn_id }) if txn_id == first.id() => Err(error.into()),
            Err(other) => panic!("expected SecondInRequest naming {}, got {other:?}", first.id()),
            Ok(second) => panic!("a second transaction {} began", second.id()),
        }
    }
    let response = stalled_commit_app(handler)
        .oneshot(empty(Method::POST, "/"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()["x-transaction-id"].to_str().unwrap(),
        FIRST.lock().unwrap().clone().expect("the first began"),
        "names the first transaction"
    );
}

/// How a front door hands the Lambda answer to its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrontDoor {
    /// A REST API (v1 proxy event) whose binary media types do not match the request (the
    /// API's default: none): the body as the function wrote it, base64 or not.
    RestApi,
    /// An HTTP API (v2), a function URL, an ALB: a base64 body decoded.
    DecodesBase64,
}

/// What the client of a front door gets.
struct FromFrontDoor {
    status: StatusCode,
    headers: HeaderMap,
    /// The Lambda answer's `isBase64Encoded`.
    base64: bool,
    /// The body as the client receives it, `Content-Encoding` not undone.
    bytes: Vec<u8>,
}

impl FromFrontDoor {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn location(&self) -> Option<String> {
        self.header("location").map(str::to_owned)
    }

    /// The body as JSON, as a client that accepts gzip reads it: gunzipped when
    /// `Content-Encoding: gzip` says so. Null when it is not JSON.
    fn json(&self) -> Value {
        let bytes = if self.header("content-encoding") == Some("gzip") {
            gunzip(&self.bytes)
        } else {
            self.bytes.clone()
        };
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }
}

/// `bytes` gunzipped by `gzip` itself, as a reference implementation.
fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut gzip = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip on the PATH");
    gzip.stdin.take().expect("piped").write_all(bytes).unwrap();
    let output = gzip.wait_with_output().unwrap();
    assert!(output.status.success(), "not gzip: {bytes:?}");
    output.stdout
}

/// An event as `sam local generate-event` writes it (tests/fixtures/generate), served as
/// `lambda_http::run` serves it (its adapter, from the event's JSON to the answer's JSON)
/// by the API's router, and handed to the client as `door` would hand it. The event's
/// `Accept-Encoding` is kept.
async fn through_front_door(router: &Router, door: FrontDoor, event: &str) -> FromFrontDoor {
    use lambda_http::lambda_runtime::{Context, LambdaEvent};
    let payload: lambda_http::request::LambdaRequest = serde_json::from_str(event).expect("an event lambda_http reads");
    let answer = lambda_http::Adapter::from(router.clone())
        .oneshot(LambdaEvent::new(payload, Context::default()))
        .await
        .unwrap();
    let answer = serde_json::to_value(answer).unwrap();
    let status = StatusCode::from_u16(answer["statusCode"].as_u64().unwrap() as u16).unwrap();
    // A REST API answer has them all in `multiValueHeaders`, an HTTP API's in `headers`,
    // an ALB's in both.
    let mut headers = HeaderMap::new();
    let multi = answer["multiValueHeaders"]
        .as_object()
        .filter(|multi| !multi.is_empty());
    let single = answer["headers"].as_object();
    for (name, values) in multi.or(single).into_iter().flatten() {
        let name: axum::http::HeaderName = name.parse().unwrap();
        for value in values.as_array().cloned().unwrap_or_else(|| vec![values.clone()]) {
            headers.append(&name, value.as_str().unwrap().parse().unwrap());
        }
    }
    let base64 = answer["isBase64Encoded"].as_bool().unwrap_or(false);
    let body = answer["body"].as_str().unwrap_or_default();
    let bytes = match door {
        FrontDoor::RestApi => body.as_bytes().to_vec(),
        FrontDoor::DecodesBase64 if base64 => aws_smithy_types::base64::decode(body).unwrap(),
        FrontDoor::DecodesBase64 => body.as_bytes().to_vec(),
    };
    FromFrontDoor {
        status,
        headers,
        base64,
        bytes,
    }
}

/// A REST API (v1) event of stage `prod`: `lambda_http` puts the stage in front of the
/// path, and the API still routes it, answering with a `Location` that keeps the stage
/// the client's URL had (and so does the link to the transaction's status); the order is
/// then read back through that `Location`.
#[tokio::test]
async fn rest_api_events_are_served_whatever_the_stage_and_locations_keep_it() {
    let app = app();
    let create = include_str!("../fixtures/sam_rest_api_create_order.json");
    let created = through_front_door(&app.router, FrontDoor::RestApi, create).await;
    let body = created.json();
    assert_eq!(created.status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().expect("the order's id");
    assert_eq!(created.location(), Some(format!("/prod/orders/{id}")));
    // The link to the transaction's status keeps the stage too.
    let txn = created.header("x-transaction-id").expect("the transaction").to_owned();
    assert_eq!(
        created.header("link"),
        Some(format!("</prod/transactions/{txn}?item=ORDER%23{id}>; rel=\"status\"").as_str())
    );
    let get = include_str!("../fixtures/sam_rest_api_get_order.json").replace("ORDER_ID", id);
    let read = through_front_door(&app.router, FrontDoor::RestApi, &get).await;
    let read_body = read.json();
    assert_eq!(
        (read.status, read_body["id"].clone()),
        (StatusCode::OK, json!(id)),
        "{read_body}"
    );
}

/// The HTTP API (v2, stage `$default`) and ALB events SAM generates create orders too;
/// their `Location` has no prefix, as the client's URL had none.
#[tokio::test]
async fn http_api_and_alb_events_from_sam_create_orders() {
    let app = app();
    for (kind, event) in [
        ("HTTP API", include_str!("../fixtures/sam_http_api_create_order.json")),
        ("ALB", include_str!("../fixtures/sam_alb_create_order.json")),
    ] {
        let created = through_front_door(&app.router, FrontDoor::DecodesBase64, event).await;
        let body = created.json();
        assert_eq!(created.status, StatusCode::CREATED, "{kind}: {body}");
        let id = body["id"].as_str().expect("the order's id");
        assert_eq!(created.location(), Some(format!("/orders/{id}")), "{kind}");
    }
}

/// `event` with `Accept-Encoding: gzip`, unless it has an `Accept-Encoding` already
/// (SAM's HTTP API event has none; a browser or `curl --compressed` sends one).
fn accepting_gzip(event: &str) -> String {
    let mut event: Value = serde_json::from_str(event).unwrap();
    let headers = event["headers"].as_object_mut().expect("headers");
    if !headers.keys().any(|name| name.eq_ignore_ascii_case("accept-encoding")) {
        headers.insert("accept-encoding".into(), json!("gzip"));
    }
    event.to_string()
}

/// Every front door hands its client JSON it can read when the client accepts gzip (as
/// SAM's events do): a REST API, which would hand a compressed answer over as base64 text
/// (its binary media types do not match), gets a plain one; an HTTP API and an ALB, which
/// decode base64, get gzip, which gunzips to the order as a plain read gives it.
#[tokio::test]
async fn every_front_door_hands_its_client_readable_json_when_it_accepts_gzip() {
    let app = app();
    let rest_api = include_str!("../fixtures/sam_rest_api_create_order.json");
    assert!(rest_api.contains("\"Accept-Encoding\": \"gzip, deflate, sdch\""));
    let created = through_front_door(&app.router, FrontDoor::RestApi, rest_api).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert!(!created.base64, "a REST API answer is text");
    assert_eq!(created.header("content-encoding"), None, "a REST API answer is plain");
    let order: Value = serde_json::from_slice(&created.bytes).expect("the client reads JSON");
    let id = order["id"].as_str().expect("the order's id");
    let read = app.send(empty(Method::GET, &format!("/orders/{id}"))).await;
    assert_eq!(order, read.body, "the order as a plain read gives it");
    let get = include_str!("../fixtures/sam_rest_api_get_order.json").replace("ORDER_ID", id);
    let read_through = through_front_door(&app.router, FrontDoor::RestApi, &get).await;
    assert_eq!(
        (read_through.base64, read_through.header("content-encoding")),
        (false, None)
    );
    assert_eq!(serde_json::from_slice::<Value>(&read_through.bytes).unwrap(), order);

    for (kind, event) in [
        ("HTTP API", include_str!("../fixtures/sam_http_api_create_order.json")),
        ("ALB", include_str!("../fixtures/sam_alb_create_order.json")),
    ] {
        let created = through_front_door(&app.router, FrontDoor::DecodesBase64, &accepting_gzip(event)).await;
        assert_eq!(created.status, StatusCode::CREATED, "{kind}");
        assert!(created.base64, "{kind}: a compressed answer goes out as base64");
        assert_eq!(created.header("content-encoding"), Some("gzip"), "{kind}: compressed");
        assert!(
            serde_json::from_slice::<Value>(&created.bytes).is_err(),
            "{kind}: gzip, not JSON"
        );
        let order = created.json();
        let id = order["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{kind}: the order's id in {order}"));
        let read = app.send(empty(Method::GET, &format!("/orders/{id}"))).await;
        assert_eq!(order, read.body, "{kind}: the order as a plain read gives it");
    }
}

/// The request's span carries the route it matched (`/orders/{id}`, not the path), so
/// that logs and traces group by route.
#[tokio::test]
async fn the_request_span_names_the_matched_route() {
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Logged(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Logged {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_span_list(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    // tracing caches each callsite's interest for the whole process, computed by the
    // thread that reaches it first: with this test's subscriber the only one registered,
    // a sibling test's thread with none caches "never" for the trace layer's events, and
    // this test misses them (seen once in CI; tokio-rs/tracing#3611). A global default
    // that writes nothing keeps every thread interested.
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = app();
    let response = app
        .router
        .clone()
        .oneshot(json_request(Method::POST, "/orders", &new_order()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let path = format!("/orders/{}", body["id"].as_str().unwrap());
    let response = app.router.clone().oneshot(empty(Method::GET, &path)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    // The read's span: its path is the order's, its route the pattern that matched it.
    let routed = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter_map(|line| line["spans"].as_array().cloned())
        .flatten()
        // The last: the first ("started processing request") comes before routing.
        .rfind(|span| span["name"] == "request" && span["path"] == path.as_str())
        .unwrap_or_else(|| panic!("no line in the read's request span: {text}"));
    assert_eq!(routed["route"], "/orders/{id}", "{routed}");
}

/// A handler that hands its transaction (entity mode) to a task and answers before the
/// commit is done. If the task has not begun the commit when the middleware settles the
/// request, the commit is refused (`TxnError::Abandoned`) and nothing is written or sent,
/// not even its control message, and the answer names no transaction (before, the
/// middleware's tombstone let the commit apply beside it). If it began (its hook told the
/// scope, and it is held in the network for a second), the middleware leaves it to
/// finish: it applies, and no tombstone or fence stands beside it. The task is told the
/// truth either way.
#[tokio::test(start_paused = true)]
async fn a_commit_handed_to_a_task_past_the_answer_is_refused_or_left_to_finish() {
    use axum::extract::State;
    use outbox::http::{enforce_deadline, Deadlines, HttpError, RequestScope};
    use outbox::ports::{BusinessWrite, CommitRequest, ExpectedVersion, ItemKey};
    use outbox::protocol::{OutboxRecord, TxnId};
    use outbox::request::TxnError;

    type Answers =
        Arc<tokio::sync::Mutex<Option<tokio::task::JoinHandle<Result<outbox::request::Committed, TxnError>>>>>;
    for wait_for_the_commit in [false, true] {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
        let key: ItemKey = "ORDER#1".parse().unwrap();
        let create = TxnId::new_v7();
        let now = clock.now();
        let seed = CommitRequest {
            txn_id: create,
            writes: vec![BusinessWrite::Put {
                key: key.clone(),
                data: json!({"lines": 1}),
                expected: ExpectedVersion::Absent,
            }],
            outbox: OutboxRecord::committed(create, vec![], now, now.plus(Duration::from_secs(600))),
            idempotency: None,
        };
        backend.store.commit(&seed).await.unwrap();
        let ports = RequestPorts {
            store: Arc::new(OddStore {
                commit: CommitStall::AppliesAfter(Duration::from_secs(1)),
                ..OddStore::around(backend.store.clone())
            }),
            ..backend.request_ports(clock.clone())
        };
        let outbox = Arc::new(Outbox::new(ports, Timing::default(), TransactionLimits::default()));
        let task: Answers = Answers::default();
        let handed = task.clone();
        let handler = move |State(_): State<Arc<Outbox>>, scope: RequestScope| async move {
            let outbox::http::Begun::Started(mut txn) = scope.begin_entity("ORDER#1".parse().unwrap(), None).await?
            else {
                unreachable!("no key, no replay")
            };
            txn.put(
                "ORDER#1".parse().unwrap(),
                json!({"lines": 2}),
                ExpectedVersion::Exactly(1),
            );
            let (began, begun) = tokio::sync::oneshot::channel();
            txn.on_commit_attempt(move |_| {
                let _ = began.send(());
            });
            *handed.lock().await = Some(tokio::spawn(txn.commit()));
            if wait_for_the_commit {
                begun.await.unwrap();
            }
            Ok::<_, HttpError>(StatusCode::ACCEPTED)
        };
        let app = Router::new()
            .route("/", axum::routing::post(handler))
            .route_layer(axum::middleware::from_fn_with_state(
                Deadlines::new(outbox.as_ref().clone(), Duration::from_secs(2)),
                enforce_deadline,
            ))
            .with_state(outbox.clone());
        let response = app.oneshot(empty(Method::POST, "/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let named: Option<TxnId> = response
            .headers()
            .get("x-transaction-id")
            .map(|value| value.to_str().unwrap().parse().unwrap());
        let answer = task.lock().await.take().unwrap().await.unwrap();
        let txn_id = match (wait_for_the_commit, &answer) {
            (false, Err(error @ TxnError::Abandoned { .. })) => error.txn_id(),
            (true, Ok(committed)) => committed.txn_id,
            other => panic!("the task's commit: {other:?}"),
        };
        assert_eq!(
            named,
            wait_for_the_commit.then_some(txn_id),
            "named once something of it was sent"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let order = backend.store.get_entity(&key).await.unwrap().unwrap();
        let status = outbox.status(txn_id).await.unwrap();
        if wait_for_the_commit {
            assert_eq!(order.item.version, 2, "the commit that began applied");
            assert_eq!(order.entries.len(), 1, "its entry, for the worker");
            assert_ne!(status, outbox::request::TxnStatus::Tombstoned);
        } else {
            assert_eq!(order.item.version, 1, "nothing applied");
            assert!(order.entries.is_empty());
            assert_eq!(status, outbox::request::TxnStatus::Unknown, "nothing written");
            assert!(backend.control_queue.queue().is_empty(), "no control message was sent");
        }
        assert_eq!(order.fence, None, "no fence: none was needed");
    }
}

/// A handler that stages its change, hands the transaction to a task and then overruns:
/// the middleware answers for it, a plain timeout saying nothing was written (nothing of
/// the transaction had been sent), and from then on the transaction can neither send its
/// control message nor commit. The task's commit, coming after that answer, is refused
/// (`TxnError::Abandoned`), and nothing of it is ever sent or written: the order stays as
/// it was, no record, no control message, no event.
#[tokio::test(start_paused = true)]
async fn a_task_that_commits_after_the_middleware_answered_nothing_written_cannot_commit() {
    use outbox::http::{enforce_deadline, Deadlines, HttpError, RequestScope};
    use outbox::ports::{BusinessWrite, CommitRequest, ExpectedVersion, ItemKey};
    use outbox::protocol::{Message, OutboxRecord, TxnId};
    use outbox::request::{Committed, TxnError};

    type Task = Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<Result<Committed, TxnError>>>>>;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let key: ItemKey = "ORDER#1".parse().unwrap();
    let create = TxnId::new_v7();
    let now = clock.now();
    let seed = CommitRequest {
        txn_id: create,
        writes: vec![BusinessWrite::Put {
            key: key.clone(),
            data: json!({"lines": 1}),
            expected: ExpectedVersion::Absent,
        }],
        outbox: OutboxRecord::committed(create, vec![], now, now.plus(Duration::from_secs(600))),
        idempotency: None,
    };
    backend.store.commit(&seed).await.unwrap();
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let task: Task = Task::default();
    let handed = task.clone();
    let (go, went) = tokio::sync::oneshot::channel::<()>();
    let went = Arc::new(std::sync::Mutex::new(Some(went)));
    let handler = move |scope: RequestScope| async move {
        // Begun without the request's deadline, so that nothing but the abandon stops its
        // late commit (the middleware sees it all the same).
        let mut txn = scope.outbox().begin_entity("ORDER#1".parse().unwrap()).await?;
        txn.put(
            "ORDER#1".parse().unwrap(),
            json!({"lines": 2}),
            ExpectedVersion::Exactly(1),
        );
        txn.emit(Message::json(events(), &json!({"type": "LineAdded"})).unwrap());
        let went = went.lock().unwrap().take().unwrap();
        *handed.lock().unwrap() = Some(tokio::spawn(async move {
            went.await.unwrap();
            txn.commit().await
        }));
        // Overruns: the middleware answers for it.
        std::future::pending::<()>().await;
        Ok::<_, HttpError>(StatusCode::ACCEPTED)
    };
    let app = Router::new()
        .route("/", axum::routing::post(handler))
        .route_layer(axum::middleware::from_fn_with_state(
            Deadlines::new(outbox.clone(), Duration::from_secs(2)),
            enforce_deadline,
        ));
    let response = app.oneshot(empty(Method::POST, "/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().get("x-transaction-id").is_none());
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["detail"].as_str()),
        (
            Some("/problems/timeout"),
            Some("nothing was written; retry the request")
        )
    );
    // The task commits after that answer.
    go.send(()).unwrap();
    let handle = task.lock().unwrap().take().unwrap();
    let late = handle.await.unwrap();
    let txn_id = match &late {
        Err(error @ TxnError::Abandoned { .. }) => error.txn_id(),
        other => panic!("a commit after a 'nothing was written' answer: {other:?}"),
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let order = backend.store.get_entity(&key).await.unwrap().unwrap();
    assert_eq!(order.item.version, 1, "nothing applied");
    assert!(order.entries.is_empty());
    assert_eq!(
        outbox.status(txn_id).await.unwrap(),
        outbox::request::TxnStatus::Unknown,
        "no record"
    );
    assert!(backend.control_queue.queue().is_empty(), "no control message");
    assert!(backend.publisher.queue(&events()).unwrap().is_empty());
}

/// The middleware answers for a handler that overran from how far the transaction had got
/// when it abandoned it, not from an earlier look: here a task the handler gave the
/// transaction to (begun without a deadline) starts its commit just as the middleware
/// takes over (held there by a
/// hook on the middleware's own log line), the commit never answers and the fence in the
/// item cannot be written in time. The commit may still land, so the answer is "outcome
/// unknown", never "nothing was written".
#[test]
fn a_commit_started_as_the_middleware_answers_for_an_overrun_is_answered_outcome_unknown() {
    use axum::routing::post;
    use outbox::http::{enforce_deadline, Deadlines, RequestScope};
    use outbox::ports::{ExpectedVersion, ItemKey, SystemClock};
    use outbox::protocol::Message;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    /// When the middleware logs that it answers for the handler, lets the task holding
    /// the transaction commit and waits until its commit reached the store.
    struct CommitOnOverrun {
        go: Arc<tokio::sync::Notify>,
        store: Arc<OddStore>,
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CommitOnOverrun {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            if message.0.contains("overran its deadline") {
                // Woken from a thread outside the runtime, so that the task goes to the
                // runtime's shared queue, where the other worker takes it (woken from
                // here, it would wait in this blocked worker's own slot).
                let go = self.go.clone();
                std::thread::spawn(move || go.notify_one()).join().unwrap();
                let until = std::time::Instant::now() + Duration::from_secs(5);
                while self.store.commits.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let store = Arc::new(OddStore {
        commit: CommitStall::Forever,
        tombstones_stall: true,
        ..OddStore::around(backend.store.clone())
    });
    let go = Arc::new(tokio::sync::Notify::new());
    let hook = (go.clone(), store.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let layer = CommitOnOverrun {
                go: hook.0.clone(),
                store: hook.1.clone(),
            };
            // The thread's own subscriber, kept for the thread's life.
            std::mem::forget(tracing::subscriber::set_default(
                tracing_subscriber::registry().with(layer),
            ));
        })
        .build()
        .unwrap();
    let outbox = Outbox::new(
        RequestPorts {
            store: store.clone(),
            ..backend.request_ports(clock.clone())
        },
        Timing::default(),
        TransactionLimits::default(),
    );
    // The item is created through the store as it is.
    let creator = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let item: ItemKey = "COUNTER#1".parse().unwrap();
    // On the runtime's threads, where the hook is.
    let reply = runtime
        .block_on(runtime.spawn(async move {
            let mut create = creator.begin().await.unwrap();
            create.put(item.clone(), json!({"n": 0}), ExpectedVersion::Absent);
            create.commit().await.unwrap();
            let handler = move |scope: RequestScope| async move {
                // Begun on the request path directly (the scope sees it): with no deadline, its
                // commit may start at any time.
                let mut txn = scope.outbox().begin_entity(item.clone()).await.unwrap();
                txn.put(item, json!({"n": 1}), ExpectedVersion::Exactly(1));
                txn.emit(Message::json(events(), &json!({"n": 1})).unwrap());
                tokio::spawn(async move {
                    go.notified().await;
                    let _ = txn.commit().await;
                });
                std::future::pending::<()>().await;
            };
            let app = Router::new()
                .route("/hold", post(handler))
                .layer(axum::middleware::from_fn_with_state(
                    Deadlines::new(outbox.clone(), Duration::from_secs(2)),
                    enforce_deadline,
                ));
            let response = app
                .oneshot(Request::post("/hold").body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body: Value =
                serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
            (status, body)
        }))
        .unwrap();
    assert_eq!(store.commits.load(Ordering::SeqCst), 1, "the task's commit was sent");
    assert_eq!(reply.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.1["type"], "/problems/outcome-unknown",
        "a commit under way is not 'nothing was written': {}",
        reply.1
    );
}

/// Once the middleware has answered for a handler that overran ("nothing was written"),
/// nothing of that request begins any more: a task the handler spawned that begins
/// through the scope afterwards is refused, so its change cannot land behind the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_middleware_answered_for_an_overrun_nothing_of_the_request_begins() {
    use axum::routing::post;
    use outbox::http::{enforce_deadline, Deadlines, RequestScope};
    use outbox::ports::SystemClock;

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let answered = Arc::new(tokio::sync::Notify::new());
    let (began, late_begin) = tokio::sync::oneshot::channel();
    let began = Arc::new(std::sync::Mutex::new(Some(began)));
    let go = answered.clone();
    let handler = move |scope: RequestScope| async move {
        let began = began.lock().unwrap().take().expect("one request");
        tokio::spawn(async move {
            go.notified().await;
            let _ = began.send(scope.begin(None).await.map(|_| ()));
        });
        std::future::pending::<()>().await;
    };
    let app = Router::new()
        .route("/late", post(handler))
        .layer(axum::middleware::from_fn_with_state(
            Deadlines::new(outbox.clone(), Duration::from_secs(2)),
            enforce_deadline,
        ));
    let response = app
        .oneshot(Request::post("/late").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["type"], "/problems/timeout", "{body}");
    answered.notify_one();
    let late = late_begin.await.unwrap();
    assert!(
        matches!(
            late,
            Err(outbox::http::HttpError::Transaction(
                outbox::request::TxnError::DeadlineExceeded { .. }
            ))
        ),
        "a begin after the answer is refused: {late:?}"
    );
}

/// Every header an answer naming its transaction carries (its id, its item, the link to
/// its status, and the others a route sends) is one the document lists for that route
/// and status: a success, each refusal decided after the transaction began (which names
/// none, having sent nothing), and a 503.
#[tokio::test(start_paused = true)]
async fn every_header_an_answer_naming_its_transaction_carries_is_documented() {
    let app = app();
    let document = app.send(empty(Method::GET, "/openapi.json")).await.body;
    let mut answers: Vec<(&str, &str, Reply)> = Vec::new();
    let line = |sku: &str| json!({"sku": sku, "quantity": 1, "unit_price_cents": 500});
    let created = app.create().await;
    assert_eq!(created.status, StatusCode::CREATED);
    let id = created.body["id"].as_str().unwrap().to_owned();
    answers.push(("/orders", "post", created));
    let items = format!("/orders/{id}/items");
    let added = app.send(json_request(Method::POST, &items, &line("SKU-2"))).await;
    answers.push(("/orders/{id}/items", "post", added));
    let removed = app.send(empty(Method::DELETE, &format!("{items}/SKU-2"))).await;
    answers.push(("/orders/{id}/items/{sku}", "delete", removed));
    let mut stale = json_request(Method::POST, &items, &line("SKU-3"));
    stale.headers_mut().insert("if-match", "\"7\"".parse().unwrap());
    answers.push(("/orders/{id}/items", "post", app.send(stale).await));
    let missing = "/orders/018bcfe5-6800-7000-8000-0000000000ff";
    answers.push((
        "/orders/{id}/items",
        "post",
        app.send(json_request(Method::POST, &format!("{missing}/items"), &line("SKU-3")))
            .await,
    ));
    answers.push((
        "/orders/{id}/items/{sku}",
        "delete",
        app.send(empty(Method::DELETE, &format!("{missing}/items/SKU-1"))).await,
    ));
    answers.push((
        "/orders/{id}/cancel",
        "post",
        app.send(empty(Method::POST, &format!("{missing}/cancel"))).await,
    ));
    let full: Vec<Value> = (0..50).map(|n| line(&format!("SKU-{n}"))).collect();
    let full = app
        .send(json_request(
            Method::POST,
            "/orders",
            &json!({"customer_id": "c-1", "items": full}),
        ))
        .await;
    let full_id = full.body["id"].as_str().unwrap().to_owned();
    answers.push((
        "/orders/{id}/items",
        "post",
        app.send(json_request(
            Method::POST,
            &format!("/orders/{full_id}/items"),
            &line("SKU-X"),
        ))
        .await,
    ));
    answers.push((
        "/orders/{id}/cancel",
        "post",
        app.send(empty(Method::POST, &format!("/orders/{id}/cancel"))).await,
    ));
    answers.push((
        "/orders/{id}/items",
        "post",
        app.send(json_request(Method::POST, &items, &line("SKU-4"))).await,
    ));
    // 503s: a create whose commit stalls (naming its transaction), a change whose read
    // does (nothing of it sent: a plain timeout).
    let stalled = app_with_odd_store(|odd| OddStore {
        commit: CommitStall::Forever,
        ..odd
    });
    answers.push(("/orders", "post", stalled.create().await));
    let slow = app_with_odd_store(|odd| OddStore {
        read_delay: Duration::from_secs(30),
        ..odd
    });
    let slow_id = slow.create().await.body["id"].as_str().unwrap().to_owned();
    answers.push((
        "/orders/{id}/items",
        "post",
        slow.send(json_request(
            Method::POST,
            &format!("/orders/{slow_id}/items"),
            &line("SKU-2"),
        ))
        .await,
    ));

    let statuses: Vec<u16> = answers.iter().map(|(_, _, reply)| reply.status.as_u16()).collect();
    assert_eq!(
        statuses,
        [201, 200, 200, 412, 404, 404, 404, 422, 200, 409, 503, 503],
        "the answers this test means"
    );
    // Those whose transaction sent something (a commit, a stalled commit) name it; the
    // refusals decided by the reads or the rules, and the read that stalled, sent
    // nothing and name none.
    let names = [
        true, true, true, false, false, false, false, false, true, false, true, false,
    ];
    let named = [
        "x-transaction-id",
        "x-transaction-item",
        "link",
        "location",
        "etag",
        "retry-after",
    ];
    for ((path, method, reply), names) in answers.iter().zip(names) {
        let status = reply.status.as_u16();
        assert_eq!(
            header(reply, "x-transaction-id").is_some(),
            names,
            "{method} {path} {status}: names its transaction"
        );
        let documented: Vec<String> = document["paths"][*path][*method]["responses"][status.to_string()]["headers"]
            .as_object()
            .map(|headers| headers.keys().map(|name| name.to_ascii_lowercase()).collect())
            .unwrap_or_default();
        for name in named.iter().filter(|name| reply.headers.contains_key(**name)) {
            assert!(
                documented.iter().any(|listed| listed == name),
                "{method} {path} {status} sends {name}, which the document does not list ({documented:?})"
            );
        }
    }
}

/// A request as API Gateway's HTTP API hands it over once its JWT authorizer verified the
/// caller's token: SAM's HTTP API event (tests/fixtures/generate) on `method` and `path`
/// with `body`, its claims with `sub` set to `subject` (SAM's event has none), read by
/// `lambda_http` as on Lambda.
fn signed_in(subject: Option<&str>, method: Method, path: &str, body: Option<&Value>) -> Request<Body> {
    let mut event: Value = serde_json::from_str(include_str!("../fixtures/sam_http_api_create_order.json")).unwrap();
    event["rawPath"] = json!(path);
    event["rawQueryString"] = json!("");
    event["queryStringParameters"] = json!({});
    event["requestContext"]["http"]["method"] = json!(method.as_str());
    event["requestContext"]["http"]["path"] = json!(path);
    event["isBase64Encoded"] = json!(false);
    event["body"] = body.map_or(Value::Null, |body| json!(body.to_string()));
    if let Some(subject) = subject {
        event["requestContext"]["authorizer"]["jwt"]["claims"]["sub"] = json!(subject);
        event["requestContext"]["authorizer"]["jwt"]["claims"]["iss"] = json!(ISSUER);
    }
    // A token with both of the API's scopes, on the route API Gateway matched.
    event["requestContext"]["authorizer"]["jwt"]["scopes"] = json!(["orders/read", "orders/write"]);
    event["requestContext"]["routeKey"] = json!(format!("{method} {path}"));
    event["routeKey"] = event["requestContext"]["routeKey"].clone();
    let request = lambda_http::request::from_str(&event.to_string()).expect("an HTTP API event");
    request.map(|body| Body::from(body.to_vec()))
}

/// The issuer of the tokens `signed_in` carries.
const ISSUER: &str = "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_test";

/// An order belongs to the caller who placed it (the subject of their token): another
/// caller reads it, changes it and cancels it as if it did not exist (404, nothing sent or
/// written, no transaction named), while its owner does all three; the
/// same `Idempotency-Key` from two callers makes two orders, never one's replay for the
/// other.
#[tokio::test]
async fn an_order_is_its_callers_and_another_caller_finds_nothing() {
    let app = app();
    let placed = app
        .send(signed_in(Some("alice"), Method::POST, "/orders", Some(&new_order())))
        .await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
    let id = placed.body["id"].as_str().unwrap().to_owned();
    let path = format!("/orders/{id}");
    let item = json!({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 100});

    let read = app.send(signed_in(Some("bob"), Method::GET, &path, None)).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "{}", read.body);
    assert_eq!(
        read.body["detail"],
        json!(format!("no order {id}")),
        "as for no order at all"
    );
    let items = format!("{path}/items");
    let cancel = format!("{path}/cancel");
    for (method, target, body) in [
        (Method::POST, items.as_str(), Some(&item)),
        (Method::DELETE, &format!("{path}/items/SKU-1"), None),
        (Method::POST, cancel.as_str(), None),
    ] {
        let changed = app.send(signed_in(Some("bob"), method.clone(), target, body)).await;
        assert_eq!(
            changed.status,
            StatusCode::NOT_FOUND,
            "{method} {target}: {}",
            changed.body
        );
        assert!(
            !changed.headers.contains_key("x-transaction-id"),
            "{method} {target}: nothing of the transaction it began was sent, and none is named"
        );
    }
    app.settle().await;
    let mine = app.send(signed_in(Some("alice"), Method::GET, &path, None)).await;
    assert_eq!(
        (mine.status, mine.body["version"].clone(), mine.body["status"].clone()),
        (StatusCode::OK, json!(1), json!("placed")),
        "nothing another caller sent changed it: {}",
        mine.body
    );
    assert_eq!(
        app.published().len(),
        1,
        "one event: the placing; another caller's tries emitted nothing"
    );
    let added = app
        .send(signed_in(Some("alice"), Method::POST, &items, Some(&item)))
        .await;
    assert_eq!(
        (added.status, added.body["version"].clone()),
        (StatusCode::OK, json!(2))
    );
    let development = app.send(empty(Method::GET, &path)).await;
    assert_eq!(
        development.status,
        StatusCode::NOT_FOUND,
        "with sign-in off, a request without a token is the development caller, not Alice"
    );

    let keyed = |subject: &'static str, customer: &str| {
        let mut request = signed_in(
            Some(subject),
            Method::POST,
            "/orders",
            Some(&json!({"customer_id": customer, "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 1}]})),
        );
        request
            .headers_mut()
            .insert("idempotency-key", "\"one-key\"".parse().unwrap());
        request
    };
    let alices = app.send(keyed("alice", "c-alice")).await;
    let bobs = app.send(keyed("bob", "c-bob")).await;
    assert_eq!(
        (alices.status, bobs.status),
        (StatusCode::CREATED, StatusCode::CREATED),
        "one key, two callers, two different requests: neither is refused as a reuse ({})",
        bobs.body
    );
    assert_ne!(alices.body["id"], bobs.body["id"], "two orders");
    assert!(
        !bobs.headers.contains_key("idempotent-replayed"),
        "Bob never gets Alice's answer"
    );
    let again = app.send(keyed("bob", "c-bob")).await;
    assert_eq!(
        (
            again.status,
            again.body["id"].clone(),
            again.headers.get("idempotent-replayed").cloned()
        ),
        (
            StatusCode::CREATED,
            bobs.body["id"].clone(),
            Some("true".parse().unwrap())
        ),
        "Bob's own repeat replays Bob's answer"
    );
}

/// With sign-in required (`OUTBOX_AUTH=jwt`, the default on Lambda), a request that
/// reaches the API without a caller verified by API Gateway (SAM's event, whose claims
/// have no subject, or none at all) is a 401 problem before anything begins: no
/// transaction, no control message; the OpenAPI document stays open, and a verified
/// caller is served.
#[tokio::test]
async fn without_a_verified_caller_a_signed_in_api_answers_401_and_writes_nothing() {
    let config = HttpConfig {
        authentication: Authentication::Jwt,
        ..config()
    };
    let app = app_with_config(|backend, clock| backend.request_ports(clock), config);
    let unsigned = [
        signed_in(None, Method::POST, "/orders", Some(&new_order())),
        json_request(Method::POST, "/orders", &new_order()),
        empty(Method::GET, "/orders/018bcfe5-6800-7000-8000-000000000000"),
        empty(Method::POST, "/orders/018bcfe5-6800-7000-8000-000000000000/cancel"),
        empty(Method::GET, "/transactions/018bcfe5-6800-7000-8000-000000000000"),
    ];
    for request in unsigned {
        let target = format!("{} {}", request.method(), request.uri());
        let reply = app.send(request).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{target}: {}", reply.body);
        assert_eq!(reply.headers["content-type"], "application/problem+json", "{target}");
        assert_eq!(reply.headers["www-authenticate"], "Bearer", "{target}");
        assert_eq!(reply.body["type"], "/problems/unauthenticated", "{target}");
        assert!(
            !reply.headers.contains_key("x-transaction-id"),
            "{target}: nothing began"
        );
    }
    assert!(
        app.backend.control_queue.queue().is_empty(),
        "no control message went out"
    );
    let document = app.send(empty(Method::GET, "/openapi.json")).await;
    assert_eq!(document.status, StatusCode::OK, "the document needs no token");
    let placed = app
        .send(signed_in(Some("alice"), Method::POST, "/orders", Some(&new_order())))
        .await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
}

/// Behind API Gateway, the request's id is the one its access log carries (the event's
/// `requestContext.requestId`), even when the client sent its own `x-request-id`; a
/// request from elsewhere keeps the client's id.
#[tokio::test]
async fn behind_api_gateway_the_request_id_is_the_access_logs() {
    let app = app();
    let mut request = signed_in(Some("alice"), Method::POST, "/orders", Some(&new_order()));
    request
        .headers_mut()
        .insert("x-request-id", "chosen-by-the-client".parse().unwrap());
    let placed = app.send(request).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
    assert_eq!(
        placed.headers["x-request-id"], "id",
        "SAM's event's requestContext.requestId"
    );
    let mut local = json_request(Method::POST, "/orders", &new_order());
    local
        .headers_mut()
        .insert("x-request-id", "chosen-by-the-client".parse().unwrap());
    assert_eq!(app.send(local).await.headers["x-request-id"], "chosen-by-the-client");
}

/// Under `OUTBOX_AUTH=jwt`, the caller is the verified subject wherever the front door
/// puts it: a REST API's Cognito authorizer (`requestContext.authorizer.claims.sub`)
/// serves Alice as an HTTP API's JWT authorizer does; an empty subject, or one that
/// names the development caller, is no caller (401); a caller a middleware put in the
/// request never outranks the subject the front door verified.
#[tokio::test]
async fn the_verified_subject_is_the_caller_whatever_the_front_door() {
    let config = HttpConfig {
        authentication: Authentication::Jwt,
        ..config()
    };
    let app = app_with_config(|backend, clock| backend.request_ports(clock), config);
    let rest_api = |subject: &str| {
        let mut event: Value =
            serde_json::from_str(include_str!("../fixtures/sam_rest_api_create_order.json")).unwrap();
        event["requestContext"]["authorizer"] = json!({"claims": {"sub": subject, "iss": ISSUER, "token_use": "access", "scope": "orders/read orders/write"}});
        let request = lambda_http::request::from_str(&event.to_string()).expect("a REST API event");
        request.map(|body| Body::from(body.to_vec()))
    };
    let placed = app.send(rest_api("alice")).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
    let id = placed.body["id"].as_str().unwrap().to_owned();
    let path = format!("/orders/{id}");
    assert_eq!(
        app.send(signed_in(Some("alice"), Method::GET, &path, None))
            .await
            .status,
        StatusCode::OK,
        "the REST API's Alice is the HTTP API's"
    );
    for subject in ["", outbox::http::Caller::DEVELOPMENT] {
        let refused = app
            .send(signed_in(Some(subject), Method::POST, "/orders", Some(&new_order())))
            .await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "subject {subject:?}");
        assert_eq!(
            app.send(rest_api(subject)).await.status,
            StatusCode::UNAUTHORIZED,
            "REST API, subject {subject:?}"
        );
    }
    let mut claimed = signed_in(Some("bob"), Method::GET, &path, None);
    claimed.extensions_mut().insert(outbox::http::Caller::new("alice"));
    assert_eq!(
        app.send(claimed).await.status,
        StatusCode::NOT_FOUND,
        "Bob's verified subject wins over a caller put in the request"
    );
}

#[path = "api/front_doors.rs"]
mod front_doors;
