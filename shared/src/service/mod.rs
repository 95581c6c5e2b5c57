//! A service's whole `main` in one call (feature `service`): its settings from the
//! environment, its backend, its axum router under each request's deadline, served on
//! Lambda or on a local address by the environment, and a graceful stop that finishes
//! the work after each answer.
//!
//! On the embedded backend (no settings at all, or `OUTBOX_BACKEND=embedded`) the
//! service needs no AWS: the control worker and the service's consumers run in the same
//! process, on in-memory queues and table. That backend is one process's: nothing is
//! durable, and another process cannot reach it. On AWS (or the emulators), the control
//! worker and each consumer run as their own functions or processes, and registering a
//! consumer here only says so in the log.
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use outbox::consumer::{Handler, HandlerError, Incoming, Staging};
//! # async fn reserve() {}
//! struct Notify;
//! #[async_trait::async_trait]
//! impl Handler for Notify {
//!     async fn handle(&self, _message: &Incoming, _staging: &mut Staging) -> Result<(), HandlerError> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), outbox::service::ServiceError> {
//!     outbox::service::Service::from_env()?
//!         .consumer("notify", "events", Notify)?
//!         .serve(|_outbox| Router::new().route("/reservations", post(reserve)))
//!         .await
//! }
//! ```

mod embedded;
pub(crate) use embedded::queue_target;
mod error;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use tokio::sync::watch;

pub use error::ServiceError;

use crate::aws::{AwsBackend, BackendError};
use crate::consumer::{ConsumerName, Handler};
use crate::embedded::EmbeddedBackend;
use crate::http::{enforce_deadline, Deadlines};
use crate::ports::{Clock, SystemClock};
use crate::protocol::DestinationName;
use crate::request::Outbox;
use crate::settings::{Backend, Settings};

/// Where a local server listens, `OUTBOX_LISTEN_ADDR` (default `127.0.0.1:3000`).
pub const LISTEN_ADDR: &str = "OUTBOX_LISTEN_ADDR";

/// What `--help` says of a service's process ([`Service::from_env`]).
pub const SERVICE_USAGE: &str = "\
usage: a service on the outbox (no arguments; --help prints this)
It serves its routes, with the transaction status route, and runs its consumers in this
process on the embedded backend. On AWS it serves the routes alone, or, where
OUTBOX_CONSUMER_NAME names one of its consumers, it is that consumer.";

/// The address a local server listens on when [`LISTEN_ADDR`] is not set.
pub const DEFAULT_LISTEN_ADDR: &str = "127.0.0.1:3000";

/// The destination the embedded backend always has, besides those the settings name.
pub const DEFAULT_DESTINATION: &str = "events";

/// A consumer the service registered: its name, the destination it reads, its handler.
#[derive(Clone)]
struct Registered {
    name: ConsumerName,
    source: DestinationName,
    handler: Arc<dyn Handler>,
}

/// A service, from its settings to its running parts.
pub struct Service {
    settings: Settings,
    consumers: Vec<Registered>,
    /// Whether the service installed the process's logging (and so flushes it at its stop).
    owns_logging: bool,
}

impl Service {
    /// The registered consumer this process is, where it runs on AWS and
    /// `OUTBOX_CONSUMER_NAME` names one ([`Self::serve`]).
    fn consumer_of_this_process(&self) -> Result<Option<Arc<dyn Handler>>, ServiceError> {
        if matches!(self.settings.backend, Backend::Embedded) {
            return Ok(None);
        }
        let Ok(name) = std::env::var(crate::consumer::consumer_vars::NAME) else {
            return Ok(None);
        };
        match self.consumers.iter().find(|consumer| consumer.name.as_str() == name) {
            Some(consumer) => Ok(Some(consumer.handler.clone())),
            None => Err(ServiceError::NotAConsumer {
                name,
                registered: self
                    .consumers
                    .iter()
                    .map(|consumer| consumer.name.to_string())
                    .collect(),
            }),
        }
    }

    /// The service the environment describes (the `OUTBOX_*` variables; with none, the
    /// embedded backend), with the process's logging installed
    /// ([`crate::logging::init`]). Asked for help (`--help`, `-h`), it prints
    /// [`SERVICE_USAGE`] and the settings it reads, and ends the process.
    pub fn from_env() -> Result<Self, ServiceError> {
        crate::settings::help::print_if_asked(SERVICE_USAGE);
        crate::logging::init();
        let mut service = Self::new(Settings::from_env()?);
        service.owns_logging = true;
        Ok(service)
    }

    /// The service `settings` describe (logging is the caller's).
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            consumers: Vec::new(),
            owns_logging: false,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Registers `handler` as consumer `name` of destination `source`: on the embedded
    /// backend it runs in this process, each message handled exactly once in effect
    /// ([`crate::consumer`]); on AWS it is its own function (`outbox::consumer::serve`).
    /// One consumer per destination: a destination is one queue, whose messages its
    /// consumers would share rather than each get (on AWS, give each consumer its own
    /// queue behind a topic or a bus).
    pub fn consumer(mut self, name: &str, source: &str, handler: impl Handler + 'static) -> Result<Self, ServiceError> {
        let consumer = name.parse().map_err(|source| ServiceError::ConsumerName {
            name: name.to_owned(),
            source,
        })?;
        let source: DestinationName = source.parse().map_err(|_| ServiceError::Destination {
            name: source.to_owned(),
        })?;
        if let Some(first) = self.consumers.iter().find(|registered| registered.source == source) {
            return Err(ServiceError::SourceTaken {
                destination: source.to_string(),
                first: first.name.to_string(),
            });
        }
        self.consumers.push(Registered {
            name: consumer,
            source,
            handler: Arc::new(handler),
        });
        Ok(self)
    }

    /// Builds the backend and the request path, and on the embedded backend starts the
    /// control worker and the consumers in this process. On AWS the table is described
    /// first, and refused where this process must not write it ([`crate::aws::regions`]).
    pub async fn start(self) -> Result<Running, ServiceError> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (stop, stopped) = watch::channel(false);
        let Self {
            settings,
            consumers,
            owns_logging,
        } = self;
        match &settings.backend {
            Backend::Embedded => {
                let consumed: BTreeSet<DestinationName> =
                    consumers.iter().map(|consumer| consumer.source.clone()).collect();
                let backend = embedded::backend(&settings, clock.clone(), &consumed);
                let outbox = Outbox::from_settings(
                    backend.request_ports(clock.clone()),
                    &settings,
                    backend.publisher.clone(),
                );
                let mut tasks = vec![tokio::spawn(embedded::control_worker(
                    backend.clone(),
                    clock.clone(),
                    settings.timing,
                    stopped.clone(),
                ))];
                for consumer in consumers {
                    tasks.push(tokio::spawn(embedded::consumer(
                        backend.clone(),
                        clock.clone(),
                        consumer,
                        stopped.clone(),
                    )));
                }
                Ok(Running {
                    outbox,
                    embedded: Some(backend),
                    settings,
                    stop,
                    stopped,
                    tasks,
                    owns_logging,
                    consumed: consumed.into_iter().collect(),
                })
            }
            Backend::Aws { .. } => {
                // The table is described first: a process refused it starts nothing.
                let backend = match AwsBackend::from_settings(&settings).await {
                    Ok(backend) => backend,
                    Err(BackendError::Table(refused)) => return Err(refused.into()),
                    Err(other) => unreachable!("the settings name the aws backend: {other}"),
                };
                for consumer in &consumers {
                    tracing::info!(consumer = %consumer.name, source = %consumer.source,
                        "on AWS this consumer runs as its own function or process (this binary with OUTBOX_CONSUMER_NAME naming it, or outbox::consumer::serve), not in this process");
                }
                Ok(Running {
                    outbox: backend.outbox(&settings, clock),
                    embedded: None,
                    settings,
                    stop,
                    stopped,
                    tasks: Vec::new(),
                    owns_logging,
                    consumed: Vec::new(),
                })
            }
        }
    }

    /// Starts the service ([`Self::start`]), builds its router with `app` from the
    /// request path, and serves it until the process is asked to stop
    /// ([`Running::serve`]).
    ///
    /// On AWS (or the emulators), a process whose settings name one of the service's
    /// consumers (`OUTBOX_CONSUMER_NAME`, as its function's or its process's settings
    /// give it) is that consumer instead ([`crate::consumer::serve`]: inside Lambda its
    /// queue's events, elsewhere its poller): one binary deploys as the API and as each
    /// consumer, each function's settings saying which, with no switch of its own. A
    /// name the service does not register is refused.
    pub async fn serve(self, app: impl FnOnce(Outbox) -> Router) -> Result<(), ServiceError> {
        if let Some(handler) = self.consumer_of_this_process()? {
            let served = crate::consumer::serve(handler).await;
            if self.owns_logging {
                crate::logging::finish();
            }
            return served.map_err(ServiceError::Consumer);
        }
        let running = self.start().await?;
        let app = app(running.outbox.clone());
        running.serve(app).await
    }
}

/// A started service.
pub struct Running {
    /// The request path.
    pub outbox: Outbox,
    /// The embedded backend, when it is the one (its queues and table can be read).
    pub embedded: Option<EmbeddedBackend>,
    settings: Settings,
    stop: watch::Sender<bool>,
    stopped: watch::Receiver<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    owns_logging: bool,
    /// On the embedded backend, the destinations its consumers read.
    consumed: Vec<DestinationName>,
}

impl Running {
    /// `app` as the service serves it: with the ready status route
    /// (`GET /transactions/{id}`, [`crate::http::status`]), each request under its
    /// deadline (the Lambda invocation's, or `OUTBOX_API_TIMEOUT_SECONDS`), which the
    /// [`crate::http::RequestScope`] extractor needs, every answer that names a
    /// transaction linking its status (`Link: <…>; rel="status"`), and bodies over
    /// `OUTBOX_MAX_REQUEST_BYTES` refused, and requests without a verified caller
    /// answered as `OUTBOX_AUTH` says ([`crate::http::caller`]). `app` must not route `/transactions/{id}`
    /// itself (axum refuses two routes of one path), and a fallback of its own does not run
    /// under the deadline (it gets no [`crate::http::RequestScope`]).
    pub fn router(&self, app: Router) -> Router {
        let deadlines = Deadlines::new(self.outbox.clone(), self.settings.api_timeout)
            .with_status_links(crate::http::status::STATUS_PATH);
        app.merge(crate::http::status::routes())
            .route_layer(axum::middleware::from_fn_with_state(deadlines, enforce_deadline))
            // Unrouted paths and methods answer problem+json, as every error does.
            .layer(axum::middleware::from_fn(crate::http::problem_for_unrouted))
            .layer(DefaultBodyLimit::max(self.settings.max_request_bytes))
            .layer(axum::Extension(self.settings.authentication))
    }

    /// Serves `app` ([`Self::router`]): on Lambda (the runtime API is in the
    /// environment) through [`crate::http::lambda::run`], which holds each invocation's
    /// environment until the work after its answer is done; elsewhere on
    /// `OUTBOX_LISTEN_ADDR` until SIGINT or SIGTERM, then finishing the work after the
    /// last answers and stopping the in-process worker and consumers
    /// ([`Self::stop`]).
    pub async fn serve(self, app: Router) -> Result<(), ServiceError> {
        let app = self.router(app);
        if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
            crate::http::caller::announce(self.settings.authentication);
            let after_answer = self.outbox.after_answer().cloned();
            // Behind API Gateway's stage (a REST API, an HTTP API's named stage), the
            // routes match without it and the status links keep it.
            let app = crate::http::serve_under_stage(app);
            return crate::http::lambda::run(app, after_answer)
                .await
                .map_err(ServiceError::Lambda);
        }
        let text = std::env::var(LISTEN_ADDR).unwrap_or_else(|_| DEFAULT_LISTEN_ADDR.to_owned());
        let address: SocketAddr = text.parse().map_err(|_| ServiceError::ListenAddr { text })?;
        self.settings
            .check_listen_address(address)
            .map_err(|error| crate::settings::SettingsError { errors: vec![error] })?;
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| ServiceError::Listen { address, source })?;
        self.serve_on(listener, app, signal()).await
    }

    /// Serves `app` as is on `listener` until `shutdown` completes, then stops
    /// ([`Self::stop`]).
    pub async fn serve_on(
        self,
        listener: tokio::net::TcpListener,
        app: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServiceError> {
        let address = listener.local_addr().ok();
        tracing::info!(?address, backend = self.backend_name(), "serving");
        let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
        self.stop().await;
        served.map_err(ServiceError::Serve)
    }

    /// Stops: the work after the answers finishes (bounded by the API timeout; on AWS
    /// what is cut off is the control worker's), then the in-process control worker and
    /// consumers stop receiving, hand back what they took and did not start, and finish
    /// what they started. On the embedded backend, whose queues go with the process, the
    /// consumers first take what their destinations hold (bounded by the API timeout);
    /// whatever is left then (control messages not due yet, work cut off) is lost with
    /// the process: it is not durable.
    pub async fn stop(self) {
        if let Some(after) = self.outbox.after_answer() {
            if !after.idle_within(self.settings.api_timeout).await {
                tracing::warn!(
                    running = after.running(),
                    "stopping with publishing after the answer unfinished; the control worker publishes the rest"
                );
            }
        }
        if let Some(backend) = &self.embedded {
            embedded::drain(backend, &self.consumed, self.settings.api_timeout).await;
        }
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        drop(self.stopped);
        if self.owns_logging {
            crate::logging::finish();
        }
    }

    /// Whether a consumer in this process reads `destination` (embedded backend).
    #[cfg(feature = "testing")]
    pub(crate) fn consumes(&self, destination: &DestinationName) -> bool {
        self.consumed.contains(destination)
    }

    fn backend_name(&self) -> &'static str {
        match self.embedded {
            Some(_) => "embedded",
            None => "aws",
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("stopping: finishing what was started");
}
