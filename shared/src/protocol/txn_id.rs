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

/// A string that is not a transaction id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a transaction id (a UUID v7, or v8 for a consumed message, in hyphenated form): {input:?}")]
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

    /// The id of the transaction that consumer `consumer` runs for the incoming message
    /// whose id is `incoming` (docs/PROTOCOL.md section 10): a UUID v8 (RFC 9562's custom
    /// version) from the SHA-256 of both, so that every attempt of every copy of the
    /// message names the same record and the same outgoing ids, whatever the incoming
    /// id's length or alphabet. Never equal to a request path's v7 id.
    pub fn consumed(consumer: &str, incoming: &str) -> Self {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(b"outbox consumer\0");
        hash.update(consumer.as_bytes());
        hash.update(b"\0");
        hash.update(incoming.as_bytes());
        let digest = hash.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Self(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }

    /// Whether this id was derived for a consumed message ([`Self::consumed`]) rather
    /// than begun by the request path.
    pub fn is_consumed(&self) -> bool {
        self.0.get_version_num() == 8
    }

    /// The logical key of its record: `TXN#{id}` for the request path's transactions,
    /// `IN#{id}` for a consumed message's (docs/PROTOCOL.md sections 2 and 10).
    pub fn record_key(&self) -> String {
        if self.is_consumed() {
            format!("IN#{self}")
        } else {
            format!("TXN#{self}")
        }
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
        if !matches!(uuid.get_version_num(), 7 | 8) {
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

    #[test]
    fn a_consumed_message_has_one_id_per_consumer_and_incoming_id() {
        let id = TxnId::consumed("shipping", "0190f3c2-0000-7000-8000-000000000000:0");
        assert_eq!(
            id,
            TxnId::consumed("shipping", "0190f3c2-0000-7000-8000-000000000000:0")
        );
        assert_ne!(id, TxnId::consumed("billing", "0190f3c2-0000-7000-8000-000000000000:0"));
        assert_ne!(
            id,
            TxnId::consumed("shipping", "0190f3c2-0000-7000-8000-000000000000:1")
        );
        // The separator keeps ("a", "b#c") and ("a#b", "c") apart.
        assert_ne!(TxnId::consumed("a", "bc"), TxnId::consumed("ab", "c"));
        assert!(id.is_consumed() && !TxnId::new_v7().is_consumed());
        assert_eq!(id.to_string().parse::<TxnId>(), Ok(id));
    }
}
