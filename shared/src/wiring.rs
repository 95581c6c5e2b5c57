//! Where the adapters meet the paths: the ports of the request path, the control path
//! and the consumers, built from a backend (AWS or embedded). It sits above both, so that
//! the adapters never look up at the paths they serve.

use std::sync::Arc;

use crate::aws::{AwsBackend, BackendError, SdkConfig};
use crate::consumer::ConsumerPorts;
use crate::control::ControlPorts;
use crate::embedded::EmbeddedBackend;
use crate::native::NativeOutbox;
use crate::ports::{Clock, RandomIds};
use crate::request::{Outbox, RequestPorts};
use crate::settings::Settings;

impl AwsBackend {
    /// The request path's ports, with random transaction ids.
    pub fn request_ports(&self, clock: Arc<dyn Clock>) -> RequestPorts {
        RequestPorts {
            store: self.store(clock.clone()),
            control_queue: self.control_queue(),
            clock,
            ids: Arc::new(RandomIds),
        }
    }

    /// The control path's ports.
    pub fn control_ports(&self, clock: Arc<dyn Clock>) -> ControlPorts {
        ControlPorts {
            store: self.store(clock.clone()),
            control_queue: self.control_queue(),
            publisher: self.publisher(),
            clock,
        }
    }

    /// The request path as `settings` configure it (see [`Outbox::from_settings`]).
    pub fn outbox(&self, settings: &Settings, clock: Arc<dyn Clock>) -> Outbox {
        Outbox::from_settings(self.request_ports(clock), settings, self.publisher())
    }
}

impl EmbeddedBackend {
    /// The request path's ports over this backend, with random transaction ids.
    pub fn request_ports(&self, clock: Arc<dyn Clock>) -> RequestPorts {
        RequestPorts {
            store: self.store.clone(),
            control_queue: self.control_queue.clone(),
            clock,
            ids: Arc::new(RandomIds),
        }
    }

    /// A consumer's ports over this backend (its table and destinations), with random
    /// attempt ids.
    pub fn consumer_ports(&self, clock: Arc<dyn Clock>) -> ConsumerPorts {
        ConsumerPorts {
            store: self.store.clone(),
            publisher: self.publisher.clone(),
            clock,
            ids: Arc::new(RandomIds),
        }
    }

    /// The control path's ports over this backend.
    pub fn control_ports(&self, clock: Arc<dyn Clock>) -> ControlPorts {
        ControlPorts {
            store: self.store.clone(),
            control_queue: self.control_queue.clone(),
            publisher: self.publisher.clone(),
            clock,
        }
    }
}

/// The request path with native actions on the table and control queue `settings` name
/// (the layout of the protocol's records included), with clients from `config`: what a
/// service's `main` builds once. The table is described first, and refused where this
/// process must not write it ([`AwsBackend::check_table`]).
pub async fn native_outbox(settings: &Settings, config: &SdkConfig) -> Result<NativeOutbox, BackendError> {
    let backend = AwsBackend::connect(settings, config).await?;
    let outbox = backend.outbox(settings, Arc::new(crate::ports::SystemClock));
    Ok(NativeOutbox::new(outbox).expect("the DynamoDB store runs native actions"))
}
