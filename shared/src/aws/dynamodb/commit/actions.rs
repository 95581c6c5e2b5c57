//! A commit's actions: the application's native actions in its order, its portable
//! business writes, then the protocol's records (the records of the sent marks deleted
//! items carried, the outbox record and its parts, the idempotency record), each with the
//! role its cancellation reason is read by, checked against DynamoDB's budget.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::deleted_marks::Marks;
use crate::aws::dynamodb::branches::{reached, Branch};
use crate::aws::dynamodb::chain::ChainSets;
use crate::aws::dynamodb::entity_attributes::{FENCE_ATTRIBUTE, NO_FENCE, OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE};
use crate::aws::dynamodb::{DynamoStore, MAX_ACTIONS, MAX_TRANSACTION_BYTES, PART_ORPHAN_GUARD};
use crate::aws::item::{dispatched_item, idempotency_item, n, outbox_items, s, to_attribute};
use crate::aws::size::{action_bytes, item_bytes};
use crate::ports::{BusinessWrite, CommitError, CommitRequest, ExpectedVersion, ItemKey, NativeAction};
use crate::protocol::{IdempotencySlot, OutboxRecord, OutgoingMessage};
use crate::settings::TableLayout;

/// What each action of a commit stands for, to read its cancellation reason.
pub(super) enum Role {
    Native(usize),
    /// A business write; for a delete, the version it expects.
    Business(ItemKey, Option<u64>),
    Outbox,
    Part,
    /// The record of a sent mark a deleted item carried.
    MarkRecord,
    Idempotency(IdempotencySlot),
}

/// The actions of one commit, what each stands for, and the budget they use.
pub(super) struct Actions {
    pub(super) items: Vec<TransactWriteItem>,
    pub(super) roles: Vec<Role>,
}

impl DynamoStore {
    /// The condition of a portable write expecting `expected`, with its values; it names
    /// `#data`. An item is live while it has data; a vacant key keeps its version (none:
    /// never written, or vacated before versions were kept, which is version 0).
    fn version_condition(expected: ExpectedVersion) -> (&'static str, Option<HashMap<String, AttributeValue>>) {
        let at = |version: u64| Some(HashMap::from([(":expected".to_owned(), n(version))]));
        match expected {
            ExpectedVersion::Absent => ("attribute_not_exists(#data)", None),
            ExpectedVersion::AbsentAt(0) => ("attribute_not_exists(#data) AND attribute_not_exists(version)", None),
            ExpectedVersion::AbsentAt(version) => ("attribute_not_exists(#data) AND version = :expected", at(version)),
            ExpectedVersion::Exactly(version) => ("attribute_exists(#data) AND version = :expected", at(version)),
        }
    }

    /// The action of one portable business write of a commit sending `messages`.
    fn portable(
        &self,
        write: &BusinessWrite,
        messages: &[OutgoingMessage],
        marks: &Marks,
    ) -> Result<(TransactWriteItem, usize), CommitError> {
        let table = &self.layout.table;
        let action = match write {
            // An existing item is updated, not replaced: the outbox entries the entity mode
            // keeps in it (docs/PROTOCOL.md section 11) stay, with their messages still to go out,
            // and so does its fence mark. A create keeps the mark of a vacant key and
            // continues its version (what the condition names, where it names one). Both
            // reserve the mark's room, so that a fence never grows the item. Both move the
            // chain heads past the messages positioned in the item (a create continues the
            // heads a vacant key kept), in the same write: its condition on the version
            // the messages were stamped against is the heads'.
            BusinessWrite::Put { key, data, expected } => {
                let (condition, values) = Self::version_condition(*expected);
                let chain = ChainSets::new(key, messages);
                let mut values = values.unwrap_or_default();
                values.extend([
                    (":data".to_owned(), to_attribute(data)),
                    (":zero".to_owned(), n(0)),
                    (":one".to_owned(), n(1)),
                    (":nofence".to_owned(), s(NO_FENCE.to_owned())),
                ]);
                values.extend(chain.values());
                let mut names = HashMap::from([
                    ("#data".to_owned(), "data".to_owned()),
                    ("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned()),
                ]);
                names.extend(chain.names());
                let update = Update::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .update_expression(format!(
                        "SET #data = :data, version = if_not_exists(version, :zero) + :one, #fence = if_not_exists(#fence, :nofence){}",
                        chain.after_set()
                    ))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(names))
                    .set_expression_attribute_values(Some(values))
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().update(update).build()
            }
            // The item is vacated, never deleted: its data, entries and sent marks go, and
            // the key stays at the next version with its fence mark, so that a create
            // continues the versions (an attempt that expects a version of this life never
            // applies to a later one) and a late commit of a transaction fenced in it meets
            // the mark again. The item holds no outbox entry of the entity mode (vacating
            // it would drop the entries' messages before they went out; the delete waits
            // until they are removed); the fence mark read before is checked, so that a
            // fence landing in between is not lost, and so are the sent marks, whose
            // records this commit puts.
            BusinessWrite::Delete { key, version } => {
                let mut values = HashMap::from([
                    (":expected".to_owned(), n(*version)),
                    (":none".to_owned(), n(0)),
                    (":one".to_owned(), n(1)),
                ]);
                let mut names = HashMap::from([
                    ("#data".to_owned(), "data".to_owned()),
                    ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
                    ("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned()),
                    ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
                ]);
                let base = "attribute_exists(#data) AND version = :expected AND (attribute_not_exists(#outbox) OR size(#outbox) = :none)";
                let kept = marks.get(key).cloned().unwrap_or_default();
                let fence_as_read = match kept.fence {
                    Some(mark) => {
                        values.insert(":mark".to_owned(), s(mark.to_string()));
                        "#fence = :mark"
                    }
                    // No fence mark, as read; one that appeared since fails the condition,
                    // and the commit is tried again.
                    None => {
                        values.insert(":nofence".to_owned(), s(NO_FENCE.to_owned()));
                        "(attribute_not_exists(#fence) OR #fence = :nofence)"
                    }
                };
                // The sent marks exactly as read, whose records this commit puts: one
                // settled or evicted since fails it, and the commit is tried again.
                let sent_as_read = if kept.sent.is_empty() {
                    "(attribute_not_exists(#sent) OR size(#sent) = :none)".to_owned()
                } else {
                    values.insert(":marks".to_owned(), n(kept.sent.len()));
                    let mut condition = "size(#sent) = :marks".to_owned();
                    for (index, txn_id) in kept.sent.keys().enumerate() {
                        names.insert(format!("#m{index}"), txn_id.to_string());
                        condition.push_str(&format!(" AND attribute_exists(#sent.#m{index})"));
                    }
                    condition
                };
                // The chain heads are kept, and moved past the messages positioned in the
                // item.
                let chain = ChainSets::new(key, messages);
                names.extend(chain.names());
                values.extend(chain.values());
                let vacate = Update::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .update_expression(format!(
                        "REMOVE #data, #outbox, #sent SET version = version + :one{}",
                        chain.after_set()
                    ))
                    .condition_expression(format!("{base} AND {fence_as_read} AND {sent_as_read}"))
                    .set_expression_attribute_names(Some(names))
                    .set_expression_attribute_values(Some(values))
                    // What blocked it: another version, entries still to dispatch, or marks
                    // changed since the read.
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().update(vacate).build()
            }
            BusinessWrite::Check { key, expected } => {
                let (condition, values) = Self::version_condition(*expected);
                let check = ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .condition_expression(condition)
                    .expression_attribute_names("#data", "data")
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().condition_check(check).build()
            }
        };
        let bytes = action_bytes(&action);
        Ok((action, bytes))
    }

    /// Every action of a commit, checked against DynamoDB's budget before anything is
    /// sent: the error says how much of it the protocol's own records took.
    pub(super) fn actions(
        &self,
        request: &CommitRequest,
        native: &[NativeAction],
        marks: &Marks,
    ) -> Result<Actions, CommitError> {
        // Every attempt of one commit must send the same request under its token (else
        // DynamoDB answers IdempotentParameterMismatch): times come from the request,
        // built once, never from the clock of the attempt.
        let now = request.outbox.created_at;
        let mut items = Vec::new();
        let mut roles = Vec::new();
        let mut application_bytes = 0;
        for (index, action) in native.iter().enumerate() {
            application_bytes += action_bytes(action);
            items.push(action.clone());
            roles.push(Role::Native(index));
        }
        for write in &request.writes {
            let (action, bytes) = self.portable(write, &request.outbox.messages, marks)?;
            application_bytes += bytes;
            items.push(action);
            let deleting = match write {
                BusinessWrite::Delete { version, .. } => Some(*version),
                _ => None,
            };
            roles.push(Role::Business(write.key().clone(), deleting));
        }
        let application_actions = items.len();

        let mut protocol_bytes = 0;
        // The sent marks of deleted items move to their records, in the same commit.
        for (txn_id, expires_at) in marks.values().flat_map(|kept| &kept.sent) {
            reached(Branch::CommitMovesSentMarks);
            let record = OutboxRecord::committed(*txn_id, Vec::new(), now, *expires_at);
            let item = dispatched_item(&self.layout, &record, *expires_at);
            protocol_bytes += item_bytes(&item);
            let put = Put::builder()
                .table_name(&self.layout.table)
                .set_item(Some(item))
                .build()
                .map_err(invalid)?;
            items.push(TransactWriteItem::builder().put(put).build());
            roles.push(Role::MarkRecord);
        }
        let part_expiry = now.plus(PART_ORPHAN_GUARD);
        let outbox = outbox_items(&self.layout, &request.outbox, part_expiry, self.part_bytes)
            .map_err(|reason| CommitError::TooLarge { reason })?;
        let record_items = outbox.len();
        // A consumed message's record that has expired (its retention passed) may still be
        // in the table until TTL deletes it, days later; a late copy of the message is new
        // again by then (as every read already says), so the expired record does not
        // block it. A request path's record never expires within its commit window.
        let consumed = request.outbox.txn_id.is_consumed();
        for (index, item) in outbox.into_iter().enumerate() {
            protocol_bytes += item_bytes(&item);
            let mut put = Put::builder().table_name(&self.layout.table).set_item(Some(item));
            // The main item's condition guards the whole record: where it holds (no
            // record, or an expired consumed one), a part found under the record's key is
            // an orphan of an earlier record whose mark could not delete it, and is
            // replaced (conditioned too, it would refuse a late copy of a consumed message
            // for as long as the orphan lasts).
            if index == 0 {
                put = put
                    .condition_expression(TableLayout::NOT_EXISTS)
                    .set_expression_attribute_names(Some(self.layout.key_names()));
            }
            if consumed && index == 0 {
                put = put
                    .condition_expression(format!("{} OR #ttl <= :now", TableLayout::NOT_EXISTS))
                    .set_expression_attribute_names(Some(self.layout.key_and_ttl_names()))
                    .expression_attribute_values(":now", n(now.as_unix_seconds()));
            }
            if index == 0 {
                // What blocks the put, if anything: this transaction's own record
                // (committed already) or a tombstone (never will).
                put = put.return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
            }
            items.push(TransactWriteItem::builder().put(put.build().map_err(invalid)?).build());
            roles.push(if index == 0 { Role::Outbox } else { Role::Part });
        }
        if let Some(record) = &request.idempotency {
            let item = idempotency_item(&self.layout, record);
            protocol_bytes += item_bytes(&item);
            // An expired record may linger until TTL deletes it; it no longer counts.
            let put = Put::builder()
                .table_name(&self.layout.table)
                .set_item(Some(item))
                .condition_expression(format!("{} OR #ttl <= :now", TableLayout::NOT_EXISTS))
                .set_expression_attribute_names(Some(self.layout.key_and_ttl_names()))
                .expression_attribute_values(":now", n(now.as_unix_seconds()))
                .build()
                .map_err(invalid)?;
            items.push(TransactWriteItem::builder().put(put).build());
            roles.push(Role::Idempotency(record.slot.clone()));
        }
        let protocol_actions = items.len() - application_actions;
        let share = || {
            format!(
                "the outbox's records take {protocol_actions} action(s) ({record_items} for the outbox record, {} for the idempotency record) and about {protocol_bytes} bytes",
                usize::from(request.idempotency.is_some())
            )
        };
        if items.len() > MAX_ACTIONS {
            return Err(CommitError::TooLarge {
                reason: format!(
                    "{} actions, at most {MAX_ACTIONS}: the application's {application_actions}; {}",
                    items.len(),
                    share()
                ),
            });
        }
        let bytes = application_bytes + protocol_bytes;
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(CommitError::TooLarge {
                reason: format!(
                    "about {bytes} bytes, at most {MAX_TRANSACTION_BYTES}: the application's about {application_bytes}; {}",
                    share()
                ),
            });
        }
        Ok(Actions { items, roles })
    }
}

fn invalid(_: aws_smithy_types::error::operation::BuildError) -> CommitError {
    CommitError::Invalid {
        reason: "a commit action misses a required field".into(),
    }
}
