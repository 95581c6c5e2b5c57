//! The positions in-order consumers keep in their entity's key (entity mode,
//! [`crate::protocol::Applied`]): one top-level attribute per position, `in:<name>`, a map
//! `{"seq": N, "version": N}`. Top-level, as the chain heads are ([`super::chain`]), so
//! that a write sets one with a plain `SET` on any item; always named through expression
//! attribute names.
//!
//! A consumer's commit into its entity sets the position it moves in that write, under
//! the write's condition on the entity's version. A message applied without a change of
//! the entity sets it alone ([`DynamoStore::set_applied`]), where the key is as read and
//! the position below the new one. Nothing removes them: a delete (which vacates the key)
//! and a fence keep them, and a create continues them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::branches::{reached, Branch};
use super::chain::{map_of, whole_number};
use super::entity::{commit_error, condition_failed};
use super::DynamoStore;
use crate::aws::item::{n, Item, Reader};
use crate::ports::{CommitError, ExpectedVersion, ItemKey, StoreError};
use crate::protocol::{Applied, AppliedPositions};
use crate::settings::TableLayout;

/// The prefix of the attributes that hold the positions in-order consumers keep.
pub(crate) const APPLIED_PREFIX: &str = "in:";

/// The attribute that holds position `name`.
pub(super) fn attribute(name: &str) -> String {
    format!("{APPLIED_PREFIX}{name}")
}

/// A position as stored.
pub(super) fn value(applied: Applied) -> AttributeValue {
    let mut fields = HashMap::from([
        ("seq".to_owned(), n(applied.seq)),
        ("version".to_owned(), n(applied.version)),
    ]);
    if let Some(txn) = applied.txn {
        fields.insert("txn".to_owned(), AttributeValue::S(txn.to_string()));
    }
    AttributeValue::M(fields)
}

/// The positions an item keeps, read back (none on most items). An `in:` attribute that
/// cannot be read is the item's corruption.
pub(crate) fn applied_of(layout: &TableLayout, item: &Item) -> Result<AppliedPositions, StoreError> {
    let reader = Reader::new(layout, item);
    item.iter()
        .filter_map(|(attribute, value)| {
            attribute
                .strip_prefix(APPLIED_PREFIX)
                .map(|name| (attribute, name, value))
        })
        .map(|(attribute, name, value)| {
            let fields = map_of(&reader, attribute, value)?;
            let number = |field: &str| whole_number(&reader, attribute, fields, field);
            // The transaction, where kept: one that cannot be read is left out (it only
            // informs whoever looks, nothing decides on it).
            let txn = match fields.get("txn") {
                Some(AttributeValue::S(txn)) => txn.parse().ok(),
                _ => None,
            };
            let applied = Applied {
                seq: number("seq")?,
                version: number("version")?,
                txn,
            };
            Ok((name.to_owned(), applied))
        })
        .collect()
}

impl DynamoStore {
    /// One `UpdateItem` that sets position `name` alone, where the key is as `expected`
    /// and the position below `applied` (or not there); the version stays. A key never
    /// written gets an item holding the position only, which reads as a vacant key at
    /// version 0.
    pub(super) async fn set_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        let mut names = HashMap::from([
            ("#data".to_owned(), "data".to_owned()),
            ("#applied".to_owned(), attribute(name)),
            ("#seq".to_owned(), "seq".to_owned()),
        ]);
        // DynamoDB refuses a name the expressions do not use.
        if !matches!(expected, ExpectedVersion::Absent) {
            names.insert("#version".to_owned(), "version".to_owned());
        }
        let mut values = HashMap::from([
            (":applied".to_owned(), value(applied)),
            (":seq".to_owned(), n(applied.seq)),
        ]);
        let as_expected = match expected {
            ExpectedVersion::Absent => "attribute_not_exists(#data)".to_owned(),
            ExpectedVersion::AbsentAt(0) => "attribute_not_exists(#data) AND attribute_not_exists(#version)".to_owned(),
            ExpectedVersion::AbsentAt(version) => {
                values.insert(":expected".to_owned(), n(version));
                "attribute_not_exists(#data) AND #version = :expected".to_owned()
            }
            ExpectedVersion::Exactly(version) => {
                values.insert(":expected".to_owned(), n(version));
                "attribute_exists(#data) AND #version = :expected".to_owned()
            }
        };
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key.as_str())))
            .update_expression("SET #applied = :applied")
            .condition_expression(format!(
                "{as_expected} AND (attribute_not_exists(#applied) OR #applied.#seq < :seq)"
            ))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(error) => {
                let Some(old) = condition_failed(&error) else {
                    reached(Branch::FailKeepApplied);
                    return Err(commit_error(error));
                };
                // Set as far by another copy already: done. Otherwise the key changed.
                let held = old
                    .as_ref()
                    .map(|old| applied_of(&self.layout, old))
                    .transpose()
                    .map_err(|error| CommitError::Ambiguous(Box::new(error)))?
                    .and_then(|positions| positions.get(name).copied());
                match held {
                    Some(held) if held.seq >= applied.seq => {
                        reached(Branch::AppliedHeldAlready);
                        Ok(())
                    }
                    _ => {
                        reached(Branch::AppliedKeyChanged);
                        Err(CommitError::VersionConflict { key: key.clone() })
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::item::s;

    #[test]
    fn positions_read_back_and_a_malformed_one_is_corrupt() {
        let layout = TableLayout::dedicated("t");
        let mut item = layout.key("SHIPMENT#1");
        item.insert("data".into(), s("{}".to_owned()));
        let applied = Applied {
            seq: 4,
            version: 9,
            txn: Some(crate::protocol::TxnId::new_v7()),
        };
        item.insert(attribute("shipping#events#ORDER#1"), value(applied));
        let read = applied_of(&layout, &item).unwrap();
        let expected: AppliedPositions = [("shipping#events#ORDER#1".to_owned(), applied)].into();
        assert_eq!(read, expected);
        item.insert(attribute("broken"), n(3));
        assert!(applied_of(&layout, &item).is_err());
    }
}
