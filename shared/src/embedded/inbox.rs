//! An embedded queue as a consumer's [`Inbox`]: what the local consumer poller receives
//! from when the producer runs on the embedded backend too.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::EmbeddedQueue;
use crate::ports::{Clock, QueueError};
use crate::ports::{Delivery, Inbox, Requeue};

/// How often a waiting receive looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A consumer's view of an [`EmbeddedQueue`].
#[derive(Clone)]
pub struct EmbeddedInbox {
    queue: Arc<EmbeddedQueue>,
    clock: Arc<dyn Clock>,
}

impl EmbeddedInbox {
    /// Receives from `queue`, waiting by `clock`.
    pub fn new(queue: Arc<EmbeddedQueue>, clock: Arc<dyn Clock>) -> Self {
        Self { queue, clock }
    }
}

#[async_trait]
impl Inbox for EmbeddedInbox {
    async fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        let deadline = self.clock.now().plus(wait);
        loop {
            let received = self.queue.receive_for(max.clamp(1, 10), visibility);
            if !received.is_empty() || self.clock.now() >= deadline {
                return Ok(received
                    .into_iter()
                    .map(|message| Delivery {
                        message_id: message.message_id,
                        receipt: message.receipt,
                        body: message.body,
                        attributes: message.attributes,
                        group_id: message.group_id,
                        receive_count: message.receive_count,
                        trace_header: None,
                    })
                    .collect());
            }
            self.clock
                .sleep(POLL_INTERVAL.min(deadline.since(self.clock.now())))
                .await;
        }
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        for receipt in receipts {
            self.queue.delete(receipt);
        }
        Ok(())
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        let mut gone = Vec::new();
        for (receipt, timeout) in receipts {
            if !self.queue.change_visibility(receipt, *timeout) {
                gone.push(receipt.clone());
            }
        }
        Ok(gone)
    }
}

#[async_trait]
impl Requeue for EmbeddedInbox {
    async fn requeue(
        &self,
        delivery: &Delivery,
        extra: &std::collections::BTreeMap<String, String>,
        delay: Duration,
    ) -> Result<(), QueueError> {
        let attributes = crate::ports::requeued_attributes(delivery, extra)?;
        self.queue
            .send(super::SendRequest {
                body: delivery.body.clone(),
                attributes,
                delay,
                group_id: None,
                deduplication_id: None,
            })
            .map(|_| ())
            .map_err(|fault| QueueError::Unavailable(Box::new(fault)))
    }
}
