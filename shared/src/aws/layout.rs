//! How the protocol's records are keyed in DynamoDB's terms: keys, whole items and
//! expression names under a [`TableLayout`] (the layout itself is a setting:
//! [`crate::settings::TableLayout`]).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::settings::{SortKeyValue, TableLayout};

impl TableLayout {
    /// The key of the record whose logical key is `logical`.
    pub(crate) fn key(&self, logical: &str) -> HashMap<String, AttributeValue> {
        let mut key = HashMap::from([(self.partition_key.clone(), AttributeValue::S(logical.to_owned()))]);
        if let Some(sort_key) = &self.sort_key {
            let value = match &sort_key.value {
                SortKeyValue::SameAsPartitionKey => logical.to_owned(),
                SortKeyValue::Constant(value) => value.clone(),
            };
            key.insert(sort_key.attribute.clone(), AttributeValue::S(value));
        }
        key
    }

    /// A whole item: `attributes` under the key of `logical`.
    pub(crate) fn item(
        &self,
        logical: &str,
        attributes: impl IntoIterator<Item = (String, AttributeValue)>,
    ) -> HashMap<String, AttributeValue> {
        let mut item = self.key(logical);
        item.extend(attributes);
        item
    }

    /// The logical key of an item read from the table.
    pub(crate) fn logical_key<'a>(&self, item: &'a HashMap<String, AttributeValue>) -> Option<&'a str> {
        item.get(&self.partition_key)
            .and_then(|value| value.as_s().ok())
            .map(String::as_str)
    }

    /// `attribute_not_exists` on the partition key, with the placeholder `#pk` that
    /// [`Self::key_names`] defines.
    pub(crate) const NOT_EXISTS: &'static str = "attribute_not_exists(#pk)";

    /// The expression attribute names that [`Self::NOT_EXISTS`] and `#ttl` refer to.
    pub(crate) fn key_names(&self) -> HashMap<String, String> {
        HashMap::from([("#pk".to_owned(), self.partition_key.clone())])
    }

    /// [`Self::key_names`] plus `#ttl` for the TTL attribute.
    pub(crate) fn key_and_ttl_names(&self) -> HashMap<String, String> {
        let mut names = self.key_names();
        names.insert("#ttl".to_owned(), self.ttl_attribute.clone());
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_layout() {
        let dedicated = TableLayout::dedicated("t");
        assert_eq!(
            dedicated.key("TXN#1"),
            HashMap::from([("pk".to_owned(), AttributeValue::S("TXN#1".into()))])
        );
        let same = TableLayout::dedicated("t")
            .with_partition_key("PK")
            .with_sort_key("SK", SortKeyValue::SameAsPartitionKey);
        assert_eq!(same.key("TXN#1")["SK"], AttributeValue::S("TXN#1".into()));
        let constant = same
            .clone()
            .with_sort_key("SK", SortKeyValue::Constant("OUTBOX".into()));
        let item = constant.item("TXN#1", [("state".to_owned(), AttributeValue::S("pending".into()))]);
        assert_eq!(item["SK"], AttributeValue::S("OUTBOX".into()));
        assert_eq!(constant.logical_key(&item), Some("TXN#1"));
    }
}
