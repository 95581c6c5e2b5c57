//! The AWS adapters: the store on DynamoDB, the control queue on SQS, the publisher to
//! SQS queues, SNS topics and EventBridge buses, client construction, and the bootstrap of
//! local resources (for the emulator).

mod backend;
mod bootstrap;
mod dynamodb;
mod eventbridge;
pub mod invocation_trace;
mod item;
mod layout;
mod publisher;
pub mod regions;
mod send_outcome;
mod size;
mod sns;
mod sqs;

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
pub use aws_config::SdkConfig;

pub use crate::settings::{
    LayoutError, SortKey, SortKeyValue, TableLayout, DEFAULT_PARTITION_KEY, DEFAULT_TTL_ATTRIBUTE, RESERVED_ATTRIBUTES,
    RESERVED_PREFIXES,
};
pub use backend::{AwsBackend, BackendError, NotOnAws};
pub use bootstrap::{
    bootstrap, outbox_event_pattern, BootstrapError, BootstrappedConsumer, ConsumerResource, DestinationResource,
    ResourceNames, Resources, DESTINATION_VISIBILITY_TIMEOUT,
};
pub use dynamodb::{branches, DynamoStore, MAX_ACTIONS, MAX_TRANSACTION_BYTES};
pub use invocation_trace::InvocationTrace;
pub use publisher::AwsPublisher;
pub use regions::{check_table_regions, RegionError, TableRegions};
pub use sqs::{
    dead_letter_source, queue_retention, queue_visibility_timeout, receive_timeouts, redrive, SqsControlQueue,
    SqsInbox, RECEIVE_TIMEOUT_MARGIN,
};

/// The SDK configuration for this process: the standard credential chain and region
/// (and `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_DYNAMODB`, for emulators), explicit
/// timeouts, standard retries. Load it once per process and build every client from it.
pub async fn load_sdk_config(operation_timeout: Duration) -> SdkConfig {
    sdk_config_loader(operation_timeout).load().await
}

/// What [`load_sdk_config`] loads, before loading: for a caller that sets more (a test
/// pointing the production settings at a stub).
pub fn sdk_config_loader(operation_timeout: Duration) -> aws_config::ConfigLoader {
    aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(timeouts(operation_timeout))
        .retry_config(RetryConfig::standard().with_max_attempts(3))
}

/// The timeouts for an operation timeout: each attempt gets half of it, so that one
/// retry always fits, and connecting gets at most two seconds.
pub fn timeouts(operation_timeout: Duration) -> TimeoutConfig {
    TimeoutConfig::builder()
        .operation_timeout(operation_timeout)
        .operation_attempt_timeout(operation_timeout / 2)
        .connect_timeout(operation_timeout.min(Duration::from_secs(2)))
        .build()
}

/// The clients, built once per process from one [`SdkConfig`] (building one makes no
/// call; an unused one costs nothing).
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// SQS.
    pub sqs: aws_sdk_sqs::Client,
    /// SNS, for destination topics.
    pub sns: aws_sdk_sns::Client,
    /// EventBridge, for destination buses.
    pub eventbridge: aws_sdk_eventbridge::Client,
}

impl AwsClients {
    /// Every client from `config`.
    pub fn new(config: &SdkConfig) -> Self {
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(config),
            sqs: aws_sdk_sqs::Client::new(config),
            sns: aws_sdk_sns::Client::new(config),
            eventbridge: aws_sdk_eventbridge::Client::new(config),
        }
    }
}
