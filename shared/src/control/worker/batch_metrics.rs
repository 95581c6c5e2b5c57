//! A batch's report as metrics: what was dispatched, tombstoned, deferred, how late
//! dispatch came after the commit, and how many checks transactions needed.

use crate::control::{BatchReport, ControlError, ControlOutcome};
use crate::metrics::{MetricRecord, Unit};
use crate::publish::PublishFailure;
use crate::time::Timestamp;

/// The metrics of one batch, as of `now`.
pub fn for_batch(report: &BatchReport, now: Timestamp) -> MetricRecord {
    let outcomes: Vec<&ControlOutcome> = report
        .items
        .iter()
        .filter_map(|item| item.result.as_ref().ok())
        .collect();
    let dispatched: Vec<(usize, Timestamp)> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            ControlOutcome::Dispatched { messages, committed_at }
            | ControlOutcome::DispatchedBesideTombstone { messages, committed_at } => Some((*messages, *committed_at)),
            _ => None,
        })
        .collect();
    let count = |wanted: fn(&ControlOutcome) -> bool| outcomes.iter().filter(|outcome| wanted(outcome)).count();
    MetricRecord::new("control-worker", now)
        .count("ControlMessages", report.items.len())
        .count("FailedControlMessages", report.failed_message_ids().len())
        .count("DispatchedTransactions", dispatched.len())
        .count(
            "DispatchedMessages",
            dispatched.iter().map(|(messages, _)| messages).sum(),
        )
        .count(
            "Tombstones",
            count(|outcome| matches!(outcome, ControlOutcome::Tombstoned)),
        )
        .count(
            "EntriesBesideTombstones",
            count(|outcome| matches!(outcome, ControlOutcome::DispatchedBesideTombstone { .. })),
        )
        .count(
            "ParkedTransactions",
            report
                .items
                .iter()
                .filter(|item| {
                    matches!(
                        item.result,
                        Err(ControlError::Publish {
                            first: PublishFailure::Refused { .. },
                            ..
                        })
                    )
                })
                .count(),
        )
        .count(
            "Deferrals",
            count(|outcome| matches!(outcome, ControlOutcome::Deferred { .. })),
        )
        .count(
            "FencesOnBusyItems",
            count(|outcome| matches!(outcome, ControlOutcome::FenceOnBusyItem { .. })),
        )
        .add(
            "DispatchLag",
            Unit::Milliseconds,
            dispatched.iter().map(|(_, at)| now.since(*at).as_millis() as f64),
        )
        .add(
            "ControlAttempts",
            Unit::Count,
            report.items.iter().filter_map(|item| item.attempt).map(f64::from),
        )
}
