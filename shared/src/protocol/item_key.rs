//! The key of a business item, chosen by the application: the protocol names it (a
//! control message names the item a transaction commits into), and the store keys items
//! by it.

use std::fmt;
use std::str::FromStr;

/// The key of a business item, chosen by the application (`ORDER#42`). 1 to 1024 bytes;
/// the prefixes `TXN#`, `IN#` and `IDEM#` belong to the protocol's records.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ItemKey(String);

/// The prefixes of the protocol's own records' keys (outbox records and their parts,
/// consumers' dedup records, idempotency records): no business item's key starts with
/// one.
pub const RESERVED_KEY_PREFIXES: &[&str] = &["TXN#", "IN#", "IDEM#"];

/// A key that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("item key must be 1 to 1024 bytes and must not start with TXN#, IN# or IDEM#")]
pub struct InvalidItemKey;

impl FromStr for ItemKey {
    type Err = InvalidItemKey;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let reserved = RESERVED_KEY_PREFIXES.iter().any(|prefix| input.starts_with(prefix));
        ((1..=1024).contains(&input.len()) && !reserved)
            .then(|| Self(input.to_owned()))
            .ok_or(InvalidItemKey)
    }
}

impl TryFrom<String> for ItemKey {
    type Error = InvalidItemKey;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<ItemKey> for String {
    fn from(key: ItemKey) -> Self {
        key.0
    }
}

impl ItemKey {
    /// A key of the protocol's own, under one of its prefixes (a consumer's positions):
    /// written as a business item, which no application key can name.
    pub(crate) fn protocol(text: String) -> Self {
        debug_assert!(RESERVED_KEY_PREFIXES.iter().any(|prefix| text.starts_with(prefix)));
        Self(text)
    }

    /// Whether it is one of the protocol's own keys (under one of [`RESERVED_KEY_PREFIXES`]).
    pub fn is_protocol(&self) -> bool {
        RESERVED_KEY_PREFIXES.iter().any(|prefix| self.0.starts_with(prefix))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ItemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_every_reserved_prefix() {
        let message = InvalidItemKey.to_string();
        for prefix in RESERVED_KEY_PREFIXES {
            assert!(message.contains(prefix), "{message} does not name {prefix}");
        }
    }

    #[test]
    fn item_keys_keep_out_of_the_protocol_prefixes() {
        assert!("ORDER#1".parse::<ItemKey>().is_ok());
        for bad in ["", "TXN#x", "IN#x", "IDEM#x", &"k".repeat(1025)] {
            assert!(bad.parse::<ItemKey>().is_err(), "{bad:?} accepted");
        }
    }
}
