//! The in-order mode of a consumer ([`Handler::in_order`](super::Handler::in_order)):
//! each source entity's messages applied in their chain's order, each once.
//!
//! A message placed in its entity's history ([`Position`]: the entity, the chain of the
//! destination it was sent to, its `seq` on it) is applied only when the consumer has
//! applied its predecessor: the consumer keeps, per chain and entity, the last `seq` it
//! applied, in an item of its own ([`position_key`]) that the message's commit moves
//! under a condition on its version, atomically with the handler's effects. A message at
//! or below it is a duplicate; one beyond the next waits: it is sent back to its queue
//! to come again after a delay that grows with its waits ([`wait_delay`]), and the
//! delivery in hand is acknowledged, so that waiting never counts toward the dead-letter
//! queue. A message at or below it from a later version of its entity than the one
//! applied last is no duplicate but a chain that restarted: it fails, visibly, instead of
//! being dropped. A message without a position is applied as it comes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::ports::{Delivery, ExpectedVersion, ItemKey};
use crate::protocol::Position;
use crate::staging::Staging;
use crate::time::Timestamp;

/// The attribute a waiting message's copy carries: how many times it waited.
pub const WAITS_ATTRIBUTE: &str = "outbox-waits";
/// The attribute a waiting message's copy carries: when it first waited (milliseconds
/// since the epoch), for the oldest wait's metric.
pub const WAITING_SINCE_ATTRIBUTE: &str = "outbox-waiting-since";
/// The longest delay of a waiting message's copy: SQS's longest `DelaySeconds`.
pub const MAX_WAIT_DELAY: Duration = Duration::from_secs(900);

/// The key of the item where consumer `consumer` keeps the last `seq` it applied of
/// `position`'s chain and entity.
pub fn position_key(consumer: &str, position: &Position) -> ItemKey {
    ItemKey::protocol(format!("IN#AT#{consumer}#{}#{}", position.chain, position.entity))
}

/// What the consumer does with a placed message, given what it applied of its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Its predecessor was applied: run the handler, and move the position to it in the
    /// same commit.
    Apply,
    /// Applied before (its `seq` is at or below the position).
    Duplicate {
        /// The last `seq` applied.
        applied: u64,
    },
    /// Its predecessor was not applied yet.
    Wait {
        /// The last `seq` applied.
        applied: u64,
    },
    /// Its `seq` is at or below the position, but it comes from a later version of its
    /// entity than the message applied last: it cannot be an earlier message of the same
    /// chain. The chain restarted, counting from 1 again (the entity's heads were lost,
    /// or its table was restored from an old backup), and the message is no duplicate.
    Restarted {
        /// The last `seq` applied.
        applied: u64,
        /// The entity's version of the message applied last.
        version: u64,
    },
}

/// Reads the chain's position through `staging` (so that the commit is conditioned on the
/// version read) and decides; on [`Gate::Apply`] it stages the position's move to
/// `position.seq`.
pub async fn gate(
    consumer: &str,
    position: &Position,
    staging: &mut Staging,
) -> Result<Gate, crate::ports::StoreError> {
    let key = position_key(consumer, position);
    let read = staging.get(&key).await?;
    let applied = read
        .as_ref()
        .and_then(|item| item.data["applied"].as_u64())
        .unwrap_or(0);
    if position.seq <= applied {
        // Every message of one chain at or below the last applied comes from a version
        // at or below its version.
        let version = read.as_ref().and_then(|item| item.data["version"].as_u64());
        return Ok(match version {
            Some(version) if position.version > version => Gate::Restarted { applied, version },
            _ => Gate::Duplicate { applied },
        });
    }
    if position.seq > applied + 1 {
        return Ok(Gate::Wait { applied });
    }
    let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
    let data = json!({
        "applied": position.seq,
        "chain": position.chain.as_str(),
        "entity": position.entity.as_str(),
        "version": position.version,
    });
    staging.put(key, data, expected);
    Ok(Gate::Apply)
}

/// How long a message that waited `waits` times before waits again: 1 s, doubling, at
/// most [`MAX_WAIT_DELAY`].
pub fn wait_delay(waits: u32) -> Duration {
    Duration::from_secs(1u64 << waits.min(10)).min(MAX_WAIT_DELAY)
}

/// How many times `delivery` waited already, and since when (`now` for its first wait).
pub fn waited(delivery: &Delivery, now: Timestamp) -> (u32, Timestamp) {
    let waits = delivery
        .attributes
        .get(WAITS_ATTRIBUTE)
        .and_then(|waits| waits.parse().ok())
        .unwrap_or(0);
    let since = delivery
        .attributes
        .get(WAITING_SINCE_ATTRIBUTE)
        .and_then(|since| since.parse().ok())
        .map_or(now, Timestamp::from_millis);
    (waits, since)
}

/// The attributes a waiting message's copy carries beyond the delivery's own.
pub fn wait_attributes(waits: u32, since: Timestamp) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WAITS_ATTRIBUTE.to_owned(), waits.to_string()),
        (WAITING_SINCE_ATTRIBUTE.to_owned(), since.as_millis().to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_grows_from_a_second_to_the_longest_delay() {
        let delays: Vec<u64> = (0..12).map(|waits| wait_delay(waits).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]);
    }

    #[test]
    fn a_copy_counts_its_waits_from_the_first() {
        let now = Timestamp::from_millis(5_000);
        let mut delivery = Delivery {
            message_id: "m".into(),
            receipt: String::new(),
            body: "{}".into(),
            attributes: BTreeMap::new(),
            group_id: None,
            receive_count: 1,
            trace_header: None,
        };
        assert_eq!(waited(&delivery, now), (0, now));
        delivery.attributes = wait_attributes(3, Timestamp::from_millis(1_000));
        assert_eq!(waited(&delivery, now), (3, Timestamp::from_millis(1_000)));
    }
}
