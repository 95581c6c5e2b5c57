//! The consumer as the bootstrap leaves it: the queue it reads and what that queue and its
//! dead-letter queue really keep, the queues it publishes to, and the settings its process
//! reads.

use std::collections::BTreeMap;
use std::time::Duration;

use super::queue::create_queue;
use super::{BootstrapError, ConsumerResource, Resources};
use crate::aws::{queue_retention, AwsClients};
use crate::consumer::{consumer_vars, ConsumerName};
use crate::destination::Target;
use crate::protocol::DestinationName;
use crate::settings::vars;

/// A consumer on what [`super::bootstrap`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrappedConsumer {
    /// Its name.
    pub name: ConsumerName,
    /// The URL of the queue it reads: its source destination's.
    pub queue_url: String,
    /// How long that queue keeps a message, as the queue itself says.
    pub source_retention: Duration,
    /// How long that queue's dead-letter queue keeps a message, as it says.
    pub dead_letter_retention: Duration,
    /// Each destination it publishes to, and its target.
    pub destinations: BTreeMap<DestinationName, Target>,
}

impl BootstrappedConsumer {
    /// Each variable the consumer's process reads, with its value, in the order
    /// `control-worker bootstrap --consumer` prints them: its name, its queue, both queues'
    /// retention (from which the consumer derives how long it keeps its dedup data), and
    /// its destinations (empty when it publishes nothing).
    pub fn variables(&self) -> Vec<(&'static str, String)> {
        let destinations: Vec<String> = self
            .destinations
            .iter()
            .map(|(name, target)| format!("{name}={target}"))
            .collect();
        vec![
            (consumer_vars::NAME, self.name.to_string()),
            (consumer_vars::QUEUE_URL, self.queue_url.clone()),
            (
                consumer_vars::SOURCE_RETENTION_SECONDS,
                self.source_retention.as_secs().to_string(),
            ),
            (
                consumer_vars::DLQ_RETENTION_SECONDS,
                self.dead_letter_retention.as_secs().to_string(),
            ),
            (vars::DESTINATIONS, destinations.join(",")),
        ]
    }
}

impl Resources {
    /// How long the queue of `destination` and its dead-letter queue keep a message, as
    /// the queues themselves say.
    pub async fn delivery_retention(
        &self,
        clients: &AwsClients,
        destination: &DestinationName,
    ) -> Result<(Duration, Duration), BootstrapError> {
        let (Some(queue), Some(dead_letters)) = (
            self.delivery_queues.get(destination),
            self.delivery_dead_letter_queues.get(destination),
        ) else {
            return Err(BootstrapError::NoDestination {
                destination: destination.clone(),
            });
        };
        Ok((
            retention(clients, queue).await?,
            retention(clients, dead_letters).await?,
        ))
    }
}

/// How long the queue at `url` keeps a message.
async fn retention(clients: &AwsClients, url: &str) -> Result<Duration, BootstrapError> {
    queue_retention(&clients.sqs, url)
        .await
        .map_err(|error| BootstrapError::Retention {
            queue_url: url.to_owned(),
            source: Box::new(error),
        })
}

/// Creates the queues `consumer` publishes to (a destination of the stack keeps its own
/// target) and reads the retention of the queue it consumes.
pub(super) async fn create_consumer(
    clients: &AwsClients,
    consumer: &ConsumerResource,
    resources: &Resources,
) -> Result<BootstrappedConsumer, BootstrapError> {
    let (source_retention, dead_letter_retention) = resources.delivery_retention(clients, &consumer.source).await?;
    let mut destinations = BTreeMap::new();
    for (destination, queue) in &consumer.destinations {
        let target = match resources.destinations.get(destination) {
            Some(target) => target.clone(),
            None => Target::SqsQueue {
                url: create_queue(clients, queue, None, None).await?,
                fifo: queue.ends_with(".fifo"),
            },
        };
        destinations.insert(destination.clone(), target);
    }
    Ok(BootstrappedConsumer {
        name: consumer.name.clone(),
        queue_url: resources.delivery_queues[&consumer.source].clone(),
        source_retention,
        dead_letter_retention,
        destinations,
    })
}
