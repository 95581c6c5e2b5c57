//! The control queue ports over an embedded queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::queue::{EmbeddedQueue, QueueFault, SendRequest};
use crate::ports::{Clock, ControlDelivery, ControlInbox, ControlQueue, QueueError};
use crate::protocol::ControlMessage;

/// How often a waiting receive looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The control queue, embedded.
pub struct EmbeddedControlQueue {
    queue: Arc<EmbeddedQueue>,
    clock: Arc<dyn Clock>,
}

impl EmbeddedControlQueue {
    /// The control queue over `queue`, waiting on `clock`.
    pub fn new(queue: Arc<EmbeddedQueue>, clock: Arc<dyn Clock>) -> Self {
        Self { queue, clock }
    }

    /// The queue itself, for tests and for sending raw bodies.
    pub fn queue(&self) -> &Arc<EmbeddedQueue> {
        &self.queue
    }
}

impl From<QueueFault> for QueueError {
    fn from(fault: QueueFault) -> Self {
        match fault {
            QueueFault::InvalidParameter(reason) => QueueError::Rejected { reason },
        }
    }
}

#[async_trait]
impl ControlQueue for EmbeddedControlQueue {
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        self.queue.send(SendRequest {
            body: message.encode(),
            delay,
            ..SendRequest::default()
        })?;
        Ok(())
    }
}

#[async_trait]
impl ControlInbox for EmbeddedControlQueue {
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<ControlDelivery>, QueueError> {
        let deadline = self.clock.now().plus(wait);
        loop {
            let received = self.queue.receive(max.clamp(1, 10));
            if !received.is_empty() || self.clock.now() >= deadline {
                return Ok(received
                    .into_iter()
                    .map(|message| ControlDelivery {
                        message_id: message.message_id,
                        receipt: message.receipt,
                        body: message.body,
                        receive_count: message.receive_count,
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

    async fn retry_later(&self, receipts: &[(String, Duration)]) -> Result<(), QueueError> {
        for (receipt, delay) in receipts {
            self.queue.change_visibility(receipt, *delay);
        }
        Ok(())
    }
}
