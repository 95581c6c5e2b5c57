//! The API's binary: on Lambda (the runtime API is in the environment, as on AWS and
//! under `cargo lambda watch`) it serves the router through `outbox::http::lambda::run`
//! (`lambda_http`, and the extension that publishing after the answer needs); elsewhere it
//! listens on `OUTBOX_LISTEN_ADDR` (default 127.0.0.1:3000). With no settings it runs on
//! the embedded backend with the control worker in process.

use std::net::SocketAddr;
use std::process::ExitCode;

use api::app::router;
use api::runtime::{http_config, start};
use outbox::settings::Settings;
use tokio::sync::watch;

const LISTEN_ADDR: &str = "OUTBOX_LISTEN_ADDR";

async fn signal(stop: watch::Sender<bool>) {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    let _ = stop.send(true);
}

#[tokio::main]
async fn main() -> ExitCode {
    outbox::settings::help::print_if_asked(
        "usage: api (no arguments; --help prints this)\n\
         The orders API: its routes on OUTBOX_LISTEN_ADDR (default 127.0.0.1:3000), or inside Lambda\n\
         through API Gateway; with no settings on the embedded backend, its control worker in this\n\
         process.",
    );
    let on_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    outbox::logging::init();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let address: SocketAddr = match std::env::var(LISTEN_ADDR)
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
    {
        Ok(address) => address,
        Err(error) => {
            eprintln!("error: {LISTEN_ADDR}: must be an address such as 127.0.0.1:3000 ({error})");
            return ExitCode::from(2);
        }
    };
    if !on_lambda {
        if let Err(error) = settings.check_listen_address(address) {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    }
    let (stop, stopped) = watch::channel(false);
    let wait_for_stop = |mut stopped: watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    tokio::spawn(signal(stop));
    let parts = match start(&settings, wait_for_stop(stopped.clone())).await {
        Ok(parts) => parts,
        Err(refused) => {
            eprintln!("error: {refused}");
            let mut source = std::error::Error::source(&refused);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            return ExitCode::FAILURE;
        }
    };
    let after_answer = parts.state.outbox.after_answer().cloned();
    let app = router(parts.state, &http_config(&settings));
    if on_lambda {
        outbox::http::caller::announce(settings.authentication);
        return match outbox::http::lambda::run(app, after_answer).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {address}: {error}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%address, "serving the orders API (POST /orders, GET /openapi.json)");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(wait_for_stop(stopped))
        .await;
    // What was left for after the answers goes out before the process ends, however the
    // server stopped (bounded: the control worker publishes whatever is cut off).
    if let Some(after) = after_answer {
        if !after.idle_within(settings.api_timeout).await {
            tracing::warn!(
                running = after.running(),
                "stopping with publishing after the answer unfinished; the control worker publishes the rest"
            );
        }
    }
    if let Err(error) = served {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    if let Some(worker) = parts.worker {
        let _ = worker.await;
    }
    outbox::logging::finish();
    ExitCode::SUCCESS
}
