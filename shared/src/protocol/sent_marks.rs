//! How many sent marks an item keeps (entity mode, docs/PROTOCOL.md section 11).
//!
//! Settling an entry leaves a sent mark in its item: the transaction's proof of commit,
//! in place of a record of its own (one write instead of two). Every write of the item
//! pays for the marks' bytes (about 50 each), so an item holds at most
//! [`MAX_SENT_MARKS`]: an entry settled in an item that holds that many moves its proof to
//! its record instead (the two writes of before). A mark is kept for the retention, as a
//! record is; the control worker, which reads the item for each of its control messages,
//! drops the marks past their time (with [`FORGET_MARGIN`] more) from an item that is
//! full, to make room.

use std::collections::BTreeMap;
use std::time::Duration;

use super::TxnId;
use crate::time::Timestamp;

/// The most sent marks an item holds. Four keep a small item (an order of about 200 bytes
/// with an entry of one message, about 500) under the 1 KB of one write unit.
pub const MAX_SENT_MARKS: usize = 4;

/// How long after its time a mark is still kept: the clocks of the host that stamped it,
/// of the worker that drops it and of the worker that calls a late control message stale
/// may be that far apart without a proof dropped while a control message of its
/// transaction is still handled as current.
pub const FORGET_MARGIN: Duration = Duration::from_secs(3600);

/// The marks of an item holding `sent` that may be dropped at `now`, if it holds `max` or
/// more (it is full) and some are past their time by [`FORGET_MARGIN`]; `None` otherwise
/// (nothing to write).
pub fn past_their_time(sent: &BTreeMap<TxnId, Timestamp>, now: Timestamp, max: usize) -> Option<Vec<TxnId>> {
    if sent.len() < max {
        return None;
    }
    let past: Vec<TxnId> = sent
        .iter()
        .filter(|(_, until)| until.plus(FORGET_MARGIN) <= now)
        .map(|(txn_id, _)| *txn_id)
        .collect();
    (!past.is_empty()).then_some(past)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_past_their_time_are_dropped_only_from_a_full_item() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let past = TxnId::new_v7();
        let mut sent = BTreeMap::from([(past, now.minus(FORGET_MARGIN + Duration::from_secs(1)))]);
        assert_eq!(past_their_time(&sent, now, MAX_SENT_MARKS), None, "room left: kept");
        while sent.len() < MAX_SENT_MARKS {
            sent.insert(TxnId::new_v7(), now.plus(Duration::from_secs(60)));
        }
        assert_eq!(past_their_time(&sent, now, MAX_SENT_MARKS), Some(vec![past]));
        sent.insert(past, now.minus(FORGET_MARGIN));
        assert_eq!(
            past_their_time(&sent, now, MAX_SENT_MARKS),
            Some(vec![past]),
            "at its time"
        );
        sent.insert(past, now.minus(Duration::from_secs(1)));
        assert_eq!(
            past_their_time(&sent, now, MAX_SENT_MARKS),
            None,
            "past its time, within the margin: kept"
        );
    }
}
