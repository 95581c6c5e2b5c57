//! The queue a message handler receives from: one message as the queue delivered it,
//! and the inbox a local poller receives and acknowledges on when no Lambda event source
//! mapping does it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::QueueError;
use crate::protocol::MAX_MESSAGE_ATTRIBUTES;

/// One message as a queue delivered it (an SQS record of a Lambda event, or a receive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The queue's id of this message (SQS `messageId`): what a partial batch response
    /// names. The same for every redelivery by the queue; a producer's re-send gets a
    /// new one.
    pub message_id: String,
    /// The handle that acknowledges this receipt (empty on Lambda, where the event
    /// source mapping acknowledges).
    pub receipt: String,
    /// The body as sent.
    pub body: String,
    /// The string message attributes.
    pub attributes: BTreeMap<String, String>,
    /// The FIFO message group, on FIFO queues.
    pub group_id: Option<String>,
    /// How many times it has been received, this time included.
    pub receive_count: u32,
    /// X-Ray's trace header the queue delivered with it (SQS's `AWSTraceHeader` system
    /// attribute), if any: the sender's trace where no `traceparent` attribute names it.
    pub trace_header: Option<String>,
}

/// A queue a consumer receives from, when no Lambda event source mapping does it.
#[async_trait]
pub trait Inbox: Send + Sync {
    /// Receives up to `max` visible messages (1 to 10) with their string attributes and
    /// FIFO group, waiting up to `wait` for the first. Each becomes invisible for
    /// `visibility` (the poller's lease, whatever the queue's own visibility timeout) and
    /// comes back after it unless acknowledged or made invisible longer
    /// ([`Inbox::set_visibility`]).
    async fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Delivery>, QueueError>;

    /// Deletes received messages. A receipt that is no longer current does nothing.
    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError>;

    /// Makes received messages visible again after the given durations from now (SQS's
    /// `ChangeMessageVisibility`): the poller extends the lease of a message still being
    /// handled. A receipt that is no longer current is ignored, and returned: the queue
    /// no longer counts its message as held by this receiver (acknowledged meanwhile,
    /// or its lease ran out).
    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError>;
}

/// The attributes of `delivery`'s copy sent back to its queue: its own with `extra` over
/// them (what every [`Requeue`] checks first). Refused for a FIFO queue's delivery, which
/// takes no per-message delay, and where the copy would carry more than
/// [`MAX_MESSAGE_ATTRIBUTES`], which SQS refuses: the delivery then comes back with its
/// queue's visibility timeout instead.
pub fn requeued_attributes(
    delivery: &Delivery,
    extra: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, QueueError> {
    if delivery.group_id.is_some() {
        return Err(QueueError::Rejected {
            reason: "a FIFO queue takes no delay per message",
        });
    }
    let mut attributes = delivery.attributes.clone();
    attributes.extend(extra.clone());
    if attributes.len() > MAX_MESSAGE_ATTRIBUTES {
        return Err(QueueError::Rejected {
            reason: "the copy would carry more than 10 message attributes, the most SQS takes on one message",
        });
    }
    Ok(attributes)
}

/// Where a consumer sends a message back to come again later: its source queue. An
/// in-order consumer sends a copy of a message whose predecessor it has not applied yet,
/// then acknowledges the delivery in hand, so that waiting never counts toward the
/// dead-letter queue.
#[async_trait]
pub trait Requeue: Send + Sync {
    /// Sends a copy of `delivery` (its body, its attributes and `extra` ones, its FIFO
    /// group) to the queue it came from, to be delivered after `delay` (on a FIFO queue,
    /// which takes no per-message delay, the copy refuses: `QueueError::Unavailable`).
    async fn requeue(
        &self,
        delivery: &Delivery,
        extra: &BTreeMap<String, String>,
        delay: Duration,
    ) -> Result<(), QueueError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carrying(count: usize) -> Delivery {
        Delivery {
            message_id: "m".into(),
            receipt: String::new(),
            body: "{}".into(),
            attributes: (0..count)
                .map(|index| (format!("own-{index}"), "x".to_owned()))
                .collect(),
            group_id: None,
            receive_count: 1,
            trace_header: None,
        }
    }

    #[test]
    fn a_copy_over_ten_attributes_is_refused_saying_so() {
        let extra = BTreeMap::from([("outbox-wait".to_owned(), "1;0".to_owned())]);
        assert_eq!(requeued_attributes(&carrying(9), &extra).unwrap().len(), 10);
        match requeued_attributes(&carrying(10), &extra) {
            Err(QueueError::Rejected { reason }) => {
                assert!(reason.contains("more than 10 message attributes"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // An attribute the copy replaces takes no more room.
        let mut waited = carrying(9);
        waited.attributes.insert("outbox-wait".to_owned(), "0;0".to_owned());
        assert_eq!(requeued_attributes(&waited, &extra).unwrap()["outbox-wait"], "1;0");
    }
}
