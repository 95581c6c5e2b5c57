//! The transaction id: a UUID v7, so ids sort by creation time and carry it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::time::Timestamp;

/// Identifies one request-path transaction across the control message, the outbox
/// record, the outgoing messages' ids and the `ClientRequestToken` of its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TxnId(Uuid);

/// A string that is not a UUID v7.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a transaction id (a UUID v7 in hyphenated form): {input:?}")]
pub struct InvalidTxnId {
    input: String,
}

impl TxnId {
    /// A fresh id from the operating system's clock and random source.
    pub fn new_v7() -> Self {
        Self(Uuid::now_v7())
    }

    /// An id for the instant `at` with the given random bits (80 of them are used).
    /// Deterministic, so simulations can replay a seed exactly.
    pub fn from_parts(at: Timestamp, random: [u8; 10]) -> Self {
        Self(uuid::Builder::from_unix_timestamp_millis(at.as_millis(), &random).into_uuid())
    }

    /// The UUID itself.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl FromStr for TxnId {
    type Err = InvalidTxnId;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidTxnId {
            input: input.chars().take(64).collect(),
        };
        // Only the canonical hyphenated form: ids travel in URLs, keys and headers, and one
        // spelling per id keeps them comparable as strings.
        if input.len() != 36 {
            return Err(invalid());
        }
        let uuid = Uuid::try_parse(input).map_err(|_| invalid())?;
        if uuid.get_version_num() != 7 {
            return Err(invalid());
        }
        Ok(Self(uuid))
    }
}

impl TryFrom<String> for TxnId {
    type Error = InvalidTxnId;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<TxnId> for String {
    fn from(id: TxnId) -> Self {
        id.to_string()
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_its_own_display_and_nothing_else() {
        let id = TxnId::new_v7();
        assert_eq!(id.to_string().parse::<TxnId>(), Ok(id));
        assert!("not-a-uuid".parse::<TxnId>().is_err());
        // A valid UUID of another version is refused.
        assert!("67e55044-10b1-426f-9247-bb680e5fe0c8".parse::<TxnId>().is_err());
        // The simple (unhyphenated) form is refused.
        assert!(id.as_uuid().simple().to_string().parse::<TxnId>().is_err());
    }

    #[test]
    fn deterministic_ids_carry_their_timestamp() {
        let a = TxnId::from_parts(Timestamp::from_millis(1_700_000_000_000), [7; 10]);
        let b = TxnId::from_parts(Timestamp::from_millis(1_700_000_000_000), [7; 10]);
        assert_eq!(a, b);
        assert_eq!(a.as_uuid().get_version_num(), 7);
        let later = TxnId::from_parts(Timestamp::from_millis(1_700_000_000_001), [0; 10]);
        assert!(later > a, "v7 ids sort by time");
    }
}
