//! The billing consumer's binary: inside Lambda it handles the shipments queue's SQS
//! events; elsewhere it polls `OUTBOX_CONSUMER_QUEUE_URL`. Its settings are the
//! `OUTBOX_*` and `OUTBOX_CONSUMER_*` variables (docs/GUIDE.md, "Consumers: handle messages exactly once").

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;

#[tokio::main]
async fn main() -> ExitCode {
    outbox::logging::init();
    let served = outbox::consumer::serve(Arc::new(billing::Billing)).await;
    outbox::logging::finish();
    let Err(error) = served else {
        return ExitCode::SUCCESS;
    };
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text = format!("{text}: {inner}");
        cause = inner.source();
    }
    eprintln!("error: {text}");
    ExitCode::FAILURE
}
