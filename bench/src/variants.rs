//! The variants measured, and what one request does in each: the same business step
//! (read one item, write it back under its version, publish one event) made without the
//! outbox, as baselines (a, b), and with it: the control send with the commit, after the
//! read (c, the library's default), or overlapped with the read (d), and (d) with inline
//! publishing (e); and in entity mode (issue
//! 21, `docs/ENTITY_MODE.md`), the commit one conditional write of the item instead of a
//! transaction, inline publishing off (f) and on (g); and (e) and (g) publishing after the
//! answer (h, i; issue 29). Beside these changes of an existing item, a create of an item
//! that does not exist yet, publishing after the answer: in entity mode, one conditional
//! write (j), and in the transactional form (k).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use outbox::embedded::{EmbeddedBackend, SendRequest};
use outbox::ports::{Clock, ExpectedVersion, ItemKey, KeyRead, Store, SystemClock};
use outbox::protocol::{DestinationName, Message};
use outbox::request::{AfterAnswer, InlineDispatch, Outbox, RequestPorts, Transaction};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use serde_json::json;

use crate::latency::{Call, Delays};
use crate::ports::{SlowControlQueue, SlowPublisher, SlowQueue, SlowStore, StoreCalls, StoreOp};
use crate::BenchError;

/// The destination every variant publishes its event to.
pub const EVENTS: &str = "events";

/// How long a request may take, as the API's own timeout would give it. Never reached
/// here; it makes the request path race each call against a timer, as it does in the API.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// One way of making the business step. Add a variant here (with its calls and its
/// request in [`Rig::request`]) and every report shows it. The letters are the issue's:
/// (a) and (b) are baselines without an outbox, (c) to (e) the outbox, (f) and (g) the
/// outbox in entity mode, (h) and (i) publishing after the answer; (j) and (k) create an
/// item instead of changing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// (a) Baseline: a consistent read and a conditional put, no event at all: the plain
    /// write a user gives up.
    PlainPut,
    /// (b) Baseline: the plain put, then `SendMessage` of the event. Not atomic (a crash
    /// between the two loses the event, a failed send after the write leaves it unsent):
    /// the cost floor of publishing, without the guarantee.
    DualWrite,
    /// (c) The outbox with the control send not overlapped with the read, the library's
    /// default: `begin` sends nothing, the transaction reads, and the commit sends the
    /// control message and waits for its acknowledgement before its write (a refusal
    /// decided by the read would have cost nothing more). Inline publishing off: the
    /// control worker publishes about a second later (the first check's delay).
    OutboxSequential,
    /// (d) The outbox with the control send overlapped with the read
    /// ([`Transaction::send_control`] beside the store's `get_keys`, `tokio::join!`, the
    /// read handed to the transaction), for a handler that will write for sure; then the
    /// put under the version read, the event, the commit. Inline publishing off.
    Outbox,
    /// (e) (d) with inline publishing (the library's default): the request publishes and
    /// marks the record dispatched itself before answering.
    OutboxInline,
    /// (f) (d) in entity mode, as the orders API changes an existing order: `begin_entity`
    /// names the item in the control message (overlapped with the read), and the commit,
    /// one put of that item at the version read, is one conditional `UpdateItem` carrying
    /// the outbox entry inside the item (`Store::commit_entity`), not a
    /// `TransactWriteItems`. Inline publishing off: the control worker publishes the entry.
    OutboxEntity,
    /// (g) (f) with inline publishing: after the commit the request publishes the entry's
    /// message, then settles the entry into its sent mark (one `UpdateItem`), before
    /// answering.
    OutboxEntityInline,
    /// (h) (e) publishing after the answer (the library's default): the commit returns at
    /// once and the publish and mark run on their own ([`outbox::request::AfterAnswer`]);
    /// the request's latency is (d)'s.
    OutboxAfter,
    /// (i) (g) publishing after the answer: the request's latency is (f)'s, the publish and
    /// the settle follow it.
    OutboxEntityAfter,
    /// (j) A create in entity mode, publishing after the answer: `begin_entity` names the
    /// new item in the control message, overlapped with the read of its key
    /// (`Store::get_keys`, handed to the transaction), which finds no item; the put of
    /// the item with [`ExpectedVersion::Absent`] is pinned by that read to the key's
    /// version, and the commit is one conditional `UpdateItem` creating the item with its
    /// outbox entry inside (`Store::commit_entity`), no `TransactWriteItems`. The publish
    /// and the settle follow the answer.
    CreateEntityAfter,
    /// (k) The same create in the transactional form, publishing after the answer, as the
    /// orders API places an order: `begin_within`, a blind create
    /// ([`ExpectedVersion::Absent`], nothing read), the commit a `TransactWriteItems` of
    /// the item and its outbox record; the publish and the mark follow the answer.
    CreateAfter,
}

impl Variant {
    /// Every variant, in the order reported.
    pub const ALL: [Variant; 11] = [
        Variant::PlainPut,
        Variant::DualWrite,
        Variant::OutboxSequential,
        Variant::Outbox,
        Variant::OutboxInline,
        Variant::OutboxEntity,
        Variant::OutboxEntityInline,
        Variant::OutboxAfter,
        Variant::OutboxEntityAfter,
        Variant::CreateEntityAfter,
        Variant::CreateAfter,
    ];

    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Variant::PlainPut => "plain-put",
            Variant::DualWrite => "dual-write",
            Variant::OutboxSequential => "outbox-sequential",
            Variant::Outbox => "outbox",
            Variant::OutboxInline => "outbox-inline",
            Variant::OutboxEntity => "outbox-entity",
            Variant::OutboxEntityInline => "outbox-entity-inline",
            Variant::OutboxAfter => "outbox-after",
            Variant::OutboxEntityAfter => "outbox-entity-after",
            Variant::CreateEntityAfter => "create-entity-after",
            Variant::CreateAfter => "create-after",
        }
    }

    /// Its letter in the issue and the report: `a` to `k`.
    pub fn letter(self) -> char {
        match self {
            Variant::PlainPut => 'a',
            Variant::DualWrite => 'b',
            Variant::OutboxSequential => 'c',
            Variant::Outbox => 'd',
            Variant::OutboxInline => 'e',
            Variant::OutboxEntity => 'f',
            Variant::OutboxEntityInline => 'g',
            Variant::OutboxAfter => 'h',
            Variant::OutboxEntityAfter => 'i',
            Variant::CreateEntityAfter => 'j',
            Variant::CreateAfter => 'k',
        }
    }

    /// `(d) outbox`: its letter and name.
    pub fn label(self) -> String {
        format!("({}) {}", self.letter(), self.name())
    }

    /// The AWS calls one request makes, as stages run one after another; the calls of a
    /// stage overlap (the request waits for the slowest). What the model column adds up.
    pub fn stages(self) -> &'static [&'static [Call]] {
        match self {
            Variant::PlainPut => &[&[Call::Get], &[Call::Put]],
            Variant::DualWrite => &[&[Call::Get], &[Call::Put], &[Call::Send]],
            // The read, then the commit: its control send, then its transaction.
            Variant::OutboxSequential => &[&[Call::Get], &[Call::Send], &[Call::Transact]],
            // The dispatch after the answer is not on the request's path.
            Variant::Outbox | Variant::OutboxAfter => &[&[Call::Send, Call::Get], &[Call::Transact]],
            Variant::OutboxInline => &[
                &[Call::Send, Call::Get],
                &[Call::Transact],
                &[Call::SendBatch],
                &[Call::Update],
            ],
            // commit_entity: one conditional UpdateItem; a create's as a change's.
            Variant::OutboxEntity | Variant::OutboxEntityAfter | Variant::CreateEntityAfter => {
                &[&[Call::Send, Call::Get], &[Call::Update]]
            }
            // A blind create reads nothing: the control send, then the transaction.
            Variant::CreateAfter => &[&[Call::Send], &[Call::Transact]],
            // + publish, settle_entry (one UpdateItem: the entry out, its sent mark in).
            Variant::OutboxEntityInline => &[
                &[Call::Send, Call::Get],
                &[Call::Update],
                &[Call::SendBatch],
                &[Call::Update],
            ],
        }
    }

    /// The store calls one request makes, by operation: what a run checks its commits
    /// against (an entity-mode commit that fell back to the transactional form would be a
    /// `commit` here, and fail the run).
    pub fn store_calls(self) -> &'static [(StoreOp, usize)] {
        match self {
            // The baselines' put is its latency only (SlowStore::simulated_conditional_put).
            Variant::PlainPut | Variant::DualWrite => &[(StoreOp::GetItems, 1)],
            // The transactional commit goes through `commit_native` (no native actions here).
            Variant::OutboxSequential | Variant::Outbox => &[(StoreOp::CommitNative, 1), (StoreOp::GetItems, 1)],
            Variant::OutboxInline | Variant::OutboxAfter => &[
                (StoreOp::CommitNative, 1),
                (StoreOp::GetItems, 1),
                (StoreOp::MarkDispatched, 1),
            ],
            Variant::OutboxEntity => &[(StoreOp::GetItems, 1), (StoreOp::CommitEntity, 1)],
            // The read of the key (`get_keys`) is counted as `get_items`.
            Variant::OutboxEntityInline | Variant::OutboxEntityAfter | Variant::CreateEntityAfter => &[
                (StoreOp::GetItems, 1),
                (StoreOp::CommitEntity, 1),
                (StoreOp::SettleEntry, 1),
            ],
            // No read; the transaction, then the record marked dispatched.
            Variant::CreateAfter => &[(StoreOp::CommitNative, 1), (StoreOp::MarkDispatched, 1)],
        }
    }

    /// [`Self::store_calls`] for `requests` requests.
    pub fn expected_store_calls(self, requests: usize) -> StoreCalls {
        self.store_calls()
            .iter()
            .map(|(op, per_request)| (*op, per_request * requests))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// Whether its commits publish inline, before or after the answer.
    pub fn publishes_inline(self) -> bool {
        matches!(
            self,
            Variant::OutboxInline
                | Variant::OutboxEntityInline
                | Variant::OutboxAfter
                | Variant::OutboxEntityAfter
                | Variant::CreateEntityAfter
                | Variant::CreateAfter
        )
    }

    /// Whether its commits publish after the answer.
    pub fn publishes_after_answer(self) -> bool {
        matches!(
            self,
            Variant::OutboxAfter | Variant::OutboxEntityAfter | Variant::CreateEntityAfter | Variant::CreateAfter
        )
    }

    /// Whether it begins its transactions in entity mode.
    pub fn entity_mode(self) -> bool {
        matches!(
            self,
            Variant::OutboxEntity
                | Variant::OutboxEntityInline
                | Variant::OutboxEntityAfter
                | Variant::CreateEntityAfter
        )
    }

    /// Whether each request creates an item that does not exist yet (instead of changing
    /// one written before the run).
    pub fn creates(self) -> bool {
        matches!(self, Variant::CreateEntityAfter | Variant::CreateAfter)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Variant {
    type Err = String;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Variant::ALL
            .into_iter()
            .find(|variant| variant.name() == input)
            .ok_or_else(|| {
                let known: Vec<&str> = Variant::ALL.iter().map(|variant| variant.name()).collect();
                format!("unknown variant {input:?} (known: {})", known.join(", "))
            })
    }
}

/// A fresh embedded deployment for one variant, wrapped in the latencies, with its items
/// already written (none for a variant that creates: its requests create theirs). Each
/// request `index` works on its own item, so no two requests contend and every
/// conditional write succeeds.
pub struct Rig {
    variant: Variant,
    clock: Arc<dyn Clock>,
    store: Arc<SlowStore>,
    events: SlowQueue,
    events_name: DestinationName,
    outbox: Option<Outbox>,
    after: Option<AfterAnswer>,
}

impl Rig {
    /// A rig for `variant` over a new backend, its items `0..items` written once (at
    /// version 1) without latency, so that every request reads an existing item; for a
    /// variant that creates, nothing is written (each request's key is new).
    pub async fn new(variant: Variant, delays: Arc<Delays>, items: usize) -> Result<Self, BenchError> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let events_name: DestinationName = EVENTS.parse().expect("a valid destination name");
        let backend = EmbeddedBackend::new(clock.clone(), [(events_name.clone(), false)]);
        if !variant.creates() {
            seed(&backend, clock.clone(), items).await?;
        }

        let store = Arc::new(SlowStore::new(backend.store.clone(), delays.clone()));
        let events_queue = backend
            .publisher
            .queue(&events_name)
            .expect("the backend was built with this destination")
            .clone();
        let outbox = match variant {
            Variant::PlainPut | Variant::DualWrite => None,
            Variant::OutboxSequential
            | Variant::Outbox
            | Variant::OutboxInline
            | Variant::OutboxEntity
            | Variant::OutboxEntityInline
            | Variant::OutboxAfter
            | Variant::OutboxEntityAfter
            | Variant::CreateEntityAfter
            | Variant::CreateAfter => {
                let ports = RequestPorts {
                    store: store.clone(),
                    control_queue: Arc::new(SlowControlQueue::new(backend.control_queue.clone(), delays.clone())),
                    clock: clock.clone(),
                    ids: Arc::new(outbox::ports::RandomIds),
                };
                let outbox = Outbox::new(ports, Timing::default(), TransactionLimits::default());
                let publisher = Arc::new(SlowPublisher::new(backend.publisher.clone(), delays.clone()));
                Some(if variant.publishes_after_answer() {
                    outbox.with_publishing_after_answer(publisher, AfterAnswer::on_tokio())
                } else if variant.publishes_inline() {
                    outbox.with_inline_publisher(publisher)
                } else {
                    outbox
                })
            }
        };
        let after = outbox.as_ref().and_then(|outbox| outbox.after_answer().cloned());
        Ok(Self {
            variant,
            clock,
            store,
            events: SlowQueue::new(events_queue, delays),
            events_name,
            outbox,
            after,
        })
    }

    /// Waits until every dispatch left for after the answer is done (before its store
    /// calls are counted).
    pub async fn settled(&self) {
        if let Some(after) = &self.after {
            after.idle().await;
        }
    }

    /// The store calls made so far through this rig's slowed store (the seeding is not
    /// among them: it writes to the backend directly).
    pub fn store_calls(&self) -> StoreCalls {
        self.store.calls()
    }

    /// One request on item `index` (for a variant that creates, on new item `index`).
    pub async fn request(&self, index: usize) -> Result<(), BenchError> {
        match &self.outbox {
            Some(outbox) if self.variant.creates() => self.create_request(outbox, new_item_key(index)).await,
            Some(outbox) => self.outbox_request(outbox, item_key(index)).await,
            None => self.plain_request(item_key(index)).await,
        }
    }

    /// The outbox variants: begin and read, the control message sent by the commit (c),
    /// or sent beside the read (d, e, h; f, g, i begin in entity mode, naming the item,
    /// as the orders API's `change_order` does); put under the version read, emit one
    /// event, commit.
    async fn outbox_request(&self, outbox: &Outbox, key: ItemKey) -> Result<(), BenchError> {
        let deadline = self.clock.now().plus(REQUEST_DEADLINE);
        let (mut txn, item) = if self.variant == Variant::OutboxSequential {
            let txn = outbox.begin_within(deadline).await?;
            let item = txn.get(&key).await?;
            (txn, item)
        } else {
            let (txn, read) = self.begin_beside_read(outbox, &key, deadline).await?;
            (txn, read.item)
        };
        let item = item.ok_or(BenchError::Missing(key.clone()))?;
        let count = item.data["count"].as_u64().unwrap_or(0) + 1;
        txn.put(
            key.clone(),
            json!({ "count": count }),
            ExpectedVersion::Exactly(item.version),
        );
        let event = json!({ "type": "ItemCounted", "item": key.as_str(), "count": count });
        txn.emit(Message::json(self.events_name.clone(), &event)?);
        let committed = txn.commit().await?;
        self.check_dispatch(committed.inline)
    }

    /// Begins the request's transaction (in entity mode on `key` where the variant is) and
    /// sends its control message ([`Transaction::send_control`]) while reading `key`
    /// across its lives, and hands the read to the transaction
    /// ([`outbox::request::Transaction::note_read`]): a create of the key is pinned to the
    /// version read, and the event is placed in the item's history, as if the transaction
    /// had read it itself.
    async fn begin_beside_read(
        &self,
        outbox: &Outbox,
        key: &ItemKey,
        deadline: Timestamp,
    ) -> Result<(Transaction, KeyRead), BenchError> {
        let begin = async {
            let txn = if self.variant.entity_mode() {
                outbox.begin_entity_within(key.clone(), deadline).await?
            } else {
                outbox.begin_within(deadline).await?
            };
            txn.send_control().await?;
            Ok::<_, outbox::request::TxnError>(txn)
        };
        let (txn, reads) = tokio::join!(begin, outbox.store().get_keys(std::slice::from_ref(key)));
        let (mut txn, mut reads) = (txn?, reads?);
        let read = reads.remove(key).unwrap_or_default();
        txn.note_read(key.clone(), read.clone());
        Ok((txn, read))
    }

    /// The creates: (j) begins in entity mode on the new item beside the read of its key,
    /// which finds no item, and creates it ([`ExpectedVersion::Absent`], which the read
    /// pins to the key's version): one conditional write. (k) begins a plain transaction
    /// and creates the item blind (nothing read): a transaction. Either emits one event
    /// and commits, publishing after the answer.
    async fn create_request(&self, outbox: &Outbox, key: ItemKey) -> Result<(), BenchError> {
        let deadline = self.clock.now().plus(REQUEST_DEADLINE);
        let event = json!({ "type": "ItemCreated", "item": key.as_str(), "count": 1 });
        let mut txn = if self.variant.entity_mode() {
            let (mut txn, read) = self.begin_beside_read(outbox, &key, deadline).await?;
            if read.item.is_some() {
                return Err(BenchError::Exists(key));
            }
            txn.put(key.clone(), json!({ "count": 1 }), ExpectedVersion::Absent);
            txn
        } else {
            let mut txn = outbox.begin_within(deadline).await?;
            txn.put(key.clone(), json!({ "count": 1 }), ExpectedVersion::Absent);
            txn
        };
        txn.emit(Message::json(self.events_name.clone(), &event)?);
        let committed = txn.commit().await?;
        self.check_dispatch(committed.inline)
    }

    /// Whether a commit was dispatched as the variant requires.
    fn check_dispatch(&self, inline: InlineDispatch) -> Result<(), BenchError> {
        let expected = if self.variant.publishes_after_answer() {
            InlineDispatch::AfterAnswer
        } else if self.variant.publishes_inline() {
            InlineDispatch::Dispatched
        } else {
            InlineDispatch::Off
        };
        // Anything else means the variant did not measure what it claims (a publish left
        // to the worker is cheaper or dearer than the path being measured).
        if inline != expected {
            return Err(BenchError::UnexpectedDispatch {
                variant: self.variant,
                got: inline.as_str(),
            });
        }
        Ok(())
    }

    /// The baselines: a consistent read through the slowed store (real), a conditional
    /// put (its latency only, see [`SlowStore::simulated_conditional_put`]), and for the
    /// dual write a real `SendMessage` to the events queue.
    async fn plain_request(&self, key: ItemKey) -> Result<(), BenchError> {
        let items = self.store.get_items(std::slice::from_ref(&key)).await?;
        let item = items.get(&key).ok_or(BenchError::Missing(key.clone()))?;
        let count = item.data["count"].as_u64().unwrap_or(0) + 1;
        self.store.simulated_conditional_put().await;
        if self.variant == Variant::DualWrite {
            let event = json!({ "type": "ItemCounted", "item": key.as_str(), "count": count });
            self.events
                .send_message(SendRequest {
                    body: event.to_string(),
                    ..SendRequest::default()
                })
                .await?;
        }
        Ok(())
    }
}

/// The key of item `index`.
fn item_key(index: usize) -> ItemKey {
    format!("ITEM#{index}").parse().expect("a valid item key")
}

/// The key of new item `index`, which no one wrote before its create.
fn new_item_key(index: usize) -> ItemKey {
    format!("NEW#{index}").parse().expect("a valid item key")
}

/// Writes items `0..items` at version 1 through an outbox over the bare backend.
async fn seed(backend: &EmbeddedBackend, clock: Arc<dyn Clock>, items: usize) -> Result<(), BenchError> {
    let outbox = Outbox::new(
        backend.request_ports(clock),
        Timing::default(),
        TransactionLimits::default(),
    );
    for index in 0..items {
        let mut txn = outbox.begin().await?;
        txn.put(item_key(index), json!({ "count": 0 }), ExpectedVersion::Absent);
        txn.commit().await?;
    }
    Ok(())
}
