//! EventBridge buses: a destination published through a bus whose rule sends every outbox
//! event to its queue.

use super::queue::{allow_sends, queue_arn};
use super::BootstrapError;
use crate::aws::AwsClients;
use crate::destination::Target;
use crate::ports::BoxError;
use crate::protocol::MESSAGE_ID_ATTRIBUTE;

/// The pattern of the rule that [`super::bootstrap`] puts on a bus: every event whose detail
/// carries an outbox message id ([`crate::event_detail`]).
pub fn outbox_event_pattern() -> String {
    serde_json::json!({ "detail": { "metadata": { MESSAGE_ID_ATTRIBUTE: [{ "exists": true }] } } }).to_string()
}

/// Creates bus `name` (unless it is `default`) and a rule on it that sends every outbox
/// event ([`outbox_event_pattern`]) to the queue at `queue_url`. The rule is named after
/// the queue (its last 64 characters, the most a rule name takes).
pub(super) async fn create_bus(clients: &AwsClients, name: &str, queue_url: &str) -> Result<Target, BootstrapError> {
    use aws_sdk_eventbridge::operation::create_event_bus::CreateEventBusError;

    let failed = |source: BoxError| BootstrapError::Bus {
        bus: name.to_owned(),
        source,
    };
    if name != "default" {
        match clients.eventbridge.create_event_bus().name(name).send().await {
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.as_service_error(),
                    Some(CreateEventBusError::ResourceAlreadyExistsException(_))
                ) => {}
            Err(error) => return Err(failed(Box::new(error))),
        }
    }
    let queue_arn = queue_arn(clients, queue_url).await.map_err(failed)?;
    let queue_name = queue_arn.rsplit(':').next().unwrap_or(&queue_arn);
    let rule = &queue_name[queue_name.len().saturating_sub(64)..];
    let rule_arn = clients
        .eventbridge
        .put_rule()
        .name(rule)
        .event_bus_name(name)
        .event_pattern(outbox_event_pattern())
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?
        .rule_arn()
        .map(str::to_owned)
        .ok_or_else(|| failed("no rule ARN in the answer".into()))?;
    allow_sends(clients, queue_url, &queue_arn, "events.amazonaws.com", &rule_arn)
        .await
        .map_err(failed)?;
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id("outbox-queue")
        .arn(&queue_arn)
        .build()
        .map_err(|e| failed(Box::new(e)))?;
    let put = clients
        .eventbridge
        .put_targets()
        .rule(rule)
        .event_bus_name(name)
        .targets(target)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    if put.failed_entry_count() > 0 {
        return Err(failed(
            format!("the rule's target was refused: {:?}", put.failed_entries()).into(),
        ));
    }
    Ok(Target::EventBus {
        name_or_arn: name.to_owned(),
    })
}
