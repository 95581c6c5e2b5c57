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

use async_trait::async_trait;
use outbox::consumer::{Handler, HandlerError, Incoming, Staging};
use outbox::ports::{ExpectedVersion, ItemKey};
use serde_json::{json, Value};

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

#[cfg(test)]
mod tests {
    //! The handler on the embedded backend, its messages delivered as a queue may: the
    //! cancellation before the request, and every message twice.

    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery};
    use outbox::embedded::{EmbeddedBackend, ManualClock};
    use outbox::ports::{RandomIds, Store};
    use outbox::protocol::{ENTITY_ATTRIBUTE, MESSAGE_ID_ATTRIBUTE, POSITION_ATTRIBUTE};
    use outbox::time::Timestamp;
    use serde_json::json;

    use super::*;

    /// Message `seq` of order `order`'s shipment, as shipping sends it: its place in the
    /// shipment's history on the `shipments` chain, the shipment changed once per message.
    fn delivery(order: &str, seq: u64, body: Value) -> Delivery {
        let attributes = BTreeMap::from([
            (ENTITY_ATTRIBUTE.to_owned(), format!("SHIPMENT#{order}")),
            (
                POSITION_ATTRIBUTE.to_owned(),
                format!("chain=shipments;seq={seq};version={};after={seq}", seq + 1),
            ),
            (MESSAGE_ID_ATTRIBUTE.to_owned(), format!("txn-{order}-{seq}:0")),
        ]);
        Delivery {
            message_id: format!("q-{order}-{seq}"),
            receipt: String::new(),
            body: body.to_string(),
            attributes,
            group_id: None,
            receive_count: 1,
            trace_header: None,
        }
    }

    async fn invoice(backend: &EmbeddedBackend, order: &str) -> Value {
        let key = invoice_key(order).unwrap();
        let items = backend.store.get_items(std::slice::from_ref(&key)).await.unwrap();
        items[&key].data.clone()
    }

    #[tokio::test]
    async fn each_invoice_applies_its_shipments_messages_once_in_order() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), []);
        let consumer = Consumer::new(
            "billing".parse().unwrap(),
            ConsumerPorts {
                store: backend.store.clone(),
                publisher: backend.publisher.clone(),
                clock,
                ids: Arc::new(RandomIds),
            },
            Arc::new(Billing),
            Duration::from_secs(3600),
        );
        let requested = |order: &str| {
            delivery(
                order,
                1,
                json!({"type": "ShipmentRequested", "order_id": order, "shipment_id": "s-1", "items": 2}),
            )
        };
        let cancelled = |order: &str| {
            delivery(
                order,
                2,
                json!({"type": "ShipmentCancelled", "order_id": order, "shipment_id": "s-1"}),
            )
        };
        let outcome = |delivery: Delivery| {
            let consumer = &consumer;
            async move {
                let report = consumer.consume_batch(&[delivery]).await;
                *report.items[0].result.as_ref().expect("consumed")
            }
        };

        // The cancellation overtook the request: kept, then applied right after it.
        assert!(matches!(
            outcome(cancelled("o-1")).await,
            ConsumeOutcome::Kept { applied: 0, seq: 2 }
        ));
        assert!(matches!(
            outcome(requested("o-1")).await,
            ConsumeOutcome::Processed { .. }
        ));
        assert_eq!(outcome(requested("o-1")).await, ConsumeOutcome::Duplicate);
        assert_eq!(outcome(cancelled("o-1")).await, ConsumeOutcome::Duplicate);
        assert_eq!(
            invoice(&backend, "o-1").await,
            json!({"order_id": "o-1", "shipment_id": "s-1", "items": 2, "status": "void", "applied": [1, 2]})
        );

        // A shipment never cancelled: its invoice stays open.
        assert!(matches!(
            outcome(requested("o-2")).await,
            ConsumeOutcome::Processed { .. }
        ));
        assert_eq!(outcome(requested("o-2")).await, ConsumeOutcome::Duplicate);
        let open = invoice(&backend, "o-2").await;
        assert_eq!(
            (open["status"].clone(), open["applied"].clone()),
            (json!("open"), json!([1]))
        );
    }
}
