//! From settings to a ready control path and control queue, once per process.

use std::sync::Arc;

use crate::aws::{load_sdk_config, AwsBackend, AwsClients, BackendError, RegionError, SdkConfig, SqsControlQueue};
use crate::control::ControlPath;
use crate::ports::{Clock, Store, SystemClock};
use crate::settings::{vars, Settings};

/// What the worker runs with.
pub struct Worker {
    /// The control path.
    pub control: ControlPath,
    /// The control queue, for the local poller.
    pub control_queue: Arc<SqsControlQueue>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// The table, for commands that read it (a consumer's state of a chain).
    pub store: Arc<dyn Store>,
    /// The clients, for commands such as the redrive.
    pub clients: AwsClients,
    /// The control queue's URL.
    pub control_queue_url: String,
}

/// Why the worker cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The worker runs against AWS (or an emulator) only: the embedded backend lives
    /// inside the API process, which runs its own worker.
    #[error(
        "the control worker needs {}=aws; the embedded backend runs its worker inside the API (`cargo run -p api`)",
        vars::BACKEND
    )]
    EmbeddedBackend,
    /// The table is one this process must not write (replicated to other Regions, or
    /// written from another Region), or could not be described.
    #[error(transparent)]
    Table(#[from] RegionError),
}

impl Worker {
    /// Builds the clients (from the standard chain, with the settings' timeouts) and the
    /// control path from `settings`, once the table is seen to be one this process may
    /// write ([`AwsBackend::check_table`]).
    pub async fn from_settings(settings: &Settings) -> Result<Self, SetupError> {
        Self::connect(settings, &load_sdk_config(settings.sdk_operation_timeout).await).await
    }

    /// [`Self::from_settings`] with clients from `sdk_config`.
    pub async fn connect(settings: &Settings, sdk_config: &SdkConfig) -> Result<Self, SetupError> {
        let backend = AwsBackend::connect(settings, sdk_config)
            .await
            .map_err(|error| match error {
                BackendError::Table(refused) => SetupError::Table(refused),
                _ => SetupError::EmbeddedBackend,
            })?;
        Ok(Self::of(settings, backend))
    }

    /// Builds the clients from `sdk_config` and the control path from `settings`, making
    /// no call (the table is not described: [`Self::from_settings`] is a process's start).
    pub fn new(settings: &Settings, sdk_config: &SdkConfig) -> Result<Self, SetupError> {
        let backend = AwsBackend::new(settings, sdk_config).map_err(|_| SetupError::EmbeddedBackend)?;
        Ok(Self::of(settings, backend))
    }

    fn of(settings: &Settings, backend: AwsBackend) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ports = backend.control_ports(clock.clone());
        Self {
            control: ControlPath::new(ports, settings.timing),
            control_queue: backend.control_queue(),
            store: backend.store(clock.clone()),
            clock,
            clients: backend.clients,
            control_queue_url: backend.control_queue_url,
        }
    }
}
