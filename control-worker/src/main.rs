//! The control worker's binary: thin, over [`outbox::control::worker`] (deploy it unchanged; it
//! reads the `OUTBOX_*` settings).
//!
//! - Inside Lambda (the runtime API is in the environment): handles the control queue's
//!   SQS events and answers with partial batch responses.
//! - `control-worker` or `control-worker poll`: long-polls the control queue (SQS or an
//!   emulator through `AWS_ENDPOINT_URL`) with the same handler; SIGINT or SIGTERM stops
//!   it after the batch in hand.
//! - `control-worker redrive DEAD_LETTER_QUEUE_URL`: moves the dead-letter queue's
//!   messages back to the control queue.
//! - `control-worker bootstrap [STACK] [--events-via sqs|sns|eventbridge]`: creates the
//!   table and queues of `template.yaml` for stack STACK (default `outbox`), with the
//!   `events` destination published to its queue directly (the default), through an SNS
//!   topic the queue subscribes to, or through an EventBridge bus whose rule targets the
//!   queue, and prints the settings that point at them. DynamoDB goes where the SDK sends
//!   it: `AWS_ENDPOINT_URL_DYNAMODB` (DynamoDB Local), else `AWS_ENDPOINT_URL`, else AWS;
//!   the queues, topics and buses to `AWS_ENDPOINT_URL` (moto). The table is `OUTBOX_TABLE_NAME`
//!   if set (an existing table must have the key schema the layout variables name:
//!   `OUTBOX_PARTITION_KEY`, `OUTBOX_SORT_KEY`, ...).

use std::process::ExitCode;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, LambdaEvent};
use outbox::aws::SortKeyValue;
use outbox::aws::{bootstrap, load_sdk_config, queue_retention, redrive, AwsClients, ResourceNames};
use outbox::consumer::consumer_vars;
use outbox::consumer::Retention;
use outbox::control::worker::lambda::handle_event;
use outbox::control::worker::setup::Worker;
use outbox::settings::{layout_from_env, vars, Settings};

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

const USAGE: &str = "usage: control-worker [poll] | redrive DEAD_LETTER_QUEUE_URL | bootstrap [STACK] [--events-via sqs|sns|eventbridge]";

#[tokio::main]
async fn main() -> ExitCode {
    let on_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    outbox::logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["bootstrap"] => run_bootstrap("outbox", "sqs").await,
        ["bootstrap", "--events-via", kind] => run_bootstrap("outbox", kind).await,
        ["bootstrap", stack] => run_bootstrap(stack, "sqs").await,
        ["bootstrap", stack, "--events-via", kind] => run_bootstrap(stack, kind).await,
        [] | ["poll"] => run_worker(on_lambda, None).await,
        ["redrive", dead_letter_queue_url] => run_worker(false, Some(dead_letter_queue_url)).await,
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

async fn run_worker(on_lambda: bool, redrive_from: Option<&str>) -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => return report(&error),
    };
    let worker = match Worker::from_settings(&settings).await {
        Ok(worker) => worker,
        Err(error) => return report(&error),
    };
    if let Some(from) = redrive_from {
        return match redrive(&worker.clients.sqs, from, &worker.control_queue_url).await {
            Ok(moved) => {
                println!("moved {moved} messages from {from} to {}", worker.control_queue_url);
                ExitCode::SUCCESS
            }
            Err(error) => report(&error),
        };
    }
    if on_lambda {
        let worker = &worker;
        let handler = service_fn(move |event: LambdaEvent<SqsEvent>| async move {
            let response = handle_event(
                &worker.control,
                worker.control_queue.as_ref(),
                worker.clock.as_ref(),
                event.payload,
            )
            .await;
            Ok::<_, lambda_runtime::Error>(response)
        });
        return match lambda_runtime::run(handler).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => report(error.as_ref()),
        };
    }
    outbox::control::worker::poll::run(&worker, shutdown_signal()).await;
    ExitCode::SUCCESS
}

async fn run_bootstrap(stack: &str, events_via: &str) -> ExitCode {
    let Some(mut names) = ResourceNames::for_stack(stack).with_events_via(events_via) else {
        eprintln!("--events-via takes sqs, sns or eventbridge, not {events_via:?}\n{USAGE}");
        return ExitCode::from(2);
    };
    names.layout = match layout_from_env(&names.layout.table) {
        Ok(layout) => layout,
        Err(error) => return report(&error),
    };
    let clients = AwsClients::new(&load_sdk_config(Duration::from_secs(10)).await);
    match bootstrap(&clients, &names).await {
        Ok(resources) => {
            let destinations: Vec<String> = resources
                .destinations
                .iter()
                .map(|(name, target)| format!("{name}={target}"))
                .collect();
            println!("export {}=aws", vars::BACKEND);
            let layout = &resources.layout;
            println!("export {}={}", vars::TABLE_NAME, layout.table);
            println!("export {}={}", vars::PARTITION_KEY, layout.partition_key);
            if let Some(sort_key) = &layout.sort_key {
                println!("export {}={}", vars::SORT_KEY, sort_key.attribute);
                if let SortKeyValue::Constant(value) = &sort_key.value {
                    println!("export {}={value}", vars::SORT_KEY_VALUE);
                }
            }
            println!("export {}={}", vars::TTL_ATTRIBUTE, layout.ttl_attribute);
            println!("export {}={}", vars::CONTROL_QUEUE_URL, resources.control_queue_url);
            println!("export {}={}", vars::DESTINATIONS, destinations.join(","));
            println!(
                "# control dead-letter queue: {}",
                resources.control_dead_letter_queue_url
            );
            // Where the environment sends DynamoDB: the SDK's per-service endpoint, else the
            // shared one (a profile's endpoint settings are not looked at here).
            let dynamodb = ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|name| std::env::var(name).ok().map(|url| format!("{url} ({name})")))
                .unwrap_or_else(|| "the region's endpoint".to_owned());
            println!(
                "# table {} on DynamoDB at {dynamodb}, per the environment",
                layout.table
            );
            for (name, url) in &resources.delivery_queues {
                println!("# {name}: read the messages from {url}");
                // A consumer of this queue (outbox::consumer) keeps its dedup data for
                // what these queues really keep, plus the producer's re-send window (C4).
                let dead_letters = &resources.delivery_dead_letter_queues[name];
                match (
                    queue_retention(&clients.sqs, url).await,
                    queue_retention(&clients.sqs, dead_letters).await,
                ) {
                    (Ok(source), Ok(dead_letter)) => {
                        let retention = Retention {
                            source_queue: source,
                            dead_letter_queue: dead_letter,
                            resend_window: Duration::from_secs(24 * 3600),
                        };
                        println!(
                            "# a consumer of {name}: {}={url} {}={} {}={} (with the default 1-day {}: dedup data kept {} s from dispatch)",
                            consumer_vars::QUEUE_URL,
                            consumer_vars::SOURCE_RETENTION_SECONDS,
                            source.as_secs(),
                            consumer_vars::DLQ_RETENTION_SECONDS,
                            dead_letter.as_secs(),
                            consumer_vars::RESEND_WINDOW_SECONDS,
                            retention.derived().as_secs()
                        );
                    }
                    (Err(error), _) | (_, Err(error)) => return report(&error),
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => report(&error),
    }
}
