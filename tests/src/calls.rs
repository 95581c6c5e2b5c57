//! Counts the AWS API calls that reach the wire, by operation, and their replies' HTTP
//! statuses, with an SDK interceptor.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_config::SdkConfig;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut,
    BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use outbox::aws::AwsClients;

/// A request sent: its operation and its body.
type Sent = (String, Vec<u8>);

/// Counts every attempt sent, by its operation's name (`TransactWriteItems`,
/// `PublishBatch`, `PutEvents`), which every SDK operation stores in its config bag
/// whatever its wire protocol (SNS's query protocol has no `X-Amz-Target` header).
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    sent: Arc<Mutex<BTreeMap<String, usize>>>,
    bodies: Arc<Mutex<Vec<Sent>>>,
    replies: Arc<Mutex<Vec<(String, u16)>>>,
}

fn operation(cfg: &ConfigBag) -> String {
    cfg.load::<Metadata>()
        .map_or_else(|| "unknown".to_owned(), |metadata| metadata.name().to_owned())
}

impl CallCounter {
    /// The counts so far.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.sent.lock().expect("counter lock").clone()
    }

    /// The body of every request of `operation` sent so far, in order (empty for a
    /// streamed body).
    pub fn bodies(&self, operation: &str) -> Vec<Vec<u8>> {
        self.bodies
            .lock()
            .expect("counter lock")
            .iter()
            .filter(|(name, _)| name == operation)
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// The HTTP status of every reply to `operation` so far, in the order they came.
    pub fn replies(&self, operation: &str) -> Vec<u16> {
        self.replies
            .lock()
            .expect("counter lock")
            .iter()
            .filter(|(name, _)| name == operation)
            .map(|(_, status)| *status)
            .collect()
    }

    /// Forgets the counts and replies so far.
    pub fn reset(&self) {
        self.sent.lock().expect("counter lock").clear();
        self.bodies.lock().expect("counter lock").clear();
        self.replies.lock().expect("counter lock").clear();
    }

    /// Every client, counting through this counter.
    pub fn clients(&self, config: &SdkConfig) -> AwsClients {
        AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(config)
                    .interceptor(self.clone())
                    .build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(config)
                    .interceptor(self.clone())
                    .build(),
            ),
            sns: aws_sdk_sns::Client::from_conf(
                aws_sdk_sns::config::Builder::from(config)
                    .interceptor(self.clone())
                    .build(),
            ),
            eventbridge: aws_sdk_eventbridge::Client::from_conf(
                aws_sdk_eventbridge::config::Builder::from(config)
                    .interceptor(self.clone())
                    .build(),
            ),
        }
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context.request().body().bytes().unwrap_or_default().to_vec();
        self.bodies.lock().expect("counter lock").push((operation(cfg), body));
        *self
            .sent
            .lock()
            .expect("counter lock")
            .entry(operation(cfg))
            .or_default() += 1;
        Ok(())
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let status = context.response().status().as_u16();
        self.replies
            .lock()
            .expect("counter lock")
            .push((operation(cfg), status));
        Ok(())
    }
}

/// The operation an `X-Amz-Target` header names (`DynamoDB_20120810.TransactWriteItems`
/// is `TransactWriteItems`), or `unknown`.
pub fn operation_of(target: Option<&str>) -> String {
    let target = target.unwrap_or("unknown");
    target.rsplit('.').next().unwrap_or(target).to_owned()
}

/// Drops `ClientRequestToken` from every `TransactWriteItems` before it is sent: what a
/// retry looks like to DynamoDB once the token's ten-minute window has passed (a new
/// request, which the transaction's own record then cancels), without waiting ten
/// minutes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForgetToken;

impl Intercept for ForgetToken {
    fn name(&self) -> &'static str {
        "ForgetToken"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context
            .input_mut()
            .downcast_mut::<aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput>(
        ) {
            input.client_request_token = None;
        }
        Ok(())
    }
}
