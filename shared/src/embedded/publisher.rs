//! The publisher port over embedded destinations: every kind of destination is an
//! embedded queue that receives what an SQS queue behind the real one would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;

use super::queue::{EmbeddedQueue, QueueFault, SendRequest};
use crate::ports::{EntryFailure, PublishError, Publisher};
use crate::protocol::{DestinationName, OutgoingMessage};
use crate::publish::MAX_BATCH_ENTRIES;

/// Destinations, embedded: each one a queue. A queue or topic destination receives the
/// message as an SQS queue (or a topic's SQS subscription with raw message delivery)
/// would: body and attributes. A bus destination receives the event as a rule's SQS
/// target would: a JSON object with `source`, `detail-type` and `detail` (the fields the
/// outbox sets; EventBridge adds `id`, `time`, `account` and the like).
pub struct EmbeddedPublisher {
    destinations: BTreeMap<DestinationName, Arc<EmbeddedQueue>>,
    buses: BTreeSet<DestinationName>,
}

impl EmbeddedPublisher {
    /// A publisher to these queues.
    pub fn new(destinations: BTreeMap<DestinationName, Arc<EmbeddedQueue>>) -> Self {
        Self {
            destinations,
            buses: BTreeSet::new(),
        }
    }

    /// The same, with the destinations named in `buses` standing in for EventBridge buses.
    pub fn with_buses(mut self, buses: impl IntoIterator<Item = DestinationName>) -> Self {
        self.buses = buses.into_iter().collect();
        self
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
    SendRequest {
        body: message.body.clone(),
        attributes: message.send_attributes(),
        delay: std::time::Duration::ZERO,
        group_id: fifo.then(|| message.fifo_group()),
        deduplication_id: fifo.then(|| message.id.to_string()),
    }
}

/// The queue send for one event on a bus: the event as a rule's SQS target delivers it.
fn bus_send_request(message: &OutgoingMessage) -> SendRequest {
    let event = message.event_type();
    let source = serde_json::to_string(&event.source).expect("a string serialises");
    let detail_type = serde_json::to_string(&event.detail_type).expect("a string serialises");
    let detail = crate::event_detail::detail(message);
    SendRequest {
        body: format!(r#"{{"source":{source},"detail-type":{detail_type},"detail":{detail}}}"#),
        attributes: BTreeMap::new(),
        delay: std::time::Duration::ZERO,
        group_id: None,
        deduplication_id: None,
    }
}

#[async_trait]
impl Publisher for EmbeddedPublisher {
    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.destinations
            .get(destination)
            .is_some_and(|queue| queue.config().fifo)
    }

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
        let bus = self.buses.contains(destination);
        Ok(messages
            .iter()
            .map(|message| {
                if bus {
                    bus_send_request(message)
                } else {
                    send_request(message, queue.config().fifo)
                }
            })
            .zip(messages)
            .filter_map(|(request, message)| match queue.send(request) {
                Ok(_) => None,
                Err(QueueFault::InvalidParameter(reason)) => Some(EntryFailure {
                    id: message.id.clone(),
                    sender_fault: true,
                    code: reason.to_owned(),
                }),
            })
            .collect())
    }

    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        if self.buses.contains(destination) {
            crate::event_detail::entry_bytes(message)
        } else {
            message.payload_bytes()
        }
    }
}
