//! Where the protocol's records live in DynamoDB: the table, the names of its key
//! attributes and of its TTL attribute, so that the records fit a dedicated table with a
//! string hash key as well as the application's own single-table design (`PK` + `SK`).
//!
//! Every protocol record has a *logical key*, a string such as `TXN#{txn_id}` or
//! `IDEM#{scope}#{hash}`. It is written to the partition key attribute; a table with a
//! sort key gets either the same string there or one constant for every record. The
//! portable form's business items (`ItemKey`s) are laid out the same way.
//!
//! Only string keys are supported (`S`), and the key and TTL attributes must not be named
//! like the attributes the records and items carry ([`RESERVED_ATTRIBUTES`],
//! [`RESERVED_PREFIXES`]).

use std::fmt;

/// The partition key attribute of a dedicated table.
pub const DEFAULT_PARTITION_KEY: &str = "pk";
/// The TTL attribute (unix seconds) by default.
pub const DEFAULT_TTL_ATTRIBUTE: &str = "expires_at";

/// Attribute names the protocol's records and the portable form's items use for their
/// content (the entity mode's entries, sent marks and fence mark among them): key and TTL
/// attributes must be named otherwise.
pub const RESERVED_ATTRIBUTES: &[&str] = &[
    "version",
    "data",
    "txn_id",
    "state",
    "created_at",
    "messages",
    "parts",
    "attempt",
    "scope",
    "key_hash",
    "fingerprint",
    "status",
    "headers",
    "body",
    "outbox",
    "outbox_sent",
    "outbox_fence",
];

/// Prefixes of the attribute names an item keeps per destination (its chain heads,
/// `chain:{destination}`) and per chain an in-order consumer applies (its positions,
/// `in:{consumer}#{chain}#{entity}`): key and TTL attributes must not start with one.
pub const RESERVED_PREFIXES: &[&str] = &["chain:", "in:"];

/// What a protocol record writes in the table's sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SortKeyValue {
    /// The same string as in the partition key (`PK = SK = "TXN#…"`).
    SameAsPartitionKey,
    /// One constant for every record (`SK = "OUTBOX"`).
    Constant(String),
}

/// The table's sort key, when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// The attribute's name (`SK`).
    pub attribute: String,
    /// What the protocol writes in it.
    pub value: SortKeyValue,
}

/// The table of the protocol's records and how they are keyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLayout {
    /// The table's name.
    pub table: String,
    /// The partition key attribute's name (a string attribute).
    pub partition_key: String,
    /// The sort key, if the table has one (a string attribute).
    pub sort_key: Option<SortKey>,
    /// The TTL attribute's name (a number of unix seconds).
    pub ttl_attribute: String,
}

/// A layout that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table layout: {0}")]
pub struct LayoutError(pub String);

impl TableLayout {
    /// A dedicated table `table`: partition key `pk`, no sort key, TTL on `expires_at`.
    pub fn dedicated(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            partition_key: DEFAULT_PARTITION_KEY.to_owned(),
            sort_key: None,
            ttl_attribute: DEFAULT_TTL_ATTRIBUTE.to_owned(),
        }
    }

    /// This layout with partition key attribute `name`.
    pub fn with_partition_key(mut self, name: impl Into<String>) -> Self {
        self.partition_key = name.into();
        self
    }

    /// This layout with sort key attribute `name`, holding `value`.
    pub fn with_sort_key(mut self, name: impl Into<String>, value: SortKeyValue) -> Self {
        self.sort_key = Some(SortKey {
            attribute: name.into(),
            value,
        });
        self
    }

    /// This layout with TTL attribute `name`.
    pub fn with_ttl_attribute(mut self, name: impl Into<String>) -> Self {
        self.ttl_attribute = name.into();
        self
    }

    /// Checks the names: present, distinct, and none of them an attribute the records
    /// carry.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.table.trim().is_empty() {
            return Err(LayoutError("the table name is empty".into()));
        }
        let mut names = vec![
            ("partition key", &self.partition_key),
            ("TTL attribute", &self.ttl_attribute),
        ];
        if let Some(sort_key) = &self.sort_key {
            names.push(("sort key", &sort_key.attribute));
            if let SortKeyValue::Constant(value) = &sort_key.value {
                if value.is_empty() {
                    return Err(LayoutError("the sort key's constant value is empty".into()));
                }
            }
        }
        for (what, name) in &names {
            if name.is_empty() || name.len() > 255 {
                return Err(LayoutError(format!("the {what} name must be 1 to 255 bytes")));
            }
            if RESERVED_ATTRIBUTES.contains(&name.as_str()) {
                return Err(LayoutError(format!(
                    "the {what} must not be named {name:?}: the protocol's records use that attribute"
                )));
            }
            if let Some(prefix) = RESERVED_PREFIXES.iter().find(|prefix| name.starts_with(*prefix)) {
                return Err(LayoutError(format!(
                    "the {what} must not be named {name:?}: names starting with {prefix:?} are the protocol's (an item's chain heads, an in-order consumer's positions)"
                )));
            }
        }
        for (index, (what, name)) in names.iter().enumerate() {
            if let Some((other, _)) = names[index + 1..].iter().find(|(_, other)| other == name) {
                return Err(LayoutError(format!(
                    "the {what} and the {other} are both named {name:?}"
                )));
            }
        }
        Ok(())
    }
}

impl From<&str> for TableLayout {
    fn from(table: &str) -> Self {
        Self::dedicated(table)
    }
}

impl From<String> for TableLayout {
    fn from(table: String) -> Self {
        Self::dedicated(table)
    }
}

impl fmt::Display for TableLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "table {} (partition key {}", self.table, self.partition_key)?;
        if let Some(sort_key) = &self.sort_key {
            match &sort_key.value {
                SortKeyValue::SameAsPartitionKey => write!(f, ", sort key {} = partition key", sort_key.attribute)?,
                SortKeyValue::Constant(value) => write!(f, ", sort key {} = {value:?}", sort_key.attribute)?,
            }
        }
        write!(f, ", TTL {})", self.ttl_attribute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_that_would_clash_with_the_records_are_refused() {
        assert!(TableLayout::dedicated("t").validate().is_ok());
        assert!(TableLayout::dedicated("").validate().is_err());
        assert!(TableLayout::dedicated("t")
            .with_partition_key("state")
            .validate()
            .is_err());
        assert!(TableLayout::dedicated("t").with_ttl_attribute("pk").validate().is_err());
        assert!(TableLayout::dedicated("t")
            .with_sort_key("pk", SortKeyValue::SameAsPartitionKey)
            .validate()
            .is_err());
        assert!(TableLayout::dedicated("t")
            .with_sort_key("sk", SortKeyValue::Constant(String::new()))
            .validate()
            .is_err());
    }

    /// No name the layout sets may be one the entity mode keeps in an item, nor start
    /// like a chain head's: each is refused, saying why.
    #[test]
    fn names_the_items_keep_are_refused() {
        for name in ["outbox", "outbox_sent", "outbox_fence", "attempt"] {
            let error = TableLayout::dedicated("t")
                .with_ttl_attribute(name)
                .validate()
                .unwrap_err();
            assert!(error.0.contains("the protocol's records use that attribute"), "{error}");
        }
        for layout in [
            TableLayout::dedicated("t").with_partition_key("chain:events"),
            TableLayout::dedicated("t").with_ttl_attribute("chain:"),
            TableLayout::dedicated("t").with_sort_key("chain:sk", SortKeyValue::SameAsPartitionKey),
        ] {
            let error = layout.validate().unwrap_err();
            assert!(error.0.contains("starting with \"chain:\""), "{error}");
        }
        assert!(TableLayout::dedicated("t")
            .with_ttl_attribute("chains")
            .validate()
            .is_ok());
        assert!(TableLayout::dedicated("t")
            .with_partition_key("PK_chain:")
            .validate()
            .is_ok());
    }
}
