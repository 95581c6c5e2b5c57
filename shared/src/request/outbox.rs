//! The entry point of the request path: its ports, and beginning transactions.

use std::sync::Arc;
use std::time::Duration;

use super::after_answer::AfterAnswer;
use super::control_send::ControlSend;
use super::live::Live;
#[cfg(feature = "axum")]
use super::turns::Turn;
use super::turns::Turns;
use super::watch::BEGIN_WATCH;
use super::{Transaction, TxnError};
use crate::ports::{Clock, ControlQueue, IdSource, ItemKey, Publisher, Store, StoreError};
use crate::protocol::{ControlMessage, FifoGrouping, OutboxState, TxnId};
use crate::settings::{InlinePublish, Settings, Timing, TransactionLimits};
use crate::staging::Staging;
use crate::time::Timestamp;

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

/// The `Service` dimension of the request path's metrics unless
/// [`Outbox::with_service_name`] names it (and the settings' default service name).
pub use crate::settings::DEFAULT_SERVICE;

/// The entry point of the request path: begins transactions and reports their status.
/// Build one per process and share it.
#[derive(Clone)]
pub struct Outbox {
    pub(super) ports: RequestPorts,
    pub(super) timing: Timing,
    pub(super) limits: TransactionLimits,
    pub(super) inline: Option<Arc<dyn Publisher>>,
    /// Where inline publishing runs when it runs after the answer.
    pub(super) after_answer: Option<AfterAnswer>,
    /// The `Service` dimension of its metrics.
    pub(super) service: Arc<str>,
    /// Its transactions begun and not finished (shared by its clones).
    pub(super) live: Arc<Live>,
    /// How many sent marks an item holds (entity mode).
    pub(super) sent_marks: usize,
    /// The FIFO group of a message its emitter gave none.
    pub(super) fifo_groups: FifoGrouping,
    /// Its publishers' turns per entity (shared by its clones).
    pub(super) turns: Arc<Turns>,
    /// Its requests' turns per entity, for their read-decide-commit steps (shared by its
    /// clones).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(super) entity_turns: Arc<Turns>,
    /// The first pause before a step that met a version conflict runs again.
    pub(super) conflict_retry_pause: Duration,
}

/// The first pause before a request's step that met a version conflict runs again
/// (before jitter), unless the settings say otherwise.
pub const CONFLICT_RETRY_PAUSE: Duration = Duration::from_millis(10);

impl Outbox {
    /// The request path over `ports`, with `timing` and `limits` from the settings.
    pub fn new(ports: RequestPorts, timing: Timing, limits: TransactionLimits) -> Self {
        Self {
            ports,
            timing,
            limits,
            inline: None,
            after_answer: None,
            service: Arc::from(DEFAULT_SERVICE),
            live: Arc::default(),
            sent_marks: crate::protocol::sent_marks::MAX_SENT_MARKS,
            fifo_groups: FifoGrouping::Entity,
            turns: Arc::default(),
            entity_turns: Arc::default(),
            conflict_retry_pause: CONFLICT_RETRY_PAUSE,
        }
    }

    /// This request path, a step that met a version conflict running again after a
    /// pause drawn up to `pause`, then up to twice as long each time
    /// ([`CONFLICT_RETRY_PAUSE`] by default).
    pub fn with_conflict_retry_pause(mut self, pause: Duration) -> Self {
        self.conflict_retry_pause = pause.max(Duration::from_millis(1));
        self
    }

    /// The first pause before a step that met a version conflict runs again, before
    /// jitter.
    pub fn conflict_retry_pause(&self) -> Duration {
        self.conflict_retry_pause
    }

    /// This request path as another process's would be over the same ports: transactions
    /// and turns of its own, nothing shared with this one's. For tests and benchmarks
    /// that play several Lambda environments in one process.
    pub fn as_another_process(&self) -> Self {
        Self {
            live: Arc::default(),
            turns: Arc::default(),
            entity_turns: Arc::default(),
            ..self.clone()
        }
    }

    /// Waits for this process's turn to change entity `key` until `deadline` (`None`: the
    /// deadline passed first): the request that took it before lets go when its step
    /// has committed or given up. An entity nobody holds is taken at once.
    #[cfg(feature = "axum")]
    pub(crate) async fn entity_turn(&self, key: &ItemKey, deadline: Option<Timestamp>) -> Option<Turn<'_>> {
        let clock = self.ports.clock.as_ref();
        // No deadline: as long as the holders take.
        let wait = deadline.map_or(Duration::from_secs(24 * 3600), |deadline| deadline.since(clock.now()));
        self.entity_turns.take(clock, key, wait).await
    }

    /// This request path, giving each message its emitter gave no FIFO group the group
    /// `grouping` says ([`FifoGrouping::Entity`] by default: each entity's messages in
    /// commit order).
    pub fn with_fifo_groups(mut self, grouping: FifoGrouping) -> Self {
        self.fifo_groups = grouping;
        self
    }

    /// Replaces how many sent marks an item holds (entity mode;
    /// [`crate::protocol::sent_marks::MAX_SENT_MARKS`] by default): as many as the control
    /// path's ([`crate::control::ControlPath::with_sent_marks`]).
    pub fn with_sent_marks(mut self, max: usize) -> Self {
        self.sent_marks = max;
        self
    }

    /// The request path over `ports` as `settings` configure it: their timing, limits
    /// and service name, publishing inline through `publisher` after the answer (on
    /// tokio, [`AfterAnswer::on_tokio`]), before it, or not at all, as they choose.
    pub fn from_settings(ports: RequestPorts, settings: &Settings, publisher: Arc<dyn Publisher>) -> Self {
        let outbox = Self::new(ports, settings.timing, settings.limits)
            .with_service_name(&settings.service_name)
            .with_conflict_retry_pause(settings.conflict_retry_pause)
            .with_fifo_groups(settings.fifo_groups);
        match settings.inline_publish {
            InlinePublish::AfterAnswer => outbox.with_publishing_after_answer(publisher, AfterAnswer::on_tokio()),
            InlinePublish::BeforeAnswer => outbox.with_inline_publisher(publisher),
            InlinePublish::Off => outbox,
        }
    }

    /// This request path, its metrics under service name `service` (the `Service`
    /// dimension) instead of [`DEFAULT_SERVICE`]: the application's name, so that each
    /// service that commits through the outbox counts its own.
    pub fn with_service_name(mut self, service: &str) -> Self {
        self.service = Arc::from(service);
        self
    }

    /// This request path, publishing each committed transaction's messages itself through
    /// `publisher` and marking its record `dispatched` before answering (docs/PROTOCOL.md
    /// section 3, "Settling in the request path"). A failure there is logged and left to
    /// the control worker, whose control message stays the guarantee; the answer is the
    /// commit's either way.
    pub fn with_inline_publisher(mut self, publisher: Arc<dyn Publisher>) -> Self {
        self.inline = Some(publisher);
        self.after_answer = None;
        // What was sent whole is what this publisher sent.
        self.turns = Arc::default();
        self
    }

    /// This request path, publishing each committed transaction's messages itself through
    /// `publisher` right after the commit returns, on `after` instead of before the
    /// answer: the client does not wait for the publish. Whatever holds the process up
    /// until its work is done waits on [`Self::after_answer`] (the local server's graceful
    /// shutdown; on Lambda, `outbox::http::lambda::run`'s internal extension). Work cut
    /// off is the control worker's, as any failure of inline publishing.
    pub fn with_publishing_after_answer(mut self, publisher: Arc<dyn Publisher>, after: AfterAnswer) -> Self {
        self.inline = Some(publisher);
        self.after_answer = Some(after);
        self.turns = Arc::default();
        self
    }

    /// Where it publishes after the answer, if it does: wait on it before the process
    /// stops or freezes.
    pub fn after_answer(&self) -> Option<&AfterAnswer> {
        self.after_answer.as_ref()
    }

    /// The table, for reads outside a transaction (idempotency look-ups, queries).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.ports.store
    }

    /// The `Service` dimension of its metrics (the application's own metrics can use it).
    pub fn service_name(&self) -> &str {
        &self.service
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.ports.clock
    }

    /// Its timing: the commit window, the retention of records, the control message's
    /// delays.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// Begins a transaction: picks its id. Nothing is sent or written yet: its control
    /// message goes out when the transaction first needs it, just before its first commit
    /// attempt (or when the handler asks, [`Transaction::send_control`]), and the commit
    /// waits for the queue's acknowledgement. So a handler that refuses after its reads
    /// (not found, not yours, out of stock, a failed precondition) costs its reads and
    /// nothing more. Its commit may take as long as its retries need, within the commit
    /// window, which starts when its control message is sent.
    pub async fn begin(&self) -> Result<Transaction, TxnError> {
        self.begin_with(None, None)
    }

    /// Begins a transaction that changes one existing item, `key`, in entity mode
    /// (docs/PROTOCOL.md section 11, `docs/ENTITY_MODE.md`): its control message names the item,
    /// and where its staging is one put of `key` at a version read (no create, no other
    /// item, no native action, no idempotency record), its commit is one conditional
    /// write of the item carrying its outbox entry, with no transaction. Anything else
    /// commits in the transactional form, with the same guarantees (the fence that settles
    /// it blocks both forms).
    pub async fn begin_entity(&self, key: ItemKey) -> Result<Transaction, TxnError> {
        self.begin_with(None, Some(key))
    }

    /// [`Self::begin_entity`] within `deadline`, as [`Self::begin_within`].
    pub async fn begin_entity_within(&self, key: ItemKey, deadline: Timestamp) -> Result<Transaction, TxnError> {
        self.begin_with(Some(deadline), Some(key))
    }

    /// Begins a transaction that must be answered by `deadline` (an HTTP request's
    /// deadline, less a margin to answer): the control send is cut short there, commit
    /// attempts [`super::SETTLE_RESERVE`] before it (no retry starts after that, nor the
    /// control send the commit makes), and the tombstone that settles a failed commit is
    /// written by it. A commit cut short in flight is then [`TxnError::Fenced`] (nothing
    /// written), `Ok` (it had applied), or [`TxnError::Ambiguous`] if the tombstone could
    /// not be written in time; a deadline that passes before the commit is tried is
    /// [`TxnError::DeadlineExceeded`] (nothing written). Each names the transaction.
    pub async fn begin_within(&self, deadline: Timestamp) -> Result<Transaction, TxnError> {
        self.begin_with(Some(deadline), None)
    }

    #[tracing::instrument(name = "begin", skip_all, fields(txn_id))]
    fn begin_with(&self, deadline: Option<Timestamp>, entity: Option<ItemKey>) -> Result<Transaction, TxnError> {
        let now = self.ports.clock.now();
        let txn_id = self.ports.ids.next_txn_id(now);
        // The request scope running on this task, if any, sees every transaction begun
        // in it, however it is begun, and may refuse a second one.
        let watch = BEGIN_WATCH.try_with(Arc::clone).ok();
        if let Some(watch) = &watch {
            watch.admit(txn_id)?;
        }
        tracing::Span::current().record("txn_id", tracing::field::display(txn_id));
        // Built now, sent later: the worker's handling links the request's trace, through
        // this span.
        let mut control = ControlMessage::first(txn_id, now)
            .with_trace(crate::telemetry::current())
            .with_retention(self.timing.retention);
        if let Some(key) = &entity {
            control = control.with_entity(key.clone());
        }
        let mut txn = Transaction {
            outbox: self.clone(),
            txn_id,
            control: ControlSend::new(control),
            deadline,
            staging: Staging::new(txn_id, Arc::clone(&self.ports.store)),
            on_commit: Vec::new(),
            idempotency: None,
            _live: self.live.begun(txn_id, entity.clone(), now),
            entity,
            entity_barred: false,
            entity_attempted: false,
            counters: Vec::new(),
            counter_earlier: Vec::new(),
            counter_settled: false,
        };
        if let Some(watch) = watch {
            watch.started(self, &mut txn);
        }
        Ok(txn)
    }

    /// What is known of transaction `txn_id`.
    pub async fn status(&self, txn_id: TxnId) -> Result<TxnStatus, StoreError> {
        TxnStatus::read(self.ports.store.as_ref(), txn_id, None).await
    }

    /// What is known of transaction `txn_id`, begun in entity mode on item `key`
    /// ([`Self::begin_entity`]): its record where it has one, else the item, which holds
    /// its entry until dispatch and its sent mark after.
    pub async fn status_in(&self, txn_id: TxnId, key: &ItemKey) -> Result<TxnStatus, StoreError> {
        TxnStatus::read(self.ports.store.as_ref(), txn_id, Some(key)).await
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
    /// What `store` holds of transaction `txn_id`: its record; for a transaction begun in
    /// entity mode on `entity`, that item first (its entry until dispatch, its sent mark
    /// after), then the record. The item before the record: a proof only ever moves from
    /// the item to the record (a full item's settle, a delete), so one missed in the item
    /// is found in the record read after it; and a mark outranks a tombstone record (one
    /// written without the fence, by a direct `Store::put_tombstone`).
    pub async fn read(store: &dyn Store, txn_id: TxnId, entity: Option<&ItemKey>) -> Result<Self, StoreError> {
        if let Some(key) = entity {
            if let Some(item) = store.get_entity(key).await? {
                match item.entries.get(&txn_id).map(|entry| entry.state) {
                    Some(OutboxState::Pending) => return Ok(Self::Pending),
                    Some(OutboxState::Dispatched) => return Ok(Self::Dispatched),
                    _ if item.sent.contains_key(&txn_id) => return Ok(Self::Dispatched),
                    _ => {}
                }
            }
        }
        let records = store.get_outboxes(&[txn_id]).await?;
        Ok(match records.get(&txn_id).map(|record| record.state) {
            Some(OutboxState::Pending) => Self::Pending,
            Some(OutboxState::Dispatched) => Self::Dispatched,
            Some(OutboxState::Tombstone) => Self::Tombstoned,
            None => Self::Unknown,
        })
    }

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
