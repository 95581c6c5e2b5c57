//! Every branch that only the DynamoDB adapter has (`outbox::aws::branches`: what it
//! reads back from cancellation reasons and `ALL_OLD`, the parts of split records,
//! conditions on nested maps, contention, and its handling of requests that fail) is
//! reached on DynamoDB Local, by a conformance case or a scenario of
//! `conformance::dynamodb_only` (races held open and faults given by the fault proxy). A
//! test binary of its own, one test, the scenarios one after another: what each reaches is
//! counted alone. Every scenario runs even when one before it failed; the test then fails
//! naming each. It prints the table of branches and the scenarios that reached each, and
//! how many of the paths and of the failure branches were reached.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use outbox::aws::branches::{times_reached, Branch};
use outbox_tests::conformance::dynamodb_only::{self as only, proxied, proxied_with, without_tokens};
use outbox_tests::conformance::{cases, Backend};

/// What each scenario reached, and the scenarios that failed.
#[derive(Default)]
struct Tally {
    reached: BTreeMap<Branch, Vec<&'static str>>,
    failed: Vec<String>,
}

impl Tally {
    /// Runs `scenario`, which must pass and reach every branch of `meant`.
    async fn run(&mut self, name: &'static str, meant: &[Branch], scenario: impl Future<Output = ()>) {
        let before: Vec<u64> = Branch::ALL.iter().map(|branch| times_reached(*branch)).collect();
        let started = std::time::Instant::now();
        let outcome = AssertUnwindSafe(scenario).catch_unwind().await;
        let reached: Vec<Branch> = Branch::ALL
            .iter()
            .zip(&before)
            .filter(|(branch, count)| times_reached(**branch) > **count)
            .map(|(branch, _)| *branch)
            .collect();
        println!("{name}: {:.1} s", started.elapsed().as_secs_f64());
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_default();
            self.failed.push(format!("{name} failed: {message}"));
        }
        for branch in meant {
            if !reached.contains(branch) {
                self.failed.push(format!(
                    "{name} did not reach {branch:?} ({}); it reached {reached:?}",
                    branch.describe()
                ));
            }
        }
        for branch in reached {
            self.reached.entry(branch).or_default().push(name);
        }
    }
}

/// A proxied backend for the races: its attempts outlast a request held for
/// [`only::HOLD`].
async fn holding() -> only::Proxied {
    proxied_with(std::time::Duration::from_secs(60)).await
}

/// The scenarios' futures add up to more than a test thread's stack holds: the census
/// runs on a thread of its own with room for them, its future on the heap.
#[test]
fn every_dynamodb_only_branch_is_reached_on_dynamodb_local() {
    const STACK: usize = 256 << 20;
    std::thread::Builder::new()
        .name("census".into())
        .stack_size(STACK)
        .spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(STACK)
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(Box::pin(census()))
        })
        .expect("the census's thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

async fn census() {
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
    case!(
        counters_under_a_bound_never_conflict_and_keep_their_place,
        CounterOwnEntry,
        CounterFenced,
        CounterBoundRefused,
        CounterMissing,
        CounterOrdinaryForm
    );
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
        FenceOverPlainTombstone,
        FenceVacantKey
    );
    case!(
        a_fence_meeting_a_committed_split_record_finds_it_whole,
        SplitRecordReadWhole
    );
    case!(
        positions_applied_live_in_the_key_across_its_lives,
        AppliedHeldAlready,
        AppliedKeyChanged
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
        SettleFullItem,
        FailSettleRecordPut
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
        MarkPartsLeftToExpire
    );
    scenario!(
        an_item_full_of_entries_is_too_large_for_the_next_and_the_commit_goes_transactional,
        &proxied().await,
        EntityTooLargeForItem
    );
    // The races, held open on the wire.
    scenario!(
        a_fence_meeting_a_split_commit_in_flight_publishes_all_of_it_or_nothing,
        &holding().await,
        FenceRecordFromReason,
        SplitRecordReadWhole,
        MarkDeletesParts,
        CommitTombstoneInReasons
    );
    scenario!(
        a_settle_held_across_a_delete_writes_nothing_to_the_vacant_key_or_its_new_life,
        &holding().await,
        SettleAlreadyGone,
        CommitMovesSentMarks,
        EntityCreateOverVacant
    );
    scenario!(
        a_mark_held_across_a_delete_and_a_create_leaves_the_new_life_as_it_was,
        &holding().await,
        EntityCreateOverVacant
    );
    scenario!(
        a_counter_whose_ordinary_write_meets_a_moved_version_starts_again,
        &holding().await,
        CounterOrdinaryForm,
        CounterVersionMoved
    );
    // Requests that fail.
    scenario!(
        a_tombstone_put_that_fails_writes_nothing_and_decides_nothing,
        &proxied().await,
        FailTombstonePut,
        FailRecordBehindRead
    );
    scenario!(
        a_fence_whose_requests_fail_decides_nothing,
        &proxied().await,
        FailFenceTransact,
        FailFenceItemRead,
        FenceOverPlainTombstone,
        FenceFoundEntry
    );
    scenario!(
        a_mark_that_fails_leaves_the_record_pending_and_whole,
        &proxied().await,
        FailMarkBatchWrite,
        MarkUnprocessedLeft,
        BatchUnprocessedRetried,
        MarkDeletesParts
    );
    scenario!(
        reads_left_unprocessed_or_failing_are_errors_never_absences,
        &proxied().await,
        BatchGetUnprocessedLeft,
        BatchUnprocessedRetried,
        ReadTornRecord,
        FailTornReread
    );
    scenario!(
        a_position_kept_alone_whose_write_fails_is_ambiguous,
        &proxied().await,
        FailKeepApplied
    );
    scenario!(
        entity_commits_whose_requests_fail_are_ambiguous,
        &proxied().await,
        FailEntityUpdate,
        EntityOwnEntry,
        EntityOldItemRead,
        FailEntityOldItemRead
    );
    scenario!(
        counter_commits_whose_requests_fail_are_ambiguous,
        &proxied().await,
        FailCounterUpdate,
        CounterOwnEntry,
        CounterSentMark,
        CounterOldItemRead
    );
    scenario!(
        settles_whose_requests_fail_keep_the_entry_for_the_worker,
        &proxied().await,
        FailSettleUpdate,
        SettleFullItem,
        FailSettleEntryRemoval
    );

    println!("DynamoDB-only branches and the scenarios that reached them:");
    for branch in Branch::ALL {
        let by = tally
            .reached
            .get(branch)
            .map(|names| names.join(", "))
            .unwrap_or_default();
        println!(
            "  {branch:?}{}: {}\n      by {}",
            if branch.is_failure() { " (failure)" } else { "" },
            branch.describe(),
            if by.is_empty() { "nothing" } else { &by }
        );
    }
    let reached_of = |branches: Vec<Branch>| {
        let reached = branches
            .iter()
            .filter(|branch| tally.reached.contains_key(branch))
            .count();
        (reached, branches.len())
    };
    let (reached, all) = reached_of(Branch::ALL.to_vec());
    let (paths, all_paths) = reached_of(
        Branch::ALL
            .iter()
            .copied()
            .filter(|branch| !branch.is_failure())
            .collect(),
    );
    let (failures, all_failures) = reached_of(Branch::FAILURES.to_vec());
    println!("DynamoDB-only branches reached on DynamoDB Local: {reached} of {all}");
    println!("  paths on DynamoDB's answers: {paths} of {all_paths}");
    println!("  failure branches (a request that failed, handled): {failures} of {all_failures}");
    assert!(
        tally.failed.is_empty(),
        "{} of the scenarios failed:\n{}",
        tally.failed.len(),
        tally.failed.join("\n")
    );
    assert_eq!(reached, all, "every DynamoDB-only branch is reached");
}
