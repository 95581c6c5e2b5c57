//! A transaction that adds to counters of its entity ([`Transaction::add`]): committed in
//! one conditional write that reads nothing first ([`crate::counter`]), so two of them
//! never conflict, and whose messages take their place in the entity's history from the
//! write itself.
//!
//! The counter form applies where the entity form would: a transaction begun on the
//! entity ([`super::Outbox::begin_entity`]) whose staging writes nothing else, with no
//! native action and no idempotency record. Anything else (an idempotency key, a write of
//! another item) commits as a read-modify-write in the form it needs: the entity is read,
//! the additions decided on what was read (a refusal then costs the read alone), and the
//! result put at the version read, which a concurrent change makes conflict as any
//! read-modify-write does. A transaction that adds to its entity does not also put or
//! delete it.
//!
//! A counter write is conditioned on no version, only on the absence of its own entry
//! and sent mark: once its entry has settled into its record (an item full of sent
//! marks), a second write of the same transaction would apply again. So the request path
//! sends it at most once past an unknown outcome: after a timeout or a lost reply it does
//! not try again, and the settling write decides, finding the transaction's entry or
//! proof, or raising the item's fence mark to it so that the write still on its way can
//! never land.

use super::{Transaction, TxnError};
use crate::counter::{Add, CounterCommit, CounterCommitted, CounterError};
use crate::ports::{CommitError, CommitRequest, ExpectedVersion};

impl Transaction {
    /// Stages an addition to a whole number of the transaction's entity (it must have
    /// been begun with [`super::Outbox::begin_entity`]), kept within the addition's
    /// bounds: for example [`Add::take`]`("stock", 2)`, two units of stock if two are
    /// left. Additions to one field add up; the bounds of each are checked on the value
    /// it reaches. The commit refuses the whole transaction with [`TxnError::Refused`]
    /// where a bound does not hold, and with [`TxnError::NoSuchItem`] where the entity is
    /// not there. Where nothing but additions and messages are staged, the commit reads
    /// nothing and never meets a version conflict; the messages still carry their place
    /// in the entity's history.
    pub fn add(&mut self, add: Add) {
        self.counters.push(add);
    }

    /// Whether its commit, as staged now, is a counter commit: additions to its entity
    /// and messages, nothing else written, no native action, no idempotency record. Such
    /// a commit reads nothing and never meets a version conflict.
    pub fn is_counter_commit(&self) -> bool {
        self.counter_form_applies()
    }

    /// The additions staged so far.
    pub fn additions(&self) -> &[Add] {
        &self.counters
    }

    /// Whether this transaction's commit is a counter commit: additions on its entity,
    /// nothing else written, no native action, no idempotency record, and the entity form
    /// not barred.
    pub(super) fn counter_form_applies(&self) -> bool {
        !self.counters.is_empty()
            && self.entity.is_some()
            && !self.entity_barred
            && self.idempotency.is_none()
            && self.staging.native.is_empty()
            && self.staging.writes.is_empty()
    }

    /// The counter commit of `sent` (its outbox entry, messages not yet placed).
    pub(super) fn counter_commit(&self, sent: &CommitRequest) -> Option<CounterCommit> {
        let key = self.entity.clone().filter(|_| self.counter_form_applies())?;
        Some(CounterCommit {
            key,
            adds: self.counters.clone(),
            entry: sent.outbox.clone(),
            checks_fence: true,
        })
    }

    /// Before the commit, checks the additions and, where the counter form does not
    /// apply, turns them into a put of the entity at the version read (reading it unless
    /// the handler did), deciding the bounds now: nothing has left the process yet, so
    /// a refusal costs the read alone.
    pub(super) async fn prepare_counters(&mut self) -> Result<(), TxnError> {
        if self.counters.is_empty() {
            return Ok(());
        }
        let txn_id = self.txn_id;
        let invalid = |reason: &str| TxnError::NotCommitted {
            txn_id,
            source: CommitError::Invalid { reason: reason.into() },
        };
        let Some(key) = self.entity.clone() else {
            return Err(invalid("additions need a transaction begun on their entity"));
        };
        if self.staging.writes.contains_key(&key) {
            return Err(invalid(
                "a transaction that adds to its entity does not also put or delete it",
            ));
        }
        self.counters = merged(std::mem::take(&mut self.counters)).map_err(|reason| invalid(&reason))?;
        if self.counter_form_applies() {
            return Ok(());
        }
        let item = self.get(&key).await?.ok_or_else(|| TxnError::NoSuchItem {
            txn_id,
            key: key.clone(),
        })?;
        let mut data = item.data;
        crate::counter::apply_all(&self.counters, &mut data)
            .map_err(|refusal| TxnError::Refused { txn_id, refusal })?;
        self.staging.put(key, data, ExpectedVersion::Exactly(item.version));
        self.counters.clear();
        Ok(())
    }

    /// What a counter commit's outcome means for the commit loop: `Ok` with what it did,
    /// or the error the loop judges as any commit's.
    pub(super) fn counter_outcome(
        &self,
        outcome: Result<CounterCommitted, CounterError>,
    ) -> Result<CounterCommitted, CounterOutcome> {
        let txn_id = self.txn_id;
        outcome.map_err(|error| match error {
            CounterError::Refused(refusal) => CounterOutcome::Answer(TxnError::Refused { txn_id, refusal }),
            CounterError::Missing { key } => CounterOutcome::Answer(TxnError::NoSuchItem { txn_id, key }),
            // The fence mark is at or above the transaction: neither form can apply now.
            CounterError::Commit(CommitError::EntityFenced { .. }) => {
                CounterOutcome::Answer(TxnError::CommitWindowExpired { txn_id })
            }
            CounterError::Commit(error) => CounterOutcome::Commit(error),
        })
    }
}

impl Transaction {
    /// Notes what a counter commit that applied did: its messages as the write placed
    /// them go out, after the entries it found before it; one that found its entry
    /// settled already has nothing left to publish.
    pub(super) fn counter_placed(&mut self, sent: &mut CommitRequest, done: CounterCommitted) {
        if done.messages.is_empty() && !sent.outbox.messages.is_empty() {
            self.counter_settled = true;
        }
        sent.outbox.messages = done.messages;
        self.counter_earlier = done.earlier;
    }
}

/// How a counter commit failed.
pub(super) enum CounterOutcome {
    /// A definite answer: nothing was written.
    Answer(TxnError),
    /// What any commit can meet, judged as such.
    Commit(CommitError),
}

/// The additions with those to one field added up (the tightest bounds kept), so that
/// every store sees at most one per field.
fn merged(adds: Vec<Add>) -> Result<Vec<Add>, String> {
    let mut merged: Vec<Add> = Vec::new();
    for add in adds {
        match merged.iter_mut().find(|kept| kept.field == add.field) {
            None => merged.push(add),
            Some(kept) => {
                kept.delta = kept
                    .delta
                    .checked_add(add.delta)
                    .ok_or_else(|| format!("the additions to {} overflow", add.field))?;
                kept.at_least = tighter(kept.at_least, add.at_least, i64::max);
                kept.at_most = tighter(kept.at_most, add.at_most, i64::min);
            }
        }
    }
    Ok(merged)
}

fn tighter(a: Option<i64>, b: Option<i64>, pick: fn(i64, i64) -> i64) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additions_to_one_field_add_up_under_the_tightest_bounds() {
        let adds = merged(vec![
            Add::take("stock", 2),
            Add::give_up_to("sold", 2, 100),
            Add::take("stock", 3),
            Add {
                field: "stock".into(),
                delta: 0,
                at_least: Some(1),
                at_most: Some(50),
            },
        ])
        .unwrap();
        assert_eq!(
            adds,
            vec![
                Add {
                    field: "stock".into(),
                    delta: -5,
                    at_least: Some(1),
                    at_most: Some(50),
                },
                Add::give_up_to("sold", 2, 100),
            ]
        );
        assert!(merged(vec![Add::take("stock", i64::MAX), Add::take("stock", 2)]).is_err());
    }
}
