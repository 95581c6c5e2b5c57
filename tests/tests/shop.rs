//! The second worked example end to end on the emulator: the shop's HTTP routes over a
//! single-table design it made itself (`PK` + `SK`, a GSI, TTL on `ttl`), its native
//! `Update ... ADD` and conditional `Put` committed with the outbox's records, and the
//! unchanged control path dispatching its events.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use outbox::control::poller::poll_once;
use outbox::control::{ControlPath, ControlPorts};
use outbox::embedded::ManualClock;
use outbox::native::NativeOutbox;
use outbox::ports::{Clock, ControlQueue, QueueError, RandomIds};
use outbox::protocol::ControlMessage;
use outbox::request::{Outbox, RequestPorts, TxnStatus};
use outbox::settings::{Timing, TransactionLimits};
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::{events, Backend};
use outbox_tests::emulator::{emulator, unique_name};
use outbox_tests::single_table::{create_single_table, single_table_layout};
use serde_json::{json, Value};
use shop::catalog::{Catalog, CatalogError, DynamoCatalog, Product};
use shop::{router, Shop};
use tower::ServiceExt;

/// The third worked example, on the embedded backend.
#[path = "shop/inventory.rs"]
mod inventory_example;

/// The shipping example, a consumer that publishes, on the test harness.
#[path = "shop/shipping.rs"]
mod shipping_example;

/// The billing example, a consumer of shipping's messages, on the test harness.
#[path = "shop/billing.rs"]
mod billing_example;

/// A busy item of the inventory example, on both backends.
#[path = "shop/hot_item.rs"]
mod hot_item;

const SKU: &str = "SKU-1";

fn timing() -> Timing {
    Timing {
        first_check_delay: Duration::ZERO,
        ..Timing::default()
    }
}

struct World {
    backend: Backend,
    catalog: DynamoCatalog,
    outbox: NativeOutbox,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

/// A fresh shop table holding `SKU-1` with 10 units in stock; every call of the shop and
/// of the outbox counted on the wire (`backend.wire`).
async fn world() -> World {
    let wire = CallCounter::default();
    let clients = wire.clients(&emulator().sdk_config().await);
    let table = unique_name("shop");
    create_single_table(&clients.dynamodb, &table).await;
    let catalog = DynamoCatalog::new(clients.dynamodb.clone(), &table);
    catalog.add_product(SKU, "tools", 10).await.expect("seed the product");
    let mut backend = Backend::aws_on(clients, Some(single_table_layout(&table))).await;
    backend.wire = Some(wire);
    let outbox = NativeOutbox::new(backend.outbox(timing())).expect("the DynamoDB store");
    World {
        backend,
        catalog,
        outbox,
    }
}

impl World {
    fn app(&self, catalog: Arc<dyn Catalog>) -> Router {
        router(
            Shop {
                outbox: self.outbox.clone(),
                catalog,
                writes: self.catalog.clone(),
                events: events(),
            },
            Duration::from_secs(10),
        )
    }

    async fn send(&self, app: &Router, request: Request<Body>) -> Reply {
        let response = app.clone().oneshot(request).await.expect("an answer");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, headers, body }
    }

    async fn stock(&self) -> Product {
        self.catalog.product(SKU).await.unwrap().expect("the product")
    }
}

fn reserve(id: &str, quantity: u64, key: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(format!("/products/{SKU}/reservations"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Body::from(
            json!({"reservation_id": id, "quantity": quantity}).to_string(),
        ))
        .unwrap()
}

fn transaction_of(reply: &Reply) -> String {
    reply.headers["x-transaction-id"].to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_commits_the_counter_and_the_item_and_its_event_is_dispatched() {
    let world = world().await;
    let app = world.app(Arc::new(world.catalog.clone()));
    let reply = world.send(&app, reserve("r-1", 3, None)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(reply.body["quantity"], 3);
    let txn = transaction_of(&reply);
    assert_eq!(world.stock().await.reserved, 3);
    assert!(world.catalog.reservation_exists("r-1", SKU).await.unwrap());

    world.backend.settle(timing()).await;
    let delivered = world.backend.drain(&events()).await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].message_id.as_deref(), Some(format!("{txn}:0").as_str()));
    let event: Value = serde_json::from_str(&delivered[0].body).unwrap();
    assert_eq!(event["type"], "StockReserved");
    assert_eq!(event["reservation"]["reservation_id"], "r-1");
    assert_eq!(
        world.outbox.outbox().status(txn.parse().unwrap()).await.unwrap(),
        TxnStatus::Dispatched
    );

    let read = world
        .send(
            &app,
            Request::get(format!("/products/{SKU}")).body(Body::empty()).unwrap(),
        )
        .await;
    assert_eq!(read.body, json!({"sku": SKU, "stock": 10, "reserved": 3}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shops_own_condition_failing_is_a_409_naming_its_action_and_nothing_is_written() {
    let world = world().await;
    let app = world.app(Arc::new(world.catalog.clone()));
    assert_eq!(
        world.send(&app, reserve("r-1", 2, None)).await.status,
        StatusCode::CREATED
    );

    // The reservation's put (action 1) finds the id taken: the counter's ADD (action 0),
    // which alone would have passed, is not applied either.
    let again = world.send(&app, reserve("r-1", 2, None)).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert_eq!(again.body["type"], "/problems/reservation-exists");
    let txn = transaction_of(&again);
    assert_eq!(again.body["transaction_id"], txn.as_str());
    assert_eq!(world.stock().await.reserved, 2, "the counter did not move");
    assert_eq!(
        world.outbox.outbox().status(txn.parse().unwrap()).await.unwrap(),
        TxnStatus::Tombstoned,
        "no outbox record: the request path settled it with its tombstone"
    );

    // A stale read lets the handler decide on stock that is gone: the counter's bound
    // (action 0) refuses it.
    let stale = world.app(Arc::new(Stale(world.catalog.clone())));
    let raced = world.send(&stale, reserve("r-2", 9, None)).await;
    assert_eq!(raced.status, StatusCode::CONFLICT, "{}", raced.body);
    assert_eq!(raced.body["type"], "/problems/out-of-stock");
    assert_eq!(world.stock().await.reserved, 2);
    assert!(!world.catalog.reservation_exists("r-2", SKU).await.unwrap());

    world.backend.settle(timing()).await;
    assert_eq!(
        world.backend.drain(&events()).await.len(),
        1,
        "only the first reservation's event"
    );
}

/// The shop's own refusals, decided by its read of the product (more units than are
/// available, a product that does not exist), cost that read alone: counted on the wire,
/// one `GetItem` each and nothing else (no `SendMessage`, no tombstone `PutItem`), and
/// the answers name no transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_decided_by_the_read_sends_nothing_and_writes_nothing() {
    let world = world().await;
    let app = world.app(Arc::new(world.catalog.clone()));
    let wire = world.backend.wire.as_ref().expect("counted");
    wire.reset();
    let out_of_stock = world.send(&app, reserve("r-1", 11, None)).await;
    assert_eq!(out_of_stock.status, StatusCode::CONFLICT, "{}", out_of_stock.body);
    assert_eq!(out_of_stock.body["type"], "/problems/out-of-stock");
    let missing = Request::builder()
        .method(Method::POST)
        .uri("/products/SKU-9/reservations")
        .header("content-type", "application/json")
        .body(Body::from(json!({"reservation_id": "r-2", "quantity": 1}).to_string()))
        .unwrap();
    let missing = world.send(&app, missing).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert_eq!(
        wire.counts(),
        [("GetItem".to_owned(), 2)].into(),
        "the two reads of the product, and nothing else"
    );
    for reply in [&out_of_stock, &missing] {
        assert!(!reply.headers.contains_key("x-transaction-id"), "{:?}", reply.headers);
        assert_eq!(reply.body["transaction_id"], Value::Null);
    }
    assert_eq!(world.stock().await.reserved, 0);
}

/// Reads every product as if nothing were reserved.
struct Stale(DynamoCatalog);

#[async_trait]
impl Catalog for Stale {
    async fn product(&self, sku: &str) -> Result<Option<Product>, CatalogError> {
        Ok(self
            .0
            .product(sku)
            .await?
            .map(|product| Product { reserved: 0, ..product }))
    }
}

/// The control queue, but each send is followed, before it returns, by a control worker
/// whose clock is past the commit window handling the message: it tombstones the
/// transaction between its control message (which goes out with the commit) and its
/// commit.
struct TombstoneOnSend {
    inner: Arc<dyn ControlQueue>,
    backend_inbox: Arc<dyn outbox::ports::ControlInbox>,
    late_worker: ControlPath,
}

#[async_trait]
impl ControlQueue for TombstoneOnSend {
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        self.inner.send(message, delay).await?;
        let report = poll_once(self.backend_inbox.as_ref(), &self.late_worker, Duration::from_secs(2))
            .await
            .expect("poll");
        let outcomes: Vec<&str> = report
            .items
            .iter()
            .map(|item| item.result.as_ref().map_or("failed", |outcome| outcome.as_str()))
            .collect();
        assert_eq!(outcomes, ["tombstoned"], "the worker tombstoned the transaction");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_comes_after_its_tombstone_is_refused_and_writes_nothing() {
    let world = world().await;
    let later = Arc::new(ManualClock::new(
        world.backend.clock.now().plus(Duration::from_secs(3600)),
    ));
    let late_worker = ControlPath::new(
        ControlPorts {
            store: world.backend.store.clone(),
            control_queue: world.backend.control_queue.clone(),
            publisher: world.backend.publisher.clone(),
            clock: later,
        },
        timing(),
    );
    let ports = RequestPorts {
        store: world.backend.store.clone(),
        control_queue: Arc::new(TombstoneOnSend {
            inner: world.backend.control_queue.clone(),
            backend_inbox: world.backend.inbox.clone(),
            late_worker,
        }),
        clock: world.backend.clock.clone(),
        ids: Arc::new(RandomIds),
    };
    let outbox = Outbox::new(ports, timing(), TransactionLimits::default());
    let app = router(
        Shop {
            outbox: NativeOutbox::new(outbox).expect("the DynamoDB store"),
            catalog: Arc::new(world.catalog.clone()),
            writes: world.catalog.clone(),
            events: events(),
        },
        Duration::from_secs(10),
    );
    let reply = world.send(&app, reserve("r-late", 1, None)).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    assert_eq!(reply.body["type"], "/problems/commit-window-expired");
    let txn = transaction_of(&reply);
    assert_eq!(
        world.outbox.outbox().status(txn.parse().unwrap()).await.unwrap(),
        TxnStatus::Tombstoned
    );
    assert_eq!(world.stock().await.reserved, 0);
    assert!(!world.catalog.reservation_exists("r-late", SKU).await.unwrap());
    world.backend.settle(timing()).await;
    assert!(world.backend.drain(&events()).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_with_its_idempotency_key_is_replayed_and_reserves_once() {
    let world = world().await;
    let app = world.app(Arc::new(world.catalog.clone()));
    let first = world.send(&app, reserve("r-1", 4, Some("key-1"))).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = world.send(&app, reserve("r-1", 4, Some("key-1"))).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body);
    assert_eq!(transaction_of(&again), transaction_of(&first));
    let other = world.send(&app, reserve("r-2", 1, Some("key-1"))).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.body["type"], "/problems/idempotency-key-reused");
    assert_eq!(world.stock().await.reserved, 4, "reserved once");
    world.backend.settle(timing()).await;
    assert_eq!(world.backend.drain(&events()).await.len(), 1);
}
