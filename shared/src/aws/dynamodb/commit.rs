//! The commit: one `TransactWriteItems`, its actions, and a cancellation explained item
//! by item.

use std::collections::HashMap;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};

use crate::aws::item::{attempt_of, dispatched_item, idempotency_item, n, outbox_items, s, to_attribute, Item};
use crate::aws::size::{action_bytes, item_bytes};
use crate::ports::{
    BoxError, BusinessWrite, CommitError, CommitRequest, ExpectedVersion, ItemKey, NativeAction, Store,
};
use crate::protocol::{IdempotencySlot, OutboxRecord, OutboxState, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

use super::branches::{reached, Branch};
use super::entity::{sent_of, OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE};
use super::fence::{fence_of, FENCE_ATTRIBUTE, NO_FENCE};
use super::{DynamoStore, MAX_ACTIONS, MAX_TRANSACTION_BYTES, PART_ORPHAN_GUARD};

/// What an item a commit deletes holds of the protocol, as read before the commit: a
/// fence mark, which the deleted item keeps in a vacant item, and sent marks, which the
/// commit moves to their transactions' records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Kept {
    /// Its fence mark (`None`: no mark).
    fence: Option<TxnId>,
    /// Its sent marks.
    sent: std::collections::BTreeMap<TxnId, Timestamp>,
}

/// What each item a commit deletes keeps, read before the commit.
type Marks = std::collections::BTreeMap<ItemKey, Kept>;

/// What each action of a commit stands for, to read its cancellation reason.
enum Role {
    Native(usize),
    /// A business write; for a delete, the version it expects.
    Business(ItemKey, Option<u64>),
    Outbox,
    Part,
    /// The record of a sent mark a deleted item carried.
    MarkRecord,
    Idempotency(IdempotencySlot),
}

/// What a cancelled commit's reasons say.
enum Explained {
    /// Decided by the reasons alone.
    Decided(Result<(), CommitError>),
    /// The outbox record's condition failed and the record did not come back with the
    /// reasons: it is this transaction's own (success) or a tombstone (`otherwise`), and
    /// only a read tells.
    ReadRecord { otherwise: CommitError },
}

/// The actions of one commit, what each stands for, and the budget they use.
struct Actions {
    items: Vec<TransactWriteItem>,
    roles: Vec<Role>,
}

/// The cancellation codes that mean "another request held an item, or capacity ran
/// out": nothing was written, and trying again may succeed.
const CONTENTION_CODES: &[&str] = &[
    "TransactionConflict",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "RequestLimitExceeded",
];

impl DynamoStore {
    /// The condition of a portable write expecting `expected`, with its values. `Absent`
    /// holds for a vacant key too (no version: it keeps only a fence mark).
    fn version_condition(expected: ExpectedVersion) -> (&'static str, Option<HashMap<String, AttributeValue>>) {
        match expected {
            ExpectedVersion::Absent => ("attribute_not_exists(version)", None),
            ExpectedVersion::Exactly(version) => (
                "attribute_exists(version) AND version = :expected",
                Some(HashMap::from([(":expected".to_owned(), n(version))])),
            ),
        }
    }

    fn portable(&self, write: &BusinessWrite, marks: &Marks) -> Result<(TransactWriteItem, usize), CommitError> {
        let table = &self.layout.table;
        let action = match write {
            // An existing item is updated, not replaced: the outbox entries the entity mode
            // keeps in it (docs/PROTOCOL.md section 11) stay, with their messages still to go out,
            // and so does its fence mark. A create keeps the mark of a vacant key. Both
            // reserve the mark's room, so that a fence never grows the item.
            BusinessWrite::Put { key, data, expected } => {
                let (condition, values) = Self::version_condition(*expected);
                let mut values = values.unwrap_or_default();
                values.extend([
                    (":data".to_owned(), to_attribute(data)),
                    (":next".to_owned(), n(expected.next())),
                    (":nofence".to_owned(), s(NO_FENCE.to_owned())),
                ]);
                let update = Update::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .update_expression("SET #data = :data, version = :next, #fence = if_not_exists(#fence, :nofence)")
                    .condition_expression(condition)
                    .expression_attribute_names("#data", "data")
                    .expression_attribute_names("#fence", FENCE_ATTRIBUTE)
                    .set_expression_attribute_values(Some(values))
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().update(update).build()
            }
            // The item holds no outbox entry of the entity mode (deleting it would drop the
            // entries' messages before they went out; the delete waits until they are
            // removed). An item with a fence mark keeps it in a vacant item, so that a late
            // commit of a transaction fenced in it meets the mark again if the item is
            // created anew; the mark read before is checked, so that a fence landing in
            // between is not lost.
            BusinessWrite::Delete { key, version } => {
                let mut values = HashMap::from([(":expected".to_owned(), n(*version)), (":none".to_owned(), n(0))]);
                let mut names = HashMap::from([
                    ("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned()),
                    ("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned()),
                    ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
                ]);
                let base = "attribute_exists(version) AND version = :expected AND (attribute_not_exists(#outbox) OR size(#outbox) = :none)";
                let kept = marks.get(key).cloned().unwrap_or_default();
                let fence_as_read = match kept.fence {
                    Some(mark) => {
                        values.insert(":mark".to_owned(), s(mark.to_string()));
                        "#fence = :mark"
                    }
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
                let condition = format!("{base} AND {fence_as_read} AND {sent_as_read}");
                match kept.fence {
                    // The fence mark stays in a vacant item.
                    Some(_) => {
                        reached(Branch::CommitVacatesKeepingFence);
                        names.insert("#data".to_owned(), "data".to_owned());
                        let vacate = Update::builder()
                            .table_name(table)
                            .set_key(Some(self.key(key.as_str())))
                            .update_expression("REMOVE #data, version, #outbox, #sent")
                            .condition_expression(condition)
                            .set_expression_attribute_names(Some(names))
                            .set_expression_attribute_values(Some(values))
                            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                            .build()
                            .map_err(invalid)?;
                        TransactWriteItem::builder().update(vacate).build()
                    }
                    // No fence mark, as read; one that appeared since fails the condition,
                    // and the commit is tried again.
                    None => {
                        let delete = Delete::builder()
                            .table_name(table)
                            .set_key(Some(self.key(key.as_str())))
                            .condition_expression(condition)
                            .set_expression_attribute_names(Some(names))
                            .set_expression_attribute_values(Some(values))
                            // What blocked it: another version, entries still to dispatch, or
                            // marks changed since the read.
                            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                            .build()
                            .map_err(invalid)?;
                        TransactWriteItem::builder().delete(delete).build()
                    }
                }
            }
            BusinessWrite::Check { key, expected } => {
                let (condition, values) = Self::version_condition(*expected);
                let check = ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .condition_expression(condition)
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().condition_check(check).build()
            }
        };
        let bytes = action_bytes(&action);
        Ok((action, bytes))
    }

    /// The fence marks of the items `request` deletes, read before the commit (deletes are
    /// rare; the read costs nothing otherwise).
    async fn marks_of_deleted(&self, request: &CommitRequest) -> Result<Marks, CommitError> {
        let deleted: Vec<&ItemKey> = request
            .writes
            .iter()
            .filter_map(|write| match write {
                BusinessWrite::Delete { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        let mut marks = Marks::new();
        for key in deleted {
            // Nothing was sent yet: a failed read writes nothing.
            let item = self
                .read_raw(key)
                .await
                .map_err(|error| CommitError::Unavailable(Box::new(error)))?;
            let kept = match &item {
                Some(item) => Kept {
                    fence: fence_of(&self.layout, item).map_err(|error| CommitError::Unavailable(Box::new(error)))?,
                    sent: sent_of(&self.layout, item).map_err(|error| CommitError::Unavailable(Box::new(error)))?,
                },
                None => Kept::default(),
            };
            marks.insert(key.clone(), kept);
        }
        Ok(marks)
    }

    /// Every action of a commit, checked against DynamoDB's budget before anything is
    /// sent: the error says how much of it the protocol's own records took.
    fn actions(&self, request: &CommitRequest, native: &[NativeAction], marks: &Marks) -> Result<Actions, CommitError> {
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
            let (action, bytes) = self.portable(write, marks)?;
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

    /// Explains a cancelled commit from its reasons, which come in request order.
    fn explain(request: &CommitRequest, roles: &[Role], reasons: &[CancellationReason], source: BoxError) -> Explained {
        // Several conditions may fail at once; the one reported is the one that decides
        // what the caller does: a used idempotency key (replay) before a tombstone
        // (never commits) before a business condition (conflict).
        let mut failures = Vec::new();
        // The outbox record's condition failed, but the record did not come back.
        let mut unread_record = false;
        for (role, reason) in roles.iter().zip(reasons) {
            let code = match reason.code() {
                None | Some("None") => continue,
                Some(code) => code,
            };
            if CONTENTION_CODES.contains(&code) {
                reached(Branch::CommitContentionReason);
                return Explained::Decided(Err(CommitError::Contention(source)));
            }
            match (role, code) {
                (Role::Outbox, "ConditionalCheckFailed") => {
                    let state = reason
                        .item()
                        .and_then(|item| item.get("state"))
                        .and_then(|v| v.as_s().ok());
                    let txn = reason
                        .item()
                        .and_then(|item| item.get("txn_id"))
                        .and_then(|v| v.as_s().ok());
                    let attempt = reason.item().map(attempt_of);
                    let same_txn = txn == Some(&request.txn_id.to_string());
                    match state.map(String::as_str) {
                        // This transaction's own record: an earlier request (whose reply was
                        // lost) committed everything. Atomicity makes the other reasons moot.
                        Some("pending" | "dispatched") if same_txn && attempt == Some(Ok(request.outbox.attempt)) => {
                            reached(Branch::CommitOwnRecordInReasons);
                            return Explained::Decided(Ok(()));
                        }
                        // Another attempt's (a consumed message's record, which every copy
                        // of the message races to write).
                        Some("pending" | "dispatched") if same_txn => {
                            reached(Branch::CommitRivalAttemptRecord);
                            failures.push((1, CommitError::Superseded { txn_id: request.txn_id }))
                        }
                        // No old item came back (an engine that leaves `ALL_OLD` out): the
                        // record may be this transaction's own as well as a tombstone.
                        _ if reason.item().is_none() => {
                            reached(Branch::CommitRecordReadBack);
                            unread_record = true;
                            failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id }))
                        }
                        _ => {
                            reached(Branch::CommitTombstoneInReasons);
                            failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id }))
                        }
                    }
                }
                // A delete blocked by the entity mode's entries (only deletes return the
                // old item): not a conflict the caller must resolve, but one that passes
                // once they are dispatched, so the commit is tried again.
                (Role::Business(..), "ConditionalCheckFailed")
                    if reason
                        .item()
                        .and_then(|item| item.get(OUTBOX_ATTRIBUTE))
                        .and_then(|outbox| outbox.as_m().ok())
                        .is_some_and(|entries| !entries.is_empty()) =>
                {
                    reached(Branch::CommitDeleteBlockedByEntries);
                    return Explained::Decided(Err(CommitError::Contention(
                        "the item holds outbox entries still to be dispatched".into(),
                    )));
                }
                // A delete that found the item at its version: its fence mark is not the
                // one read before (a fence landed in between), so it is tried again.
                (Role::Business(_, Some(version)), "ConditionalCheckFailed")
                    if reason
                        .item()
                        .is_some_and(|item| item.contains_key("version") && Self::at_version(item, *version)) =>
                {
                    reached(Branch::CommitDeleteMetNewFence);
                    return Explained::Decided(Err(CommitError::Contention(
                        "the item was fenced while it was being deleted".into(),
                    )));
                }
                (Role::Business(key, _), "ConditionalCheckFailed") => {
                    reached(Branch::CommitBusinessConflict);
                    failures.push((2, CommitError::VersionConflict { key: key.clone() }))
                }
                (Role::Idempotency(slot), "ConditionalCheckFailed") => {
                    reached(Branch::CommitIdempotencyUsed);
                    failures.push((0, CommitError::IdempotencyKeyUsed { slot: slot.clone() }))
                }
                // The application's own action: whatever DynamoDB says of it is the
                // application's to read (its condition, its item collection, its
                // expression).
                (Role::Native(index), code) => {
                    reached(Branch::CommitNativeCancelled);
                    failures.push((
                        2,
                        CommitError::ActionCancelled {
                            index: *index,
                            code: code.to_owned(),
                            item: reason.item().cloned(),
                        },
                    ))
                }
                (_, "ItemCollectionSizeLimitExceeded") => {
                    return Explained::Decided(Err(CommitError::TooLarge {
                        reason: "item collection size limit exceeded".into(),
                    }))
                }
                (_, "ValidationError") => {
                    return Explained::Decided(Err(CommitError::Invalid {
                        reason: reason
                            .message()
                            .unwrap_or("DynamoDB refused an action of the outbox as invalid")
                            .to_owned(),
                    }))
                }
                (_, _) => return Explained::Decided(Err(CommitError::Ambiguous(source))),
            }
        }
        match failures.into_iter().min_by_key(|(rank, _)| *rank) {
            Some((_, otherwise)) if unread_record => Explained::ReadRecord { otherwise },
            Some((_, error)) => Explained::Decided(Err(error)),
            None => Explained::Decided(Err(CommitError::Ambiguous(source))),
        }
    }

    /// Reads the record that blocked transaction `txn_id`'s commit, when the cancellation
    /// did not return it: its own committed record means an earlier attempt committed
    /// everything; a tombstone (or nothing any more) leaves `otherwise`.
    async fn blocked_by(&self, sent: &OutboxRecord, otherwise: CommitError) -> Result<(), CommitError> {
        let txn_id = sent.txn_id;
        match self.get_outboxes(&[txn_id]).await {
            Ok(mut found) => match found.remove(&txn_id) {
                Some(record) if sent.is_own(&record) => Ok(()),
                Some(record) if record.state != OutboxState::Tombstone => Err(CommitError::Superseded { txn_id }),
                _ => Err(otherwise),
            },
            // This request wrote nothing, but whether an earlier one did is unknown.
            Err(read) => Err(CommitError::Ambiguous(Box::new(read))),
        }
    }

    /// Whether `item` is at `version`.
    fn at_version(item: &Item, version: u64) -> bool {
        item.get("version")
            .and_then(|value| value.as_n().ok())
            .and_then(|text| text.parse::<u64>().ok())
            == Some(version)
    }

    /// The commit's `ClientRequestToken`: the transaction (or the attempt's own id, where
    /// several attempts race for one record: a consumed message's). DynamoDB answers
    /// `IdempotentParameterMismatch` to one token sent with other parameters, and a
    /// delete's form follows the fence mark read before it, which a fence may change
    /// between attempts: so the marks read are part of the token when there are any.
    /// Nothing relies on the token to commit once: the outbox record's condition does.
    fn client_token(request: &CommitRequest, marks: &Marks) -> String {
        use sha2::{Digest, Sha256};
        let base = request.outbox.attempt.unwrap_or(request.txn_id).to_string();
        let marked: Vec<String> = marks
            .iter()
            .filter(|(_, kept)| **kept != Kept::default())
            .map(|(key, kept)| {
                let fence = kept.fence.map(|mark| mark.to_string()).unwrap_or_default();
                let sent: Vec<String> = kept.sent.keys().map(TxnId::to_string).collect();
                format!("{key}={fence}+{}", sent.join(","))
            })
            .collect();
        if marked.is_empty() {
            return base;
        }
        let digest = Sha256::new()
            .chain_update(base.as_bytes())
            .chain_update(marked.join("\0").as_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
    }

    pub(super) async fn transact(&self, request: &CommitRequest, native: &[NativeAction]) -> Result<(), CommitError> {
        let marks = self.marks_of_deleted(request).await?;
        let Actions { items, roles } = self.actions(request, native, &marks)?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // The attempt's own token where several attempts race for one record (a
            // consumed message's): a rival's commit is then a cancellation naming the
            // winner's record, not a repeat of it.
            .client_request_token(Self::client_token(request, &marks))
            // One request per call: the SDK would retry a timed-out request and return
            // only the last request's error, hiding one that may still apply (docs/PROTOCOL.md
            // section 3). The request path retries instead, and counts every request.
            .customize()
            .config_override(aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled()))
            .send()
            .await;
        let error = match result {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        match &error {
            SdkError::ServiceError(service) => match service.err() {
                TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                    let reasons = cancelled.cancellation_reasons().to_vec();
                    match Self::explain(request, &roles, &reasons, Box::new(error)) {
                        Explained::Decided(result) => result,
                        Explained::ReadRecord { otherwise } => self.blocked_by(&request.outbox, otherwise).await,
                    }
                }
                TransactWriteItemsError::ProvisionedThroughputExceededException(_)
                | TransactWriteItemsError::RequestLimitExceeded(_)
                | TransactWriteItemsError::ThrottlingException(_) => Err(CommitError::Contention(Box::new(error))),
                // An earlier attempt under this token is still running, or one with other
                // parameters ran: either may have committed. Trying again settles it.
                TransactWriteItemsError::TransactionInProgressException(_)
                | TransactWriteItemsError::IdempotentParameterMismatchException(_) => {
                    Err(CommitError::Ambiguous(Box::new(error)))
                }
                TransactWriteItemsError::ResourceNotFoundException(_) => Err(CommitError::Unavailable(Box::new(error))),
                // Refused before anything ran: the function may not write there.
                other
                    if matches!(
                        other.code(),
                        Some("AccessDeniedException" | "UnrecognizedClientException")
                    ) =>
                {
                    Err(CommitError::Unavailable(Box::new(error)))
                }
                // A request DynamoDB refused before doing anything: a malformed
                // expression, a key that does not match the table's schema, two actions
                // on one item. Its message is for the developer who wrote the action.
                other if other.code() == Some("ValidationException") => Err(CommitError::Invalid {
                    reason: other.message().unwrap_or("DynamoDB refused the request").to_owned(),
                }),
                // An internal error may or may not have applied the commit.
                _ => Err(CommitError::Ambiguous(Box::new(error))),
            },
            // Never sent.
            SdkError::ConstructionFailure(_) => Err(CommitError::Invalid {
                reason: "the request could not be built".into(),
            }),
            // Sent, or maybe sent: a timeout, a lost connection, an unreadable reply.
            _ => Err(CommitError::Ambiguous(Box::new(error))),
        }
    }
}

fn invalid(_: aws_smithy_types::error::operation::BuildError) -> CommitError {
    CommitError::Invalid {
        reason: "a commit action misses a required field".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    /// A delete's form follows the mark read before it: attempts that read different marks
    /// send different tokens (one token with other parameters is refused by DynamoDB);
    /// without a mark the token is the transaction's id, as before.
    #[test]
    fn the_token_follows_the_marks_of_deleted_items() {
        let txn_id = TxnId::new_v7();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let key: ItemKey = "ORDER#1".parse().unwrap();
        let request = CommitRequest {
            txn_id,
            writes: vec![BusinessWrite::Delete {
                key: key.clone(),
                version: 1,
            }],
            outbox: OutboxRecord::committed(txn_id, vec![], now, now),
            idempotency: None,
        };
        let token = |fence: Option<TxnId>, sent: &[TxnId]| {
            let sent = sent.iter().map(|txn_id| (*txn_id, now)).collect();
            DynamoStore::client_token(&request, &Marks::from([(key.clone(), Kept { fence, sent })]))
        };
        assert_eq!(token(None, &[]), txn_id.to_string());
        let (first, second) = (token(Some(TxnId::new_v7()), &[]), token(Some(TxnId::new_v7()), &[]));
        assert_ne!(first, second);
        // The sent marks read decide the records the commit puts.
        let (one, other) = (token(None, &[TxnId::new_v7()]), token(None, &[TxnId::new_v7()]));
        assert_ne!(one, other);
        assert_ne!(one, txn_id.to_string());
        assert_ne!(first, txn_id.to_string());
        assert!(
            first.len() <= 36,
            "DynamoDB takes tokens of at most 36 characters: {first}"
        );
    }
}
