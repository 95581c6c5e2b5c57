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
    /// before it to finish their step (no longer than the deadline); a step that staged
    /// only additions ([`Transaction::is_counter_commit`]) gives up its turn before its
    /// commit, which cannot conflict. When the commit
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
        let mut turn = match &entity {
            Some(key) => match outbox.entity_turn(key, self.deadline).await {
                Some(turn) => Some(turn),
                // Nothing began: nothing of this request left the process.
                None => return Err(E::from(super::error::timeout_problem(super::Progress::NotBegun).into())),
            },
            None => None,
        };
        let mut backoff = Backoff::new(outbox.conflict_retry_pause());
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
            // Additions alone never conflict, whatever the reads saw: the next request
            // need not wait for this commit (its reads only decide a refusal early,
            // which the write's bounds decide anyway).
            if txn.is_counter_commit() {
                drop(turn.take());
            }
            let (txn_id, key) = match self.commit(txn, answer).await {
                Err(HttpError::Transaction(TxnError::VersionConflict { txn_id, key })) => (txn_id, key),
                result => return result.map_err(E::from),
            };
            let pause = backoff.next_pause();
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

/// The pauses of one request's retries: full jitter, each drawn at random up to a
/// ceiling that starts at the first pause and doubles after each draw, up to
/// [`RETRY_PAUSE_CAP`] (or the first pause, if that is longer).
#[derive(Debug, Clone, Copy)]
struct Backoff {
    /// The longest the next pause may be.
    ceiling: Duration,
    /// The longest any pause may be.
    cap: Duration,
}

impl Backoff {
    /// The pauses after a first one drawn up to `first`.
    fn new(first: Duration) -> Self {
        Self {
            ceiling: first,
            cap: RETRY_PAUSE_CAP.max(first),
        }
    }

    /// The next pause, drawn uniformly from zero to the ceiling (from this thread's
    /// generator, which a simulation seeds): anywhere in it, so that contenders that met
    /// at once come back apart, instead of meeting again after the same pause. The
    /// ceiling then doubles, up to the cap.
    fn next_pause(&mut self) -> Duration {
        let pause = Duration::from_micros(fastrand::u64(0..=self.ceiling.as_micros() as u64));
        self.ceiling = (self.ceiling * 2).min(self.cap);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_millis(10);

    /// The ceilings of the first rounds from a first pause of 10 ms: doubling, then
    /// held at the cap.
    fn ceilings() -> Vec<Duration> {
        [10, 20, 40, 80, 160, 320, 500, 500, 500, 500]
            .map(Duration::from_millis)
            .to_vec()
    }

    /// Each round's pause stays under its ceiling, and over many requests some come
    /// close to it: the ceiling doubles from the first pause and stops at the cap (a
    /// first pause above the cap is the ceiling throughout).
    #[test]
    fn pauses_stay_under_a_ceiling_that_doubles_up_to_the_cap() {
        fastrand::seed(1);
        let ceilings = ceilings();
        let mut longest = vec![Duration::ZERO; ceilings.len()];
        for _ in 0..1_000 {
            let mut backoff = Backoff::new(FIRST);
            for (round, ceiling) in ceilings.iter().enumerate() {
                let pause = backoff.next_pause();
                assert!(pause <= *ceiling, "round {round}: {pause:?} over {ceiling:?}");
                longest[round] = longest[round].max(pause);
            }
        }
        for (round, (longest, ceiling)) in longest.iter().zip(&ceilings).enumerate() {
            assert!(
                *longest >= ceiling.mul_f64(0.95),
                "round {round}: the longest of 1,000 pauses is {longest:?}, its ceiling {ceiling:?}"
            );
        }
        let first = Duration::from_millis(800);
        let mut backoff = Backoff::new(first);
        let pauses: Vec<Duration> = (0..200).map(|_| backoff.next_pause()).collect();
        assert!(pauses.iter().all(|pause| *pause <= first), "{pauses:?}");
        assert!(pauses.iter().any(|pause| *pause >= first.mul_f64(0.95)), "{pauses:?}");
    }

    /// Full jitter: the pauses at a ceiling spread evenly from zero to it (each tenth of
    /// it holds about a tenth of them), never all the ceiling (contenders that met would
    /// meet again) nor all nothing.
    #[test]
    fn pauses_spread_evenly_from_zero_to_the_ceiling() {
        fastrand::seed(2);
        let mut backoff = Backoff::new(FIRST);
        // Past the doubling: every pause is drawn up to the cap.
        for _ in 0..ceilings().iter().filter(|ceiling| **ceiling < RETRY_PAUSE_CAP).count() {
            backoff.next_pause();
        }
        let draws = 10_000;
        let mut tenths = [0usize; 10];
        let mut total = Duration::ZERO;
        let (mut zero, mut ceiling) = (0, 0);
        for _ in 0..draws {
            let pause = backoff.next_pause();
            total += pause;
            zero += usize::from(pause.is_zero());
            ceiling += usize::from(pause == RETRY_PAUSE_CAP);
            let tenth = (pause.as_secs_f64() / RETRY_PAUSE_CAP.as_secs_f64() * 10.0) as usize;
            tenths[tenth.min(9)] += 1;
        }
        let mean = total / draws;
        assert!(
            mean >= RETRY_PAUSE_CAP.mul_f64(0.45) && mean <= RETRY_PAUSE_CAP.mul_f64(0.55),
            "mean pause {mean:?}, not about half of {RETRY_PAUSE_CAP:?}"
        );
        assert!(
            tenths.iter().all(|count| (800..=1_200).contains(count)),
            "pauses per tenth of the ceiling: {tenths:?}"
        );
        assert!(
            zero < 10 && ceiling < 10,
            "{zero} pauses of zero, {ceiling} of the ceiling"
        );
    }
}
