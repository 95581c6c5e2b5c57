//! The publisher: batched sends to destinations (queues, topics, buses).

use async_trait::async_trait;

use super::BoxError;
use crate::protocol::{DestinationName, MessageId, OutgoingMessage};

/// One entry of a batch that the destination refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryFailure {
    /// Which message.
    pub id: MessageId,
    /// Whether the fault is the sender's (retrying the same entry will fail again).
    pub sender_fault: bool,
    /// The service's error code, for logs.
    pub code: String,
}

/// A whole batch call that failed: no entry can be assumed sent, nor assumed unsent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The service could not be reached or failed the call.
    #[error("destination {destination} is unavailable")]
    Unavailable {
        /// Which destination.
        destination: DestinationName,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// No destination is configured under this name.
    #[error("no destination is configured under the name {destination}")]
    UnknownDestination {
        /// The name the message asked for.
        destination: DestinationName,
    },
}

/// Sends messages to destinations.
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Sends up to 10 messages for one destination in one call, in order, each carrying
    /// its stable id and transaction id (and, on FIFO queues and topics, its group and its
    /// id as deduplication id). Returns the entries that failed; the others were accepted.
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError>;

    /// The bytes `message` counts against the destination's per-call size limit
    /// ([`crate::publish::MAX_BATCH_BYTES`]): by default SQS's and SNS's measure (the
    /// body and every attribute a send carries, [`OutgoingMessage::payload_bytes`]); an
    /// EventBridge bus counts its entry instead.
    fn entry_bytes(&self, destination: &DestinationName, message: &OutgoingMessage) -> usize {
        let _ = destination;
        message.payload_bytes()
    }

    /// Whether the destination keeps each FIFO group's order (an SQS FIFO queue, an SNS
    /// FIFO topic): publishing then sends at most one message of a group per call, and
    /// none of a group after one of it failed, so that a partial failure never lets a
    /// later message of the group in before an earlier one. False by default: a wrapper
    /// forwards it.
    fn keeps_order(&self, destination: &DestinationName) -> bool {
        let _ = destination;
        false
    }
}
