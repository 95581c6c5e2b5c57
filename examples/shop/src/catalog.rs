//! The shop's own items on its own table, read and written the shop's way: its client,
//! its keys, `ConsistentRead` for what a decision depends on, and a condition on every
//! write for what must still hold when it commits.
//!
//! | item | `PK` | `SK` | attributes |
//! |---|---|---|---|
//! | product | `PRODUCT#{sku}` | `PRODUCT#{sku}` | `stock`, `reserved` (N); `GSI1PK` = `CATEGORY#{category}`, `GSI1SK` = `PRODUCT#{sku}` |
//! | reservation | `RESERVATION#{id}` | `PRODUCT#{sku}` | `quantity` (N); `GSI1PK` = `PRODUCT#{sku}`, `GSI1SK` = `RESERVATION#{id}` |

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;

/// A product's stock as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Product {
    /// Its SKU.
    pub sku: String,
    /// Units in stock.
    pub stock: u64,
    /// Units reserved.
    pub reserved: u64,
}

impl Product {
    /// Units that may still be reserved.
    pub fn available(&self) -> u64 {
        self.stock.saturating_sub(self.reserved)
    }
}

/// A read that failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// DynamoDB could not be read.
    #[error("the catalog could not be read")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A product item lacks its numbers.
    #[error("product {0} is malformed")]
    Corrupt(String),
}

/// The shop's reads.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// A product, strongly consistent.
    async fn product(&self, sku: &str) -> Result<Option<Product>, CatalogError>;
}

/// The catalog on the shop's DynamoDB table.
#[derive(Clone)]
pub struct DynamoCatalog {
    client: Client,
    table: String,
}

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: u64) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// A product's key.
pub fn product_key(sku: &str) -> String {
    format!("PRODUCT#{sku}")
}

/// A reservation's key.
pub fn reservation_key(id: &str) -> String {
    format!("RESERVATION#{id}")
}

impl DynamoCatalog {
    /// The catalog on `table`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// Adds a product with `stock` units, none reserved (or leaves an existing one).
    pub async fn add_product(&self, sku: &str, category: &str, stock: u64) -> Result<(), CatalogError> {
        let key = product_key(sku);
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("PK", s(&key))
            .item("SK", s(&key))
            .item("GSI1PK", s(format!("CATEGORY#{category}")))
            .item("GSI1SK", s(&key))
            .item("stock", n(stock))
            .item("reserved", n(0))
            .condition_expression("attribute_not_exists(PK)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(error) => Err(CatalogError::Unavailable(Box::new(error))),
        }
    }

    /// The update that reserves `quantity` units of `sku`, provided the stock is still
    /// `stock` and no more than `stock - quantity` are reserved when it commits: DynamoDB
    /// conditions have no arithmetic, so the read's arithmetic becomes a bound.
    pub fn reserve_stock(&self, sku: &str, quantity: u64, stock: u64) -> TransactWriteItem {
        let limit = stock.saturating_sub(quantity);
        let key = product_key(sku);
        let update = Update::builder()
            .table_name(&self.table)
            .key("PK", s(&key))
            .key("SK", s(&key))
            .update_expression("ADD reserved :quantity")
            .condition_expression("attribute_exists(PK) AND stock = :stock AND reserved <= :limit")
            .expression_attribute_values(":quantity", n(quantity))
            .expression_attribute_values(":stock", n(stock))
            .expression_attribute_values(":limit", n(limit))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("the update names its table, key and expression");
        TransactWriteItem::builder().update(update).build()
    }

    /// The put of a new reservation `id`; it must not exist yet (its old item comes back
    /// when it does).
    pub fn new_reservation(&self, id: &str, sku: &str, quantity: u64) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.table)
            .item("PK", s(reservation_key(id)))
            .item("SK", s(product_key(sku)))
            .item("GSI1PK", s(product_key(sku)))
            .item("GSI1SK", s(reservation_key(id)))
            .item("quantity", n(quantity))
            .condition_expression("attribute_not_exists(PK)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("the put names its table and item");
        TransactWriteItem::builder().put(put).build()
    }

    /// Whether reservation `id` of `sku` exists (strongly consistent).
    pub async fn reservation_exists(&self, id: &str, sku: &str) -> Result<bool, CatalogError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("PK", s(reservation_key(id)))
            .key("SK", s(product_key(sku)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| CatalogError::Unavailable(Box::new(error)))?;
        Ok(output.item().is_some())
    }
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> Option<u64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

#[async_trait]
impl Catalog for DynamoCatalog {
    async fn product(&self, sku: &str) -> Result<Option<Product>, CatalogError> {
        let key = product_key(sku);
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("PK", s(&key))
            .key("SK", s(&key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| CatalogError::Unavailable(Box::new(error)))?;
        let Some(item) = output.item() else {
            return Ok(None);
        };
        match (number(item, "stock"), number(item, "reserved")) {
            (Some(stock), Some(reserved)) => Ok(Some(Product {
                sku: sku.to_owned(),
                stock,
                reserved,
            })),
            _ => Err(CatalogError::Corrupt(key)),
        }
    }
}
