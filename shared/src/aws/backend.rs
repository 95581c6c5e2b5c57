//! A complete AWS deployment, as the settings name it: the clients, the table with its
//! layout, the control queue and the destinations. The counterpart of
//! [`crate::embedded::EmbeddedBackend`]; every process that runs on AWS builds its ports
//! from one ([`crate::wiring`]).

use std::sync::Arc;

use super::regions::{check_table_regions, RegionError, TableRegions};
use super::{load_sdk_config, AwsClients, AwsPublisher, DynamoStore, SdkConfig, SqsControlQueue};
use crate::ports::Clock;
use crate::settings::{vars, Backend, Settings, TableLayout};

/// The settings name the embedded backend, where a service needs DynamoDB and SQS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} must be aws: this process runs on DynamoDB and SQS", vars::BACKEND)]
pub struct NotOnAws;

/// Why a process cannot start on the AWS backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The settings name the embedded backend.
    #[error(transparent)]
    NotOnAws(#[from] NotOnAws),
    /// The table is one this process must not write (replicated to other Regions, or
    /// written from another Region), or could not be described.
    #[error(transparent)]
    Table(#[from] RegionError),
}

/// The AWS adapters for one process: built once at start-up, cloned freely.
#[derive(Clone)]
pub struct AwsBackend {
    /// The clients, from one SDK configuration.
    pub clients: AwsClients,
    /// The table of the protocol's records, and how they are keyed.
    pub layout: TableLayout,
    /// The control queue's URL.
    pub control_queue_url: String,
    /// The one Region that writes the table, where it is named (`OUTBOX_WRITE_REGION`).
    pub write_region: Option<String>,
    publisher: Arc<AwsPublisher>,
}

impl AwsBackend {
    /// The backend `settings` name, with clients from `config`. It makes no call: a
    /// process's start goes through [`Self::connect`] or [`Self::from_settings`], which
    /// check the table's Regions too.
    pub fn new(settings: &Settings, config: &SdkConfig) -> Result<Self, NotOnAws> {
        let Backend::Aws {
            layout,
            control_queue_url,
            write_region,
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
            write_region: write_region.clone(),
        })
    }

    /// The backend `settings` name, with clients from `config`, once its table is seen to
    /// be one this process may write ([`Self::check_table`]): what a process builds at
    /// start-up.
    pub async fn connect(settings: &Settings, config: &SdkConfig) -> Result<Self, BackendError> {
        let backend = Self::new(settings, config)?;
        backend.check_table().await?;
        Ok(backend)
    }

    /// [`Self::connect`] with clients from the standard chain and the settings' SDK
    /// timeouts ([`load_sdk_config`]).
    pub async fn from_settings(settings: &Settings) -> Result<Self, BackendError> {
        if !matches!(settings.backend, Backend::Aws { .. }) {
            return Err(NotOnAws.into());
        }
        Self::connect(settings, &load_sdk_config(settings.sdk_operation_timeout).await).await
    }

    /// Reads the table's description (one `DescribeTable`) and refuses a table this
    /// process must not write: one with replicas in other Regions, unless
    /// `OUTBOX_WRITE_REGION` names this process's Region; one with multi-Region strong
    /// consistency; any table, from a process outside the Region named
    /// ([`crate::aws::regions`]).
    pub async fn check_table(&self) -> Result<TableRegions, RegionError> {
        check_table_regions(&self.clients.dynamodb, &self.layout.table, self.write_region.as_deref()).await
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
