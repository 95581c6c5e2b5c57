//! The publisher port over embedded destination queues.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::queue::{EmbeddedQueue, QueueFault, SendRequest};
use crate::ports::{EntryFailure, PublishError, Publisher};
use crate::protocol::{DestinationName, OutgoingMessage, MESSAGE_ID_ATTRIBUTE, TXN_ID_ATTRIBUTE};
use crate::publish::MAX_BATCH_ENTRIES;

/// Destination queues, embedded.
pub struct EmbeddedPublisher {
    destinations: BTreeMap<DestinationName, Arc<EmbeddedQueue>>,
}

impl EmbeddedPublisher {
    /// A publisher to these queues.
    pub fn new(destinations: BTreeMap<DestinationName, Arc<EmbeddedQueue>>) -> Self {
        Self { destinations }
    }

    /// The queue behind a destination name.
    pub fn queue(&self, name: &DestinationName) -> Option<&Arc<EmbeddedQueue>> {
        self.destinations.get(name)
    }

    /// Every destination.
    pub fn destinations(&self) -> &BTreeMap<DestinationName, Arc<EmbeddedQueue>> {
        &self.destinations
    }
}

/// The queue send for one outgoing message: its stable id and transaction id as
/// attributes, and on FIFO queues its group and its id as deduplication id.
fn send_request(message: &OutgoingMessage, fifo: bool) -> SendRequest {
    let mut attributes = message.attributes.clone();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.into(), message.id.to_string());
    attributes.insert(TXN_ID_ATTRIBUTE.into(), message.txn_id.to_string());
    SendRequest {
        body: message.body.clone(),
        attributes,
        delay: std::time::Duration::ZERO,
        group_id: fifo.then(|| message.fifo_group()),
        deduplication_id: fifo.then(|| message.id.to_string()),
    }
}

#[async_trait]
impl Publisher for EmbeddedPublisher {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let queue = self
            .destinations
            .get(destination)
            .ok_or_else(|| PublishError::UnknownDestination {
                destination: destination.clone(),
            })?;
        if messages.len() > MAX_BATCH_ENTRIES {
            return Ok(messages
                .iter()
                .map(|m| EntryFailure {
                    id: m.id.clone(),
                    sender_fault: true,
                    code: "TooManyEntriesInBatchRequest".into(),
                })
                .collect());
        }
        Ok(messages
            .iter()
            .filter_map(|message| match queue.send(send_request(message, queue.config().fifo)) {
                Ok(_) => None,
                Err(QueueFault::InvalidParameter(reason)) => Some(EntryFailure {
                    id: message.id.clone(),
                    sender_fault: true,
                    code: reason.to_owned(),
                }),
            })
            .collect())
    }
}
