//! The shop's binary: on Lambda it serves the router through `outbox::http::lambda::run`
//! (`lambda_http`, and the extension that publishing after the answer needs); elsewhere it
//! listens on `SHOP_LISTEN_ADDR` (default 127.0.0.1:3001). It needs DynamoDB and SQS (or
//! the emulator through `AWS_ENDPOINT_URL`): native actions have no embedded backend.
//! Settings: the `OUTBOX_*` variables (the table is the shop's own), and
//! `SHOP_EVENTS_DESTINATION` (default `events`).

use std::process::ExitCode;

use outbox::aws::load_sdk_config;
use outbox::settings::{Backend, Settings};
use outbox::wiring::native_outbox;
use shop::catalog::DynamoCatalog;
use shop::{router, Shop};

#[tokio::main]
async fn main() -> ExitCode {
    outbox::settings::help::print_if_asked(
        "usage: shop (no arguments; --help prints this)\n\
         The shop: native DynamoDB actions beside the outbox, on SHOP_LISTEN_ADDR (default\n\
         127.0.0.1:3001) or inside Lambda; it needs DynamoDB and SQS (SHOP_EVENTS_DESTINATION, default events).",
    );
    outbox::logging::init();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let sdk = load_sdk_config(settings.sdk_operation_timeout).await;
    let outbox = match native_outbox(&settings, &sdk).await {
        Ok(outbox) => outbox,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let Backend::Aws { layout, .. } = &settings.backend else {
        unreachable!("native_outbox accepted the settings")
    };
    let events = std::env::var("SHOP_EVENTS_DESTINATION").unwrap_or_else(|_| "events".into());
    let events = match events.parse() {
        Ok(events) => events,
        Err(error) => {
            eprintln!("error: SHOP_EVENTS_DESTINATION: {error}");
            return ExitCode::from(2);
        }
    };
    let after_answer = outbox.outbox().after_answer().cloned();
    let catalog = DynamoCatalog::new(aws_sdk_dynamodb::Client::new(&sdk), layout.table.clone());
    let shop = Shop {
        outbox,
        catalog: std::sync::Arc::new(catalog.clone()),
        writes: catalog,
        events,
    };
    let app = router(shop, settings.api_timeout);
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        return match outbox::http::lambda::run(app, after_answer).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let address = std::env::var("SHOP_LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3001".into());
    let listener = match tokio::net::TcpListener::bind(&address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {address}: {error}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%address, "serving the shop (POST /products/{{sku}}/reservations)");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    // What was left for after the answers goes out before the process ends (bounded).
    if let Some(after) = after_answer {
        after.idle_within(settings.api_timeout).await;
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
