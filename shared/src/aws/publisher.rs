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

    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.destinations.get(destination).is_some_and(Target::is_fifo)
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        match self.destinations.get(destination) {
            Some(Target::EventBus { .. }) => crate::event_detail::entry_bytes(message),
            _ => message.payload_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
    use crate::time::Timestamp;
    use aws_config::{BehaviorVersion, SdkConfig};

    #[test]
    fn a_bus_counts_its_event_and_a_queue_or_topic_its_payload() {
        let config = SdkConfig::builder().behavior_version(BehaviorVersion::latest()).build();
        let parse = |text: &str| Target::parse(text).unwrap().target;
        let destinations: BTreeMap<DestinationName, Target> = [
            ("queue", parse("sqs:https://sqs.us-east-1.amazonaws.com/123456789012/q")),
            ("topic", parse("sns:arn:aws:sns:us-east-1:123456789012:t")),
            ("bus", parse("eventbridge:b")),
        ]
        .into_iter()
        .map(|(name, target)| (name.parse().unwrap(), target))
        .collect();
        let publisher = AwsPublisher::new(AwsClients::new(&config), destinations);
        let message = OutgoingMessage::new(
            TxnId::from_parts(Timestamp::from_millis(1), [0; 10]),
            0,
            Message::json("bus".parse().unwrap(), &serde_json::json!({"x": 1}))
                .unwrap()
                .with_event("com.example", "Happened"),
        );
        let size = |name: &str| publisher.entry_bytes(&name.parse().unwrap(), &message);
        assert_eq!(size("bus"), crate::event_detail::entry_bytes(&message));
        assert!(size("bus") > message.payload_bytes());
        assert_eq!(size("queue"), message.payload_bytes());
        assert_eq!(size("topic"), message.payload_bytes());
    }
}
