//! From settings to a ready control path and control queue, once per process.

use std::sync::Arc;

use crate::aws::{load_sdk_config, AwsBackend, AwsClients, SdkConfig, SqsControlQueue};
use crate::control::ControlPath;
use crate::ports::{Clock, SystemClock};
use crate::settings::{vars, Settings};

/// What the worker runs with.
pub struct Worker {
    /// The control path.
    pub control: ControlPath,
    /// The control queue, for the local poller.
    pub control_queue: Arc<SqsControlQueue>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
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
}

impl Worker {
    /// Builds the clients (from the standard chain, with the settings' timeouts) and the
    /// control path from `settings`.
    pub async fn from_settings(settings: &Settings) -> Result<Self, SetupError> {
        Self::new(settings, &load_sdk_config(settings.sdk_operation_timeout).await)
    }

    /// Builds the clients from `sdk_config` and the control path from `settings`.
    pub fn new(settings: &Settings, sdk_config: &SdkConfig) -> Result<Self, SetupError> {
        let backend = AwsBackend::new(settings, sdk_config).map_err(|_| SetupError::EmbeddedBackend)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ports = backend.control_ports(clock.clone());
        Ok(Self {
            control: ControlPath::new(ports, settings.timing),
            control_queue: backend.control_queue(),
            clock,
            clients: backend.clients,
            control_queue_url: backend.control_queue_url,
        })
    }
}
