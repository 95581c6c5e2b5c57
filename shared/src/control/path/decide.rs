//! What the control path decides for each transaction of a batch: publish its record or
//! its entry, or settle it at once (done already, deferred, fenced, tombstoned, stale),
//! in the transactional mode from its record and in entity mode from its item first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::ControlPath;
use crate::control::outcome::{ControlError, ControlOutcome};
use crate::earlier::{self, Earlier, EarlierError};
use crate::ports::{FenceOutcome, ItemKey, StoreError, TombstoneOutcome};
use crate::protocol::{sent_marks, ControlMessage, DestinationName, OutboxRecord, OutboxState, TxnId};

/// After this many checks a transaction is tombstoned even if the worker's clock says
/// its window is still open: tombstoning is always safe (in entity mode too: the fence
/// mark is never pruned, so a commit arriving after it fails however late), and this
/// bounds the work a clock far behind the API's could cause.
pub const MAX_ATTEMPTS: u32 = 64;

/// What the batch decided for one transaction before publishing.
pub(super) enum Decision {
    /// A pending record: publish, then mark it. The entity's earlier transactions still
    /// unsent go out first (and are settled the same way).
    Publish(OutboxRecord, Vec<Earlier>),
    /// An entry committed into its entity (entity mode): publish, then put the
    /// transaction's record dispatched, then remove the entry. `true`: found beside the
    /// transaction's tombstone record. The entity's earlier transactions still unsent go
    /// out first (and are settled the same way).
    PublishEntry(ItemKey, OutboxRecord, bool, Vec<Earlier>),
    Done(Result<ControlOutcome, ControlError>),
}

impl ControlPath {
    /// What to do for one transaction, given what the batched read found of its record
    /// (entity mode: nothing was read yet).
    pub(super) async fn decide(
        &self,
        control: &ControlMessage,
        record: Option<Result<OutboxRecord, StoreError>>,
        parent: &tracing::Span,
    ) -> Decision {
        if let Some(key) = &control.entity {
            let span =
                tracing::info_span!(parent: parent, "decide", txn_id = %control.txn_id, attempt = control.attempt);
            return self.decide_in_entity(control, key).instrument(span).await;
        }
        match record {
            Some(Ok(record)) => self.decide_on_record(record).await,
            Some(Err(error)) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            None => {
                let span =
                    tracing::info_span!(parent: parent, "decide", txn_id = %control.txn_id, attempt = control.attempt);
                self.decide_on_absence(control).instrument(span).await
            }
        }
    }

    async fn decide_on_record(&self, record: OutboxRecord) -> Decision {
        match record.state {
            OutboxState::Pending => {
                // Its messages have their place in an entity's history on a destination
                // that keeps order: the entity's earlier transactions still unsent go
                // first (its entries are read from the item, the records from their ids).
                let keeps_order = |destination: &DestinationName| self.ports.publisher.keeps_order(destination);
                let entity = record
                    .messages
                    .iter()
                    .find_map(|message| message.position.as_ref().map(|position| position.entity.clone()))
                    .filter(|_| earlier::is_ordered(&record, &keeps_order));
                let Some(key) = entity else {
                    return Decision::Publish(record, Vec::new());
                };
                match self.ports.store.get_entity(&key).await {
                    Ok(entity) => {
                        let entries = entity.as_ref().map(|entity| &entity.entries);
                        match self.earlier(&key, entries, &record).await {
                            Ok(earlier) => Decision::Publish(record, earlier),
                            Err(error) => error,
                        }
                    }
                    Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
                }
            }
            state => Decision::Done(Ok(ControlOutcome::AlreadyDone { state })),
        }
    }

    /// The transactions of entity `key` before `record` still unsent, in commit order:
    /// its pending `entries` before it, and the records their chains name
    /// ([`earlier::unsent_before`]).
    async fn earlier(
        &self,
        key: &ItemKey,
        entries: Option<&BTreeMap<TxnId, OutboxRecord>>,
        record: &OutboxRecord,
    ) -> Result<Vec<Earlier>, Decision> {
        let entries = earlier::entries_before(entries.into_iter().flat_map(BTreeMap::values), record);
        let keeps_order = |destination: &DestinationName| self.ports.publisher.keeps_order(destination);
        earlier::unsent_before(self.ports.store.as_ref(), &keeps_order, key, entries, record, &|_| {
            false
        })
        .await
        .map_err(|error| {
            Decision::Done(Err(match error {
                EarlierError::Read(error) => ControlError::Read(Arc::new(error)),
                EarlierError::TooMany { entity } => ControlError::EarlierUnsent {
                    entity,
                    max: earlier::MAX_RECORDS_READ,
                },
            }))
        })
    }

    /// Entry `entry` of `key` to publish, after the earlier transactions still unsent
    /// (`entries`: the item's, as read).
    async fn publish_entry(
        &self,
        key: &ItemKey,
        entry: OutboxRecord,
        beside_tombstone: bool,
        entries: Option<&BTreeMap<TxnId, OutboxRecord>>,
    ) -> Decision {
        match self.earlier(key, entries, &entry).await {
            Ok(earlier) => Decision::PublishEntry(key.clone(), entry, beside_tombstone, earlier),
            Err(error) => error,
        }
    }

    /// T's record as found, in entity mode, where the entity may still hold T's entry
    /// (`slot`: T's slot in the entity as read already, `None` where it was not read):
    /// beside a dispatched record (a full item's settle, or a removal of an earlier
    /// version, that failed after the record) it is removed; beside a tombstone it is
    /// proof of a commit the tombstone did not fence, and is published.
    async fn decide_on_entity_record(
        &self,
        control: &ControlMessage,
        key: &ItemKey,
        record: OutboxRecord,
        slot: Option<Option<OutboxRecord>>,
    ) -> Decision {
        let slot = match slot {
            Some(slot) => Ok(slot),
            None => self.slot(key, control.txn_id).await,
        };
        match record.state {
            OutboxState::Dispatched => match slot {
                Ok(Some(_)) => {
                    tracing::info!(txn_id = %control.txn_id, entity = %key, "removing an entry left in its entity");
                    match self.ports.store.remove_entry(key, control.txn_id).await {
                        Ok(()) => self.decide_on_record(record).await,
                        Err(error) => Decision::Done(Err(ControlError::Mark(Arc::new(error)))),
                    }
                }
                Ok(_) => self.decide_on_record(record).await,
                Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            },
            OutboxState::Tombstone => match slot {
                Ok(Some(entry)) => {
                    tracing::error!(
                        txn_id = %control.txn_id,
                        entity = %key,
                        committed_at = %entry.created_at,
                        "an entry beside its transaction's tombstone: the transaction committed; publishing it"
                    );
                    match self.ports.store.get_entity(key).await {
                        Ok(entity) => {
                            self.publish_entry(key, entry, true, entity.as_ref().map(|entity| &entity.entries))
                                .await
                        }
                        Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
                    }
                }
                Ok(None) => self.decide_on_record(record).await,
                Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            },
            OutboxState::Pending => self.decide_on_record(record).await,
        }
    }

    /// Transaction `txn_id`'s committed entry in `key`, if it is there.
    async fn slot(&self, key: &ItemKey, txn_id: TxnId) -> Result<Option<OutboxRecord>, StoreError> {
        let entity = self.ports.store.get_entity(key).await?;
        Ok(entity.and_then(|entity| entity.entries.get(&txn_id).cloned()))
    }

    /// Entity mode: the item first. T's sent mark there settles it (one read, the usual
    /// case once the request path dispatched); otherwise T's record tells, read after the
    /// item: a mark leaves the item only once its record is put, so a mark missed by the
    /// item's read is found in the record. An entry is published; nothing at all is an
    /// absence (the fence, which checks both again atomically, decides).
    async fn decide_in_entity(&self, control: &ControlMessage, key: &ItemKey) -> Decision {
        let txn_id = control.txn_id;
        let entity = match self.ports.store.get_entity(key).await {
            Ok(entity) => entity,
            Err(error) => return Decision::Done(Err(ControlError::Read(Arc::new(error)))),
        };
        if let Some(entity) = &entity {
            self.forget_marks(key, &entity.sent).await;
            if entity.sent.contains_key(&txn_id) {
                return Decision::Done(Ok(ControlOutcome::AlreadyDone {
                    state: OutboxState::Dispatched,
                }));
            }
        }
        let record = match self.ports.store.get_outboxes_each(&[txn_id]).await {
            Ok(mut records) => records.remove(&txn_id),
            Err(error) => Some(Err(error)),
        };
        match record {
            Some(Ok(record)) => {
                let slot = entity.as_ref().and_then(|entity| entity.entries.get(&txn_id).cloned());
                self.decide_on_entity_record(control, key, record, Some(slot)).await
            }
            Some(Err(error)) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
            None => match entity.as_ref().and_then(|entity| entity.entries.get(&txn_id).cloned()) {
                Some(entry) => {
                    self.publish_entry(key, entry, false, entity.as_ref().map(|entity| &entity.entries))
                        .await
                }
                None => self.decide_on_absence(control).await,
            },
        }
    }

    /// Drops the marks past their time from an item that holds as many as it keeps, to
    /// make room for the next. A failure is logged: the next control message of the item
    /// tries again, and nothing depends on it (a full item settles in two writes).
    async fn forget_marks(&self, key: &ItemKey, sent: &BTreeMap<TxnId, crate::time::Timestamp>) {
        let Some(forget) = sent_marks::past_their_time(sent, self.ports.clock.now(), self.sent_marks) else {
            return;
        };
        match self.ports.store.forget_marks(key, &forget).await {
            Ok(()) => tracing::info!(entity = %key, forgotten = forget.len(), "sent marks past their time dropped"),
            Err(error) => tracing::warn!(entity = %key, error = %error, "dropping sent marks past their time failed"),
        }
    }

    async fn decide_on_absence(&self, control: &ControlMessage) -> Decision {
        let now = self.ports.clock.now();
        // Stale after the shorter of the sender's retention and this worker's: past the
        // sender's, the proof of a commit (its record, its sent mark) may have expired, and
        // a fence then would stand beside a commit.
        let stale_after = control.stale_after(self.timing.retention, self.timing.max_commit_duration);
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let disagree = control.retention.is_some_and(|sender| sender != self.timing.retention);
        if disagree && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                txn_id = %control.txn_id,
                sender_retention_s = control.retention.map(|sender| sender.as_secs()),
                worker_retention_s = self.timing.retention.as_secs(),
                stale_after_s = stale_after.as_secs(),
                "the API's OUTBOX_RETENTION_SECONDS differs from this worker's: the shorter holds (one within the commit window is ignored); set one value for both"
            );
        }
        if now >= control.first_sent_at.plus(stale_after) {
            tracing::warn!(txn_id = %control.txn_id, "control message older than the retention; acknowledging it without a tombstone");
            return Decision::Done(Ok(ControlOutcome::Stale));
        }
        let window_end = control.first_sent_at.plus(self.timing.max_commit_duration);
        if now < window_end && control.attempt < MAX_ATTEMPTS {
            let next = control.next_attempt();
            let delay = self.deferral_delay(control.attempt, window_end.since(now));
            return Decision::Done(match self.ports.control_queue.send(&next, delay).await {
                Ok(()) => Ok(ControlOutcome::Deferred {
                    next_attempt: next.attempt,
                    delay,
                }),
                Err(error) => Err(ControlError::Defer(Arc::new(error))),
            });
        }
        let expires_at = now.plus(self.timing.retention);
        if let Some(key) = &control.entity {
            // The fence raises the entity's fence mark, with the record's tombstone: no
            // commit of the transaction, in either form, applies after it, however late
            // (docs/ENTITY_MODE.md). Nothing to prune: the mark is one attribute.
            return match self
                .ports
                .store
                .fence_entity(key, control.txn_id, now, expires_at)
                .await
            {
                Ok(FenceOutcome::Fenced) => Decision::Done(Ok(ControlOutcome::Tombstoned)),
                Ok(FenceOutcome::Committed(entry)) => {
                    // Committed since the read above: the entity's earlier entries, as it
                    // holds them now, go out first.
                    match self.ports.store.get_entity(key).await {
                        Ok(entity) => {
                            self.publish_entry(key, entry, false, entity.as_ref().map(|entity| &entity.entries))
                                .await
                        }
                        Err(error) => Decision::Done(Err(ControlError::Read(Arc::new(error)))),
                    }
                }
                Ok(FenceOutcome::Dispatched) => Decision::Done(Ok(ControlOutcome::AlreadyDone {
                    state: OutboxState::Dispatched,
                })),
                // Recorded since this message's read (tombstoned by the request path's
                // settling fence, or committed and dispatched, its entry perhaps left in
                // the entity by a removal that failed): handled as a record read first is.
                Ok(FenceOutcome::Recorded(record)) => self.decide_on_entity_record(control, key, record, None).await,
                Err(error @ StoreError::Contention(_)) => self.fence_later(control, key, error).await,
                Err(error) => Decision::Done(Err(ControlError::Tombstone(Arc::new(error)))),
            };
        }
        match self.ports.store.put_tombstone(control.txn_id, now, expires_at).await {
            Ok(TombstoneOutcome::Written) => Decision::Done(Ok(ControlOutcome::Tombstoned)),
            // The transaction committed after our read (or a duplicate tombstoned it):
            // handle the record as it is now.
            Ok(TombstoneOutcome::Exists(record)) => self.decide_on_record(record).await,
            Err(error) => Decision::Done(Err(ControlError::Tombstone(Arc::new(error)))),
        }
    }

    /// A fence refused by a busy item: a new control message fences it later (its delay
    /// growing with the attempts, up to the backoff cap), and this one is done. Failing
    /// this message instead would count each refusal toward the dead-letter queue, where
    /// the transaction would wait unfenced, with a commit of it still able to land.
    async fn fence_later(&self, control: &ControlMessage, key: &ItemKey, error: StoreError) -> Decision {
        let next = control.next_attempt();
        let delay = self.deferral_delay(control.attempt, self.timing.backoff_cap);
        tracing::warn!(
            txn_id = %control.txn_id,
            entity = %key,
            error = %error,
            delay_s = delay.as_secs(),
            "the item is busy: fencing the transaction in a later check"
        );
        Decision::Done(match self.ports.control_queue.send(&next, delay).await {
            Ok(()) => Ok(ControlOutcome::FenceOnBusyItem {
                next_attempt: next.attempt,
                delay,
            }),
            Err(error) => Err(ControlError::Defer(Arc::new(error))),
        })
    }

    /// The delay before re-checking after check number `attempt`: the first check delay
    /// doubled per attempt, capped by the backoff cap and by the time left in the window,
    /// in whole seconds (SQS's unit), at least one.
    pub fn deferral_delay(&self, attempt: u32, left_in_window: Duration) -> Duration {
        let base = self.timing.first_check_delay.max(Duration::from_secs(1));
        let doubled = base.saturating_mul(1u32 << attempt.min(16));
        let delay = doubled.min(self.timing.backoff_cap).min(left_in_window);
        let whole_seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        Duration::from_secs(whole_seconds.clamp(1, 900))
    }
}
