//! Entity mode in the consumer simulation (docs/PROTOCOL.md section 11): the other writer that
//! commits into M's entity beside M's copies, and the checks only this mode has.
//!
//! The schedules themselves are [`super::consumer`]'s: the handler names its counter as
//! its entity, and the copies' entity reads, conditional writes, dedup record puts and
//! entry removals pass the gates. What differs after recovery is where M's effect shows:
//! in the entity's history (one `EntityCommitted` of M), in its dedup record, and in the
//! entity's entries, which must hold nothing of M any more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::FutureExt;
use outbox::embedded::{ManualClock, StoreEvent};
use outbox::ports::{Clock, EntityCommit, ExpectedVersion, IdSource, Store};
use outbox::protocol::{OutboxRecord, TxnId};
use outbox::time::Timestamp;
use serde_json::json;

use super::consumer::{
    check_count, check_counter, check_handler_runs, check_messages, check_retention, check_retention_of, counter_key,
    destination, incoming_txn_id, winner_copy, ActorFuture, End, Event, World, COUNTER, RETENTION, WRITER_ADDS,
};
use super::gate::ActorId;
use super::ports::GatedStore;

/// The consumer whose message the other writer's commit stands for.
const OTHER_CONSUMER: &str = "other";
/// That message's id.
const OTHER_MESSAGE: &str = "w-1";

/// The other writer in entity mode: reads the counter with its entries and adds 100 in
/// one conditional write carrying an entry of its own (another consumer's message), again
/// on a conflict, until it applied once; then removes its entry. Its write moves the
/// counter's version under a copy's read, so that the copy's commit fails its version
/// condition and its handler runs again; and its entry sits beside M's, which neither
/// side's write or removal may touch.
pub(super) fn writer(store: Arc<GatedStore>, clock: Arc<ManualClock>, ids: Arc<dyn IdSource>) -> ActorFuture {
    Box::pin(async move {
        let key = counter_key();
        let txn_id = TxnId::consumed(OTHER_CONSUMER, OTHER_MESSAGE);
        loop {
            let Ok(entity) = store.get_entity(&key).await else {
                continue;
            };
            let (count, expected) = match entity {
                Some(entity) => (
                    entity.item.data["count"].as_u64().expect("counters hold a count"),
                    ExpectedVersion::Exactly(entity.item.version),
                ),
                None => (0, ExpectedVersion::Absent),
            };
            let now = clock.now();
            let commit = EntityCommit {
                key: key.clone(),
                data: json!({ "count": count + WRITER_ADDS }),
                expected,
                entry: OutboxRecord::committed(txn_id, vec![], now, now.plus(RETENTION))
                    .by_attempt(ids.next_txn_id(now)),
                checks_fence: false,
                applied: None,
            };
            if store.commit_entity(&commit).await.is_ok() {
                break;
            }
        }
        while store.remove_entry(&key, txn_id).await.is_err() {}
        End::Writer
    })
}

/// Checks C1 to C4 after recovery in entity mode (C5 is checked at each
/// acknowledgement), then that no entry was left behind or brought back; returns the
/// copy whose attempt won, where known, and whether M's message went out again after
/// the TTL's start.
pub(super) fn check(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    writer: bool,
    changes_mind: bool,
) -> Result<(Option<usize>, bool), String> {
    let txn_id = incoming_txn_id();
    let history = world.backend.store.history();
    if changes_mind {
        return check_changed_mind(world, events, copy_of, writer, &history);
    }

    // C1: the counter changed once, by one conditional write carrying M's entry, and the
    // handler never ran in a round whose reads found M's entry or dedup record.
    check_counter(world, writer)?;
    if history
        .iter()
        .any(|event| matches!(event, StoreEvent::Committed { request, .. } if request.txn_id == txn_id))
    {
        return Err("entity mode: M was committed in a transaction, not in its entity".into());
    }
    let commits: Vec<(&EntityCommit, Timestamp)> = history
        .iter()
        .filter_map(|event| match event {
            StoreEvent::EntityCommitted { commit, at, .. } if commit.entry.txn_id == txn_id => {
                Some((commit.as_ref(), *at))
            }
            _ => None,
        })
        .collect();
    let [(winner, committed_at)] = commits.as_slice() else {
        return Err(format!(
            "C1 once in effect: M's entry was committed into {COUNTER} {} times",
            commits.len()
        ));
    };
    check_handler_runs(events, copy_of)?;
    let winner_copy = winner_copy(events, copy_of, winner.entry.attempt);

    // C2 and C3 on the entry's messages, then C4 on the dedup record.
    check_messages(world, &winner.entry.messages, *committed_at)?;
    let republished = check_retention(world, events, copy_of)?;

    check_entries(world, &history, txn_id)?;
    Ok((winner_copy, republished))
}

/// [`check`] for a handler that changes its mind (its first run counts M and emits, every
/// later run stages nothing): M's effect is one of two, never both, never half. Either
/// the counting run's write applied (at most one write of M's entry, holding its message):
/// the counter counts M once and that message, and only it, went out (C1 to C3); or it
/// never applied: the counter does not count M, nothing of M went out, and M's write, if
/// any, is the later run's (the entity as read, with an empty entry, blocking the counting
/// run's attempt). Then C4, and no entry left behind.
fn check_changed_mind(
    world: &World,
    events: &[Event],
    copy_of: &BTreeMap<ActorId, usize>,
    writer: bool,
    history: &[StoreEvent],
) -> Result<(Option<usize>, bool), String> {
    let txn_id = incoming_txn_id();
    let commits: Vec<(&EntityCommit, Timestamp)> = history
        .iter()
        .filter_map(|event| match event {
            StoreEvent::EntityCommitted { commit, at, .. } if commit.entry.txn_id == txn_id => {
                Some((commit.as_ref(), *at))
            }
            _ => None,
        })
        .collect();
    check_handler_runs(events, copy_of)?;
    let nothing = commits
        .first()
        .is_none_or(|(commit, _)| commit.entry.messages.is_empty());
    let winner_copy = match commits.as_slice() {
        [] | [(_, _)] if nothing => {
            check_count(world, writer, false)?;
            let sent = world.backend.publisher.queue(&destination()).expect("events").sent();
            if !sent.is_empty() {
                return Err(format!(
                    "C2/C3: M's effect was nothing (its counting run never applied), yet {} message(s) went out",
                    sent.len()
                ));
            }
            commits
                .first()
                .and_then(|(commit, _)| winner_copy(events, copy_of, commit.entry.attempt))
        }
        [(winner, committed_at)] => {
            check_count(world, writer, true)?;
            check_messages(world, &winner.entry.messages, *committed_at)?;
            winner_copy(events, copy_of, winner.entry.attempt)
        }
        _ => {
            return Err(format!(
                "C1 once in effect: M's entry was committed into {COUNTER} {} times (a run that changed its \
                 mind did not block the attempt before it)",
                commits.len()
            ))
        }
    };
    let republished = check_retention_of(world, events, copy_of, !nothing)?;
    check_entries(world, history, txn_id)?;
    Ok((winner_copy, republished))
}

/// The entity's entries: M's entry left the entity only once M's dedup record was there
/// (at every moment one of the two says M was applied), no removed entry ever came back
/// (a removal is undone only by a commit of the same transaction, and there is one), and
/// after recovery the entity holds none (M's, or the other writer's).
fn check_entries(world: &World, history: &[StoreEvent], txn_id: TxnId) -> Result<(), String> {
    let mut deduplicated: BTreeSet<TxnId> = BTreeSet::new();
    let mut removed: BTreeMap<TxnId, Timestamp> = BTreeMap::new();
    for event in history {
        match event {
            StoreEvent::MarkedDispatched { txn_id, .. } => {
                deduplicated.insert(*txn_id);
            }
            StoreEvent::EntryRemoved {
                txn_id: removed_id, at, ..
            } => {
                if *removed_id == txn_id && !deduplicated.contains(&txn_id) {
                    return Err(format!(
                        "entity mode: M's entry left {COUNTER} at {at} before M's dedup record was written: \
                         between the two nothing says M was applied, and a crash there applies it again"
                    ));
                }
                removed.insert(*removed_id, *at);
            }
            StoreEvent::EntityCommitted { commit, at, .. } => {
                if let Some(removed_at) = removed.get(&commit.entry.txn_id) {
                    return Err(format!(
                        "entity mode: the entry of {}, removed from {COUNTER} at {removed_at}, came back at {at}",
                        commit.entry.txn_id
                    ));
                }
            }
            _ => {}
        }
    }
    let key = counter_key();
    let entity = Store::get_entity(world.backend.store.as_ref(), &key)
        .now_or_never()
        .expect("the embedded store answers at once")
        .map_err(|error| format!("reading {COUNTER} failed: {error}"))?;
    let left: Vec<TxnId> = entity
        .map(|entity| entity.entries.into_keys().collect())
        .unwrap_or_default();
    if !left.is_empty() {
        return Err(format!(
            "entity mode: after recovery {COUNTER} still holds the entries of {left:?} (M's is {txn_id}): left behind"
        ));
    }
    Ok(())
}
