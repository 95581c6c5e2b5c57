//! Optimistic retries: a handler's read-decide-stage step run again, in a new
//! transaction, when its commit met a concurrent change of an item it read.
//!
//! Two requests that read an item at the same version and both write it cannot both
//! commit; the later one fails with [`TxnError::VersionConflict`] and nothing of it is
//! written. Where the business rule may still allow the change (a reservation while
//! stock is left), reading again and deciding again is the answer a client expects, not
//! a 409. A counter that only adds under a bound is better written as one native
//! `ADD` with a condition ([`crate::native`]), which never conflicts.
//!
//! Two things keep a busy item's requests answered by the business rule. In one process
//! (a local server, the embedded backend, a Lambda environment on Managed Instances),
//! the requests that change one entity take turns for their whole step
//! ([`crate::request::Outbox`]'s turns per entity): each reads what the one before it
//! committed, so they never invalidate each other's reads. Across processes, which know
//! nothing of each other, a step that met a conflict runs again after a pause drawn at
//! random (full jitter: up to the first pause, then up to twice as long each time, at
//! most [`RETRY_PAUSE_CAP`]), which spreads the contenders, for as long as the request's
//! deadline leaves room, not a fixed count. A request the deadline stops answers a 503
//! naming its last transaction, with nothing written: never a 409 for a change the
//! business rule may still allow.
//!
//! A retry never applies a change twice: [`TxnError::VersionConflict`] is the commit's
//! answer only once the attempt is known not to have landed (after an attempt of unknown
//! outcome, the settling write decides: it finds the transaction's own record, and the
//! commit answers `Ok`, or its tombstone holds, and no attempt of that transaction can
//! ever land). The retry begins a new transaction, with a new id, whose step reads again
//! and decides on what is there now, so its answer is the business rule's on the item as
//! it is.

use std::future::Future;
use std::time::Duration;

use axum::response::Response;

use super::{Answer, Begun, HttpError, Idempotency, RequestScope};
use crate::ports::ItemKey;
use crate::request::{Transaction, TxnError, SETTLE_RESERVE};

/// The longest pause drawn before a retry, however many came before.
pub const RETRY_PAUSE_CAP: Duration = Duration::from_millis(500);

impl RequestScope {
    /// Begins a transaction (in entity mode on `entity`, if given), runs `attempt` on it
    /// to read, decide and stage, and commits what it staged with the answer it gives.
    /// On `entity`, the requests of this process take turns: this one waits for those
    /// before it to finish their step (no longer than the deadline). When the commit
    /// fails on a version conflict (a request of another process changed an item it
    /// read), the whole step runs again in a new transaction, after a pause with jitter
    /// ([`crate::request::Outbox::conflict_retry_pause`], doubling up to
    /// [`RETRY_PAUSE_CAP`]), for as long as the request's deadline leaves room for
    /// another attempt; when it does not, the answer is a 503 naming the transaction,
    /// with nothing written. Any other outcome is the answer. Under an idempotency key, a
    /// repeat of an answered request is answered as before without running `attempt`.
    ///
    /// `attempt` may run several times: it must only read and stage (a refusal it decides
    /// is its error, returned as is).
    pub async fn retry_conflicts<E, F, Fut>(
        &self,
        entity: Option<ItemKey>,
        idempotency: Option<Idempotency>,
        mut attempt: F,
    ) -> Result<Response, E>
    where
        E: From<HttpError>,
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<(Transaction, Answer), E>>,
    {
        let outbox = self.outbox().clone();
        let clock = outbox.clock().clone();
        // Held until the step has committed or given up: the next request of this
        // process on the entity then reads what this one left.
        let _turn = match &entity {
            Some(key) => match outbox.entity_turn(key, self.deadline).await {
                Some(turn) => Some(turn),
                // Nothing began: nothing of this request left the process.
                None => return Err(E::from(super::error::timeout_problem(super::Progress::NotBegun).into())),
            },
            None => None,
        };
        let first_pause = outbox.conflict_retry_pause();
        let mut ceiling = first_pause;
        let mut round = 0u32;
        loop {
            round += 1;
            let started = clock.now();
            let begun = match &entity {
                Some(key) => self.begin_entity(key.clone(), idempotency.clone()).await?,
                None => self.begin(idempotency.clone()).await?,
            };
            let txn = match begun {
                Begun::Replay(first_answer) => return Ok(first_answer),
                Begun::Started(txn) => txn,
            };
            let (txn, answer) = attempt(txn).await?;
            let (txn_id, key) = match self.commit(txn, answer).await {
                Err(HttpError::Transaction(TxnError::VersionConflict { txn_id, key })) => (txn_id, key),
                result => return result.map_err(E::from),
            };
            // Full jitter: anywhere up to the ceiling, so that contenders that met at
            // once come back apart.
            let pause = Duration::from_micros(fastrand::u64(0..=ceiling.as_micros() as u64));
            // Another attempt needs the pause, about as long as this one took, and the
            // reserve its commit keeps for settling.
            let needs = pause + clock.now().since(started) + SETTLE_RESERVE;
            if !self.leaves_room_for(needs) || !self.reopen(txn_id) {
                tracing::info!(%txn_id, %key, round, "version conflict, and the deadline leaves no room to read again");
                // Nothing of it was written, and it can no longer commit.
                return Err(E::from(HttpError::Transaction(TxnError::DeadlineExceeded { txn_id })));
            }
            tracing::debug!(%txn_id, %key, round, ?pause, "version conflict; reading again");
            clock.sleep(pause).await;
            ceiling = (ceiling * 2).min(RETRY_PAUSE_CAP.max(first_pause));
        }
    }

    /// Whether the request's deadline is further than `room` away (no deadline: yes).
    fn leaves_room_for(&self, room: Duration) -> bool {
        self.deadline.is_none_or(|deadline| {
            let now = self.outbox().clock().now();
            deadline.since(now) > room
        })
    }
}
