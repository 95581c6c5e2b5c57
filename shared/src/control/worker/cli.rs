//! The control worker's command line, the whole of its binary's `main` ([`main`]): a crate of
//! your own runs the control worker from the published library with a binary of one line
//! (`fn main() -> std::process::ExitCode { crate::control::worker::cli::main() }`); it reads the
//! `OUTBOX_*` settings.
//!
//! - Inside Lambda (the runtime API is in the environment): handles the control queue's
//!   SQS events and answers with partial batch responses, several batches at once on
//!   Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY`), one at a time elsewhere.
//! - `control-worker` or `control-worker poll`: long-polls the control queue (SQS or an
//!   emulator through `AWS_ENDPOINT_URL`) with the same handler; SIGINT or SIGTERM stops
//!   it after the batch in hand.
//! - `control-worker redrive DEAD_LETTER_QUEUE_URL [SOURCE_QUEUE_URL]`: moves a
//!   dead-letter queue's messages back to its source queue: the one whose redrive policy
//!   names it (the control queue's, a destination queue's), or the one given.
//! - `control-worker release TXN_ID [ITEM_KEY]`: releases a parked transaction, one whose
//!   message a destination refuses for good (the `ParkedTransactions` metric, the log's
//!   "parked" line naming it), which holds back every later transaction of its entity on
//!   a destination that keeps order: sends what its destinations take, skips what they
//!   refuse for good (each skipped message logged), and settles it. `ITEM_KEY` names its
//!   item where it committed in entity mode (the log line's `entity`).
//! - `control-worker consumer-state CONSUMER DESTINATION ENTITY [--producer TABLE] [--item
//!   ITEM_KEY]`: prints, as JSON, what in-order consumer CONSUMER did with ENTITY's chain on
//!   DESTINATION: the `seq` it applied last and the transaction that applied it, and the
//!   messages kept waiting for a predecessor with how long each has waited
//!   (`crate::consumer::state`). The chain is the one the table `OUTBOX_TABLE_NAME`
//!   keeps unless `--producer` names another table; `--item` names the item the consumer
//!   applies the entity's messages to, where it applies them in entity mode.
//! - `control-worker --help` (after any command too): prints the usage, and runs nothing.
//! - `control-worker bootstrap [STACK] [--events-via sqs|sqs-fifo|sns|eventbridge] [--consumer NAME
//!   [--source DEST] [--publishes DEST]...]`: creates the table and queues of
//!   `template.yaml` for stack STACK (default `outbox`), with the `events` destination
//!   published to its queue directly (the default), through an SNS topic the queue
//!   subscribes to, or through an EventBridge bus whose rule targets the queue; and prints
//!   the settings that point the API and the worker at them. With `--consumer NAME` it
//!   also makes what consumer NAME needs and prints its settings instead: its name, the
//!   queue of destination `--source` (default `events`; another name gets a queue
//!   `STACK-DEST` with its dead-letter queue) and both queues' retention, and each
//!   destination it publishes to (one `--publishes` each, on a queue `STACK-DEST`). The
//!   worked consumer is `--consumer shipping --publishes shipments`. DynamoDB goes where the SDK sends
//!   it: `AWS_ENDPOINT_URL_DYNAMODB` (DynamoDB Local), else `AWS_ENDPOINT_URL`, else AWS;
//!   the queues, topics and buses to `AWS_ENDPOINT_URL` (moto). The table is `OUTBOX_TABLE_NAME`
//!   if set (an existing table must have the key schema the layout variables name:
//!   `OUTBOX_PARTITION_KEY`, `OUTBOX_SORT_KEY`, ...). With `--env-file PATH` it also
//!   writes the same settings to PATH as `NAME=value` lines, the process's alone, so that
//!   the API's and each consumer's live side by side (`env $(cat PATH) COMMAND`,
//!   `cargo lambda watch --env-file PATH`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::aws::{dead_letter_source, load_sdk_config, redrive, AwsClients};
use crate::consumer::state::{chain_state, ChainQuery};
use crate::control::worker::lambda::handle_event;
use crate::control::worker::setup::Worker;
use crate::settings::Settings;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, LambdaEvent};

mod bootstrap;

fn report(error: &dyn std::error::Error) -> ExitCode {
    eprintln!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        eprintln!("  caused by: {cause}");
        source = cause.source();
    }
    ExitCode::FAILURE
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("shutting down after the batch in hand");
}

/// What `--help` prints, and a wrong command line beside its problem.
pub const USAGE: &str = "usage: control-worker [poll] | redrive DEAD_LETTER_QUEUE_URL [SOURCE_QUEUE_URL] | release TXN_ID [ITEM_KEY] | consumer-state CONSUMER DESTINATION ENTITY [--producer TABLE] [--item ITEM_KEY] | --help | bootstrap [STACK] [--events-via sqs|sqs-fifo|sns|eventbridge] [--consumer NAME [--source DEST] [--publishes DEST]...] [--env-file PATH]";

/// The control worker's binary: reads its arguments and runs as they say (see the
/// module's list), on a Tokio runtime of its own. Inside Lambda (no arguments) it handles
/// the control queue's events.
pub fn main() -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => report(&error),
    }
}

async fn run() -> ExitCode {
    let on_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    crate::logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if crate::settings::help::asked_in(&args) {
        println!("{}", crate::settings::help::text(USAGE));
        return ExitCode::SUCCESS;
    }
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["bootstrap", rest @ ..] => match bootstrap::Request::parse(rest) {
            Ok(request) => bootstrap::run(request, USAGE).await,
            Err(problem) => {
                eprintln!("{problem}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        [] | ["poll"] => run_worker(on_lambda).await,
        ["redrive", dead_letter_queue_url] => run_redrive(dead_letter_queue_url, None).await,
        ["redrive", dead_letter_queue_url, source] => run_redrive(dead_letter_queue_url, Some(source)).await,
        ["release", txn_id] => run_release(txn_id, None).await,
        ["release", txn_id, item] => run_release(txn_id, Some(item)).await,
        ["consumer-state", consumer, destination, entity, options @ ..] => {
            match state_query(consumer, destination, entity, options) {
                Ok(query) => run_consumer_state(query).await,
                Err(problem) => {
                    eprintln!("{problem}\n{USAGE}");
                    ExitCode::from(2)
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The chain `consumer-state` asks about, from its arguments.
fn state_query(consumer: &str, destination: &str, entity: &str, options: &[&str]) -> Result<ChainQuery, String> {
    let consumer = consumer.parse().map_err(|error| format!("CONSUMER: {error}"))?;
    let destination = destination.parse().map_err(|error| format!("DESTINATION: {error}"))?;
    let entity = entity.parse().map_err(|error| format!("ENTITY: {error}"))?;
    let mut query = ChainQuery::new(consumer, destination, entity);
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let value = options.next().ok_or_else(|| format!("{option} needs a value"))?;
        query = match *option {
            "--producer" => query.producer(value.parse().map_err(|error| format!("--producer: {error}"))?),
            "--item" => query.applied_in(value.parse().map_err(|error| format!("--item: {error}"))?),
            other => return Err(format!("unknown option {other}")),
        };
    }
    Ok(query)
}

/// The worker the `OUTBOX_*` settings describe, or, having reported why not, the exit code.
async fn worker_from_env() -> Result<Worker, ExitCode> {
    let settings = Settings::from_env().map_err(|error| report(&error))?;
    Worker::from_settings(&settings).await.map_err(|error| report(&error))
}

/// Prints a consumer's state of one chain, as JSON.
async fn run_consumer_state(query: ChainQuery) -> ExitCode {
    let worker = match worker_from_env().await {
        Ok(worker) => worker,
        Err(exit) => return exit,
    };
    // The chain is the table's own unless --producer names another.
    let query = match (query.names_producer(), worker.store.producer()) {
        (false, Some(own)) => query.producer(own),
        _ => query,
    };
    let state = chain_state(worker.store.as_ref(), worker.clock.as_ref(), &query).await;
    crate::logging::finish();
    match state {
        Ok(state) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&state).expect("a chain's state is JSON")
            );
            ExitCode::SUCCESS
        }
        Err(error) => report(&error),
    }
}

/// Releases parked transaction `txn_id` (committed into `item` in entity mode).
async fn run_release(txn_id: &str, item: Option<&str>) -> ExitCode {
    let txn_id = match txn_id.parse() {
        Ok(txn_id) => txn_id,
        Err(error) => return report(&error),
    };
    let item = match item.map(str::parse).transpose() {
        Ok(item) => item,
        Err(error) => return report(&error),
    };
    let worker = match worker_from_env().await {
        Ok(worker) => worker,
        Err(exit) => return exit,
    };
    let released = worker.control.release(txn_id, item).await;
    crate::logging::finish();
    match released {
        Ok(outcome) => {
            println!("released {txn_id}: {outcome:?}");
            ExitCode::SUCCESS
        }
        Err(error) => report(&error),
    }
}

/// Moves the dead-letter queue's messages back to `source`, or to the queue whose redrive
/// policy names it.
async fn run_redrive(dead_letters: &str, source: Option<&str>) -> ExitCode {
    let clients = AwsClients::new(&load_sdk_config(Duration::from_secs(10)).await);
    let to = match source {
        Some(source) => source.to_owned(),
        None => match dead_letter_source(&clients.sqs, dead_letters).await {
            Ok(source) => source,
            Err(error) => return report(&error),
        },
    };
    match redrive(&clients.sqs, dead_letters, &to).await {
        Ok(moved) => {
            println!("moved {moved} messages from {dead_letters} to {to}");
            ExitCode::SUCCESS
        }
        Err(error) => report(&error),
    }
}

async fn run_worker(on_lambda: bool) -> ExitCode {
    let worker = match worker_from_env().await {
        Ok(worker) => worker,
        Err(exit) => return exit,
    };
    if on_lambda {
        // Shared by the batches in flight at once on Lambda Managed Instances: the control
        // path holds no state of its own between batches (its ports are clients).
        let worker = Arc::new(worker);
        let handler = service_fn(move |event: LambdaEvent<SqsEvent>| {
            let worker = worker.clone();
            async move {
                let response = handle_event(
                    &worker.control,
                    worker.control_queue.as_ref(),
                    worker.clock.as_ref(),
                    event.payload,
                )
                .await;
                Ok::<_, lambda_runtime::Error>(response)
            }
        });
        return match crate::telemetry::lambda::run(handler).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => report(error.as_ref()),
        };
    }
    crate::control::worker::poll::run(&worker, shutdown_signal()).await;
    crate::logging::finish();
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_state_reads_its_chain_and_refuses_what_is_not_one() {
        let query = state_query(
            "billing",
            "shipments",
            "SHIPMENT#1",
            &["--item", "INVOICE#1", "--producer", "outbox-table"],
        )
        .expect("a valid query");
        assert!(query.names_producer());
        let refused = [
            state_query("bad name!", "shipments", "SHIPMENT#1", &[]).unwrap_err(),
            state_query("billing", "shipments", "", &[]).unwrap_err(),
            state_query("billing", "shipments", "SHIPMENT#1", &["--item"]).unwrap_err(),
            state_query("billing", "shipments", "SHIPMENT#1", &["--nope", "x"]).unwrap_err(),
        ];
        for (problem, says) in
            refused
                .iter()
                .zip(["CONSUMER", "ENTITY", "--item needs a value", "unknown option --nope"])
        {
            assert!(problem.contains(says), "{problem:?} says {says}");
        }
    }
}
