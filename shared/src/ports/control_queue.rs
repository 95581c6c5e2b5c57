//! The control queue: where the request path sends delayed control messages, and where
//! a poller receives them when no Lambda event source mapping does it.

use std::time::Duration;

use async_trait::async_trait;

use super::BoxError;
use crate::protocol::ControlMessage;

/// Receives before the control queue moves a message to its dead-letter queue (the
/// redrive policy of `template.yaml` and of the bootstrap; the control path's redelivery
/// spaces them out).
pub const CONTROL_MAX_RECEIVE_COUNT: u32 = 10;

/// A queue operation that failed. The request path treats every failure to send as
/// "not sent" and writes nothing, which is safe whether or not the message got through:
/// a control message for a transaction that never commits only writes a tombstone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The queue service could not be reached or refused the call.
    #[error("the control queue is unavailable")]
    Unavailable(#[source] BoxError),
    /// The call was refused for a reason that retrying will not fix.
    #[error("the control queue refused the call: {reason}")]
    Rejected {
        /// What was wrong.
        reason: &'static str,
    },
}

/// Sending side of the control queue.
#[async_trait]
pub trait ControlQueue: Send + Sync {
    /// Sends `message`, invisible to receivers for `delay` (whole seconds, at most
    /// 15 minutes; the caller keeps within that). Returns once the queue has durably
    /// accepted it. At-least-once: a receiver may see it more than once.
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError>;
}

/// One received control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlDelivery {
    /// The queue's id for this message (the SQS `messageId`), used to report failures.
    pub message_id: String,
    /// Handle for acknowledging this receipt.
    pub receipt: String,
    /// The body as sent; may be anything, since anyone with access can send.
    pub body: String,
    /// How many times this message has been received, this time included.
    pub receive_count: u32,
}

/// Receiving side of the control queue, for local pollers. On Lambda the event source
/// mapping does this work and the handler sees only the batch.
#[async_trait]
pub trait ControlInbox: Send + Sync {
    /// Receives up to `max` visible messages (1 to 10), waiting up to `wait` for the
    /// first. Each received message becomes invisible for `visibility` (the poller's
    /// lease, whatever the queue's own visibility timeout) and comes back after it unless
    /// acknowledged or made invisible longer ([`ControlInbox::set_visibility`]).
    async fn receive(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<ControlDelivery>, QueueError>;

    /// Deletes a received message. Acknowledging a receipt that is no longer current
    /// (the message was received again since) does nothing.
    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError>;

    /// Makes received messages visible again after the given delays (SQS's
    /// `ChangeMessageVisibility`): sooner, so that a message that failed comes back in
    /// seconds rather than after its whole lease; or later, so that one still being
    /// handled does not come back meanwhile. Each receipt counts as one more receive
    /// toward the dead-letter policy when it comes back, as usual. A receipt that is no
    /// longer current is ignored, and returned: the queue no longer counts its message
    /// as held by this receiver (acknowledged meanwhile, or its lease ran out).
    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError>;
}
