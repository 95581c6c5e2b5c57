//! Idempotency keys and the records that let a repeated request replay its first answer.
//!
//! The record is committed in the same transaction as the change it answers for, so a
//! stored response exists exactly when the change happened.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::txn_id::TxnId;
use crate::time::Timestamp;

/// A client-chosen `Idempotency-Key`: 1 to 255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// A key that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key must be 1 to 255 printable ASCII characters")]
pub struct InvalidIdempotencyKey;

impl FromStr for IdempotencyKey {
    type Err = InvalidIdempotencyKey;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let valid = (1..=255).contains(&input.len()) && input.bytes().all(|b| (0x20..=0x7e).contains(&b));
        valid.then(|| Self(input.to_owned())).ok_or(InvalidIdempotencyKey)
    }
}

impl IdempotencyKey {
    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where one key's record lives: the operation's scope (so one key may be reused across
/// unrelated operations) and a hash of the key (so stored keys are bounded and opaque).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdempotencySlot {
    /// The operation, for example `orders.create` or a caller's id plus a route.
    pub scope: String,
    /// Hex SHA-256 of the key.
    pub key_hash: String,
}

impl IdempotencySlot {
    /// The slot of `key` within `scope`.
    pub fn new(scope: impl Into<String>, key: &IdempotencyKey) -> Self {
        Self {
            scope: scope.into(),
            key_hash: hex_sha256(key.as_str().as_bytes()),
        }
    }
}

impl fmt::Display for IdempotencySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.scope, self.key_hash)
    }
}

/// The response stored for replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// The headers worth replaying (content type, location, transaction id, ETag).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

/// The record of one idempotency key's first successful use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// Its key.
    pub slot: IdempotencySlot,
    /// Fingerprint of the request that used the key first; a different request with the
    /// same key is refused.
    pub fingerprint: String,
    /// The transaction that committed with it.
    pub txn_id: TxnId,
    /// What to answer a repeat with.
    pub response: StoredResponse,
    /// When it was written.
    pub created_at: Timestamp,
    /// When it may be deleted (TTL).
    pub expires_at: Timestamp,
}

impl IdempotencyRecord {
    /// Whether the record no longer exists for readers at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }

    /// A fingerprint of a request's parts, for [`IdempotencyRecord::fingerprint`].
    pub fn fingerprint_of(parts: &[&[u8]]) -> String {
        let mut hasher = Sha256::new();
        for part in parts {
            // Length-prefixed so that ("ab", "c") and ("a", "bc") differ.
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        hex(&hasher.finalize())
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!("8e03978e-40d5-43e8-bc93-6894a57f9324".parse::<IdempotencyKey>().is_ok());
        for bad in ["", "tab\there", "é", &"k".repeat(256)] {
            assert!(bad.parse::<IdempotencyKey>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn slots_hash_the_key_and_keep_the_scope() {
        let key: IdempotencyKey = "abc".parse().unwrap();
        let slot = IdempotencySlot::new("orders.create", &key);
        assert_eq!(
            slot.key_hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(slot, IdempotencySlot::new("orders.cancel", &key));
    }

    #[test]
    fn fingerprints_separate_their_parts() {
        assert_ne!(
            IdempotencyRecord::fingerprint_of(&[b"ab", b"c"]),
            IdempotencyRecord::fingerprint_of(&[b"a", b"bc"])
        );
    }
}
