//! The control queue ports over an embedded queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::inbox::EmbeddedInbox;
use super::queue::{EmbeddedQueue, QueueFault, SendRequest};
use crate::ports::Inbox;
use crate::ports::{Clock, ControlDelivery, ControlInbox, ControlQueue, QueueError};
use crate::protocol::ControlMessage;

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
    async fn receive(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<ControlDelivery>, QueueError> {
        // The same waiting receive as a consumer's: control messages carry no attributes.
        let inbox = EmbeddedInbox::new(self.queue.clone(), self.clock.clone());
        Ok(Inbox::receive(&inbox, max, wait, visibility)
            .await?
            .into_iter()
            .map(|delivery| ControlDelivery {
                message_id: delivery.message_id,
                receipt: delivery.receipt,
                body: delivery.body,
                receive_count: delivery.receive_count,
            })
            .collect())
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        for receipt in receipts {
            self.queue.delete(receipt);
        }
        Ok(())
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        let mut gone = Vec::new();
        for (receipt, delay) in receipts {
            if !self.queue.change_visibility(receipt, *delay) {
                gone.push(receipt.clone());
            }
        }
        Ok(gone)
    }
}
