//! The branches that only the DynamoDB adapter has: what it reads back from cancellation
//! reasons and `ALL_OLD`, the parts of split records, conditions on nested maps, its
//! retries. The embedded store decides the same questions under one lock and never takes
//! them, so the simulation cannot reach them; each is counted as it is taken, so that the
//! tests on DynamoDB Local can show that every one of them is reached.
//!
//! A count is one relaxed atomic increment: nothing a request would notice.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! branches {
    ($($name:ident => $text:literal,)*) => {
        /// A branch of the DynamoDB adapter that the embedded store has no counterpart of.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Branch {
            $(
                #[doc = $text]
                $name,
            )*
        }

        impl Branch {
            /// Every branch, in the order of this list.
            pub const ALL: &'static [Branch] = &[$(Branch::$name),*];

            /// What the branch does, in a few words.
            pub fn describe(self) -> &'static str {
                match self {
                    $(Branch::$name => $text,)*
                }
            }
        }
    };
}

branches! {
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
