//! Counter commits on DynamoDB ([`crate::counter`]): one `UpdateItem` that reads nothing
//! first. Every right-hand side of an update is evaluated on the item as it was, so the
//! write adds to the counters, moves the version (`version = version + 1`) and each chain
//! head its messages go to (`head.seq = head.seq + n`, `head.version = version + 1`,
//! `head.txn = T`), and keeps, beside the entry, what the stamp counts from: the version
//! before (`outbox_placed:T`) and a copy of each head before (`outbox_placed:T:i`, the
//! i-th destination in emission order). The entry is written with its messages
//! unplaced; every read of the entries ([`place`], called by `entries_of`) stamps them
//! from what was kept, with [`crate::counter::stamp`], and the writer stamps them the same
//! way from the old item the write returns (`ALL_OLD`).
//!
//! The condition: the item live with its map of entries, no entry nor sent mark of T (a
//! repeat of an applied write adds nothing), the fence mark below T (the request path),
//! each head there, and the bounds. Where it fails, the old item decides: T's own entry is
//! success, the fence or a bound refuses, and an item without a head or a map yet (its
//! first message to a destination, an item of the transactional mode) gets one ordinary
//! entity commit stamped from that old item and conditioned on its version; if another
//! write moved the version meanwhile, the counter form is tried again.
//!
//! Settling or removing the entry removes what was kept with it.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::aws::item::{business_from_item, n, s, Item, Reader};
use crate::counter::{apply_all, chains_of, stamp, CounterCommit, CounterCommitted, CounterError};
use crate::earlier::{entries_before, pending_entries};
use crate::ports::{CommitError, EntityCommit, ExpectedVersion, ItemKey, StoreError};
use crate::protocol::{ChainHead, ChainHeads, OutboxRecord, TxnId};
use crate::settings::TableLayout;

use super::branches::{reached, Branch};
use super::chain::heads_of;
use super::entity::{commit_error, condition_failed};
use super::entity_attributes::{entries_of, fence_of, sent_of, FENCE_ATTRIBUTE, OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE};
use super::{producer_of, DynamoStore};

/// The most destinations one counter commit sends to: settling its entry removes that
/// many copies of heads without knowing how many there were.
pub(crate) const MAX_CHAINS: usize = 4;

/// How many times a counter commit meets a version moved under its ordinary form before
/// it reports contention.
const ATTEMPTS: usize = 8;

/// The prefix of what a counter commit keeps beside its entry.
const PLACED_PREFIX: &str = "outbox_placed:";

/// The attribute that keeps the version T's counter commit found.
pub(crate) fn placed_version(txn_id: TxnId) -> String {
    format!("{PLACED_PREFIX}{txn_id}")
}

/// The attribute that keeps the head of T's `index`-th chain as T found it.
pub(crate) fn placed_head(txn_id: TxnId, index: usize) -> String {
    format!("{PLACED_PREFIX}{txn_id}:{index}")
}

/// The attributes to remove with T's entry.
pub(crate) fn placed_attributes(txn_id: TxnId) -> impl Iterator<Item = String> {
    std::iter::once(placed_version(txn_id)).chain((0..MAX_CHAINS).map(move |index| placed_head(txn_id, index)))
}

/// Stamps the messages of each entry of `item` that a counter commit wrote, from what it
/// kept beside the entry; other entries are left as they are.
pub(crate) fn place(
    layout: &TableLayout,
    item: &Item,
    entries: &mut BTreeMap<TxnId, OutboxRecord>,
) -> Result<(), StoreError> {
    let reader = Reader::new(layout, item);
    for (txn_id, entry) in entries.iter_mut() {
        let Some(version) = item.get(&placed_version(*txn_id)) else {
            continue;
        };
        let version: u64 = version
            .as_n()
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| reader.corrupt(format!("the place kept for {txn_id} is not a number")))?;
        let key: ItemKey = layout
            .logical_key(item)
            .and_then(|key| key.parse().ok())
            .ok_or_else(|| reader.corrupt("the item names no key"))?;
        let mut heads = ChainHeads::new();
        for (index, (destination, _)) in chains_of(&entry.messages).into_iter().enumerate() {
            let name = placed_head(*txn_id, index);
            let head = item
                .get(&name)
                .ok_or_else(|| reader.corrupt(format!("{name} is missing")))?;
            heads.insert(destination, head_of(&reader, &name, head)?);
        }
        entry.messages = stamp(&key, version, &heads, &entry.messages, producer_of(layout).as_ref());
    }
    Ok(())
}

/// A head as stored (see [`super::chain`]), read back.
fn head_of(reader: &Reader<'_>, name: &str, value: &AttributeValue) -> Result<ChainHead, StoreError> {
    let fields = super::chain::map_of(reader, name, value)?;
    let number = |field: &str| super::chain::whole_number(reader, name, fields, field);
    let txn = match fields.get("txn") {
        None => None,
        Some(value) => Some(
            value
                .as_s()
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| reader.corrupt(format!("{name:?} has a txn that is no transaction id")))?,
        ),
    };
    Ok(ChainHead {
        seq: number("seq")?,
        version: number("version")?,
        txn,
    })
}

/// What the old item returned by a failed condition says.
enum Verdict {
    Done(Result<CounterCommitted, CounterError>),
    /// The counter form cannot apply to this item as it is (no map, no head yet): one
    /// ordinary commit stamped from it.
    Ordinary(Item),
}

/// The values of `commit`'s fields in `item`'s data.
fn values_in(layout: &TableLayout, commit: &CounterCommit, item: &Item) -> BTreeMap<String, i64> {
    let Ok(Some(live)) = business_from_item(layout, &commit.key, item) else {
        return BTreeMap::new();
    };
    commit
        .adds
        .iter()
        .filter_map(|add| {
            live.data
                .get(&add.field)
                .and_then(serde_json::Value::as_i64)
                .map(|value| (add.field.clone(), value))
        })
        .collect()
}

fn judge(layout: &TableLayout, commit: &CounterCommit, old: Option<Item>) -> Verdict {
    let txn_id = commit.entry.txn_id;
    let missing = || {
        reached(Branch::CounterMissing);
        Verdict::Done(Err(CounterError::Missing {
            key: commit.key.clone(),
        }))
    };
    let Some(old) = old else { return missing() };
    let version = Reader::new(layout, &old).version().unwrap_or(0);
    let entries = match entries_of(layout, &old) {
        Ok(entries) => entries,
        Err(error) => return Verdict::Done(Err(CommitError::Ambiguous(Box::new(error)).into())),
    };
    if let Some(found) = entries.get(&txn_id) {
        return Verdict::Done(if commit.entry.is_own(found) {
            reached(Branch::CounterOwnEntry);
            Ok(CounterCommitted {
                version,
                values: values_in(layout, commit, &old),
                messages: found.messages.clone(),
                earlier: entries_before(entries.values(), found),
            })
        } else {
            Err(CommitError::Superseded { txn_id }.into())
        });
    }
    if sent_of(layout, &old).is_ok_and(|sent| sent.contains_key(&txn_id)) {
        reached(Branch::CounterSentMark);
        return Verdict::Done(Ok(CounterCommitted {
            version,
            values: values_in(layout, commit, &old),
            messages: Vec::new(),
            earlier: Vec::new(),
        }));
    }
    match fence_of(layout, &old) {
        Ok(Some(fence)) if commit.checks_fence && fence >= txn_id => {
            reached(Branch::CounterFenced);
            return Verdict::Done(Err(CommitError::EntityFenced { txn_id }.into()));
        }
        Ok(_) => {}
        Err(error) => return Verdict::Done(Err(CommitError::Ambiguous(Box::new(error)).into())),
    }
    let Ok(Some(live)) = business_from_item(layout, &commit.key, &old) else {
        return missing();
    };
    let mut data = live.data;
    if let Err(refusal) = apply_all(&commit.adds, &mut data) {
        reached(Branch::CounterBoundRefused);
        return Verdict::Done(Err(refusal.into()));
    }
    reached(Branch::CounterOrdinaryForm);
    Verdict::Ordinary(old)
}

impl DynamoStore {
    pub(super) async fn write_counter(&self, commit: &CounterCommit) -> Result<CounterCommitted, CounterError> {
        let chains = chains_of(&commit.entry.messages);
        if chains.len() > MAX_CHAINS {
            return Err(CommitError::Invalid {
                reason: format!("a counter commit sends to at most {MAX_CHAINS} destinations"),
            }
            .into());
        }
        if commit.entry.messages.iter().any(|message| message.position.is_some()) {
            return Err(CommitError::Invalid {
                reason: "a counter commit's messages are placed by the store".into(),
            }
            .into());
        }
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let old = match self.counter_update(commit, &chains).await? {
                Verdict::Done(result) => return result,
                Verdict::Ordinary(old) => old,
            };
            match self.ordinary(commit, &old).await {
                Err(CounterError::Commit(CommitError::VersionConflict { key })) => {
                    reached(Branch::CounterVersionMoved);
                    last = Some(CommitError::VersionConflict { key });
                }
                done => return done,
            }
        }
        Err(CommitError::Contention(Box::new(last.expect("at least one attempt"))).into())
    }

    /// The counter form: adds, moves the version and the heads, keeps the places.
    async fn counter_update(
        &self,
        commit: &CounterCommit,
        chains: &[(crate::protocol::DestinationName, u64)],
    ) -> Result<Verdict, CounterError> {
        let txn_id = commit.entry.txn_id;
        let entry = serde_json::to_string(&commit.entry).map_err(|error| CommitError::Invalid {
            reason: format!("the outbox entry cannot be written: {error}"),
        })?;
        let mut names = HashMap::from([
            ("#data".to_owned(), "data".to_owned()),
            ("#version".to_owned(), "version".to_owned()),
            ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
            ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
            ("#txn".to_owned(), txn_id.to_string()),
            ("#placed".to_owned(), placed_version(txn_id)),
            ("#seq".to_owned(), "seq".to_owned()),
            ("#htxn".to_owned(), "txn".to_owned()),
        ]);
        let mut values = HashMap::from([
            (":one".to_owned(), n(1)),
            (":entry".to_owned(), s(entry)),
            (":txnid".to_owned(), s(txn_id.to_string())),
        ]);
        let mut sets = vec![
            "#version = #version + :one".to_owned(),
            "#outbox.#txn = :entry".to_owned(),
            "#placed = #version".to_owned(),
        ];
        let mut conditions = vec![
            "attribute_exists(#data)".to_owned(),
            "attribute_exists(#outbox)".to_owned(),
            "attribute_not_exists(#outbox.#txn)".to_owned(),
            "attribute_not_exists(#sent.#txn)".to_owned(),
        ];
        for (index, add) in commit.adds.iter().enumerate() {
            names.insert(format!("#f{index}"), add.field.clone());
            values.insert(format!(":d{index}"), n(add.delta));
            sets.push(format!("#data.#f{index} = #data.#f{index} + :d{index}"));
            conditions.push(format!("attribute_exists(#data.#f{index})"));
            if let Some(lowest) = add.lowest_before() {
                values.insert(format!(":lo{index}"), n(lowest));
                conditions.push(format!("#data.#f{index} >= :lo{index}"));
            }
            if let Some(highest) = add.highest_before() {
                values.insert(format!(":hi{index}"), n(highest));
                conditions.push(format!("#data.#f{index} <= :hi{index}"));
            }
        }
        for (index, (destination, count)) in chains.iter().enumerate() {
            names.insert(
                format!("#chain{index}"),
                format!("{}{}", super::chain::CHAIN_PREFIX, destination.as_str()),
            );
            names.insert(format!("#placed{index}"), placed_head(txn_id, index));
            values.insert(format!(":n{index}"), n(count));
            sets.push(format!("#placed{index} = #chain{index}"));
            sets.push(format!("#chain{index}.#seq = #chain{index}.#seq + :n{index}"));
            sets.push(format!("#chain{index}.#version = #version + :one"));
            sets.push(format!("#chain{index}.#htxn = :txnid"));
            conditions.push(format!("attribute_exists(#chain{index})"));
        }
        if commit.checks_fence {
            names.insert("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned());
            conditions.push("(attribute_not_exists(#fence) OR #fence < :txnid)".to_owned());
        }
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(commit.key.as_str())))
            .update_expression(format!("SET {}", sets.join(", ")))
            .condition_expression(conditions.join(" AND "))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .customize()
            .config_override(super::entity::one_request())
            .send()
            .await;
        match result {
            Ok(output) => {
                let old = output.attributes.unwrap_or_default();
                let reader = Reader::new(&self.layout, &old);
                let version = reader.version().unwrap_or(0);
                let heads = heads_of(&self.layout, &old).map_err(|error| CommitError::Ambiguous(Box::new(error)))?;
                let messages = stamp(
                    &commit.key,
                    version,
                    &heads,
                    &commit.entry.messages,
                    producer_of(&self.layout).as_ref(),
                );
                let earlier = entries_of(&self.layout, &old)
                    .map(|entries| pending_entries(entries.values(), commit.entry.txn_id))
                    .map_err(|error| CommitError::Ambiguous(Box::new(error)))?;
                let values = values_in(&self.layout, commit, &old)
                    .into_iter()
                    .map(|(field, value)| {
                        let delta = commit
                            .adds
                            .iter()
                            .find(|add| add.field == field)
                            .map_or(0, |add| add.delta);
                        (field, value + delta)
                    })
                    .collect();
                Ok(Verdict::Done(Ok(CounterCommitted {
                    version: version + 1,
                    values,
                    messages,
                    earlier,
                })))
            }
            Err(error) => match condition_failed(&error) {
                Some(Some(old)) => Ok(judge(&self.layout, commit, Some(old))),
                Some(None) => {
                    // From an engine that leaves the old item out: read it.
                    reached(Branch::CounterOldItemRead);
                    let old = self
                        .read_raw(&commit.key)
                        .await
                        .map_err(|error| CommitError::Ambiguous(Box::new(error)))?;
                    Ok(judge(&self.layout, commit, old))
                }
                None => {
                    reached(Branch::FailCounterUpdate);
                    Err(commit_error(error).into())
                }
            },
        }
    }

    /// One ordinary entity commit of `commit`, stamped from `old` and conditioned on its
    /// version.
    async fn ordinary(&self, commit: &CounterCommit, old: &Item) -> Result<CounterCommitted, CounterError> {
        let live = business_from_item(&self.layout, &commit.key, old)
            .map_err(|error| CommitError::Ambiguous(Box::new(error)))?
            .ok_or_else(|| CounterError::Missing {
                key: commit.key.clone(),
            })?;
        let heads = heads_of(&self.layout, old).map_err(|error| CommitError::Ambiguous(Box::new(error)))?;
        let mut data = live.data;
        let values = apply_all(&commit.adds, &mut data)?;
        let messages = stamp(
            &commit.key,
            live.version,
            &heads,
            &commit.entry.messages,
            producer_of(&self.layout).as_ref(),
        );
        let earlier = entries_of(&self.layout, old)
            .map(|entries| pending_entries(entries.values(), commit.entry.txn_id))
            .map_err(|error| CommitError::Ambiguous(Box::new(error)))?;
        let entity_commit = EntityCommit {
            key: commit.key.clone(),
            data: data.clone(),
            expected: ExpectedVersion::Exactly(live.version),
            entry: OutboxRecord {
                messages: messages.clone(),
                ..commit.entry.clone()
            },
            checks_fence: commit.checks_fence,
            applied: None,
        };
        self.write_entity(&entity_commit).await?;
        Ok(CounterCommitted {
            version: live.version + 1,
            values,
            messages,
            earlier,
        })
    }
}
