//! The ledger: for each `StockReserved`, adds its units to the product's tally
//! (`TALLY#{product}`). The handler only reads and stages; the library commits each
//! message's effect once, however often the message arrives.

use async_trait::async_trait;
use outbox::consumer::{Handler, HandlerError, Incoming, Staging};
use outbox::ports::{ExpectedVersion, ItemKey};
use serde_json::{json, Value};

/// The consumer.
pub struct Ledger;

/// The tally of product `id`.
pub fn tally_key(product_id: &str) -> Result<ItemKey, HandlerError> {
    Ok(format!("TALLY#{product_id}").parse()?)
}

#[async_trait]
impl Handler for Ledger {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let event: Value = message.json()?;
        if event["type"] != "StockReserved" {
            return Ok(());
        }
        let product_id = event["product_id"].as_str().ok_or("StockReserved without product_id")?;
        let quantity = event["quantity"].as_u64().ok_or("StockReserved without quantity")?;
        let key = tally_key(product_id)?;
        let (reserved, expected) = match staging.get(&key).await? {
            Some(item) => (
                item.data["reserved"].as_u64().unwrap_or(0),
                ExpectedVersion::Exactly(item.version),
            ),
            None => (0, ExpectedVersion::Absent),
        };
        staging.put(
            key,
            json!({"product_id": product_id, "reserved": reserved + quantity}),
            expected,
        );
        Ok(())
    }

    /// One item changes per message: entity mode.
    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let event: Value = message.json()?;
        match event["product_id"].as_str() {
            Some(product_id) if event["type"] == "StockReserved" => Ok(Some(tally_key(product_id)?)),
            _ => Ok(None),
        }
    }
}
