//! The control worker's binary. For now it offers the local resource bootstrap; the
//! Lambda handler and the local poller come with the control worker itself.
//!
//! `control-worker bootstrap [STACK]` creates (or finds) the table and queues that
//! `template.yaml` declares for stack STACK (default `outbox`), on AWS or on whatever
//! `AWS_ENDPOINT_URL` names, and prints the settings that point the binaries at them.

use std::process::ExitCode;
use std::time::Duration;

use outbox::aws::{bootstrap, load_sdk_config, AwsClients, ResourceNames};
use outbox::settings::vars;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stack = match args.as_slice() {
        [command] if command == "bootstrap" => "outbox".to_owned(),
        [command, stack] if command == "bootstrap" => stack.clone(),
        _ => {
            eprintln!("usage: control-worker bootstrap [STACK]");
            return ExitCode::from(2);
        }
    };
    let clients = AwsClients::new(&load_sdk_config(Duration::from_secs(10)).await);
    match bootstrap(&clients, &ResourceNames::for_stack(&stack)).await {
        Ok(resources) => {
            let destinations: Vec<String> = resources
                .destinations
                .iter()
                .map(|(name, url)| format!("{name}={url}"))
                .collect();
            println!("export {}=aws", vars::BACKEND);
            println!("export {}={}", vars::TABLE_NAME, resources.table);
            println!("export {}={}", vars::CONTROL_QUEUE_URL, resources.control_queue_url);
            println!("export {}={}", vars::DESTINATIONS, destinations.join(","));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("bootstrap failed: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
