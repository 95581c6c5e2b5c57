//! Gated ports: each wraps an embedded port, parks at a gate before every operation,
//! and applies the fault the scheduler chose.
//!
//! The store's entity-mode operations (docs/PROTOCOL.md section 11) pass the gates of their
//! transactional counterparts, and so meet the same faults: reading an item with its
//! entries is a read ([`Op::Read`]), the one conditional write a commit ([`Op::Commit`],
//! its late request a [`Op::LateCommit`]), and the dedup record's put and the entry's
//! removal are writes like the mark ([`Op::Mark`], late: [`Op::LateMark`]). The fence in
//! the item (with its transaction's tombstone record) is a tombstone write
//! ([`Op::Tombstone`], late: [`Op::LateTombstone`]), whether the request path settles with
//! it or the control worker writes it past the window.

use outbox::ports::{ExpectedVersion, KeptMessage};
use outbox::protocol::Applied;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox::counter::{CounterCommit, CounterCommitted, CounterError};
use outbox::embedded::{EmbeddedStore, ManualClock, StoreEvent};
use outbox::ports::{
    Clock, CommitError, CommitRequest, ControlDelivery, ControlInbox, ControlQueue, EntityCommit, EntityItem,
    EntryFailure, FenceOutcome, ItemKey, KeyRead, PublishError, Publisher, QueueError, Store, StoreError,
    TombstoneOutcome, VersionedItem,
};
use outbox::protocol::{
    ControlMessage, DestinationName, IdempotencyRecord, IdempotencySlot, OutboxRecord, OutgoingMessage, TxnId,
};
use outbox::time::Timestamp;

use super::gate::{ActorId, Fault, Gate, Op};

fn injected(what: &str) -> Box<dyn std::error::Error + Send + Sync> {
    format!("injected fault: {what}").into()
}

/// Applies `fault` around `apply`: the shape every mutating wrapper shares.
macro_rules! gated {
    ($gate:expr, $op:expr, $apply:expr, failed => $failed:expr, lost => $lost:expr) => {
        match $gate.pass($op).await {
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy | Fault::Late => $apply,
            Fault::CrashBefore => $gate.crash().await,
            Fault::CrashAfter => {
                let _ = $apply;
                $gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = $apply;
                $lost
            }
            Fault::Fail => $failed,
        }
    };
}

/// An operation still on its way after its caller stopped waiting ([`Fault::Late`]):
/// the caller got an error, the request may still apply.
#[derive(Debug, Clone)]
pub(crate) enum LateOp {
    Commit(Box<CommitRequest>),
    Tombstone {
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    },
    Mark {
        records: Vec<OutboxRecord>,
        expires_at: Timestamp,
    },
    ControlSend {
        message: ControlMessage,
        delay: Duration,
    },
    /// An entity-mode commit (one conditional write of the item and its entry), with its
    /// `X-Amz-Date` where AWS's signature check is modelled ([`Signatures`]); otherwise it
    /// arrives whenever the scheduler lets it, the worst case.
    EntityCommit(Box<EntityCommit>, Option<Timestamp>),
    /// A counter commit (one conditional write that reads nothing, stamping its
    /// messages in the write), with its `X-Amz-Date` as for [`LateOp::EntityCommit`].
    CounterCommit(Box<CounterCommit>, Option<Timestamp>),
    /// An entity-mode dedup record's put.
    PutDispatched {
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    },
    /// An entry's removal from its item.
    RemoveEntry {
        key: ItemKey,
        txn_id: TxnId,
    },
    /// An entry settled into its sent mark.
    Settle {
        key: ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    },
    /// Sent marks past their time leaving their item.
    Forget {
        key: ItemKey,
        forget: Vec<TxnId>,
    },
    /// A fence in an item, with its transaction's tombstone record.
    Fence {
        key: ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    },
}

impl LateOp {
    /// The gate its ghost passes.
    pub fn op(&self) -> Op {
        match self {
            LateOp::Commit(_) | LateOp::EntityCommit(..) | LateOp::CounterCommit(..) => Op::LateCommit,
            LateOp::Tombstone { .. } | LateOp::Fence { .. } => Op::LateTombstone,
            LateOp::Mark { .. }
            | LateOp::PutDispatched { .. }
            | LateOp::RemoveEntry { .. }
            | LateOp::Settle { .. }
            | LateOp::Forget { .. } => Op::LateMark,
            LateOp::ControlSend { .. } => Op::LateSend,
        }
    }
}

/// Operations still on their way, each with the actor that sent it; the scheduler turns
/// each into a ghost actor that applies it later.
pub(crate) type InFlight = Arc<std::sync::Mutex<Vec<(ActorId, LateOp)>>>;

/// Who publishes for whom (the request-path worlds): each actor's own transactions, those
/// it began or committed (a request, a task it handed its transaction to, a dispatch
/// after its answer), or, a control worker, those whose control messages its batch in
/// hand holds; and, for each message, whether its first send was made for its own
/// transaction, and by a worker. A first send made for another transaction is an earlier
/// entry of the entity that a later transaction's publisher sent first, before its own
/// control message or its own request path got to it.
#[derive(Clone, Default)]
pub(crate) struct Publishers(Arc<Mutex<PublishersState>>);

#[derive(Default)]
struct PublishersState {
    own: BTreeMap<ActorId, BTreeSet<TxnId>>,
    workers: BTreeSet<ActorId>,
    /// By message id: its transaction, and its first send.
    first: BTreeMap<String, (TxnId, FirstSend)>,
}

/// The first send of a message: its place among first sends, whether its publisher was
/// publishing for the message's own transaction, and whether a control worker made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstSend {
    /// Its place among the first sends of all messages.
    pub order: usize,
    /// Made for the message's own transaction.
    pub own: bool,
    /// Made by a control worker.
    pub by_worker: bool,
}

impl Publishers {
    fn lock(&self) -> std::sync::MutexGuard<'_, PublishersState> {
        self.0.lock().expect("publishers lock")
    }

    /// `actor` begins or commits `txn_id`.
    pub fn own(&self, actor: ActorId, txn_id: TxnId) {
        self.lock().own.entry(actor).or_default().insert(txn_id);
    }

    /// Worker `actor` holds a batch of control messages for `txn_ids`.
    pub fn batch(&self, actor: ActorId, txn_ids: BTreeSet<TxnId>) {
        let mut state = self.lock();
        state.workers.insert(actor);
        state.own.insert(actor, txn_ids);
    }

    /// `to` (a dispatch after the answer) publishes for what `from` (its request) did.
    pub fn inherit(&self, from: ActorId, to: ActorId) {
        let mut state = self.lock();
        let own = state.own.get(&from).cloned().unwrap_or_default();
        state.own.insert(to, own);
    }

    /// `actor`'s send of `messages` was accepted.
    fn sent<'a>(&self, actor: ActorId, messages: impl Iterator<Item = &'a OutgoingMessage>) {
        let mut state = self.lock();
        let own = state.own.get(&actor).cloned().unwrap_or_default();
        let by_worker = state.workers.contains(&actor);
        for message in messages {
            let order = state.first.len();
            state.first.entry(message.id.as_str().to_owned()).or_insert((
                message.txn_id,
                FirstSend {
                    order,
                    own: own.contains(&message.txn_id),
                    by_worker,
                },
            ));
        }
    }

    /// Each transaction's first send: that of the first of its messages to go out.
    pub fn first_sends(&self) -> BTreeMap<TxnId, FirstSend> {
        let mut firsts: BTreeMap<TxnId, FirstSend> = BTreeMap::new();
        for (txn_id, send) in self.lock().first.values() {
            let first = firsts.entry(*txn_id).or_insert(*send);
            if send.order < first.order {
                *first = *send;
            }
        }
        firsts
    }
}

/// Counts commit attempts of a transaction that had committed already, refused by the
/// version its item continued at (a late attempt, or a retry after an attempt whose
/// reply was lost): the history of `store` says whether it had committed.
#[derive(Clone)]
pub(crate) struct Refusals {
    pub store: Arc<EmbeddedStore>,
    pub count: Arc<AtomicUsize>,
}

impl Refusals {
    fn note(&self, txn_id: TxnId, result: &Result<(), CommitError>) {
        if !matches!(result, Err(CommitError::VersionConflict { .. })) {
            return;
        }
        let committed = self.store.history().iter().any(|event| match event {
            StoreEvent::Committed { request, .. } => request.txn_id == txn_id,
            StoreEvent::EntityCommitted { commit, .. } => commit.entry.txn_id == txn_id,
            _ => false,
        });
        if committed {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A gated store.
pub(crate) struct GatedStore {
    pub inner: Arc<dyn Store>,
    pub gate: Gate,
    pub in_flight: InFlight,
    /// Entity mode: commits refused by their item's fence mark, counted.
    pub fenced_out: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// Where set, AWS's signature check of entity commits.
    pub signatures: Option<Signatures>,
    /// Where set, who commits what ([`Publishers::own`]).
    pub publishers: Option<Publishers>,
    /// Where set, attempts of committed transactions refused by their item's version.
    pub refusals: Option<Refusals>,
}

/// SigV4: AWS refuses a request whose `X-Amz-Date` is more than 15 minutes from its own
/// clock.
pub(crate) const SIGNATURE_VALIDITY: Duration = Duration::from_secs(15 * 60);

/// AWS's signature check of the request path's entity commits, on AWS's own clock (the
/// simulation's): a request is dated when it is sent, by the request path's clock (skewed)
/// or, once the SDK has learnt the skew from AWS's responses, by AWS's time; AWS refuses it
/// on arrival if that date is more than [`SIGNATURE_VALIDITY`] from its time, and the
/// request path hears of it as of unknown outcome (the DynamoDB adapter's mapping of an
/// error it cannot prove wrote nothing).
#[derive(Clone)]
pub(crate) struct Signatures {
    /// AWS's time.
    pub clock: Arc<ManualClock>,
    /// The request path's clock against AWS's, in milliseconds.
    pub host_skew_millis: i64,
    /// Whether the SDK corrects its signing clock by the skew it learnt.
    pub sdk_corrects: bool,
    /// Requests refused so far.
    pub refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl Signatures {
    /// The `X-Amz-Date` of a request signed now.
    pub fn sign(&self) -> Timestamp {
        let aws = self.clock.now();
        if self.sdk_corrects {
            aws
        } else {
            Timestamp::from_millis(aws.as_millis().saturating_add_signed(self.host_skew_millis))
        }
    }

    /// Whether AWS refuses, now, a request dated `signed_at` (counted when it does).
    pub fn refuses(&self, signed_at: Timestamp) -> bool {
        let now = self.clock.now();
        let off = now.as_millis().abs_diff(signed_at.as_millis());
        let refused = off > SIGNATURE_VALIDITY.as_millis() as u64;
        if refused {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        refused
    }
}

/// `commit` applied to `store`; a refusal by the item's fence mark counted in `fenced_out`.
async fn entity_commit(
    store: &dyn Store,
    commit: &EntityCommit,
    fenced_out: Option<&Arc<std::sync::atomic::AtomicUsize>>,
    refusals: Option<&Refusals>,
) -> Result<(), CommitError> {
    let result = store.commit_entity(commit).await;
    if let (Err(CommitError::EntityFenced { .. }), Some(count)) = (&result, fenced_out) {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(refusals) = refusals {
        refusals.note(commit.entry.txn_id, &result);
    }
    result
}

/// `commit` applied to `store` as [`entity_commit`] applies an entity commit: a refusal by
/// the fence counted in `fenced_out`, and in `refusals` a refusal of a transaction that
/// committed (a repeat that should have found its entry).
async fn counter_commit(
    store: &dyn Store,
    commit: &CounterCommit,
    fenced_out: Option<&Arc<std::sync::atomic::AtomicUsize>>,
    refusals: Option<&Refusals>,
) -> Result<CounterCommitted, CounterError> {
    let result = store.commit_counter(commit).await;
    if let (Err(CounterError::Commit(CommitError::EntityFenced { .. })), Some(count)) = (&result, fenced_out) {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(refusals) = refusals {
        // A bound or a missing item refusing a transaction that committed is the same
        // fault as a version refusing it: the repeat did not find its own entry.
        let as_commit = match &result {
            Ok(_) => Ok(()),
            Err(CounterError::Commit(error)) => Err(CommitError::Invalid {
                reason: error.to_string(),
            }),
            Err(CounterError::Refused(_) | CounterError::Missing { .. }) => Err(CommitError::VersionConflict {
                key: commit.key.clone(),
            }),
        };
        refusals.note(commit.entry.txn_id, &as_commit);
    }
    result
}

/// `request` applied to `store`; a refusal of a committed transaction counted in `refusals`.
async fn transaction_commit(
    store: &dyn Store,
    request: &CommitRequest,
    refusals: Option<&Refusals>,
) -> Result<(), CommitError> {
    let result = store.commit(request).await;
    if let Some(refusals) = refusals {
        refusals.note(request.txn_id, &result);
    }
    result
}

impl GatedStore {
    fn late(&self, op: LateOp) {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .push((self.gate.actor(), op));
    }
}

/// The ghost of a [`Fault::Late`] operation: it reaches the table or the queue when the
/// scheduler lets it, unless it is lost on its way; returns whether it got there.
pub(crate) async fn late_op(
    store: Arc<dyn Store>,
    queue: Arc<dyn ControlQueue>,
    gate: Gate,
    op: LateOp,
    fenced_out: Option<&Arc<std::sync::atomic::AtomicUsize>>,
    signatures: Option<&Signatures>,
    refusals: Option<&Refusals>,
) -> bool {
    if gate.pass(op.op()).await == Fault::Fail {
        return false;
    }
    match op {
        LateOp::Commit(request) => {
            let _ = transaction_commit(store.as_ref(), &request, refusals).await;
        }
        LateOp::Tombstone {
            txn_id,
            now,
            expires_at,
        } => {
            let _ = store.put_tombstone(txn_id, now, expires_at).await;
        }
        LateOp::Mark { records, expires_at } => {
            let _ = store.mark_dispatched(&records, expires_at).await;
        }
        LateOp::ControlSend { message, delay } => {
            let _ = queue.send(&message, delay).await;
        }
        LateOp::EntityCommit(commit, signed_at) => {
            if signatures.zip(signed_at).is_some_and(|(aws, at)| aws.refuses(at)) {
                return false;
            }
            let _ = entity_commit(store.as_ref(), &commit, fenced_out, refusals).await;
        }
        LateOp::CounterCommit(commit, signed_at) => {
            if signatures.zip(signed_at).is_some_and(|(aws, at)| aws.refuses(at)) {
                return false;
            }
            let _ = counter_commit(store.as_ref(), &commit, fenced_out, refusals).await;
        }
        LateOp::PutDispatched {
            txn_id,
            now,
            expires_at,
        } => {
            let _ = store.put_dispatched(txn_id, now, expires_at).await;
        }
        LateOp::RemoveEntry { key, txn_id } => {
            let _ = store.remove_entry(&key, txn_id).await;
        }
        LateOp::Settle {
            key,
            txn_id,
            now,
            expires_at,
            max_marks,
        } => {
            let _ = store.settle_entry(&key, txn_id, now, expires_at, max_marks).await;
        }
        LateOp::Forget { key, forget } => {
            let _ = store.forget_marks(&key, &forget).await;
        }
        LateOp::Fence {
            key,
            txn_id,
            now,
            expires_at,
        } => {
            let _ = store.fence_entity(&key, txn_id, now, expires_at).await;
        }
    }
    true
}

#[async_trait]
impl Store for GatedStore {
    fn producer(&self) -> Option<outbox::protocol::Producer> {
        self.inner.producer()
    }

    async fn commit(&self, request: &CommitRequest) -> Result<(), CommitError> {
        let fault = self.gate.pass(Op::Commit).await;
        if let Some(publishers) = &self.publishers {
            publishers.own(self.gate.actor(), request.txn_id);
        }
        let apply = || transaction_commit(self.inner.as_ref(), request, self.refusals.as_ref());
        match fault {
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails => apply().await,
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = apply().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = apply().await;
                Err(CommitError::Ambiguous(injected("commit reply lost")))
            }
            Fault::Fail => Err(CommitError::Unavailable(injected("commit refused"))),
            Fault::Busy => Err(CommitError::Contention(injected("commit met contention"))),
            Fault::Late => {
                self.late(LateOp::Commit(Box::new(request.clone())));
                Err(CommitError::Ambiguous(injected("commit timed out on its way")))
            }
        }
    }

    async fn get_items(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_items(keys).await,
            failed => Err(StoreError::Unavailable(injected("read failed"))),
            lost => Err(StoreError::Unavailable(injected("read reply lost"))))
    }

    async fn get_keys(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, KeyRead>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_keys(keys).await,
            failed => Err(StoreError::Unavailable(injected("read failed"))),
            lost => Err(StoreError::Unavailable(injected("read reply lost"))))
    }

    async fn get_outboxes(&self, txn_ids: &[TxnId]) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_outboxes(txn_ids).await,
            failed => Err(StoreError::Unavailable(injected("read failed"))),
            lost => Err(StoreError::Unavailable(injected("read reply lost"))))
    }

    async fn get_idempotency(&self, slot: &IdempotencySlot) -> Result<Option<IdempotencyRecord>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_idempotency(slot).await,
            failed => Err(StoreError::Unavailable(injected("read failed"))),
            lost => Err(StoreError::Unavailable(injected("read reply lost"))))
    }

    async fn put_tombstone(
        &self,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<TombstoneOutcome, StoreError> {
        let write = || self.inner.put_tombstone(txn_id, now, expires_at);
        match self.gate.pass(Op::Tombstone).await {
            Fault::Late => {
                self.late(LateOp::Tombstone {
                    txn_id,
                    now,
                    expires_at,
                });
                Err(StoreError::Unavailable(injected("tombstone timed out on its way")))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = write().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = write().await;
                Err(StoreError::Unavailable(injected("tombstone reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("tombstone refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => write().await,
        }
    }

    async fn mark_dispatched(&self, records: &[OutboxRecord], expires_at: Timestamp) -> Vec<Result<(), StoreError>> {
        let all_failed = |what: &str| {
            records
                .iter()
                .map(|_| Err(StoreError::Unavailable(injected(what))))
                .collect()
        };
        let mark = || self.inner.mark_dispatched(records, expires_at);
        match self.gate.pass(Op::Mark).await {
            Fault::Late => {
                self.late(LateOp::Mark {
                    records: records.to_vec(),
                    expires_at,
                });
                all_failed("mark timed out on its way")
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = mark().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = mark().await;
                all_failed("mark reply lost")
            }
            Fault::Fail => all_failed("mark refused"),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => mark().await,
        }
    }

    async fn get_entity(&self, key: &ItemKey) -> Result<Option<EntityItem>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_entity(key).await,
            failed => Err(StoreError::Unavailable(injected("entity read failed"))),
            lost => Err(StoreError::Unavailable(injected("entity read reply lost"))))
    }

    async fn keep_applied(
        &self,
        key: &ItemKey,
        expected: ExpectedVersion,
        name: &str,
        applied: Applied,
    ) -> Result<(), CommitError> {
        gated!(self.gate, Op::Mark, self.inner.keep_applied(key, expected, name, applied).await,
            failed => Err(CommitError::Unavailable(injected("position write failed"))),
            lost => Err(CommitError::Ambiguous(injected("position write reply lost"))))
    }

    /// Meets what a transactional commit meets: its one conditional write is the commit.
    async fn commit_entity(&self, commit: &EntityCommit) -> Result<(), CommitError> {
        let signed_at = self.signatures.as_ref().map(Signatures::sign);
        let fault = self.gate.pass(Op::Commit).await;
        if let Some(publishers) = &self.publishers {
            publishers.own(self.gate.actor(), commit.entry.txn_id);
        }
        let apply = || async {
            match self.signatures.as_ref().zip(signed_at) {
                Some((aws, at)) if aws.refuses(at) => Err(CommitError::Ambiguous(injected(
                    "AWS refused the request: its X-Amz-Date is more than 15 minutes from AWS's time",
                ))),
                _ => {
                    entity_commit(
                        self.inner.as_ref(),
                        commit,
                        self.fenced_out.as_ref(),
                        self.refusals.as_ref(),
                    )
                    .await
                }
            }
        };
        match fault {
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails => apply().await,
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = apply().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = apply().await;
                Err(CommitError::Ambiguous(injected("entity commit reply lost")))
            }
            Fault::Fail => Err(CommitError::Unavailable(injected("entity commit refused"))),
            Fault::Busy => Err(CommitError::Contention(injected("entity commit met contention"))),
            Fault::Late => {
                self.late(LateOp::EntityCommit(Box::new(commit.clone()), signed_at));
                Err(CommitError::Ambiguous(injected("entity commit timed out on its way")))
            }
        }
    }

    async fn commit_counter(&self, commit: &CounterCommit) -> Result<CounterCommitted, CounterError> {
        let signed_at = self.signatures.as_ref().map(Signatures::sign);
        let fault = self.gate.pass(Op::Commit).await;
        if let Some(publishers) = &self.publishers {
            publishers.own(self.gate.actor(), commit.entry.txn_id);
        }
        let apply = || async {
            match self.signatures.as_ref().zip(signed_at) {
                Some((aws, at)) if aws.refuses(at) => Err(CommitError::Ambiguous(injected(
                    "AWS refused the request: its X-Amz-Date is more than 15 minutes from AWS's time",
                ))
                .into()),
                _ => {
                    counter_commit(
                        self.inner.as_ref(),
                        commit,
                        self.fenced_out.as_ref(),
                        self.refusals.as_ref(),
                    )
                    .await
                }
            }
        };
        match fault {
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails => apply().await,
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = apply().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = apply().await;
                Err(CommitError::Ambiguous(injected("counter commit reply lost")).into())
            }
            Fault::Fail => Err(CommitError::Unavailable(injected("counter commit refused")).into()),
            Fault::Busy => Err(CommitError::Contention(injected("counter commit met contention")).into()),
            Fault::Late => {
                self.late(LateOp::CounterCommit(Box::new(commit.clone()), signed_at));
                Err(CommitError::Ambiguous(injected("counter commit timed out on its way")).into())
            }
        }
    }

    async fn remove_entry(&self, key: &ItemKey, txn_id: TxnId) -> Result<(), StoreError> {
        let remove = || self.inner.remove_entry(key, txn_id);
        match self.gate.pass(Op::Mark).await {
            Fault::Late => {
                self.late(LateOp::RemoveEntry {
                    key: key.clone(),
                    txn_id,
                });
                Err(StoreError::Unavailable(injected("entry removal timed out on its way")))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = remove().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = remove().await;
                Err(StoreError::Unavailable(injected("entry removal reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("entry removal refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => remove().await,
        }
    }

    /// Meets what a mark meets: one write of the item. In an item it finds full (a peek,
    /// outside the gates), the two writes the store would make instead, each through its
    /// own gate, so that a crash between them is reached too.
    async fn settle_entry(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
        max_marks: usize,
    ) -> Result<(), StoreError> {
        let full = self
            .inner
            .get_entity(key)
            .await
            .ok()
            .flatten()
            .is_some_and(|entity| entity.sent.len() >= max_marks && entity.entries.contains_key(&txn_id));
        if full {
            self.put_dispatched(txn_id, now, expires_at).await?;
            return self.remove_entry(key, txn_id).await;
        }
        let settle = || self.inner.settle_entry(key, txn_id, now, expires_at, max_marks);
        match self.gate.pass(Op::Mark).await {
            Fault::Late => {
                self.late(LateOp::Settle {
                    key: key.clone(),
                    txn_id,
                    now,
                    expires_at,
                    max_marks,
                });
                Err(StoreError::Unavailable(injected("settling timed out on its way")))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = settle().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = settle().await;
                Err(StoreError::Unavailable(injected("settling reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("settling refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => settle().await,
        }
    }

    async fn forget_marks(&self, key: &ItemKey, forget: &[TxnId]) -> Result<(), StoreError> {
        let removal = || self.inner.forget_marks(key, forget);
        match self.gate.pass(Op::Mark).await {
            Fault::Late => {
                self.late(LateOp::Forget {
                    key: key.clone(),
                    forget: forget.to_vec(),
                });
                Err(StoreError::Unavailable(injected("mark removal timed out on its way")))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = removal().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = removal().await;
                Err(StoreError::Unavailable(injected("mark removal reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("mark removal refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => removal().await,
        }
    }

    /// Meets what a tombstone write meets: it is one (with the fence in the item).
    async fn fence_entity(
        &self,
        key: &ItemKey,
        txn_id: TxnId,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<FenceOutcome, StoreError> {
        let fence = || self.inner.fence_entity(key, txn_id, now, expires_at);
        match self.gate.pass(Op::Tombstone).await {
            Fault::Late => {
                self.late(LateOp::Fence {
                    key: key.clone(),
                    txn_id,
                    now,
                    expires_at,
                });
                Err(StoreError::Unavailable(injected("fence timed out on its way")))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = fence().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = fence().await;
                Err(StoreError::Unavailable(injected("fence reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("fence refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => fence().await,
        }
    }

    async fn put_dispatched(&self, txn_id: TxnId, now: Timestamp, expires_at: Timestamp) -> Result<(), StoreError> {
        let put = || self.inner.put_dispatched(txn_id, now, expires_at);
        match self.gate.pass(Op::Mark).await {
            Fault::Late => {
                self.late(LateOp::PutDispatched {
                    txn_id,
                    now,
                    expires_at,
                });
                Err(StoreError::Unavailable(injected(
                    "dedup record put timed out on its way",
                )))
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = put().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = put().await;
                Err(StoreError::Unavailable(injected("dedup record put reply lost")))
            }
            Fault::Fail => Err(StoreError::Unavailable(injected("dedup record put refused"))),
            Fault::None | Fault::Duplicate | Fault::FirstEntryFails | Fault::Busy => put().await,
        }
    }

    /// An in-order consumer's keep of a message that came before its predecessor: a write,
    /// meeting what a mark meets.
    async fn keep_message(&self, kept: &KeptMessage) -> Result<(), StoreError> {
        gated!(self.gate, Op::Mark, self.inner.keep_message(kept).await,
            failed => Err(StoreError::Unavailable(injected("keep refused"))),
            lost => Err(StoreError::Unavailable(injected("keep reply lost"))))
    }

    async fn get_kept(&self, key: &str) -> Result<Option<KeptMessage>, StoreError> {
        gated!(self.gate, Op::Read, self.inner.get_kept(key).await,
            failed => Err(StoreError::Unavailable(injected("kept message read failed"))),
            lost => Err(StoreError::Unavailable(injected("kept message read reply lost"))))
    }

    async fn remove_kept(&self, key: &str) -> Result<(), StoreError> {
        gated!(self.gate, Op::Mark, self.inner.remove_kept(key).await,
            failed => Err(StoreError::Unavailable(injected("kept message removal refused"))),
            lost => Err(StoreError::Unavailable(injected("kept message removal reply lost"))))
    }
}

/// A gated control queue, both sides.
pub(crate) struct GatedControlQueue<Q> {
    pub inner: Arc<Q>,
    pub gate: Gate,
    pub in_flight: InFlight,
    /// Where set, who sends and receives control messages of what
    /// ([`Publishers::own`], [`Publishers::batch`]).
    pub publishers: Option<Publishers>,
}

#[async_trait]
impl<Q: ControlQueue + ControlInbox + 'static> ControlQueue for GatedControlQueue<Q> {
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        let fault = self.gate.pass(Op::ControlSend).await;
        if let Some(publishers) = &self.publishers {
            publishers.own(self.gate.actor(), message.txn_id);
        }
        let send = || self.inner.send(message, delay);
        match fault {
            Fault::None | Fault::FirstEntryFails | Fault::Busy => send().await,
            Fault::Late => {
                self.in_flight.lock().expect("in-flight lock").push((
                    self.gate.actor(),
                    LateOp::ControlSend {
                        message: message.clone(),
                        delay,
                    },
                ));
                Err(QueueError::Unavailable(injected("send timed out on its way")))
            }
            Fault::Duplicate => {
                send().await?;
                send().await
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = send().await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = send().await;
                Err(QueueError::Unavailable(injected("send reply lost")))
            }
            Fault::Fail => Err(QueueError::Unavailable(injected("send refused"))),
        }
    }
}

#[async_trait]
impl<Q: ControlQueue + ControlInbox + 'static> ControlInbox for GatedControlQueue<Q> {
    async fn receive(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<ControlDelivery>, QueueError> {
        let received = gated!(self.gate, Op::Receive, self.inner.receive(max, wait, visibility).await,
            failed => Err(QueueError::Unavailable(injected("receive failed"))),
            lost => Err(QueueError::Unavailable(injected("receive reply lost"))));
        if let (Some(publishers), Ok(deliveries)) = (&self.publishers, &received) {
            let txn_ids = deliveries
                .iter()
                .filter_map(|delivery| ControlMessage::decode(&delivery.body).ok())
                .map(|message| message.txn_id)
                .collect();
            publishers.batch(self.gate.actor(), txn_ids);
        }
        received
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        gated!(self.gate, Op::Ack, self.inner.ack(receipts).await,
            failed => Err(QueueError::Unavailable(injected("ack refused"))),
            lost => Err(QueueError::Unavailable(injected("ack reply lost"))))
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        gated!(self.gate, Op::Ack, self.inner.set_visibility(receipts).await,
            failed => Err(QueueError::Unavailable(injected("visibility change refused"))),
            lost => Err(QueueError::Unavailable(injected("visibility change reply lost"))))
    }
}

/// A consumer's ports over `store`: its publisher `publisher` and the simulation's clock
/// `clock`, both through `gate` (no skew, no timer firing), its ids from `ids`.
pub(crate) fn consumer_ports(
    store: Arc<dyn Store>,
    publisher: Arc<dyn Publisher>,
    clock: &Arc<ManualClock>,
    gate: &Gate,
    ids: Arc<dyn outbox::ports::IdSource>,
) -> outbox::consumer::ConsumerPorts {
    outbox::consumer::ConsumerPorts {
        store,
        publisher: Arc::new(GatedPublisher {
            inner: publisher,
            gate: gate.clone(),
            publishers: None,
        }),
        clock: Arc::new(GatedClock {
            inner: clock.clone(),
            skew_millis: 0,
            gate: gate.clone(),
            timers_fire: false,
        }),
        ids,
    }
}

/// A store through `gate`, its late commits into `in_flight`, with none of the
/// request path's extras (fence counts, signatures, publishers, refusals).
pub(crate) fn plain_gated_store(inner: Arc<dyn Store>, gate: &Gate, in_flight: &InFlight) -> Arc<GatedStore> {
    Arc::new(GatedStore {
        inner,
        gate: gate.clone(),
        in_flight: in_flight.clone(),
        fenced_out: None,
        signatures: None,
        publishers: None,
        refusals: None,
    })
}

/// A gated publisher.
pub(crate) struct GatedPublisher {
    pub inner: Arc<dyn Publisher>,
    pub gate: Gate,
    /// Where set, whose messages each actor sends first ([`Publishers`]).
    pub publishers: Option<Publishers>,
}

impl GatedPublisher {
    /// Sends `messages`, noting those accepted as sent by this actor.
    async fn send(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let result = self.inner.send_batch(destination, messages).await;
        if let (Some(publishers), Ok(failures)) = (&self.publishers, &result) {
            let accepted = messages
                .iter()
                .filter(|message| !failures.iter().any(|failure| failure.id == message.id));
            publishers.sent(self.gate.actor(), accepted);
        }
        result
    }
}

#[async_trait]
impl Publisher for GatedPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let unavailable = |what: &str| {
            Err(PublishError::Unavailable {
                destination: destination.clone(),
                source: injected(what),
            })
        };
        match self.gate.pass(Op::Publish).await {
            Fault::None | Fault::Duplicate | Fault::Busy | Fault::Late => self.send(destination, messages).await,
            Fault::FirstEntryFails => {
                let (first, rest) = messages.split_first().expect("batches are never empty");
                let mut failures = self.send(destination, rest).await?;
                failures.insert(
                    0,
                    EntryFailure {
                        id: first.id.clone(),
                        sender_fault: false,
                        code: "InternalError".into(),
                    },
                );
                Ok(failures)
            }
            Fault::CrashBefore => self.gate.crash().await,
            Fault::CrashAfter => {
                let _ = self.send(destination, messages).await;
                self.gate.crash().await
            }
            Fault::ReplyLost => {
                let _ = self.send(destination, messages).await;
                unavailable("publish reply lost")
            }
            Fault::Fail => unavailable("publish refused"),
        }
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

/// An actor's clock: the simulation's clock plus the actor's skew. Sleeping is a
/// scheduling point; only the scheduler moves time.
pub(crate) struct GatedClock {
    pub inner: Arc<ManualClock>,
    pub skew_millis: i64,
    pub gate: Gate,
    /// Whether timers fire (when the clock passes them and the scheduler wakes the
    /// actor), or never.
    pub timers_fire: bool,
}

#[async_trait]
impl Clock for GatedClock {
    fn now(&self) -> Timestamp {
        let base = self.inner.now().as_millis();
        Timestamp::from_millis(base.saturating_add_signed(self.skew_millis))
    }

    async fn sleep(&self, _duration: Duration) {
        self.gate.pass(Op::Sleep).await;
    }

    /// With `timers_fire`, fires once the simulation's clock has passed it and the
    /// scheduler wakes the actor (an operation waiting at its gate is then dropped: it
    /// never ran). Otherwise never: an operation cut short by a deadline is the fault
    /// `ReplyLost` (it may have applied, the caller got an error), which the scheduler
    /// injects; and a deadline passing between operations is the clock moving, which it
    /// chooses too.
    async fn timer(&self, duration: Duration) {
        if !self.timers_fire {
            std::future::pending::<()>().await;
        }
        let clock = self.inner.clone();
        let at = clock.now().plus(duration);
        self.gate.timer(at, move || clock.now()).await;
    }
}
