//! The worked consumer of a consumer: the billing service behind shipping. It reads the
//! shipping service's `shipments` messages and keeps one invoice per order's shipment
//! (`INVOICE#{order}`): `ShipmentRequested` opens it (status `open`, with the shipment's
//! item count) and `ShipmentCancelled` voids it (status `void`). The handler only reads
//! and stages: dedup, commit and acknowledgement are the library's
//! ([`outbox::consumer`]), so a copy of a message, however it arrives, bills nothing
//! twice.
//!
//! It applies each shipment's messages in the order shipping committed them
//! ([`Handler::in_order`]): a `ShipmentCancelled` that overtook its `ShipmentRequested`
//! in the queue waits for it, so an invoice ends as its shipment did, whatever the order
//! of delivery. The invoice lists the place (`seq`) of every message of the shipment's
//! history it applied, in the order applied (`applied`): 1, 2, ... once each, which is
//! what the end-to-end check reads.

use outbox::prelude::*;

/// The handler.
pub struct Billing;

/// The key of the invoice of order `order_id`'s shipment.
pub fn invoice_key(order_id: &str) -> Result<ItemKey, HandlerError> {
    Ok(format!("INVOICE#{order_id}").parse()?)
}

#[async_trait]
impl Handler for Billing {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let event: Value = message.json()?;
        let Some(order_id) = event["order_id"].as_str() else {
            return Ok(());
        };
        // Its place in the shipment's history (none from a producer that stamps none).
        let seq = message.position()?.map(|position| position.seq);
        let key = invoice_key(order_id)?;
        let invoice = staging.get(&key).await?;
        match (event["type"].as_str(), invoice) {
            (Some("ShipmentRequested"), None) => {
                let data = json!({
                    "order_id": order_id,
                    "shipment_id": event["shipment_id"],
                    "items": event["items"],
                    "status": "open",
                    "applied": seq.into_iter().collect::<Vec<u64>>(),
                });
                staging.put(key, data, ExpectedVersion::Absent);
                Ok(())
            }
            (Some(kind @ ("ShipmentRequested" | "ShipmentCancelled")), Some(invoice)) => {
                let mut data = invoice.data.clone();
                if kind == "ShipmentCancelled" {
                    data["status"] = json!("void");
                }
                if let (Some(seq), Some(applied)) = (seq, data["applied"].as_array_mut()) {
                    applied.push(json!(seq));
                }
                staging.put(key, data, ExpectedVersion::Exactly(invoice.version));
                Ok(())
            }
            // Another message, or a cancellation of a shipment this service never saw
            // requested (from a producer whose messages carry no place in the history).
            _ => Ok(()),
        }
    }

    /// Each shipment's messages in the order shipping committed them.
    fn in_order(&self) -> bool {
        true
    }

    /// Every message of a shipment is about its invoice: the one item this handler may
    /// write (entity mode), which also keeps the place of the shipment's last message it
    /// applied.
    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let event: Value = message.json()?;
        Ok(match event["order_id"].as_str() {
            Some(order_id) => Some(invoice_key(order_id)?),
            None => None,
        })
    }
}
