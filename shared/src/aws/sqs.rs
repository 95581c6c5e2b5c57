//! The control queue on SQS, a consumer's source queue, and sends to destination queues.

use std::time::Duration;

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageAttributeValue,
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;

use super::send_outcome::{failed_by_index, unavailable};
use crate::ports::{ControlDelivery, ControlInbox, ControlQueue, EntryFailure, PublishError, QueueError};
use crate::ports::{Delivery, Inbox, Requeue};
use crate::protocol::{ControlMessage, DestinationName, OutgoingMessage, TraceContext, TXN_ID_ATTRIBUTE};

/// X-Ray's trace header as the `AWSTraceHeader` system attribute of a send.
fn trace_header(header: String) -> MessageSystemAttributeValue {
    MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        .expect("data type is set")
}

fn string_attribute(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("data type is set")
}

/// The control queue on SQS, both sides.
#[derive(Clone)]
pub struct SqsControlQueue {
    client: Client,
    queue_url: String,
}

impl SqsControlQueue {
    /// The control queue at `queue_url`.
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }
}

#[async_trait]
impl ControlQueue for SqsControlQueue {
    #[tracing::instrument(skip_all, fields(txn_id = %message.txn_id))]
    async fn send(&self, message: &ControlMessage, delay: Duration) -> Result<(), QueueError> {
        let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(message.encode())
            .delay_seconds(seconds.min(900) as i32)
            .message_attributes(TXN_ID_ATTRIBUTE, string_attribute(&message.txn_id.to_string()));
        // The request's trace travels with its control message (in its body, and as
        // SQS carries a trace: `traceparent`, and X-Ray's header, the invocation's own
        // from Lambda when the request was not traced otherwise), so that the worker's
        // handling links it. Lambda's header is the invocation's being served, never the
        // process's variable where several run at once (Managed Instances).
        for (name, value) in message.trace.iter().flat_map(TraceContext::attributes) {
            send = send.message_attributes(name, string_attribute(&value));
        }
        let xray = message
            .trace
            .as_ref()
            .map(TraceContext::xray)
            .or_else(super::invocation_trace::header_for_send);
        if let Some(header) = xray {
            send = send
                .message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, trace_header(header));
        }
        send.send()
            .await
            .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
        Ok(())
    }
}

/// How much longer than its long-poll wait a receive may take before the client gives
/// up on it: the server answers an empty long poll only when the wait is over, so the
/// client must outwait it by the round trip and some slack.
pub const RECEIVE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// The timeouts of a receive that long-polls for `wait`: one attempt, which may take the
/// whole wait plus [`RECEIVE_TIMEOUT_MARGIN`]. The client's usual operation timeout (a
/// few seconds) would abandon every quiet long poll while SQS keeps it open; a message
/// arriving then is handed to the abandoned receive, stays invisible for the visibility
/// timeout and gains a receive count without being handled (AWS's long-polling guidance:
/// the HTTP timeout must exceed the wait).
pub fn receive_timeouts(wait: Duration) -> TimeoutConfig {
    let limit = wait + RECEIVE_TIMEOUT_MARGIN;
    TimeoutConfig::builder()
        .operation_timeout(limit)
        .operation_attempt_timeout(limit)
        .build()
}

/// Long-polls the queue at `url` for up to `max` messages, with their string message
/// attributes, receive count, FIFO group and X-Ray trace header.
async fn receive_messages(
    client: &Client,
    url: &str,
    max: usize,
    wait: Duration,
    visibility: Duration,
) -> Result<Vec<aws_sdk_sqs::types::Message>, QueueError> {
    let wait = wait.min(Duration::from_secs(20));
    // No SDK retry either: a retried long poll would be cut short by the operation
    // timeout and abandoned in turn. The poller retries, after a short pause.
    let config = aws_sdk_sqs::config::Builder::default()
        .timeout_config(receive_timeouts(wait))
        .retry_config(RetryConfig::disabled());
    let output = client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(max.clamp(1, 10) as i32)
        .wait_time_seconds(wait.as_secs() as i32)
        .visibility_timeout(lease_seconds(visibility))
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
        .message_attribute_names("All")
        .customize()
        .config_override(config)
        .send()
        .await
        .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
    Ok(output.messages.unwrap_or_default())
}

/// Deletes received messages from the queue at `url`, ten per call. A failed entry only
/// means its message comes back and is handled again.
async fn delete_messages(client: &Client, url: &str, receipts: &[String]) -> Result<(), QueueError> {
    for chunk in receipts.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(index, receipt)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(index.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .expect("id and receipt are set")
            })
            .collect();
        let output = client
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
        for failed in output.failed() {
            tracing::warn!(code = failed.code(), "deleting a received message failed");
        }
    }
    Ok(())
}

fn system_attribute(message: &aws_sdk_sqs::types::Message, name: MessageSystemAttributeName) -> Option<&str> {
    message
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .map(String::as_str)
}

fn receive_count(message: &aws_sdk_sqs::types::Message) -> u32 {
    system_attribute(message, MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|count| count.parse().ok())
        .unwrap_or(1)
}

#[async_trait]
impl ControlInbox for SqsControlQueue {
    async fn receive(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<ControlDelivery>, QueueError> {
        let messages = receive_messages(&self.client, &self.queue_url, max, wait, visibility).await?;
        Ok(messages
            .iter()
            .map(|message| ControlDelivery {
                message_id: message.message_id().unwrap_or_default().to_owned(),
                receipt: message.receipt_handle().unwrap_or_default().to_owned(),
                body: message.body().unwrap_or_default().to_owned(),
                receive_count: receive_count(message),
            })
            .collect())
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        delete_messages(&self.client, &self.queue_url, receipts).await
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        change_visibility(&self.client, &self.queue_url, receipts).await
    }
}

/// SQS's visibility timeout in whole seconds, at most its 12 hours.
fn visibility_seconds(visibility: Duration) -> i32 {
    visibility.as_secs().min(43_200) as i32
}

/// A receive's lease in whole seconds: at least one (zero would show each message to the
/// next receive at once).
fn lease_seconds(lease: Duration) -> i32 {
    visibility_seconds(lease).max(1)
}

/// Sets the visibility of received messages of the queue at `url`, ten per call; returns
/// the receipts SQS no longer counts as held (`MessageNotInflight`,
/// `ReceiptHandleIsInvalid`). Another failed entry only means its message comes back
/// when its visibility runs out anyway: logged.
async fn change_visibility(
    client: &Client,
    url: &str,
    receipts: &[(String, Duration)],
) -> Result<Vec<String>, QueueError> {
    let mut gone = Vec::new();
    for chunk in receipts.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(index, (receipt, visibility))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(index.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(visibility_seconds(*visibility))
                    .build()
                    .expect("id and receipt are set")
            })
            .collect();
        let output = client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
        for failed in output.failed() {
            if matches!(failed.code(), "ReceiptHandleIsInvalid" | "MessageNotInflight") {
                // The entry's id is its index in the chunk.
                if let Some((receipt, _)) = failed.id().parse::<usize>().ok().and_then(|index| chunk.get(index)) {
                    gone.push(receipt.clone());
                }
            } else {
                tracing::warn!(code = failed.code(), "changing a message's visibility failed");
            }
        }
    }
    Ok(gone)
}

/// The `MessageRetentionPeriod` of the queue at `url`: how long a copy of a message can
/// still be delivered from it.
pub async fn queue_retention(client: &Client, url: &str) -> Result<Duration, QueueError> {
    queue_seconds(
        client,
        url,
        QueueAttributeName::MessageRetentionPeriod,
        "the queue did not say its MessageRetentionPeriod",
    )
    .await
}

/// The `VisibilityTimeout` of the queue at `url`: how long a received message stays
/// hidden unless its receiver says otherwise (a local poller's lease).
pub async fn queue_visibility_timeout(client: &Client, url: &str) -> Result<Duration, QueueError> {
    queue_seconds(
        client,
        url,
        QueueAttributeName::VisibilityTimeout,
        "the queue did not say its VisibilityTimeout",
    )
    .await
}

async fn queue_seconds(
    client: &Client,
    url: &str,
    attribute: QueueAttributeName,
    missing: &'static str,
) -> Result<Duration, QueueError> {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(attribute.clone())
        .send()
        .await
        .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
    output
        .attributes()
        .and_then(|attributes| attributes.get(&attribute))
        .and_then(|seconds| seconds.parse().ok())
        .map(Duration::from_secs)
        .ok_or(QueueError::Rejected { reason: missing })
}

/// A consumer's source queue on SQS, for the local poller (on Lambda the event source
/// mapping receives and deletes).
#[derive(Clone)]
pub struct SqsInbox {
    client: Client,
    queue_url: String,
}

impl SqsInbox {
    /// The queue at `queue_url`.
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }

    /// The queue's own visibility timeout: the local poller's lease.
    pub async fn visibility_timeout(&self) -> Result<Duration, QueueError> {
        queue_visibility_timeout(&self.client, &self.queue_url).await
    }
}

#[async_trait]
impl Inbox for SqsInbox {
    async fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        let messages = receive_messages(&self.client, &self.queue_url, max, wait, visibility).await?;
        Ok(messages
            .iter()
            .map(|message| Delivery {
                message_id: message.message_id().unwrap_or_default().to_owned(),
                receipt: message.receipt_handle().unwrap_or_default().to_owned(),
                body: message.body().unwrap_or_default().to_owned(),
                attributes: message
                    .message_attributes()
                    .map(|attributes| {
                        attributes
                            .iter()
                            .filter_map(|(name, value)| Some((name.clone(), value.string_value()?.to_owned())))
                            .collect()
                    })
                    .unwrap_or_default(),
                group_id: system_attribute(message, MessageSystemAttributeName::MessageGroupId).map(str::to_owned),
                receive_count: receive_count(message),
                trace_header: system_attribute(message, MessageSystemAttributeName::AwsTraceHeader).map(str::to_owned),
            })
            .collect())
    }

    async fn ack(&self, receipts: &[String]) -> Result<(), QueueError> {
        delete_messages(&self.client, &self.queue_url, receipts).await
    }

    async fn set_visibility(&self, receipts: &[(String, Duration)]) -> Result<Vec<String>, QueueError> {
        change_visibility(&self.client, &self.queue_url, receipts).await
    }
}

#[async_trait]
impl Requeue for SqsInbox {
    /// One `SendMessage` of the delivery's body and attributes (with `extra`) to this
    /// queue, `DelaySeconds` the delay in whole seconds (at most 900). A FIFO queue takes
    /// no per-message delay: refused.
    async fn requeue(
        &self,
        delivery: &Delivery,
        extra: &std::collections::BTreeMap<String, String>,
        delay: Duration,
    ) -> Result<(), QueueError> {
        let attributes = crate::ports::requeued_attributes(delivery, extra)?;
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(&delivery.body)
            .delay_seconds(delay.as_secs().min(900) as i32);
        for (name, value) in &attributes {
            send = send.message_attributes(name, string_attribute(value));
        }
        send.send()
            .await
            .map(|_| ())
            .map_err(|error| QueueError::Unavailable(Box::new(error)))
    }
}

/// Sends `messages` to the queue at `url` in one `SendMessageBatch`, each with its stable
/// id, transaction id and trace context as message attributes beside its own (and the
/// trace as its `AWSTraceHeader`), and on a FIFO queue its group and its stable id as
/// deduplication id. Returns the entries SQS failed.
pub(crate) async fn send_to_queue(
    client: &Client,
    destination: &DestinationName,
    url: &str,
    fifo: bool,
    messages: &[OutgoingMessage],
) -> Result<Vec<EntryFailure>, PublishError> {
    let entries = messages
        .iter()
        .enumerate()
        .map(|(index, message)| queue_entry(message, index, fifo))
        .collect();
    let output = client
        .send_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
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

fn queue_entry(message: &OutgoingMessage, index: usize, fifo: bool) -> SendMessageBatchRequestEntry {
    let mut entry = SendMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .message_body(&message.body);
    for (name, value) in message.send_attributes() {
        entry = entry.message_attributes(name, string_attribute(&value));
    }
    if let Some(trace) = &message.trace {
        entry = entry.message_system_attributes(
            MessageSystemAttributeNameForSends::AwsTraceHeader,
            trace_header(trace.xray()),
        );
    }
    if fifo {
        entry = entry
            .message_group_id(message.fifo_group())
            .message_deduplication_id(message.id.as_str());
    }
    entry.build().expect("id and body are set")
}

/// The queue whose redrive policy names the dead-letter queue at `dead_letter_url`
/// (`ListDeadLetterSourceQueues`): where its messages go back to. An error when no queue
/// or several do (then the caller names one).
pub async fn dead_letter_source(client: &Client, dead_letter_url: &str) -> Result<String, QueueError> {
    let sources = client
        .list_dead_letter_source_queues()
        .queue_url(dead_letter_url)
        .send()
        .await
        .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
    match sources.queue_urls() {
        [one] => Ok(one.clone()),
        [] => Err(QueueError::Rejected {
            reason: "no queue names it as its dead-letter queue: name the queue to move its messages to",
        }),
        _ => Err(QueueError::Rejected {
            reason: "several queues name it as their dead-letter queue: name the one to move its messages to",
        }),
    }
}

/// Moves every message of queue `from` (a dead-letter queue) to queue `to` (its source,
/// [`dead_letter_source`]), with its body and attributes (and on a FIFO queue its group,
/// its SQS id and the run as deduplication id), deleting each from `from` only once `to`
/// has accepted it. SQS's own `StartMessageMoveTask` does this too, but emulators lack it
/// and it needs extra IAM; this needs only receive, send and delete (and
/// `ListDeadLetterSourceQueues` to find `to`). A FIFO group's order holds unless an entry
/// of a batch fails and a later one of its group is sent: it comes back in a later round. Returns how many messages moved;
/// stops when a round moves nothing (what is left failed to send and stays in `from`).
pub async fn redrive(client: &Client, from: &str, to: &str) -> Result<usize, QueueError> {
    let failed = |error: Box<dyn std::error::Error + Send + Sync>| QueueError::Unavailable(error);
    // A FIFO queue drops a deduplication id it saw in the last 5 minutes: a message
    // redriven, failed and redriven again within them would be deleted here unsent. One
    // id per run and message: a retry within the run is deduplicated, a later run is not.
    let run = uuid::Uuid::now_v7();
    let mut moved = 0;
    loop {
        let received = client
            .receive_message()
            .queue_url(from)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(30)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
            .send()
            .await
            .map_err(|error| failed(Box::new(error)))?;
        let messages = received.messages();
        if messages.is_empty() {
            return Ok(moved);
        }
        let entries = messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                let group = system_attribute(message, MessageSystemAttributeName::MessageGroupId);
                // Its trace goes back with it.
                let traced = system_attribute(message, MessageSystemAttributeName::AwsTraceHeader).map(|header| {
                    [(
                        MessageSystemAttributeNameForSends::AwsTraceHeader,
                        trace_header(header.to_owned()),
                    )]
                    .into()
                });
                SendMessageBatchRequestEntry::builder()
                    .id(index.to_string())
                    .message_body(message.body().unwrap_or_default())
                    .set_message_attributes(message.message_attributes().cloned())
                    .set_message_system_attributes(traced)
                    .set_message_group_id(group.map(str::to_owned))
                    .set_message_deduplication_id(
                        group
                            .and(message.message_id())
                            .map(|id| format!("{id}-{}", run.simple())),
                    )
                    .build()
                    .expect("id and body are set")
            })
            .collect();
        let sent = client
            .send_message_batch()
            .queue_url(to)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|error| failed(Box::new(error)))?;
        let deletes: Vec<DeleteMessageBatchRequestEntry> = sent
            .successful()
            .iter()
            .filter_map(|entry| {
                let message = entry.id().parse::<usize>().ok().and_then(|index| messages.get(index))?;
                DeleteMessageBatchRequestEntry::builder()
                    .id(entry.id())
                    .receipt_handle(message.receipt_handle().unwrap_or_default())
                    .build()
                    .ok()
            })
            .collect();
        if deletes.is_empty() {
            return Ok(moved);
        }
        moved += deletes.len();
        client
            .delete_message_batch()
            .queue_url(from)
            .set_entries(Some(deletes))
            .send()
            .await
            .map_err(|error| failed(Box::new(error)))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
    use crate::time::Timestamp;

    #[test]
    fn a_traced_message_goes_with_its_traceparent_and_its_xray_header() {
        let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        let txn = TxnId::from_parts(Timestamp::from_millis(5), [3; 10]);
        let message = OutgoingMessage::new(txn, 0, Message::json("events".parse().unwrap(), &"x").unwrap());
        let entry = queue_entry(&message.clone().with_trace(Some(trace.clone())), 0, false);
        let header = entry
            .message_system_attributes()
            .and_then(|attributes| attributes.get(&MessageSystemAttributeNameForSends::AwsTraceHeader))
            .and_then(|value| value.string_value());
        assert_eq!(header, Some(trace.xray().as_str()));
        let parent = entry
            .message_attributes()
            .and_then(|attributes| attributes.get("traceparent"))
            .and_then(|value| value.string_value());
        assert_eq!(parent, Some(trace.traceparent().as_str()));
        let untraced = queue_entry(&message, 0, false);
        assert!(untraced
            .message_system_attributes()
            .is_none_or(|attributes| attributes.is_empty()));
        assert!(!untraced
            .message_attributes()
            .is_some_and(|attributes| attributes.contains_key("traceparent")));
    }
}
