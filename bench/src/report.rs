//! The printed report: the settings used, one row per variant with its p50 over the
//! baselines' (a) and (b), the goal (d)/(b) <= 1.5 and where the gap between (d) and (b)
//! comes from, entity mode's goal (f)/(b) <= 1.0 and what inline publishing adds to it,
//! a create in entity mode publishing after the answer against the goal (j)/(b) <= 1.0 and
//! against the same create in the transactional form (k), the store calls each variant
//! made (counted), the two calibrations (timer lateness, backend alone); and the same
//! figures with every sample as JSON, for the plots.

use std::fmt::{self, Write as _};
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::Config;
use crate::latency::{format_duration, Call, Latencies, Timer};
use crate::measure::Summary;
use crate::ports::StoreCalls;
use crate::variants::Variant;

/// The goal: the outbox as built, (d), at most this many times the naive dual
/// write's p50, (b), with the default latencies.
pub const GOAL_D_OVER_B: f64 = 1.5;

/// Issue 21's goal: the outbox in entity mode, (f), at most (b)'s p50, with the default
/// latencies.
pub const GOAL_F_OVER_B: f64 = 1.0;

/// A create in entity mode publishing after the answer, (j), at most this many times (b)'s
/// p50, with the default latencies.
pub const GOAL_J_OVER_B: f64 = 1.0;

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
    /// Its calls' nominal latencies, added up stage by stage (the slowest of overlapped
    /// calls).
    pub model: Duration,
    /// Requests one at a time.
    pub sequential: Summary,
    /// Each request's latency, one at a time, in the order made.
    pub samples: Vec<Duration>,
    /// Requests `concurrency` at a time.
    pub concurrent: Summary,
    /// Each request's latency, `concurrency` at a time, in completion order per task.
    pub concurrent_samples: Vec<Duration>,
    /// Requests per second with `concurrency` in flight.
    pub throughput: f64,
    /// Requests one at a time with every latency zero: the embedded backend alone.
    pub bare: Summary,
    /// The store calls the measured rig forwarded, by operation (checked against the
    /// variant's claim before the row is made).
    pub store_calls: StoreCalls,
    /// The requests the measured rig made (warm-up, one at a time, in flight).
    pub requests: usize,
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", millis(duration))
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Milliseconds to the microsecond, for the JSON.
fn json_ms(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1000.0
}

/// `a / b` of two durations, to the nanosecond; `None` if `b` is zero.
fn ratio(a: Duration, b: Duration) -> Option<f64> {
    (!b.is_zero()).then(|| a.as_nanos() as f64 / b.as_nanos() as f64)
}

fn show_ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
}

/// The (d)/(b) goal, measured and in the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Goal {
    /// (d)'s p50 over (b)'s, one at a time.
    pub measured: f64,
    /// (d)'s model over (b)'s.
    pub model: f64,
}

impl Goal {
    /// Whether the measured ratio is within [`GOAL_D_OVER_B`] (to rounding).
    pub fn met(&self) -> bool {
        self.measured <= GOAL_D_OVER_B + 1e-9
    }
}

/// Where the model's gap between (d) and (b) comes from, term by term, for `latencies`:
/// (d) = max(send, get) + transact; (b) = get + put + send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    /// TransactWriteItems instead of PutItem: transact - put, in ms (signed).
    pub transact_over_put: f64,
    /// The control send overlapped with the read: what it takes beyond the read,
    /// max(send, get) - get, in ms.
    pub control_send_beyond_read: f64,
    /// The event's SendMessage, which (b) makes in the request and (d) leaves to the
    /// control worker, in ms: subtracted.
    pub event_send: f64,
    /// The TransactWriteItems latency at which the model's (d)/(b) is exactly
    /// [`GOAL_D_OVER_B`]: 1.5 (get + put + send) - max(send, get). `None` if even a free
    /// transaction would not do.
    pub transact_break_even: Option<Duration>,
}

impl Gap {
    /// The terms for `latencies`.
    pub fn of(latencies: &Latencies) -> Self {
        let n = |call| latencies.nominal(call);
        let overlapped = n(Call::Send).max(n(Call::Get));
        let dual = latencies.staged_model(Variant::DualWrite.stages());
        let budget = dual.mul_f64(GOAL_D_OVER_B);
        Self {
            transact_over_put: millis(n(Call::Transact)) - millis(n(Call::Put)),
            control_send_beyond_read: millis(overlapped) - millis(n(Call::Get)),
            event_send: millis(n(Call::Send)),
            transact_break_even: budget.checked_sub(overlapped),
        }
    }

    /// (d) - (b) in the model, in ms (signed).
    pub fn total_ms(&self, latencies: &Latencies) -> f64 {
        millis(latencies.staged_model(Variant::Outbox.stages()))
            - millis(latencies.staged_model(Variant::DualWrite.stages()))
    }
}

impl Report {
    fn row(&self, variant: Variant) -> Option<&Row> {
        self.rows.iter().find(|row| row.variant == variant)
    }

    /// `row`'s p50 over `base`'s, one at a time; `None` if `base` did not run.
    pub fn p50_ratio(&self, row: &Row, base: Variant) -> Option<f64> {
        ratio(row.sequential.p50, self.row(base)?.sequential.p50)
    }

    /// (f)/(b), if both ran.
    pub fn entity_goal(&self) -> Option<Goal> {
        let (f, b) = (self.row(Variant::OutboxEntity)?, self.row(Variant::DualWrite)?);
        Some(Goal {
            measured: ratio(f.sequential.p50, b.sequential.p50)?,
            model: ratio(f.model, b.model)?,
        })
    }

    /// (j)/(b), if both ran.
    pub fn create_goal(&self) -> Option<Goal> {
        let (j, b) = (self.row(Variant::CreateEntityAfter)?, self.row(Variant::DualWrite)?);
        Some(Goal {
            measured: ratio(j.sequential.p50, b.sequential.p50)?,
            model: ratio(j.model, b.model)?,
        })
    }

    /// (d)/(b), if both ran.
    pub fn goal(&self) -> Option<Goal> {
        let (d, b) = (self.row(Variant::Outbox)?, self.row(Variant::DualWrite)?);
        Some(Goal {
            measured: ratio(d.sequential.p50, b.sequential.p50)?,
            model: ratio(d.model, b.model)?,
        })
    }

    /// The settings, each variant's samples (ms) and summary, the ratios and the goal.
    pub fn to_json(&self) -> Value {
        let config = &self.config;
        let latencies: serde_json::Map<String, Value> = Call::ALL
            .iter()
            .map(|call| {
                (
                    call.key().to_owned(),
                    json!({ "aws": call.aws_name(), "ms": json_ms(config.latencies.nominal(*call)) }),
                )
            })
            .collect();
        let variants: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                json!({
                    "name": row.variant.name(),
                    "letter": row.variant.letter().to_string(),
                    "label": row.variant.label(),
                    "calls": calls(row.variant),
                    "store_calls_per_request": row
                        .store_calls
                        .iter()
                        .map(|(op, count)| (op.name().to_owned(), json!(*count as f64 / row.requests as f64)))
                        .collect::<serde_json::Map<String, Value>>(),
                    "model_ms": json_ms(row.model),
                    "summary": {
                        "count": row.sequential.count,
                        "p50_ms": json_ms(row.sequential.p50),
                        "p90_ms": json_ms(row.sequential.p90),
                        "p99_ms": json_ms(row.sequential.p99),
                        "concurrent_p50_ms": json_ms(row.concurrent.p50),
                        "concurrent_p99_ms": json_ms(row.concurrent.p99),
                        "throughput_per_s": row.throughput,
                        "bare_p50_us": row.bare.p50.as_secs_f64() * 1e6,
                        "p50_over_a": self.p50_ratio(row, Variant::PlainPut),
                        "p50_over_b": self.p50_ratio(row, Variant::DualWrite),
                    },
                    "samples_ms": row.samples.iter().copied().map(json_ms).collect::<Vec<_>>(),
                    "concurrent_samples_ms": row.concurrent_samples.iter().copied().map(json_ms).collect::<Vec<_>>(),
                })
            })
            .collect();
        let goal = self.goal().map(|goal| {
            json!({
                "ratio": "(d)/(b) p50",
                "measured": goal.measured,
                "model": goal.model,
                "limit": GOAL_D_OVER_B,
                "met": goal.met(),
            })
        });
        let entity_goal = self.entity_goal().map(|goal| {
            json!({
                "ratio": "(f)/(b) p50",
                "measured": goal.measured,
                "model": goal.model,
                "limit": GOAL_F_OVER_B,
                "met": goal.measured <= GOAL_F_OVER_B + 1e-9,
            })
        });
        let create_goal = self.create_goal().map(|goal| {
            json!({
                "ratio": "(j)/(b) p50",
                "measured": goal.measured,
                "model": goal.model,
                "limit": GOAL_J_OVER_B,
                "met": goal.measured <= GOAL_J_OVER_B + 1e-9,
            })
        });
        json!({
            "benchmark": "request-path",
            "backend": "embedded, AWS-modelled call latencies",
            "config": {
                "requests": config.requests,
                "concurrency": config.concurrency,
                "latencies": latencies,
                "jitter": config.latencies.jitter,
                "seed": config.seed,
                "timer": config.latencies.timer.name(),
                "workers": self.workers,
            },
            "variants": variants,
            "goal": goal,
            "entity_goal": entity_goal,
            "create_goal": create_goal,
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        let latencies = &config.latencies;
        let c = config.concurrency;
        let mut out = String::new();
        writeln!(
            out,
            "outbox request path, embedded backend, AWS-modelled call latencies"
        )?;
        writeln!(
            out,
            "latencies: {} (jitter: uniform +-{:.0}%, seed {}; timer {})",
            latencies,
            latencies.jitter * 100.0,
            config.seed,
            latencies.timer.name(),
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

        let label_width = self
            .rows
            .iter()
            .map(|row| row.variant.label().len())
            .max()
            .unwrap_or(0)
            .max("variant".len());
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
            "{:<label_width$} {:<calls_width$} {}{}{}{}{}{}{}{}{}",
            "variant",
            "calls",
            heading("model"),
            heading("p50"),
            heading("p90"),
            heading("p99"),
            heading(&format!("p50@{c}")),
            heading(&format!("p99@{c}")),
            format_args!("{:>10}", format!("req/s@{c}")),
            heading("/(a)"),
            heading("/(b)"),
        )?;
        for row in &self.rows {
            writeln!(
                out,
                "{:<label_width$} {:<calls_width$} {:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>10.1}{:>8}{:>8}",
                row.variant.label(),
                calls(row.variant),
                ms(row.model),
                ms(row.sequential.p50),
                ms(row.sequential.p90),
                ms(row.sequential.p99),
                ms(row.concurrent.p50),
                ms(row.concurrent.p99),
                row.throughput,
                show_ratio(self.p50_ratio(row, Variant::PlainPut)),
                show_ratio(self.p50_ratio(row, Variant::DualWrite)),
            )?;
        }
        writeln!(
            out,
            "(ms; model = the calls' nominal latencies added, max() where they overlap; p50/p90/p99 one at a time;"
        )?;
        writeln!(
            out,
            " @{c} = {c} in flight; /(a), /(b) = the variant's p50 over (a)'s and (b)'s, one at a time)"
        )?;
        writeln!(out)?;

        self.goal_lines(&mut out)?;
        self.differences(&mut out)?;
        self.entity_lines(&mut out)?;
        self.create_lines(&mut out)?;
        writeln!(out)?;
        self.store_call_lines(&mut out)?;
        writeln!(out)?;

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
            latencies.timer.name(),
        )?;
        let bare: Vec<String> = self
            .rows
            .iter()
            .map(|row| format!("({}) {:.1}", row.variant.letter(), row.bare.p50.as_secs_f64() * 1e6))
            .collect();
        writeln!(
            out,
            "embedded backend alone (every latency 0, one at a time, p50 in microseconds): {}",
            bare.join(", ")
        )?;
        f.write_str(&out)
    }
}

impl Report {
    /// The goal line, (d)/(a), and where the gap between (d) and (b) comes from.
    fn goal_lines(&self, out: &mut String) -> fmt::Result {
        let latencies = &self.config.latencies;
        if let Some(d) = self.row(Variant::Outbox) {
            if let Some(over_a) = self.p50_ratio(d, Variant::PlainPut) {
                let model_a = latencies.staged_model(Variant::PlainPut.stages());
                writeln!(
                    out,
                    "(d)/(a) p50 = {over_a:.2} (model {:.2})",
                    ratio(d.model, model_a).unwrap_or(f64::NAN)
                )?;
            }
        }
        let Some(goal) = self.goal() else {
            writeln!(
                out,
                "(d)/(b) p50: not measured (the goal needs the variants dual-write and outbox)"
            )?;
            return Ok(());
        };
        writeln!(
            out,
            "(d)/(b) p50 = {:.2} (goal <= {GOAL_D_OVER_B}): {} (model {:.2})",
            goal.measured,
            if goal.met() { "met" } else { "not met" },
            goal.model,
        )?;
        let (d, b) = (
            self.row(Variant::Outbox).expect("the goal needs it"),
            self.row(Variant::DualWrite).expect("the goal needs it"),
        );
        let gap = Gap::of(latencies);
        let n = |call| format_duration(latencies.nominal(call));
        writeln!(
            out,
            "where the gap between (d) and (b) comes from: (d) - (b) = {:+.2} ms measured (p50), {:+.2} ms in the model:",
            millis(d.sequential.p50) - millis(b.sequential.p50),
            gap.total_ms(latencies),
        )?;
        writeln!(
            out,
            "  {:>+8.2} ms  the commit is a TransactWriteItems ({}: item and outbox record, prepare and commit)",
            gap.transact_over_put,
            n(Call::Transact),
        )?;
        writeln!(
            out,
            "               where (b) makes one conditional PutItem ({})",
            n(Call::Put)
        )?;
        writeln!(
            out,
            "  {:>+8.2} ms  the control SendMessage ({}) is overlapped with the GetItem ({}): only what it takes",
            gap.control_send_beyond_read,
            n(Call::Send),
            n(Call::Get),
        )?;
        writeln!(
            out,
            "               beyond the read is paid (sequential, (c), it would be all of it)"
        )?;
        writeln!(
            out,
            "  {:>+8.2} ms  (d) makes no SendMessage of the event in the request (the control worker publishes it);",
            -gap.event_send,
        )?;
        writeln!(out, "               (b) does, after its write")?;
        match gap.transact_break_even {
            Some(limit) => writeln!(
                out,
                "  the model meets the goal iff TransactWriteItems <= {} ({GOAL_D_OVER_B} x (b) {} - max(send, get) {});",
                format_duration(limit),
                format_duration(b.model),
                format_duration(latencies.nominal(Call::Send).max(latencies.nominal(Call::Get))),
            )?,
            None => writeln!(
                out,
                "  the model cannot meet the goal with these latencies, whatever TransactWriteItems takes;"
            )?,
        }
        writeln!(
            out,
            "  the TransactWriteItems latency is the lever: measure it in your region (--latency transact=..). Closing"
        )?;
        writeln!(
            out,
            "  the gap otherwise takes a commit without a transaction: entity mode, for a change to one existing item"
        )?;
        writeln!(out, "  ((f) below) or a create of one whose key was read ((j) below).")
    }

    /// Entity mode: (f)/(b) against its goal, where (f) - (b) comes from, and what inline
    /// publishing adds, (g) - (f).
    fn entity_lines(&self, out: &mut String) -> fmt::Result {
        let latencies = &self.config.latencies;
        let Some(f) = self.row(Variant::OutboxEntity) else {
            return Ok(());
        };
        let n = |call| format_duration(latencies.nominal(call));
        let nominal = |call| millis(latencies.nominal(call));
        if let Some(goal) = self.entity_goal() {
            let b = self.row(Variant::DualWrite).expect("the goal needs it");
            writeln!(
                out,
                "(f)/(b) p50 = {:.2} (entity mode; goal <= {GOAL_F_OVER_B}): {} (model {:.2})",
                goal.measured,
                if goal.measured <= GOAL_F_OVER_B + 1e-9 {
                    "met"
                } else {
                    "not met"
                },
                goal.model,
            )?;
            writeln!(
                out,
                "  (f) - (b) = {:+.2} ms measured (p50), {:+.2} ms in the model: {:+.2} the commit is one conditional UpdateItem ({})",
                millis(f.sequential.p50) - millis(b.sequential.p50),
                millis(f.model) - millis(b.model),
                nominal(Call::Update) - nominal(Call::Put),
                n(Call::Update),
            )?;
            writeln!(
                out,
                "  where (b) makes a PutItem ({}); {:+.2} the control send beyond the read it overlaps; {:+.2} no event sent",
                n(Call::Put),
                nominal(Call::Send).max(nominal(Call::Get)) - nominal(Call::Get),
                -nominal(Call::Send),
            )?;
            writeln!(out, "  in the request (the control worker publishes it)")?;
        }
        if let Some(d) = self.row(Variant::Outbox) {
            writeln!(
                out,
                "(f) - (d): p50 {:+.2} ms (model {:+.2} ms): the commit without TransactWriteItems",
                millis(f.sequential.p50) - millis(d.sequential.p50),
                millis(f.model) - millis(d.model),
            )?;
        }
        if let Some(g) = self.row(Variant::OutboxEntityInline) {
            writeln!(
                out,
                "(g) - (f): p50 {:+.2} ms (model {:+.2} ms: SendMessageBatch + UpdateItem, one after the other):",
                millis(g.sequential.p50) - millis(f.sequential.p50),
                millis(g.model) - millis(f.model),
            )?;
            writeln!(
                out,
                "           inline publishing in entity mode publishes, then settles the entry into its sent mark (one"
            )?;
            writeln!(out, "           write), both before the answer")?;
            if let Some(over_b) = self.p50_ratio(g, Variant::DualWrite) {
                let b_model = latencies.staged_model(Variant::DualWrite.stages());
                writeln!(
                    out,
                    "(g)/(b) p50 = {over_b:.2} (model {:.2}): {} (b)'s by the settle after the publish",
                    ratio(g.model, b_model).unwrap_or(f64::NAN),
                    if over_b <= GOAL_F_OVER_B + 1e-9 {
                        "within"
                    } else {
                        "above"
                    },
                )?;
            }
        }
        if let Some(i) = self.row(Variant::OutboxEntityAfter) {
            if let Some(over_b) = self.p50_ratio(i, Variant::DualWrite) {
                let b_model = latencies.staged_model(Variant::DualWrite.stages());
                writeln!(
                    out,
                    "(i)/(b) p50 = {over_b:.2} (entity mode publishing after the answer, issue 29; goal <= {GOAL_F_OVER_B}): {} (model {:.2})",
                    if over_b <= GOAL_F_OVER_B + 1e-9 { "met" } else { "not met" },
                    ratio(i.model, b_model).unwrap_or(f64::NAN),
                )?;
                writeln!(
                    out,
                    "  the answer waits for the commit alone; the publish and the settle follow it"
                )?;
            }
        }
        Ok(())
    }

    /// The creates, publishing after the answer: (j)/(b) against its goal, and what the
    /// transactional form costs the same create, (k) - (j).
    fn create_lines(&self, out: &mut String) -> fmt::Result {
        let latencies = &self.config.latencies;
        let nominal = |call| millis(latencies.nominal(call));
        let n = |call| format_duration(latencies.nominal(call));
        if let Some(goal) = self.create_goal() {
            let (j, b) = (
                self.row(Variant::CreateEntityAfter).expect("the goal needs it"),
                self.row(Variant::DualWrite).expect("the goal needs it"),
            );
            writeln!(
                out,
                "(j)/(b) p50 = {:.2} (a create in entity mode publishing after the answer; goal <= {GOAL_J_OVER_B}): {} (model {:.2})",
                goal.measured,
                if goal.measured <= GOAL_J_OVER_B + 1e-9 {
                    "met"
                } else {
                    "not met"
                },
                goal.model,
            )?;
            writeln!(
                out,
                "  (j) - (b) = {:+.2} ms measured (p50), {:+.2} ms in the model: the create is one conditional UpdateItem ({})",
                millis(j.sequential.p50) - millis(b.sequential.p50),
                millis(j.model) - millis(b.model),
                n(Call::Update),
            )?;
            writeln!(
                out,
                "  after the read of its key, overlapped with the control send ({:+.2} beyond the read); no event sent",
                nominal(Call::Send).max(nominal(Call::Get)) - nominal(Call::Get),
            )?;
            writeln!(out, "  before the answer (the publish and the settle follow it)")?;
        }
        if let Some(k) = self.row(Variant::CreateAfter) {
            if let Some(over_b) = self.p50_ratio(k, Variant::DualWrite) {
                let b_model = latencies.staged_model(Variant::DualWrite.stages());
                writeln!(
                    out,
                    "(k)/(b) p50 = {over_b:.2} (model {:.2}): the same create in the transactional form (a blind create:",
                    ratio(k.model, b_model).unwrap_or(f64::NAN),
                )?;
                writeln!(
                    out,
                    "  the control send, then a TransactWriteItems ({}) of the item and its outbox record)",
                    n(Call::Transact),
                )?;
            }
            if let Some(j) = self.row(Variant::CreateEntityAfter) {
                writeln!(
                    out,
                    "(k) - (j): p50 {:+.2} ms (model {:+.2} ms): what committing a create without TransactWriteItems saves",
                    millis(k.sequential.p50) - millis(j.sequential.p50),
                    millis(k.model) - millis(j.model),
                )?;
            }
        }
        Ok(())
    }

    /// The store calls each variant made per request, as counted by the slowed store.
    fn store_call_lines(&self, out: &mut String) -> fmt::Result {
        writeln!(
            out,
            "store calls per request, counted (commit = TransactWriteItems, commit_entity = one UpdateItem; checked"
        )?;
        writeln!(
            out,
            "against each variant's claim: a fallback to the transaction fails the run):"
        )?;
        for row in &self.rows {
            let per_request: Vec<String> = row
                .store_calls
                .iter()
                .map(|(op, count)| format!("{} {}", op.name(), show_count(*count, row.requests)))
                .collect();
            writeln!(
                out,
                "  ({}) {} over {} requests",
                row.variant.letter(),
                per_request.join(", "),
                row.requests
            )?;
        }
        Ok(())
    }

    /// What the overlap and inline publishing cost: (c) - (d) and (e) - (d).
    fn differences(&self, out: &mut String) -> fmt::Result {
        let Some(d) = self.row(Variant::Outbox) else {
            return Ok(());
        };
        let between = |other: &Row| {
            (
                millis(other.sequential.p50) - millis(d.sequential.p50),
                millis(other.model) - millis(d.model),
            )
        };
        if let Some(c) = self.row(Variant::OutboxSequential) {
            let (measured, model) = between(c);
            writeln!(
                out,
                "(c) - (d): p50 {measured:+.2} ms (model {model:+.2} ms): what overlapping the control send with the read saves"
            )?;
        }
        if let Some(e) = self.row(Variant::OutboxInline) {
            let (measured, model) = between(e);
            writeln!(
                out,
                "(e) - (d): p50 {measured:+.2} ms (model {model:+.2} ms: SendMessageBatch + BatchWriteItem): inline publishing,"
            )?;
            writeln!(
                out,
                "           the event out before the answer instead of after the first check's delay (~1 s by default)"
            )?;
        }
        Ok(())
    }
}

/// `count` calls over `requests` requests, per request: `1` or `0.50`.
fn show_count(count: usize, requests: usize) -> String {
    if requests == 0 {
        return "-".to_owned();
    }
    if count % requests == 0 {
        (count / requests).to_string()
    } else {
        format!("{:.2}", count as f64 / requests as f64)
    }
}

/// `commit 300, get_items 300`: calls by operation.
pub fn show_calls(calls: &StoreCalls) -> String {
    if calls.is_empty() {
        return "none".to_owned();
    }
    calls
        .iter()
        .map(|(op, count)| format!("{} {count}", op.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `max(send,get)+transact`: the variant's calls by their `--latency` names, stage by
/// stage.
pub fn calls(variant: Variant) -> String {
    variant
        .stages()
        .iter()
        .map(|stage| {
            let names: Vec<&str> = stage.iter().map(|call| call.key()).collect();
            match names.as_slice() {
                [one] => (*one).to_owned(),
                many => format!("max({})", many.join(",")),
            }
        })
        .collect::<Vec<_>>()
        .join("+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: Variant, p50_ms: u64) -> Row {
        let p50 = Duration::from_millis(p50_ms);
        let summary = Summary::of(vec![p50]);
        Row {
            variant,
            model: Latencies::default().staged_model(variant.stages()),
            sequential: summary,
            samples: vec![p50],
            concurrent: summary,
            concurrent_samples: vec![p50],
            throughput: 100.0,
            bare: Summary::of(vec![Duration::from_micros(30)]),
            store_calls: variant.expected_store_calls(1),
            requests: 1,
        }
    }

    fn report(rows: Vec<Row>) -> Report {
        let probe = Summary::of(vec![Duration::from_micros(10)]);
        Report {
            config: Config::default(),
            workers: 4,
            lateness: [(Timer::Tokio, probe), (Timer::Precise, probe)],
            rows,
        }
    }

    #[test]
    fn calls_show_the_overlap() {
        assert_eq!(calls(Variant::DualWrite), "get+put+send");
        assert_eq!(calls(Variant::OutboxSequential), "get+send+transact");
        assert_eq!(calls(Variant::Outbox), "max(send,get)+transact");
        assert_eq!(calls(Variant::OutboxInline), "max(send,get)+transact+batch+update");
        assert_eq!(calls(Variant::OutboxEntity), "max(send,get)+update");
        assert_eq!(calls(Variant::OutboxEntityInline), "max(send,get)+update+batch+update");
        assert_eq!(calls(Variant::CreateEntityAfter), "max(send,get)+update");
        assert_eq!(calls(Variant::CreateAfter), "send+transact");
    }

    #[test]
    fn a_create_in_entity_mode_is_measured_against_b_and_the_transactional_create() {
        let latencies = Latencies::default();
        let ms = Duration::from_millis;
        assert_eq!(latencies.staged_model(Variant::CreateEntityAfter.stages()), ms(16));
        assert_eq!(latencies.staged_model(Variant::CreateAfter.stages()), ms(33));
        let missed = report(vec![row(Variant::DualWrite, 21), row(Variant::CreateEntityAfter, 22)]);
        assert!(missed.to_string().contains("goal <= 1): not met"));
        let report = report(vec![
            row(Variant::DualWrite, 21),
            row(Variant::CreateEntityAfter, 17),
            row(Variant::CreateAfter, 34),
        ]);
        let goal = report.create_goal().unwrap();
        assert!((goal.measured - 17.0 / 21.0).abs() < 1e-12);
        assert!((goal.model - 16.0 / 21.0).abs() < 1e-12);
        let text = report.to_string();
        assert!(
            text.contains(
                "(j)/(b) p50 = 0.81 (a create in entity mode publishing after the answer; goal <= 1): met (model 0.76)"
            ),
            "{text}"
        );
        assert!(text.contains("(k)/(b) p50 = 1.62 (model 1.57)"), "{text}");
        assert!(text.contains("(k) - (j): p50 +17.00 ms (model +17.00 ms)"), "{text}");
        assert!(
            text.contains("(j) get_items 1, commit_entity 1, settle_entry 1 over 1 requests"),
            "{text}"
        );
        assert!(
            text.contains("(k) commit_native 1, mark_dispatched 1 over 1 requests"),
            "{text}"
        );
        let value = report.to_json();
        assert_eq!(value["create_goal"]["met"], true);
        assert_eq!(value["variants"][1]["store_calls_per_request"]["commit_entity"], 1.0);
    }

    #[test]
    fn entity_mode_is_measured_against_b() {
        let latencies = Latencies::default();
        let ms = Duration::from_millis;
        assert_eq!(latencies.staged_model(Variant::OutboxEntity.stages()), ms(16));
        assert_eq!(latencies.staged_model(Variant::OutboxEntityInline.stages()), ms(34));
        let report = report(vec![
            row(Variant::DualWrite, 21),
            row(Variant::Outbox, 33),
            row(Variant::OutboxEntity, 17),
            row(Variant::OutboxEntityInline, 43),
        ]);
        let goal = report.entity_goal().unwrap();
        assert!((goal.measured - 17.0 / 21.0).abs() < 1e-12);
        assert!((goal.model - 16.0 / 21.0).abs() < 1e-12);
        let text = report.to_string();
        assert!(
            text.contains("(f)/(b) p50 = 0.81 (entity mode; goal <= 1): met (model 0.76)"),
            "{text}"
        );
        assert!(text.contains("(g)/(b) p50 = 2.05 (model 1.62): above"), "{text}");
        assert!(
            text.contains("(f) get_items 1, commit_entity 1 over 1 requests"),
            "{text}"
        );
        assert!(
            text.contains("(g) get_items 1, commit_entity 1, settle_entry 1"),
            "{text}"
        );
        let value = report.to_json();
        assert_eq!(value["entity_goal"]["met"], true);
        assert_eq!(value["variants"][2]["store_calls_per_request"]["commit_entity"], 1.0);
    }

    #[test]
    fn the_gap_adds_up_to_the_models_difference() {
        let latencies = Latencies::default();
        let gap = Gap::of(&latencies);
        let terms = gap.transact_over_put + gap.control_send_beyond_read - gap.event_send;
        assert!((terms - gap.total_ms(&latencies)).abs() < 1e-9);
        assert!((terms - 12.0).abs() < 1e-9, "{terms}");
        // 1.5 x 21 ms - 8 ms.
        assert_eq!(gap.transact_break_even, Some(Duration::from_micros(23_500)));
    }

    #[test]
    fn the_goal_is_d_over_b() {
        let met = report(vec![
            row(Variant::PlainPut, 14),
            row(Variant::DualWrite, 22),
            row(Variant::Outbox, 33),
        ]);
        let goal = met.goal().unwrap();
        assert!((goal.measured - 1.5).abs() < 1e-12 && goal.met());
        assert!((goal.model - 33.0 / 21.0).abs() < 1e-12);
        let text = met.to_string();
        assert!(text.contains("(d)/(b) p50 = 1.50 (goal <= 1.5): met"), "{text}");
        assert!(text.contains("(d)/(a) p50 = 2.36"), "{text}");

        let missed = report(vec![row(Variant::DualWrite, 22), row(Variant::Outbox, 34)]);
        assert!(missed.to_string().contains("(goal <= 1.5): not met"));
        let without = report(vec![row(Variant::Outbox, 34)]);
        assert!(without.goal().is_none());
        assert!(without.to_string().contains("(d)/(b) p50: not measured"));
    }

    #[test]
    fn the_json_holds_the_samples_and_the_summary() {
        let value = report(vec![row(Variant::DualWrite, 22), row(Variant::Outbox, 33)]).to_json();
        let variants = value["variants"].as_array().unwrap();
        assert_eq!(variants.len(), 2);
        assert_eq!(variants[1]["label"], "(d) outbox");
        assert_eq!(variants[1]["samples_ms"], json!([33.0]));
        assert_eq!(variants[1]["summary"]["p50_ms"], 33.0);
        assert_eq!(variants[1]["summary"]["p50_over_b"], 1.5);
        assert_eq!(variants[1]["summary"]["p50_over_a"], Value::Null);
        assert_eq!(value["goal"]["met"], true);
        assert_eq!(value["config"]["latencies"]["transact"]["ms"], 25.0);
    }
}
