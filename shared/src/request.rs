//! The request path (DESIGN.md section 3): a transactional session that sends the
//! delayed control message, stages business writes and messages, and commits them with
//! the outbox record in one atomic write.
//!
//! ```text
//! begin ── send control message (delay) ──► acknowledged?  no ─► ControlSend (nothing written)
//!   │ yes
//!   ├── reads (strongly consistent), business logic: put / delete / check / emit
//!   ▼
//! commit ── one atomic write: business writes (versioned) + outbox record + idempotency record
//!   ├── applied: publish the messages, mark the record dispatched (inline publishing)
//!   └── refused, or outcome unknown: write the tombstone (settles it; decides an unknown)
//! abandon (no commit) ── write the tombstone
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::ports::{
    BusinessWrite, Clock, CommitError, CommitRequest, ControlQueue, ExpectedVersion, IdSource, ItemKey, NativeAction,
    Publisher, QueueError, Store, StoreError, TombstoneOutcome, VersionedItem,
};
use crate::protocol::{
    ControlMessage, IdempotencyRecord, IdempotencySlot, Message, MessageId, OutboxRecord, OutboxState, OutgoingMessage,
    StoredResponse, TxnId,
};
use crate::publish::{publish_all, RetryPolicy};
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

/// Commits tried at most, when the store answers "contention" or "unknown outcome".
pub const COMMIT_ATTEMPTS: u32 = 5;
/// Wait before the first commit retry; doubled for the next.
const COMMIT_RETRY_DELAY: Duration = Duration::from_millis(25);
/// Time kept before a request's deadline for settling a commit of unknown outcome with a
/// tombstone (a conditional put, tried again if it fails): commit attempts stop this long
/// before the deadline. Also the most a settling write may add to an answer that is
/// already definite (a refusal, an abandoned transaction).
pub const SETTLE_RESERVE: Duration = Duration::from_millis(200);
/// Tombstone writes tried at most when settling a transaction in the request path.
pub const SETTLE_ATTEMPTS: u32 = 3;

/// How long a settling write that only spares the control worker work may take: until
/// [`SETTLE_RESERVE`] from `now`, or the deadline if that is sooner.
pub fn settle_bound(now: Timestamp, deadline: Option<Timestamp>) -> Timestamp {
    let quick = now.plus(SETTLE_RESERVE);
    deadline.map_or(quick, |deadline| deadline.min(quick))
}

/// Runs `operation`, cut short at `deadline` (by `clock`'s timer) if there is one:
/// `None` when the deadline came first.
async fn within<T>(
    clock: &dyn Clock,
    deadline: Option<Timestamp>,
    operation: impl std::future::Future<Output = T>,
) -> Option<T> {
    let Some(deadline) = deadline else {
        return Some(operation.await);
    };
    let left = deadline.since(clock.now());
    tokio::select! {
        biased;
        result = operation => Some(result),
        () = clock.timer(left) => None,
    }
}

/// The ports the request path uses.
#[derive(Clone)]
pub struct RequestPorts {
    /// The table.
    pub store: Arc<dyn Store>,
    /// Where control messages go.
    pub control_queue: Arc<dyn ControlQueue>,
    /// Wall-clock time.
    pub clock: Arc<dyn Clock>,
    /// Transaction ids.
    pub ids: Arc<dyn IdSource>,
}

/// The entry point of the request path: begins transactions and reports their status.
/// Build one per process and share it.
#[derive(Clone)]
pub struct Outbox {
    ports: RequestPorts,
    timing: Timing,
    limits: TransactionLimits,
    inline: Option<Arc<dyn Publisher>>,
}

/// Sends of one message the request path tries inline: fewer than the worker's, since a
/// client waits and the worker is the safety net.
const INLINE_RETRY: RetryPolicy = RetryPolicy {
    attempts: 2,
    base_delay: Duration::from_millis(25),
    max_delay: Duration::from_millis(100),
};

/// Why a transaction did not commit, or that its outcome is unknown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// The control message could not be sent; nothing was written.
    #[error("transaction {txn_id}: the control message could not be sent")]
    ControlSend {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: QueueError,
    },
    /// A read failed; nothing was written.
    #[error("transaction {txn_id}: a read failed")]
    Read {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The commit window had passed (or a tombstone was found): nothing was written,
    /// and this transaction can never commit. Starting again is safe.
    #[error("transaction {txn_id}: the commit window has expired")]
    CommitWindowExpired {
        /// The transaction.
        txn_id: TxnId,
    },
    /// The request's deadline came before the commit was tried; nothing was written,
    /// and this transaction can never commit now (the request path or its control
    /// message tombstones it).
    #[error("transaction {txn_id}: the request's deadline passed before the commit")]
    DeadlineExceeded {
        /// The transaction.
        txn_id: TxnId,
    },
    /// A business item changed since it was read; nothing was written.
    #[error("transaction {txn_id}: item {key} changed concurrently")]
    VersionConflict {
        /// The transaction.
        txn_id: TxnId,
        /// The item.
        key: ItemKey,
    },
    /// One of the application's native actions was cancelled (its condition failed, or
    /// DynamoDB refused it); nothing was written. See [`crate::native`].
    #[error("transaction {txn_id}: the application's action {index} was cancelled ({code})")]
    ActionCancelled {
        /// The transaction.
        txn_id: TxnId,
        /// The action's index, as [`crate::native::NativeTransaction::action`] returned it.
        index: usize,
        /// DynamoDB's cancellation code (`ConditionalCheckFailed`, ...).
        code: String,
        /// The item as it was, when the action asked for it (`ALL_OLD`).
        item: Option<crate::ports::NativeItem>,
    },
    /// The idempotency key was used by a transaction that committed; nothing was written.
    /// Read its record and replay the stored response.
    #[error("transaction {txn_id}: idempotency key {slot} is already used")]
    IdempotencyKeyUsed {
        /// The transaction.
        txn_id: TxnId,
        /// The key.
        slot: IdempotencySlot,
    },
    /// The transaction carries more than one commit can; nothing was written.
    #[error("transaction {txn_id} is too large: {reason}")]
    TooLarge {
        /// The transaction.
        txn_id: TxnId,
        /// Which limit.
        reason: String,
    },
    /// The store could not take the commit (contention, throttling, unavailable, or
    /// refused as invalid); nothing was written.
    #[error("transaction {txn_id}: the store did not take the commit")]
    NotCommitted {
        /// The transaction.
        txn_id: TxnId,
        /// Why.
        #[source]
        source: CommitError,
    },
    /// The commit's outcome was unknown (`source` says why), and the request path then
    /// settled it: it wrote the transaction's tombstone (or found the control worker's),
    /// so no attempt applied and none still in flight ever can. Nothing was written;
    /// starting again is safe.
    #[error("transaction {txn_id}: the commit's outcome was unknown; its tombstone now stops it")]
    Fenced {
        /// The transaction.
        txn_id: TxnId,
        /// The error of the attempt whose outcome was unknown.
        #[source]
        source: CommitError,
    },
    /// A second transaction was begun in a request that had begun one already
    /// (`txn_id`, which the answer names): a request is one transaction, with one answer
    /// and one idempotency record, even when the first was refused or abandoned (to try
    /// again, the client sends the request again). The second was refused before its
    /// control message; nothing of it was written. The first stands as it is. Stage
    /// every change of the request in one transaction.
    #[error("a second transaction in the request of transaction {txn_id}")]
    SecondInRequest {
        /// The request's first transaction.
        txn_id: TxnId,
    },
    /// Nobody knows whether the commit applied: it could not be settled before the
    /// deadline. The control worker settles it; the transaction's status tells the
    /// outcome later.
    #[error("transaction {txn_id}: the commit's outcome is unknown")]
    Ambiguous {
        /// The transaction.
        txn_id: TxnId,
        /// The last error seen.
        #[source]
        source: CommitError,
    },
}

impl TxnError {
    /// The transaction concerned.
    pub fn txn_id(&self) -> TxnId {
        match self {
            Self::ControlSend { txn_id, .. }
            | Self::Read { txn_id, .. }
            | Self::CommitWindowExpired { txn_id }
            | Self::DeadlineExceeded { txn_id }
            | Self::VersionConflict { txn_id, .. }
            | Self::ActionCancelled { txn_id, .. }
            | Self::IdempotencyKeyUsed { txn_id, .. }
            | Self::TooLarge { txn_id, .. }
            | Self::NotCommitted { txn_id, .. }
            | Self::Fenced { txn_id, .. }
            | Self::SecondInRequest { txn_id }
            | Self::Ambiguous { txn_id, .. } => *txn_id,
        }
    }

    /// Whether the transaction it names certainly did not commit: every variant but
    /// `Ambiguous`, and `SecondInRequest`, which names the request's first transaction
    /// (that one may well have committed).
    pub fn is_definite(&self) -> bool {
        !matches!(self, Self::Ambiguous { .. } | Self::SecondInRequest { .. })
    }
}

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

impl Committable for Transaction<'_> {
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

/// What the request path did with a committed transaction's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InlineDispatch {
    /// Inline publishing is off: the control worker publishes them.
    Off,
    /// The transaction emitted nothing: its record was committed `dispatched`.
    NothingToPublish,
    /// Published and the record marked `dispatched`: the control message finds it done.
    Dispatched,
    /// Publishing or marking failed, or the deadline came first: the control worker
    /// publishes them (again, under the same ids), as without inline publishing.
    LeftToWorker,
}

impl InlineDispatch {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NothingToPublish => "nothing_to_publish",
            Self::Dispatched => "dispatched",
            Self::LeftToWorker => "left_to_worker",
        }
    }
}

/// What is known of a transaction, for clients that got an ambiguous answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    /// Committed; its messages are being published.
    Pending,
    /// Committed and published.
    Dispatched,
    /// Never committed, and never will.
    Tombstoned,
    /// No record: still within its window, or finished long enough ago to be forgotten.
    Unknown,
}

impl TxnStatus {
    /// The status's name as reported.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Dispatched => "dispatched",
            Self::Tombstoned => "tombstoned",
            Self::Unknown => "unknown",
        }
    }
}

/// What the request path's tombstone write for a transaction found (DESIGN.md section 3,
/// "Settling in the request path").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// The tombstone is written: the transaction never committed and never can; its
    /// control message finds it settled.
    Tombstoned,
    /// A tombstone was there already (the control worker's): the same.
    AlreadyTombstoned,
    /// The transaction's own record: it committed.
    Committed(OutboxRecord),
    /// The write failed, or the deadline came first: the control message settles it, as
    /// it would have without this write.
    LeftToWorker,
}

impl Settlement {
    /// Whether the transaction certainly never committed.
    pub fn never_committed(&self) -> bool {
        matches!(self, Self::Tombstoned | Self::AlreadyTombstoned)
    }

    /// A short name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Tombstoned => "tombstoned",
            Self::AlreadyTombstoned => "already_tombstoned",
            Self::Committed(_) => "committed",
            Self::LeftToWorker => "left_to_worker",
        }
    }
}

impl Outbox {
    /// The request path over `ports`, with `timing` and `limits` from the settings.
    pub fn new(ports: RequestPorts, timing: Timing, limits: TransactionLimits) -> Self {
        Self {
            ports,
            timing,
            limits,
            inline: None,
        }
    }

    /// This request path, publishing each committed transaction's messages itself through
    /// `publisher` and marking its record `dispatched` before answering (DESIGN.md
    /// section 3, "Settling in the request path"). A failure there is logged and left to
    /// the control worker, whose control message stays the guarantee; the answer is the
    /// commit's either way.
    pub fn with_inline_publisher(mut self, publisher: Arc<dyn Publisher>) -> Self {
        self.inline = Some(publisher);
        self
    }

    /// Publishes a committed record's messages and marks it dispatched, within
    /// `deadline`. Never fails: what it cannot do, the control worker does.
    async fn dispatch_inline(&self, record: &OutboxRecord, deadline: Option<Timestamp>) -> InlineDispatch {
        let Some(publisher) = &self.inline else {
            return InlineDispatch::Off;
        };
        if record.state != OutboxState::Pending {
            return InlineDispatch::NothingToPublish;
        }
        let clock = self.ports.clock.as_ref();
        let settle = async {
            let messages: Vec<&OutgoingMessage> = record.messages.iter().collect();
            let report = publish_all(publisher.as_ref(), clock, &messages, INLINE_RETRY).await;
            if !report.failed.is_empty() {
                tracing::warn!(
                    failed = report.failed.len(),
                    "inline publishing failed; the control worker will publish"
                );
                return InlineDispatch::LeftToWorker;
            }
            // Only after every message went out: a record marked first and a crash before
            // publishing would lose them (I1).
            let expires_at = clock.now().plus(self.timing.retention);
            match self
                .ports
                .store
                .mark_dispatched(std::slice::from_ref(record), expires_at)
                .await
                .pop()
            {
                Some(Ok(())) => InlineDispatch::Dispatched,
                other => {
                    tracing::warn!(error = ?other.and_then(Result::err).map(|e| e.to_string()), "marking the record dispatched failed; the control worker will");
                    InlineDispatch::LeftToWorker
                }
            }
        };
        let outcome = within(clock, deadline, settle).await.unwrap_or_else(|| {
            tracing::warn!("the deadline came during inline publishing; the control worker will publish");
            InlineDispatch::LeftToWorker
        });
        // Which path dispatched the transaction: the worker counts its own dispatches.
        crate::metrics::MetricRecord::new("api", clock.now())
            .count("InlineDispatches", usize::from(outcome == InlineDispatch::Dispatched))
            .count("InlineFailures", usize::from(outcome == InlineDispatch::LeftToWorker))
            .emit();
        outcome
    }

    /// Abandons transaction `txn_id`: writes its tombstone (the same conditional put the
    /// control worker writes, `attribute_not_exists`), by `deadline` if there is one, so
    /// that its control message finds it settled at the first check instead of deferring
    /// until the window ends. A commit of it that is still in flight, or tried later,
    /// then fails. Never fails itself: what it cannot write, the control message settles.
    ///
    /// [`Transaction::abandon`] does this for a transaction in hand; the HTTP glue does
    /// it for a request whose handler began a transaction and answered without
    /// committing it.
    pub async fn abandon(&self, txn_id: TxnId, deadline: Option<Timestamp>) -> Settlement {
        let clock = self.ports.clock.as_ref();
        let mut settlement = Settlement::LeftToWorker;
        // A failed write is tried again while time remains: DynamoDB refuses a put on an
        // item that a transaction still in flight holds (TransactionConflict), which is
        // exactly the race this write settles. Trying again is safe: every outcome of
        // the conditional put means the same thing however many times it ran.
        for attempt in 1..=SETTLE_ATTEMPTS {
            let now = clock.now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                break;
            }
            let expires_at = now.plus(self.timing.retention);
            let write = self.ports.store.put_tombstone(txn_id, now, expires_at);
            match within(clock, deadline, write).await {
                Some(Ok(TombstoneOutcome::Written)) => settlement = Settlement::Tombstoned,
                Some(Ok(TombstoneOutcome::Exists(record))) if record.state == OutboxState::Tombstone => {
                    settlement = Settlement::AlreadyTombstoned
                }
                Some(Ok(TombstoneOutcome::Exists(record))) => settlement = Settlement::Committed(record),
                Some(Err(error)) => {
                    tracing::warn!(%txn_id, attempt, error = %error, "writing the tombstone failed");
                    if attempt < SETTLE_ATTEMPTS {
                        clock.sleep(COMMIT_RETRY_DELAY * attempt).await;
                    }
                    continue;
                }
                None => tracing::warn!(%txn_id, "the deadline came while writing the tombstone"),
            }
            break;
        }
        if settlement == Settlement::LeftToWorker {
            tracing::warn!(%txn_id, "the transaction is left to its control message");
        }
        tracing::info!(%txn_id, settlement = settlement.as_str(), "transaction settled in the request path");
        crate::metrics::MetricRecord::new("api", clock.now())
            .count("RequestTombstones", usize::from(settlement == Settlement::Tombstoned))
            .count(
                "RequestSettleFailures",
                usize::from(settlement == Settlement::LeftToWorker),
            )
            .emit();
        settlement
    }

    /// The table, for reads outside a transaction (idempotency look-ups, queries).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.ports.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.ports.clock
    }

    /// Begins a transaction: picks its id and sends its control message, returning once
    /// the queue has acknowledged it. Nothing is written before that. Its commit may take
    /// as long as its retries need, within the commit window.
    pub async fn begin(&self) -> Result<Transaction<'_>, TxnError> {
        self.begin_with(None).await
    }

    /// Begins a transaction that must be answered by `deadline` (an HTTP request's
    /// deadline, less a margin to answer): the control send is cut short there, commit
    /// attempts [`SETTLE_RESERVE`] before it (no retry starts after that), and the
    /// tombstone that settles a failed commit is written by it. A commit cut short in
    /// flight is then [`TxnError::Fenced`] (nothing written), `Ok` (it had applied), or
    /// [`TxnError::Ambiguous`] if the tombstone could not be written in time; a deadline
    /// that passes before the commit is tried is [`TxnError::DeadlineExceeded`] (nothing
    /// written). Each names the transaction.
    pub async fn begin_within(&self, deadline: Timestamp) -> Result<Transaction<'_>, TxnError> {
        self.begin_with(Some(deadline)).await
    }

    #[tracing::instrument(skip_all, fields(txn_id))]
    async fn begin_with(&self, deadline: Option<Timestamp>) -> Result<Transaction<'_>, TxnError> {
        let now = self.ports.clock.now();
        let txn_id = self.ports.ids.next_txn_id(now);
        // The request scope running on this task, if any, sees every transaction begun
        // in it, however it is begun, and may refuse a second one before anything is sent.
        let watch = BEGIN_WATCH.try_with(Arc::clone).ok();
        if let Some(watch) = &watch {
            watch.admit(txn_id)?;
        }
        tracing::Span::current().record("txn_id", tracing::field::display(txn_id));
        let control = ControlMessage::first(txn_id, now);
        let send = self.ports.control_queue.send(&control, self.timing.first_check_delay);
        // Whether or not a send cut short reached the queue, nothing will be committed:
        // a control message for a transaction that never commits only tombstones it.
        let sent = match within(self.ports.clock.as_ref(), deadline, send).await {
            Some(sent) => sent.map_err(|source| TxnError::ControlSend { txn_id, source }),
            None => Err(TxnError::ControlSend {
                txn_id,
                source: QueueError::Unavailable("the request's deadline passed during the send".into()),
            }),
        };
        if let Err(error) = sent {
            if let Some(watch) = &watch {
                watch.not_started();
            }
            return Err(error);
        }
        let mut txn = Transaction {
            outbox: self,
            txn_id,
            first_sent_at: now,
            deadline,
            writes: BTreeMap::new(),
            native: Vec::new(),
            on_commit: Vec::new(),
            messages: Vec::new(),
            idempotency: None,
        };
        if let Some(watch) = watch {
            watch.started(self, &mut txn);
        }
        Ok(txn)
    }

    /// What is known of transaction `txn_id`.
    pub async fn status(&self, txn_id: TxnId) -> Result<TxnStatus, StoreError> {
        let records = self.ports.store.get_outboxes(&[txn_id]).await?;
        Ok(match records.get(&txn_id).map(|record| record.state) {
            Some(OutboxState::Pending) => TxnStatus::Pending,
            Some(OutboxState::Dispatched) => TxnStatus::Dispatched,
            Some(OutboxState::Tombstone) => TxnStatus::Tombstoned,
            None => TxnStatus::Unknown,
        })
    }
}

/// What a request scope (the HTTP glue's) is told of the transactions begun while it
/// runs on this task, however they are begun: through it, or with [`Outbox::begin`]
/// directly. Installed with [`watch_begins`].
pub trait BeginWatch: Send + Sync {
    /// Before a transaction begins (nothing sent yet): an error refuses it. Admitting
    /// one holds the request's place until [`Self::started`] or [`Self::not_started`].
    fn admit(&self, txn_id: TxnId) -> Result<(), TxnError>;
    /// The admitted transaction could not begin (its control message was not sent).
    fn not_started(&self);
    /// Once it began (its control message acknowledged): record it, and hook its commit.
    fn started(&self, outbox: &Outbox, txn: &mut Transaction<'_>);
}

tokio::task_local! {
    static BEGIN_WATCH: Arc<dyn BeginWatch>;
}

/// Runs `future` with `watch` told of every transaction begun in it on this task.
pub async fn watch_begins<F: std::future::Future>(watch: Arc<dyn BeginWatch>, future: F) -> F::Output {
    BEGIN_WATCH.scope(watch, future).await
}

/// One transaction of the request path, from `begin` to `commit`. To give it up, call
/// [`Transaction::abandon`]: it writes the tombstone at once. Dropping it without
/// committing is safe too (a crash does that): its control message tombstones it, after
/// deferring until the commit window ends.
pub struct Transaction<'a> {
    outbox: &'a Outbox,
    txn_id: TxnId,
    first_sent_at: Timestamp,
    deadline: Option<Timestamp>,
    writes: BTreeMap<ItemKey, BusinessWrite>,
    /// The application's native actions ([`crate::native`] stages them), in order.
    pub(crate) native: Vec<NativeAction>,
    /// Each told once, just before the first commit attempt reaches the store.
    on_commit: Vec<Box<dyn FnOnce(TxnId) + Send + Sync + 'a>>,
    messages: Vec<OutgoingMessage>,
    idempotency: Option<(IdempotencySlot, String, StoredResponse)>,
}

impl<'a> Transaction<'a> {
    /// The transaction's id.
    pub fn id(&self) -> TxnId {
        self.txn_id
    }

    /// Has `hook` told, once, when the commit begins: from then on the transaction may
    /// have committed, and the commit settles it whatever happens (the HTTP glue records
    /// it, so that an answer given for an overrunning handler says "outcome unknown", not
    /// "nothing written", and so that it does not abandon the transaction itself). Hooks
    /// add up: each is told, in the order they were given.
    pub fn on_commit_attempt(&mut self, hook: impl FnOnce(TxnId) + Send + Sync + 'a) {
        self.on_commit.push(Box::new(hook));
    }

    /// The deadline it was begun with, if any.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.deadline
    }

    /// Reads one business item, strongly consistent.
    pub async fn get(&self, key: &ItemKey) -> Result<Option<VersionedItem>, TxnError> {
        Ok(self.get_many(std::slice::from_ref(key)).await?.remove(key))
    }

    /// Reads several business items in one call, strongly consistent.
    pub async fn get_many(&self, keys: &[ItemKey]) -> Result<BTreeMap<ItemKey, VersionedItem>, TxnError> {
        self.outbox
            .ports
            .store
            .get_items(keys)
            .await
            .map_err(|source| TxnError::Read {
                txn_id: self.txn_id,
                source,
            })
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

    /// Emits a message, published if and only if this transaction commits. Returns its
    /// stable id.
    pub fn emit(&mut self, message: Message) -> MessageId {
        let position = u32::try_from(self.messages.len()).unwrap_or(u32::MAX);
        let outgoing = OutgoingMessage::new(self.txn_id, position, message);
        let id = outgoing.id.clone();
        self.messages.push(outgoing);
        id
    }

    /// The messages emitted so far.
    pub fn messages(&self) -> &[OutgoingMessage] {
        &self.messages
    }

    /// Commits, with the transaction, the response that repeats of this request under
    /// idempotency key `slot` must get (the request's `fingerprint` tells repeats from
    /// misuse of the key).
    pub fn remember_response(&mut self, slot: IdempotencySlot, fingerprint: String, response: StoredResponse) {
        self.idempotency = Some((slot, fingerprint, response));
    }

    /// Abandons the transaction: writes its tombstone now, within its deadline (see
    /// [`Outbox::abandon`]). For a handler that decided, after `begin`, not to commit (a
    /// no-op, a 404 or 409 found by its reads).
    pub async fn abandon(self) -> Settlement {
        let by = settle_bound(self.outbox.ports.clock.now(), self.deadline);
        self.outbox.abandon(self.txn_id, Some(by)).await
    }

    /// Commits everything staged atomically with the outbox record.
    ///
    /// A commit that fails is settled before this returns (DESIGN.md section 3): the
    /// request path writes the transaction's tombstone, so its control message finds it
    /// settled. When the outcome was unknown (a timeout, a lost reply), that write
    /// decides it: written, the commit never applied and never can
    /// ([`TxnError::Fenced`], safe to retry); finding the transaction's own record, it
    /// committed (`Ok`). Only when the write cannot be made before the deadline is the
    /// answer [`TxnError::Ambiguous`]. Commit attempts stop [`SETTLE_RESERVE`] before the
    /// deadline to leave time for it.
    #[tracing::instrument(skip_all, fields(txn_id = %self.txn_id))]
    pub async fn commit(mut self) -> Result<Committed, TxnError> {
        let txn_id = self.txn_id;
        let message_ids: Vec<MessageId> = self.messages.iter().map(|message| message.id.clone()).collect();
        let mut request: Option<CommitRequest> = None;
        // The error of an attempt whose outcome was unknown, when a definite refusal
        // came after it.
        let mut unknown: Option<CommitError> = None;
        for hook in std::mem::take(&mut self.on_commit) {
            hook(txn_id);
        }
        let error = match self.attempt(&mut request, &mut unknown).await {
            Ok(()) => {
                let record = &request.as_ref().expect("a commit that applied was sent").outbox;
                let inline = self.outbox.dispatch_inline(record, self.deadline).await;
                return Ok(Committed {
                    txn_id,
                    message_ids,
                    inline,
                });
            }
            // A tombstone holds the key already, or the window has passed and the
            // control worker writes it at its next check: nothing to settle.
            Err(error @ TxnError::CommitWindowExpired { .. }) => return Err(error),
            Err(error) => error,
        };
        // The settling write decides the answer only when an attempt's outcome was
        // unknown; it may take until the deadline then. Otherwise the answer is definite
        // already, and the write only spares the control worker its deferrals.
        let uncertain = !error.is_definite() || unknown.is_some();
        let settle_by = if uncertain {
            self.deadline
        } else {
            Some(settle_bound(self.outbox.ports.clock.now(), self.deadline))
        };
        match self.outbox.abandon(txn_id, settle_by).await {
            Settlement::Committed(found) => {
                // An attempt whose outcome was unknown applied after all.
                tracing::warn!(error = %error, "the commit applied after all");
                let committed = match request {
                    Some(request) if found.state == OutboxState::Pending => request.outbox,
                    _ => found,
                };
                let inline = self.outbox.dispatch_inline(&committed, self.deadline).await;
                Ok(Committed {
                    txn_id,
                    message_ids,
                    inline,
                })
            }
            settlement if settlement.never_committed() => Err(match error {
                TxnError::Ambiguous { txn_id, source } => TxnError::Fenced { txn_id, source },
                definite => definite,
            }),
            // Unsettled: a refusal that came after an attempt of unknown outcome is not
            // the last word, since that attempt may still be on its way to the table.
            _ => Err(match unknown {
                Some(source) if error.is_definite() => TxnError::Ambiguous { txn_id, source },
                _ => error,
            }),
        }
    }

    /// Tries the commit until it applies, is refused definitely, or its attempts, the
    /// window or the time before the deadline's reserve run out. `request` keeps what
    /// was sent.
    async fn attempt(
        &mut self,
        request: &mut Option<CommitRequest>,
        unknown: &mut Option<CommitError>,
    ) -> Result<(), TxnError> {
        let txn_id = self.txn_id;
        self.check_limits()?;
        let ports = &self.outbox.ports;
        let timing = &self.outbox.timing;
        let window_end = self.first_sent_at.plus(timing.max_commit_duration);
        let attempts_until = self.deadline.map(|deadline| deadline.minus(SETTLE_RESERVE));

        // `unknown` holds the error of an earlier attempt whose outcome is unknown: from
        // then on, no failure short of a definite refusal can say "nothing was written".
        // The error of the last attempt that was definitely refused, for when the
        // deadline stops the retries.
        let mut last_refusal: Option<CommitError> = None;
        for attempt in 1..=COMMIT_ATTEMPTS {
            let now = ports.clock.now();
            // Past the window the worker may tombstone at any moment; trying anyway is
            // safe (the tombstone would block it) but pointless.
            if now >= window_end {
                return Err(match unknown.take() {
                    Some(source) => TxnError::Ambiguous { txn_id, source },
                    None => TxnError::CommitWindowExpired { txn_id },
                });
            }
            // Past the request's deadline (less the time settling needs) nobody waits
            // for the answer any more.
            if attempts_until.is_some_and(|until| now >= until) {
                return Err(match (unknown.take(), last_refusal) {
                    (Some(source), _) => TxnError::Ambiguous { txn_id, source },
                    (None, Some(source)) => TxnError::NotCommitted { txn_id, source },
                    (None, None) => TxnError::DeadlineExceeded { txn_id },
                });
            }
            if request.is_none() {
                *request = Some(self.request(now));
            }
            let sent = request.as_ref().expect("just built");
            let commit = ports.store.commit_native(sent, &self.native);
            let outcome = within(ports.clock.as_ref(), attempts_until, commit).await;
            let error = match outcome {
                Some(Ok(())) => {
                    tracing::info!(messages = sent.outbox.messages.len(), "committed");
                    return Ok(());
                }
                Some(Err(error)) => error,
                // Cut short in flight: the request may still reach the table.
                None => CommitError::Ambiguous("the request's deadline passed while the commit was in flight".into()),
            };
            // A business condition that failed is an answer (a 409), not a fault.
            if matches!(
                error,
                CommitError::VersionConflict { .. }
                    | CommitError::ActionCancelled { .. }
                    | CommitError::IdempotencyKeyUsed { .. }
            ) {
                tracing::info!(error = %error, attempt, "commit refused by a condition");
            } else {
                tracing::warn!(error = %error, attempt, "commit attempt failed");
            }
            // A definite refusal is authoritative even after an attempt of unknown
            // outcome: had that attempt applied, this one would have found its own
            // outbox record and reported success.
            match error {
                CommitError::Tombstoned { .. } => return Err(TxnError::CommitWindowExpired { txn_id }),
                CommitError::VersionConflict { key } => return Err(TxnError::VersionConflict { txn_id, key }),
                CommitError::IdempotencyKeyUsed { slot } => return Err(TxnError::IdempotencyKeyUsed { txn_id, slot }),
                CommitError::TooLarge { reason } => return Err(TxnError::TooLarge { txn_id, reason }),
                CommitError::Ambiguous(_) if attempt < COMMIT_ATTEMPTS => *unknown = Some(error),
                CommitError::Contention(_) | CommitError::Unavailable(_) if attempt < COMMIT_ATTEMPTS => {
                    last_refusal = Some(error)
                }
                CommitError::Ambiguous(_) => return Err(TxnError::Ambiguous { txn_id, source: error }),
                CommitError::ActionCancelled { index, code, item } => {
                    return Err(TxnError::ActionCancelled {
                        txn_id,
                        index,
                        code,
                        item,
                    })
                }
                CommitError::NativeUnsupported => return Err(TxnError::NotCommitted { txn_id, source: error }),
                CommitError::Contention(_) | CommitError::Unavailable(_) | CommitError::Invalid { .. } => {
                    return Err(match unknown.take() {
                        Some(source) => TxnError::Ambiguous { txn_id, source },
                        None => TxnError::NotCommitted { txn_id, source: error },
                    })
                }
            }
            ports.clock.sleep(COMMIT_RETRY_DELAY * 2u32.pow(attempt - 1)).await;
        }
        unreachable!("the last attempt returns")
    }

    fn check_limits(&self) -> Result<(), TxnError> {
        let limits = &self.outbox.limits;
        let bytes: usize = self.messages.iter().map(OutgoingMessage::payload_bytes).sum();
        let reason = if self.messages.len() > limits.max_messages {
            format!(
                "{} messages, at most {} allowed",
                self.messages.len(),
                limits.max_messages
            )
        } else if bytes > limits.max_message_bytes {
            format!(
                "{bytes} bytes of messages, at most {} allowed",
                limits.max_message_bytes
            )
        } else {
            return Ok(());
        };
        Err(TxnError::TooLarge {
            txn_id: self.txn_id,
            reason,
        })
    }

    fn request(&self, now: Timestamp) -> CommitRequest {
        let expires_at = now.plus(self.outbox.timing.retention);
        CommitRequest {
            txn_id: self.txn_id,
            writes: self.writes.values().cloned().collect(),
            outbox: OutboxRecord::committed(self.txn_id, self.messages.clone(), now, expires_at),
            idempotency: self
                .idempotency
                .as_ref()
                .map(|(slot, fingerprint, response)| IdempotencyRecord {
                    slot: slot.clone(),
                    fingerprint: fingerprint.clone(),
                    txn_id: self.txn_id,
                    response: response.clone(),
                    created_at: now,
                    expires_at,
                }),
        }
    }
}
