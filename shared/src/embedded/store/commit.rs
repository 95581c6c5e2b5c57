//! A commit of the transactional mode on the embedded table, checked as DynamoDB's
//! `TransactWriteItems` checks it: its size, one action per item, every condition (with a
//! reason per failed one, the deciding one reported), then applied all at once.

use std::collections::BTreeMap;

use super::history::StoreEvent;
use super::state::{idempotency_key, outbox_key, Item, State, MAX_ITEM_BYTES};
use super::EmbeddedStore;
use crate::ports::{BusinessWrite, CommitError, CommitRequest, ExpectedVersion};
use crate::protocol::{advance_chain, AppliedPositions, ChainHeads, OutboxRecord, OutboxState};
use crate::time::Timestamp;

/// DynamoDB's limit of actions in one `TransactWriteItems`.
const MAX_TRANSACTION_ACTIONS: usize = 100;
/// DynamoDB's 4 MB limit of one `TransactWriteItems`, less the margin the DynamoDB
/// adapter keeps for attribute names and overhead.
const MAX_TRANSACTION_BYTES: usize = 4_000_000 - 64 * 1024;

/// The first failed condition of a commit, in the order the protocol wants them
/// reported: a used idempotency key (the request may be a repeat, to replay), then a
/// tombstone, then a business conflict.
fn first_failure(reasons: Vec<CommitError>) -> Option<CommitError> {
    let rank = |error: &CommitError| match error {
        CommitError::IdempotencyKeyUsed { .. } => 0,
        CommitError::Tombstoned { .. } | CommitError::Superseded { .. } => 1,
        _ => 2,
    };
    reasons.into_iter().min_by_key(rank)
}

/// Applies `request` to `state` at `now` if every condition holds, all of it or nothing.
pub(super) fn apply(state: &mut State, request: &CommitRequest, now: Timestamp) -> Result<(), CommitError> {
    let outbox_key = outbox_key(request.txn_id);
    let idem_key = request.idempotency.as_ref().map(|record| idempotency_key(&record.slot));

    let actions = request.writes.len() + 1 + usize::from(idem_key.is_some());
    if actions > MAX_TRANSACTION_ACTIONS {
        return Err(CommitError::TooLarge {
            reason: format!("{actions} actions, at most {MAX_TRANSACTION_ACTIONS}"),
        });
    }
    let bytes: usize = request
        .outbox
        .messages
        .iter()
        .map(|m| serde_json::to_string(m).map_or(0, |json| json.len()))
        .sum::<usize>()
        + request
            .writes
            .iter()
            .map(|write| match write {
                BusinessWrite::Put { data, .. } => data.to_string().len(),
                _ => 0,
            })
            .sum::<usize>();
    if bytes > MAX_TRANSACTION_BYTES {
        return Err(CommitError::TooLarge {
            reason: format!("about {bytes} bytes, at most {MAX_TRANSACTION_BYTES}"),
        });
    }
    // As DynamoDB refuses a request that would leave an item over its limit, before any
    // condition: a put's data with the entries the item keeps.
    for write in &request.writes {
        let BusinessWrite::Put { key, data, .. } = write else {
            continue;
        };
        let entries = match EmbeddedStore::live(state, key.as_str(), now) {
            Some(Item::Business { entries, .. }) => entries
                .values()
                .map(|entry| serde_json::to_string(entry).map_or(0, |json| json.len()))
                .sum::<usize>(),
            _ => 0,
        };
        let bytes = data.to_string().len() + entries;
        if bytes > MAX_ITEM_BYTES {
            return Err(CommitError::Invalid {
                reason: format!(
                    "item {key} would be about {bytes} bytes, over the item size limit of {MAX_ITEM_BYTES}"
                ),
            });
        }
    }
    let mut keys: Vec<&str> = request.writes.iter().map(|write| write.key().as_str()).collect();
    keys.push(&outbox_key);
    keys.extend(idem_key.as_deref());
    keys.sort_unstable();
    if keys.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(CommitError::Invalid {
            reason: "two actions on one item".into(),
        });
    }

    let mut reasons = Vec::new();
    match EmbeddedStore::live(state, &outbox_key, now) {
        None => {}
        // This transaction's own record: an earlier attempt applied. The commit is
        // atomic, so that attempt wrote everything; report success.
        Some(Item::Outbox(record)) if request.outbox.is_own(record) => return Ok(()),
        // A rival attempt's (a consumed message's record, written by another copy).
        Some(Item::Outbox(record)) if record.state != OutboxState::Tombstone => {
            reasons.push(CommitError::Superseded { txn_id: request.txn_id })
        }
        Some(_) => reasons.push(CommitError::Tombstoned { txn_id: request.txn_id }),
    }
    for write in &request.writes {
        let item = EmbeddedStore::live(state, write.key().as_str(), now);
        let (live, version) = item.and_then(Item::key_version).unwrap_or((false, 0));
        let holds_entries = matches!(item, Some(Item::Business { entries, .. }) if !entries.is_empty());
        let expected = match write {
            BusinessWrite::Put { expected, .. } | BusinessWrite::Check { expected, .. } => *expected,
            BusinessWrite::Delete { version, .. } => ExpectedVersion::Exactly(*version),
        };
        // A delete would drop the entries of commits in entity mode that are still to
        // be dispatched: it waits until they are removed, and is tried again (a put
        // keeps them).
        if holds_entries && matches!(write, BusinessWrite::Delete { .. }) {
            return Err(CommitError::Contention(
                "the item holds outbox entries still to be dispatched".into(),
            ));
        }
        if !expected.holds(live, version) {
            reasons.push(CommitError::VersionConflict {
                key: write.key().clone(),
            });
        }
    }
    if let (Some(key), Some(record)) = (&idem_key, &request.idempotency) {
        if EmbeddedStore::live(state, key, now).is_some() {
            reasons.push(CommitError::IdempotencyKeyUsed {
                slot: record.slot.clone(),
            });
        }
    }
    if let Some(error) = first_failure(reasons) {
        return Err(error);
    }

    let mut versions = BTreeMap::new();
    for write in &request.writes {
        match write {
            BusinessWrite::Put { key, data, .. } => {
                // An update of an existing item keeps its entries and its fence mark; a
                // create keeps the mark a vacant key held and continues its version. Both
                // move the chain heads past the messages positioned in it.
                let (version, entries, fence, sent, mut heads, applied) = match state.items.remove(key.as_str()) {
                    Some(Item::Business {
                        version,
                        entries,
                        fence,
                        sent,
                        heads,
                        applied,
                        ..
                    }) => (version, entries, fence, sent, heads, applied),
                    Some(Item::Vacant {
                        fence,
                        version,
                        heads,
                        applied,
                    }) => (version, BTreeMap::new(), fence, BTreeMap::new(), heads, applied),
                    _ => (
                        0,
                        BTreeMap::new(),
                        None,
                        BTreeMap::new(),
                        ChainHeads::new(),
                        AppliedPositions::new(),
                    ),
                };
                advance_chain(&mut heads, key, &request.outbox.messages);
                let item = Item::Business {
                    version: version + 1,
                    json: data.to_string().into_boxed_str(),
                    entries,
                    fence,
                    sent,
                    heads,
                    applied,
                };
                versions.insert(key.clone(), version + 1);
                state.insert(key.as_str().to_owned(), item);
            }
            // A deleted item leaves its key vacant at the next version, keeping its fence
            // mark and its chain heads: a create continues the version (so a late attempt
            // expecting a version of this life never applies to a later one) and the
            // chains, and a late commit of a transaction fenced in it meets the mark
            // again. Its sent marks move to their transactions' records, in the same
            // commit, so that no proof of a commit leaves with the item.
            BusinessWrite::Delete { key, .. } => {
                if let Some(Item::Business {
                    version,
                    fence,
                    sent,
                    mut heads,
                    applied,
                    ..
                }) = state.items.remove(key.as_str())
                {
                    advance_chain(&mut heads, key, &request.outbox.messages);
                    let vacant = Item::Vacant {
                        fence,
                        version: version + 1,
                        heads,
                        applied,
                    };
                    versions.insert(key.clone(), version + 1);
                    state.insert(key.as_str().to_owned(), vacant);
                    for (txn_id, expires_at) in sent {
                        let record = OutboxRecord::committed(txn_id, Vec::new(), now, expires_at);
                        state.insert(txn_id.record_key(), Item::Outbox(Box::new(record)));
                        state.record(|| StoreEvent::MarkedDispatched { txn_id, at: now });
                    }
                }
            }
            BusinessWrite::Check { .. } => {}
        }
    }
    state.insert(outbox_key, Item::Outbox(Box::new(request.outbox.clone())));
    if let (Some(key), Some(record)) = (idem_key, &request.idempotency) {
        state.insert(key, Item::Idempotency(Box::new(record.clone())));
    }
    state.record(|| StoreEvent::Committed {
        request: Box::new(request.clone()),
        versions,
        at: now,
    });
    Ok(())
}
