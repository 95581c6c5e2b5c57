//! The store port on DynamoDB.
//!
//! The commit is one `TransactWriteItems` whose `ClientRequestToken` is the transaction
//! id; a cancelled commit is explained item by item from `CancellationReasons` (never
//! from message text), and the outbox put asks for `ALL_OLD` so that finding this
//! transaction's own record means "already committed". Reads are consistent; items whose
//! TTL has passed read as absent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Delete, DeleteRequest, KeysAndAttributes, Put, PutRequest,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, WriteRequest,
};
use aws_sdk_dynamodb::Client;

use super::item::{
    business_from_item, business_item, idempotency_from_item, idempotency_item, idempotency_pk, is_expired, n,
    outbox_from_items, outbox_items, outbox_pk, part_count, part_pk, s, split_messages, ttl_seconds, Item, EXPIRES_AT,
    PK,
};
use crate::ports::{
    BoxError, BusinessWrite, Clock, CommitError, CommitRequest, ExpectedVersion, ItemKey, Store, StoreError,
    TombstoneOutcome, VersionedItem,
};
use crate::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, TxnId};
use crate::time::Timestamp;

/// Most actions in one `TransactWriteItems`.
const MAX_ACTIONS: usize = 100;
/// Most bytes in one `TransactWriteItems` (4 MB), less a margin for names and overhead.
const MAX_TRANSACTION_BYTES: usize = 4_000_000 - 64 * 1024;
/// Most keys in one `BatchGetItem`.
const MAX_BATCH_GET: usize = 100;
/// Most requests in one `BatchWriteItem`.
const MAX_BATCH_WRITE: usize = 25;
/// Rounds of retrying unprocessed keys or items before giving up.
const UNPROCESSED_ROUNDS: u32 = 5;
/// How long parts of a split record outlive their commit, in case marking it
/// dispatched deletes the main item and then fails before deleting them.
const PART_ORPHAN_GUARD: Duration = Duration::from_secs(30 * 24 * 3600);

/// The store on a DynamoDB table.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    clock: Arc<dyn Clock>,
}

/// What each action of a commit stands for, to read its cancellation reason.
enum Role {
    Business(ItemKey),
    Outbox,
    Part,
    Idempotency(IdempotencySlot),
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

impl DynamoStore {
    /// The store on `table`, reading TTLs against `clock`.
    pub fn new(client: Client, table: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            table: table.into(),
            clock,
        }
    }

    fn key(pk: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.to_owned(), s(pk))])
    }

    fn version_condition(expected: ExpectedVersion) -> (String, Option<(String, AttributeValue)>) {
        match expected {
            ExpectedVersion::Absent => ("attribute_not_exists(pk)".into(), None),
            ExpectedVersion::Exactly(version) => ("version = :expected".into(), Some((":expected".into(), n(version)))),
        }
    }

    fn actions(&self, request: &CommitRequest) -> Result<(Vec<TransactWriteItem>, Vec<Role>), CommitError> {
        let invalid = |_: aws_smithy_types::error::operation::BuildError| CommitError::Invalid {
            reason: "a commit action misses a required field",
        };
        let now = self.clock.now();
        let mut actions = Vec::new();
        let mut roles = Vec::new();
        let mut bytes = 0;
        for write in &request.writes {
            let action = match write {
                BusinessWrite::Put { key, data, expected } => {
                    let (condition, value) = Self::version_condition(*expected);
                    let item = business_item(key, expected.next(), data);
                    bytes += data.to_string().len() + key.as_str().len();
                    TransactWriteItem::builder()
                        .put(
                            Put::builder()
                                .table_name(&self.table)
                                .set_item(Some(item))
                                .condition_expression(condition)
                                .set_expression_attribute_values(value.map(|v| HashMap::from([v])))
                                .build()
                                .map_err(invalid)?,
                        )
                        .build()
                }
                BusinessWrite::Delete { key, version } => {
                    let (condition, value) = Self::version_condition(ExpectedVersion::Exactly(*version));
                    TransactWriteItem::builder()
                        .delete(
                            Delete::builder()
                                .table_name(&self.table)
                                .set_key(Some(Self::key(key.as_str())))
                                .condition_expression(condition)
                                .set_expression_attribute_values(value.map(|v| HashMap::from([v])))
                                .build()
                                .map_err(invalid)?,
                        )
                        .build()
                }
                BusinessWrite::Check { key, expected } => {
                    let (condition, value) = Self::version_condition(*expected);
                    TransactWriteItem::builder()
                        .condition_check(
                            ConditionCheck::builder()
                                .table_name(&self.table)
                                .set_key(Some(Self::key(key.as_str())))
                                .condition_expression(condition)
                                .set_expression_attribute_values(value.map(|v| HashMap::from([v])))
                                .build()
                                .map_err(invalid)?,
                        )
                        .build()
                }
            };
            actions.push(action);
            roles.push(Role::Business(write.key().clone()));
        }
        let part_expiry = now.plus(PART_ORPHAN_GUARD);
        let outbox = outbox_items(&request.outbox, part_expiry).map_err(|reason| CommitError::TooLarge { reason })?;
        for (index, item) in outbox.into_iter().enumerate() {
            bytes += item.values().map(|v| v.as_s().map_or(16, String::len)).sum::<usize>();
            let mut put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(pk)");
            if index == 0 {
                // What blocks the put, if anything: this transaction's own record
                // (committed already) or a tombstone (never will).
                put = put.return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
            }
            actions.push(TransactWriteItem::builder().put(put.build().map_err(invalid)?).build());
            roles.push(if index == 0 { Role::Outbox } else { Role::Part });
        }
        if let Some(record) = &request.idempotency {
            bytes += record.response.body.len();
            // An expired record may linger until TTL deletes it; it no longer counts.
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(idempotency_item(record)))
                .condition_expression("attribute_not_exists(pk) OR #expires_at <= :now")
                .expression_attribute_names("#expires_at", EXPIRES_AT)
                .expression_attribute_values(":now", n(now.as_unix_seconds()))
                .build()
                .map_err(invalid)?;
            actions.push(TransactWriteItem::builder().put(put).build());
            roles.push(Role::Idempotency(record.slot.clone()));
        }
        if actions.len() > MAX_ACTIONS {
            return Err(CommitError::TooLarge {
                reason: format!("{} actions, at most {MAX_ACTIONS}", actions.len()),
            });
        }
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(CommitError::TooLarge {
                reason: format!("about {bytes} bytes, at most {MAX_TRANSACTION_BYTES}"),
            });
        }
        Ok((actions, roles))
    }

    /// Explains a cancelled commit from its reasons, which come in request order.
    fn explain(
        request: &CommitRequest,
        roles: &[Role],
        reasons: &[CancellationReason],
        source: BoxError,
    ) -> Result<(), CommitError> {
        let mut failures = Vec::new();
        for (role, reason) in roles.iter().zip(reasons) {
            match (role, reason.code()) {
                (_, None | Some("None")) => {}
                (Role::Outbox, Some("ConditionalCheckFailed")) => {
                    let state = reason
                        .item()
                        .and_then(|item| item.get("state"))
                        .and_then(|v| v.as_s().ok());
                    let txn = reason
                        .item()
                        .and_then(|item| item.get("txn_id"))
                        .and_then(|v| v.as_s().ok());
                    match state.map(String::as_str) {
                        // This transaction's own record: an earlier attempt (whose reply was
                        // lost) committed everything. Atomicity makes the other reasons moot.
                        Some("pending" | "dispatched") if txn == Some(&request.txn_id.to_string()) => return Ok(()),
                        _ => failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id })),
                    }
                }
                (Role::Part, Some("ConditionalCheckFailed")) => {
                    failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id }))
                }
                (Role::Business(key), Some("ConditionalCheckFailed")) => {
                    failures.push((2, CommitError::VersionConflict { key: key.clone() }))
                }
                (Role::Idempotency(slot), Some("ConditionalCheckFailed")) => {
                    failures.push((0, CommitError::IdempotencyKeyUsed { slot: slot.clone() }))
                }
                (
                    _,
                    Some(
                        "TransactionConflict"
                        | "ThrottlingError"
                        | "ProvisionedThroughputExceeded"
                        | "RequestLimitExceeded",
                    ),
                ) => return Err(CommitError::Contention(source)),
                (_, Some("ItemCollectionSizeLimitExceeded")) => {
                    return Err(CommitError::TooLarge {
                        reason: "item collection size limit exceeded".into(),
                    })
                }
                (_, Some("ValidationError")) => {
                    return Err(CommitError::Invalid {
                        reason: "DynamoDB refused an action as invalid",
                    })
                }
                (_, Some(_)) => return Err(CommitError::Ambiguous(source)),
            }
        }
        match failures.into_iter().min_by_key(|(rank, _)| *rank) {
            Some((_, error)) => Err(error),
            None => Err(CommitError::Ambiguous(source)),
        }
    }

    /// Consistent reads of `pks`, in batches of 100, retrying unprocessed keys.
    async fn batch_get(&self, pks: &[String]) -> Result<HashMap<String, Item>, StoreError> {
        let mut found = HashMap::new();
        for chunk in pks.chunks(MAX_BATCH_GET) {
            let keys: Vec<_> = chunk.iter().map(|pk| Self::key(pk)).collect();
            let mut request = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(unavailable)?,
            );
            let mut round = 0;
            while let Some(keys) = request.take() {
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, keys)
                    .send()
                    .await
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                for item in output
                    .responses()
                    .and_then(|tables| tables.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    if let Some(pk) = item.get(PK).and_then(|v| v.as_s().ok()) {
                        found.insert(pk.clone(), item.clone());
                    }
                }
                request = output
                    .unprocessed_keys()
                    .and_then(|tables| tables.get(&self.table))
                    .cloned();
                if request.as_ref().is_some_and(|keys| !keys.keys().is_empty()) {
                    round += 1;
                    if round > UNPROCESSED_ROUNDS {
                        return Err(StoreError::Unavailable(
                            "DynamoDB left keys unprocessed after retries".into(),
                        ));
                    }
                    self.clock.sleep(Duration::from_millis(25 << round)).await;
                } else {
                    request = None;
                }
            }
        }
        Ok(found)
    }

    /// `BatchWriteItem` of `requests`, 25 at a time, retrying unprocessed items. Returns
    /// the requests that could not be written.
    async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<Vec<WriteRequest>, StoreError> {
        let mut left_over = Vec::new();
        for chunk in requests.chunks(MAX_BATCH_WRITE) {
            let mut pending = chunk.to_vec();
            let mut round = 0;
            while !pending.is_empty() {
                let output = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, pending)
                    .send()
                    .await
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                pending = output
                    .unprocessed_items()
                    .and_then(|tables| tables.get(&self.table))
                    .cloned()
                    .unwrap_or_default();
                if !pending.is_empty() {
                    round += 1;
                    if round > UNPROCESSED_ROUNDS {
                        left_over.extend(pending);
                        break;
                    }
                    self.clock.sleep(Duration::from_millis(25 << round)).await;
                }
            }
        }
        Ok(left_over)
    }

    fn pk_of(request: &WriteRequest) -> Option<&str> {
        let item = request
            .put_request()
            .map(|put| put.item())
            .or_else(|| request.delete_request().map(|delete| delete.key()));
        item.and_then(|item| item.get(PK))
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
    }
}

#[async_trait]
impl Store for DynamoStore {
    #[tracing::instrument(skip_all, fields(txn_id = %request.txn_id))]
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let (actions, roles) = self.actions(request)?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(actions))
            .client_request_token(request.txn_id.to_string())
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
                    Self::explain(request, &roles, &reasons, Box::new(error))
                }
                TransactWriteItemsError::ProvisionedThroughputExceededException(_)
                | TransactWriteItemsError::RequestLimitExceeded(_)
                | TransactWriteItemsError::ThrottlingException(_)
                | TransactWriteItemsError::TransactionInProgressException(_) => {
                    Err(CommitError::Contention(Box::new(error)))
                }
                TransactWriteItemsError::ResourceNotFoundException(_) => Err(CommitError::Unavailable(Box::new(error))),
                TransactWriteItemsError::IdempotentParameterMismatchException(_) => Err(CommitError::Invalid {
                    reason: "the transaction id was used for a different commit",
                }),
                // An internal error may or may not have applied the commit.
                _ => Err(CommitError::Ambiguous(Box::new(error))),
            },
            // Never sent.
            SdkError::ConstructionFailure(_) => Err(CommitError::Invalid {
                reason: "the request could not be built",
            }),
            // Sent, or maybe sent: a timeout, a lost connection, an unreadable reply.
            _ => Err(CommitError::Ambiguous(Box::new(error))),
        }
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        let pks: Vec<String> = keys.iter().map(|key| key.as_str().to_owned()).collect();
        let found = self.batch_get(&pks).await?;
        keys.iter()
            .filter_map(|key| {
                found
                    .get(key.as_str())
                    .map(|item| business_from_item(key, item).map(|v| (key.clone(), v)))
            })
            .collect()
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        let now = self.clock.now();
        let pks: Vec<String> = txn_ids.iter().map(|txn| outbox_pk(*txn)).collect();
        let mains = self.batch_get(&pks).await?;
        let mut live = Vec::new();
        let mut part_pks = Vec::new();
        for txn_id in txn_ids {
            let Some(main) = mains.get(&outbox_pk(*txn_id)) else {
                continue;
            };
            if is_expired(main, now)? {
                continue;
            }
            let parts = part_count(main)?;
            part_pks.extend((1..=parts).map(|part| part_pk(*txn_id, part)));
            live.push((*txn_id, main, parts));
        }
        let parts = if part_pks.is_empty() {
            HashMap::new()
        } else {
            self.batch_get(&part_pks).await?
        };
        let mut records = BTreeMap::new();
        for (txn_id, main, count) in live {
            let items: Vec<&Item> = (1..=count)
                .map(|part| {
                    parts.get(&part_pk(txn_id, part)).ok_or_else(|| StoreError::Corrupt {
                        key: part_pk(txn_id, part),
                        reason: "a part of a split outbox record is missing".into(),
                    })
                })
                .collect::<Result<_, _>>()?;
            records.insert(txn_id, outbox_from_items(main, &items)?);
        }
        Ok(records)
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(&idempotency_pk(slot))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
        match output.item() {
            Some(item) if !is_expired(item, self.clock.now())? => Ok(Some(idempotency_from_item(item)?)),
            _ => Ok(None),
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
        let item = outbox_items(&record, expires_at).map_err(|reason| StoreError::Corrupt {
            key: outbox_pk(txn_id),
            reason,
        })?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(item.into_iter().next())
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(TombstoneOutcome::Written),
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                let old = match service.err() {
                    PutItemError::ConditionalCheckFailedException(failed) => failed.item().cloned(),
                    _ => None,
                };
                match old {
                    Some(main) if part_count(&main)? == 0 => {
                        Ok(TombstoneOutcome::Exists(outbox_from_items(&main, &[])?))
                    }
                    // A split record: read it whole.
                    _ => match self.get_outboxes(&[txn_id]).await?.remove(&txn_id) {
                        Some(record) => Ok(TombstoneOutcome::Exists(record)),
                        None => Err(StoreError::Corrupt {
                            key: outbox_pk(txn_id),
                            reason: "blocked by a record that cannot be read".into(),
                        }),
                    },
                }
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        // A record read as pending can only become dispatched (it can never be a
        // tombstone), so an unconditional put of its dispatched form is safe, and lets a
        // whole batch be marked in one `BatchWriteItem`. Parts of split records are
        // deleted in the same call.
        let mut requests = Vec::new();
        let mut owners: HashMap<String, usize> = HashMap::new();
        for (index, record) in records.iter().enumerate() {
            let pk = outbox_pk(record.txn_id);
            let mut main = HashMap::from([
                (PK.to_owned(), s(pk.clone())),
                ("txn_id".to_owned(), s(record.txn_id.to_string())),
                ("state".to_owned(), s(OutboxState::Dispatched.as_str())),
                ("created_at".to_owned(), n(record.created_at.as_millis())),
            ]);
            main.insert(EXPIRES_AT.to_owned(), n(ttl_seconds(expires_at)));
            owners.insert(pk, index);
            requests.push(
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(main)).build().expect("item is set"))
                    .build(),
            );
            let parts = split_messages(&record.messages).map_or(1, |groups| groups.len());
            for part in 1..parts {
                let pk = part_pk(record.txn_id, part);
                let delete = DeleteRequest::builder()
                    .set_key(Some(Self::key(&pk)))
                    .build()
                    .expect("key is set");
                owners.insert(pk, index);
                requests.push(WriteRequest::builder().delete_request(delete).build());
            }
        }
        match self.batch_write(requests).await {
            Ok(left_over) => {
                let mut results: Vec<Result<(), StoreError>> = records.iter().map(|_| Ok(())).collect();
                for request in &left_over {
                    if let Some(index) = Self::pk_of(request).and_then(|pk| owners.get(pk)) {
                        results[*index] = Err(StoreError::Unavailable(
                            "DynamoDB left the write unprocessed after retries".into(),
                        ));
                    }
                }
                results
            }
            Err(error) => {
                let shared = Arc::new(error);
                records
                    .iter()
                    .map(|_| Err(StoreError::Unavailable(Box::new(SharedError(shared.clone())))))
                    .collect()
            }
        }
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
