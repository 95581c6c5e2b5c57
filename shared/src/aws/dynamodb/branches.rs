//! The branches that only the DynamoDB adapter has: what it reads back from cancellation
//! reasons and `ALL_OLD`, the parts of split records, conditions on nested maps, its
//! retries. The embedded store decides the same questions under one lock and never takes
//! them, so the simulation cannot reach them; each is counted as it is taken, so that the
//! tests on DynamoDB Local can show that every one of them is reached. The failure
//! branches are the adapter's handling of a request that failed (a 5xx, a throttle, keys
//! or items left unprocessed), which DynamoDB Local never answers by itself and the
//! embedded store's calls never meet.
//!
//! A count is one relaxed atomic increment: nothing a request would notice.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! branches {
    (
        paths { $($name:ident => $text:literal,)* }
        failures { $($failure:ident => $failure_text:literal,)* }
    ) => {
        /// A branch of the DynamoDB adapter that the embedded store has no counterpart of:
        /// a path it takes on an answer of DynamoDB's, or the handling of a request of its
        /// that failed (a failure branch).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Branch {
            $(
                #[doc = $text]
                $name,
            )*
            $(
                #[doc = $failure_text]
                $failure,
            )*
        }

        impl Branch {
            /// Every branch, in the order of this list: the paths, then the failures.
            pub const ALL: &'static [Branch] = &[$(Branch::$name,)* $(Branch::$failure,)*];

            /// The failure branches: a request of the adapter's failed (a 5xx, throttled,
            /// left unprocessed), and what it answers then.
            pub const FAILURES: &'static [Branch] = &[$(Branch::$failure),*];

            /// What the branch does, in a few words.
            pub fn describe(self) -> &'static str {
                match self {
                    $(Branch::$name => $text,)*
                    $(Branch::$failure => $failure_text,)*
                }
            }

            /// Whether it is a failure branch.
            pub fn is_failure(self) -> bool {
                matches!(self, $(Branch::$failure)|*)
            }
        }
    };
}

branches! {
    paths {
        CommitOwnRecordInReasons => "commit: its own record in the cancellation (ALL_OLD): an earlier request committed, success",
        CommitRivalAttemptRecord => "commit: another attempt's record in the cancellation: superseded",
        CommitRecordReadBack => "commit: the record's condition failed and no old item came back: the record is read",
        CommitTombstoneInReasons => "commit: a tombstone in the cancellation: tombstoned",
        CommitDeleteBlockedByEntries => "commit: a delete blocked by the item's entries (old item): contention, tried again",
        CommitDeleteMetNewFence => "commit: a delete at its version whose fence mark changed since the read: contention",
        CommitBusinessConflict => "commit: a business condition failed: version conflict",
        CommitIdempotencyUsed => "commit: the idempotency record exists: replay",
        CommitNativeCancelled => "commit: an application's native action cancelled, its index and code kept",
        CommitContentionReason => "commit: a reason of contention (TransactionConflict, throttling): nothing written",
        CommitMovesSentMarks => "commit: a delete moves the item's sent marks to their records",
        EntityNewMap => "entity commit: the item has no entry map yet: the second form creates it",
        EntityOwnEntry => "entity commit: its own entry in the old item: an earlier request applied, success",
        EntityRivalEntry => "entity commit: another attempt's entry in the old item: superseded",
        EntityFenced => "entity commit: the old item's fence mark is at or above it: fenced",
        EntityOldItemRead => "entity commit: no old item came back: it is read",
        SettleFullItem => "settle: the item is full of sent marks: record put, then the entry removed",
        SettleAlreadyGone => "settle: the entry is gone already: nothing to do",
        FenceFormAgain => "fence: the item changed under it: its form is chosen again from the old item",
        FenceRecordFromReason => "fence: the transaction's record exists: read from the cancellation",
        FenceFoundEntry => "fence: the item holds the transaction's entry: committed",
        FenceFoundSentMark => "fence: the item holds the transaction's sent mark: dispatched",
        FenceOverPlainTombstone => "fence: a tombstone record without the fence: checked, and the mark raised",
        FenceContention => "fence: another transaction on the item (TransactionConflict): contention",
        TombstoneExistsFromReason => "tombstone put: the record exists, read from ALL_OLD",
        SplitRecordReadWhole => "a record behind a failed condition is split (fence, tombstone put): read whole with its parts",
        MarkDeletesParts => "mark dispatched: the parts of a split record deleted after its main item",
        ReadTornRecord => "read: a main item names a part that is gone (a mark in between): read again",
        AppliedHeldAlready => "keep applied: its condition failed and the old item (ALL_OLD) holds the position at or above: another copy applied it, success",
        AppliedKeyChanged => "keep applied: its condition failed and the old item holds the position below it, or none: the key changed, version conflict",
        EntityTooLargeForItem => "entity commit: DynamoDB refuses the update for the item's size (ValidationException): too large, nothing written",
        EntityCreateOverVacant => "entity commit: a create over a vacant key at the version it kept (attribute_not_exists(data) AND version = v): version, chain heads and fence mark continued",
        FenceVacantKey => "fence: the key is vacant or absent: the form without data raises or checks the mark on the key alone",
        BatchUnprocessedRetried => "batched read or write: keys or items left unprocessed are sent again",
        MarkPartsLeftToExpire => "mark dispatched: the parts' deletes failed or were left unprocessed: left to expire, the record marked",
        CounterOwnEntry => "counter commit: its own entry in the old item: an earlier request applied, success with the values now",
        CounterSentMark => "counter commit: its sent mark in the old item: applied and settled, success",
        CounterFenced => "counter commit: the old item's fence mark is at or above it: fenced",
        CounterBoundRefused => "counter commit: a bound or a field that is no number, judged on the old item: refused, nothing written",
        CounterMissing => "counter commit: no live item came back: missing, nothing written",
        CounterOrdinaryForm => "counter commit: the old item has no entry map or no head for a destination yet: one entity commit stamped from it",
        CounterVersionMoved => "counter commit: the item changed under its ordinary form: the counter form again",
        CounterOldItemRead => "counter commit: no old item came back: it is read",
    }
    failures {
        FailRecordBehindRead => "a record behind a failed condition cannot be read (fence, tombstone put): the read's error, no outcome",
        FailTombstonePut => "tombstone put: the put fails (a 5xx, throttled): unavailable, nothing written",
        FailFenceTransact => "fence: TransactWriteItems fails without a cancellation (a 5xx): unavailable, for the next control message",
        FailFenceItemRead => "fence: the item's read after its condition failed (no old item came back) fails: the read's error, nothing decided",
        FailMarkBatchWrite => "mark dispatched: BatchWriteItem fails: every record's mark fails, no part deleted",
        MarkUnprocessedLeft => "mark dispatched: a record's put left unprocessed after the retries: its mark fails, its parts kept",
        BatchGetUnprocessedLeft => "batched read: keys left unprocessed after the retries: unavailable",
        FailTornReread => "read: the re-read of a torn split record fails: that record's read fails alone",
        FailKeepApplied => "keep applied: the UpdateItem fails (a 5xx): ambiguous, the position as it was",
        FailEntityUpdate => "entity commit: the UpdateItem fails (a 5xx): ambiguous, never a conflict",
        FailEntityOldItemRead => "entity commit: the read of the old item (none came back) fails: ambiguous, never a conflict",
        FailSettleUpdate => "settle: the UpdateItem fails (a 5xx): unavailable, the entry kept",
        FailSettleRecordPut => "settle of a full item: the record's put fails: unavailable, the entry kept for the worker",
        FailSettleEntryRemoval => "settle of a full item: the entry's removal after the record's put fails: unavailable, the record dispatched and the entry left for the worker",
        FailCounterUpdate => "counter commit: the UpdateItem fails (a 5xx, a lost reply): ambiguous, never a refusal",
    }
}

static COUNTS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
const _: () = assert!(Branch::ALL.len() <= 64, "one counter per branch");

/// Counts `branch` as taken.
pub(crate) fn reached(branch: Branch) {
    COUNTS[branch as usize].fetch_add(1, Ordering::Relaxed);
}

/// How often `branch` was taken in this process.
pub fn times_reached(branch: Branch) -> u64 {
    COUNTS[branch as usize].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_branch_has_a_counter() {
        assert!(Branch::ALL.len() <= COUNTS.len());
        let before = times_reached(Branch::FenceContention);
        reached(Branch::FenceContention);
        assert_eq!(times_reached(Branch::FenceContention), before + 1);
    }
}
