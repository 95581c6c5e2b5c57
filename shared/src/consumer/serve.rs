//! A consumer's process from its settings (feature `consumer`): inside Lambda, the SQS
//! event handler with partial batch responses (several batches at once on Lambda Managed
//! Instances); elsewhere, the local poller on `OUTBOX_CONSUMER_QUEUE_URL` until SIGINT or
//! SIGTERM, the batch in hand finished first and the open long poll waited out (what it
//! takes is handed back).
//! A service's `main` is then one call: `outbox::consumer::serve(handler).await`.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, LambdaEvent};

use super::settings::{consumer_vars, ConsumerBackend, ConsumerSettings};
use super::{Consumer, ConsumerPorts, Handler, Inbox, RetentionError};
use crate::aws::{load_sdk_config, AwsClients, AwsPublisher, DynamoStore, SqsInbox};
use crate::ports::{Clock, QueueError, RandomIds, SystemClock};
use crate::settings::{vars, SettingsError};

/// How long one receive of the local poller waits: SQS's longest long poll.
pub const LONG_POLL_WAIT: Duration = Duration::from_secs(20);

/// Why a consumer cannot start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A setting is wrong.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A consumer process runs against AWS (or the emulators): an embedded producer's
    /// queues live inside the producer's process.
    #[error(
        "a consumer process needs {}=aws; on the embedded backend, run the consumer inside the producer's process",
        vars::BACKEND
    )]
    EmbeddedBackend,
    /// Outside Lambda, the poller needs its queue.
    #[error(
        "{} is required outside Lambda: the queue the local poller receives from",
        consumer_vars::QUEUE_URL
    )]
    NoQueue,
    /// The source queue keeps messages longer than the consumer keeps their dedup data.
    #[error("the source queue {queue_url} refuses this consumer's retention")]
    Retention {
        /// The queue.
        queue_url: String,
        /// Both figures.
        #[source]
        source: RetentionError,
    },
    /// The source queue's attributes could not be read at start-up.
    #[error("reading the source queue's retention failed")]
    QueueAttributes(#[source] QueueError),
    /// The local poller could not read the source queue's visibility timeout, its lease.
    #[error("reading the source queue's visibility timeout failed")]
    QueueVisibility(#[source] QueueError),
    /// The Lambda runtime failed.
    #[error("the Lambda runtime failed")]
    Lambda(#[source] lambda_runtime::Error),
    /// The table is one this process must not write (replicated to other Regions, or
    /// written from another Region), or could not be described.
    #[error(transparent)]
    Table(#[from] crate::aws::RegionError),
}

/// A consumer ready to run: built once per process.
pub struct Setup {
    /// The consumer.
    pub consumer: Consumer,
    /// Its source queue, for the local poller (and the start-up retention check).
    pub inbox: Option<(String, SqsInbox)>,
    /// Its settings.
    pub settings: ConsumerSettings,
}

impl Setup {
    /// Builds the clients (the standard chain, the settings' timeouts) and the consumer of
    /// `handler` from `settings`. The table is described first, and refused where this
    /// process must not write it ([`crate::aws::regions`]). When the source queue is
    /// named, its real message retention is read and a consumer retention shorter than it
    /// is refused (C4).
    pub async fn new(settings: ConsumerSettings, handler: Arc<dyn Handler>) -> Result<Self, ServeError> {
        let ConsumerBackend::Aws {
            layout,
            queue_url,
            write_region,
        } = settings.backend.clone()
        else {
            return Err(ServeError::EmbeddedBackend);
        };
        let clients = AwsClients::new(&load_sdk_config(settings.sdk_operation_timeout).await);
        // A consumer writes the table as the request path does: its own records, its
        // entities, its outgoing messages' records.
        crate::aws::check_table_regions(&clients.dynamodb, &layout.table, write_region.as_deref()).await?;
        // The source queue's own retention, where it is named: the dedup data must
        // outlive what the queue really keeps, whatever the settings say (C4).
        let (settings, inbox) = match queue_url.clone() {
            Some(url) => {
                let real = crate::aws::queue_retention(&clients.sqs, &url)
                    .await
                    .map_err(ServeError::QueueAttributes)?;
                let settings = settings
                    .with_source_queue_retention(real)
                    .map_err(|source| ServeError::Retention {
                        queue_url: url.clone(),
                        source,
                    })?;
                let inbox = SqsInbox::new(clients.sqs.clone(), url.clone());
                (settings, Some((url, inbox)))
            }
            None => (settings, None),
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ports = ConsumerPorts {
            store: Arc::new(DynamoStore::new(
                clients.dynamodb.clone(),
                layout.clone(),
                clock.clone(),
            )),
            publisher: Arc::new(AwsPublisher::new(clients.clone(), settings.destinations.clone())),
            clock,
            ids: Arc::new(RandomIds),
        };
        let consumer = Consumer::new(settings.name.clone(), ports, handler, settings.retention)
            .with_message_ids(settings.message_ids.clone())
            .with_limits(settings.limits);
        // An in-order message that waits goes back to its source queue, where it is named.
        let consumer = match &inbox {
            Some((_, inbox)) => consumer.with_requeue(Arc::new(inbox.clone())),
            None => consumer,
        };
        tracing::info!(
            consumer = %settings.name,
            retention_seconds = settings.retention.as_secs(),
            message_ids = %settings.message_ids,
            "consumer ready; dedup data kept from dispatch for the retention"
        );
        Ok(Self {
            consumer,
            inbox,
            settings,
        })
    }
}

/// What `--help` says of a consumer's process ([`serve`]).
pub const CONSUMER_USAGE: &str = "\
usage: a consumer on the outbox (no arguments; --help prints this)
It handles each message of its source queue once in effect: inside Lambda the queue's
events, elsewhere it polls OUTBOX_CONSUMER_QUEUE_URL until SIGINT or SIGTERM.";

/// Runs a consumer of `handler` as the environment says: inside Lambda its SQS events,
/// elsewhere the local poller on `OUTBOX_CONSUMER_QUEUE_URL` until SIGINT or SIGTERM.
/// Asked for help (`--help`, `-h`), it prints [`CONSUMER_USAGE`] and the settings it
/// reads, and ends the process.
pub async fn serve(handler: Arc<dyn Handler>) -> Result<(), ServeError> {
    crate::settings::help::print_if_asked(CONSUMER_USAGE);
    let on_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    let setup = Setup::new(ConsumerSettings::from_env()?, handler).await?;
    if on_lambda {
        // Shared by the batches in flight at once on Lambda Managed Instances: the consumer
        // keeps no state of its own between batches (its ports are clients).
        let consumer = Arc::new(setup.consumer);
        let handler = service_fn(move |event: LambdaEvent<SqsEvent>| {
            let consumer = consumer.clone();
            async move { Ok::<_, lambda_runtime::Error>(super::lambda::handle_event(&consumer, event.payload).await) }
        });
        return crate::telemetry::lambda::run(handler).await.map_err(ServeError::Lambda);
    }
    let Some((url, inbox)) = &setup.inbox else {
        return Err(ServeError::NoQueue);
    };
    // Each message leased for the queue's own visibility timeout: a dead poller's
    // messages come back when the operator's setting says.
    let lease = inbox
        .visibility_timeout()
        .await
        .map_err(ServeError::QueueVisibility)?
        .max(Duration::from_secs(1));
    tracing::info!(queue = %url, lease_s = lease.as_secs(), "polling the source queue");
    super::run_poller(
        inbox as &dyn Inbox,
        &setup.consumer,
        LONG_POLL_WAIT,
        lease,
        shutdown_signal(),
        |_| {},
    )
    .await;
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = interrupt => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = interrupt.await;
        }
    }
    tracing::info!("shutting down after the batch in hand and the open long poll");
}
