//! What one unit of work stages for its atomic commit: business writes (the portable
//! form, and the application's native DynamoDB actions) and outgoing messages, beside
//! strongly consistent reads. The request path's [`crate::request::Transaction`] and a
//! consumer's handler ([`crate::consumer`]) stage through the same [`Staging`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::ports::{BusinessWrite, ExpectedVersion, ItemKey, KeyRead, NativeAction, Store, StoreError, VersionedItem};
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
    /// The keys read across their lives ([`Store::get_keys`]), without their items: a
    /// create of one read holding no item expects it at the version read
    /// ([`ExpectedVersion::AbsentAt`]), and the messages of a change of one are positioned
    /// in its history from the heads read.
    keys: Mutex<BTreeMap<ItemKey, KeyRead>>,
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
            keys: Mutex::default(),
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
            self.read_keys(&to_read).await?
        };
        for key in keys {
            if let Some(Some(item)) = self.read_already.get(key) {
                found.insert(key.clone(), item.clone());
            }
        }
        Ok(found)
    }

    /// Reads `keys` with their versions across their lives where the store offers it
    /// ([`Store::get_keys`]), noting the version of each key that holds no item.
    async fn read_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        let mut read = match self.store.get_keys(keys).await {
            Ok(read) => read,
            Err(StoreError::Unsupported(_)) => return self.store.get_items(keys).await,
            Err(error) => return Err(error),
        };
        let mut held = self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut found = BTreeMap::new();
        for key in keys {
            let key_read = read.remove(key).unwrap_or_default();
            if let Some(item) = &key_read.item {
                found.insert(key.clone(), item.clone());
            }
            held.insert(key.clone(), key_read);
        }
        Ok(found)
    }

    /// Notes what a read of `key` made outside this staging found (a read overlapped with
    /// the transaction's begin): reads of it are served from it, a create of it is pinned
    /// to it, and messages are positioned from it, as if this staging had read it.
    pub(crate) fn note_read(&mut self, key: ItemKey, read: KeyRead) {
        self.read_already.insert(key.clone(), read.item.clone());
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, read);
    }

    /// Whether the commit would place its messages in `key`'s history, changing it, but
    /// holds no read of the key across its lives to place them from (its item was read
    /// outside this staging, without its chain heads, [`Self::with_read`]): then
    /// [`Self::note_heads`] with a read of the key places them.
    pub(crate) fn lacks_heads_of(&self, key: &ItemKey) -> bool {
        !self.messages.is_empty()
            && matches!(
                self.writes.get(key),
                Some(BusinessWrite::Put { .. } | BusinessWrite::Delete { .. })
            )
            && !self
                .keys
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .contains_key(key)
    }

    /// Notes a read of `key` across its lives made after the handler decided, for its
    /// chain heads only: the reads the handler made are left as they were, and the
    /// messages are placed from it where it finds the key at the version the change
    /// expects (else they are not placed, and the commit, conditioned on that version,
    /// fails anyway).
    pub(crate) fn note_heads(&self, key: ItemKey, read: KeyRead) {
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, read);
    }

    /// `expected` for `key` as the commit checks it: a create of a key read as holding no
    /// item expects it at the version read, so that it can only apply to the life it read.
    fn pinned(&self, key: &ItemKey, expected: ExpectedVersion) -> ExpectedVersion {
        match expected {
            ExpectedVersion::Absent => match self
                .keys
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(key)
            {
                Some(read) if read.item.is_none() => ExpectedVersion::AbsentAt(read.version),
                _ => expected,
            },
            pinned => pinned,
        }
    }

    /// Stages a put of `data` to `key`, conditioned on `expected`. A later write to the
    /// same key replaces this one. A create ([`ExpectedVersion::Absent`]) of a key this
    /// staging read expects the key at the version read ([`ExpectedVersion::AbsentAt`]).
    pub fn put(&mut self, key: ItemKey, data: Value, expected: ExpectedVersion) {
        let expected = self.pinned(&key, expected);
        self.stage(BusinessWrite::Put { key, data, expected });
    }

    /// Stages a delete of `key`, conditioned on its `version`.
    pub fn delete(&mut self, key: ItemKey, version: u64) {
        self.stage(BusinessWrite::Delete { key, version });
    }

    /// Makes the commit depend on `key` being as `expected`, without writing it (pinned
    /// as [`Self::put`] pins a create).
    pub fn check(&mut self, key: ItemKey, expected: ExpectedVersion) {
        let expected = self.pinned(&key, expected);
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

    /// The messages as the commit carries them: positioned in the history of the one
    /// entity the commit changes ([`crate::protocol::Position`]), where it changes one
    /// portable item, which it read across its lives, at the version read (a change or a
    /// delete of it, or a create of it read holding no item), whether or not it adds
    /// native actions (on other items); as emitted otherwise. The commit's condition on
    /// that version makes the heads read the heads it moves, in the item's own write.
    pub(crate) fn messages_to_commit(&self) -> Vec<OutgoingMessage> {
        let mut messages = self.messages.clone();
        if let Some((entity, version, heads)) = self.positioned_in() {
            crate::protocol::stamp_chain_named(&mut messages, &entity, version, &heads, self.store.producer().as_ref());
        }
        messages
    }

    /// The pending entries of transactions other than `txn_id` that item `key` held as read,
    /// in commit order (their place in its history, else their commit time)
    /// ([`crate::earlier::pending_entries`]).
    pub(crate) fn entries_read(&self, key: &ItemKey, txn_id: TxnId) -> Vec<crate::protocol::OutboxRecord> {
        let keys = self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.get(key)
            .map(|read| crate::earlier::pending_entries(read.entries.values(), txn_id))
            .unwrap_or_default()
    }

    /// The entity the commit's messages are positioned in, the version it takes it to,
    /// and its heads as read.
    fn positioned_in(&self) -> Option<(ItemKey, u64, crate::protocol::ChainHeads)> {
        if self.messages.is_empty() {
            return None;
        }
        // The protocol's own items (an in-order consumer's chain position) are no entity
        // of the application's.
        let mut changes = self
            .writes
            .values()
            .filter(|write| !matches!(write, BusinessWrite::Check { .. }) && !write.key().is_protocol());
        let (Some(change), None) = (changes.next(), changes.next()) else {
            return None;
        };
        let keys = self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(read) = keys.get(change.key()) else {
            // A key the commit expects never written holds no chain yet: its heads are
            // known without a read.
            return match change {
                BusinessWrite::Put {
                    expected: ExpectedVersion::AbsentAt(0),
                    key,
                    ..
                } => Some((key.clone(), 1, crate::protocol::ChainHeads::new())),
                _ => None,
            };
        };
        let live = read.item.is_some();
        let as_read = match change {
            BusinessWrite::Put {
                expected: ExpectedVersion::Exactly(version),
                ..
            }
            | BusinessWrite::Delete { version, .. } => live && *version == read.version,
            BusinessWrite::Put {
                expected: ExpectedVersion::AbsentAt(version),
                ..
            } => !live && *version == read.version,
            _ => false,
        };
        as_read.then(|| (change.key().clone(), read.version + 1, read.heads.clone()))
    }

    /// Whether the messages keep within `limits`; if not, which limit they break. Their
    /// bytes are counted as the commit carries them, positioned where they will be, so
    /// that every attribute their sends add counts.
    /// Checks that every destination takes each message emitted
    /// ([`crate::protocol::sendable::check`]): one it would refuse for good is refused
    /// here, before anything is written, rather than block its entity's chain once
    /// committed.
    pub(crate) fn check_sendable(&self) -> Result<(), crate::protocol::Unsendable> {
        self.messages.iter().try_for_each(crate::protocol::sendable::check)
    }

    pub(crate) fn check_limits(&self, limits: &TransactionLimits) -> Result<(), String> {
        let bytes: usize = self
            .messages_to_commit()
            .iter()
            .map(OutgoingMessage::payload_bytes)
            .sum();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::{EmbeddedBackend, ManualClock};
    use crate::time::Timestamp;

    /// The transaction's message bytes count the attributes its sends add, its messages'
    /// positions among them: a limit its messages fit only without them is broken.
    #[test]
    fn the_limit_counts_the_messages_as_positioned() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock, [("events".parse().unwrap(), false)]);
        let mut staging = Staging::new(TxnId::new_v7(), backend.store.clone());
        let order: ItemKey = "ORDER#1".parse().unwrap();
        // A create of a key made fresh: positioned without a read.
        staging.put(order, serde_json::json!({}), ExpectedVersion::AbsentAt(0));
        staging.emit(Message::json("events".parse().unwrap(), &serde_json::json!({"n": 1})).unwrap());
        let as_emitted = staging.messages()[0].payload_bytes();
        let positioned = staging.messages_to_commit()[0].payload_bytes();
        assert!(positioned > as_emitted, "{positioned} > {as_emitted}");
        let limits = |max_message_bytes| TransactionLimits {
            max_messages: 10,
            max_message_bytes,
        };
        assert_eq!(staging.check_limits(&limits(positioned)), Ok(()));
        let broken = staging.check_limits(&limits(as_emitted)).unwrap_err();
        assert!(broken.contains(&format!("{positioned} bytes of messages")), "{broken}");
    }
}
