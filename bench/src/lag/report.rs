//! What a configuration's run produced, its percentiles, the printed table and the JSON.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::model::Config;
use super::Scenario;

/// What one configuration's run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The configuration.
    pub scenario: Scenario,
    /// Transactions committed (acknowledged to the request path).
    pub committed: usize,
    /// Requests whose transaction failed.
    pub failed: usize,
    /// Each committed transaction's dispatch lag, in milliseconds, in transaction order.
    pub lags_ms: Vec<i64>,
    /// Committed transactions whose message never reached the destination.
    pub unpublished: usize,
    /// Messages published more than once.
    pub duplicates: usize,
    /// Control messages sent: first ones and deferrals.
    pub control_messages: usize,
    /// Checks that found no record yet and sent a later control message.
    pub deferrals: usize,
    /// Control messages handled.
    pub checks: usize,
    /// Transactions the worker published.
    pub worker_dispatches: usize,
    /// Transactions the request path published.
    pub inline_dispatches: usize,
    /// Requests that crashed after their commit.
    pub crashed: usize,
    /// Tombstones written by the worker (none are expected).
    pub tombstones: usize,
    /// Worker invocations (batches).
    pub invocations: usize,
    /// Their handling time summed, in milliseconds (what a Lambda worker is billed for).
    pub handling_ms: u64,
    /// Control messages whose handling failed (none are expected).
    pub control_errors: usize,
    /// Control messages still queued when the run ended (none are expected).
    pub left_in_control_queue: usize,
}

/// Percentiles of the lags, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median.
    pub p50: i64,
    /// 90th percentile.
    pub p90: i64,
    /// 99th percentile.
    pub p99: i64,
    /// The largest.
    pub max: i64,
    /// The mean.
    pub mean: f64,
}

/// The nearest-rank percentile `q` (0 to 1) of `sorted`, which is not empty.
fn percentile(sorted: &[i64], q: f64) -> i64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Outcome {
    /// The worker's mean handling time per invocation, in milliseconds.
    pub fn ms_per_invocation(&self) -> f64 {
        self.handling_ms as f64 / self.invocations.max(1) as f64
    }

    /// The lags' percentiles (all zero when nothing was published).
    pub fn summary(&self) -> Summary {
        let mut sorted = self.lags_ms.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Summary {
                p50: 0,
                p90: 0,
                p99: 0,
                max: 0,
                mean: 0.0,
            };
        }
        Summary {
            p50: percentile(&sorted, 0.50),
            p90: percentile(&sorted, 0.90),
            p99: percentile(&sorted, 0.99),
            max: *sorted.last().expect("not empty"),
            mean: sorted.iter().sum::<i64>() as f64 / sorted.len() as f64,
        }
    }

    /// Control messages sent per committed transaction.
    pub fn control_per_txn(&self) -> f64 {
        self.control_messages as f64 / self.committed.max(1) as f64
    }

    /// Whether the run is clean: everything committed, published once, nothing left.
    pub fn is_clean(&self) -> bool {
        self.failed == 0
            && self.unpublished == 0
            && self.duplicates == 0
            && self.tombstones == 0
            && self.control_errors == 0
            && self.left_in_control_queue == 0
    }

    /// This outcome as JSON (the plot script reads `name` and `lags_ms`).
    pub fn to_json(&self) -> Value {
        let summary = self.summary();
        json!({
            "name": self.scenario.name,
            "first_check_delay_s": self.scenario.first_check_delay.as_secs_f64(),
            "inline": self.scenario.inline,
            "crash_fraction": self.scenario.crash_fraction,
            "transactions": self.committed,
            "failed": self.failed,
            "lags_ms": self.lags_ms,
            "p50": summary.p50,
            "p90": summary.p90,
            "p99": summary.p99,
            "max": summary.max,
            "mean": summary.mean,
            "control_messages": self.control_messages,
            "control_messages_per_txn": self.control_per_txn(),
            "deferrals": self.deferrals,
            "checks": self.checks,
            "worker_invocations": self.invocations,
            "worker_ms_per_invocation": self.ms_per_invocation(),
            "worker_dispatches": self.worker_dispatches,
            "inline_dispatches": self.inline_dispatches,
            "crashed_after_commit": self.crashed,
            "unpublished": self.unpublished,
            "duplicates": self.duplicates,
            "tombstones": self.tombstones,
        })
    }
}

/// `value` without a needless fraction: 1 for 1.0, 0.5 for 0.5.
pub fn trim_float(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The printed report: the settings, then one row per configuration.
pub fn table(config: &Config, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dispatch lag (commit acknowledged -> message on the destination queue), virtual clock, \
         embedded backend"
    );
    let _ = writeln!(
        out,
        "load: {} transactions per configuration, Poisson arrivals at {}/s, seed {}, {} pollers",
        config.transactions,
        trim_float(config.rate),
        config.seed,
        config.workers
    );
    let _ = writeln!(out, "latencies: {}", config.latencies.describe());
    let _ = writeln!(out);
    let name_width = outcomes
        .iter()
        .map(|outcome| outcome.scenario.name.len())
        .chain([13])
        .max()
        .unwrap_or(13);
    let _ = writeln!(
        out,
        "{:<name_width$}  {:>5}  {:>7}  {:>7}  {:>7}  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
        "configuration",
        "txns",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "ctl/txn",
        "deferrals",
        "by worker",
        "ms/batch"
    );
    for outcome in outcomes {
        let summary = outcome.summary();
        let _ = writeln!(
            out,
            "{:<name_width$}  {:>5}  {:>7}  {:>7}  {:>7}  {:>7}  {:>9.2}  {:>9}  {:>9}  {:>9.1}",
            outcome.scenario.name,
            outcome.committed,
            summary.p50,
            summary.p90,
            summary.p99,
            summary.max,
            outcome.control_per_txn(),
            outcome.deferrals,
            outcome.worker_dispatches,
            outcome.ms_per_invocation()
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "ctl/txn: control messages sent (first and deferred) per committed transaction\n\
         deferrals: checks that found no record yet (each sends a later control message)\n\
         by worker: transactions the control worker published; the request path published the rest\n\
         ms/batch: the worker's handling time per invocation (receive to acknowledgement), what Lambda bills"
    );
    for outcome in outcomes.iter().filter(|outcome| !outcome.is_clean()) {
        let _ = writeln!(
            out,
            "WARNING {}: failed {}, unpublished {}, duplicates {}, tombstones {}, control errors {}, left queued {}",
            outcome.scenario.name,
            outcome.failed,
            outcome.unpublished,
            outcome.duplicates,
            outcome.tombstones,
            outcome.control_errors,
            outcome.left_in_control_queue
        );
    }
    out
}

/// The JSON document: the settings and every configuration.
pub fn to_json(config: &Config, outcomes: &[Outcome]) -> Value {
    let latencies = &config.latencies;
    json!({
        "measure": "dispatch lag: destination sent_at - commit acknowledged, virtual ms",
        "transactions": config.transactions,
        "rate_per_s": config.rate,
        "seed": config.seed,
        "workers": config.workers,
        "latencies_ms": {
            "get": latencies.get_ms,
            "put": latencies.put_ms,
            "update": latencies.update_ms,
            "transact": latencies.transact_ms,
            "send": latencies.send_ms,
            "batch": latencies.batch_ms,
            "receive": latencies.receive_ms,
            "reply": latencies.reply_ms,
            "jitter": latencies.jitter,
        },
        "configurations": outcomes.iter().map(Outcome::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 0.5), 50);
        assert_eq!(percentile(&sorted, 0.99), 99);
        assert_eq!(percentile(&[7], 0.9), 7);
        assert_eq!(trim_float(1.0), "1");
        assert_eq!(trim_float(0.5), "0.5");
    }
}
