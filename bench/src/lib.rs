//! Measures the latency the outbox adds to a request: the request path on the embedded
//! backend, each port call slowed by the latency of the AWS call it stands for
//! (docs/PROTOCOL.md section 3): the control send after the read or overlapped with it, inline
//! publishing off and on, in the transactional form and in entity mode (one conditional
//! write of the item, issue 21), a change of an existing item and a create of a new one,
//! next to baselines that write without an outbox.
//!
//! The embedded backend does the real work of every call (conditions, versions, queues),
//! so the numbers include the request path's own code; the AWS latencies are a model,
//! round published figures by default, and the report prints the ones used.
//!
//! # Layout
//!
//! - [`config`]: the command line and its environment variables.
//! - [`latency`]: the modelled call latencies, their jitter, and waiting them.
//! - [`ports`]: the latency-injecting wrappers around the store, queue and publisher ports.
//! - [`variants`]: what one request does in each variant, over a fresh backend.
//! - [`measure`]: timing requests one at a time and C at a time; percentiles.
//! - [`report`]: the printed table, the ratios to the baselines, and the JSON of the samples.

pub mod config;
pub mod lag;
pub mod latency;
pub mod measure;
pub mod ports;
pub mod report;
pub mod variants;

use std::sync::Arc;

use outbox::embedded::QueueFault;
use outbox::ports::{ItemKey, StoreError};
use outbox::request::TxnError;

use crate::config::Config;
use crate::latency::{Delays, Latencies, Timer};
use crate::measure::Summary;
use crate::ports::StoreCalls;
use crate::report::{Report, Row};
use crate::variants::{Rig, Variant};

/// Why a run stopped: any failed request makes the numbers meaningless.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A transaction failed.
    #[error("a transaction failed")]
    Txn(#[from] TxnError),
    /// A baseline's read failed.
    #[error("a read failed")]
    Read(#[from] StoreError),
    /// The dual write's send was refused.
    #[error("the event could not be sent")]
    Send(#[from] QueueFault),
    /// An event could not be encoded.
    #[error("an event could not be encoded")]
    Encode(#[from] serde_json::Error),
    /// A seeded item was not found.
    #[error("item {0} is missing")]
    Missing(ItemKey),
    /// An item to create was found already.
    #[error("item {0} exists already: a create must find no item")]
    Exists(ItemKey),
    /// A commit was not dispatched as its variant requires.
    #[error("variant {variant}: a commit's inline dispatch was {got}")]
    UnexpectedDispatch {
        /// The variant.
        variant: Variant,
        /// What the commit said.
        got: &'static str,
    },
    /// The store calls a variant's requests made differ from what the variant claims to
    /// measure (an entity-mode commit that fell back to a transaction, say).
    #[error("variant {variant}: {requests} requests made the store calls {got}, not {expected}")]
    UnexpectedCalls {
        /// The variant.
        variant: Variant,
        /// Requests made.
        requests: usize,
        /// The calls it should have made.
        expected: String,
        /// The calls it made.
        got: String,
    },
    /// A request task panicked.
    #[error("a request task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Requests made, unmeasured, before each variant's measured ones: the first requests
/// on a fresh runtime and backend pay for allocations the later ones do not.
const WARM_UP: usize = 20;

/// Requests timed to see how late the timer wakes.
const TIMER_PROBES: usize = 50;

/// Runs every variant of `config` and reports. Progress goes to standard error.
pub async fn run(config: &Config) -> Result<Report, BenchError> {
    let probe = std::time::Duration::from_millis(5);
    let lateness = [
        (
            Timer::Tokio,
            measure::timer_lateness(Timer::Tokio, probe, TIMER_PROBES).await,
        ),
        (
            Timer::Precise,
            measure::timer_lateness(Timer::Precise, probe, TIMER_PROBES).await,
        ),
    ];
    let warm_up = WARM_UP.min(config.requests);
    let mut rows = Vec::new();
    for (position, variant) in config.variants.iter().copied().enumerate() {
        // The embedded backend alone: every latency zero.
        let bare = Rig::new(variant, Arc::new(Delays::new(Latencies::zero(), 0)), config.requests).await?;
        let bare_samples = measure::sequential(&bare, 0, config.requests).await?;
        bare.settled().await;
        check_calls(variant, bare.store_calls(), config.requests)?;
        let bare = Summary::of(bare_samples);

        // Each variant's own seed, so that its sequential draws repeat run to run
        // whichever other variants are chosen.
        let delays = Arc::new(Delays::new(
            config.latencies.clone(),
            config.seed.wrapping_add(position as u64),
        ));
        let rig = Arc::new(Rig::new(variant, delays, warm_up + 2 * config.requests).await?);
        eprintln!("request-path: {variant}: {} requests one at a time", config.requests);
        measure::sequential(&rig, 0, warm_up).await?;
        let sequential = measure::sequential(&rig, warm_up, config.requests).await?;
        eprintln!(
            "request-path: {variant}: {} requests, {} in flight",
            config.requests, config.concurrency
        );
        let concurrent = measure::concurrent(
            rig.clone(),
            warm_up + config.requests,
            config.requests,
            config.concurrency,
        )
        .await?;
        let requests = warm_up + 2 * config.requests;
        rig.settled().await;
        let store_calls = rig.store_calls();
        check_calls(variant, store_calls.clone(), requests)?;
        rows.push(Row {
            variant,
            model: config.latencies.staged_model(variant.stages()),
            sequential: Summary::of(sequential.clone()),
            samples: sequential,
            throughput: concurrent.throughput(),
            concurrent: Summary::of(concurrent.samples.clone()),
            concurrent_samples: concurrent.samples,
            bare,
            store_calls,
            requests,
        });
    }
    Ok(Report {
        config: config.clone(),
        workers: tokio::runtime::Handle::current().metrics().num_workers(),
        lateness,
        rows,
    })
}

/// Whether `requests` requests of `variant` made the store calls it claims, by operation.
fn check_calls(variant: Variant, got: StoreCalls, requests: usize) -> Result<(), BenchError> {
    let expected = variant.expected_store_calls(requests);
    if got == expected {
        return Ok(());
    }
    Err(BenchError::UnexpectedCalls {
        variant,
        requests,
        expected: report::show_calls(&expected),
        got: report::show_calls(&got),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variants::Variant;

    /// Every variant runs end to end (a few requests, no latency): its commits take the
    /// form it claims, counted by store operation, or the run fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_variant_runs_and_makes_the_store_calls_it_claims() {
        let config = Config {
            requests: 4,
            concurrency: 2,
            latencies: Latencies::zero(),
            ..Config::default()
        };
        let report = run(&config).await.expect("every variant runs");
        let variants: Vec<Variant> = report.rows.iter().map(|row| row.variant).collect();
        assert_eq!(variants, Variant::ALL.to_vec());
        for row in &report.rows {
            assert_eq!(
                row.store_calls,
                row.variant.expected_store_calls(row.requests),
                "{}",
                row.variant
            );
        }
    }
}
