//! A complete AWS deployment, as the settings name it: the clients, the table with its
//! layout, the control queue and the destinations. The counterpart of
//! [`crate::embedded::EmbeddedBackend`]; every process that runs on AWS builds its ports
//! from one ([`crate::wiring`]).

use std::sync::Arc;

use super::{load_sdk_config, AwsClients, AwsPublisher, DynamoStore, SdkConfig, SqsControlQueue};
use crate::ports::Clock;
use crate::settings::{vars, Backend, Settings, TableLayout};

/// The settings name the embedded backend, where a service needs DynamoDB and SQS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} must be aws: this process runs on DynamoDB and SQS", vars::BACKEND)]
pub struct NotOnAws;

/// The AWS adapters for one process: built once at start-up, cloned freely.
#[derive(Clone)]
pub struct AwsBackend {
    /// The clients, from one SDK configuration.
    pub clients: AwsClients,
    /// The table of the protocol's records, and how they are keyed.
    pub layout: TableLayout,
    /// The control queue's URL.
    pub control_queue_url: String,
    publisher: Arc<AwsPublisher>,
}

impl AwsBackend {
    /// The backend `settings` name, with clients from `config`.
    pub fn new(settings: &Settings, config: &SdkConfig) -> Result<Self, NotOnAws> {
        let Backend::Aws {
            layout,
            control_queue_url,
        } = &settings.backend
        else {
            return Err(NotOnAws);
        };
        let clients = AwsClients::new(config);
        Ok(Self {
            publisher: Arc::new(AwsPublisher::new(clients.clone(), settings.destinations.clone())),
            clients,
            layout: layout.clone(),
            control_queue_url: control_queue_url.clone(),
        })
    }

    /// The backend `settings` name, with clients from the standard chain and the
    /// settings' SDK timeouts ([`load_sdk_config`]).
    pub async fn from_settings(settings: &Settings) -> Result<Self, NotOnAws> {
        if !matches!(settings.backend, Backend::Aws { .. }) {
            return Err(NotOnAws);
        }
        Self::new(settings, &load_sdk_config(settings.sdk_operation_timeout).await)
    }

    /// The store on the table, its time from `clock`.
    pub fn store(&self, clock: Arc<dyn Clock>) -> Arc<DynamoStore> {
        Arc::new(DynamoStore::new(
            self.clients.dynamodb.clone(),
            self.layout.clone(),
            clock,
        ))
    }

    /// The control queue.
    pub fn control_queue(&self) -> Arc<SqsControlQueue> {
        Arc::new(SqsControlQueue::new(
            self.clients.sqs.clone(),
            self.control_queue_url.clone(),
        ))
    }

    /// The publisher to the settings' destinations.
    pub fn publisher(&self) -> Arc<AwsPublisher> {
        self.publisher.clone()
    }
}
