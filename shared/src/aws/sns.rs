//! Sends to destination topics on SNS.

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use aws_sdk_sns::Client;

use crate::ports::{EntryFailure, PublishError};
use crate::protocol::{DestinationName, OutgoingMessage, MESSAGE_ID_ATTRIBUTE, TXN_ID_ATTRIBUTE};

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
        .map_err(|error| PublishError::Unavailable {
            destination: destination.clone(),
            source: Box::new(error),
        })?;
    Ok(output
        .failed()
        .iter()
        .filter_map(|failed| {
            let message = failed
                .id()
                .parse::<usize>()
                .ok()
                .and_then(|index| messages.get(index))?;
            Some(EntryFailure {
                id: message.id.clone(),
                sender_fault: failed.sender_fault(),
                code: failed.code().to_owned(),
            })
        })
        .collect())
}

fn topic_entry(message: &OutgoingMessage, index: usize, fifo: bool) -> PublishBatchRequestEntry {
    let mut entry = PublishBatchRequestEntry::builder()
        .id(index.to_string())
        .message(&message.body);
    for (name, value) in &message.attributes {
        entry = entry.message_attributes(name, string_attribute(value));
    }
    entry = entry
        .message_attributes(MESSAGE_ID_ATTRIBUTE, string_attribute(message.id.as_str()))
        .message_attributes(TXN_ID_ATTRIBUTE, string_attribute(&message.txn_id.to_string()));
    if fifo {
        entry = entry
            .message_group_id(message.fifo_group())
            .message_deduplication_id(message.id.as_str());
    }
    entry.build().expect("id and message are set")
}
