//! The entity mode on DynamoDB (docs/PROTOCOL.md section 11): an item's outbox entries live in
//! its map attribute `outbox` (transaction id to the record as JSON), a commit is one
//! conditional `UpdateItem` (of a live item, or creating one over an absent or vacant key),
//! and a removal is an `UpdateItem` that removes one entry and nothing else.
//!
//! An item is live while it has `data`; a vacant key keeps its version, and a create
//! continues it (`if_not_exists(version, 0) + 1`), so that versions never restart.
//!
//! The update sets the data, the version and `outbox.T` only, so an entry removed
//! meanwhile is never brought back and no other entry is rewritten. DynamoDB cannot set
//! `outbox.T` where the item has no map yet (an item written in the transactional mode):
//! that item gets its first map in a second form of the update, conditioned on the map's
//! absence, chosen from the old item the first form's failed condition returns.
//!
//! Every form also sets the heads of the item's chains that the entry's messages move
//! (`chain:<destination>`, [`super::chain`]), under the condition on the version they were
//! stamped against.
//!
//! A commit of the request path is also conditioned on the item's fence mark
//! (`outbox_fence`, [`super::fence`]) being below its transaction, and reserves the mark's
//! room (`if_not_exists`), so that a fence never grows the item.

use std::collections::HashMap;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use crate::aws::item::{business_from_item, dispatched_item, n, s, to_attribute, Item, Reader};
use crate::aws::size::value_bytes;
use crate::ports::{CommitError, EntityCommit, EntityItem, ExpectedVersion, ItemKey, StoreError};
use crate::protocol::{OutboxRecord, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

use super::applied::{self, applied_of};
use super::branches::{reached, Branch};
use super::chain::ChainSets;
use super::counter::placed_attributes;
use super::entity_attributes::{
    entries_of, fence_of, sent_of, FENCE_ATTRIBUTE, NO_FENCE, OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE,
};
use super::{unavailable, DynamoStore};

/// DynamoDB's 400 KB item limit.
const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Which update a commit sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Adds `outbox.T` to the item's map.
    IntoMap,
    /// Gives the item its first map, holding only `T`.
    NewMap,
    /// Creates the item (where it has no data: absent, or a vacant key keeping its version
    /// and fence mark, which the item continues and keeps), its map holding only `T`.
    Create,
}

/// What every form of one commit writes: the data, the entry, and the chain heads its
/// messages positioned in the item move.
#[derive(Clone, Copy)]
struct Write<'a> {
    data: &'a AttributeValue,
    entry: &'a AttributeValue,
    chain: &'a ChainSets,
}

/// What the old item returned by a failed condition says.
enum Verdict {
    Decided(Result<(), CommitError>),
    /// The item is as expected but has no map yet.
    NeedsMap,
}

fn entry_value(entry: &OutboxRecord) -> Result<AttributeValue, CommitError> {
    serde_json::to_string(entry)
        .map(s)
        .map_err(|error| CommitError::Invalid {
            reason: format!("the outbox entry cannot be written: {error}"),
        })
}

/// The decision an item as it was (`old`, absent if the item is gone) gives a commit
/// whose condition failed.
fn judge(layout: &TableLayout, commit: &EntityCommit, old: Option<&Item>) -> Verdict {
    let txn_id = commit.entry.txn_id;
    let conflict = || {
        Verdict::Decided(Err(CommitError::VersionConflict {
            key: commit.key.clone(),
        }))
    };
    let Some(old) = old else { return conflict() };
    match entries_of(layout, old) {
        Ok(entries) => {
            if let Some(found) = entries.get(&txn_id) {
                return Verdict::Decided(if commit.entry.is_own(found) {
                    reached(Branch::EntityOwnEntry);
                    Ok(())
                } else {
                    reached(Branch::EntityRivalEntry);
                    Err(CommitError::Superseded { txn_id })
                });
            }
        }
        // An entry nobody can read may be this very attempt's: whether it applied is
        // unknown.
        Err(error) => return Verdict::Decided(Err(CommitError::Ambiguous(Box::new(error)))),
    }
    match fence_of(layout, old) {
        Ok(Some(fence)) if commit.checks_fence && fence >= txn_id => {
            reached(Branch::EntityFenced);
            return Verdict::Decided(Err(CommitError::EntityFenced { txn_id }));
        }
        Ok(_) => {}
        Err(error) => return Verdict::Decided(Err(CommitError::Ambiguous(Box::new(error)))),
    }
    let version = Reader::new(layout, old).version();
    match commit.expected {
        ExpectedVersion::Exactly(expected)
            if old.contains_key("data") && version == Some(expected) && !old.contains_key(OUTBOX_ATTRIBUTE) =>
        {
            Verdict::NeedsMap
        }
        _ => conflict(),
    }
}

/// The old item an `UpdateItem` whose condition failed returned (`Some(None)`: the engine
/// left it out, or there was none); `None` for any other error.
pub(super) fn condition_failed<R>(error: &SdkError<UpdateItemError, R>) -> Option<Option<Item>> {
    match error {
        SdkError::ServiceError(service) => match service.err() {
            UpdateItemError::ConditionalCheckFailedException(failed) => Some(failed.item().cloned()),
            _ => None,
        },
        _ => None,
    }
}

/// A failed write's error, as the commit reports it.
pub(super) fn commit_error<E, R>(error: SdkError<E, R>) -> CommitError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &error {
        SdkError::ServiceError(service) => match service.err().code() {
            // Another transaction holds the item, or capacity ran out: nothing written.
            Some(
                "TransactionConflictException"
                | "ThrottlingException"
                | "ProvisionedThroughputExceededException"
                | "RequestLimitExceeded",
            ) => CommitError::Contention(Box::new(error)),
            Some("ValidationException") => {
                let message = service.err().message().unwrap_or("DynamoDB refused the write");
                if message.contains("size") {
                    CommitError::TooLarge {
                        reason: message.to_owned(),
                    }
                } else {
                    CommitError::Invalid {
                        reason: message.to_owned(),
                    }
                }
            }
            Some("ResourceNotFoundException" | "AccessDeniedException" | "UnrecognizedClientException") => {
                CommitError::Unavailable(Box::new(error))
            }
            // An internal error may or may not have applied the write.
            _ => CommitError::Ambiguous(Box::new(error)),
        },
        SdkError::ConstructionFailure(_) => CommitError::Invalid {
            reason: "the request could not be built".into(),
        },
        // Sent, or maybe sent: a timeout, a lost connection, an unreadable reply.
        _ => CommitError::Ambiguous(Box::new(error)),
    }
}

/// The clauses (each after `, `) that remove what a counter commit of T kept beside its
/// entry ([`super::counter`]), with their names; removing what is not there is harmless.
fn placed_removals(names: &mut HashMap<String, String>, txn_id: TxnId) -> String {
    placed_attributes(txn_id)
        .enumerate()
        .map(|(index, attribute)| {
            names.insert(format!("#placed{index}"), attribute);
            format!(", #placed{index}")
        })
        .collect()
}

/// One request per call, as for the transactional commit: the SDK would retry a request
/// that timed out and report only the last one's error (docs/PROTOCOL.md section 3).
pub(super) fn one_request() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled())
}

impl DynamoStore {
    pub(super) async fn read_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        let Some(item) = self.read_raw(key).await? else {
            return Ok(None);
        };
        let Some(business) = business_from_item(&self.layout, key, &item)? else {
            return Ok(None);
        };
        Ok(Some(EntityItem {
            item: business,
            entries: entries_of(&self.layout, &item)?,
            fence: fence_of(&self.layout, &item)?,
            sent: sent_of(&self.layout, &item)?,
            applied: applied_of(&self.layout, &item)?,
        }))
    }

    pub(super) async fn write_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        commit.check_entry()?;
        let entry = entry_value(&commit.entry)?;
        let data = to_attribute(&commit.data);
        let chain = ChainSets::new(&commit.key, &commit.entry.messages);
        let applied_bytes = commit.applied.as_ref().map_or(0, |(name, applied)| {
            applied::attribute(name).len() + value_bytes(&applied::value(*applied))
        });
        let bytes =
            commit.data.to_string().len() + entry.as_s().map_or(0, String::len) + chain.stored_bytes() + applied_bytes;
        if bytes > MAX_ITEM_BYTES {
            return Err(CommitError::TooLarge {
                reason: format!(
                    "item {} would be about {bytes} bytes with its outbox entry, at most {MAX_ITEM_BYTES}",
                    commit.key
                ),
            });
        }
        let write = Write {
            data: &data,
            entry: &entry,
            chain: &chain,
        };
        let verdict = match commit.expected {
            ExpectedVersion::Absent | ExpectedVersion::AbsentAt(_) => self.update(commit, Form::Create, write).await?,
            ExpectedVersion::Exactly(_) => match self.update(commit, Form::IntoMap, write).await? {
                Verdict::NeedsMap => {
                    reached(Branch::EntityNewMap);
                    self.update(commit, Form::NewMap, write).await?
                }
                decided => decided,
            },
        };
        match verdict {
            Verdict::Decided(result) => result,
            // The map appeared between the two forms: the item changed, so its version did.
            Verdict::NeedsMap => Err(CommitError::VersionConflict {
                key: commit.key.clone(),
            }),
        }
    }

    /// The data, the version, the entry and the chain heads it moves, in `form`; the fence
    /// mark kept (its room reserved where the item has none) and, for the request path,
    /// checked.
    async fn update(&self, commit: &EntityCommit, form: Form, write: Write<'_>) -> Result<Verdict, CommitError> {
        let Write { data, entry, chain } = write;
        let txn = commit.entry.txn_id.to_string();
        let mut names = HashMap::from([
            ("#data".to_owned(), "data".to_owned()),
            ("#version".to_owned(), "version".to_owned()),
            ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
            ("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned()),
            ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
        ]);
        let mut values = HashMap::from([
            (":data".to_owned(), data.clone()),
            (":zero".to_owned(), n(0)),
            (":one".to_owned(), n(1)),
            (":nofence".to_owned(), s(NO_FENCE.to_owned())),
            (":nosent".to_owned(), AttributeValue::M(HashMap::new())),
        ]);
        // The version the item must be at: live (the first two forms), or vacant (a
        // create, where it names one; a vacant key written before versions were kept
        // across deletes has none, which is version 0).
        let at_version = match commit.expected {
            ExpectedVersion::Absent => "",
            ExpectedVersion::AbsentAt(0) => " AND attribute_not_exists(#version)",
            ExpectedVersion::AbsentAt(version) | ExpectedVersion::Exactly(version) => {
                values.insert(":expected".to_owned(), n(version));
                " AND #version = :expected"
            }
        };
        names.extend(chain.names());
        values.extend(chain.values());
        // An in-order consumer's position, moved in the same write, and only up (one
        // moved alone by another copy leaves the version as it was).
        let (applied_set, applied_condition) = match &commit.applied {
            Some((name, applied)) => {
                names.insert("#applied".to_owned(), applied::attribute(name));
                names.insert("#seq".to_owned(), "seq".to_owned());
                values.insert(":applied".to_owned(), applied::value(*applied));
                values.insert(":seq".to_owned(), n(applied.seq));
                (
                    ", #applied = :applied",
                    " AND (attribute_not_exists(#applied) OR #applied.#seq < :seq)",
                )
            }
            None => ("", ""),
        };
        let (update, mut condition) = match form {
            Form::IntoMap => {
                names.insert("#txn".to_owned(), txn);
                values.insert(":entry".to_owned(), entry.clone());
                (
                    "SET #data = :data, #version = if_not_exists(#version, :zero) + :one, #outbox.#txn = :entry, #fence = if_not_exists(#fence, :nofence), #sent = if_not_exists(#sent, :nosent)",
                    format!("attribute_exists(#data){at_version} AND attribute_exists(#outbox) AND attribute_not_exists(#outbox.#txn)"),
                )
            }
            Form::NewMap | Form::Create => {
                values.insert(
                    ":map".to_owned(),
                    AttributeValue::M(HashMap::from([(txn, entry.clone())])),
                );
                (
                    "SET #data = :data, #version = if_not_exists(#version, :zero) + :one, #outbox = :map, #fence = if_not_exists(#fence, :nofence), #sent = if_not_exists(#sent, :nosent)",
                    if form == Form::Create {
                        format!("attribute_not_exists(#data){at_version}")
                    } else {
                        format!("attribute_exists(#data){at_version} AND attribute_not_exists(#outbox)")
                    },
                )
            }
        };
        condition.push_str(applied_condition);
        if commit.checks_fence {
            condition.push_str(" AND (attribute_not_exists(#fence) OR #fence < :txnid)");
            values.insert(":txnid".to_owned(), s(commit.entry.txn_id.to_string()));
        }
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(commit.key.as_str())))
            .update_expression(format!("{update}{}{applied_set}", chain.after_set()))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .customize()
            .config_override(one_request())
            .send()
            .await;
        match result {
            Ok(_) => {
                if form == Form::Create && matches!(commit.expected, ExpectedVersion::AbsentAt(version) if version > 0)
                {
                    reached(Branch::EntityCreateOverVacant);
                }
                Ok(Verdict::Decided(Ok(())))
            }
            Err(error) => match condition_failed(&error) {
                Some(old) => self.judge_old(commit, old).await,
                None => {
                    let error = commit_error(error);
                    reached(match error {
                        CommitError::TooLarge { .. } => Branch::EntityTooLargeForItem,
                        _ => Branch::FailEntityUpdate,
                    });
                    Err(error)
                }
            },
        }
    }

    /// Judges a failed condition by the old item it returned, or, from an engine that
    /// left it out, by a read.
    async fn judge_old(&self, commit: &EntityCommit, old: Option<Item>) -> Result<Verdict, CommitError> {
        let old = match old {
            Some(old) => Some(old),
            None => {
                reached(Branch::EntityOldItemRead);
                self.client
                    .get_item()
                    .table_name(&self.layout.table)
                    .set_key(Some(self.key(commit.key.as_str())))
                    .consistent_read(true)
                    .send()
                    .await
                    // This request wrote nothing, but whether an earlier one did is unknown.
                    .map_err(|error| {
                        reached(Branch::FailEntityOldItemRead);
                        CommitError::Ambiguous(Box::new(error))
                    })?
                    .item
                    .take()
            }
        };
        Ok(judge(&self.layout, commit, old.as_ref()))
    }

    pub(super) async fn drop_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        let mut names = HashMap::from([
            ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
            ("#txn".to_owned(), txn_id.to_string()),
        ]);
        let placed = placed_removals(&mut names, txn_id);
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key.as_str())))
            .update_expression(format!("REMOVE #outbox.#txn{placed}"))
            // Never creates the item again, nor a map on an item without one.
            .condition_expression("attribute_exists(#outbox.#txn)")
            .set_expression_attribute_names(Some(names))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(())
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// Settles T's entry in K in one `UpdateItem` where K holds fewer than `max_marks`
    /// sent marks: the entry removed, T's sent mark set. In a full item, T's record is put
    /// and the entry removed instead. (Every commit into an item writes its map of marks,
    /// so the condition on the map only keeps the update from failing on a malformed one.)
    pub(super) async fn settle_in_item(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        let mut names = HashMap::from([
            ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
            ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
            ("#txn".to_owned(), txn_id.to_string()),
        ]);
        let placed = placed_removals(&mut names, txn_id);
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key.as_str())))
            .update_expression(format!("REMOVE #outbox.#txn{placed} SET #sent.#txn = :until"))
            // Never creates the item again, nor a mark without the entry it replaces.
            .condition_expression("attribute_exists(#outbox.#txn) AND attribute_exists(#sent) AND size(#sent) < :max")
            .set_expression_attribute_names(Some(names))
            .expression_attribute_values(":until", n(expires_at.as_millis()))
            .expression_attribute_values(":max", n(max_marks))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(error) => {
                let Some(old) = condition_failed(&error) else {
                    reached(Branch::FailSettleUpdate);
                    return Err(unavailable(error));
                };
                // From an engine that leaves the old item out: read it.
                let old = match old {
                    Some(old) => Some(old),
                    None => self.read_raw(key).await?,
                };
                // The entry still there: the item is full.
                let holds_entry = old.as_ref().is_some_and(|item| {
                    entries_of(&self.layout, item).is_ok_and(|entries| entries.contains_key(&txn_id))
                });
                if holds_entry {
                    reached(Branch::SettleFullItem);
                    // The entry stays where the record could not be put: it is all that
                    // is left of T's commit.
                    if let Err(error) = self.put_dispatched_record(txn_id, now, expires_at).await {
                        reached(Branch::FailSettleRecordPut);
                        return Err(error);
                    }
                    if let Err(error) = self.drop_entry(key, txn_id).await {
                        reached(Branch::FailSettleEntryRemoval);
                        return Err(error);
                    }
                } else {
                    // The entry is gone: settled already.
                    reached(Branch::SettleAlreadyGone);
                }
                Ok(())
            }
        }
    }

    /// Drops the sent marks of `forget` from K in one `UpdateItem`.
    pub(super) async fn forget_in_item(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        if forget.is_empty() {
            return Ok(());
        }
        let mut names = HashMap::from([("#sent".to_owned(), SENT_ATTRIBUTE.to_owned())]);
        let mut removals = Vec::with_capacity(forget.len());
        for (index, txn_id) in forget.iter().enumerate() {
            names.insert(format!("#t{index}"), txn_id.to_string());
            removals.push(format!("#sent.#t{index}"));
        }
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key.as_str())))
            .update_expression(format!("REMOVE {}", removals.join(", ")))
            // Never creates the item again.
            .condition_expression("attribute_exists(#sent)")
            .set_expression_attribute_names(Some(names))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(())
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    pub(super) async fn put_dispatched_record(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let record = OutboxRecord::committed(txn_id, Vec::new(), now, expires_at);
        self.client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(Some(dispatched_item(&self.layout, &record, expires_at)))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
