//! Settling a transaction in the request path: its tombstone, written by a deadline, and
//! what the write found (docs/PROTOCOL.md section 3, "Settling in the request path").

use std::time::Duration;

use super::live::Abandoned;
use super::Outbox;
use crate::ports::{Clock, FenceOutcome, ItemKey, TombstoneOutcome};
use crate::protocol::{OutboxRecord, OutboxState, TxnId};
use crate::time::Timestamp;

/// Time kept before a request's deadline for settling a commit of unknown outcome with a
/// tombstone (a conditional put, tried again if it fails): commit attempts stop this long
/// before the deadline. Also the most a settling write may add to an answer that is
/// already definite (a refusal, an abandoned transaction).
pub const SETTLE_RESERVE: Duration = Duration::from_millis(200);
/// Wait before the first commit retry (doubled for the next), and between settling
/// writes (times the attempt).
pub(super) const COMMIT_RETRY_DELAY: Duration = Duration::from_millis(25);
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
pub(super) async fn within<T>(
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

/// What the request path's tombstone write for a transaction found (docs/PROTOCOL.md section 3,
/// "Settling in the request path").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Nothing of the transaction had been sent (no control message, no commit) and now
    /// nothing ever will be: it never committed and never can, and nothing needed writing.
    NothingSent,
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
        matches!(self, Self::NothingSent | Self::Tombstoned | Self::AlreadyTombstoned)
    }

    /// A short name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NothingSent => "nothing_sent",
            Self::Tombstoned => "tombstoned",
            Self::AlreadyTombstoned => "already_tombstoned",
            Self::Committed(_) => "committed",
            Self::LeftToWorker => "left_to_worker",
        }
    }
}

impl Outbox {
    /// Abandons transaction `txn_id`, begun on this request path (or a clone of it). If
    /// neither its control message nor its commit was sent, nothing is: from now on both
    /// are refused, and nothing of it ever leaves the process ([`Settlement::NothingSent`],
    /// nothing written). Otherwise it writes its tombstone (the same conditional put the
    /// control worker writes, `attribute_not_exists`), by `deadline` if there is one, so
    /// that its control message finds it settled at the first check instead of deferring
    /// until the window ends. Never fails itself: what it cannot write, the control
    /// message settles.
    ///
    /// A commit of it tried later fails ([`super::TxnError::Abandoned`], nothing written),
    /// wherever the transaction went (a task spawned past the answer, a channel). A commit
    /// under way (or cut off midway) is fenced: one in flight then fails, in entity mode
    /// too, where the fence goes into the item the transaction was begun on. A transaction
    /// whose commit has ended, or that this request path does not know (begun by another
    /// process), is left to its control message ([`Settlement::LeftToWorker`], nothing
    /// written): its commit settled it, and a tombstone record alone would not stop a
    /// commit into an item in entity mode (name the item with [`Self::abandon_in`] to
    /// fence it there).
    ///
    /// [`super::Transaction::abandon`] does this for a transaction in hand; the HTTP glue does
    /// it for a request whose handler began a transaction and answered without
    /// committing it.
    pub async fn abandon(&self, txn_id: TxnId, deadline: Option<Timestamp>) -> Settlement {
        self.abandon_in(txn_id, None, deadline).await
    }

    /// [`Self::abandon`] for a transaction begun in entity mode into `entity`
    /// ([`Outbox::begin_entity`]): where a commit of it may be under way or done (its
    /// commit began, or it is not a live transaction of this request path, so nobody can
    /// tell), the settling write is the fence in the entity with the record's tombstone,
    /// in one atomic write (`Store::fence_entity`), so that neither form of its commit can
    /// apply any more; it finds the transaction's entry where it committed into the
    /// entity. `None` is [`Self::abandon`].
    ///
    /// `entity` must be the item the transaction was begun on (its control message names
    /// the same one). For a transaction this request path still holds it is taken from
    /// there and `entity` is only a fallback; for one it does not hold (another process's,
    /// or one whose commit ended) nothing here can check it. The fence finds T's commit
    /// only in the item it names: named wrongly for a T that committed into another item,
    /// it writes T's tombstone beside that commit (the control worker then publishes the
    /// commit, but T's status reads `tombstoned`). When in doubt, pass `None`: the control
    /// message settles T in the right item.
    pub async fn abandon_in(&self, txn_id: TxnId, entity: Option<&ItemKey>, deadline: Option<Timestamp>) -> Settlement {
        let fence_in = match self.live.abandon(txn_id) {
            // Its control message and its commit are now refused: nothing of it exists
            // outside the process, nor ever will.
            Abandoned::Unsent => {
                tracing::info!(%txn_id, "abandoned before anything of it was sent: nothing to settle");
                return Settlement::NothingSent;
            }
            // Its commit is now refused: nothing of it can land.
            Abandoned::BeforeCommit => None,
            Abandoned::WhileCommitting(begun_in) => begun_in.or_else(|| entity.cloned()),
            Abandoned::Unknown => match entity {
                Some(entity) => Some(entity.clone()),
                // Its commit ended (and settled it), or it is another process's: a
                // tombstone record here could stand beside its commit into an item.
                None => {
                    tracing::info!(%txn_id, "not a live transaction of this request path: left to its control message");
                    return Settlement::LeftToWorker;
                }
            },
        };
        self.settle(txn_id, fence_in.as_ref(), deadline).await.0
    }

    /// Marks transaction `txn_id` abandoned, so that a commit of it that has not begun is
    /// refused, and tells what its commit had done (the HTTP glue decides on it under its
    /// own lock, which the commit hook takes too).
    #[cfg(feature = "axum")]
    pub(crate) fn claim_abandoned(&self, txn_id: TxnId) -> Abandoned {
        self.live.abandon(txn_id)
    }

    /// Marks `txn_id`'s commit as begun without telling its hooks, as the commit does an
    /// instant before it tells them: for a test of what an abandon meets in between.
    #[cfg(all(test, feature = "axum"))]
    pub(crate) fn start_commit_unhooked(&self, txn_id: TxnId) -> bool {
        self.live.start_commit(txn_id)
    }

    /// [`Self::abandon_in`]'s write, once decided: T's tombstone record, or the fence in
    /// `entity` too.
    #[cfg(feature = "axum")]
    pub(crate) async fn settle_abandoned(
        &self,
        txn_id: TxnId,
        entity: Option<&ItemKey>,
        deadline: Timestamp,
    ) -> Settlement {
        self.settle(txn_id, entity, Some(deadline)).await.0
    }

    /// The settling write: T's tombstone record, or with `entity` the fence there too;
    /// `true` with it where it found T committed into the entity (its entry).
    pub(super) async fn settle(
        &self,
        txn_id: TxnId,
        entity: Option<&ItemKey>,
        deadline: Option<Timestamp>,
    ) -> (Settlement, bool) {
        let clock = self.ports.clock.as_ref();
        let mut settlement = Settlement::LeftToWorker;
        let mut in_entity = false;
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
            let written = match entity {
                Some(key) => {
                    let fence = self.ports.store.fence_entity(key, txn_id, now, expires_at);
                    within(clock, deadline, fence).await.map(|outcome| {
                        outcome.map(|outcome| match outcome {
                            FenceOutcome::Fenced => Settlement::Tombstoned,
                            FenceOutcome::Recorded(record) if record.state == OutboxState::Tombstone => {
                                Settlement::AlreadyTombstoned
                            }
                            FenceOutcome::Recorded(found) => Settlement::Committed(found),
                            // Committed into the entity and sent: nothing is left to do.
                            FenceOutcome::Dispatched => {
                                Settlement::Committed(OutboxRecord::committed(txn_id, Vec::new(), now, expires_at))
                            }
                            FenceOutcome::Committed(entry) => {
                                in_entity = true;
                                Settlement::Committed(entry)
                            }
                        })
                    })
                }
                None => {
                    let write = self.ports.store.put_tombstone(txn_id, now, expires_at);
                    within(clock, deadline, write).await.map(|outcome| {
                        outcome.map(|outcome| match outcome {
                            TombstoneOutcome::Written => Settlement::Tombstoned,
                            TombstoneOutcome::Exists(record) if record.state == OutboxState::Tombstone => {
                                Settlement::AlreadyTombstoned
                            }
                            TombstoneOutcome::Exists(record) => Settlement::Committed(record),
                        })
                    })
                }
            };
            match written {
                Some(Ok(found)) => settlement = found,
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
        crate::metrics::MetricRecord::new(self.service.to_string(), clock.now())
            .count("RequestTombstones", usize::from(settlement == Settlement::Tombstoned))
            .count(
                "RequestSettleFailures",
                usize::from(settlement == Settlement::LeftToWorker),
            )
            .emit();
        (settlement, in_entity)
    }
}
