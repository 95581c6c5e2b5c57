//! A consumer's name: part of every record and outgoing id it derives, so two consumers
//! of one message keep their own.

use std::fmt;
use std::str::FromStr;

/// The name of a consumer (`shipping`): 1 to 64 characters from `A-Z a-z 0-9 - _ .`.
/// Renaming a consumer makes it forget which messages it processed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerName(String);

/// A consumer name that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("consumer name {input:?} must be 1 to 64 characters from A-Z a-z 0-9 - _ .")]
pub struct InvalidConsumerName {
    input: String,
}

impl FromStr for ConsumerName {
    type Err = InvalidConsumerName;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let valid = (1..=64).contains(&input.len())
            && input
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if valid {
            Ok(Self(input.to_owned()))
        } else {
            Err(InvalidConsumerName {
                input: input.chars().take(80).collect(),
            })
        }
    }
}

impl ConsumerName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!("shipping".parse::<ConsumerName>().is_ok());
        assert!("orders.shipping-v2_a".parse::<ConsumerName>().is_ok());
        for bad in ["", "has space", "a#b", &"x".repeat(65)] {
            assert!(bad.parse::<ConsumerName>().is_err(), "{bad:?} accepted");
        }
    }
}
