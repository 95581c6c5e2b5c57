//! One conformance suite over the ports, run with the same expectations against the
//! embedded backend and against the AWS adapters on the emulators (DynamoDB Local for
//! DynamoDB, moto for the rest).
//!
//! A test binary instantiates it with [`conformance_suite!`](crate::conformance_suite),
//! naming how to build a [`Backend`].

mod backend;
pub mod cases;
mod chain;
mod consumer_hop;
mod counter;
pub mod differences;
pub mod dynamodb_only;
mod entity;
mod kept;
mod producers;
mod request_entity;

pub use backend::{audit, bus, events, fanout, Backend, Delivered, DeliveredEvent};

/// Declares one `#[tokio::test]` per conformance case, each on a fresh backend built by
/// the given expression.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@cases $backend;
            commit_then_read_everything_back,
            a_commit_after_a_tombstone_is_rejected_with_nothing_written,
            a_tombstone_after_a_commit_is_refused_and_shows_the_record,
            concurrent_commits_of_one_item_exactly_one_wins,
            versions_advance_and_stale_versions_conflict,
            deletes_and_checks_are_conditioned_on_versions,
            an_idempotency_key_commits_once,
            an_idempotency_record_put_alone_keeps_the_first_answer,
            a_retried_commit_finds_its_own_record_and_succeeds,
            a_commit_repeated_under_its_token_after_it_applied_reports_success,
            acknowledged_commits_survive_cancelled_transactions_racing_them,
            an_expired_record_reads_as_absent,
            a_split_outbox_round_trips_and_is_marked_dispatched,
            a_late_mark_puts_the_dispatched_record_back_and_nothing_more,
            beyond_one_transaction_the_commit_is_refused,
            batched_reads_beyond_one_call_return_everything,
            a_delayed_control_message_arrives_after_its_delay,
            an_unacknowledged_control_message_comes_back,
            published_messages_carry_their_ids,
            published_messages_carry_their_trace_context,
            a_redelivered_dispatch_to_a_fifo_destination_is_deduplicated,
            an_unknown_destination_is_refused,
            messages_to_a_topic_arrive_with_their_ids,
            events_on_a_bus_arrive_with_their_ids_and_type,
            a_consumed_messages_record_is_won_by_one_attempt,
            concurrent_copies_of_a_consumed_message_commit_once,
            a_consumer_processes_each_message_once_and_publishes_before_acknowledging,
            an_expired_consumed_record_does_not_block_a_new_attempt,
            an_entity_commit_is_one_write_won_by_one_attempt,
            removing_an_entry_keeps_the_rest_and_never_brings_one_back,
            an_item_of_the_transactional_mode_takes_entries_and_its_deletes_wait_for_them,
            concurrent_entity_commits_of_one_message_apply_once,
            a_consumer_in_entity_mode_processes_each_message_once,
            a_fence_in_the_entity_blocks_a_late_commit_and_finds_a_committed_one,
            a_fence_meeting_a_committed_split_record_finds_it_whole,
            an_entity_commit_of_a_tombstone_entry_is_refused,
            the_request_path_in_entity_mode_commits_into_the_item_and_dispatches_once,
            a_refusal_after_the_reads_sends_nothing_and_writes_nothing,
            counters_under_a_bound_never_conflict_and_keep_their_place,
            a_busy_counter_through_the_request_path_answers_by_its_bound_and_keeps_its_place,
            kept_messages_are_kept_whole_replaced_by_a_later_keep_and_removed_harmlessly,
            sent_marks_prove_their_commits_while_they_are_kept,
            a_late_attempt_never_applies_to_a_later_life_of_its_item,
            messages_carry_their_place_in_their_entitys_history,
            messages_of_no_one_entity_carry_no_position,
            a_publisher_sends_the_entitys_earlier_transactions_first,
            a_publisher_sends_an_earlier_commit_of_either_form_first,
            a_consumer_places_what_it_emits_in_both_modes,
            a_consumer_sends_its_entitys_earlier_transactions_first,
            two_producers_chains_stay_two_at_an_in_order_consumer,
            positions_applied_live_in_the_key_across_its_lives,
            a_run_of_unsent_transactions_longer_than_a_search_drains_oldest_first,
            a_position_kept_again_is_ok_unless_the_engine_leaves_the_old_item_out,
            a_commit_placed_from_another_keys_read_sets_the_heads_it_stamped,
            items_beyond_the_item_limit_are_refused_by_both,
            a_split_record_takes_actions_of_its_own_only_on_dynamodb,
            an_expired_record_blocks_conditions_until_dynamodb_deletes_it,
            expiry_is_kept_in_whole_seconds_on_dynamodb,
            native_actions_run_only_on_dynamodb,
            a_repeated_delete_past_the_token_window_meets_the_new_lifes_entries,
            a_busy_item_is_contention_only_on_dynamodb
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $backend;
                $crate::conformance::cases::$case(&backend).await;
            }
        )*
    };
}
