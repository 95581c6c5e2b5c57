//! A cancelled commit explained item by item from its `CancellationReasons` (never from
//! message text): contention, this transaction's own record (committed already), a
//! rival's, a tombstone, a business conflict, a used idempotency key, or the
//! application's own action; the one that decides what the caller does is reported.

use aws_sdk_dynamodb::types::CancellationReason;

use super::actions::Role;
use crate::aws::dynamodb::branches::{reached, Branch};
use crate::aws::dynamodb::entity_attributes::OUTBOX_ATTRIBUTE;
use crate::aws::dynamodb::DynamoStore;
use crate::aws::item::{attempt_of, Item};
use crate::ports::{BoxError, CommitError, CommitRequest, Store};
use crate::protocol::{OutboxRecord, OutboxState};

/// What a cancelled commit's reasons say.
pub(super) enum Explained {
    /// Decided by the reasons alone.
    Decided(Result<(), CommitError>),
    /// The outbox record's condition failed and the record did not come back with the
    /// reasons: it is this transaction's own (success) or a tombstone (`otherwise`), and
    /// only a read tells.
    ReadRecord { otherwise: CommitError },
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
    /// Explains a cancelled commit from its reasons, which come in request order.
    pub(super) fn explain(
        request: &CommitRequest,
        roles: &[Role],
        reasons: &[CancellationReason],
        source: BoxError,
    ) -> Explained {
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
                // A delete that found the item live at its version: its marks are not the
                // ones read before (a fence landed in between, or a sent mark came or went),
                // so it is tried again.
                (Role::Business(_, Some(version)), "ConditionalCheckFailed")
                    if reason
                        .item()
                        .is_some_and(|item| item.contains_key("data") && Self::at_version(item, *version)) =>
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
    pub(super) async fn blocked_by(&self, sent: &OutboxRecord, otherwise: CommitError) -> Result<(), CommitError> {
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
}
