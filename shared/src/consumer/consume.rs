//! One incoming message through the application's handler, exactly once in effect
//! (docs/PROTOCOL.md section 10, steps 1 to 5).

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::in_order::{self, Gate};
use super::{ConsumerName, Delivery, Handler, HandlerError, Incoming, MessageIds, NoId, Requeue};
use crate::earlier;
use crate::metrics::Unit;
use crate::ports::{Clock, CommitError, CommitRequest, IdSource, ItemKey, Publisher, Store, StoreError};
use crate::protocol::Position;
use crate::protocol::{DestinationName, OutboxRecord, OutboxState, OutgoingMessage, TxnId};
use crate::publish::{publish_all, PublishFailure, RetryPolicy};
use crate::settings::TransactionLimits;
use crate::staging::Staging;

/// Runs of the handler for one message at most, when a business condition fails at the
/// commit (each run reads afresh); then the message fails, and the queue brings it back.
pub const HANDLER_RUNS: u32 = 3;
/// Reads of a message's record at most, each followed by a commit attempt when the record
/// is absent: contention, an unknown outcome or a rival copy's commit start a new round.
pub const ROUNDS: u32 = 6;
/// The wait before a round that follows contention or an unknown outcome; doubled for
/// each further one.
pub(super) const ROUND_DELAY: Duration = Duration::from_millis(25);

/// What the gate of an in-order message decided, once what it asks is done.
pub(super) enum Verdict {
    /// Its predecessor was applied: run the handler.
    Apply,
    /// It was kept, and its predecessor was found applied right after: read it all again.
    Again,
    /// Nothing more to do: a duplicate, kept, sent back, or failed.
    Done(Result<ConsumeOutcome, ConsumeError>),
}

/// The ports a consumer uses.
#[derive(Clone)]
pub struct ConsumerPorts {
    /// The table of the consumer's business items and records.
    pub store: Arc<dyn Store>,
    /// Where its outgoing messages go.
    pub publisher: Arc<dyn Publisher>,
    /// Wall-clock time.
    pub clock: Arc<dyn Clock>,
    /// The ids of commit attempts (each attempt's own, so the store tells its record
    /// from a rival copy's).
    pub ids: Arc<dyn IdSource>,
}

/// What processing one message did. Logs, metrics and tests use these words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumeOutcome {
    /// The handler ran, its effects committed, its messages went out.
    Processed {
        /// How many messages it emitted.
        messages: usize,
    },
    /// A committed record was waiting (an earlier attempt crashed or failed after its
    /// commit, or a copy is being processed concurrently): its stored messages went out;
    /// the handler did not run.
    Resumed {
        /// How many messages were published.
        messages: usize,
    },
    /// Another copy committed while this one ran the handler: this run's effects were
    /// dropped, and the winner's stored messages went out.
    Adopted {
        /// How many messages were published.
        messages: usize,
    },
    /// Processed before, its messages out: acknowledged with nothing done.
    Duplicate,
    /// In order ([`super::Handler::in_order`]): its predecessor in its chain was not
    /// applied yet, and the consumer keeps it ([`crate::ports::KeptMessage`]): whoever
    /// applies the predecessor applies it right after, in the same invocation. This
    /// delivery is acknowledged (it is kept), and on a standard source queue a reminder
    /// copy comes back after [`super::in_order::REMINDER_DELAY`] while it still waits.
    Kept {
        /// The last `seq` of its chain applied.
        applied: u64,
        /// Its own `seq`.
        seq: u64,
    },
    /// In order ([`super::Handler::in_order`]): its predecessor in its chain was not
    /// applied yet, and it could not be kept (the store keeps no messages, or it is too
    /// large to keep, [`super::in_order::MAX_KEPT_BYTES`]). A copy of it went back to its
    /// queue, to come again after `delay`, and this delivery is acknowledged: waiting
    /// never counts toward the dead-letter queue.
    Waiting {
        /// The last `seq` of its chain applied.
        applied: u64,
        /// Its own `seq`.
        seq: u64,
        /// When its copy comes.
        delay: Duration,
    },
}

impl ConsumeOutcome {
    /// A short name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Processed { .. } => "processed",
            Self::Resumed { .. } => "resumed",
            Self::Adopted { .. } => "adopted",
            Self::Duplicate => "duplicate",
            Self::Kept { .. } => "kept",
            Self::Waiting { .. } => "waiting",
        }
    }
}

/// Why a message failed: it goes back to the queue (and after the redrive policy's
/// receive count to the dead-letter queue). Whatever was committed stays committed, and
/// the next delivery resumes from it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The message has no usable id; it is never processed without one (C5).
    #[error(transparent)]
    NoId(#[from] NoId),
    /// Reading the message's record failed.
    #[error("reading the message's record failed")]
    Read(#[source] StoreError),
    /// The handler failed; nothing of its run was written.
    #[error("the handler failed")]
    Handler(#[source] HandlerError),
    /// A business condition failed at every commit, however many times the handler ran
    /// on fresh reads.
    #[error("a business condition failed in each of {runs} runs of the handler")]
    Conflict {
        /// Runs of the handler.
        runs: u32,
        /// The last commit's refusal.
        #[source]
        source: CommitError,
    },
    /// The commit was refused for good (too large, invalid, native actions on a store
    /// that cannot run them); nothing was written.
    #[error("the commit was refused")]
    Refused(#[source] CommitError),
    /// The handler emitted a message that every destination would refuse for good;
    /// nothing was written.
    #[error("the handler emitted a message that cannot be sent")]
    Unsendable(#[source] crate::protocol::Unsendable),
    /// Every round met contention or an unknown outcome; an attempt may still apply, and
    /// the next delivery will find its record.
    #[error("the commit was not settled in {ROUNDS} rounds")]
    Unsettled(#[source] CommitError),
    /// Some outgoing messages could not be published; the record stays pending and the
    /// next delivery publishes them again, under the same ids.
    #[error("{failed} of {total} outgoing messages could not be published")]
    Publish {
        /// How many failed.
        failed: usize,
        /// How many the message emitted.
        total: usize,
        /// The first failure.
        first: PublishFailure,
    },
    /// The messages went out, but marking the record dispatched failed; the next
    /// delivery publishes them again (same ids) and marks it.
    #[error("marking the record dispatched failed")]
    Mark(#[source] StoreError),
    /// The record holds a state no consumer writes (a tombstone).
    #[error("the message's record {txn_id} is a tombstone, which no consumer writes")]
    Corrupt {
        /// The record.
        txn_id: TxnId,
    },
    /// In entity mode, the handler staged what one conditional write of its entity
    /// cannot carry (another item, a delete, a native action, messages with no entity to
    /// hold them); nothing was written. Such a message needs the transactional mode.
    #[error("entity mode commits one item, {key}: {reason}")]
    NotOneItem {
        /// The entity.
        key: crate::ports::ItemKey,
        /// What the handler staged beyond it.
        reason: String,
    },
    /// In entity mode, the messages went out and the deduplication record is written,
    /// but removing the entry from the entity failed; the next delivery removes it.
    #[error("removing the outbox entry from its entity failed")]
    RemoveEntry(#[source] StoreError),
    /// An earlier message of its FIFO group failed in this batch: it was not tried, so
    /// that the group stays in order.
    #[error("an earlier message of its FIFO group failed")]
    EarlierInGroupFailed,
    /// In order: its predecessor in its chain was not applied yet, and no copy of it
    /// could go back to its queue (no [`super::Requeue`], a FIFO queue, or the send
    /// failed): it fails, and the queue brings it back after its visibility timeout.
    #[error("waiting for seq {} of its chain (applied: {applied}); it comes back with the queue", applied + 1)]
    Waiting {
        /// The last `seq` of its chain applied.
        applied: u64,
        /// Its own `seq`.
        seq: u64,
    },
    /// In order: the message was applied (or found applied), but a message kept after it
    /// could not be applied, nor handed back to its queue to be tried on its own (a FIFO
    /// source, no [`super::Requeue`], or the send failed): this delivery fails, so that it
    /// comes back and its next delivery, a duplicate, tries the kept message again.
    #[error("seq {seq} of its chain, kept after this message, could not be applied nor handed back to its queue")]
    KeptNotApplied {
        /// The kept message's `seq`.
        seq: u64,
        /// Why it could not be applied.
        #[source]
        source: Box<ConsumeError>,
    },
    /// Its messages have their place in an entity's history on a destination that keeps
    /// order, and the entity's earlier transactions still unsent, which go out first,
    /// could not all be found (a read failed, or more are unsent than one search reads):
    /// nothing of the message's was sent, and its next delivery tries again.
    #[error("the earlier unsent transactions of entity {entity} could not all be found")]
    Earlier {
        /// The entity.
        entity: ItemKey,
        /// Why.
        #[source]
        source: crate::ports::BoxError,
    },
    /// Its position attributes are there but cannot be read.
    #[error(transparent)]
    Position(#[from] crate::protocol::InvalidPosition),
    /// In order: its `seq` is at or below the last applied of its chain, but it comes
    /// from a later version of its entity than the message applied last, so it cannot be
    /// a copy of an earlier message: its entity's chain restarted from 1 (its heads were
    /// lost, or its table was restored from an old backup). Nothing of it was applied; it
    /// fails, to reach the dead-letter queue, rather than being dropped as a duplicate.
    #[error(
        "seq {seq} of its chain, from version {version} of its entity, is at or below seq {applied} applied (from version {applied_version}): \
         the entity's chain restarted (its heads lost, or its table restored from an old backup); not applied, and not a duplicate"
    )]
    ChainRestarted {
        /// Its own `seq`.
        seq: u64,
        /// Its entity's version after the transaction that sent it.
        version: u64,
        /// The last `seq` of its chain applied.
        applied: u64,
        /// The entity's version of the message applied last.
        applied_version: u64,
    },
}

/// A consumer: one handler, its name, and what it needs. Build one per process and share
/// it.
pub struct Consumer {
    name: ConsumerName,
    pub(super) ports: ConsumerPorts,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) retention: Duration,
    message_ids: MessageIds,
    pub(super) limits: TransactionLimits,
    pub(super) retry: RetryPolicy,
    /// Where an in-order message that waits goes back to.
    requeue: Option<Arc<dyn Requeue>>,
    /// The `Service` dimension of its metrics: its name.
    service: String,
}

impl Consumer {
    /// Consumer `name` running `handler` over `ports`, keeping each message's dedup data
    /// for `retention` from its dispatch ([`super::Retention`] derives it); messages are
    /// recognised by this library's ids ([`MessageIds::Outbox`]).
    pub fn new(name: ConsumerName, ports: ConsumerPorts, handler: Arc<dyn Handler>, retention: Duration) -> Self {
        Self {
            service: name.to_string(),
            name,
            ports,
            handler,
            retention,
            message_ids: MessageIds::Outbox,
            limits: TransactionLimits::default(),
            retry: RetryPolicy::default(),
            requeue: None,
        }
    }

    /// This consumer, sending an in-order message that waits back through `requeue` (its
    /// source queue) instead of failing it.
    pub fn with_requeue(mut self, requeue: Arc<dyn Requeue>) -> Self {
        self.requeue = Some(requeue);
        self
    }

    /// The clock it keeps time by (its poller's lease renewals too).
    pub fn clock(&self) -> &dyn Clock {
        self.ports.clock.as_ref()
    }

    /// This consumer, finding each message's id as `ids` says.
    pub fn with_message_ids(mut self, ids: MessageIds) -> Self {
        self.message_ids = ids;
        self
    }

    /// This consumer, with `limits` on what one message may emit.
    pub fn with_limits(mut self, limits: TransactionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// This consumer, retrying failed publish entries as `retry` says.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Its name.
    pub fn name(&self) -> &ConsumerName {
        &self.name
    }

    /// How long a message's dedup data is kept from its dispatch.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The id of the record (and the prefix of the outgoing ids) of the message whose id
    /// is `incoming`.
    pub fn txn_id(&self, incoming: &str) -> TxnId {
        TxnId::consumed(self.name.as_str(), incoming)
    }

    /// Processes one delivered message: acknowledge it if this returns `Ok`.
    ///
    /// In order, once the message is applied (or found applied), the messages kept after it
    /// in its chain are applied too, each in turn, before this returns (docs/PROTOCOL.md
    /// section 15, the kept messages).
    pub async fn consume(&self, delivery: &Delivery) -> Result<ConsumeOutcome, ConsumeError> {
        let (result, placed) = self.consume_once(delivery).await;
        let (Ok(outcome), Some(position)) = (&result, placed) else {
            return result;
        };
        if matches!(outcome, ConsumeOutcome::Kept { .. } | ConsumeOutcome::Waiting { .. }) {
            return result;
        }
        self.drain(&position).await?;
        // A copy that waited (a reminder, or one handed back) may have been kept, and so
        // may a delivery that comes again (an invocation that kept it stopped before its
        // acknowledgement, or failed to send its reminder): applied now, its kept message
        // goes, after those kept above it (see `drain`), under every key it may be kept.
        if in_order::waited(delivery, self.ports.clock.now()).0 > 0 || delivery.receive_count > 1 {
            for key in in_order::kept_keys(self.name.as_str(), &position, position.producer.is_some()) {
                self.forget_kept(&key).await;
            }
        }
        result
    }

    /// [`Self::consume`] without the drain: the outcome, and the message's position where it
    /// is placed and the consumer applies in order.
    async fn consume_once(&self, delivery: &Delivery) -> (Result<ConsumeOutcome, ConsumeError>, Option<Position>) {
        let incoming = match self.message_ids.read(delivery) {
            Ok(incoming) => incoming,
            Err(error) => {
                tracing::error!(queue_message_id = %delivery.message_id, error = %error, "message without a usable id: failed, never processed without dedup");
                return (Err(error.into()), None);
            }
        };
        let txn_id = self.txn_id(incoming.id.as_str());
        // Its processing continues its sender's trace; what the handler emits carries
        // this span's context. How it ended (a duplicate, an adopted run) is on the span.
        let span = tracing::info_span!(
            "consumed_message",
            queue_message_id = %delivery.message_id,
            incoming_id = %incoming.id,
            txn_id = %txn_id,
            receive_count = delivery.receive_count,
            outcome = tracing::field::Empty,
        );
        if let Some(trace) = &incoming.trace {
            crate::telemetry::continue_from(&span, trace);
        }
        let placed = match self.handler.in_order() {
            true => incoming.position().map_err(ConsumeError::Position),
            false => Ok(None),
        };
        let position = placed.as_ref().ok().cloned().flatten();
        let result = match (placed, self.handler.entity(&incoming).map_err(ConsumeError::Handler)) {
            (Err(error), _) | (Ok(Some(_)), Err(error)) => Err(error),
            // In order, in entity mode the chain's position is kept in the entity's key,
            // moved by the entity's own write; otherwise it is an item of its own, moved
            // in the transaction.
            (Ok(Some(position)), Ok(Some(key))) => {
                self.consume_entity(&incoming, txn_id, key, Some((&position, delivery)))
                    .instrument(span.clone())
                    .await
            }
            (Ok(Some(position)), _) => {
                self.consume_incoming(&incoming, txn_id, Some((&position, delivery)))
                    .instrument(span.clone())
                    .await
            }
            (Ok(None), Ok(Some(key))) => {
                self.consume_entity(&incoming, txn_id, key, None)
                    .instrument(span.clone())
                    .await
            }
            (Ok(None), Ok(None)) => {
                self.consume_incoming(&incoming, txn_id, None)
                    .instrument(span.clone())
                    .await
            }
            (Ok(None), Err(error)) => Err(error),
        };
        match &result {
            Ok(outcome) => span.record("outcome", outcome.as_str()),
            Err(_) => span.record("outcome", "failed"),
        };
        (result, position)
    }

    async fn consume_incoming(
        &self,
        incoming: &Incoming,
        txn_id: TxnId,
        in_order: Option<(&Position, &Delivery)>,
    ) -> Result<ConsumeOutcome, ConsumeError> {
        let mut runs = 0;
        let mut lost_race = false;
        let mut last: Option<CommitError> = None;
        let mut waits = 0;
        for _ in 1..=ROUNDS {
            // 1. The record says whether any attempt of any copy committed.
            if let Some(record) = self.read(txn_id).await? {
                return match record.state {
                    OutboxState::Dispatched => Ok(ConsumeOutcome::Duplicate),
                    OutboxState::Pending => {
                        // Never this run's messages: the winner's, as stored.
                        let messages = self.dispatch(&record).await?;
                        Ok(if lost_race {
                            ConsumeOutcome::Adopted { messages }
                        } else {
                            ConsumeOutcome::Resumed { messages }
                        })
                    }
                    OutboxState::Tombstone => Err(ConsumeError::Corrupt { txn_id }),
                };
            }
            // 2. The handler decides on fresh reads; in order, only once the message's
            // predecessor in its chain was applied.
            runs += 1;
            let mut staging = Staging::new(txn_id, Arc::clone(&self.ports.store));
            if let Some((position, delivery)) = in_order {
                let gate = in_order::gate(self.name.as_str(), position, &mut staging)
                    .await
                    .map_err(ConsumeError::Read)?;
                match self.not_applied(gate, position, delivery, None).await {
                    Verdict::Apply => {}
                    Verdict::Again => continue,
                    // The position may have been moved by this message's own commit since
                    // step 1 read no record: another invocation applied it meanwhile (a
                    // rival copy, or a drain that took its kept copy), and may stop before
                    // publishing. Acknowledged as a duplicate only with that commit's
                    // messages out: once this copy's kept message is gone, nothing else
                    // would send them. The record and the position are two reads, not one,
                    // and need not be: the commit that moved the position wrote the record
                    // in the same transaction, so the record read again after the position
                    // (strongly consistent, as every read here) finds it: pending, it goes
                    // out now; dispatched, its messages are out; absent, the message was
                    // applied so long ago that its record expired, after its dispatch (a
                    // pending record never expires). (consumer::tests::rival)
                    Verdict::Done(Ok(ConsumeOutcome::Duplicate)) => {
                        return match self.read(txn_id).await? {
                            Some(record) if record.state == OutboxState::Pending => {
                                let messages = self.dispatch(&record).await?;
                                Ok(ConsumeOutcome::Resumed { messages })
                            }
                            _ => Ok(ConsumeOutcome::Duplicate),
                        };
                    }
                    Verdict::Done(result) => return result,
                }
            }
            self.handler
                .handle(incoming, &mut staging)
                .await
                .map_err(ConsumeError::Handler)?;
            staging.check_sendable().map_err(ConsumeError::Unsendable)?;
            if let Err(reason) = staging.check_limits(&self.limits) {
                return Err(ConsumeError::Refused(CommitError::TooLarge { reason }));
            }
            // 3. Its writes and the record, atomically; the record only where none is.
            let now = self.ports.clock.now();
            let attempt = self.ports.ids.next_txn_id(now);
            let request = CommitRequest {
                txn_id,
                outbox: OutboxRecord::committed(txn_id, staging.messages_to_commit(), now, now.plus(self.retention))
                    .by_attempt(attempt),
                writes: staging.writes.into_values().collect(),
                idempotency: None,
            };
            let committed = self
                .ports
                .store
                .commit_native(&request, &staging.native)
                .instrument(tracing::info_span!("commit", txn_id = %txn_id))
                .await;
            let error = match committed {
                Ok(()) => {
                    tracing::info!(messages = request.outbox.messages.len(), "committed");
                    // Nothing to send: committed `dispatched`, its TTL running from now.
                    if request.outbox.state == OutboxState::Dispatched {
                        return Ok(ConsumeOutcome::Processed { messages: 0 });
                    }
                    let messages = self.dispatch(&request.outbox).await?;
                    return Ok(ConsumeOutcome::Processed { messages });
                }
                Err(error) => error,
            };
            match error {
                // Another copy won: the next round reads its record.
                CommitError::Superseded { .. } => {
                    tracing::info!("another copy of the message committed first; adopting its record");
                    lost_race = true;
                }
                CommitError::VersionConflict { .. } | CommitError::ActionCancelled { .. } => {
                    tracing::info!(error = %error, runs, "a business condition failed; running the handler again");
                    if runs >= HANDLER_RUNS {
                        return Err(ConsumeError::Conflict { runs, source: error });
                    }
                }
                // Whether it applied (or still may) the next read tells: a later attempt
                // can only apply where no record is, so an attempt still in flight loses
                // to it, or wins and is adopted.
                CommitError::Contention(_) | CommitError::Ambiguous(_) | CommitError::Unavailable(_) => {
                    tracing::warn!(error = %error, "commit attempt failed; reading the record again");
                    self.ports.clock.sleep(ROUND_DELAY * 2u32.pow(waits)).await;
                    waits += 1;
                    last = Some(error);
                }
                refused => return Err(ConsumeError::Refused(refused)),
            }
        }
        Err(ConsumeError::Unsettled(last.unwrap_or_else(|| {
            CommitError::Contention("copies of the message kept winning and losing".into())
        })))
    }

    /// What an in-order message the gate did not let through comes to: a duplicate
    /// (acknowledged), kept or a wait ([`Self::wait`]), or a failure where its chain
    /// restarted. `entity`: the handler's entity, where the position is kept in its key.
    pub(super) async fn not_applied(
        &self,
        gate: Gate,
        position: &Position,
        delivery: &Delivery,
        entity: Option<&ItemKey>,
    ) -> Verdict {
        Verdict::Done(match gate {
            Gate::Duplicate { applied } => {
                tracing::info!(
                    seq = position.seq,
                    applied,
                    "at or below the position applied: a duplicate"
                );
                Ok(ConsumeOutcome::Duplicate)
            }
            Gate::Wait { applied, unnamed_too } => {
                return self.wait(delivery, position, applied, unnamed_too, entity).await
            }
            Gate::Restarted { applied, version } => {
                let restarted = ConsumeError::ChainRestarted {
                    seq: position.seq,
                    version: position.version,
                    applied,
                    applied_version: version,
                };
                tracing::warn!(error = %restarted, "its chain restarted; failing the message");
                Err(restarted)
            }
            Gate::Apply => return Verdict::Apply,
        })
    }

    /// An in-order message whose predecessor was not applied: kept, so that whoever
    /// applies the predecessor applies it right after ([`Self::drain`]), and acknowledged;
    /// where it cannot be kept, a copy goes back to its queue to come again after a delay
    /// that grows with its waits ([`Self::send_back`]). Either way the oldest wait is
    /// measured, for the operator's alarm.
    ///
    /// Kept, the position is read once more: the predecessor may have been applied
    /// between the gate's read and the keep, by an invocation that looked for this message
    /// before it was kept and found none. Reads are strongly consistent, so one of the two
    /// sees the other's write: the applier reads the kept message after its commit, and
    /// the keeper the position after its keep. Then the keeper applies it itself
    /// ([`Verdict::Again`]).
    ///
    /// `unnamed_too`: its chain names its producer and has no position yet, so its
    /// predecessor may be a message sent before the producer named itself, whose drain
    /// looks under the unnamed chain's key: it is kept under both keys.
    async fn wait(
        &self,
        delivery: &Delivery,
        position: &Position,
        applied: u64,
        unnamed_too: bool,
        entity: Option<&ItemKey>,
    ) -> Verdict {
        let now = self.ports.clock.now();
        let (waits, since) = in_order::waited(delivery, now);
        let seq = position.seq;
        let mut metrics = crate::metrics::MetricRecord::new(self.service.clone(), now)
            .add(
                "InOrderWaitAge",
                Unit::Milliseconds,
                [now.since(since).as_millis() as f64],
            )
            .count("InOrderWaits", 1);
        if !in_order::fits_kept(delivery) {
            metrics.emit();
            tracing::warn!(seq, applied, "too large to keep; it waits on its queue");
            return Verdict::Done(self.send_back(delivery, position, applied, waits, since).await);
        }
        let keys = in_order::kept_keys(self.name.as_str(), position, unnamed_too);
        let mut kept_delivery = delivery.clone();
        kept_delivery.receipt = String::new();
        kept_delivery.receive_count = 1;
        let mut kept = Ok(());
        for key in &keys {
            let message = crate::ports::KeptMessage {
                key: key.clone(),
                delivery: kept_delivery.clone(),
                kept_at: since,
                expires_at: now.plus(self.retention),
            };
            kept = self.ports.store.keep_message(&message).await;
            if kept.is_err() {
                break;
            }
        }
        match kept {
            Ok(()) => {}
            Err(error) => {
                metrics.emit();
                match error {
                    StoreError::Unsupported(_) => {}
                    error => {
                        tracing::warn!(seq, applied, error = %error, "keeping the message failed; it waits on its queue")
                    }
                }
                return Verdict::Done(self.send_back(delivery, position, applied, waits, since).await);
            }
        }
        metrics = metrics.count("InOrderKept", 1);
        metrics.emit();
        match self.applied_now(position, entity).await {
            Ok(now_applied) if now_applied + 1 >= seq => {
                tracing::info!(
                    seq,
                    applied = now_applied,
                    "its predecessor was applied meanwhile; applying it"
                );
                // Applied by this invocation now, its kept message goes first: if this
                // invocation stops, the delivery in hand (not acknowledged) comes back.
                for key in &keys {
                    self.forget_kept(key).await;
                }
                return Verdict::Again;
            }
            Ok(_) => {}
            // Kept all the same: the next delivery reads the position again.
            Err(error) => return Verdict::Done(Err(ConsumeError::Read(error))),
        }
        if !self.remind(delivery, position, waits, since).await {
            // Kept, but acknowledged only with its reminder on its way: the reminder is
            // what keeps a kept message alive (each keep sets its expiry anew).
            return Verdict::Done(Err(ConsumeError::Waiting { applied, seq }));
        }
        tracing::info!(seq, applied, chain = %position.chain, entity = %position.entity, "waiting for the message's predecessor; kept");
        Verdict::Done(Ok(ConsumeOutcome::Kept { applied, seq }))
    }

    /// The last `seq` of `position`'s chain applied, read now: in `entity`'s key where the
    /// consumer keeps it there (else, or where the key keeps none, the position item); for
    /// a chain that names its producer and has no position yet, what it continues from
    /// ([`in_order::continued`]).
    pub(super) async fn applied_now(&self, position: &Position, entity: Option<&ItemKey>) -> Result<u64, StoreError> {
        let held = match self.held_now(position, entity).await? {
            held if !in_order::reads_legacy(held, position) => held,
            _ => in_order::continued(self.held_now(&position.unnamed(), entity).await?, position),
        };
        Ok(held.map_or(0, |(seq, _)| seq))
    }

    /// The last message of `position`'s own chain applied, read now, where there is one.
    async fn held_now(
        &self,
        position: &Position,
        entity: Option<&ItemKey>,
    ) -> Result<Option<in_order::Held>, StoreError> {
        let store = self.ports.store.as_ref();
        if let Some(key) = entity {
            let name = in_order::applied_name(self.name.as_str(), position);
            let held = match store.get_keys(std::slice::from_ref(key)).await {
                Ok(mut keys) => keys
                    .remove(key)
                    .and_then(|read| read.applied.get(&name).map(|held| (held.seq, Some(held.version)))),
                Err(StoreError::Unsupported(_)) => store
                    .get_entity(key)
                    .await?
                    .and_then(|entity| entity.applied.get(&name).map(|held| (held.seq, Some(held.version)))),
                Err(error) => return Err(error),
            };
            if held.is_some() {
                return Ok(held);
            }
        }
        in_order::read_position_item(self.name.as_str(), position, store).await
    }

    /// On a standard source queue, a reminder copy of a kept message, to come back after
    /// [`in_order::REMINDER_DELAY`]: if the message still waits then, it measures the wait
    /// again (the alarm), keeps the message anew (its expiry from then) and goes back once
    /// more; if its predecessor was applied and nothing applied the message (a kept message
    /// no invocation reached), it applies it. `false` where the reminder could not be sent
    /// (the delivery then fails, and comes back to keep and remind again); a message that
    /// carries 10 attributes already gets none, and is kept for the retention. Nothing to
    /// send on a FIFO source or without a [`super::Requeue`].
    async fn remind(
        &self,
        delivery: &Delivery,
        position: &Position,
        waits: u32,
        since: crate::time::Timestamp,
    ) -> bool {
        let Some(requeue) = self.requeue.as_ref().filter(|_| delivery.group_id.is_none()) else {
            return true;
        };
        let extra = in_order::wait_attributes(waits + 1, since);
        let copy = in_order::without_earlier_wait(delivery);
        if crate::ports::requeued_attributes(&copy, &extra).is_err() {
            tracing::warn!(
                seq = position.seq,
                "a kept message with 10 attributes gets no reminder; it is kept for the retention"
            );
            return true;
        }
        match requeue.requeue(&copy, &extra, in_order::REMINDER_DELAY).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(seq = position.seq, error = %error, "sending a kept message's reminder failed; the delivery fails and comes back");
                false
            }
        }
    }

    /// Removes a kept message applied (or a copy of one applied); a failure leaves it to
    /// its TTL (read again, it is a duplicate).
    async fn forget_kept(&self, key: &str) {
        match self.ports.store.remove_kept(key).await {
            Ok(()) | Err(StoreError::Unsupported(_)) => {}
            Err(error) => tracing::warn!(key, error = %error, "removing a kept message failed; it expires"),
        }
    }

    /// After the message at `position` was applied (or found applied): applies the
    /// messages kept after it in its chain, `seq + 1`, `seq + 2`, ..., each through the
    /// whole of [`Self::consume`]'s processing (its record, its gate, its handler, its
    /// commit moving the position, its messages), until a `seq` that is not kept. Then it
    /// removes them, the highest first: until then each is read again, as a duplicate, by
    /// the next delivery of this message if this invocation stops, so none above a kept
    /// one is ever stranded.
    ///
    /// A kept message that fails (its handler, the store) is handed back to its source
    /// queue as a copy of its own, to be tried and to fail as any message does (toward the
    /// dead-letter queue), and the drain stops there. Where it cannot be handed back (a
    /// FIFO source, no [`super::Requeue`], the send failed), this delivery fails
    /// ([`ConsumeError::KeptNotApplied`]) and its next delivery tries again.
    pub(super) async fn drain(&self, position: &Position) -> Result<usize, ConsumeError> {
        let mut drained: Vec<String> = Vec::new();
        let mut seq = position.seq;
        let failure = loop {
            let key = in_order::kept_key(self.name.as_str(), position, seq + 1);
            let kept = match self.ports.store.get_kept(&key).await {
                Ok(Some(kept)) => kept,
                Ok(None) | Err(StoreError::Unsupported(_)) => break None,
                Err(error) => break Some((seq + 1, ConsumeError::Read(error))),
            };
            match self.consume_once(&kept.delivery).await.0 {
                // Not its turn after all (its position is not the one its key says).
                Ok(ConsumeOutcome::Kept { .. } | ConsumeOutcome::Waiting { .. }) => break None,
                Ok(outcome) => {
                    let now = self.ports.clock.now();
                    tracing::info!(
                        seq = seq + 1,
                        entity = %position.entity,
                        chain = %position.chain,
                        outcome = outcome.as_str(),
                        kept_ms = now.since(kept.kept_at).as_millis() as u64,
                        "applied a kept message after its predecessor"
                    );
                    crate::metrics::MetricRecord::new(self.service.clone(), now)
                        .add(
                            "InOrderKeptAge",
                            Unit::Milliseconds,
                            [now.since(kept.kept_at).as_millis() as f64],
                        )
                        .emit();
                    // A message that names its producer may have been kept under the
                    // unnamed chain's key as well (it waited while its own chain had no
                    // position): both go.
                    let named = Position::from_attributes(&kept.delivery.attributes)
                        .ok()
                        .flatten()
                        .filter(|kept| kept.producer.is_some() && kept.seq == seq + 1);
                    drained.extend(named.map_or_else(
                        || vec![key.clone()],
                        |kept| in_order::kept_keys(self.name.as_str(), &kept, true),
                    ));
                    if !drained.contains(&key) {
                        drained.push(key);
                    }
                    seq += 1;
                }
                Err(error) => {
                    tracing::warn!(seq = seq + 1, error = %error, "a kept message failed after its predecessor; handing it back to its queue");
                    match self.hand_back(&kept.delivery).await {
                        Ok(()) => break None,
                        Err(()) => break Some((seq + 1, error)),
                    }
                }
            }
        };
        let count = drained.len();
        for key in drained.iter().rev() {
            self.forget_kept(key).await;
        }
        match failure {
            None => Ok(count),
            Some((seq, error)) => Err(ConsumeError::KeptNotApplied {
                seq,
                source: Box::new(error),
            }),
        }
    }

    /// A kept message that failed, handed back to its standard source queue as a copy of
    /// its own (marked as having waited, so that applied it removes its kept message), to
    /// come in a second. `Err` where it cannot be.
    async fn hand_back(&self, delivery: &Delivery) -> Result<(), ()> {
        let Some(requeue) = self.requeue.as_ref().filter(|_| delivery.group_id.is_none()) else {
            return Err(());
        };
        let now = self.ports.clock.now();
        let (waits, since) = in_order::waited(delivery, now);
        let extra = in_order::wait_attributes(waits + 1, since);
        requeue
            .requeue(
                &in_order::without_earlier_wait(delivery),
                &extra,
                in_order::wait_delay(0),
            )
            .await
            .map_err(|error| {
                tracing::warn!(error = %error, "handing a kept message back failed");
            })
    }

    /// An in-order message whose predecessor was not applied and that cannot be kept: a
    /// copy goes back to its queue to come again after a delay that grows with its waits,
    /// and the delivery in hand is acknowledged; without a way back, it fails (and counts
    /// toward the dead-letter queue).
    async fn send_back(
        &self,
        delivery: &Delivery,
        position: &Position,
        applied: u64,
        waits: u32,
        since: crate::time::Timestamp,
    ) -> Result<ConsumeOutcome, ConsumeError> {
        let seq = position.seq;
        let failed = ConsumeError::Waiting { applied, seq };
        let requeue = match (&self.requeue, &delivery.group_id) {
            (Some(requeue), None) => requeue,
            _ => {
                tracing::warn!(seq, applied, waits, chain = %position.chain, entity = %position.entity, "waiting for the message's predecessor; it comes back with the queue");
                return Err(failed);
            }
        };
        let delay = in_order::wait_delay(waits);
        let extra = in_order::wait_attributes(waits + 1, since);
        match requeue
            .requeue(&in_order::without_earlier_wait(delivery), &extra, delay)
            .await
        {
            Ok(()) => {
                tracing::info!(seq, applied, waits = waits + 1, delay_s = delay.as_secs(), chain = %position.chain, entity = %position.entity, "waiting for the message's predecessor; sent back to come again");
                Ok(ConsumeOutcome::Waiting { applied, seq, delay })
            }
            Err(error) => {
                tracing::warn!(seq, applied, error = %error, "sending a waiting message back failed; it comes back with the queue");
                Err(failed)
            }
        }
    }

    /// The message's record, read strongly consistent.
    pub(super) async fn read(&self, txn_id: TxnId) -> Result<Option<OutboxRecord>, ConsumeError> {
        let mut records = self
            .ports
            .store
            .get_outboxes_each(&[txn_id])
            .await
            .map_err(ConsumeError::Read)?;
        records.remove(&txn_id).transpose().map_err(ConsumeError::Read)
    }

    /// Publishes a committed record's (or entry's) messages, every one or fails (C5);
    /// returns how many went out.
    pub(super) async fn publish(&self, record: &OutboxRecord) -> Result<usize, ConsumeError> {
        // Nothing to send (an entry whose handler changed its entity and emitted nothing):
        // no publish at all, nor its span.
        if record.messages.is_empty() {
            return Ok(0);
        }
        self.send_earlier_first(record).await?;
        let messages: Vec<&OutgoingMessage> = record.messages.iter().collect();
        let clock = self.ports.clock.as_ref();
        let report = publish_all(self.ports.publisher.as_ref(), clock, &messages, self.retry).await;
        if let Some(first) = report.failed.values().next() {
            return Err(ConsumeError::Publish {
                failed: report.failed.len(),
                total: messages.len(),
                first: first.clone(),
            });
        }
        Ok(messages.len())
    }

    /// Before a committed record's (or entry's) messages, where they have their place in
    /// an entity's history on a destination that keeps order: the messages to such
    /// destinations of the entity's earlier transactions still unsent, whoever committed
    /// them (the request path, a worker's, another consumer's, this one's for another
    /// message), found through the entity's entries and the chain ([`earlier`]), as the
    /// request path sends them. They stay for their own publishers to settle (FIFO drops
    /// the copies within its deduplication window). So that a record this consumer marks
    /// dispatched means, as any other, that everything before it went out, and a later
    /// transaction's search may stop there.
    async fn send_earlier_first(&self, record: &OutboxRecord) -> Result<(), ConsumeError> {
        let publisher = self.ports.publisher.as_ref();
        let keeps_order = |destination: &DestinationName| publisher.keeps_order(destination);
        if !earlier::is_ordered(record, &keeps_order) {
            return Ok(());
        }
        let Some(key) = record
            .messages
            .iter()
            .find_map(|message| message.position.as_ref().map(|position| position.entity.clone()))
        else {
            return Ok(());
        };
        let store = self.ports.store.as_ref();
        // The entity's entries as they are now (those the handler's read saw may have
        // gone out since, or more come).
        let entries = match store.get_keys(std::slice::from_ref(&key)).await {
            Ok(mut keys) => keys.remove(&key).map(|read| read.entries).unwrap_or_default(),
            Err(StoreError::Unsupported(_)) => match store.get_entity(&key).await {
                Ok(entity) => entity.map(|entity| entity.entries).unwrap_or_default(),
                Err(StoreError::Unsupported(_)) => Default::default(),
                Err(error) => return Err(ConsumeError::Read(error)),
            },
            Err(error) => return Err(ConsumeError::Read(error)),
        };
        let entries = earlier::entries_before(entries.values(), record);
        let found = earlier::unsent_before_sending(store, &keeps_order, &key, entries, record)
            .await
            .map_err(|error| ConsumeError::Earlier {
                entity: key.clone(),
                source: Box::new(error),
            })?;
        let ordered: Vec<&OutgoingMessage> = found
            .iter()
            .flat_map(|earlier| &earlier.record().messages)
            .filter(|message| keeps_order(&message.destination))
            .collect();
        if ordered.is_empty() {
            return Ok(());
        }
        let report = publish_all(publisher, self.ports.clock.as_ref(), &ordered, self.retry).await;
        if let Some(first) = report.failed.values().next() {
            return Err(ConsumeError::Publish {
                failed: report.failed.len(),
                total: ordered.len(),
                first: first.clone(),
            });
        }
        tracing::info!(
            earlier = found.len(),
            messages = ordered.len(),
            entity = %key,
            "sent the entity's earlier messages first"
        );
        Ok(())
    }

    /// Step 4: publishes a committed record's messages, then marks it dispatched with its
    /// TTL from now (C4); returns how many went out.
    pub(super) async fn dispatch(&self, record: &OutboxRecord) -> Result<usize, ConsumeError> {
        let published = self.publish(record).await?;
        let clock = self.ports.clock.as_ref();
        // Only once every message went out: marked first, a crash would lose them.
        let expires_at = clock.now().plus(self.retention);
        match self
            .ports
            .store
            .mark_dispatched(std::slice::from_ref(record), expires_at)
            .await
            .pop()
        {
            Some(Ok(())) => Ok(published),
            Some(Err(error)) => Err(ConsumeError::Mark(error)),
            None => Err(ConsumeError::Mark(StoreError::Unavailable(
                "the store gave no result for the record".into(),
            ))),
        }
    }
}
