//! The shipping example, an in-order consumer of the orders API's `events` that publishes
//! to `shipments`, run on the test harness (`outbox::testing`): an order's events
//! delivered out of order and twice.

use outbox::testing::{TestService, Upstream};
use serde_json::{json, Value};

/// Event `seq` of order `order`, as the orders API's outbox sends it.
fn order_event(order: &str, seq: u64, body: Value) -> Upstream {
    let mut body = body;
    body["order_id"] = json!(order);
    Upstream::json("events", &body).at("orders", &format!("ORDER#{order}"), seq)
}

/// An order's events applied in the order's order whatever the queue's: a line added
/// before the order was placed waits for it, a cancellation is applied after both, and
/// copies change nothing. The shipment ends cancelled with the added line, and shipping
/// published one `ShipmentRequested` and one `ShipmentCancelled`, in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_events_make_one_shipment_in_the_orders_order_whatever_the_queues() {
    let service = outbox::testing::service_publishing_to(&[shipping::SHIPMENTS])
        .consumer("shipping", "events", shipping::Shipping)
        .expect("a valid consumer");
    let service = TestService::start(service, axum::Router::new()).await;
    let placed = order_event(
        "o-1",
        1,
        json!({"type": "OrderPlaced", "items": [{"sku": "SKU-1", "quantity": 1}]}),
    );
    let added = order_event("o-1", 2, json!({"type": "ItemAdded", "sku": "SKU-2", "quantity": 3}));
    let cancelled = order_event("o-1", 3, json!({"type": "OrderCancelled"}));

    service.deliver(&added);
    service.drain().await;
    assert_eq!(service.item("SHIPMENT#o-1").await, None, "the line waits for its order");
    for message in [&cancelled, &placed, &added, &placed, &cancelled] {
        service.deliver(message);
    }
    service.drain().await;

    let shipment = service.item("SHIPMENT#o-1").await.expect("the shipment");
    assert_eq!(shipment["status"], "cancelled", "{shipment}");
    assert_eq!(shipment["lines"], json!({"SKU-1": 1, "SKU-2": 3}), "{shipment}");
    let kinds: Vec<Value> = service
        .sent("shipments")
        .iter()
        .map(|message| message["type"].clone())
        .collect();
    assert_eq!(kinds, [json!("ShipmentRequested"), json!("ShipmentCancelled")]);
    service.stop().await;
}
