//! One transaction: its reads, and the writes and messages it stages for the commit.

use std::collections::BTreeMap;

use serde_json::Value;

use super::settle::settle_bound;
use super::{InlineDispatch, Outbox, Settlement, TxnError};
use crate::ports::{ExpectedVersion, ItemKey, KeyRead, StoreError, VersionedItem};
use crate::protocol::{IdempotencySlot, Message, MessageId, OutgoingMessage, StoredResponse, TxnId};
use crate::staging::Staging;
use crate::time::Timestamp;

/// A transaction that can be committed: a [`Transaction`], or a
/// [`crate::native::NativeTransaction`]. Lets code that finishes requests (the HTTP glue)
/// take either.
pub trait Committable: Send {
    /// The transaction's id.
    fn id(&self) -> TxnId;

    /// See [`Transaction::remember_response`].
    fn remember_response(&mut self, slot: IdempotencySlot, fingerprint: String, response: StoredResponse);

    /// See [`Transaction::commit`].
    fn commit(self) -> impl std::future::Future<Output = Result<Committed, TxnError>> + Send;
}

impl Committable for Transaction {
    fn id(&self) -> TxnId {
        Transaction::id(self)
    }

    fn remember_response(&mut self, slot: IdempotencySlot, fingerprint: String, response: StoredResponse) {
        Transaction::remember_response(self, slot, fingerprint, response);
    }

    fn commit(self) -> impl std::future::Future<Output = Result<Committed, TxnError>> + Send {
        Transaction::commit(self)
    }
}

/// A committed transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The transaction.
    pub txn_id: TxnId,
    /// The ids of the messages it will publish, in order.
    pub message_ids: Vec<MessageId>,
    /// Whether the request path published them itself.
    pub inline: InlineDispatch,
}

/// One transaction of the request path, from `begin` to `commit`. Its control message goes
/// out when it is first needed: just before the first commit attempt, or when the handler
/// asks ([`Transaction::send_control`]). To give it up, call [`Transaction::abandon`]:
/// before its control message was sent it writes nothing (nothing of it left the process),
/// after it writes the tombstone at once. Dropping it without committing is safe too (a
/// crash does that): a transaction never sent leaves nothing, one sent is tombstoned by its
/// control message, after deferring until the commit window ends.
pub struct Transaction {
    pub(super) outbox: Outbox,
    pub(super) txn_id: TxnId,
    /// Its control message, and whether and when it was sent.
    pub(super) control: super::control_send::ControlSend,
    pub(super) deadline: Option<Timestamp>,
    /// The business writes (portable, and native through [`crate::native`]) and messages.
    pub(crate) staging: Staging,
    /// Each told once, just before the first commit attempt reaches the store.
    pub(super) on_commit: Vec<Box<dyn FnOnce(TxnId) + Send + Sync + 'static>>,
    pub(super) idempotency: Option<(IdempotencySlot, String, StoredResponse)>,
    /// The one item it commits into, in entity mode ([`Outbox::begin_entity`]).
    pub(super) entity: Option<ItemKey>,
    /// Its entity form was refused for good (the item's fence mark is at or above it, or
    /// the entry does not fit the item): it commits in the transactional form.
    pub(super) entity_barred: bool,
    /// A commit of it in entity form was sent: an attempt of unknown outcome is then
    /// fenced in the item.
    pub(super) entity_attempted: bool,
    /// The additions to counters of its entity ([`Transaction::add`]).
    pub(super) counters: Vec<crate::counter::Add>,
    /// The entity's pending entries of earlier transactions that its counter commit
    /// found: they go out before its messages where order is kept.
    pub(super) counter_earlier: Vec<crate::protocol::OutboxRecord>,
    /// Its counter commit found its entry settled already (a repeat of a write that
    /// applied): nothing is left to publish.
    pub(super) counter_settled: bool,
    /// Its place among the request path's live transactions, for abandoning it.
    pub(super) _live: super::live::LiveGuard,
}

impl Transaction {
    /// The transaction's id.
    pub fn id(&self) -> TxnId {
        self.txn_id
    }

    /// Has `hook` told, once, when the commit begins: from then on the transaction may
    /// have committed, and the commit settles it whatever happens (the HTTP glue records
    /// it, so that an answer given for an overrunning handler says "outcome unknown", not
    /// "nothing written", and so that it does not abandon the transaction itself). Hooks
    /// add up: each is told, in the order they were given.
    pub fn on_commit_attempt(&mut self, hook: impl FnOnce(TxnId) + Send + Sync + 'static) {
        self.on_commit.push(Box::new(hook));
    }

    /// The item it was begun to commit into, in entity mode.
    pub fn entity(&self) -> Option<&ItemKey> {
        self.entity.as_ref()
    }

    /// The deadline it was begun with, if any.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.deadline
    }

    /// Reads one business item, strongly consistent.
    pub async fn get(&self, key: &ItemKey) -> Result<Option<VersionedItem>, TxnError> {
        self.staging.get(key).await.map_err(|source| self.read_error(source))
    }

    /// Reads several business items in one call, strongly consistent.
    pub async fn get_many(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, TxnError> {
        self.staging
            .get_many(keys)
            .await
            .map_err(|source| self.read_error(source))
    }

    fn read_error(&self, source: StoreError) -> TxnError {
        TxnError::Read {
            txn_id: self.txn_id,
            source,
        }
    }

    /// Tells the transaction what a read of `key` made outside it found
    /// ([`crate::ports::Store::get_keys`], overlapped with [`Outbox::begin_entity`] to
    /// save the round trip): reads of `key` are served from it, a create of it is pinned
    /// to the version read, and the messages of a change of it are placed in its history
    /// from it, as if the transaction had read it itself. The commit is conditioned on
    /// the version the write names, so a read gone stale only makes it conflict. `read`
    /// must be what [`crate::ports::Store::get_keys`] returned for `key` itself: the
    /// chain heads of another key would place the messages wrongly.
    pub fn note_read(&mut self, key: ItemKey, read: KeyRead) {
        self.staging.note_read(key, read);
    }

    /// Stages a put of `data` to `key`, conditioned on `expected`. A later write to the
    /// same key replaces this one.
    pub fn put(&mut self, key: ItemKey, data: Value, expected: ExpectedVersion) {
        self.staging.put(key, data, expected);
    }

    /// Stages a delete of `key`, conditioned on its `version`.
    pub fn delete(&mut self, key: ItemKey, version: u64) {
        self.staging.delete(key, version);
    }

    /// Makes the commit depend on `key` being as `expected`, without writing it.
    pub fn check(&mut self, key: ItemKey, expected: ExpectedVersion) {
        self.staging.check(key, expected);
    }

    /// Emits a message, published if and only if this transaction commits. Returns its
    /// stable id.
    pub fn emit(&mut self, message: Message) -> MessageId {
        self.staging.emit(message)
    }

    /// The messages emitted so far.
    pub fn messages(&self) -> &[OutgoingMessage] {
        self.staging.messages()
    }

    /// Commits, with the transaction, the response that repeats of this request under
    /// idempotency key `slot` must get (the request's `fingerprint` tells repeats from
    /// misuse of the key).
    pub fn remember_response(&mut self, slot: IdempotencySlot, fingerprint: String, response: StoredResponse) {
        self.idempotency = Some((slot, fingerprint, response));
    }

    /// Abandons the transaction (see [`Outbox::abandon`]). For a handler that decided,
    /// after `begin`, not to commit (a no-op, a 404 or 409 found by its reads). If its
    /// control message was not sent, nothing is written or sent
    /// ([`Settlement::NothingSent`]); otherwise its tombstone is written now, within its
    /// deadline.
    pub async fn abandon(self) -> Settlement {
        let by = settle_bound(self.outbox.ports.clock.now(), self.deadline);
        // No commit of it was sent (a commit takes the transaction), so none can land:
        // nothing settles it if its control message was not sent either, its record's
        // tombstone otherwise, in entity mode too.
        self.outbox
            .abandon_in(self.txn_id, self.entity.as_ref(), Some(by))
            .await
    }
}
