//! The billing example, a consumer of the shipping service's `shipments`, run on the
//! test harness (`outbox::testing`): its messages delivered as a queue may, the
//! cancellation before the request it cancels and every message twice.

use outbox::testing::{TestService, Upstream};
use serde_json::json;

/// Message `seq` of order `order`'s shipment, as shipping's outbox sends it.
fn shipment(order: &str, seq: u64, kind: &str) -> Upstream {
    let body = json!({"type": kind, "order_id": order, "shipment_id": "s-1", "items": 2});
    Upstream::json("shipments", &body).at("shipping", &format!("SHIPMENT#{order}"), seq)
}

/// Each invoice applies its shipment's messages once each, in the shipment's order: a
/// cancellation that overtook its request is kept, then applied right after it; copies
/// change nothing. A shipment never cancelled leaves its invoice open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invoice_applies_its_shipments_messages_once_in_order() {
    let service = outbox::testing::service()
        .consumer("billing", "shipments", billing::Billing)
        .expect("a valid consumer");
    let service = TestService::start(service, axum::Router::new()).await;
    let (requested, cancelled) = (
        shipment("o-1", 1, "ShipmentRequested"),
        shipment("o-1", 2, "ShipmentCancelled"),
    );

    // The cancellation overtook the request: kept, nothing applied.
    service.deliver(&cancelled);
    service.drain().await;
    assert_eq!(
        service.item("INVOICE#o-1").await,
        None,
        "the cancellation waits for its request"
    );
    // The request, then both again.
    for message in [&requested, &requested, &cancelled] {
        service.deliver(message);
    }
    service.drain().await;
    assert_eq!(
        service.item("INVOICE#o-1").await,
        Some(json!({"order_id": "o-1", "shipment_id": "s-1", "items": 2, "status": "void", "applied": [1, 2]}))
    );

    // A shipment never cancelled, its request delivered twice: open, applied once.
    let open = shipment("o-2", 1, "ShipmentRequested");
    service.deliver(&open);
    service.deliver(&open);
    service.drain().await;
    let invoice = service.item("INVOICE#o-2").await.expect("the invoice");
    assert_eq!((&invoice["status"], &invoice["applied"]), (&json!("open"), &json!([1])));
    service.stop().await;
}
