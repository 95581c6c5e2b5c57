//! The worked message handler: the shipping service behind the orders API. It keeps one
//! shipment per order (`SHIPMENT#{order}`): `OrderPlaced` creates it with the order's
//! lines and emits `ShipmentRequested` to its `shipments` destination, `ItemAdded` and
//! `ItemRemoved` change its lines, and `OrderCancelled` cancels it and emits
//! `ShipmentCancelled`. The handler only reads and stages: dedup, commit, publishing and
//! acknowledgement are the library's ([`outbox::consumer`]), so a copy of an event,
//! however it arrives, ships nothing twice.
//!
//! It applies each order's events in the order the order committed them
//! ([`Handler::in_order`]): an `ItemAdded` that overtook its `OrderPlaced` in the queue
//! waits for it, and a line added after a cancellation never revives the shipment. So
//! the shipment ends as the order did, whatever the order of delivery.

use outbox::prelude::*;
use serde_json::Map;
use uuid::Uuid;

/// The destination of `ShipmentRequested` and `ShipmentCancelled`.
pub const SHIPMENTS: &str = "shipments";

/// The handler.
pub struct Shipping;

fn shipment_key(order_id: &str) -> Result<ItemKey, HandlerError> {
    Ok(format!("SHIPMENT#{order_id}").parse()?)
}

/// The shipping service's events' source on an EventBridge bus.
const SOURCE: &str = "com.example.shipping";

#[async_trait]
impl Handler for Shipping {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let event: Value = message.json()?;
        let Some(order_id) = event["order_id"].as_str() else {
            return Ok(());
        };
        let key = shipment_key(order_id)?;
        let shipment = staging.get(&key).await?;
        match (event["type"].as_str(), shipment) {
            // An order is shipped once even if two different events placed it; a copy of
            // one event never gets this far (the library acknowledges it).
            (Some("OrderPlaced"), None) => {
                let lines: Map<String, Value> = event["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|item| Some((item["sku"].as_str()?.to_owned(), item["quantity"].clone())))
                    .collect();
                // A new id on every run: only the committed run's may ever be seen outside.
                let shipment_id = Uuid::now_v7();
                let items = lines.len();
                let data = json!({"order_id": order_id, "shipment_id": shipment_id, "lines": lines, "status": "requested", "placed_by": message.id.as_str()});
                staging.put(key, data, ExpectedVersion::Absent);
                let requested = json!({"type": "ShipmentRequested", "order_id": order_id, "shipment_id": shipment_id, "items": items});
                staging.emit(Message::event(SHIPMENTS, SOURCE, &requested)?);
                Ok(())
            }
            (Some(kind @ ("ItemAdded" | "ItemRemoved" | "OrderCancelled")), Some(shipment)) => {
                let mut data = shipment.data.clone();
                if data["status"] == "cancelled" {
                    return Ok(());
                }
                let sku = event["sku"].as_str().unwrap_or_default().to_owned();
                match kind {
                    "ItemAdded" => {
                        data["lines"][sku] = event["quantity"].clone();
                    }
                    "ItemRemoved" => {
                        if let Some(lines) = data["lines"].as_object_mut() {
                            lines.remove(&sku);
                        }
                    }
                    _ => {
                        data["status"] = json!("cancelled");
                        let cancelled = json!({"type": "ShipmentCancelled", "order_id": order_id, "shipment_id": data["shipment_id"]});
                        staging.emit(Message::event(SHIPMENTS, SOURCE, &cancelled)?);
                    }
                }
                staging.put(key, data, ExpectedVersion::Exactly(shipment.version));
                Ok(())
            }
            // Another event, or one about an order this service never saw placed (its
            // events carry no place in the order's history: an older producer).
            _ => Ok(()),
        }
    }

    /// Each order's events in the order the order committed them.
    fn in_order(&self) -> bool {
        true
    }

    /// Every event of an order is about that order's shipment: the one item this handler
    /// may write (entity mode), which also keeps the place of the order's last event it
    /// applied.
    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let event: Value = message.json()?;
        Ok(match event["order_id"].as_str() {
            Some(order_id) => Some(shipment_key(order_id)?),
            None => None,
        })
    }
}
