//! What one unit of work stages for its atomic commit: business writes (the portable
//! form, and the application's native DynamoDB actions) and outgoing messages, beside
//! strongly consistent reads. The request path's [`crate::request::Transaction`] and a
//! consumer's handler ([`crate::consumer`]) stage through the same [`Staging`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::ports::{BusinessWrite, ExpectedVersion, ItemKey, NativeAction, Store, StoreError, VersionedItem};
use crate::protocol::{Message, MessageId, OutgoingMessage, TxnId};
use crate::settings::TransactionLimits;

/// Business writes and messages staged for one commit, and the reads they depend on.
pub struct Staging {
    txn_id: TxnId,
    store: Arc<dyn Store>,
    /// At most one write per item: a later one replaces an earlier one.
    pub(crate) writes: BTreeMap<ItemKey, BusinessWrite>,
    /// The application's native actions, in order.
    pub(crate) native: Vec<NativeAction>,
    pub(crate) messages: Vec<OutgoingMessage>,
    /// Items read before the handler ran (the entity mode's entity), served from here.
    read_already: BTreeMap<ItemKey, Option<VersionedItem>>,
}

impl Staging {
    /// Nothing staged yet for transaction `txn_id`, reading from `store`.
    pub(crate) fn new(txn_id: TxnId, store: Arc<dyn Store>) -> Self {
        Self {
            txn_id,
            store,
            writes: BTreeMap::new(),
            native: Vec::new(),
            messages: Vec::new(),
            read_already: BTreeMap::new(),
        }
    }

    /// This staging, serving reads of `key` with `item` (read just before, strongly
    /// consistent) instead of reading it again.
    pub(crate) fn with_read(mut self, key: ItemKey, item: Option<VersionedItem>) -> Self {
        self.read_already.insert(key, item);
        self
    }

    /// The transaction whose commit this stages (its messages' ids derive from it).
    pub fn id(&self) -> TxnId {
        self.txn_id
    }

    /// Reads one business item, strongly consistent.
    pub async fn get(&self, key: &ItemKey) -> Result<Option<VersionedItem>, StoreError> {
        Ok(self.get_many(std::slice::from_ref(key)).await?.remove(key))
    }

    /// Reads several business items in one call, strongly consistent.
    pub async fn get_many(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        let to_read: Vec<ItemKey> = keys
            .iter()
            .filter(|key| !self.read_already.contains_key(*key))
            .cloned()
            .collect();
        let mut found = if to_read.is_empty() {
            BTreeMap::new()
        } else {
            self.store.get_items(&to_read).await?
        };
        for key in keys {
            if let Some(Some(item)) = self.read_already.get(key) {
                found.insert(key.clone(), item.clone());
            }
        }
        Ok(found)
    }

    /// Stages a put of `data` to `key`, conditioned on `expected`. A later write to the
    /// same key replaces this one.
    pub fn put(&mut self, key: ItemKey, data: Value, expected: ExpectedVersion) {
        self.stage(BusinessWrite::Put { key, data, expected });
    }

    /// Stages a delete of `key`, conditioned on its `version`.
    pub fn delete(&mut self, key: ItemKey, version: u64) {
        self.stage(BusinessWrite::Delete { key, version });
    }

    /// Makes the commit depend on `key` being as `expected`, without writing it.
    pub fn check(&mut self, key: ItemKey, expected: ExpectedVersion) {
        self.stage(BusinessWrite::Check { key, expected });
    }

    fn stage(&mut self, write: BusinessWrite) {
        self.writes.insert(write.key().clone(), write);
    }

    /// Adds one of the application's native DynamoDB actions to the commit, after those
    /// added before, and returns its index (the one a cancellation names). Only the
    /// DynamoDB store runs them: on another store the commit fails, writing nothing.
    pub fn action(&mut self, action: NativeAction) -> usize {
        self.native.push(action);
        self.native.len() - 1
    }

    /// The native actions added so far.
    pub fn actions(&self) -> &[NativeAction] {
        &self.native
    }

    /// Emits a message, published if and only if the commit applies. Returns its stable
    /// id: `{transaction}:{position}`. The message keeps the trace context of the span in
    /// hand ([`crate::telemetry::current`]), which every send of it carries.
    pub fn emit(&mut self, message: Message) -> MessageId {
        let position = u32::try_from(self.messages.len()).unwrap_or(u32::MAX);
        let outgoing = OutgoingMessage::new(self.txn_id, position, message).with_trace(crate::telemetry::current());
        let id = outgoing.id.clone();
        self.messages.push(outgoing);
        id
    }

    /// The messages emitted so far.
    pub fn messages(&self) -> &[OutgoingMessage] {
        &self.messages
    }

    /// Whether the messages keep within `limits`; if not, which limit they break.
    pub(crate) fn check_limits(&self, limits: &TransactionLimits) -> Result<(), String> {
        let bytes: usize = self.messages.iter().map(OutgoingMessage::payload_bytes).sum();
        if self.messages.len() > limits.max_messages {
            Err(format!(
                "{} messages, at most {} allowed",
                self.messages.len(),
                limits.max_messages
            ))
        } else if bytes > limits.max_message_bytes {
            Err(format!(
                "{bytes} bytes of messages, at most {} allowed",
                limits.max_message_bytes
            ))
        } else {
            Ok(())
        }
    }
}
