//! `control-worker bootstrap`: creates what `template.yaml` declares for a stack on the
//! emulators (or an account) and prints, as `export` lines, the settings that point the
//! API and the worker at it, or with `--consumer` those of the worked consumer
//! (`examples/shipping`).

use std::process::ExitCode;
use std::time::Duration;

use outbox::aws::{bootstrap, load_sdk_config, queue_retention, AwsClients, ResourceNames, Resources, SortKeyValue};
use outbox::consumer::{consumer_vars, Retention};
use outbox::settings::{layout_from_env, vars};

use crate::report;

/// What `bootstrap` was asked for.
pub struct Request<'a> {
    /// The stack whose names to use.
    pub stack: &'a str,
    /// How the `events` destination is published: `sqs`, `sns` or `eventbridge`.
    pub events_via: &'a str,
    /// Print the consumer's settings rather than the API's and the worker's.
    pub consumer: bool,
}

impl<'a> Request<'a> {
    /// Reads `[STACK] [--events-via sqs|sns|eventbridge] [--consumer]`; `None` when the
    /// arguments are not that.
    pub fn parse(args: &[&'a str]) -> Option<Self> {
        let mut request = Request {
            stack: "outbox",
            events_via: "sqs",
            consumer: false,
        };
        let mut stack_seen = false;
        let mut args = args.iter();
        while let Some(&arg) = args.next() {
            match arg {
                "--events-via" => request.events_via = args.next()?,
                "--consumer" => request.consumer = true,
                flag if flag.starts_with('-') => return None,
                stack if !stack_seen => {
                    request.stack = stack;
                    stack_seen = true;
                }
                _ => return None,
            }
        }
        Some(request)
    }
}

/// Creates what is missing and prints the settings.
pub async fn run(request: Request<'_>, usage: &str) -> ExitCode {
    let Some(mut names) = ResourceNames::for_stack(request.stack).with_events_via(request.events_via) else {
        eprintln!(
            "--events-via takes sqs, sns or eventbridge, not {:?}\n{usage}",
            request.events_via
        );
        return ExitCode::from(2);
    };
    names.layout = match layout_from_env(&names.layout.table) {
        Ok(layout) => layout,
        Err(error) => return report(&error),
    };
    let clients = AwsClients::new(&load_sdk_config(Duration::from_secs(10)).await);
    let resources = match bootstrap(&clients, &names).await {
        Ok(resources) => resources,
        Err(error) => return report(&error),
    };
    print_table(&resources);
    if request.consumer {
        return print_consumer(&clients, &names, &resources, request.stack).await;
    }
    let again = match request.events_via {
        "sqs" => request.stack.to_owned(),
        kind => format!("{} --events-via {kind}", request.stack),
    };
    print_producer(&clients, &resources, &again).await
}

/// The backend and the table's layout: the same for every binary.
fn print_table(resources: &Resources) {
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
}

/// The settings of the API and the worker; `again` is how to name this bootstrap again.
async fn print_producer(clients: &AwsClients, resources: &Resources, again: &str) -> ExitCode {
    let destinations: Vec<String> = resources
        .destinations
        .iter()
        .map(|(name, target)| format!("{name}={target}"))
        .collect();
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
        resources.layout.table
    );
    for (name, url) in &resources.delivery_queues {
        println!("# {name}: read the messages from {url}");
        // A consumer of this queue keeps its dedup data for what these queues really
        // keep, plus the producer's re-send window (C4).
        let (source, dead_letter) = match source_retention(clients, resources, name).await {
            Ok(retention) => retention,
            Err(error) => return report(&error),
        };
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
    println!("# the shipping consumer's settings: control-worker bootstrap {again} --consumer");
    ExitCode::SUCCESS
}

/// The settings of the worked consumer: its name, its source queue and both queues'
/// real retention, and its own destinations.
async fn print_consumer(clients: &AwsClients, names: &ResourceNames, resources: &Resources, stack: &str) -> ExitCode {
    let Some(consumer) = &names.consumer else {
        eprintln!("stack {stack} has no consumer");
        return ExitCode::FAILURE;
    };
    let Some(source_url) = resources.delivery_queues.get(&consumer.source) else {
        eprintln!("the consumer's source {} has no queue", consumer.source);
        return ExitCode::FAILURE;
    };
    let (source, dead_letter) = match source_retention(clients, resources, &consumer.source).await {
        Ok(retention) => retention,
        Err(error) => return report(&error),
    };
    let destinations: Vec<String> = resources
        .consumer_destinations
        .iter()
        .map(|(name, target)| format!("{name}={target}"))
        .collect();
    println!("export {}={}", consumer_vars::NAME, consumer.name);
    println!("export {}={source_url}", consumer_vars::QUEUE_URL);
    println!(
        "export {}={}",
        consumer_vars::SOURCE_RETENTION_SECONDS,
        source.as_secs()
    );
    println!(
        "export {}={}",
        consumer_vars::DLQ_RETENTION_SECONDS,
        dead_letter.as_secs()
    );
    println!("export {}={}", vars::DESTINATIONS, destinations.join(","));
    for (name, target) in &resources.consumer_destinations {
        println!("# {name}: the consumer publishes to {target}");
    }
    ExitCode::SUCCESS
}

/// The real retention of a destination's queue and of its dead-letter queue.
async fn source_retention(
    clients: &AwsClients,
    resources: &Resources,
    destination: &outbox::protocol::DestinationName,
) -> Result<(Duration, Duration), outbox::ports::QueueError> {
    let url = &resources.delivery_queues[destination];
    let dead_letters = &resources.delivery_dead_letter_queues[destination];
    Ok((
        queue_retention(&clients.sqs, url).await?,
        queue_retention(&clients.sqs, dead_letters).await?,
    ))
}
