//! The fence of entity mode on DynamoDB (`docs/ENTITY_MODE.md`): one `TransactWriteItems`
//! that puts T's tombstone record where it has none and raises K's fence mark
//! (`outbox_fence`, the highest transaction fenced in K) to T, where K holds no entry of T.
//!
//! A commit of the request path in entity form is conditioned on the mark being below its
//! transaction. The mark only moves up and is never pruned, so once T is fenced no request
//! of T gets past it, however late it arrives and whatever any clock says. It keeps no
//! slot per transaction: one attribute, as long as a transaction id.
//!
//! K's action takes one of four forms, chosen from K as last seen: K exists (it has data)
//! or is vacant (absent, or deleted keeping its version and mark; raising the mark leaves
//! the version as it is); its mark is below T (raise it) or at or above T already (only
//! check it). T's record's action is a put where it has none, or a check that it is a
//! tombstone already (one written without the fence: the mark is raised all the same). A
//! condition that fails returns the item as it is, and the forms are chosen again.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};

use super::branches::{reached, Branch};
use super::entity_attributes::{entries_of, fence_of, sent_of, FENCE_ATTRIBUTE, OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE};
use super::{unavailable, DynamoStore};
use crate::aws::item::{outbox_items, outbox_pk, s, Item};
use crate::ports::{FenceOutcome, ItemKey, Store, StoreError};
use crate::protocol::{OutboxRecord, OutboxState, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

/// How often the fence chooses its form again before giving up (the item changing
/// between tries; the caller tries again later).
const FENCE_TRIES: usize = 4;

/// K's action in the fence: which item state it expects, and whether it raises the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Form {
    /// K has data (it exists); otherwise it is vacant and keeps only its version and mark.
    exists: bool,
    /// K's mark is below T: raise it. Otherwise it is at or above T: check it.
    raise: bool,
}

impl Form {
    /// The form for K as seen (`None`: absent).
    fn for_item(layout: &TableLayout, item: Option<&Item>, txn_id: TxnId) -> Result<Self, StoreError> {
        let Some(item) = item else {
            return Ok(Self {
                exists: false,
                raise: true,
            });
        };
        Ok(Self {
            exists: item.contains_key("data"),
            raise: fence_of(layout, item)?.is_none_or(|fence| fence < txn_id),
        })
    }
}

/// What one try of the fence found.
enum Tried {
    Done(FenceOutcome),
    /// Not settled: try again, K's form chosen again from `item` (K as it is now,
    /// absent or not) where it is given, kept otherwise (K's action held); T's record
    /// checked as `tombstone` where there is one (written without the fence: the mark is
    /// raised all the same), put otherwise.
    Again {
        item: Option<Option<Item>>,
        tombstone: Option<OutboxRecord>,
    },
}

impl DynamoStore {
    /// Fences T in K (see the module).
    pub(super) async fn write_fence(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        let tombstone = outbox_items(
            &self.layout,
            &OutboxRecord::tombstone(txn_id, now, expires_at),
            expires_at,
            self.part_bytes,
        )
        .map_err(|reason| StoreError::Corrupt {
            key: outbox_pk(txn_id),
            reason,
        })?
        .into_iter()
        .next()
        .expect("a tombstone is one item");
        // The usual case first: K exists, below the mark, and T has no record.
        let mut form = Form {
            exists: true,
            raise: true,
        };
        let mut tombstoned: Option<OutboxRecord> = None;
        for _ in 0..FENCE_TRIES {
            match self
                .try_fence(key, txn_id, &tombstone, form, tombstoned.as_ref())
                .await?
            {
                Tried::Done(outcome) => return Ok(outcome),
                Tried::Again { item, tombstone } => {
                    if let Some(item) = item {
                        form = Form::for_item(&self.layout, item.as_ref(), txn_id)?;
                    }
                    tombstoned = tombstone;
                }
            }
        }
        Err(StoreError::Contention("the item kept changing under the fence".into()))
    }

    /// T's committed entry in `item`, if it holds one.
    fn entry_in(&self, item: Option<&Item>, txn_id: TxnId) -> Result<Option<OutboxRecord>, StoreError> {
        let Some(item) = item else { return Ok(None) };
        Ok(entries_of(&self.layout, item)?.remove(&txn_id))
    }

    /// Whether `item` holds T's sent mark.
    fn sent_mark_in(&self, item: Option<&Item>, txn_id: TxnId) -> Result<bool, StoreError> {
        let Some(item) = item else { return Ok(false) };
        Ok(sent_of(&self.layout, item)?.contains_key(&txn_id))
    }

    /// One try: K's action in `form`; T's record put as `tombstone` where it has none, or,
    /// with `tombstoned` (its tombstone as read), checked to be that tombstone still.
    async fn try_fence(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        tombstone: &Item,
        form: Form,
        tombstoned: Option<&OutboxRecord>,
    ) -> Result<Tried, StoreError> {
        if !form.exists {
            reached(Branch::FenceVacantKey);
        }
        let mut names = HashMap::from([
            ("#data".to_owned(), "data".to_owned()),
            ("#fence".to_owned(), FENCE_ATTRIBUTE.to_owned()),
            ("#sent".to_owned(), SENT_ATTRIBUTE.to_owned()),
            ("#txn".to_owned(), txn_id.to_string()),
        ]);
        let values = HashMap::from([(":txnid".to_owned(), s(txn_id.to_string()))]);
        // No sent mark of T (a vacant key keeps them too): a mark is proof of its commit.
        let mut condition = if form.exists {
            names.insert("#outbox".to_owned(), OUTBOX_ATTRIBUTE.to_owned());
            // No entry of T: an entry is proof of its commit.
            "attribute_exists(#data) AND attribute_not_exists(#outbox.#txn) AND attribute_not_exists(#sent.#txn)"
                .to_owned()
        } else {
            "attribute_not_exists(#data) AND attribute_not_exists(#sent.#txn)".to_owned()
        };
        condition.push_str(if form.raise {
            " AND (attribute_not_exists(#fence) OR #fence < :txnid)"
        } else {
            " AND #fence >= :txnid"
        });
        let on_item = if form.raise {
            let update = Update::builder()
                .table_name(&self.layout.table)
                .set_key(Some(self.key(key.as_str())))
                .update_expression("SET #fence = :txnid")
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values))
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .build()
                .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
            TransactWriteItem::builder().update(update).build()
        } else {
            let check = ConditionCheck::builder()
                .table_name(&self.layout.table)
                .set_key(Some(self.key(key.as_str())))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values))
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .build()
                .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
            TransactWriteItem::builder().condition_check(check).build()
        };
        let on_record = match tombstoned {
            None => {
                let put = Put::builder()
                    .table_name(&self.layout.table)
                    .set_item(Some(tombstone.clone()))
                    .condition_expression(TableLayout::NOT_EXISTS)
                    .set_expression_attribute_names(Some(self.layout.key_names()))
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                    .build()
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                TransactWriteItem::builder().put(put).build()
            }
            Some(_) => {
                let check = ConditionCheck::builder()
                    .table_name(&self.layout.table)
                    .set_key(Some(self.key(&outbox_pk(txn_id))))
                    .condition_expression("#state = :tombstone")
                    .expression_attribute_names("#state", "state")
                    .expression_attribute_values(":tombstone", s(OutboxState::Tombstone.as_str()))
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                    .build()
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                TransactWriteItem::builder().condition_check(check).build()
            }
        };
        let result = self
            .client
            .transact_write_items()
            .transact_items(on_record)
            .transact_items(on_item)
            .send()
            .await;
        let error = match result {
            Ok(_) => {
                return Ok(Tried::Done(match tombstoned {
                    None => FenceOutcome::Fenced,
                    Some(record) => {
                        reached(Branch::FenceOverPlainTombstone);
                        FenceOutcome::Recorded(record.clone())
                    }
                }))
            }
            Err(error) => error,
        };
        let reasons = match &error {
            SdkError::ServiceError(service) => match service.err() {
                TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                    cancelled.cancellation_reasons().to_vec()
                }
                _ => {
                    reached(Branch::FailFenceTransact);
                    return Err(unavailable(error));
                }
            },
            _ => {
                reached(Branch::FailFenceTransact);
                return Err(unavailable(error));
            }
        };
        let code = |index: usize| reasons.get(index).and_then(|reason| reason.code());
        let failed = |index: usize| code(index) == Some("ConditionalCheckFailed");
        if !failed(0) && !failed(1) {
            // Nothing was written; the caller tries again. Another transaction on the
            // item (a hot item) is contention, to be tried again soon; anything else
            // (throttling) is the store being unavailable.
            if (0..2).any(|index| code(index) == Some("TransactionConflict")) {
                reached(Branch::FenceContention);
                return Err(StoreError::Contention(Box::new(error)));
            }
            return Err(unavailable(error));
        }
        // K as it is, when its condition failed: from the reason, or read. `None` where it
        // held: it holds no entry of T, and its form stays.
        let read_item = || async {
            self.read_raw(key)
                .await
                .inspect_err(|_| reached(Branch::FailFenceItemRead))
        };
        let item_now = if failed(1) {
            Some(match reasons[1].item() {
                Some(item) => Some(item.clone()),
                None => read_item().await?,
            })
        } else if code(1) == Some("None") {
            None
        } else {
            Some(read_item().await?)
        };
        // T's record as it is: unchanged where its action held; read where it failed
        // (from the reason, or read: the tombstone checked may have expired).
        // A split record is read whole: its main item alone would publish only the
        // messages of its first part.
        let record = match (failed(0), tombstoned) {
            (false, held) => held.cloned(),
            (true, None) => {
                reached(Branch::FenceRecordFromReason);
                self.record_behind(txn_id, reasons[0].item()).await?
            }
            (true, Some(_)) => self
                .get_outboxes(&[txn_id])
                .await
                .inspect_err(|_| reached(Branch::FailRecordBehindRead))?
                .remove(&txn_id),
        };
        // A committed record speaks for T; an entry of T in K is proof of its commit
        // where T's record is a tombstone (written without the fence).
        Ok(
            match (
                record,
                self.entry_in(item_now.as_ref().and_then(Option::as_ref), txn_id)?,
            ) {
                (Some(record), _) if record.state != OutboxState::Tombstone => {
                    Tried::Done(FenceOutcome::Recorded(record))
                }
                (_, Some(entry)) => {
                    reached(Branch::FenceFoundEntry);
                    Tried::Done(FenceOutcome::Committed(entry))
                }
                (_, None) if self.sent_mark_in(item_now.as_ref().and_then(Option::as_ref), txn_id)? => {
                    reached(Branch::FenceFoundSentMark);
                    Tried::Done(FenceOutcome::Dispatched)
                }
                (tombstone, None) => {
                    reached(Branch::FenceFormAgain);
                    Tried::Again {
                        item: item_now,
                        tombstone,
                    }
                }
            },
        )
    }
}
