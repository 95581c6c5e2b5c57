//! From settings to a running service: the state the router needs and, on the embedded
//! backend, the control worker running in the same process and logging every message it
//! dispatches, so that one command shows the whole loop.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use outbox::aws::{AwsBackend, BackendError, RegionError};
use outbox::control::poller;
use outbox::control::{ControlPath, ControlPorts};
use outbox::destination::Target;
use outbox::embedded::EmbeddedBackend;
use outbox::ports::{Clock, EntryFailure, PublishError, Publisher, SystemClock};
use outbox::protocol::{DestinationName, OutgoingMessage};
use outbox::request::Outbox;
use outbox::settings::{Backend, Settings};

use crate::app::HttpConfig;
use crate::state::AppState;

/// The destination of order events.
pub const EVENTS: &str = "events";

/// Events each embedded destination keeps for inspection (nobody receives from them in
/// the server; every event is in the log as it is dispatched).
pub const KEPT_EVENTS: usize = 1000;

/// A publisher that logs each message its inner publisher accepted.
pub struct LoggingPublisher {
    inner: Arc<dyn Publisher>,
}

#[async_trait]
impl Publisher for LoggingPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let failures = self.inner.send_batch(destination, messages).await?;
        for message in messages.iter().filter(|m| !failures.iter().any(|f| f.id == m.id)) {
            // Its place in its order's history, where it has one ("-" where not).
            let (entity, seq) = match &message.position {
                Some(position) => (position.entity.to_string(), position.seq.to_string()),
                None => ("-".to_owned(), "-".to_owned()),
            };
            tracing::info!(%destination, message_id = %message.id, txn_id = %message.txn_id, %entity, %seq, body = %message.body, "dispatched message");
        }
        Ok(failures)
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        self.inner.entry_bytes(destination, message)
    }

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

/// How often the embedded server logs what it holds (while it works).
const HELD_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Logs what the embedded backend holds in memory: the application's items (they stay),
/// the protocol's records (they expire), and the control and destination queues.
fn log_held(backend: &EmbeddedBackend) {
    let sizes = backend.store.sizes();
    let destinations: usize = backend.publisher.destinations().values().map(|queue| queue.len()).sum();
    let dropped: usize = backend
        .publisher
        .destinations()
        .values()
        .map(|queue| queue.dropped())
        .sum();
    tracing::info!(
        business_items = sizes.business_items,
        records = sizes.records,
        control_messages = backend.control_queue.queue().len(),
        events_kept = destinations,
        events_dropped = dropped,
        "embedded backend holds"
    );
}

/// The HTTP configuration from the settings.
pub fn http_config(settings: &Settings) -> HttpConfig {
    HttpConfig {
        timeout: settings.api_timeout,
        max_body_bytes: settings.max_request_bytes,
        cors_origins: settings.cors_allowed_origins.clone(),
        authentication: settings.authentication,
    }
}

/// The running parts: the state for the router, and the in-process worker when there
/// is one (it stops when `shutdown` completes).
pub struct Parts {
    /// The router's state.
    pub state: AppState,
    /// The embedded backend's control worker.
    pub worker: Option<tokio::task::JoinHandle<()>>,
    /// The embedded backend, when it is the one: its destinations can be read.
    pub embedded: Option<EmbeddedBackend>,
}

/// Builds the state for `settings`. On AWS the table is described first, and refused
/// where this process must not write it (replicated to other Regions without
/// `OUTBOX_WRITE_REGION` naming this one, or strongly consistent across Regions).
pub async fn start(
    settings: &Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Parts, RegionError> {
    let events: DestinationName = EVENTS.parse().expect("valid name");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    match &settings.backend {
        Backend::Embedded => {
            // Every destination the settings name, whatever its kind, plus `events` (the
            // orders' destination) when they name none.
            let mut destinations = settings.destinations.clone();
            destinations.entry(events.clone()).or_insert_with(|| Target::SqsQueue {
                url: "embedded://events".into(),
                fifo: false,
            });
            let backend = EmbeddedBackend::for_server(clock.clone(), &destinations, KEPT_EVENTS);
            tracing::info!(
                retention_seconds = settings.timing.retention.as_secs(),
                kept_events = KEPT_EVENTS,
                "embedded backend: finished records are kept {}s ({}), each destination its last {KEPT_EVENTS} events",
                settings.timing.retention.as_secs(),
                outbox::settings::vars::RETENTION_SECONDS,
            );
            let publisher: Arc<dyn Publisher> = Arc::new(LoggingPublisher {
                inner: backend.publisher.clone(),
            });
            let outbox = Outbox::from_settings(backend.request_ports(clock.clone()), settings, publisher.clone());
            let ports = ControlPorts {
                publisher,
                ..backend.control_ports(clock.clone())
            };
            let control = ControlPath::new(ports, settings.timing);
            let inbox = backend.control_queue.clone();
            let held = backend.clone();
            let worker = tokio::spawn(async move {
                tracing::info!("control worker running in process (embedded backend)");
                let mut last_report = std::time::Instant::now();
                let on_batch = |report: &outbox::control::BatchReport| {
                    for item in &report.items {
                        if let Err(error) = &item.result {
                            tracing::warn!(message_id = %item.message_id, error = %error, "control message failed");
                        }
                    }
                    if last_report.elapsed() >= HELD_REPORT_EVERY {
                        last_report = std::time::Instant::now();
                        log_held(&held);
                    }
                };
                // Leased for the embedded queue's visibility timeout, as a worker on SQS
                // leases for the control queue's.
                let lease = inbox.queue().config().visibility_timeout;
                poller::run(
                    inbox.as_ref(),
                    &control,
                    std::time::Duration::from_millis(500),
                    lease,
                    shutdown,
                    on_batch,
                )
                .await;
            });
            Ok(Parts {
                state: AppState {
                    outbox: Arc::new(outbox),
                    events,
                },
                worker: Some(worker),
                embedded: Some(backend),
            })
        }
        Backend::Aws { .. } => {
            let backend = match AwsBackend::from_settings(settings).await {
                Ok(backend) => backend,
                Err(BackendError::Table(refused)) => return Err(refused),
                Err(other) => unreachable!("the settings name the aws backend: {other}"),
            };
            let outbox = backend.outbox(settings, clock);
            Ok(Parts {
                state: AppState {
                    outbox: Arc::new(outbox),
                    events,
                },
                worker: None,
                embedded: None,
            })
        }
    }
}
