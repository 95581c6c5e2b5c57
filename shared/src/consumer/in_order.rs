//! The in-order mode of a consumer ([`Handler::in_order`](super::Handler::in_order)):
//! each source entity's messages applied in their chain's order, each once.
//!
//! A message placed in its entity's history ([`Position`]: the entity, the chain of the
//! destination it was sent to, its `seq` on it) is applied only when the consumer has
//! applied its predecessor: the consumer keeps, per chain and entity, the last `seq` it
//! applied, atomically with the handler's effects. In entity mode it is kept in the
//! handler's entity's key ([`applied_name`], [`crate::ports::KeyRead::applied`]), moved by
//! the entity's own conditional write, or alone where the message changes nothing
//! ([`crate::ports::Store::keep_applied`]); otherwise in an item of its own
//! ([`position_key`]) that the message's commit moves under a condition on its version.
//! A message at
//! or below it is a duplicate; one beyond the next is kept ([`kept_key`],
//! [`crate::ports::KeptMessage`]) and acknowledged, and whoever applies its predecessor
//! applies it right after; a message that cannot be kept ([`MAX_KEPT_BYTES`]) waits on its
//! queue instead, sent back to come again after a delay that grows with its waits
//! ([`wait_delay`]), so that waiting never counts toward the dead-letter queue. A message at or below it from a later version of its entity than the one
//! applied last is no duplicate but a chain that restarted: it fails, visibly, instead of
//! being dropped. A message without a position is applied as it comes.
//!
//! A chain is its producer's: where a position names the table whose chain it is
//! ([`Position::producer`]), the consumer keys what it keeps by the producer too
//! ([`position_key`], [`applied_name`], [`kept_key`]), so that two tables' chains to one
//! destination about keys that look alike are never one; a position that names none
//! keeps the keys it always had, and a named chain with no position of its own yet
//! continues from that one ([`continued`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::ports::{Delivery, ExpectedVersion, ItemKey};
use crate::protocol::Position;
use crate::staging::Staging;
use crate::time::Timestamp;

/// The attribute a waiting message's copy carries: how many times it waited and when it
/// first waited (milliseconds since the epoch, for the oldest wait's metric), as
/// `<waits>;<since>`. One attribute, as a message carries at most
/// [`crate::protocol::MAX_MESSAGE_ATTRIBUTES`].
pub const WAIT_ATTRIBUTE: &str = "outbox-wait";
/// How many times a copy waited, as copies sent before [`WAIT_ATTRIBUTE`] carry it: read,
/// never written.
pub const WAITS_ATTRIBUTE: &str = "outbox-waits";
/// When a copy first waited, as copies sent before [`WAIT_ATTRIBUTE`] carry it: read,
/// never written.
pub const WAITING_SINCE_ATTRIBUTE: &str = "outbox-waiting-since";
/// The longest delay of a waiting message's copy: SQS's longest `DelaySeconds`.
pub const MAX_WAIT_DELAY: Duration = Duration::from_secs(900);

/// How a consumer names `position`'s chain in its keys: its destination, and where the
/// position names its producer, `@` and the producer (`events@orders`), so that two
/// producers' chains are never one. A destination holds no `@`, and a producer no `#`.
fn chain_name(position: &Position) -> String {
    match &position.producer {
        Some(producer) => format!("{}@{producer}", position.chain),
        None => position.chain.to_string(),
    }
}

/// The key of the item where consumer `consumer` keeps the last `seq` it applied of
/// `position`'s chain and entity: `IN#AT#{consumer}#{chain}#{entity}`, the chain named
/// by its producer too where the position names one (`events@orders`).
pub fn position_key(consumer: &str, position: &Position) -> ItemKey {
    ItemKey::protocol(format!("IN#AT#{consumer}#{}#{}", chain_name(position), position.entity))
}

/// The key under which consumer `consumer` keeps message `seq` of `position`'s chain and
/// entity while its predecessor is not applied ([`crate::ports::KeptMessage`]): every copy
/// of one message is kept in one place, and whoever applies `seq - 1` finds it there.
pub fn kept_key(consumer: &str, position: &Position, seq: u64) -> String {
    format!("IN#KEPT#{consumer}#{}#{}#{seq}", chain_name(position), position.entity)
}

/// The keys a message at `position` is kept under: its chain's ([`kept_key`]), and with
/// `unnamed_too` (a position that names its producer) the unnamed chain's too.
pub fn kept_keys(consumer: &str, position: &Position, unnamed_too: bool) -> Vec<String> {
    let mut keys = vec![kept_key(consumer, position, position.seq)];
    if unnamed_too && position.producer.is_some() {
        keys.push(kept_key(consumer, &position.unnamed(), position.seq));
    }
    keys
}

/// The most a message may weigh (its body and attributes, names and values) to be kept:
/// its item must stay within DynamoDB's 400 KB with the key and the rest. A heavier one
/// waits on its queue instead ([`wait_delay`]); SQS's own limit is lower unless raised.
pub const MAX_KEPT_BYTES: usize = 350 * 1024;

/// Whether `delivery` is light enough to keep ([`MAX_KEPT_BYTES`]).
pub fn fits_kept(delivery: &Delivery) -> bool {
    let attributes: usize = delivery
        .attributes
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    delivery.body.len() + attributes + delivery.message_id.len() <= MAX_KEPT_BYTES
}

/// How long after keeping a message its reminder comes back (on a standard source queue):
/// the reminder only measures the wait for the alarm and applies the message if nothing
/// else did, so it comes as late as SQS lets it.
pub const REMINDER_DELAY: Duration = MAX_WAIT_DELAY;

/// The name under which consumer `consumer` keeps, in its entity's key (entity mode),
/// the last message it applied of `position`'s chain and entity.
pub fn applied_name(consumer: &str, position: &Position) -> String {
    format!("{consumer}#{}#{}", chain_name(position), position.entity)
}

/// The last message applied of a chain, as a consumer keeps it: its `seq`, and its
/// version where known.
pub type Held = (u64, Option<u64>);

/// Where a position that names its producer finds no position of its own chain (none of
/// its producer's messages applied yet), what it continues from: the position the
/// consumer keeps under the same destination and entity with no producer (`legacy`), as
/// it kept it before the producer named itself, where it can be this chain's past. A
/// producer that starts naming itself continues its entities' chains (its next `seq`
/// after the last it sent unnamed), so such a message continues from there: the next
/// `seq`, following the message applied last, applies; a later one waits for it. A
/// legacy position at or beyond the message's `seq`, or whose next `seq` does not follow
/// it, is another producer's chain that shared the legacy key: the message starts its
/// own chain (seq 1 applies, a later one waits for its predecessor). A message at `seq`
/// 1 starts a chain and never continues one.
pub fn continued(legacy: Option<Held>, position: &Position) -> Option<Held> {
    let (applied, version) = legacy?;
    if position.producer.is_none() || position.seq <= 1 || applied >= position.seq {
        return None;
    }
    if applied + 1 == position.seq {
        if let Some(version) = version {
            if position.after != version && position.version != version {
                return None;
            }
        }
    }
    Some((applied, version))
}

/// Whether `position` needs the legacy position read ([`continued`]): it names its
/// producer, is beyond `seq` 1, and its own chain has no position.
pub fn reads_legacy(named: Option<Held>, position: &Position) -> bool {
    named.is_none() && position.producer.is_some() && position.seq > 1
}

/// What the consumer does with a placed message, given what it applied of its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
        /// It names its producer, and its own chain has no position yet: it may follow a
        /// message sent before its producer named itself, whose consumer looks for it
        /// under the unnamed chain's key, so it is kept there too.
        unnamed_too: bool,
    },
    /// Its `seq` is at or below the position, but it comes from a later version of its
    /// entity than the message applied last (it cannot be an earlier message of the same
    /// chain), or it is the next `seq` but does not follow the message applied last (its
    /// `after` and its version are not that one's version). The chain restarted, counting
    /// from 1 again while the entity's version went on (its heads were lost: a write from
    /// outside the library replaced the item without its `chain:` attributes), and the
    /// message is neither a duplicate nor the next. A restart that takes the version back
    /// too (the table restored from a backup older than the messages applied) cannot be
    /// told from copies of messages already applied: those read as
    /// [`Gate::Duplicate`], so after such a restore the consumer's positions must be
    /// restored from the same point in time.
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
    let held = read.as_ref().and_then(|item| held_in(&item.data));
    let held = match reads_legacy(held, position) {
        true => {
            let legacy = staging.get(&position_key(consumer, &position.unnamed())).await?;
            continued(legacy.as_ref().and_then(|item| held_in(&item.data)), position)
        }
        false => held,
    };
    let gate = judge_named(held, read.is_none(), position);
    if gate != Gate::Apply {
        return Ok(gate);
    }
    let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
    let data = json!({
        "applied": position.seq,
        "chain": position.chain.as_str(),
        "entity": position.entity.as_str(),
        "version": position.version,
        // The transaction that applied it, for whoever looks (consumer::state).
        "txn": staging.id().to_string(),
    });
    staging.put(key, data, expected);
    Ok(Gate::Apply)
}

/// The position a position item holds ([`position_key`]).
fn held_in(data: &serde_json::Value) -> Option<Held> {
    Some((data["applied"].as_u64()?, data["version"].as_u64()))
}

/// The position consumer `consumer` keeps of `position`'s chain in an item of its own
/// ([`position_key`]): its `seq` and version, where there is one.
pub async fn read_position_item(
    consumer: &str,
    position: &Position,
    store: &dyn crate::ports::Store,
) -> Result<Option<Held>, crate::ports::StoreError> {
    let key = position_key(consumer, position);
    let items = store.get_items(std::slice::from_ref(&key)).await?;
    Ok(items.get(&key).and_then(|item| held_in(&item.data)))
}

/// [`judge`], given what the chain continues from (`held`: its own position, else the one
/// it continues, [`continued`]) and whether its own chain has no position (`absent`):
/// a message that waits with no position of its own chain is kept under the unnamed
/// chain's key too (`unnamed_too` of [`Gate::Wait`]).
pub fn judge_named(held: Option<Held>, absent: bool, position: &Position) -> Gate {
    match judge(held, position) {
        Gate::Wait { applied, .. } => Gate::Wait {
            applied,
            unnamed_too: absent && position.producer.is_some(),
        },
        gate => gate,
    }
}

/// What to do with a message at `position`, given the last message of its chain applied
/// (`None`: none; its `seq`, and its version where known).
pub fn judge(applied: Option<(u64, Option<u64>)>, position: &Position) -> Gate {
    let (applied, version) = applied.unwrap_or((0, None));
    if position.seq <= applied {
        // Every message of one chain at or below the last applied comes from a version
        // at or below its version.
        return match version {
            Some(version) if position.version > version => Gate::Restarted { applied, version },
            _ => Gate::Duplicate { applied },
        };
    }
    if position.seq > applied + 1 {
        return Gate::Wait {
            applied,
            unnamed_too: false,
        };
    }
    // The next `seq`, but of the same chain only: it follows the message applied last,
    // from the transaction after it (`after` is that one's version) or from the same
    // transaction (the same version). Otherwise its chain restarted and counted up to
    // here again.
    match version {
        Some(version) if position.after != version && position.version != version => {
            Gate::Restarted { applied, version }
        }
        _ => Gate::Apply,
    }
}

/// How long a message that waited `waits` times before waits again: 1 s, doubling, at
/// most [`MAX_WAIT_DELAY`].
pub fn wait_delay(waits: u32) -> Duration {
    Duration::from_secs(1u64 << waits.min(10)).min(MAX_WAIT_DELAY)
}

/// How many times `delivery` waited already, and since when (`now` for its first wait):
/// read from [`WAIT_ATTRIBUTE`], else from the two attributes earlier copies carry. A part
/// that cannot be read counts as missing (no wait yet, waiting from `now`).
pub fn waited(delivery: &Delivery, now: Timestamp) -> (u32, Timestamp) {
    let attributes = &delivery.attributes;
    let (waits, since) = match attributes.get(WAIT_ATTRIBUTE) {
        Some(wait) => {
            let mut parts = wait.splitn(2, ';');
            (parts.next(), parts.next())
        }
        None => (
            attributes.get(WAITS_ATTRIBUTE).map(String::as_str),
            attributes.get(WAITING_SINCE_ATTRIBUTE).map(String::as_str),
        ),
    };
    let waits = waits.and_then(|waits| waits.trim().parse().ok()).unwrap_or(0);
    let since = since
        .and_then(|since| since.trim().parse().ok())
        .map_or(now, Timestamp::from_millis);
    (waits, since)
}

/// The attributes a waiting message's copy carries beyond the delivery's own: one,
/// [`WAIT_ATTRIBUTE`].
pub fn wait_attributes(waits: u32, since: Timestamp) -> BTreeMap<String, String> {
    BTreeMap::from([(WAIT_ATTRIBUTE.to_owned(), format!("{waits};{}", since.as_millis()))])
}

/// `delivery` as its waiting copy starts from: without the wait attributes of earlier
/// copies, which [`wait_attributes`] replaces.
pub fn without_earlier_wait(delivery: &Delivery) -> Delivery {
    let mut copy = delivery.clone();
    copy.attributes.remove(WAITS_ATTRIBUTE);
    copy.attributes.remove(WAITING_SINCE_ATTRIBUTE);
    copy
}

/// Whether `name` is one of the attributes a waiting message's copy carries of its own.
pub fn is_wait_attribute(name: &str) -> bool {
    [WAIT_ATTRIBUTE, WAITS_ATTRIBUTE, WAITING_SINCE_ATTRIBUTE].contains(&name)
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
        assert_eq!(
            delivery.attributes,
            BTreeMap::from([(WAIT_ATTRIBUTE.to_owned(), "3;1000".to_owned())]),
            "one attribute"
        );
        assert_eq!(waited(&delivery, now), (3, Timestamp::from_millis(1_000)));
    }

    #[test]
    fn the_wait_is_read_leniently_and_from_the_two_attributes_of_earlier_copies() {
        let now = Timestamp::from_millis(5_000);
        let with = |attributes: &[(&str, &str)]| Delivery {
            message_id: "m".into(),
            receipt: String::new(),
            body: "{}".into(),
            attributes: attributes
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            group_id: None,
            receive_count: 1,
            trace_header: None,
        };
        let at = Timestamp::from_millis;
        assert_eq!(waited(&with(&[(WAIT_ATTRIBUTE, " 4 ; 2000 ")]), now), (4, at(2_000)));
        assert_eq!(waited(&with(&[(WAIT_ATTRIBUTE, "4")]), now), (4, now));
        assert_eq!(waited(&with(&[(WAIT_ATTRIBUTE, "x;2000")]), now), (0, at(2_000)));
        assert_eq!(waited(&with(&[(WAIT_ATTRIBUTE, "4;soon;later")]), now), (4, now));
        assert_eq!(waited(&with(&[(WAIT_ATTRIBUTE, "")]), now), (0, now));
        let earlier = with(&[
            (WAITS_ATTRIBUTE, "2"),
            (WAITING_SINCE_ATTRIBUTE, "1000"),
            ("own", "kept"),
        ]);
        assert_eq!(waited(&earlier, now), (2, at(1_000)));
        // The new attribute wins over the earlier two.
        let both = with(&[(WAIT_ATTRIBUTE, "5;3000"), (WAITS_ATTRIBUTE, "2")]);
        assert_eq!(waited(&both, now), (5, at(3_000)));
        // A copy of an earlier copy drops the two for the one.
        let copy = without_earlier_wait(&earlier);
        assert_eq!(copy.attributes, BTreeMap::from([("own".to_owned(), "kept".to_owned())]));
    }
}
