//! The Lambda handler for a consumer's SQS events (feature `consumer`).
//!
//! It answers with a partial batch response (`ReportBatchItemFailures`): only the
//! messages that must come back are listed, so one failure never sends its neighbours
//! round again, and a message that keeps failing reaches the dead-letter queue after the
//! redrive policy's receive count.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};

use super::{BatchReport, Consumer, Delivery};

/// One SQS record as the consumer takes it: its string message attributes, its FIFO
/// group (the `MessageGroupId` system attribute), its receive count and its X-Ray trace
/// header (`AWSTraceHeader`).
pub fn delivery(record: SqsMessage) -> Delivery {
    let system = |name: &str| record.attributes.get(name).cloned();
    Delivery {
        receive_count: system("ApproximateReceiveCount")
            .and_then(|count| count.parse().ok())
            .unwrap_or(1),
        trace_header: system("AWSTraceHeader"),
        group_id: system("MessageGroupId"),
        attributes: record
            .message_attributes
            .iter()
            .filter_map(|(name, attribute)| Some((name.clone(), attribute.string_value.clone()?)))
            .collect(),
        message_id: record.message_id.unwrap_or_default(),
        receipt: record.receipt_handle.unwrap_or_default(),
        body: record.body.unwrap_or_default(),
    }
}

/// The partial batch response for a report: the ids of the failed messages.
pub fn batch_response(report: &BatchReport) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for id in report.failed_message_ids() {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id.to_owned();
        response.batch_item_failures.push(failure);
    }
    response
}

/// Handles one SQS event: processes its messages (FIFO groups in order, the rest
/// concurrently) and answers with the ones to retry.
pub async fn handle_event(consumer: &Consumer, event: SqsEvent) -> SqsBatchResponse {
    let deliveries: Vec<Delivery> = event.records.into_iter().map(delivery).collect();
    let report = consumer.consume_batch(&deliveries).await;
    batch_response(&report)
}
