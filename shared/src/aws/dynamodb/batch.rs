//! Batched reads and writes: `BatchGetItem` and `BatchWriteItem`, retrying what DynamoDB
//! leaves unprocessed, and the outbox records read whole.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::{KeysAndAttributes, WriteRequest};

use crate::aws::item::{outbox_from_items, outbox_pk, part_pk, Item, Reader};
use crate::ports::{OutboxReads, StoreError};
use crate::protocol::TxnId;

use super::branches::{reached, Branch};
use super::{unavailable, DynamoStore};

/// Most keys in one `BatchGetItem`.
const MAX_BATCH_GET: usize = 100;
/// Most requests in one `BatchWriteItem`.
const MAX_BATCH_WRITE: usize = 25;
/// Rounds of retrying unprocessed keys or items before giving up.
const UNPROCESSED_ROUNDS: u32 = 5;

impl DynamoStore {
    /// Consistent reads of `pks`, in batches of 100, retrying unprocessed keys.
    pub(super) async fn batch_get(&self, pks: &[String]) -> Result<HashMap<String, Item>, StoreError> {
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
                        reached(Branch::BatchGetUnprocessedLeft);
                        return Err(StoreError::Unavailable(
                            "DynamoDB left keys unprocessed after retries".into(),
                        ));
                    }
                    reached(Branch::BatchUnprocessedRetried);
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
    pub(super) async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<Vec<WriteRequest>, StoreError> {
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
                    reached(Branch::BatchUnprocessedRetried);
                    self.clock.sleep(Duration::from_millis(25 << round)).await;
                }
            }
        }
        Ok(left_over)
    }

    /// One consistent read of the records of `txn_ids`: those read (or that cannot be
    /// understood), and apart those whose main item names a part that is not there
    /// (torn: worth reading again).
    pub(super) async fn read_outboxes(&self, txn_ids: &[TxnId]) -> Result<(OutboxReads, OutboxReads), StoreError> {
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

    pub(super) fn pk_of<'a>(&self, request: &'a WriteRequest) -> Option<&'a str> {
        let item = request
            .put_request()
            .map(|put| put.item())
            .or_else(|| request.delete_request().map(|delete| delete.key()));
        item.and_then(|item| self.layout.logical_key(item))
    }
}
