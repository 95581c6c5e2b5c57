//! SNS topics: a destination published through a topic that its queue subscribes to.

use super::queue::{allow_sends, queue_arn};
use super::BootstrapError;
use crate::aws::AwsClients;
use crate::destination::Target;
use crate::ports::BoxError;

/// Creates topic `name` (FIFO when the name ends in `.fifo`) and subscribes the queue
/// at `queue_url` to it with raw message delivery.
pub(super) async fn create_topic(clients: &AwsClients, name: &str, queue_url: &str) -> Result<Target, BootstrapError> {
    let failed = |source: BoxError| BootstrapError::Topic {
        topic: name.to_owned(),
        source,
    };
    let fifo = name.ends_with(".fifo");
    let mut create = clients.sns.create_topic().name(name);
    if fifo {
        create = create.attributes("FifoTopic", "true");
    }
    let arn = create
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?
        .topic_arn()
        .map(str::to_owned)
        .ok_or_else(|| failed("no topic ARN in the answer".into()))?;
    let queue_arn = queue_arn(clients, queue_url).await.map_err(failed)?;
    allow_sends(clients, queue_url, &queue_arn, "sns.amazonaws.com", &arn)
        .await
        .map_err(failed)?;
    clients
        .sns
        .subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .return_subscription_arn(true)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    Ok(Target::SnsTopic { arn, fifo })
}
