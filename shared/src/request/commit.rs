//! A transaction's commit: its attempts, and the settling write that decides a failed or
//! unknown one (docs/PROTOCOL.md section 3).

use super::counters::CounterOutcome;
use super::inline::Behind;
use super::settle::{settle_bound, within, COMMIT_RETRY_DELAY, SETTLE_RESERVE};
use super::{Committed, Settlement, Transaction, TxnError};
use crate::ports::{BusinessWrite, CommitError, CommitRequest, EntityCommit, ExpectedVersion};
use crate::protocol::{FifoGrouping, IdempotencyRecord, MessageId, OutboxRecord, OutboxState};
use crate::time::Timestamp;

/// Commits tried at most, when the store answers "contention" or "unknown outcome".
pub const COMMIT_ATTEMPTS: u32 = 5;

impl Transaction {
    /// Commits everything staged atomically with the outbox record, sending the control
    /// message first if it was not sent yet: the commit waits for the queue's
    /// acknowledgement ([`TxnError::ControlSend`] if it does not come: nothing written).
    /// A commit that cannot be tried (too large, or the deadline passed) sends nothing.
    ///
    /// A commit that fails is settled before this returns (docs/PROTOCOL.md section 3): the
    /// request path writes the transaction's tombstone, so its control message finds it
    /// settled. When the outcome was unknown (a timeout, a lost reply), that write
    /// decides it: written, the commit never applied and never can
    /// ([`TxnError::Fenced`], safe to retry); finding the transaction's own record, it
    /// committed (`Ok`). Only when the write cannot be made before the deadline is the
    /// answer [`TxnError::Ambiguous`]. Commit attempts stop [`SETTLE_RESERVE`] before the
    /// deadline to leave time for it.
    #[tracing::instrument(skip_all, fields(txn_id = %self.txn_id))]
    pub async fn commit(self) -> Result<Committed, TxnError> {
        let (live, txn_id) = (self.outbox.live.clone(), self.txn_id);
        let result = self.commit_and_settle().await;
        // Not reached when the commit's future is dropped midway: the request path then
        // keeps the transaction, so that an abandon still fences what may be on its way.
        live.finish_commit(txn_id);
        result
    }

    async fn commit_and_settle(mut self) -> Result<Committed, TxnError> {
        let txn_id = self.txn_id;
        let message_ids: Vec<MessageId> = self.staging.messages.iter().map(|message| message.id.clone()).collect();
        let mut request: Option<CommitRequest> = None;
        // The error of an attempt whose outcome was unknown, when a definite refusal
        // came after it.
        let mut unknown: Option<CommitError> = None;
        // Nothing of it has left the process yet: a commit that cannot be tried sends
        // nothing, and the control message goes out now, before anything can land (an
        // abandon before the send refuses it). While it is on its way nothing can have
        // been written, so the commit has not begun: an abandon meanwhile writes only the
        // tombstone record, and refuses the commit below.
        // Additions to counters are checked, and where the counter form does not apply
        // turned into a read-modify-write, before anything else: a refusal then costs
        // the read alone.
        if let Err(error) = self.prepare_counters().await {
            if self.sent_at().is_some() {
                // Its control message is out: the tombstone spares the worker its wait.
                let by = settle_bound(self.outbox.ports.clock.now(), self.deadline);
                self.outbox.abandon_in(txn_id, self.entity.as_ref(), Some(by)).await;
            }
            return Err(error);
        }
        if self.sent_at().is_none() {
            self.check_limits()?;
            let attempts_until = self.deadline.map(|deadline| deadline.minus(SETTLE_RESERVE));
            if attempts_until.is_some_and(|until| self.outbox.ports.clock.now() >= until) {
                return Err(TxnError::DeadlineExceeded { txn_id });
            }
            self.send_control_by(attempts_until).await?;
        }
        // Under the request path's lock: an abandon before this point refuses the commit
        // (no attempt was sent; the abandon's tombstone settles the control message);
        // one after it fences what may land.
        if !self.outbox.live.start_commit(txn_id) {
            tracing::error!("the transaction was abandoned before its commit; nothing was written");
            return Err(TxnError::Abandoned { txn_id });
        }
        for hook in std::mem::take(&mut self.on_commit) {
            hook(txn_id);
        }
        let error = match self.attempt(&mut request, &mut unknown).await {
            Ok(()) => {
                let sent = request.as_ref().expect("a commit that applied was sent");
                let inline = self.dispatch(sent, &sent.outbox).await;
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
        // The fence goes into the entity only where a commit in entity form may still
        // land there (an attempt of unknown outcome): a refused or transactional commit
        // needs only the tombstone record, which costs less.
        let fence_in = self.entity.as_ref().filter(|_| uncertain && self.entity_attempted);
        let (settlement, in_entity) = self.outbox.settle(txn_id, fence_in, settle_by).await;
        match settlement {
            Settlement::Committed(found) => {
                // An attempt whose outcome was unknown applied after all: dispatched in
                // the form it was found in (an entry in the entity, or a record).
                tracing::warn!(error = %error, "the commit applied after all");
                if self.counter_form_applies() {
                    // A counter commit read nothing, and the settling write tells
                    // nothing of the entries before it: the control worker, which
                    // reads the item, publishes them in order.
                    return Ok(Committed {
                        txn_id,
                        message_ids,
                        inline: super::InlineDispatch::LeftToWorker,
                    });
                }
                let committed = match &request {
                    Some(request) if found.state == OutboxState::Pending => request.outbox.clone(),
                    _ => found,
                };
                let entry_in = self.entity.as_ref().filter(|_| in_entity);
                let inline = self
                    .outbox
                    .dispatch_committed(entry_in, self.behind(&committed), &committed, self.deadline)
                    .await;
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
        // The window starts when the control message was sent, as the message says.
        let first_sent_at = self.sent_at().expect("the control message is sent before the commit");
        let window_end = first_sent_at.plus(timing.max_commit_duration);
        let attempts_until = self.deadline.map(|deadline| deadline.minus(SETTLE_RESERVE));

        // `unknown` holds the error of an earlier attempt whose outcome is unknown: from
        // then on, no failure short of a definite refusal can say "nothing was written".
        // The error of the last attempt that was definitely refused, for when the
        // deadline stops the retries.
        let mut last_refusal: Option<CommitError> = None;
        let mut attempt = 0;
        loop {
            attempt += 1;
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
            let counter = self.counter_commit(sent);
            let entity_form = if counter.is_some() {
                None
            } else {
                self.entity_form(sent)
            };
            self.entity_attempted |= entity_form.is_some() || counter.is_some();
            let mut placed = None;
            let outcome = match (&counter, &entity_form) {
                (Some(counter), _) => {
                    match within(
                        ports.clock.as_ref(),
                        attempts_until,
                        ports.store.commit_counter(counter),
                    )
                    .await
                    {
                        None => None,
                        Some(result) => match self.counter_outcome(result) {
                            Ok(done) => {
                                placed = Some(done);
                                Some(Ok(()))
                            }
                            // A refusal is authoritative even after an attempt of
                            // unknown outcome: had that attempt applied, this one would
                            // have found its entry (or its sent mark) first.
                            Err(CounterOutcome::Answer(error)) => return Err(error),
                            Err(CounterOutcome::Commit(error)) => Some(Err(error)),
                        },
                    }
                }
                (None, Some(entity)) => {
                    within(ports.clock.as_ref(), attempts_until, ports.store.commit_entity(entity)).await
                }
                (None, None) => {
                    let commit = ports.store.commit_native(sent, &self.staging.native);
                    within(ports.clock.as_ref(), attempts_until, commit).await
                }
            };
            let error = match outcome {
                Some(Ok(())) => {
                    tracing::info!(messages = sent.outbox.messages.len(), "committed");
                    if let Some(done) = placed {
                        self.counter_placed(request.as_mut().expect("just sent"), done);
                    }
                    return Ok(());
                }
                Some(Err(error)) => error,
                // Cut short in flight: the request may still reach the table.
                None => CommitError::Ambiguous("the request's deadline passed while the commit was in flight".into()),
            };
            // A counter write is conditioned on no version: sent again after an attempt
            // whose outcome is unknown, it could apply twice (that attempt's entry may
            // have left the item meanwhile, into its record where the item is full of
            // sent marks). So it is sent once at most; the settling write decides: it
            // finds the attempt's entry (or proof), or fences the item so that the
            // attempt can never land.
            if counter.is_some() && matches!(error, CommitError::Ambiguous(_)) {
                tracing::warn!(error = %error, attempt, "counter commit of unknown outcome; settling it");
                return Err(TxnError::Ambiguous { txn_id, source: error });
            }
            // The entity form can never apply (the item's fence mark is at or above this
            // transaction, or the entry does not fit the item); nothing was written, and
            // the transactional form, which the fence blocks as well, decides at once.
            if entity_form.is_some() && matches!(error, CommitError::EntityFenced { .. } | CommitError::TooLarge { .. })
            {
                tracing::info!(error = %error, attempt, "the entity form cannot apply; committing in the transactional form");
                self.entity_barred = true;
                // The switch happens once, and does not count as an attempt.
                attempt -= 1;
                continue;
            }
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
            // outbox record and reported success. (In entity mode the worker may have
            // dispatched that attempt's entry and removed it already, so this one meets
            // a version conflict: the settling write below then finds the record.)
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
                CommitError::NativeUnsupported | CommitError::EntityUnsupported | CommitError::EntityFenced { .. } => {
                    return Err(TxnError::NotCommitted { txn_id, source: error })
                }
                // A request path's record has no rival attempts (its id is its own): a
                // record of T that is not its own is one it cannot read (a malformed
                // attempt), and whether T committed is then unknown.
                CommitError::Superseded { .. } => return Err(TxnError::Ambiguous { txn_id, source: error }),
                CommitError::Contention(_) | CommitError::Unavailable(_) | CommitError::Invalid { .. } => {
                    return Err(match unknown.take() {
                        Some(source) => TxnError::Ambiguous { txn_id, source },
                        None => TxnError::NotCommitted { txn_id, source: error },
                    })
                }
            }
            ports.clock.sleep(COMMIT_RETRY_DELAY * 2u32.pow(attempt - 1)).await;
        }
    }

    /// The commit in entity mode, where this transaction's staging allows it: begun in
    /// entity mode, one put of its entity at a version read (a change at the item's
    /// version, or a create at the version of the key read holding no item; a blind
    /// create stays transactional, as nothing in the item could refuse a late attempt of
    /// it), no native action, no idempotency record.
    /// `None`: the transactional form, which the fence blocks as well.
    fn entity_form(&self, sent: &CommitRequest) -> Option<EntityCommit> {
        let key = self.entity.as_ref().filter(|_| !self.entity_barred)?;
        if sent.idempotency.is_some() || !self.staging.native.is_empty() {
            return None;
        }
        match sent.writes.as_slice() {
            [BusinessWrite::Put {
                key: put,
                data,
                expected: expected @ (ExpectedVersion::Exactly(_) | ExpectedVersion::AbsentAt(_)),
            }] if put == key => Some(EntityCommit {
                key: key.clone(),
                data: data.clone(),
                expected: *expected,
                entry: sent.outbox.clone(),
                checks_fence: true,
                applied: None,
            }),
            _ => None,
        }
    }

    /// Publishes a committed transaction's messages in the request path, in the form it
    /// was committed in.
    async fn dispatch(&self, sent: &CommitRequest, committed: &OutboxRecord) -> super::InlineDispatch {
        if self.counter_settled {
            return super::InlineDispatch::NothingToPublish;
        }
        let entity_form = self.counter_form_applies() || self.entity_form(sent).is_some();
        let entry_in = self.entity.as_ref().filter(|_| entity_form);
        self.outbox
            .dispatch_committed(entry_in, self.behind(committed), committed, self.deadline)
            .await
    }

    /// The entity `committed`'s messages have their place in (else the one it was begun
    /// in), with the entries of earlier transactions it held as read: in whichever form
    /// the transaction committed, they and the records their chains name go out first
    /// where order is kept.
    fn behind(&self, committed: &OutboxRecord) -> Option<Behind> {
        let key = committed
            .messages
            .iter()
            .find_map(|message| message.position.as_ref().map(|position| position.entity.clone()))
            .or_else(|| self.entity.clone())?;
        let mut entries = self.staging.entries_read(&key, self.txn_id);
        // A counter commit read nothing: the write itself saw the entries before it.
        for entry in &self.counter_earlier {
            if !entries.iter().any(|read| read.txn_id == entry.txn_id) {
                entries.push(entry.clone());
            }
        }
        entries.sort_by_key(crate::protocol::commit_order);
        Some(Behind { entries, key })
    }

    fn check_limits(&self) -> Result<(), TxnError> {
        self.staging.check_sendable().map_err(|source| TxnError::Unsendable {
            txn_id: self.txn_id,
            source,
        })?;
        self.staging
            .check_limits(&self.outbox.limits)
            .map_err(|reason| TxnError::TooLarge {
                txn_id: self.txn_id,
                reason,
            })
    }

    fn request(&self, now: Timestamp) -> CommitRequest {
        let expires_at = now.plus(self.outbox.timing.retention);
        let mut messages = self.staging.messages_to_commit();
        if self.outbox.fifo_groups == FifoGrouping::Transaction {
            for message in messages.iter_mut().filter(|message| message.group_id.is_none()) {
                message.group_id = Some(self.txn_id.to_string());
            }
        }
        CommitRequest {
            txn_id: self.txn_id,
            writes: self.staging.writes.values().cloned().collect(),
            outbox: OutboxRecord::committed(self.txn_id, messages, now, expires_at),
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
