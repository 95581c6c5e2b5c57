//! Every branch that only the DynamoDB adapter has (`outbox::aws::branches`: what it
//! reads back from cancellation reasons and `ALL_OLD`, the parts of split records,
//! conditions on nested maps, contention) is reached on DynamoDB Local, by a conformance
//! case or a scenario of `conformance::dynamodb_only` (races held open and faults given
//! by the fault proxy). A test binary of its own, one test, the scenarios one after
//! another: what each reaches is counted alone. It prints the table of branches and the
//! scenarios that reached each.

use std::collections::BTreeMap;
use std::future::Future;

use outbox::aws::branches::{times_reached, Branch};
use outbox_tests::conformance::dynamodb_only::{self as only, proxied, without_tokens};
use outbox_tests::conformance::{cases, Backend};

/// What each scenario reached.
#[derive(Default)]
struct Tally(BTreeMap<Branch, Vec<&'static str>>);

impl Tally {
    /// Runs `scenario`, which must reach every branch of `meant`.
    async fn run(&mut self, name: &'static str, meant: &[Branch], scenario: impl Future<Output = ()>) {
        let before: Vec<u64> = Branch::ALL.iter().map(|branch| times_reached(*branch)).collect();
        scenario.await;
        let reached: Vec<Branch> = Branch::ALL
            .iter()
            .zip(&before)
            .filter(|(branch, count)| times_reached(**branch) > **count)
            .map(|(branch, _)| *branch)
            .collect();
        for branch in meant {
            assert!(
                reached.contains(branch),
                "{name} did not reach {branch:?} ({}); it reached {reached:?}",
                branch.describe()
            );
        }
        for branch in reached {
            self.0.entry(branch).or_default().push(name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dynamodb_only_branch_is_reached_on_dynamodb_local() {
    use Branch::*;
    let mut tally = Tally::default();
    macro_rules! case {
        ($case:ident, $($branch:ident),+) => {
            tally
                .run(stringify!($case), &[$($branch),+], cases::$case(&Backend::aws().await))
                .await
        };
    }
    case!(
        a_commit_after_a_tombstone_is_rejected_with_nothing_written,
        CommitTombstoneInReasons
    );
    case!(
        a_tombstone_after_a_commit_is_refused_and_shows_the_record,
        TombstoneExistsFromReason
    );
    case!(versions_advance_and_stale_versions_conflict, CommitBusinessConflict);
    case!(an_idempotency_key_commits_once, CommitIdempotencyUsed);
    case!(a_split_outbox_round_trips_and_is_marked_dispatched, MarkDeletesParts);
    case!(
        a_consumed_messages_record_is_won_by_one_attempt,
        CommitRivalAttemptRecord
    );
    case!(
        an_entity_commit_is_one_write_won_by_one_attempt,
        EntityOwnEntry,
        EntityRivalEntry
    );
    case!(
        an_item_of_the_transactional_mode_takes_entries_and_its_deletes_wait_for_them,
        CommitDeleteBlockedByEntries,
        EntityNewMap
    );
    case!(
        a_fence_in_the_entity_blocks_a_late_commit_and_finds_a_committed_one,
        EntityFenced,
        FenceFormAgain,
        FenceRecordFromReason,
        FenceFoundEntry,
        FenceOverPlainTombstone
    );
    case!(
        a_fence_meeting_a_committed_split_record_finds_it_whole,
        SplitRecordReadWhole
    );
    case!(
        sent_marks_prove_their_commits_while_they_are_kept,
        CommitMovesSentMarks,
        SettleFullItem,
        FenceFoundSentMark
    );
    tally
        .run(
            "a_retried_commit_finds_its_own_record_and_succeeds (no token)",
            &[CommitOwnRecordInReasons],
            cases::a_retried_commit_finds_its_own_record_and_succeeds(&without_tokens().await),
        )
        .await;
    let p = proxied().await;
    p.faults.transact(outbox_tests::fault_proxy::Fault::WithoutOldItems);
    tally
        .run(
            "a_commit_after_a_tombstone_is_rejected_with_nothing_written (no old items)",
            &[CommitRecordReadBack],
            cases::a_commit_after_a_tombstone_is_rejected_with_nothing_written(&p.backend),
        )
        .await;
    macro_rules! scenario {
        ($scenario:ident, $on:expr, $($branch:ident),*) => {
            tally
                .run(stringify!($scenario), &[$($branch),*], only::$scenario($on))
                .await
        };
    }
    scenario!(
        a_delete_that_meets_a_new_fence_mark_is_contention,
        &proxied().await,
        CommitDeleteMetNewFence
    );
    scenario!(
        a_cancelled_native_action_is_reported_with_its_index_and_code,
        &Backend::aws().await,
        CommitNativeCancelled
    );
    scenario!(
        a_commit_in_conflict_is_contention_with_nothing_written,
        &proxied().await,
        CommitContentionReason
    );
    scenario!(
        an_entity_commit_without_its_old_item_reads_the_item,
        &proxied().await,
        EntityOldItemRead
    );
    scenario!(
        a_second_settle_finds_the_entry_gone,
        &Backend::aws().await,
        SettleAlreadyGone
    );
    scenario!(
        a_full_items_settle_whose_record_put_fails_keeps_the_entry,
        &proxied().await,
        SettleFullItem
    );
    scenario!(
        a_fence_in_conflict_is_contention_with_nothing_written,
        &proxied().await,
        FenceContention
    );
    scenario!(
        a_split_record_read_across_its_mark_is_read_again,
        &proxied().await,
        ReadTornRecord
    );
    scenario!(
        orphan_parts_of_an_expired_consumed_record_do_not_block_a_late_copy,
        &proxied().await,
    );

    println!("DynamoDB-only branches and the scenarios that reached them:");
    for branch in Branch::ALL {
        let by = tally.0.get(branch).map(|names| names.join(", ")).unwrap_or_default();
        println!(
            "  {branch:?}: {}\n      by {}",
            branch.describe(),
            if by.is_empty() { "nothing" } else { &by }
        );
    }
    let reached = Branch::ALL.iter().filter(|branch| tally.0.contains_key(branch)).count();
    println!(
        "DynamoDB-only branches reached on DynamoDB Local: {reached} of {}",
        Branch::ALL.len()
    );
    assert_eq!(reached, Branch::ALL.len(), "every DynamoDB-only branch is reached");
}
