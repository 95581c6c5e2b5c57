//! Optimistic retries: a handler's read-decide-stage step run again, in a new
//! transaction, when its commit met a concurrent change of an item it read.
//!
//! Two requests that read an item at the same version and both write it cannot both
//! commit; the later one fails with [`TxnError::VersionConflict`] and nothing of it is
//! written. Where the business rule may still allow the change (a reservation while
//! stock is left), reading again and deciding again is the answer a client expects, not
//! a 409. A counter that only adds under a bound is better written as one native
//! `ADD` with a condition ([`crate::native`]), which never conflicts.

use std::future::Future;
use std::time::Duration;

use axum::response::Response;

use super::{Answer, Begun, HttpError, Idempotency, RequestScope};
use crate::ports::ItemKey;
use crate::request::{Transaction, TxnError};

/// Attempts at most (the first and three retries).
pub const ATTEMPTS: u32 = 4;

/// The first retry's pause before jitter; each next one doubles it.
pub const FIRST_PAUSE: Duration = Duration::from_millis(10);

impl RequestScope {
    /// Begins a transaction (in entity mode on `entity`, if given), runs `attempt` on it
    /// to read, decide and stage, and commits what it staged with the answer it gives.
    /// When the commit fails on a version conflict, the whole step runs again in a new
    /// transaction (at most [`ATTEMPTS`] times in all, paused with jitter, and only while
    /// the request's deadline leaves room); any other outcome is the answer. Under an
    /// idempotency key, a repeat of an answered request is answered as before without
    /// running `attempt`.
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
        let mut pause = FIRST_PAUSE;
        for round in 1..=ATTEMPTS {
            let begun = match &entity {
                Some(key) => self.begin_entity(key.clone(), idempotency.clone()).await?,
                None => self.begin(idempotency.clone()).await?,
            };
            let txn = match begun {
                Begun::Replay(first_answer) => return Ok(first_answer),
                Begun::Started(txn) => txn,
            };
            let (txn, answer) = attempt(txn).await?;
            match self.commit(txn, answer).await {
                Err(HttpError::Transaction(TxnError::VersionConflict { txn_id, key }))
                    if round < ATTEMPTS && self.leaves_room_for(pause * 2) && self.reopen(txn_id) =>
                {
                    tracing::debug!(%txn_id, %key, round, "version conflict; reading again");
                    let jitter = Duration::from_micros(fastrand::u64(0..=pause.as_micros() as u64));
                    tokio::time::sleep(pause + jitter).await;
                    pause *= 2;
                }
                result => return result.map_err(E::from),
            }
        }
        unreachable!("the last round returns")
    }

    /// Whether the request's deadline is further than `room` away (no deadline: yes).
    fn leaves_room_for(&self, room: Duration) -> bool {
        self.deadline.is_none_or(|deadline| {
            let now = self.outbox().clock().now();
            deadline.since(now) > room
        })
    }
}
