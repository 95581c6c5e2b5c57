//! The embedded backend: an in-process implementation of every port with the semantics
//! of DynamoDB and SQS that the protocol relies on. It runs the system with no AWS at
//! all, backs the fast tests and the simulation, and passes the same conformance suite as
//! the AWS adapters.

mod clock;
mod control_queue;
mod inbox;
mod publisher;
mod queue;
mod store;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use clock::ManualClock;
pub use control_queue::EmbeddedControlQueue;
pub use inbox::EmbeddedInbox;
pub use publisher::EmbeddedPublisher;
pub use queue::{EmbeddedQueue, QueueConfig, QueueFault, Received, SendRequest, SentMessage, DEDUPLICATION_WINDOW};
pub use store::{EmbeddedStore, StoreEvent, StoreSizes, EMBEDDED_PRODUCER};

use crate::destination::Target;
use crate::ports::Clock;
use crate::protocol::DestinationName;

/// A complete embedded deployment: the table, the control queue with its dead-letter
/// queue, and the destination queues.
#[derive(Clone)]
pub struct EmbeddedBackend {
    /// The table.
    pub store: Arc<EmbeddedStore>,
    /// The control queue (with its dead-letter queue behind it).
    pub control_queue: Arc<EmbeddedControlQueue>,
    /// The destination queues.
    pub publisher: Arc<EmbeddedPublisher>,
}

/// The control queue's settings in the embedded backend, mirroring `template.yaml`
/// (six times the worker's 10 s timeout).
pub const CONTROL_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(60);
/// Receives before a control message moves to the dead-letter queue.
pub const CONTROL_MAX_RECEIVE_COUNT: u32 = crate::ports::CONTROL_MAX_RECEIVE_COUNT;

impl EmbeddedBackend {
    /// A backend whose time is `clock`, with the given destinations (a name marked
    /// `true` is a FIFO queue). Nothing is recorded unless asked ([`Self::record`]).
    pub fn new(clock: Arc<dyn Clock>, destinations: impl IntoIterator<Item = (DestinationName, bool)>) -> Self {
        Self::holding(clock, destinations, |_| None)
    }

    /// [`Self::new`], each destination holding at most what `cap` says for it, if
    /// anything.
    fn holding(
        clock: Arc<dyn Clock>,
        destinations: impl IntoIterator<Item = (DestinationName, bool)>,
        cap: impl Fn(&DestinationName) -> Option<usize>,
    ) -> Self {
        let dead_letters = Arc::new(EmbeddedQueue::new(QueueConfig::standard("control-dlq"), clock.clone()));
        let control = EmbeddedQueue::new(
            QueueConfig {
                visibility_timeout: CONTROL_VISIBILITY_TIMEOUT,
                ..QueueConfig::standard("control")
            },
            clock.clone(),
        )
        .with_dead_letter_queue(dead_letters, CONTROL_MAX_RECEIVE_COUNT);
        let destinations: BTreeMap<DestinationName, Arc<EmbeddedQueue>> = destinations
            .into_iter()
            .map(|(name, fifo)| {
                let config = QueueConfig {
                    max_messages: cap(&name),
                    ..if fifo {
                        QueueConfig::fifo(name.as_str())
                    } else {
                        QueueConfig::standard(name.as_str())
                    }
                };
                (name, Arc::new(EmbeddedQueue::new(config, clock.clone())))
            })
            .collect();
        Self {
            store: Arc::new(EmbeddedStore::new(clock.clone())),
            control_queue: Arc::new(EmbeddedControlQueue::new(Arc::new(control), clock)),
            publisher: Arc::new(EmbeddedPublisher::new(destinations)),
        }
    }

    /// A backend with a destination for each of `targets`, whatever its kind: queues and
    /// topics become queues (FIFO when they are), and buses queues that receive each
    /// event as a rule's SQS target would ([`EmbeddedPublisher`]). So a service
    /// configured for AWS destinations runs on the embedded backend unchanged.
    pub fn for_targets(clock: Arc<dyn Clock>, targets: &BTreeMap<DestinationName, Target>) -> Self {
        Self::for_targets_holding(clock, targets, |_| None)
    }

    /// The embedded server's backend ([`Self::for_targets`]): nobody receives from its
    /// destinations, so each keeps only its last `kept` messages, for inspection.
    pub fn for_server(clock: Arc<dyn Clock>, targets: &BTreeMap<DestinationName, Target>, kept: usize) -> Self {
        Self::for_targets_holding(clock, targets, |_| Some(kept))
    }

    /// A service's backend ([`Self::for_targets`]): the destinations named in `consumed`
    /// hold everything until their consumers take it, as SQS would; each of the others,
    /// which nobody in the process receives from, keeps only its last `kept` messages.
    pub fn for_service(
        clock: Arc<dyn Clock>,
        targets: &BTreeMap<DestinationName, Target>,
        consumed: &std::collections::BTreeSet<DestinationName>,
        kept: usize,
    ) -> Self {
        Self::for_targets_holding(clock, targets, |name| (!consumed.contains(name)).then_some(kept))
    }

    fn for_targets_holding(
        clock: Arc<dyn Clock>,
        targets: &BTreeMap<DestinationName, Target>,
        cap: impl Fn(&DestinationName) -> Option<usize>,
    ) -> Self {
        let mut backend = Self::holding(
            clock,
            targets.iter().map(|(name, target)| (name.clone(), target.is_fifo())),
            cap,
        );
        let buses = targets
            .iter()
            .filter(|(_, target)| matches!(target, Target::EventBus { .. }))
            .map(|(name, _)| name.clone());
        backend.publisher =
            Arc::new(EmbeddedPublisher::new(backend.publisher.destinations().clone()).with_buses(buses));
        backend
    }

    /// Records what happens from now on, for tests that check it: the store's history and
    /// every queue's send log (the control queue, its dead-letter queue, the
    /// destinations). Off by default: a long-running process would keep everything.
    pub fn record(&self) {
        self.store.record_history();
        let control = self.control_queue.queue();
        control.record_sends();
        if let Some(dead_letters) = control.dead_letter_queue() {
            dead_letters.record_sends();
        }
        for queue in self.publisher.destinations().values() {
            queue.record_sends();
        }
    }
}
