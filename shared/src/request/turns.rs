//! Publishers of one entity's transactions take turns within a process, so that on a
//! destination that keeps order a later one need not send again what an earlier one of
//! the same process is sending.
//!
//! Order never rests on this: a publisher that finds an earlier transaction of its
//! entity unsent sends it first whatever the turns say ([`crate::earlier`]). Without the
//! turns, under a steady stream of changes to one entity, each publisher after the
//! answer found the earlier ones still in flight and sent every one of them again first,
//! one send after another (a destination that keeps order takes one message of a group
//! per call), which slowed each publish and grew the backlog the next one found. With
//! them, a publisher waits for the earlier one of its entity in this process to finish
//! sending, then leaves out what that one sent: one send of its own. Publishers in other
//! processes (other Lambda environments) know nothing of each other, and send the
//! earlier ones again first, as before.
//!
//! Requests that change one entity take turns the same way, in turns of their own
//! ([`super::Outbox::entity_turn`]): their read-decide-commit steps then follow each other
//! instead of invalidating each other's reads.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use std::time::Duration;

use crate::ports::{Clock, ItemKey};
use crate::protocol::TxnId;

/// How many transactions sent whole by this process are remembered, newest first: a
/// publisher leaves those out of what it sends first. Enough for every transaction an
/// entity's waiting publishers can name, for many entities at once.
const REMEMBERED: usize = 4096;

/// The turns of one process's publishers, per entity, and the transactions they sent.
#[derive(Debug, Default)]
pub(super) struct Turns {
    /// Each entity with a publisher sending or waiting, and its turn.
    slots: Mutex<BTreeMap<ItemKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Transactions whose every message went out from this process, oldest first.
    sent: Mutex<Sent>,
}

#[derive(Debug, Default)]
struct Sent {
    ids: BTreeSet<TxnId>,
    order: VecDeque<TxnId>,
}

/// A turn on an entity (a publisher's, or a request's read-decide-commit step): the
/// next one waits until it is dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    key: ItemKey,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Turns {
    /// Waits for the turn on `key`: until the publishers of `key` that took it before
    /// have dropped theirs, or `wait` ran out first (`None`: publish without a turn,
    /// sending the earlier ones again, as a publisher of another process would). The
    /// turn on an entity nobody holds is taken at once, without a timer.
    pub(super) async fn take(&self, clock: &dyn Clock, key: &ItemKey, wait: Duration) -> Option<Turn<'_>> {
        let slot = {
            let mut slots = locked(&self.slots);
            // A waiter cut off (its caller's deadline) leaves its entity's slot with no
            // holder: dropped here.
            slots.retain(|_, slot| Arc::strong_count(slot) > 1);
            slots.entry(key.clone()).or_default().clone()
        };
        let guard = match slot.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                let deadline = clock.now().plus(wait);
                super::settle::within(clock, Some(deadline), slot.lock_owned()).await?
            }
        };
        Some(Turn {
            turns: self,
            key: key.clone(),
            guard: Some(guard),
        })
    }

    /// Notes that every message of `txn_id` went out from this process.
    pub(super) fn sent(&self, txn_id: TxnId) {
        let mut sent = locked(&self.sent);
        if sent.ids.insert(txn_id) {
            sent.order.push_back(txn_id);
            if sent.order.len() > REMEMBERED {
                if let Some(oldest) = sent.order.pop_front() {
                    sent.ids.remove(&oldest);
                }
            }
        }
    }

    /// Whether this process sent every message of `txn_id`, as far as it remembers.
    pub(super) fn was_sent(&self, txn_id: TxnId) -> bool {
        locked(&self.sent).ids.contains(&txn_id)
    }

    /// How many entities have a publisher sending or waiting.
    #[cfg(test)]
    fn entities(&self) -> usize {
        locked(&self.slots).len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut slots = locked(&self.turns.slots);
        let Some(guard) = self.guard.take() else {
            return;
        };
        let slot = tokio::sync::OwnedMutexGuard::mutex(&guard).clone();
        drop(guard);
        // Nobody else holds or waits for it (the map's, and the clone just taken): gone,
        // so that the map holds only entities being published. A waiter clones the slot
        // under the map's lock, which is held here.
        if Arc::strong_count(&slot) == 2 {
            if let Some(held) = slots.get(&self.key) {
                if Arc::ptr_eq(held, &slot) {
                    slots.remove(&self.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_later_publisher_of_an_entity_waits_for_the_earlier_ones_turn_and_others_do_not() {
        let clock: Arc<dyn Clock> = Arc::new(crate::ports::SystemClock);
        let turns = Arc::new(Turns::default());
        let (order, other): (ItemKey, ItemKey) = ("ORDER#1".parse().unwrap(), "ORDER#2".parse().unwrap());
        let first = turns.take(clock.as_ref(), &order, LONG).await.expect("free");
        // Another entity's publisher goes at once.
        let at_once = tokio::time::timeout(Duration::from_millis(50), turns.take(clock.as_ref(), &other, LONG));
        drop(at_once.await.expect("not held"));
        let waiting = {
            let (turns, clock, order) = (turns.clone(), clock.clone(), order.clone());
            tokio::spawn(async move { turns.take(clock.as_ref(), &order, LONG).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second of the entity waits");
        drop(first);
        let took = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("let go once the first's turn ended")
            .unwrap();
        assert!(took, "it had the turn");
        assert_eq!(turns.entities(), 0, "no entity is kept once its publishers are done");
    }

    #[tokio::test]
    async fn a_wait_for_the_turn_ends_when_its_time_is_up_and_leaves_nothing_behind() {
        let clock: Arc<dyn Clock> = Arc::new(crate::ports::SystemClock);
        let turns = Turns::default();
        let order: ItemKey = "ORDER#1".parse().unwrap();
        let held = turns.take(clock.as_ref(), &order, LONG).await.expect("free");
        let started = std::time::Instant::now();
        let late = turns.take(clock.as_ref(), &order, Duration::from_millis(30)).await;
        assert!(late.is_none(), "no turn within its wait: it publishes without one");
        assert!(started.elapsed() < Duration::from_secs(5));
        // A waiter still waiting when the holder lets go, then cut off by its caller's
        // deadline, leaves its slot behind until the next take, which drops it.
        let mut waiter = Box::pin(turns.take(clock.as_ref(), &order, LONG));
        assert!(tokio::time::timeout(Duration::from_millis(30), &mut waiter)
            .await
            .is_err());
        drop(held);
        assert_eq!(turns.entities(), 1, "kept for its waiter");
        drop(waiter);
        assert_eq!(turns.entities(), 1, "the cut-off waiter's slot");
        let other: ItemKey = "ORDER#2".parse().unwrap();
        drop(turns.take(clock.as_ref(), &other, LONG).await);
        assert_eq!(turns.entities(), 0, "dropped by the next take");
    }

    #[test]
    fn it_remembers_the_newest_transactions_sent() {
        let turns = Turns::default();
        let ids: Vec<TxnId> = (0..REMEMBERED + 1).map(|_| TxnId::new_v7()).collect();
        for id in &ids {
            turns.sent(*id);
        }
        let remembered: Vec<bool> = [ids[0], ids[1], ids[REMEMBERED]]
            .into_iter()
            .map(|id| turns.was_sent(id))
            .collect();
        assert_eq!(remembered, [false, true, true], "the oldest is forgotten");
    }
}
