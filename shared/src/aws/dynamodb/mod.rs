//! The store port on DynamoDB.
//!
//! The commit is one `TransactWriteItems` whose `ClientRequestToken` is the transaction
//! id: the application's native actions first, in its order, then the portable business
//! writes, then the protocol's records. A cancelled commit is explained item by item from
//! `CancellationReasons` (never from message text), and the outbox put asks for `ALL_OLD`
//! so that finding this transaction's own record means "already committed". Reads are
//! consistent; items whose TTL has passed read as absent. Where the protocol's records
//! live is the [`TableLayout`].

pub(crate) mod applied;
mod batch;
pub mod branches;
pub(crate) mod chain;
mod commit;
mod counter;
mod entity;
pub(crate) mod entity_attributes;
mod fence;
mod kept;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, PutRequest, ReturnValuesOnConditionCheckFailure, WriteRequest,
};
use aws_sdk_dynamodb::Client;

use branches::{reached, Branch};

use crate::aws::item::{
    dispatched_item, idempotency_from_item, idempotency_item, idempotency_pk, key_from_item, n, outbox_from_items,
    outbox_items, outbox_pk, part_pk, split_messages, Item, Reader, PART_BYTES,
};
use crate::ports::{
    Clock, CommitError, CommitRequest, EntityCommit, EntityItem, ExpectedVersion, FenceOutcome, ItemKey, KeptMessage,
    KeyRead, NativeAction, OutboxReads, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use crate::protocol::{Applied, IdempotencyRecord, IdempotencySlot, OutboxRecord, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

/// Most actions in one `TransactWriteItems`.
pub const MAX_ACTIONS: usize = 100;
/// Most bytes in one `TransactWriteItems` (4 MB), less a margin for the request's own
/// overhead.
pub const MAX_TRANSACTION_BYTES: usize = 4_000_000 - 64 * 1024;
/// Reads of a split record whose main item names a part that is missing, before that is
/// the record's error: a mark between the main item's read and the parts' read (it puts
/// the dispatched main item, then deletes the parts) is seen on the next read.
const TORN_READ_ROUNDS: usize = 3;

/// How long parts of a split record outlive their commit, in case marking it
/// dispatched puts the main item and then fails before deleting them.
const PART_ORPHAN_GUARD: Duration = Duration::from_secs(30 * 24 * 3600);

/// The store on a DynamoDB table.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    layout: TableLayout,
    clock: Arc<dyn Clock>,
    part_bytes: usize,
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

impl DynamoStore {
    /// The store on the table `layout` describes (a table name alone means a dedicated
    /// table with partition key `pk` and TTL attribute `expires_at`), reading TTLs
    /// against `clock`.
    pub fn new(client: Client, layout: impl Into<TableLayout>, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            layout: layout.into(),
            clock,
            part_bytes: PART_BYTES,
        }
    }

    /// Splits records at `bytes` of messages per item instead of [`PART_BYTES`]: for
    /// simulations, which split records without moving megabytes per schedule.
    #[doc(hidden)]
    pub fn with_part_bytes(mut self, bytes: usize) -> Self {
        self.part_bytes = bytes;
        self
    }

    /// Where the protocol's records live.
    pub fn layout(&self) -> &TableLayout {
        &self.layout
    }

    fn key(&self, logical: &str) -> HashMap<String, AttributeValue> {
        self.layout.key(logical)
    }

    /// T's record behind a failed condition on its main item: `old`, the main item as the
    /// failure returned it (`ALL_OLD`, a cancellation reason), where it is the whole
    /// record; read whole otherwise (a split record's parts are never returned with it,
    /// nor is an item whose condition failed returned by every engine).
    pub(crate) async fn record_behind(
        &self,
        txn_id: TxnId,
        old: Option<&Item>,
    ) -> Result<Option<OutboxRecord>, StoreError> {
        match old {
            Some(main) if Reader::new(&self.layout, main).part_count()? == 0 => {
                outbox_from_items(&self.layout, main, &[]).map(Some)
            }
            _ => {
                reached(Branch::SplitRecordReadWhole);
                let mut read = self
                    .get_outboxes(&[txn_id])
                    .await
                    .inspect_err(|_| reached(Branch::FailRecordBehindRead))?;
                Ok(read.remove(&txn_id))
            }
        }
    }
}

/// The producer a table is: its name ([`crate::protocol::Producer::of_table`]). A name
/// no producer can be (none a DynamoDB table can have) names none.
pub(crate) fn producer_of(layout: &TableLayout) -> Option<crate::protocol::Producer> {
    crate::protocol::Producer::of_table(&layout.table).ok()
}

#[async_trait]
impl Store for DynamoStore {
    #[tracing::instrument(skip_all, fields(txn_id = %request.txn_id))]
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.transact(request, &[]).await
    }

    fn producer(&self) -> Option<crate::protocol::Producer> {
        producer_of(&self.layout)
    }

    fn runs_native_actions(&self) -> bool {
        true
    }

    #[tracing::instrument(skip_all, fields(txn_id = %request.txn_id, native_actions = actions.len()))]
    async fn commit_native(&self, request: &CommitRequest, actions: &[NativeAction]) -> Result<(), CommitError> {
        self.transact(request, actions).await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        Ok(self
            .get_keys(keys)
            .await?
            .into_values()
            .filter_map(|read| read.item)
            .map(|item| (item.key.clone(), item))
            .collect())
    }

    /// One strongly consistent `BatchGetItem` of whole items: a live item's `data`,
    /// `version` and outbox entries, a vacant key's `version` (kept across a delete), and
    /// either's chain heads (`chain:<destination>`, kept across a delete).
    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        let pks: Vec<String> = keys.iter().map(|key| key.as_str().to_owned()).collect();
        let found = self.batch_get(&pks).await?;
        keys.iter()
            .filter_map(|key| {
                found
                    .get(key.as_str())
                    .map(|item| key_from_item(&self.layout, key, item).map(|read| (key.clone(), read)))
            })
            .collect()
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        self.get_outboxes_each(txn_ids)
            .await?
            .into_iter()
            .map(|(txn_id, record)| record.map(|record| (txn_id, record)))
            .collect()
    }

    async fn get_outboxes_each(&self, txn_ids: &[TxnId]) -> Result<OutboxReads, StoreError> {
        let mut records = BTreeMap::new();
        let mut to_read = txn_ids.to_vec();
        for round in 1..=TORN_READ_ROUNDS {
            let (read, torn) = match self.read_outboxes(&to_read).await {
                Ok(result) => result,
                // A re-read that fails fails only the records it was for.
                Err(error) if round > 1 => {
                    reached(Branch::FailTornReread);
                    let shared = Arc::new(error);
                    records.extend(to_read.iter().map(|txn_id| {
                        let error = StoreError::Unavailable(Box::new(SharedError(shared.clone())));
                        (*txn_id, Err(error))
                    }));
                    break;
                }
                Err(error) => return Err(error),
            };
            records.extend(read);
            if round == TORN_READ_ROUNDS {
                records.extend(torn);
                break;
            }
            // A main item read before a concurrent mark put its dispatched form, with
            // parts read after that mark deleted them: read those again.
            if !torn.is_empty() {
                reached(Branch::ReadTornRecord);
            }
            to_read = torn.into_keys().collect();
            if to_read.is_empty() {
                break;
            }
        }
        Ok(records)
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(&idempotency_pk(slot))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
        match output.item() {
            Some(item) if !Reader::new(&self.layout, item).is_expired(self.clock.now())? => {
                Ok(Some(idempotency_from_item(&self.layout, item)?))
            }
            _ => Ok(None),
        }
    }

    async fn put_idempotency(&self, record: &IdempotencyRecord) -> Result<Option<IdempotencyRecord>, StoreError> {
        let now = self.clock.now();
        // An expired record may linger until TTL deletes it; it no longer counts.
        let result = self
            .client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(Some(idempotency_item(&self.layout, record)))
            .condition_expression(format!("{} OR #ttl <= :now", TableLayout::NOT_EXISTS))
            .set_expression_attribute_names(Some(self.layout.key_and_ttl_names()))
            .expression_attribute_values(":now", n(now.as_unix_seconds()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(None),
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                match service.err() {
                    PutItemError::ConditionalCheckFailedException(failed) => match failed.item() {
                        Some(item) => Ok(Some(idempotency_from_item(&self.layout, item)?)),
                        // No old item in the answer: read it.
                        None => self.get_idempotency(&record.slot).await,
                    },
                    _ => unreachable!("matched above"),
                }
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    #[tracing::instrument(skip_all, fields(txn_id = %txn_id))]
    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        let record = OutboxRecord::tombstone(txn_id, now, expires_at);
        let item =
            outbox_items(&self.layout, &record, expires_at, self.part_bytes).map_err(|reason| StoreError::Corrupt {
                key: outbox_pk(txn_id),
                reason,
            })?;
        let result = self
            .client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(item.into_iter().next())
            .condition_expression(TableLayout::NOT_EXISTS)
            .set_expression_attribute_names(Some(self.layout.key_names()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(TombstoneOutcome::Written),
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                let old = match service.err() {
                    PutItemError::ConditionalCheckFailedException(failed) => failed.item(),
                    _ => None,
                };
                reached(Branch::TombstoneExistsFromReason);
                match self.record_behind(txn_id, old).await? {
                    Some(record) => Ok(TombstoneOutcome::Exists(record)),
                    None => Err(StoreError::Corrupt {
                        key: outbox_pk(txn_id),
                        reason: "blocked by a record that cannot be read".into(),
                    }),
                }
            }
            Err(error) => {
                reached(Branch::FailTombstonePut);
                Err(unavailable(error))
            }
        }
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        // A record read as pending can only become dispatched (it can never be a
        // tombstone), so an unconditional put of its dispatched form is safe (but for a
        // consumed message's record replaced by a newer attempt's after it expired, which
        // only a mark delayed past the retention can meet: a known limit), and lets a
        // whole batch be marked in one `BatchWriteItem`. The parts of split records are
        // deleted only after their main item no longer names them: a reader never finds
        // a main item without its parts. A part left behind expires (PART_ORPHAN_GUARD).
        let mut puts = Vec::new();
        let mut owners: HashMap<String, usize> = HashMap::new();
        for (index, record) in records.iter().enumerate() {
            let main = dispatched_item(&self.layout, record, expires_at);
            owners.insert(outbox_pk(record.txn_id), index);
            puts.push(
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(main)).build().expect("item is set"))
                    .build(),
            );
        }
        let results: Vec<Result<(), StoreError>> = match self.batch_write(puts).await {
            Ok(left_over) => {
                let mut results: Vec<Result<(), StoreError>> = records.iter().map(|_| Ok(())).collect();
                for request in &left_over {
                    if let Some(index) = self.pk_of(request).and_then(|pk| owners.get(pk)) {
                        reached(Branch::MarkUnprocessedLeft);
                        results[*index] = Err(StoreError::Unavailable(
                            "DynamoDB left the write unprocessed after retries".into(),
                        ));
                    }
                }
                results
            }
            Err(error) => {
                reached(Branch::FailMarkBatchWrite);
                let shared = Arc::new(error);
                return records
                    .iter()
                    .map(|_| Err(StoreError::Unavailable(Box::new(SharedError(shared.clone())))))
                    .collect();
            }
        };
        let mut deletes = Vec::new();
        for (record, _) in records.iter().zip(&results).filter(|(_, marked)| marked.is_ok()) {
            let parts = split_messages(&record.messages, self.part_bytes).map_or(1, |groups| groups.len());
            for part in 1..parts {
                reached(Branch::MarkDeletesParts);
                let delete = DeleteRequest::builder()
                    .set_key(Some(self.key(&part_pk(record.txn_id, part))))
                    .build()
                    .expect("key is set");
                deletes.push(WriteRequest::builder().delete_request(delete).build());
            }
        }
        if !deletes.is_empty() {
            // The records are marked whatever happens here: a part not deleted is no
            // longer named by anything and expires by itself.
            match self.batch_write(deletes).await {
                Ok(left_over) if left_over.is_empty() => {}
                Ok(left_over) => {
                    reached(Branch::MarkPartsLeftToExpire);
                    tracing::warn!(parts = left_over.len(), "parts of dispatched records left to expire")
                }
                Err(error) => {
                    reached(Branch::MarkPartsLeftToExpire);
                    tracing::warn!(error = %error, "parts of dispatched records left to expire")
                }
            }
        }
        results
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        self.read_entity(key).await
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        self.set_applied(key, expected, name, applied).await
    }

    #[tracing::instrument(skip_all, fields(key = %commit.key, txn_id = %commit.entry.txn_id))]
    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        self.write_entity(commit).await
    }

    #[tracing::instrument(skip_all, fields(key = %commit.key, txn_id = %commit.entry.txn_id))]
    async fn commit_counter(
        &self,
        commit: &crate::counter::CounterCommit,
    ) -> Result<crate::counter::CounterCommitted, crate::counter::CounterError> {
        self.write_counter(commit).await
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        self.drop_entry(key, txn_id).await
    }

    #[tracing::instrument(skip_all, fields(key = %key, txn_id = %txn_id))]
    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        self.write_fence(key, txn_id, now, expires_at).await
    }

    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        self.settle_in_item(key, txn_id, now, expires_at, max_marks).await
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        self.forget_in_item(key, forget).await
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        self.put_dispatched_record(txn_id, now, expires_at).await
    }

    async fn keep_message(&self, kept: &KeptMessage) -> Result<(), StoreError> {
        self.put_kept(kept).await
    }

    async fn get_kept(&self, key: &str) -> Result<Option<KeptMessage>, StoreError> {
        self.read_kept(key).await
    }

    async fn remove_kept(&self, key: &str) -> Result<(), StoreError> {
        self.delete_kept(key).await
    }
}

/// One error reported for several records, its source chain kept.
#[derive(Debug)]
struct SharedError(Arc<StoreError>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(self.0.as_ref())
    }
}
