//! The names of what the bootstrap makes for a stack: the table, the control queue, each
//! destination and how it is published, and the consumer behind them.

use std::time::Duration;

use super::DESTINATION_VISIBILITY_TIMEOUT;
use crate::consumer::ConsumerName;
use crate::protocol::DestinationName;
use crate::settings::TableLayout;

/// The names of the resources, as `template.yaml` names them for a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    /// The table of the protocol's records, and how they are keyed.
    pub layout: TableLayout,
    /// The control queue.
    pub control_queue: String,
    /// The control queue's dead-letter queue.
    pub control_dead_letter_queue: String,
    /// Each destination and how it is made.
    pub destinations: Vec<(DestinationName, DestinationResource)>,
    /// The control queue's visibility timeout.
    pub control_visibility_timeout: Duration,
    /// Receives before a control message moves to the dead-letter queue.
    pub max_receive_count: u32,
    /// Each destination queue's visibility timeout.
    pub destination_visibility_timeout: Duration,
    /// The consumer of one of the destinations, if any, and what it publishes to.
    pub consumer: Option<ConsumerResource>,
    /// The one Region that writes the table, where an existing table has replicas in
    /// other Regions (`OUTBOX_WRITE_REGION`); such a table is refused without it.
    pub write_region: Option<String>,
}

/// A consumer of one destination's queue (`outbox::consumer`), and the queues it
/// publishes to. `template.yaml`'s `ShippingFunction` is one: consumer `shipping` of
/// `events`, publishing to `shipments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerResource {
    /// Its name (`OUTBOX_CONSUMER_NAME`).
    pub name: ConsumerName,
    /// The destination whose queue it consumes.
    pub source: DestinationName,
    /// The queue of that destination: the one [`ResourceNames::with_consumer`] makes for it
    /// when the stack has no destination of that name.
    pub source_queue: String,
    /// Each of its own destinations and the queue that is it.
    pub destinations: Vec<(DestinationName, String)>,
}

impl ConsumerResource {
    /// Consumer `name` in stack `stack`: it reads the queue of destination `source`
    /// (`{stack}-{source}`) and publishes to each destination of `publishes` on the queue
    /// `{stack}-{destination}` (a destination named twice counts once).
    pub fn for_stack(
        stack: &str,
        name: ConsumerName,
        source: DestinationName,
        publishes: impl IntoIterator<Item = DestinationName>,
    ) -> Self {
        let mut destinations: Vec<(DestinationName, String)> = Vec::new();
        for destination in publishes {
            if !destinations.iter().any(|(known, _)| *known == destination) {
                let queue = format!("{stack}-{destination}");
                destinations.push((destination, queue));
            }
        }
        Self {
            name,
            source_queue: format!("{stack}-{source}"),
            source,
            destinations,
        }
    }
}

impl ResourceNames {
    /// The names for stack `stack`: `{stack}-table`, `{stack}-control`,
    /// `{stack}-control-dlq` and the destination `events` on `{stack}-events`, with no
    /// consumer ([`ResourceNames::with_consumer`] adds one).
    pub fn for_stack(stack: &str) -> Self {
        Self {
            layout: TableLayout::dedicated(format!("{stack}-table")),
            control_queue: format!("{stack}-control"),
            control_dead_letter_queue: format!("{stack}-control-dlq"),
            destinations: vec![(
                "events".parse().expect("valid name"),
                DestinationResource::Queue {
                    queue: format!("{stack}-events"),
                },
            )],
            control_visibility_timeout: Duration::from_secs(60),
            max_receive_count: crate::ports::CONTROL_MAX_RECEIVE_COUNT,
            destination_visibility_timeout: DESTINATION_VISIBILITY_TIMEOUT,
            consumer: None,
            write_region: None,
        }
    }

    /// The same names with `consumer` behind them. When no destination is named like its
    /// source, one is added on its source queue, made like every destination's (with a
    /// dead-letter queue): a consumer may read what another one publishes.
    pub fn with_consumer(mut self, mut consumer: ConsumerResource) -> Self {
        // A destination of the stack's: the consumer reads its queue, whatever it is named
        // (`{stack}-events.fifo` for a FIFO events destination).
        if let Some((_, resource)) = self.destinations.iter().find(|(name, _)| *name == consumer.source) {
            consumer.source_queue = resource.queue().to_owned();
        }
        if !self.destinations.iter().any(|(name, _)| *name == consumer.source) {
            self.destinations.push((
                consumer.source.clone(),
                DestinationResource::Queue {
                    queue: consumer.source_queue.clone(),
                },
            ));
        }
        self.consumer = Some(consumer);
        self
    }

    /// The same names with the `events` destination published through `kind`: `sqs` (the
    /// queue `{stack}-events` itself, as [`ResourceNames::for_stack`] has it), `sqs-fifo`
    /// (the FIFO queue `{stack}-events.fifo`, each entity's events in one message group,
    /// so an in-order consumer receives them in commit order), `sns` (a topic
    /// `{stack}-events` the queue subscribes to) or `eventbridge` (a bus `{stack}-events`
    /// whose rule targets the queue), as `template.yaml`'s `EventsDestinationKind` does.
    /// `None` for any other kind.
    pub fn with_events_via(mut self, kind: &str) -> Option<Self> {
        let events: DestinationName = "events".parse().expect("valid name");
        let (_, resource) = self.destinations.iter_mut().find(|(name, _)| *name == events)?;
        let queue = resource.queue().to_owned();
        *resource = match kind {
            "sqs" => DestinationResource::Queue { queue },
            "sqs-fifo" => DestinationResource::Queue {
                queue: match queue.strip_suffix(".fifo") {
                    Some(_) => queue,
                    None => format!("{queue}.fifo"),
                },
            },
            "sns" => DestinationResource::Topic {
                topic: queue.clone(),
                queue,
            },
            "eventbridge" => DestinationResource::Bus {
                bus: queue.clone(),
                queue,
            },
            _ => return None,
        };
        Some(self)
    }
}

/// How one destination is made. Every kind ends in a queue the messages can be read
/// from (FIFO when its name ends in `.fifo`), with a dead-letter queue named with `-dlq`
/// before any `.fifo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationResource {
    /// The destination is the queue.
    Queue {
        /// The queue's name.
        queue: String,
    },
    /// The destination is a topic (FIFO when its name ends in `.fifo`, and then so must
    /// the queue's) that the queue subscribes to with raw message delivery, so that it
    /// receives each body with its attributes.
    Topic {
        /// The topic's name.
        topic: String,
        /// The subscribed queue's name.
        queue: String,
    },
    /// The destination is a bus (`default` is the account's own, which is never
    /// created), with a rule that sends every event the outbox puts on it to the queue.
    Bus {
        /// The bus's name.
        bus: String,
        /// The rule's target queue's name (a standard queue).
        queue: String,
    },
}

impl DestinationResource {
    /// The queue where the destination's messages can be read.
    pub fn queue(&self) -> &str {
        match self {
            Self::Queue { queue } | Self::Topic { queue, .. } | Self::Bus { queue, .. } => queue,
        }
    }
}
