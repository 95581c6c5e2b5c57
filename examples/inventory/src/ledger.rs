//! The ledger: for each `StockReserved`, adds its units to the product's tally
//! (`TALLY#{product}`). The handler only reads and stages; the library commits each
//! message's effect once, however often the message arrives.

use outbox::prelude::*;

/// The consumer.
pub struct Ledger;

#[async_trait]
impl Handler for Ledger {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let Some(key) = self.entity(message)? else {
            return Ok(());
        };
        let event: Value = message.json()?;
        let quantity = event["quantity"].as_u64().ok_or("StockReserved without quantity")?;
        let tally = staging.get(&key).await?;
        let reserved = tally
            .as_ref()
            .map_or(0, |tally| tally.data["reserved"].as_u64().unwrap_or(0));
        let data = json!({"product_id": event["product_id"], "reserved": reserved + quantity});
        staging.put(key, data, ExpectedVersion::of(tally.as_ref()));
        Ok(())
    }

    /// The tally a `StockReserved` adds to (`TALLY#{product}`), the one item it changes
    /// (entity mode); no other event changes anything.
    fn entity(&self, message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        let event: Value = message.json()?;
        match event["product_id"].as_str() {
            Some(product_id) if event["type"] == "StockReserved" => Ok(Some(format!("TALLY#{product_id}").parse()?)),
            _ => Ok(None),
        }
    }
}
