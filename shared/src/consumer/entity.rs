//! One incoming message in entity mode (docs/PROTOCOL.md section 11): its outbox entry lives in
//! the one item the message changes, and its commit is one conditional write of that
//! item, with no transaction.
//!
//! ```text
//! read K, then the dedup record IN#(consumer, m)  (both strongly consistent, in order)
//!   ├── dedup record dispatched ─► remove K's entry m if still there (or, after an
//!   │                              attempt of unknown outcome, write K as read so that
//!   │                              the attempt cannot land) ─► acknowledge
//!   ├── K holds entry m ─► publish its messages ─► put the dedup record ─► remove the entry
//!   └── neither ─► run the handler ─► write K with its data and entry m, conditioned on
//!                  K's version and on no entry m ─► publish ─► dedup record ─► remove entry
//! ```
//!
//! Why this order:
//! - K before the dedup record: read the other way, a copy could find no record, then
//!   let the first copy write its record and remove its entry, then read K without the
//!   entry and apply the message again.
//! - The dedup record before the entry's removal: removed first, a crash between the two
//!   would leave neither, and the next copy would apply the message again.
//! - The commit adds entry m and sets the data only, and the removal removes entry m only:
//!   neither ever rewrites another message's entry, so a removed entry never comes back.

use std::sync::Arc;
use tracing::Instrument;

use super::consume::{Consumer, Verdict, HANDLER_RUNS, ROUNDS, ROUND_DELAY};
use super::in_order;
use super::{ConsumeError, ConsumeOutcome, Incoming};
use crate::ports::Delivery;
use crate::ports::{
    BusinessWrite, CommitError, EntityCommit, EntityItem, ExpectedVersion, ItemKey, StoreError, VersionedItem,
};
use crate::protocol::{Applied, AppliedPositions, OutboxRecord, OutboxState, Position, TxnId};
use crate::staging::Staging;

/// What one write of the entity carries: its new data and the version it expects.
/// `None`: the handler staged nothing to write or send (a check at most), so only the
/// decision is recorded, in the dedup record.
fn entity_write(
    staging: &Staging,
    key: &ItemKey,
    read: Option<&VersionedItem>,
) -> Result<Option<(serde_json::Value, ExpectedVersion)>, ConsumeError> {
    let refuse = |reason: String| ConsumeError::NotOneItem {
        key: key.clone(),
        reason,
    };
    if !staging.native.is_empty() {
        return Err(refuse(format!("{} native action(s)", staging.native.len())));
    }
    if let Some(other) = staging.writes.keys().find(|staged| *staged != key) {
        return Err(refuse(format!("a write to {other}")));
    }
    let nothing_to_write = !matches!(
        staging.writes.get(key),
        Some(BusinessWrite::Put { .. } | BusinessWrite::Delete { .. })
    );
    if nothing_to_write && staging.messages.is_empty() {
        return Ok(None);
    }
    let as_read = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
    let unchanged = |expected: ExpectedVersion| read.map(|item| (item.data.clone(), expected));
    let write = match staging.writes.get(key) {
        Some(BusinessWrite::Put { data, expected, .. }) => Some((data.clone(), *expected)),
        Some(BusinessWrite::Delete { .. }) => return Err(refuse("a delete of it, which cannot hold its entry".into())),
        // Only messages (and maybe a check of the entity as read): the entity keeps the
        // data read and carries the entry, conditioned on the version read.
        Some(BusinessWrite::Check { expected, .. }) if !same_life(*expected, as_read) => {
            return Err(refuse(format!(
                "a check expecting {expected:?}, but it was read as {as_read:?}: its data as read cannot be kept"
            )))
        }
        Some(BusinessWrite::Check { .. }) | None => unchanged(as_read),
    };
    if write.is_none() && !staging.messages.is_empty() {
        return Err(refuse("messages, but the entity does not exist to hold them".into()));
    }
    Ok(write)
}

/// Whether two expectations of the entity name the same state of it: the same version of
/// an item, or no item (a create pinned to the version a delete left, `AbsentAt`, expects
/// what a read of the missing entity, `Absent`, saw).
fn same_life(one: ExpectedVersion, other: ExpectedVersion) -> bool {
    match (one, other) {
        (ExpectedVersion::Exactly(one), ExpectedVersion::Exactly(other)) => one == other,
        (ExpectedVersion::Exactly(_), _) | (_, ExpectedVersion::Exactly(_)) => false,
        (_, _) => true,
    }
}

/// What [`Consumer::block_attempts`] did.
enum Blocked {
    /// The entity was written as read: no earlier attempt can land any more.
    Done,
    /// The entity changed since it was read: read it again.
    Changed,
    /// The write failed, or its outcome is unknown.
    Failed(CommitError),
}

impl Consumer {
    pub(super) async fn consume_entity(
        &self,
        incoming: &Incoming,
        txn_id: TxnId,
        key: ItemKey,
        in_order: Option<(&Position, &Delivery)>,
    ) -> Result<ConsumeOutcome, ConsumeError> {
        // In order: the position of the message's chain the entity's key keeps, and the
        // message's place, which a commit applying it sets there.
        let applying = in_order.map(|(position, _)| {
            let applied = Applied {
                seq: position.seq,
                version: position.version,
                txn: Some(txn_id),
            };
            (in_order::applied_name(self.name().as_str(), position), applied)
        });
        let store = &self.ports.store;
        let mut runs = 0;
        let mut lost_race = false;
        let mut last: Option<CommitError> = None;
        // An attempt of this delivery whose outcome is unknown: it may still land.
        let mut unknown_sent = false;
        // The versions those attempts expected: one may land while the entity is still
        // at it.
        let mut unknown_expected: Vec<ExpectedVersion> = Vec::new();
        let mut waits = 0;
        for _ in 1..=ROUNDS {
            // 1. The entity, then the dedup record: this order only (see the module).
            let entity = store.get_entity(&key).await.map_err(ConsumeError::Read)?;
            let record = self.read(txn_id).await?;
            let entry = entity.as_ref().and_then(|entity| entity.entries.get(&txn_id)).cloned();
            match (record, entry) {
                // A pending entry beside the dedup record: a copy whose handler staged
                // nothing recorded its decision while another copy committed this entry
                // (on the entity as it changed meanwhile), whose messages may not have
                // gone out. They go out now, under their ids.
                (Some(record), Some(entry))
                    if record.state == OutboxState::Dispatched && entry.state == OutboxState::Pending =>
                {
                    let messages = self.dispatch_entry(&key, &entry).await?;
                    return Ok(ConsumeOutcome::Resumed { messages });
                }
                (Some(record), entry) if record.state == OutboxState::Dispatched => {
                    if entry.is_some() {
                        store
                            .remove_entry(&key, txn_id)
                            .await
                            .map_err(ConsumeError::RemoveEntry)?;
                    } else {
                        // Another copy settled the message (it recorded a decision that
                        // wrote nothing), but an attempt of this one may still land on K
                        // where K is still at the version it expected: it is blocked before
                        // the acknowledgement.
                        let as_now = entity.as_ref().map_or(ExpectedVersion::Absent, |entity| {
                            ExpectedVersion::Exactly(entity.item.version)
                        });
                        if unknown_expected.iter().any(|expected| same_life(*expected, as_now)) {
                            match entity.as_ref() {
                                Some(entity) => match self.block_attempts(&key, txn_id, entity).await {
                                    Blocked::Done => {}
                                    Blocked::Changed => continue,
                                    // The block's own outcome may be unknown too: it is one
                                    // more attempt at this version, and the next round reads
                                    // K again (a block that landed is an empty entry, which
                                    // that round publishes, records and removes).
                                    Blocked::Failed(error) => {
                                        tracing::warn!(error = %error, "blocking an attempt of unknown outcome failed; reading the entity again");
                                        unknown_expected.push(as_now);
                                        self.ports.clock.sleep(ROUND_DELAY * 2u32.pow(waits)).await;
                                        waits += 1;
                                        last = Some(error);
                                        continue;
                                    }
                                },
                                None => {
                                    return Err(ConsumeError::Unsettled(last.unwrap_or_else(|| {
                                        CommitError::Ambiguous(
                                            "an attempt of unknown outcome may still create the entity".into(),
                                        )
                                    })))
                                }
                            }
                        }
                    }
                    return Ok(ConsumeOutcome::Duplicate);
                }
                // Committed in the transactional mode (the handler chose it before).
                (Some(record), _) if record.state == OutboxState::Pending => {
                    let messages = self.dispatch(&record).await?;
                    return Ok(ConsumeOutcome::Resumed { messages });
                }
                (Some(_), _) => return Err(ConsumeError::Corrupt { txn_id }),
                // Committed: never this run's messages, the entry's as stored.
                (None, Some(entry)) => {
                    let messages = self.dispatch_entry(&key, &entry).await?;
                    return Ok(if lost_race {
                        ConsumeOutcome::Adopted { messages }
                    } else {
                        ConsumeOutcome::Resumed { messages }
                    });
                }
                (None, None) => {}
            }
            // 2. The handler decides on the entity as just read.
            runs += 1;
            let (item, mut positions) = match entity {
                Some(entity) => (Some(entity.item), entity.applied),
                None => (None, AppliedPositions::new()),
            };
            let mut staging = Staging::new(txn_id, Arc::clone(store)).with_read(key.clone(), item.clone());
            // What a write that finds no item expects: the version a delete left, where
            // the key was read across its lives.
            let mut missing = ExpectedVersion::Absent;
            // No entity: read the key across its lives too (one read more, for a create
            // only), so that a create expects the version a delete left and a late
            // attempt of it can never apply to a later life of the entity; in order, it
            // holds the positions the key keeps.
            if item.is_none() {
                match store.get_keys(std::slice::from_ref(&key)).await {
                    Ok(mut keys) => {
                        let read = keys.remove(&key).unwrap_or_default();
                        // Created since the read above, the handler decides on that read
                        // all the same, and the commit's condition refuses it.
                        if read.item.is_none() {
                            missing = ExpectedVersion::AbsentAt(read.version);
                            positions = read.applied.clone();
                            staging.note_read(key.clone(), read);
                        }
                    }
                    Err(StoreError::Unsupported(_)) => {}
                    Err(error) => return Err(ConsumeError::Read(error)),
                }
            }
            // In order, only once its predecessor in its chain was applied. (A position
            // read stale is only ever behind: a message is never taken for a duplicate
            // wrongly, and every write below is conditioned on the key as read.)
            if let (Some((position, delivery)), Some((name, _))) = (in_order, &applying) {
                let own = match positions.get(name) {
                    Some(held) => Some((held.seq, Some(held.version))),
                    // None in the key: a chain this consumer may have applied in the
                    // transactional mode (its position an item of its own) continues
                    // from there; from its next commit on, the key keeps it.
                    None => in_order::read_position_item(self.name().as_str(), position, store.as_ref())
                        .await
                        .map_err(ConsumeError::Read)?,
                };
                // A chain that names its producer and has no position yet continues the
                // unnamed one where it can: in the key (no read more), else in its item.
                let held = match in_order::reads_legacy(own, position) {
                    true => {
                        let unnamed = position.unnamed();
                        let legacy = match positions.get(&in_order::applied_name(self.name().as_str(), &unnamed)) {
                            Some(held) => Some((held.seq, Some(held.version))),
                            None => in_order::read_position_item(self.name().as_str(), &unnamed, store.as_ref())
                                .await
                                .map_err(ConsumeError::Read)?,
                        };
                        in_order::continued(legacy, position)
                    }
                    false => own,
                };
                let gate = in_order::judge_named(held, own.is_none(), position);
                match self.not_applied(gate, position, delivery, Some(&key)).await {
                    Verdict::Apply => {}
                    Verdict::Again => continue,
                    Verdict::Done(result) => return result,
                }
            }
            self.handler
                .handle(incoming, &mut staging)
                .await
                .map_err(ConsumeError::Handler)?;
            // A change of the entity with messages places them in its history, as the
            // transactional mode and the request path do: the entity's read above carries
            // no chain heads, so the key is read for them (one read more, for a change
            // with messages only). Read at another version than the handler's, the
            // messages are not placed, and the commit, conditioned on that version, fails
            // and runs the handler again.
            if item.is_some() && staging.lacks_heads_of(&key) {
                match store.get_keys(std::slice::from_ref(&key)).await {
                    Ok(mut keys) => staging.note_heads(key.clone(), keys.remove(&key).unwrap_or_default()),
                    Err(StoreError::Unsupported(_)) => {}
                    Err(error) => return Err(ConsumeError::Read(error)),
                }
            }
            staging.check_sendable().map_err(ConsumeError::Unsendable)?;
            if let Err(reason) = staging.check_limits(&self.limits) {
                return Err(ConsumeError::Refused(CommitError::TooLarge { reason }));
            }
            let now = self.ports.clock.now();
            let write = match (entity_write(&staging, &key, item.as_ref())?, &item) {
                (Some(write), _) => write,
                // Nothing to apply and nothing to send, but an earlier attempt of this
                // delivery may still land (the handler decided otherwise this time): the
                // entity is written as read, with an empty entry, so that the attempt,
                // which expected this version or an older one, can no longer apply.
                (None, Some(item)) if unknown_sent => (item.data.clone(), ExpectedVersion::Exactly(item.version)),
                // Nothing to write it over: the attempt cannot be stopped, so the message
                // is not settled now; a later copy finds the attempt's entry, or not.
                (None, None) if unknown_sent => {
                    return Err(ConsumeError::Unsettled(last.unwrap_or_else(|| {
                        CommitError::Ambiguous("an attempt of unknown outcome may still create the entity".into())
                    })))
                }
                // In order, nothing to apply and nothing to send: the position the key
                // keeps moves to the message, alone, then the decision is recorded.
                (None, item) if applying.is_some() => {
                    let (name, applied) = applying.clone().expect("in order");
                    let expected = item
                        .as_ref()
                        .map_or(missing, |item| ExpectedVersion::Exactly(item.version));
                    match store.keep_applied(&key, expected, &name, applied).await {
                        Ok(()) => {
                            store
                                .put_dispatched(txn_id, now, now.plus(self.retention))
                                .await
                                .map_err(ConsumeError::Mark)?;
                            return Ok(ConsumeOutcome::Processed { messages: 0 });
                        }
                        Err(error @ CommitError::VersionConflict { .. }) => {
                            tracing::info!(error = %error, runs, "the entity changed; running the handler again");
                            if runs >= HANDLER_RUNS {
                                return Err(ConsumeError::Conflict { runs, source: error });
                            }
                            continue;
                        }
                        Err(error) => return Err(ConsumeError::Unsettled(error)),
                    }
                }
                // Nothing to apply and nothing to send: only the decision is recorded.
                (None, _) => {
                    store
                        .put_dispatched(txn_id, now, now.plus(self.retention))
                        .await
                        .map_err(ConsumeError::Mark)?;
                    return Ok(ConsumeOutcome::Processed { messages: 0 });
                }
            };
            let (data, expected) = write;
            // 3. One conditional write: the data and the entry, where K is as read and
            // holds no entry of this message.
            let attempt = self.ports.ids.next_txn_id(now);
            let commit = EntityCommit {
                key: key.clone(),
                data,
                expected,
                entry: OutboxRecord::committed(txn_id, staging.messages_to_commit(), now, now.plus(self.retention))
                    .by_attempt(attempt),
                // A consumer is never fenced, and its ids are not ordered.
                checks_fence: false,
                applied: applying.clone(),
            };
            let committed = store
                .commit_entity(&commit)
                .instrument(tracing::info_span!("commit", txn_id = %txn_id))
                .await;
            let error = match committed {
                Ok(()) => {
                    tracing::info!(messages = commit.entry.messages.len(), mode = "entity", "committed");
                    let messages = self.dispatch_entry(&key, &commit.entry).await?;
                    return Ok(ConsumeOutcome::Processed { messages });
                }
                Err(error) => error,
            };
            match error {
                CommitError::Superseded { .. } => {
                    tracing::info!("another copy of the message committed first; adopting its entry");
                    lost_race = true;
                }
                CommitError::VersionConflict { .. } => {
                    tracing::info!(error = %error, runs, "the entity changed; running the handler again");
                    if runs >= HANDLER_RUNS {
                        return Err(ConsumeError::Conflict { runs, source: error });
                    }
                }
                CommitError::Contention(_) | CommitError::Ambiguous(_) | CommitError::Unavailable(_) => {
                    tracing::warn!(error = %error, "commit attempt failed; reading the entity again");
                    if matches!(error, CommitError::Ambiguous(_)) {
                        unknown_sent = true;
                        unknown_expected.push(commit.expected);
                    }
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

    /// Blocks every attempt of message `txn_id` still on its way to `key`: writes the
    /// entity as read with an empty entry (so its version moves on, and an attempt, which
    /// expected this version or an older one, can no longer apply), then removes that
    /// entry.
    async fn block_attempts(&self, key: &ItemKey, txn_id: TxnId, entity: &EntityItem) -> Blocked {
        let store = &self.ports.store;
        let now = self.ports.clock.now();
        let block = EntityCommit {
            key: key.clone(),
            data: entity.item.data.clone(),
            expected: ExpectedVersion::Exactly(entity.item.version),
            entry: OutboxRecord::committed(txn_id, vec![], now, now.plus(self.retention))
                .by_attempt(self.ports.ids.next_txn_id(now)),
            checks_fence: false,
            applied: None,
        };
        match store.commit_entity(&block).await {
            Ok(()) => {
                tracing::info!("blocked an attempt of unknown outcome of a message another copy settled");
                // Left in K if this fails: the next round finds the empty entry beside
                // the dedup record, and removes it.
                match store.remove_entry(key, txn_id).await {
                    Ok(()) => Blocked::Done,
                    Err(error) => Blocked::Failed(CommitError::Unavailable(Box::new(error))),
                }
            }
            Err(CommitError::VersionConflict { .. } | CommitError::Superseded { .. }) => Blocked::Changed,
            Err(error) => Blocked::Failed(error),
        }
    }

    /// Steps 4 to 6: publishes a committed entry's messages, then puts the dedup record
    /// (its TTL from now, C4), then removes the entry; returns how many went out.
    async fn dispatch_entry(&self, key: &ItemKey, entry: &OutboxRecord) -> Result<usize, ConsumeError> {
        let published = self.publish(entry).await?;
        let clock = self.ports.clock.as_ref();
        let now = clock.now();
        let store = &self.ports.store;
        store
            .put_dispatched(entry.txn_id, now, now.plus(self.retention))
            .await
            .map_err(ConsumeError::Mark)?;
        store
            .remove_entry(key, entry.txn_id)
            .await
            .map_err(ConsumeError::RemoveEntry)?;
        Ok(published)
    }
}
