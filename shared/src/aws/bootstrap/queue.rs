//! Queues: created with their attributes (or brought to them when they exist), their
//! dead-letter queues, their ARNs, and the policy that lets a topic or a rule send to them.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;

use super::BootstrapError;
use crate::aws::AwsClients;
use crate::ports::BoxError;

/// The ARN of the queue at `url`.
pub(super) async fn queue_arn(clients: &AwsClients, url: &str) -> Result<String, BoxError> {
    clients
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes()
        .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or_else(|| "the queue has no ARN".into())
}

/// Lets the service `principal` send to the queue at `url` on behalf of `source_arn`
/// only (AWS's policy for topic subscriptions and rule targets).
pub(super) async fn allow_sends(
    clients: &AwsClients,
    url: &str,
    queue_arn: &str,
    principal: &str,
    source_arn: &str,
) -> Result<(), BoxError> {
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": { "Service": principal },
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": { "ArnEquals": { "aws:SourceArn": source_arn } },
        }],
    });
    clients
        .sqs
        .set_queue_attributes()
        .queue_url(url)
        .attributes(QueueAttributeName::Policy, policy.to_string())
        .send()
        .await?;
    Ok(())
}

/// How long a dead-letter queue keeps a message: SQS's most, as `template.yaml`'s dead-letter
/// queues (a consumer's retention counts it, C4).
const DEAD_LETTER_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// A dead-letter queue keeping messages [`DEAD_LETTER_RETENTION`].
pub(super) async fn create_dead_letter_queue(clients: &AwsClients, name: &str) -> Result<String, BootstrapError> {
    let url = create_queue(clients, name, None, None).await?;
    clients
        .sqs
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(
            QueueAttributeName::MessageRetentionPeriod,
            DEAD_LETTER_RETENTION.as_secs().to_string(),
        )
        .send()
        .await
        .map_err(|e| BootstrapError::Queue {
            queue: name.to_owned(),
            source: Box::new(e),
        })?;
    Ok(url)
}

/// Creates queue `name` (FIFO when the name ends in `.fifo`) with the visibility timeout
/// and the redrive policy given, or brings an existing one to them; returns its URL.
pub(super) async fn create_queue(
    clients: &AwsClients,
    name: &str,
    dead_letter: Option<(&str, u32)>,
    visibility_timeout: Option<Duration>,
) -> Result<String, BootstrapError> {
    let failed = |source: BoxError| BootstrapError::Queue {
        queue: name.to_owned(),
        source,
    };
    let mut attributes = HashMap::new();
    if name.ends_with(".fifo") {
        attributes.insert(QueueAttributeName::FifoQueue, "true".to_owned());
    }
    if let Some(timeout) = visibility_timeout {
        attributes.insert(QueueAttributeName::VisibilityTimeout, timeout.as_secs().to_string());
    }
    if let Some((dead_letter_url, max_receive_count)) = dead_letter {
        let arn = clients
            .sqs
            .get_queue_attributes()
            .queue_url(dead_letter_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| failed(Box::new(e)))?
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| failed("the dead-letter queue has no ARN".into()))?;
        let policy =
            serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count.to_string() });
        attributes.insert(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    let created = clients
        .sqs
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes.clone()))
        .send()
        .await;
    let error = match created {
        Ok(output) => {
            return output
                .queue_url()
                .map(str::to_owned)
                .ok_or_else(|| failed("no queue URL in the answer".into()))
        }
        Err(error) => error,
    };
    // A queue of that name with other attributes (one an earlier bootstrap made before
    // they changed): brought to these, its kind (FIFO or not) aside, which cannot change.
    // SQS names this error QueueNameExists, its query protocol (and moto)
    // QueueAlreadyExists; any other error is the answer.
    use aws_sdk_sqs::error::ProvideErrorMetadata;
    if !matches!(error.code(), Some("QueueNameExists" | "QueueAlreadyExists")) {
        return Err(failed(Box::new(error)));
    }
    let existing = clients
        .sqs
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let url = existing
        .queue_url()
        .map(str::to_owned)
        .ok_or_else(|| failed("no queue URL in the answer".into()))?;
    attributes.remove(&QueueAttributeName::FifoQueue);
    if !attributes.is_empty() {
        clients
            .sqs
            .set_queue_attributes()
            .queue_url(&url)
            .set_attributes(Some(attributes))
            .send()
            .await
            .map_err(|e| failed(Box::new(e)))?;
        tracing::info!(
            queue = name,
            "an existing queue's attributes were brought to the template's"
        );
    }
    Ok(url)
}
