//! The embedded backend of a service: its destinations, and the control worker and the
//! consumers that run in the service's own process.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Registered, DEFAULT_DESTINATION};
use crate::consumer::Consumer;
use crate::control::{poller, BatchReport, ControlPath};
use crate::destination::Target;
use crate::embedded::{EmbeddedBackend, EmbeddedInbox};
use crate::ports::Clock;
use crate::protocol::DestinationName;
use crate::settings::{vars, Settings, Timing};

/// Events each destination that no consumer in the process reads keeps, for inspection.
pub const KEPT_EVENTS: usize = 1000;

/// How long one receive of an in-process poller waits: short, so that a stop is quick.
const RECEIVE_WAIT: Duration = Duration::from_millis(500);

/// How long an in-process consumer keeps what it needs to recognise a message again:
/// longer than any redelivery of the in-memory queues.
pub const CONSUMER_RETENTION: Duration = Duration::from_secs(3600);

/// A standard in-process queue as destination `name`'s target.
pub(crate) fn queue_target(name: &DestinationName) -> Target {
    Target::SqsQueue {
        url: format!("embedded://{name}"),
        fifo: false,
    }
}

/// The backend: a queue for every destination the settings name, whatever its kind, for
/// [`DEFAULT_DESTINATION`], and for each consumer's source. A destination a consumer reads
/// holds everything until it is taken; the others keep their last [`KEPT_EVENTS`].
pub fn backend(settings: &Settings, clock: Arc<dyn Clock>, consumed: &BTreeSet<DestinationName>) -> EmbeddedBackend {
    let mut targets = settings.destinations.clone();
    for name in consumed
        .iter()
        .cloned()
        .chain([DEFAULT_DESTINATION.parse().expect("a valid name")])
    {
        let target = queue_target(&name);
        targets.entry(name).or_insert(target);
    }
    tracing::info!(
        destinations = ?targets.keys().map(|name| name.as_str()).collect::<Vec<_>>(),
        retention_seconds = settings.timing.retention.as_secs(),
        "embedded backend: in this process only, nothing kept across restarts; finished records are kept {}s ({})",
        settings.timing.retention.as_secs(),
        vars::RETENTION_SECONDS,
    );
    EmbeddedBackend::for_service(clock, &targets, consumed, KEPT_EVENTS)
}

/// Waits until the destinations in-process consumers read hold nothing that comes due
/// within `bound`, at most `bound`: their messages would go with the process.
pub async fn drain(backend: &EmbeddedBackend, consumed: &[DestinationName], bound: Duration) {
    let queues: Vec<_> = consumed
        .iter()
        .filter_map(|name| backend.publisher.destinations().get(name).cloned())
        .collect();
    let started = std::time::Instant::now();
    // What comes due within the bound: a kept message's reminder, due minutes later, is
    // not waited for.
    let held = || queues.iter().map(|queue| queue.due_within(bound)).sum::<usize>();
    while held() > 0 {
        if started.elapsed() >= bound {
            tracing::warn!(
                messages = held(),
                "stopping with messages the in-process consumers did not take; they go with the process"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let later = queues.iter().map(|queue| queue.len()).sum::<usize>();
    if later > 0 {
        tracing::info!(
            messages = later,
            "stopping with messages due later (a kept message's reminder, say); they go with the process"
        );
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The control worker, until `stop`.
pub async fn control_worker(
    backend: EmbeddedBackend,
    clock: Arc<dyn Clock>,
    timing: Timing,
    stop: watch::Receiver<bool>,
) {
    let control = ControlPath::new(backend.control_ports(clock), timing);
    let inbox = backend.control_queue.clone();
    // Leased for the queue's visibility timeout, as a worker on SQS leases for the
    // control queue's.
    let lease = inbox.queue().config().visibility_timeout;
    tracing::info!("control worker running in process (embedded backend)");
    poller::run(
        inbox.as_ref(),
        &control,
        RECEIVE_WAIT,
        lease,
        stopped(stop),
        |report: &BatchReport| {
            for item in &report.items {
                if let Err(error) = &item.result {
                    tracing::warn!(message_id = %item.message_id, error = %error, "control message failed");
                }
            }
        },
    )
    .await;
}

/// One consumer, until `stop`.
pub async fn consumer(
    backend: EmbeddedBackend,
    clock: Arc<dyn Clock>,
    registered: Registered,
    stop: watch::Receiver<bool>,
) {
    let queue = backend
        .publisher
        .destinations()
        .get(&registered.source)
        .cloned()
        .expect("the backend has a queue for every consumer's source");
    let lease = queue.config().visibility_timeout;
    let inbox = EmbeddedInbox::new(queue, clock.clone());
    let consumer = Consumer::new(
        registered.name.clone(),
        backend.consumer_ports(clock),
        registered.handler,
        CONSUMER_RETENTION,
    )
    .with_requeue(Arc::new(inbox.clone()));
    tracing::info!(consumer = %registered.name, source = %registered.source, "consumer running in process (embedded backend)");
    crate::consumer::run_poller(&inbox, &consumer, RECEIVE_WAIT, lease, stopped(stop), |report| {
        for item in &report.items {
            if let Err(error) = &item.result {
                tracing::warn!(consumer = %registered.name, message_id = %item.message_id, error = %error, "message failed; it comes back");
            }
        }
    })
    .await;
}
