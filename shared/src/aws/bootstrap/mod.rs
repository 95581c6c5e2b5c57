//! Creates the table, queues, topics and buses that `template.yaml` declares, and the
//! queues of a consumer of any name, for local runs against an emulator (or an account
//! without the stack). Idempotent: what exists
//! is kept, and an existing table (the application's own, in a single-table design) must
//! have the key schema the [`TableLayout`] names, and be one the outbox may write from
//! here ([`crate::aws::regions`]).

mod bus;
mod consumer;
mod error;
mod names;
mod queue;
mod table;
mod topic;

use std::collections::BTreeMap;
use std::time::Duration;

use super::AwsClients;
use crate::destination::Target;
use crate::protocol::DestinationName;
use crate::settings::TableLayout;

pub use bus::outbox_event_pattern;
pub use consumer::BootstrappedConsumer;
pub use error::BootstrapError;
pub use names::{ConsumerResource, DestinationResource, ResourceNames};
use queue::{create_dead_letter_queue, create_queue};

/// Receives before a destination queue's consumer gives a message up to its dead-letter
/// queue (`template.yaml`'s events queue).
const DESTINATION_MAX_RECEIVE_COUNT: u32 = 5;

/// A destination queue's visibility timeout: six times its consumer's function timeout
/// (10 s), as `template.yaml`'s events queue (an emulator's default is 30 s).
pub const DESTINATION_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(60);

/// What exists after the bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// The table and how the protocol's records are keyed in it.
    pub layout: TableLayout,
    /// The control queue's URL.
    pub control_queue_url: String,
    /// Its dead-letter queue's URL.
    pub control_dead_letter_queue_url: String,
    /// Each destination's target, as `OUTBOX_DESTINATIONS` names it.
    pub destinations: BTreeMap<DestinationName, Target>,
    /// Each destination's queue: the URL where its messages can be read.
    pub delivery_queues: BTreeMap<DestinationName, String>,
    /// Each destination queue's dead-letter queue, where a consumer's failures go.
    pub delivery_dead_letter_queues: BTreeMap<DestinationName, String>,
    /// The consumer of [`ResourceNames::consumer`], if any, and the settings its process
    /// reads.
    pub consumer: Option<BootstrappedConsumer>,
    /// The one Region that writes the table, where it was named
    /// ([`ResourceNames::write_region`]).
    pub write_region: Option<String>,
}

/// Creates what is missing and returns where everything is.
pub async fn bootstrap(clients: &AwsClients, names: &ResourceNames) -> Result<Resources, BootstrapError> {
    names.layout.validate()?;
    table::create_table(clients, &names.layout, names.write_region.as_deref()).await?;
    let control_dead_letter_queue_url = create_dead_letter_queue(clients, &names.control_dead_letter_queue).await?;
    let control_queue_url = create_queue(
        clients,
        &names.control_queue,
        Some((&control_dead_letter_queue_url, names.max_receive_count)),
        Some(names.control_visibility_timeout),
    )
    .await?;
    let mut destinations = BTreeMap::new();
    let mut delivery_queues = BTreeMap::new();
    let mut delivery_dead_letter_queues = BTreeMap::new();
    for (destination, resource) in &names.destinations {
        let queue = resource.queue();
        let dead_letter_name = match queue.strip_suffix(".fifo") {
            Some(base) => format!("{base}-dlq.fifo"),
            None => format!("{queue}-dlq"),
        };
        let dead_letter_url = create_dead_letter_queue(clients, &dead_letter_name).await?;
        let url = create_queue(
            clients,
            queue,
            Some((&dead_letter_url, DESTINATION_MAX_RECEIVE_COUNT)),
            Some(names.destination_visibility_timeout),
        )
        .await?;
        let target = match resource {
            DestinationResource::Queue { queue } => Target::SqsQueue {
                url: url.clone(),
                fifo: queue.ends_with(".fifo"),
            },
            DestinationResource::Topic { topic, .. } => topic::create_topic(clients, topic, &url).await?,
            DestinationResource::Bus { bus, .. } => bus::create_bus(clients, bus, &url).await?,
        };
        destinations.insert(destination.clone(), target);
        delivery_queues.insert(destination.clone(), url);
        delivery_dead_letter_queues.insert(destination.clone(), dead_letter_url);
    }
    let mut resources = Resources {
        layout: names.layout.clone(),
        control_queue_url,
        control_dead_letter_queue_url,
        destinations,
        delivery_queues,
        delivery_dead_letter_queues,
        consumer: None,
        write_region: names.write_region.clone(),
    };
    if let Some(consumer) = &names.consumer {
        resources.consumer = Some(consumer::create_consumer(clients, consumer, &resources).await?);
    }
    Ok(resources)
}
