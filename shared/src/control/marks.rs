//! When an item's sent marks move out of it (entity mode, docs/PROTOCOL.md section 11).
//!
//! Settling an entry leaves a sent mark in its item: the transaction's proof of commit,
//! in place of a record of its own (one write instead of two). Every write of the item
//! pays for the marks' bytes, so an item keeps at most [`MAX_SENT_MARKS`] of them. Past
//! that, the control worker, which reads the item for each of its control messages,
//! moves all but the [`KEPT_SENT_MARKS`] newest out: a mark past its time is forgotten
//! (its proof was kept for the retention, as a record's is), any other gets its record
//! first.

use std::collections::BTreeMap;

use crate::protocol::TxnId;
use crate::time::Timestamp;

/// The most sent marks an item keeps (about 60 bytes each) before they move out.
pub const MAX_SENT_MARKS: usize = 8;

/// The newest sent marks an item keeps when they move out: the ones whose control
/// messages are still to come.
pub const KEPT_SENT_MARKS: usize = 4;

/// How many sent marks an item keeps: [`MAX_SENT_MARKS`] and [`KEPT_SENT_MARKS`] by
/// default (a simulation lowers them to reach the eviction at every step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentMarkLimits {
    /// The most an item keeps before they move out.
    pub max: usize,
    /// The newest it keeps when they do (at most `max`).
    pub kept: usize,
}

impl Default for SentMarkLimits {
    fn default() -> Self {
        Self {
            max: MAX_SENT_MARKS,
            kept: KEPT_SENT_MARKS,
        }
    }
}

/// The marks to move out of an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// Marks still within their time: each gets its record, expiring when the mark would
    /// have been forgotten.
    pub evict: Vec<(TxnId, Timestamp)>,
    /// Marks past their time: dropped.
    pub forget: Vec<TxnId>,
}

impl SentMarkLimits {
    /// What to move out of an item holding `sent` at `now`, if anything: nothing while
    /// it holds at most `max`; otherwise every mark but the `kept` newest (by transaction
    /// id, which orders transactions by when they began).
    pub fn eviction(&self, sent: &BTreeMap<TxnId, Timestamp>, now: Timestamp) -> Option<Eviction> {
        if sent.len() <= self.max {
            return None;
        }
        let older = sent.len() - self.kept.min(self.max);
        let (forget, evict): (Vec<_>, Vec<_>) = sent
            .iter()
            .take(older)
            .map(|(txn_id, expires_at)| (*txn_id, *expires_at))
            .partition(|(_, expires_at)| *expires_at <= now);
        Some(Eviction {
            evict,
            forget: forget.into_iter().map(|(txn_id, _)| txn_id).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_item_keeps_its_marks_until_it_holds_too_many_then_keeps_the_newest() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let mut sent = BTreeMap::new();
        let mut ids = Vec::new();
        for index in 0..MAX_SENT_MARKS {
            let txn_id = TxnId::new_v7();
            ids.push(txn_id);
            // The two oldest are past their time.
            let expires_at = if index < 2 {
                now.minus(Duration::from_secs(1))
            } else {
                now.plus(Duration::from_secs(60))
            };
            sent.insert(txn_id, expires_at);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            SentMarkLimits::default().eviction(&sent, now),
            None,
            "at most {MAX_SENT_MARKS}: kept"
        );
        let newest = TxnId::new_v7();
        sent.insert(newest, now.plus(Duration::from_secs(60)));
        let moved = SentMarkLimits::default().eviction(&sent, now).expect("one too many");
        assert_eq!(moved.forget, ids[..2].to_vec(), "past their time: dropped");
        let evicted: Vec<TxnId> = moved.evict.iter().map(|(txn_id, _)| *txn_id).collect();
        assert_eq!(evicted, ids[2..MAX_SENT_MARKS + 1 - KEPT_SENT_MARKS].to_vec());
        assert!(moved
            .evict
            .iter()
            .all(|(_, at)| *at == now.plus(Duration::from_secs(60))));
        assert!(!evicted.contains(&newest), "the newest stay");
    }
}
