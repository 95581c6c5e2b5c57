//! The printed report: the settings used, one row per variant, the added latency of
//! inline publishing, and the two calibrations (timer lateness, backend alone).

use std::fmt::{self, Write as _};
use std::time::Duration;

use crate::config::Config;
use crate::latency::{Call, Timer};
use crate::measure::Summary;
use crate::variants::Variant;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The settings.
    pub config: Config,
    /// The runtime's worker threads.
    pub workers: usize,
    /// How late each way of waiting ended a wait of 5 ms.
    pub lateness: [(Timer, Summary); 2],
    /// One per variant, in the order run.
    pub rows: Vec<Row>,
}

/// One variant's numbers.
#[derive(Debug, Clone)]
pub struct Row {
    /// Which.
    pub variant: Variant,
    /// The sum of its calls' nominal latencies.
    pub model: Duration,
    /// Requests one at a time.
    pub sequential: Summary,
    /// Requests `concurrency` at a time.
    pub concurrent: Summary,
    /// Requests per second with `concurrency` in flight.
    pub throughput: f64,
    /// Requests one at a time with every latency zero: the embedded backend alone.
    pub bare: Summary,
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1000.0)
}

impl Report {
    fn row(&self, variant: Variant) -> Option<&Row> {
        self.rows.iter().find(|row| row.variant == variant)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        let c = config.concurrency;
        let mut out = String::new();
        writeln!(
            out,
            "outbox request path, embedded backend, AWS-modelled call latencies"
        )?;
        writeln!(
            out,
            "latencies: {} (jitter: uniform +-{:.0}%, seed {}; timer {})",
            config.latencies,
            config.latencies.jitter * 100.0,
            config.seed,
            config.latencies.timer.name(),
        )?;
        writeln!(
            out,
            "  defaults are round published in-region figures (DynamoDB single-digit ms reads and writes,"
        )?;
        writeln!(
            out,
            "  TransactWriteItems ~2x a write, SQS ~10 ms), not measurements; set them with --latency"
        )?;
        writeln!(
            out,
            "  calls: {}",
            Call::ALL
                .map(|call| format!("{}={}", call.key(), call.aws_name()))
                .join(" ")
        )?;
        writeln!(
            out,
            "requests: {} per variant one at a time (after {} unmeasured), then {} with {} in flight; \
             tokio multi-thread runtime ({} workers), wall clock; no control worker runs",
            config.requests,
            crate::WARM_UP.min(config.requests),
            config.requests,
            c,
            self.workers
        )?;
        writeln!(out)?;

        let calls_width = self
            .rows
            .iter()
            .map(|row| calls(row.variant).len())
            .max()
            .unwrap_or(0)
            .max("calls".len());
        let heading = |name: &str| format!("{name:>8}");
        writeln!(
            out,
            "{:<11} {:<calls_width$} {}{}{}{}{}{}{}",
            "variant",
            "calls",
            heading("model"),
            heading("p50"),
            heading("p90"),
            heading("p99"),
            heading(&format!("p50@{c}")),
            heading(&format!("p99@{c}")),
            format_args!("{:>10}", format!("req/s@{c}")),
        )?;
        for row in &self.rows {
            writeln!(
                out,
                "{:<11} {:<calls_width$} {:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>10.1}",
                row.variant.name(),
                calls(row.variant),
                ms(row.model),
                ms(row.sequential.p50),
                ms(row.sequential.p90),
                ms(row.sequential.p99),
                ms(row.concurrent.p50),
                ms(row.concurrent.p99),
                row.throughput,
            )?;
        }
        writeln!(
            out,
            "(ms; model = sum of the calls' nominal latencies; p50/p90/p99 one at a time; @{c} = {c} in flight)"
        )?;
        writeln!(out)?;

        if let (Some(off), Some(inline)) = (self.row(Variant::OutboxOff), self.row(Variant::OutboxInline)) {
            let added = inline.sequential.p50.as_secs_f64() - off.sequential.p50.as_secs_f64();
            writeln!(
                out,
                "inline over off: p50 {:+.2} ms, ratio {:.2}x (model {:+.2} ms: SendMessageBatch + BatchWriteItem)",
                added * 1000.0,
                inline.sequential.p50.as_secs_f64() / off.sequential.p50.as_secs_f64(),
                (inline.model.as_secs_f64() - off.model.as_secs_f64()) * 1000.0,
            )?;
        }
        if let (Some(dual), Some(off)) = (self.row(Variant::DualWrite), self.row(Variant::OutboxOff)) {
            writeln!(
                out,
                "off over dual-write: p50 {:+.2} ms, ratio {:.2}x",
                (off.sequential.p50.as_secs_f64() - dual.sequential.p50.as_secs_f64()) * 1000.0,
                off.sequential.p50.as_secs_f64() / dual.sequential.p50.as_secs_f64(),
            )?;
        }
        let lateness: Vec<String> = self
            .lateness
            .iter()
            .map(|(timer, late)| format!("{} p50 {} ms, p99 {} ms", timer.name(), ms(late.p50), ms(late.p99)))
            .collect();
        writeln!(
            out,
            "timer: waits of 5 ms end late by {}; every modelled call pays the lateness of the timer used \
             ({}, --timer)",
            lateness.join("; "),
            config.latencies.timer.name(),
        )?;
        let bare: Vec<String> = self
            .rows
            .iter()
            .map(|row| format!("{} {:.1}", row.variant.name(), row.bare.p50.as_secs_f64() * 1e6))
            .collect();
        writeln!(
            out,
            "embedded backend alone (every latency 0, one at a time, p50 in microseconds): {}",
            bare.join(", ")
        )?;
        f.write_str(&out)
    }
}

/// `send+get+transact`: the variant's calls by their `--latency` names.
fn calls(variant: Variant) -> String {
    variant
        .calls()
        .iter()
        .map(|call| call.key())
        .collect::<Vec<_>>()
        .join("+")
}
