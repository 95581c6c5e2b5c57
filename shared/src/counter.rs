//! Counters under bounds in entity mode: a change that only adds to whole numbers of one
//! item (stock, seats, copies, balances), each kept within its bounds, committed in one
//! conditional write that reads nothing first and never conflicts, whose messages still
//! take their place in the item's history.
//!
//! The change is typed ([`Add`]: "add -1 to `stock` if `stock` stays at least 0"), not a
//! raw expression, so that every store runs it: the embedded store under its lock, the
//! DynamoDB store as one `UpdateItem` whose condition is the bounds and whose update adds.
//!
//! **Positions without a read.** A message's place is the item's version after its
//! transaction and, per destination, the head of the chain before it
//! ([`crate::protocol::stamp_chain`]). A read-modify-write learns both from its read and
//! is conditioned on the version it read; a counter cannot be, or two counters would
//! conflict. The store stamps instead, inside the write: every right-hand side of a
//! DynamoDB update is evaluated on the item as it was, so one `UpdateItem` both moves the
//! version and each head (`version = version + 1`, `head.seq = head.seq + n`) and keeps,
//! next to the entry, what the stamp counts from (the version before and a copy of each
//! head before). Whoever reads the entry back (the worker, a later publisher) stamps its
//! messages from what was kept, exactly as the request path does from the returned old
//! item ([`stamp`]): one function, the same positions. The embedded store stamps under
//! its lock with the same function.
//!
//! **What still holds.** The write is conditioned on no entry of its transaction (a
//! retried write whose first attempt applied finds its own entry, and reports success
//! without adding twice), on the fence mark below its transaction (a late write after a
//! fence fails, as an entity commit does), on the item being live, and on the bounds. It
//! moves the item's version, so a read-modify-write racing it conflicts as it would with
//! any other commit. The answer carries the new values and the stamped messages.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ports::{CommitError, ItemKey};
use crate::protocol::{stamp_chain_named, ChainHeads, OutboxRecord, OutgoingMessage, Producer};

/// One addition to a whole number at the top level of an item's data, kept within bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Add {
    /// The field of the item's data (a JSON object) that holds the number.
    pub field: String,
    /// What to add (negative to take away).
    pub delta: i64,
    /// The smallest value the field may take after the addition, if any.
    pub at_least: Option<i64>,
    /// The largest value the field may take after the addition, if any.
    pub at_most: Option<i64>,
}

impl Add {
    /// Takes `amount` from `field` if at least `amount` is there: the field never goes
    /// below zero ("reserve `amount` units of stock").
    pub fn take(field: impl Into<String>, amount: i64) -> Self {
        Self {
            field: field.into(),
            delta: -amount,
            at_least: Some(0),
            at_most: None,
        }
    }

    /// Adds `amount` to `field` if the result stays at most `cap`.
    pub fn give_up_to(field: impl Into<String>, amount: i64, cap: i64) -> Self {
        Self {
            field: field.into(),
            delta: amount,
            at_least: None,
            at_most: Some(cap),
        }
    }

    /// The lowest value the field may hold *before* the addition (`at_least - delta`), as
    /// a condition on the item as it was; `None` where no lower bound is set.
    pub fn lowest_before(&self) -> Option<i128> {
        self.at_least.map(|bound| i128::from(bound) - i128::from(self.delta))
    }

    /// The highest value the field may hold before the addition (`at_most - delta`).
    pub fn highest_before(&self) -> Option<i128> {
        self.at_most.map(|bound| i128::from(bound) - i128::from(self.delta))
    }

    /// The field's new value from `old`, or why the addition is refused.
    pub fn apply_to(&self, old: Option<&Value>) -> Result<i64, Refusal> {
        let old = old.and_then(Value::as_i64).ok_or_else(|| Refusal::NotANumber {
            field: self.field.clone(),
        })?;
        let new = i128::from(old) + i128::from(self.delta);
        let below = self.at_least.is_some_and(|bound| new < i128::from(bound));
        let above = self.at_most.is_some_and(|bound| new > i128::from(bound));
        match i64::try_from(new) {
            Ok(new) if !below && !above => Ok(new),
            _ => Err(Refusal::OutOfBounds {
                field: self.field.clone(),
                value: old,
            }),
        }
    }
}

/// Why the additions of a counter commit were refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The field would leave its bounds; `value` is what it holds.
    #[error("{field} holds {value}: the addition would take it out of its bounds")]
    OutOfBounds {
        /// The field.
        field: String,
        /// What it holds.
        value: i64,
    },
    /// The field is missing or not a whole number.
    #[error("{field} is not a whole number in the item")]
    NotANumber {
        /// The field.
        field: String,
    },
}

/// Applies `adds` to `data` (a JSON object), all or none: the new values by field.
pub fn apply_all(adds: &[Add], data: &mut Value) -> Result<BTreeMap<String, i64>, Refusal> {
    let mut values = BTreeMap::new();
    for add in adds {
        let new = add.apply_to(data.get(&add.field))?;
        values.insert(add.field.clone(), new);
    }
    if let Some(object) = data.as_object_mut() {
        for (field, value) in &values {
            object.insert(field.clone(), Value::from(*value));
        }
    }
    Ok(values)
}

/// A counter commit of one item: the additions, and the entry whose messages the store
/// stamps in the write.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterCommit {
    /// The item; it must be live.
    pub key: ItemKey,
    /// The additions, at most one per field.
    pub adds: Vec<Add>,
    /// The entry, its messages without positions: the store gives them theirs.
    pub entry: OutboxRecord,
    /// Whether the write is refused where the item's fence mark is at or above its
    /// transaction (the request path's commits), as [`crate::ports::EntityCommit`]'s.
    pub checks_fence: bool,
}

/// What a counter commit did.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterCommitted {
    /// The item's version after it.
    pub version: u64,
    /// The counters' values after it, by field (on a retry that found its first attempt
    /// applied: their values now).
    pub values: BTreeMap<String, i64>,
    /// The entry's messages with the positions the write gave them.
    pub messages: Vec<OutgoingMessage>,
    /// The item's pending entries of other transactions as the write found them, in
    /// commit order, their messages placed: what a publisher that keeps order sends
    /// first. The write reads nothing before, so this is the only sight of them it has.
    pub earlier: Vec<OutboxRecord>,
}

/// Why a counter commit did not apply.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The business rule: a bound, or a field that holds no number. Nothing written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The item is not there (or vacant). Nothing written.
    #[error("item {key} does not exist")]
    Missing {
        /// The item.
        key: ItemKey,
    },
    /// Everything an entity commit can meet (a fence, a rival entry, an ambiguous write).
    #[error(transparent)]
    Commit(#[from] CommitError),
}

/// The messages of a counter commit that took `key` from `version` with chain heads
/// `heads` (both as they were before it), stamped, naming `producer` (the table, as the
/// store names it): the one function the store that writes and every reader of the entry
/// use.
pub fn stamp(
    key: &ItemKey,
    version: u64,
    heads: &ChainHeads,
    messages: &[OutgoingMessage],
    producer: Option<&Producer>,
) -> Vec<OutgoingMessage> {
    let mut messages = messages.to_vec();
    for message in &mut messages {
        message.position = None;
    }
    stamp_chain_named(&mut messages, key, version + 1, heads, producer);
    messages
}

/// The distinct destinations of `messages`, in the order first emitted to: the chains a
/// counter commit moves.
pub fn chains_of(messages: &[OutgoingMessage]) -> Vec<(crate::protocol::DestinationName, u64)> {
    let mut chains: Vec<(crate::protocol::DestinationName, u64)> = Vec::new();
    for message in messages {
        match chains
            .iter_mut()
            .find(|(destination, _)| destination == &message.destination)
        {
            Some((_, count)) => *count += 1,
            None => chains.push((message.destination.clone(), 1)),
        }
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_take_stays_at_or_above_zero() {
        let take = Add::take("stock", 3);
        assert_eq!(take.apply_to(Some(&json!(3))), Ok(0));
        assert_eq!(
            take.apply_to(Some(&json!(2))),
            Err(Refusal::OutOfBounds {
                field: "stock".into(),
                value: 2
            })
        );
        assert_eq!(take.lowest_before(), Some(3));
        assert_eq!(
            take.apply_to(Some(&json!("3"))),
            Err(Refusal::NotANumber { field: "stock".into() })
        );
    }

    #[test]
    fn a_give_stays_at_or_below_its_cap() {
        let give = Add::give_up_to("seats", 2, 10);
        assert_eq!(give.apply_to(Some(&json!(8))), Ok(10));
        assert!(give.apply_to(Some(&json!(9))).is_err());
        assert_eq!(give.highest_before(), Some(8));
    }

    #[test]
    fn all_adds_apply_or_none() {
        let mut data = json!({"stock": 5, "sold": 1});
        let refused = apply_all(&[Add::give_up_to("sold", 1, 100), Add::take("stock", 6)], &mut data);
        assert!(refused.is_err());
        assert_eq!(data, json!({"stock": 5, "sold": 1}));
        let values = apply_all(&[Add::give_up_to("sold", 1, 100), Add::take("stock", 5)], &mut data).unwrap();
        assert_eq!(data, json!({"stock": 0, "sold": 2}));
        assert_eq!(values, BTreeMap::from([("sold".into(), 2), ("stock".into(), 0)]));
    }
}
