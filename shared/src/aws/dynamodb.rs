//! The store port on DynamoDB.
//!
//! The commit is one `TransactWriteItems` whose `ClientRequestToken` is the transaction
//! id: the application's native actions first, in its order, then the portable business
//! writes, then the protocol's records. A cancelled commit is explained item by item from
//! `CancellationReasons` (never from message text), and the outbox put asks for `ALL_OLD`
//! so that finding this transaction's own record means "already committed". Reads are
//! consistent; items whose TTL has passed read as absent. Where the protocol's records
//! live is the [`TableLayout`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Delete, DeleteRequest, KeysAndAttributes, Put, PutRequest,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, WriteRequest,
};
use aws_sdk_dynamodb::Client;

use super::item::{
    business_from_item, business_item, dispatched_item, idempotency_from_item, idempotency_item, idempotency_pk, n,
    outbox_from_items, outbox_items, outbox_pk, part_pk, split_messages, Item, Reader, PART_BYTES,
};
use super::size::{action_bytes, item_bytes};
use crate::ports::{
    BoxError, BusinessWrite, Clock, CommitError, CommitRequest, ExpectedVersion, ItemKey, NativeAction, OutboxReads,
    Store, StoreError, TombstoneOutcome, VersionedItem,
};
use crate::protocol::{IdempotencyRecord, IdempotencySlot, OutboxRecord, OutboxState, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

/// Most actions in one `TransactWriteItems`.
pub const MAX_ACTIONS: usize = 100;
/// Most bytes in one `TransactWriteItems` (4 MB), less a margin for the request's own
/// overhead.
pub const MAX_TRANSACTION_BYTES: usize = 4_000_000 - 64 * 1024;
/// Most keys in one `BatchGetItem`.
const MAX_BATCH_GET: usize = 100;
/// Most requests in one `BatchWriteItem`.
const MAX_BATCH_WRITE: usize = 25;
/// Rounds of retrying unprocessed keys or items before giving up.
const UNPROCESSED_ROUNDS: u32 = 5;
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

/// What each action of a commit stands for, to read its cancellation reason.
enum Role {
    Native(usize),
    Business(ItemKey),
    Outbox,
    Part,
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

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(error))
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

    /// The condition of a portable write expecting `expected`, with its names and values.
    fn version_condition(&self, expected: ExpectedVersion) -> (&'static str, Option<HashMap<String, AttributeValue>>) {
        match expected {
            ExpectedVersion::Absent => (TableLayout::NOT_EXISTS, None),
            ExpectedVersion::Exactly(version) => (
                "attribute_exists(#pk) AND version = :expected",
                Some(HashMap::from([(":expected".to_owned(), n(version))])),
            ),
        }
    }

    fn portable(&self, write: &BusinessWrite) -> Result<(TransactWriteItem, usize), CommitError> {
        let table = &self.layout.table;
        let names = Some(self.layout.key_names());
        let action = match write {
            BusinessWrite::Put { key, data, expected } => {
                let (condition, values) = self.version_condition(*expected);
                let item = business_item(&self.layout, key, expected.next(), data);
                let bytes = item_bytes(&item);
                let put = Put::builder()
                    .table_name(table)
                    .set_item(Some(item))
                    .condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?;
                return Ok((TransactWriteItem::builder().put(put).build(), bytes));
            }
            BusinessWrite::Delete { key, version } => {
                let (condition, values) = self.version_condition(ExpectedVersion::Exactly(*version));
                let delete = Delete::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().delete(delete).build()
            }
            BusinessWrite::Check { key, expected } => {
                let (condition, values) = self.version_condition(*expected);
                let check = ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(self.key(key.as_str())))
                    .condition_expression(condition)
                    .set_expression_attribute_names(names)
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
    fn actions(&self, request: &CommitRequest, native: &[NativeAction]) -> Result<Actions, CommitError> {
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
            let (action, bytes) = self.portable(write)?;
            application_bytes += bytes;
            items.push(action);
            roles.push(Role::Business(write.key().clone()));
        }
        let application_actions = items.len();

        let mut protocol_bytes = 0;
        let part_expiry = now.plus(PART_ORPHAN_GUARD);
        let outbox = outbox_items(&self.layout, &request.outbox, part_expiry, self.part_bytes)
            .map_err(|reason| CommitError::TooLarge { reason })?;
        let record_items = outbox.len();
        for (index, item) in outbox.into_iter().enumerate() {
            protocol_bytes += item_bytes(&item);
            let mut put = Put::builder()
                .table_name(&self.layout.table)
                .set_item(Some(item))
                .condition_expression(TableLayout::NOT_EXISTS)
                .set_expression_attribute_names(Some(self.layout.key_names()));
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
                    match state.map(String::as_str) {
                        // This transaction's own record: an earlier attempt (whose reply was
                        // lost) committed everything. Atomicity makes the other reasons moot.
                        Some("pending" | "dispatched") if txn == Some(&request.txn_id.to_string()) => {
                            return Explained::Decided(Ok(()))
                        }
                        // No old item came back (an engine that leaves `ALL_OLD` out): the
                        // record may be this transaction's own as well as a tombstone.
                        _ if reason.item().is_none() => {
                            unread_record = true;
                            failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id }))
                        }
                        _ => failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id })),
                    }
                }
                (Role::Part, "ConditionalCheckFailed") => {
                    failures.push((1, CommitError::Tombstoned { txn_id: request.txn_id }))
                }
                (Role::Business(key), "ConditionalCheckFailed") => {
                    failures.push((2, CommitError::VersionConflict { key: key.clone() }))
                }
                (Role::Idempotency(slot), "ConditionalCheckFailed") => {
                    failures.push((0, CommitError::IdempotencyKeyUsed { slot: slot.clone() }))
                }
                // The application's own action: whatever DynamoDB says of it is the
                // application's to read (its condition, its item collection, its
                // expression).
                (Role::Native(index), code) => failures.push((
                    2,
                    CommitError::ActionCancelled {
                        index: *index,
                        code: code.to_owned(),
                        item: reason.item().cloned(),
                    },
                )),
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
    async fn blocked_by(&self, txn_id: TxnId, otherwise: CommitError) -> Result<(), CommitError> {
        match self.get_outboxes(&[txn_id]).await {
            Ok(mut found) => match found.remove(&txn_id) {
                Some(record) if record.state != OutboxState::Tombstone => Ok(()),
                _ => Err(otherwise),
            },
            // This request wrote nothing, but whether an earlier one did is unknown.
            Err(read) => Err(CommitError::Ambiguous(Box::new(read))),
        }
    }

    async fn transact(&self, request: &CommitRequest, native: &[NativeAction]) -> Result<(), CommitError> {
        let Actions { items, roles } = self.actions(request, native)?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(request.txn_id.to_string())
            // One request per call: the SDK would retry a timed-out request and return
            // only the last request's error, hiding one that may still apply (DESIGN.md
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
                        Explained::ReadRecord { otherwise } => self.blocked_by(request.txn_id, otherwise).await,
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

    /// Consistent reads of `pks`, in batches of 100, retrying unprocessed keys.
    async fn batch_get(&self, pks: &[String]) -> Result<HashMap<String, Item>, StoreError> {
        let mut found = HashMap::new();
        for chunk in pks.chunks(MAX_BATCH_GET) {
            let keys: Vec<_> = chunk.iter().map(|pk| self.key(pk)).collect();
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
                    .request_items(&self.layout.table, keys)
                    .send()
                    .await
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                for item in output
                    .responses()
                    .and_then(|tables| tables.get(&self.layout.table))
                    .into_iter()
                    .flatten()
                {
                    if let Some(pk) = self.layout.logical_key(item) {
                        found.insert(pk.to_owned(), item.clone());
                    }
                }
                request = output
                    .unprocessed_keys()
                    .and_then(|tables| tables.get(&self.layout.table))
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
                    .request_items(&self.layout.table, pending)
                    .send()
                    .await
                    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
                pending = output
                    .unprocessed_items()
                    .and_then(|tables| tables.get(&self.layout.table))
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

    /// One consistent read of the records of `txn_ids`: those read (or that cannot be
    /// understood), and apart those whose main item names a part that is not there
    /// (torn: worth reading again).
    async fn read_outboxes(&self, txn_ids: &[TxnId]) -> Result<(OutboxReads, OutboxReads), StoreError> {
        let now = self.clock.now();
        let pks: Vec<String> = txn_ids.iter().map(|txn| outbox_pk(*txn)).collect();
        let mains = self.batch_get(&pks).await?;
        let mut records = BTreeMap::new();
        let mut torn = BTreeMap::new();
        let mut live = Vec::new();
        let mut part_pks = Vec::new();
        for txn_id in txn_ids {
            let Some(main) = mains.get(&outbox_pk(*txn_id)) else {
                continue;
            };
            let reader = Reader::new(&self.layout, main);
            let parts = match reader
                .is_expired(now)
                .and_then(|expired| Ok((expired, reader.part_count()?)))
            {
                Ok((true, _)) => continue,
                Ok((false, parts)) => parts,
                Err(error) => {
                    records.insert(*txn_id, Err(error));
                    continue;
                }
            };
            part_pks.extend((1..=parts).map(|part| part_pk(*txn_id, part)));
            live.push((*txn_id, main, parts));
        }
        let parts = if part_pks.is_empty() {
            HashMap::new()
        } else {
            self.batch_get(&part_pks).await?
        };
        for (txn_id, main, count) in live {
            let items: Result<Vec<&Item>, StoreError> = (1..=count)
                .map(|part| {
                    parts.get(&part_pk(txn_id, part)).ok_or_else(|| StoreError::Corrupt {
                        key: part_pk(txn_id, part),
                        reason: "a part of a split outbox record is missing".into(),
                    })
                })
                .collect();
            match items {
                Ok(items) => {
                    records.insert(txn_id, outbox_from_items(&self.layout, main, &items));
                }
                Err(missing) => {
                    torn.insert(txn_id, Err(missing));
                }
            }
        }
        Ok((records, torn))
    }

    fn pk_of<'a>(&self, request: &'a WriteRequest) -> Option<&'a str> {
        let item = request
            .put_request()
            .map(|put| put.item())
            .or_else(|| request.delete_request().map(|delete| delete.key()));
        item.and_then(|item| self.layout.logical_key(item))
    }
}

#[async_trait]
impl Store for DynamoStore {
    #[tracing::instrument(skip_all, fields(txn_id = %request.txn_id))]
    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        self.transact(request, &[]).await
    }

    fn runs_native_actions(&self) -> bool {
        true
    }

    #[tracing::instrument(skip_all, fields(txn_id = %request.txn_id, native_actions = actions.len()))]
    async fn commit_native(&self, request: &CommitRequest, actions: &[NativeAction]) -> Result<(), CommitError> {
        self.transact(request, actions).await
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        let pks: Vec<String> = keys.iter().map(|key| key.as_str().to_owned()).collect();
        let found = self.batch_get(&pks).await?;
        keys.iter()
            .filter_map(|key| {
                found
                    .get(key.as_str())
                    .map(|item| business_from_item(&self.layout, key, item).map(|v| (key.clone(), v)))
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
                    PutItemError::ConditionalCheckFailedException(failed) => failed.item().cloned(),
                    _ => None,
                };
                match old {
                    Some(main) if Reader::new(&self.layout, &main).part_count()? == 0 => {
                        Ok(TombstoneOutcome::Exists(outbox_from_items(&self.layout, &main, &[])?))
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
                        results[*index] = Err(StoreError::Unavailable(
                            "DynamoDB left the write unprocessed after retries".into(),
                        ));
                    }
                }
                results
            }
            Err(error) => {
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
                    tracing::warn!(parts = left_over.len(), "parts of dispatched records left to expire")
                }
                Err(error) => tracing::warn!(error = %error, "parts of dispatched records left to expire"),
            }
        }
        results
    }
}

fn invalid(_: aws_smithy_types::error::operation::BuildError) -> CommitError {
    CommitError::Invalid {
        reason: "a commit action misses a required field".into(),
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
