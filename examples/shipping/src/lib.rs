//! The worked message handler: the shipping service behind the orders API. For each
//! `OrderPlaced` it records one shipment (`SHIPMENT#{order}`) and emits
//! `ShipmentRequested` to its `shipments` destination; every other event of the orders
//! API is acknowledged with nothing to do. The handler only reads and stages: dedup,
//! commit, publishing and acknowledgement are the library's
//! ([`outbox::consumer`]), so a copy of an event, however it arrives, ships nothing twice.
//!
//! Its change is one item, the order's shipment, so it runs in entity mode
//! ([`Handler::entity`]): the shipment carries its outbox entry and is written with one
//! conditional write, no transaction (docs/PROTOCOL.md section 11).

use async_trait::async_trait;
use outbox::consumer::{Handler, HandlerError, Incoming, Staging};
use outbox::ports::{ExpectedVersion, ItemKey};
use outbox::protocol::{DestinationName, Message};
use serde_json::{json, Value};
use uuid::Uuid;

/// The destination of `ShipmentRequested`.
pub const SHIPMENTS: &str = "shipments";

/// The handler.
pub struct Shipping;

#[async_trait]
impl Handler for Shipping {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let event: Value = message.json()?;
        if event["type"] != "OrderPlaced" {
            return Ok(());
        }
        let order_id = event["order_id"].as_str().ok_or("OrderPlaced without an order_id")?;
        let key: ItemKey = format!("SHIPMENT#{order_id}").parse()?;
        // An order is shipped once even if two different events placed it; a copy of one
        // event never gets this far (the library acknowledges it).
        if staging.get(&key).await?.is_some() {
            return Ok(());
        }
        let items = event["items"].as_array().map_or(0, Vec::len);
        // A new id on every run: only the committed run's may ever be seen outside.
        let shipment_id = Uuid::now_v7();
        staging.put(
            key,
            json!({"order_id": order_id, "shipment_id": shipment_id, "items": items, "status": "requested", "placed_by": message.id.as_str()}),
            ExpectedVersion::Absent,
        );
        let destination: DestinationName = SHIPMENTS.parse()?;
        let requested =
            json!({"type": "ShipmentRequested", "order_id": order_id, "shipment_id": shipment_id, "items": items});
        staging.emit(Message::json(destination, &requested)?.with_event("com.example.shipping", "ShipmentRequested"));
        Ok(())
    }

    /// Every event of an order is about that order's shipment: the one item this handler
    /// may write.
    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let event: Value = message.json()?;
        Ok(match event["order_id"].as_str() {
            Some(order_id) => Some(format!("SHIPMENT#{order_id}").parse()?),
            None => None,
        })
    }
}
