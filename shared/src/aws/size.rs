//! How many bytes an item or a transaction action takes, by DynamoDB's rules for item
//! size (attribute names plus values; numbers about one byte per two digits), so that a
//! commit whose request is over the 4 MB transaction limit is refused before it is sent.
//!
//! An estimate of what the request carries: a `Put`'s item, an action's key, expressions,
//! names and values. What an `Update`, `Delete` or `ConditionCheck` touches beyond that
//! (the stored item) is DynamoDB's to count; a transaction it finds too large is refused
//! as invalid, with nothing written.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

/// The size of one attribute value.
pub fn value_bytes(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(number) => number.len().div_ceil(2) + 1,
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(texts) => texts.iter().map(String::len).sum(),
        AttributeValue::Ns(numbers) => numbers.iter().map(|number| number.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(blobs) => blobs.iter().map(|blob| blob.as_ref().len()).sum(),
        AttributeValue::L(values) => 3 + values.iter().map(|value| 1 + value_bytes(value)).sum::<usize>(),
        AttributeValue::M(fields) => 3 + item_bytes(fields) + fields.len(),
        // A type this SDK does not know yet: count it generously.
        _ => 1024,
    }
}

/// The size of an item: every attribute's name and value.
pub fn item_bytes(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(name, value)| name.len() + value_bytes(value)).sum()
}

fn names_bytes(names: Option<&HashMap<String, String>>) -> usize {
    names.map_or(0, |names| names.iter().map(|(k, v)| k.len() + v.len()).sum())
}

fn values_bytes(values: Option<&HashMap<String, AttributeValue>>) -> usize {
    values.map_or(0, item_bytes)
}

fn text_bytes(text: Option<&str>) -> usize {
    text.map_or(0, str::len)
}

/// The size of one action of a `TransactWriteItems`: its item or key, its expressions,
/// their names and values, and its table's name.
pub fn action_bytes(action: &TransactWriteItem) -> usize {
    if let Some(put) = action.put() {
        return put.table_name().len()
            + item_bytes(put.item())
            + text_bytes(put.condition_expression())
            + names_bytes(put.expression_attribute_names())
            + values_bytes(put.expression_attribute_values());
    }
    if let Some(update) = action.update() {
        return update.table_name().len()
            + item_bytes(update.key())
            + update.update_expression().len()
            + text_bytes(update.condition_expression())
            + names_bytes(update.expression_attribute_names())
            + values_bytes(update.expression_attribute_values());
    }
    if let Some(delete) = action.delete() {
        return delete.table_name().len()
            + item_bytes(delete.key())
            + text_bytes(delete.condition_expression())
            + names_bytes(delete.expression_attribute_names())
            + values_bytes(delete.expression_attribute_values());
    }
    if let Some(check) = action.condition_check() {
        return check.table_name().len()
            + item_bytes(check.key())
            + check.condition_expression().len()
            + names_bytes(check.expression_attribute_names())
            + values_bytes(check.expression_attribute_values());
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::{Put, Update};

    #[test]
    fn sizes_count_names_and_values() {
        let item = HashMap::from([
            ("pk".to_owned(), AttributeValue::S("ORDER#1".into())),
            ("n".to_owned(), AttributeValue::N("12345".into())),
            (
                "m".to_owned(),
                AttributeValue::M(HashMap::from([("a".to_owned(), AttributeValue::Bool(true))])),
            ),
        ]);
        assert_eq!(item_bytes(&item), (2 + 7) + (1 + 4) + (1 + 3 + 2 + 1));
        let put = TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name("t")
                    .set_item(Some(item.clone()))
                    .build()
                    .unwrap(),
            )
            .build();
        assert_eq!(action_bytes(&put), 1 + item_bytes(&item));
        let update = TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name("t")
                    .key("pk", AttributeValue::S("x".into()))
                    .update_expression("ADD c :one")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .build()
                    .unwrap(),
            )
            .build();
        assert_eq!(action_bytes(&update), 1 + 3 + 10 + (4 + 2));
    }
}
