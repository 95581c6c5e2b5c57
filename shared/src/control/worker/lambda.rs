//! The Lambda handler for the control queue's SQS events.
//!
//! It answers with a partial batch response (`ReportBatchItemFailures`): only the
//! messages that must be retried are listed, so one bad message never sends its
//! neighbours round again, and a message that keeps failing reaches the dead-letter
//! queue after the redrive policy's receive count. Before answering, it shortens the
//! failed messages' visibility ([`crate::control::redelivery`]): the event source mapping
//! leaves them in the queue, and they come back in seconds instead of after the
//! queue's visibility timeout.

use crate::control::redelivery::retry_failed_soon;
use crate::control::{BatchReport, ControlPath};
use crate::ports::{Clock, ControlDelivery, ControlInbox};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use super::batch_metrics;

/// The control messages of an SQS event, as the control path takes them.
pub fn deliveries(event: SqsEvent) -> Vec<ControlDelivery> {
    event
        .records
        .into_iter()
        .map(|record| ControlDelivery {
            receive_count: record
                .attributes
                .get("ApproximateReceiveCount")
                .and_then(|count| count.parse().ok())
                .unwrap_or(1),
            message_id: record.message_id.unwrap_or_default(),
            receipt: record.receipt_handle.unwrap_or_default(),
            body: record.body.unwrap_or_default(),
        })
        .collect()
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

/// Handles one SQS event: settles its control messages as a batch, makes the failed
/// ones come back soon through `inbox` (the control queue), emits the batch's metrics,
/// and answers with the messages to retry.
pub async fn handle_event(
    control: &ControlPath,
    inbox: &dyn ControlInbox,
    clock: &dyn Clock,
    event: SqsEvent,
) -> SqsBatchResponse {
    let deliveries = deliveries(event);
    let report = control.handle_batch(&deliveries).await;
    retry_failed_soon(inbox, &deliveries, &report, clock).await;
    batch_metrics::for_batch(&report, clock.now()).emit();
    batch_response(&report)
}
