//! End to end on the emulator: an order created through the API's router on the AWS
//! adapters, the control worker run, and `OrderPlaced` on the events queue with its
//! stable message id.

use std::sync::Arc;
use std::time::Duration;

use api::app::{router, HttpConfig};
use api::state::AppState;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use outbox::control::poller::poll_once;
use outbox::control::ControlOutcome;
use outbox::settings::Timing;
use outbox_tests::conformance::Backend;
use serde_json::{json, Value};
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_created_through_the_api_reaches_the_events_queue_with_its_stable_id() {
    let backend = Backend::aws().await;
    let timing = Timing::default();
    let outbox = backend.outbox(timing);
    let app = router(
        AppState {
            outbox: Arc::new(outbox),
            events: "events".parse().unwrap(),
        },
        &HttpConfig::default(),
    );
    let body = json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1299}]});
    let request = Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let txn = response.headers()["x-transaction-id"].to_str().unwrap().to_owned();
    let order: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();

    let control = backend.control(timing);
    backend.wait(timing.first_check_delay).await;
    let report = poll_once(backend.inbox.as_ref(), &control, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(
            report.items[0].result,
            Ok(ControlOutcome::Dispatched { messages: 1, .. })
        ),
        "{report:?}"
    );

    let delivered = backend.drain(&"events".parse().unwrap()).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].message_id.as_deref(), Some(format!("{txn}:0").as_str()));
    assert_eq!(delivered[0].txn_id.as_deref(), Some(txn.as_str()));
    let event: Value = serde_json::from_str(&delivered[0].body).unwrap();
    assert_eq!(
        (event["type"].clone(), event["order_id"].clone()),
        (json!("OrderPlaced"), order["id"].clone())
    );
}
