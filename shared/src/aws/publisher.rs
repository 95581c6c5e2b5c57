//! The publisher on AWS: each destination name sends to its [`Target`], an SQS queue, an
//! SNS topic or an EventBridge bus, with the same batching, identity and per-entry
//! failures.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{eventbridge, sns, sqs, AwsClients};
use crate::destination::Target;
use crate::ports::{EntryFailure, PublishError, Publisher};
use crate::protocol::{DestinationName, OutgoingMessage};

/// Destinations on SQS, SNS and EventBridge, by name.
#[derive(Clone)]
pub struct AwsPublisher {
    clients: AwsClients,
    destinations: BTreeMap<DestinationName, Target>,
}

impl AwsPublisher {
    /// A publisher to `destinations` with `clients`.
    pub fn new(clients: AwsClients, destinations: BTreeMap<DestinationName, Target>) -> Self {
        Self { clients, destinations }
    }

    fn target(&self, destination: &DestinationName) -> Result<&Target, PublishError> {
        self.destinations
            .get(destination)
            .ok_or_else(|| PublishError::UnknownDestination {
                destination: destination.clone(),
            })
    }
}

#[async_trait]
impl Publisher for AwsPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        match self.target(destination)? {
            Target::SqsQueue { url, fifo } => {
                sqs::send_to_queue(&self.clients.sqs, destination, url, *fifo, messages).await
            }
            Target::SnsTopic { arn, fifo } => {
                sns::publish_to_topic(&self.clients.sns, destination, arn, *fifo, messages).await
            }
            Target::EventBus { name_or_arn } => {
                eventbridge::put_on_bus(&self.clients.eventbridge, destination, name_or_arn, messages).await
            }
        }
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        match self.destinations.get(destination) {
            Some(Target::EventBus { .. }) => crate::event_detail::entry_bytes(message),
            _ => message.payload_bytes(),
        }
    }
}
