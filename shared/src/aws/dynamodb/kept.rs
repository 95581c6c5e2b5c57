//! The messages an in-order consumer keeps until their predecessors are applied
//! ([`crate::ports::KeptMessage`]): one item each, under its own key, put whole, read
//! strongly consistent, deleted once applied, and expiring through the table's TTL.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{unavailable, DynamoStore};
use crate::aws::item::{n, s, ttl_seconds, Item, Reader};
use crate::ports::{Delivery, KeptMessage, StoreError};
use crate::time::Timestamp;

/// The item of a kept message: the delivery's parts, when it was kept, and its TTL.
fn kept_item(store: &DynamoStore, kept: &KeptMessage) -> Item {
    let delivery = &kept.delivery;
    let attributes: HashMap<String, AttributeValue> = delivery
        .attributes
        .iter()
        .map(|(name, value)| (name.clone(), s(value.clone())))
        .collect();
    let mut parts = vec![
        ("kept_message_id".to_owned(), s(delivery.message_id.clone())),
        ("body".to_owned(), s(delivery.body.clone())),
        ("attributes".to_owned(), AttributeValue::M(attributes)),
        ("kept_at".to_owned(), n(kept.kept_at.as_millis())),
        (store.layout.ttl_attribute.clone(), n(ttl_seconds(kept.expires_at))),
    ];
    if let Some(group) = &delivery.group_id {
        parts.push(("group_id".to_owned(), s(group.clone())));
    }
    if let Some(trace) = &delivery.trace_header {
        parts.push(("trace_header".to_owned(), s(trace.clone())));
    }
    store.layout.item(&kept.key, parts)
}

/// A kept message from its item.
fn kept_from_item(store: &DynamoStore, key: &str, item: &Item) -> Result<KeptMessage, StoreError> {
    let reader = Reader::new(&store.layout, item);
    let text = |name: &str| item.get(name).and_then(|value| value.as_s().ok()).cloned();
    let corrupt = |what: &str| reader.corrupt(format!("a kept message without {what}"));
    let attributes = match item.get("attributes") {
        Some(AttributeValue::M(map)) => map
            .iter()
            .map(|(name, value)| {
                value
                    .as_s()
                    .map(|value| (name.clone(), value.clone()))
                    .map_err(|_| corrupt("string attributes"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(corrupt("its attributes")),
    };
    let kept_at = item
        .get("kept_at")
        .and_then(|value| value.as_n().ok())
        .and_then(|value| value.parse().ok())
        .map(Timestamp::from_millis)
        .ok_or_else(|| corrupt("the time it was kept"))?;
    Ok(KeptMessage {
        key: key.to_owned(),
        delivery: Delivery {
            message_id: text("kept_message_id").ok_or_else(|| corrupt("its queue id"))?,
            receipt: String::new(),
            body: text("body").ok_or_else(|| corrupt("its body"))?,
            attributes,
            group_id: text("group_id"),
            receive_count: 1,
            trace_header: text("trace_header"),
        },
        kept_at,
        expires_at: reader.expires_at()?.ok_or_else(|| corrupt("its expiry"))?,
    })
}

impl DynamoStore {
    /// One `PutItem` of the kept message, whatever was kept under its key (a copy of it).
    pub(super) async fn put_kept(&self, kept: &KeptMessage) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(Some(kept_item(self, kept)))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// One consistent `GetItem`; an item past its TTL reads as absent.
    pub(super) async fn read_kept(&self, key: &str) -> Result<Option<KeptMessage>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        match output.item() {
            Some(item) if !Reader::new(&self.layout, item).is_expired(self.clock.now())? => {
                kept_from_item(self, key, item).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// One `DeleteItem`.
    pub(super) async fn delete_kept(&self, key: &str) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key)))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
