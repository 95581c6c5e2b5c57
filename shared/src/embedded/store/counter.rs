//! Counter commits on the embedded table ([`crate::counter`]): under the table's lock the
//! item as it is *is* the item as it was, so the additions, the stamp and the entity
//! commit conditioned on the version just seen are one step, and never conflict.

use super::{entity, EmbeddedStore, Item, State};
use crate::counter::{apply_all, stamp, CounterCommit, CounterCommitted, CounterError};
use crate::earlier::{entries_before, pending_entries};
use crate::ports::{CommitError, EntityCommit, ExpectedVersion};
use crate::protocol::{OutboxRecord, Producer};
use crate::time::Timestamp;

/// The values of `commit`'s fields in data `json` (a retry reports them as they are now).
fn values_now(commit: &CounterCommit, json: &str) -> std::collections::BTreeMap<String, i64> {
    let data: serde_json::Value = serde_json::from_str(json).expect("the store wrote this JSON itself");
    commit
        .adds
        .iter()
        .filter_map(|add| {
            data.get(&add.field)
                .and_then(serde_json::Value::as_i64)
                .map(|value| (add.field.clone(), value))
        })
        .collect()
}

/// Applies `commit` to the table, in the order DynamoDB's failed condition is judged: an
/// entry (or sent mark) of its transaction first, then the fence, the item, the bounds.
pub(super) fn commit(
    state: &mut State,
    commit: &CounterCommit,
    now: Timestamp,
    producer: &Producer,
) -> Result<CounterCommitted, CounterError> {
    let txn_id = commit.entry.txn_id;
    let Some(Item::Business {
        version,
        json,
        entries,
        fence,
        sent,
        heads,
        ..
    }) = EmbeddedStore::live(state, commit.key.as_str(), now)
    else {
        return Err(CounterError::Missing {
            key: commit.key.clone(),
        });
    };
    if let Some(found) = entries.get(&txn_id) {
        return if commit.entry.is_own(found) {
            Ok(CounterCommitted {
                version: *version,
                values: values_now(commit, json),
                messages: found.messages.clone(),
                earlier: entries_before(entries.values(), found),
            })
        } else {
            Err(CommitError::Superseded { txn_id }.into())
        };
    }
    // Its entry settled already: the commit applied, its messages are sent.
    if sent.contains_key(&txn_id) {
        return Ok(CounterCommitted {
            version: *version,
            values: values_now(commit, json),
            messages: Vec::new(),
            earlier: Vec::new(),
        });
    }
    if commit.checks_fence && fence.is_some_and(|fence| fence >= txn_id) {
        return Err(CommitError::EntityFenced { txn_id }.into());
    }
    let mut data: serde_json::Value = serde_json::from_str(json).expect("the store wrote this JSON itself");
    let values = apply_all(&commit.adds, &mut data)?;
    let messages = stamp(&commit.key, *version, heads, &commit.entry.messages, Some(producer));
    let earlier = pending_entries(entries.values(), txn_id);
    let version = *version;
    let entity_commit = EntityCommit {
        key: commit.key.clone(),
        data,
        expected: ExpectedVersion::Exactly(version),
        entry: OutboxRecord {
            messages: messages.clone(),
            ..commit.entry.clone()
        },
        checks_fence: commit.checks_fence,
        applied: None,
    };
    entity::commit(state, &entity_commit, now)?;
    Ok(CounterCommitted {
        version: version + 1,
        values,
        messages,
        earlier,
    })
}
