//! `control-worker bootstrap`: creates what `template.yaml` declares for a stack on the
//! emulators (or an account) and prints, as `export` lines, the settings that point the
//! API and the worker at it, or with `--consumer NAME` those of a consumer (such as the
//! worked one, `examples/shipping`: `--consumer shipping --publishes shipments`).

use std::process::ExitCode;
use std::time::Duration;

use crate::aws::{
    bootstrap, load_sdk_config, AwsClients, BootstrappedConsumer, ConsumerResource, ResourceNames, Resources,
    SortKeyValue,
};
use crate::consumer::{consumer_vars, ConsumerName, Retention};
use crate::protocol::DestinationName;
use crate::settings::{layout_from_env, vars, write_region_from_lookup};

use super::report;

/// What `bootstrap` was asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The stack whose names to use.
    pub stack: &'a str,
    /// How the `events` destination is published: `sqs`, `sqs-fifo`, `sns` or
    /// `eventbridge`.
    pub events_via: &'a str,
    /// The consumer whose settings to print rather than the API's and the worker's.
    pub consumer: Option<ConsumerRequest>,
    /// Where to write the same settings as an environment file of this process alone
    /// (`--env-file PATH`).
    pub env_file: Option<&'a str>,
}

/// The consumer that `--consumer NAME [--source DEST] [--publishes DEST]...` names.
#[derive(Debug, PartialEq, Eq)]
pub struct ConsumerRequest {
    /// Its name.
    pub name: ConsumerName,
    /// The destination whose queue it reads (`events` unless `--source` names another).
    pub source: DestinationName,
    /// The destinations it publishes to, each on a queue of its own.
    pub publishes: Vec<DestinationName>,
}

impl<'a> Request<'a> {
    /// Reads `[STACK] [--events-via sqs|sqs-fifo|sns|eventbridge] [--consumer NAME [--source DEST]
    /// [--publishes DEST]...] [--env-file PATH]`; the error says what is wrong with the
    /// arguments.
    pub fn parse(args: &[&'a str]) -> Result<Self, String> {
        let mut request = Request {
            stack: "outbox",
            events_via: "sqs",
            consumer: None,
            env_file: None,
        };
        let mut stack_seen = false;
        let mut name = None;
        let mut source = None;
        let mut publishes = Vec::new();
        let mut args = args.iter();
        while let Some(&arg) = args.next() {
            let mut value = || args.next().copied().ok_or_else(|| format!("{arg} takes a value"));
            match arg {
                "--events-via" => request.events_via = value()?,
                "--env-file" => request.env_file = Some(value()?),
                "--consumer" if name.is_some() => return Err("--consumer is given twice".to_owned()),
                "--consumer" => name = Some(value()?.parse::<ConsumerName>().map_err(|e| e.to_string())?),
                "--source" if source.is_some() => return Err("--source is given twice".to_owned()),
                "--source" => source = Some(destination(value()?)?),
                "--publishes" => publishes.push(destination(value()?)?),
                flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
                stack if !stack_seen => {
                    request.stack = stack;
                    stack_seen = true;
                }
                extra => return Err(format!("unexpected argument {extra:?}")),
            }
        }
        match name {
            Some(name) => {
                request.consumer = Some(ConsumerRequest {
                    name,
                    source: source.unwrap_or_else(|| "events".parse().expect("valid name")),
                    publishes,
                });
            }
            None if source.is_some() || !publishes.is_empty() => {
                return Err("--source and --publishes go with --consumer NAME".to_owned());
            }
            None => {}
        }
        Ok(request)
    }
}

/// A destination's name from the command line.
fn destination(text: &str) -> Result<DestinationName, String> {
    text.parse()
        .map_err(|error: crate::protocol::InvalidDestination| error.to_string())
}

/// Creates what is missing and prints the settings.
pub async fn run(request: Request<'_>, usage: &str) -> ExitCode {
    let Some(mut names) = ResourceNames::for_stack(request.stack).with_events_via(request.events_via) else {
        eprintln!(
            "--events-via takes sqs, sqs-fifo, sns or eventbridge, not {:?}\n{usage}",
            request.events_via
        );
        return ExitCode::from(2);
    };
    if let Some(consumer) = &request.consumer {
        names = names.with_consumer(ConsumerResource::for_stack(
            request.stack,
            consumer.name.clone(),
            consumer.source.clone(),
            consumer.publishes.iter().cloned(),
        ));
    }
    names.layout = match layout_from_env(&names.layout.table) {
        Ok(layout) => layout,
        Err(error) => return report(&error),
    };
    // An existing table replicated to other Regions is refused unless this Region is the
    // one named to write it, as every process refuses it.
    names.write_region = match write_region_from_lookup(|name| std::env::var(name).ok()) {
        Ok(region) => region,
        Err(error) => return report(&error),
    };
    let clients = AwsClients::new(&load_sdk_config(Duration::from_secs(10)).await);
    let resources = match bootstrap(&clients, &names).await {
        Ok(resources) => resources,
        Err(error) => return report(&error),
    };
    let mut out = Vec::new();
    print_table(&resources, &mut out);
    let status = match &resources.consumer {
        Some(consumer) => {
            print_consumer(consumer, &mut out);
            ExitCode::SUCCESS
        }
        None => {
            let again = match request.events_via {
                "sqs" => request.stack.to_owned(),
                kind => format!("{} --events-via {kind}", request.stack),
            };
            print_producer(&clients, &resources, &again, &mut out).await
        }
    };
    for line in &out {
        println!("{line}");
    }
    match request.env_file.filter(|_| status == ExitCode::SUCCESS) {
        Some(path) => match std::fs::write(path, env_file(&out)) {
            Ok(()) => status,
            Err(error) => {
                eprintln!("could not write {path}: {error}");
                ExitCode::FAILURE
            }
        },
        None => status,
    }
}

/// The settings among `lines` as an environment file of this process alone: `NAME=value`
/// lines, for `env $(cat FILE) COMMAND`, `set -a; . FILE`, or `cargo lambda watch
/// --env-file FILE`, so that each process's settings live side by side.
fn env_file(lines: &[String]) -> String {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix("export "))
        .map(|setting| format!("{setting}\n"))
        .collect()
}

/// The backend and the table's layout: the same for every binary.
fn print_table(resources: &Resources, out: &mut Vec<String>) {
    out.push(format!("export {}=aws", vars::BACKEND));
    let layout = &resources.layout;
    out.push(format!("export {}={}", vars::TABLE_NAME, layout.table));
    out.push(format!("export {}={}", vars::PARTITION_KEY, layout.partition_key));
    if let Some(sort_key) = &layout.sort_key {
        out.push(format!("export {}={}", vars::SORT_KEY, sort_key.attribute));
        if let SortKeyValue::Constant(value) = &sort_key.value {
            out.push(format!("export {}={value}", vars::SORT_KEY_VALUE));
        }
    }
    out.push(format!("export {}={}", vars::TTL_ATTRIBUTE, layout.ttl_attribute));
    if let Some(region) = &resources.write_region {
        out.push(format!("export {}={region}", vars::WRITE_REGION));
    }
}

/// The settings of the API and the worker; `again` is how to name this bootstrap again.
async fn print_producer(clients: &AwsClients, resources: &Resources, again: &str, out: &mut Vec<String>) -> ExitCode {
    let destinations: Vec<String> = resources
        .destinations
        .iter()
        .map(|(name, target)| format!("{name}={target}"))
        .collect();
    out.push(format!(
        "export {}={}",
        vars::CONTROL_QUEUE_URL,
        resources.control_queue_url
    ));
    out.push(format!("export {}={}", vars::DESTINATIONS, destinations.join(",")));
    out.push(format!(
        "# control dead-letter queue: {}",
        resources.control_dead_letter_queue_url
    ));
    // Where the environment sends DynamoDB: the SDK's per-service endpoint, else the
    // shared one (a profile's endpoint settings are not looked at here).
    let dynamodb = ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"]
        .iter()
        .find_map(|name| std::env::var(name).ok().map(|url| format!("{url} ({name})")))
        .unwrap_or_else(|| "the region's endpoint".to_owned());
    out.push(format!(
        "# table {} on DynamoDB at {dynamodb}, per the environment",
        resources.layout.table
    ));
    for (name, url) in &resources.delivery_queues {
        out.push(format!("# {name}: read the messages from {url}"));
        // A consumer of this queue keeps its dedup data for what these queues really
        // keep, plus the producer's re-send window (C4).
        let (source, dead_letter) = match resources.delivery_retention(clients, name).await {
            Ok(retention) => retention,
            Err(error) => return report(&error),
        };
        let retention = Retention {
            source_queue: source,
            dead_letter_queue: dead_letter,
            resend_window: Duration::from_secs(24 * 3600),
        };
        out.push(format!(
            "# a consumer of {name}: {}={url} {}={} {}={} (with the default 1-day {}: dedup data kept {} s from dispatch)",
            consumer_vars::QUEUE_URL,
            consumer_vars::SOURCE_RETENTION_SECONDS,
            source.as_secs(),
            consumer_vars::DLQ_RETENTION_SECONDS,
            dead_letter.as_secs(),
            consumer_vars::RESEND_WINDOW_SECONDS,
            retention.derived().as_secs()
        ));
    }
    out.push(format!(
        "# a consumer's settings: control-worker bootstrap {again} --consumer NAME [--source DEST] [--publishes DEST]..."
    ));
    out.push(format!(
        "#   (the worked consumer's: control-worker bootstrap {again} --consumer shipping --publishes shipments)"
    ));
    ExitCode::SUCCESS
}

/// The settings of the consumer, and where it publishes.
fn print_consumer(consumer: &BootstrappedConsumer, out: &mut Vec<String>) {
    for (variable, value) in consumer.variables() {
        out.push(format!("export {variable}={value}"));
    }
    for (name, target) in &consumer.destinations {
        out.push(format!("# {name}: the consumer publishes to {target}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_holds_the_settings_alone_and_is_asked_for_by_path() {
        let lines = [
            "export OUTBOX_BACKEND=aws".to_owned(),
            "# table t on DynamoDB".to_owned(),
            "export OUTBOX_DESTINATIONS=shipments=sqs:http://q".to_owned(),
        ];
        assert_eq!(
            env_file(&lines),
            "OUTBOX_BACKEND=aws\nOUTBOX_DESTINATIONS=shipments=sqs:http://q\n"
        );
        let request = Request::parse(&["outbox", "--consumer", "shipping", "--env-file", "shipping.env"]).unwrap();
        assert_eq!(request.env_file, Some("shipping.env"));
        assert_eq!(Request::parse(&["outbox"]).unwrap().env_file, None);
        assert!(Request::parse(&["outbox", "--env-file"])
            .unwrap_err()
            .contains("takes a value"));
    }

    fn consumer(args: &[&str]) -> ConsumerRequest {
        Request::parse(args)
            .expect("valid arguments")
            .consumer
            .expect("a consumer")
    }

    #[test]
    fn a_consumer_is_any_name_with_its_source_and_destinations() {
        let billing = consumer(&[
            "stack",
            "--consumer",
            "billing",
            "--source",
            "shipments",
            "--publishes",
            "invoices",
            "--publishes",
            "audit",
        ]);
        assert_eq!(billing.name.as_str(), "billing");
        assert_eq!(billing.source.as_str(), "shipments");
        let publishes: Vec<&str> = billing.publishes.iter().map(DestinationName::as_str).collect();
        assert_eq!(publishes, ["invoices", "audit"]);
        // The worked consumer, as the scripts name it: its source is `events` by default.
        let shipping = consumer(&["outbox", "--consumer", "shipping", "--publishes", "shipments"]);
        assert_eq!(
            (shipping.name.as_str(), shipping.source.as_str()),
            ("shipping", "events")
        );
        let request = Request::parse(&["outbox", "--events-via", "sns"]).unwrap();
        assert_eq!(
            (request.stack, request.events_via, request.consumer),
            ("outbox", "sns", None)
        );
    }

    #[test]
    fn wrong_consumer_arguments_are_refused_with_the_reason() {
        for (args, reason) in [
            (&["outbox", "--consumer"][..], "--consumer takes a value"),
            (&["outbox", "--consumer", "has space"], "consumer name"),
            (&["outbox", "--consumer", "a", "--consumer", "b"], "twice"),
            (&["outbox", "--consumer", "a", "--publishes", "bad.name"], "bad.name"),
            (&["outbox", "--publishes", "shipments"], "go with --consumer NAME"),
            (&["outbox", "--source", "events"], "go with --consumer NAME"),
            (
                &["outbox", "--consumer", "a", "--source", "x", "--source", "y"],
                "twice",
            ),
            (&["outbox", "other"], "unexpected argument"),
            (&["outbox", "--nope"], "unknown option"),
        ] {
            let error = Request::parse(args).expect_err(&format!("{args:?} accepted"));
            assert!(error.contains(reason), "{args:?}: {error}");
        }
    }
}
