//! Sends to destination topics on SNS.

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use aws_sdk_sns::Client;

use super::send_outcome::{failed_by_index, unavailable};
use crate::ports::{EntryFailure, PublishError};
use crate::protocol::{DestinationName, OutgoingMessage};

fn string_attribute(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("data type is set")
}

/// Publishes `messages` to the topic `arn` in one `PublishBatch`, each with its stable id
/// and transaction id as message attributes beside its own (an SQS subscription with raw
/// message delivery receives them as SQS message attributes), and on a FIFO topic its
/// group and its stable id as deduplication id. Returns the entries SNS failed.
pub(crate) async fn publish_to_topic(
    client: &Client,
    destination: &DestinationName,
    arn: &str,
    fifo: bool,
    messages: &[OutgoingMessage],
) -> Result<Vec<EntryFailure>, PublishError> {
    let entries = messages
        .iter()
        .enumerate()
        .map(|(index, message)| topic_entry(message, index, fifo))
        .collect();
    let output = client
        .publish_batch()
        .topic_arn(arn)
        .set_publish_batch_request_entries(Some(entries))
        .send()
        .await
        .map_err(unavailable(destination))?;
    Ok(failed_by_index(
        messages,
        output
            .failed()
            .iter()
            .map(|failed| (failed.id(), failed.sender_fault(), failed.code())),
    ))
}

fn topic_entry(message: &OutgoingMessage, index: usize, fifo: bool) -> PublishBatchRequestEntry {
    let mut entry = PublishBatchRequestEntry::builder()
        .id(index.to_string())
        .message(&message.body);
    for (name, value) in message.send_attributes() {
        entry = entry.message_attributes(name, string_attribute(&value));
    }
    if fifo {
        entry = entry
            .message_group_id(message.fifo_group())
            .message_deduplication_id(message.id.as_str());
    }
    entry.build().expect("id and message are set")
}
