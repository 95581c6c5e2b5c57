//! The variants measured, and what one request does in each: the same business step
//! (read one item, write it back under its version, publish one event) made with the
//! outbox, inline publishing off or on, and without it, as baselines.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use outbox::embedded::{EmbeddedBackend, SendRequest};
use outbox::ports::{Clock, ExpectedVersion, ItemKey, Store, SystemClock};
use outbox::protocol::{DestinationName, Message};
use outbox::request::{InlineDispatch, Outbox, RequestPorts};
use outbox::settings::{Timing, TransactionLimits};
use serde_json::json;

use crate::latency::{Call, Delays};
use crate::ports::{SlowControlQueue, SlowPublisher, SlowQueue, SlowStore};
use crate::BenchError;

/// The destination every variant publishes its event to.
pub const EVENTS: &str = "events";

/// How long a request may take, as the API's own timeout would give it. Never reached
/// here; it makes the request path race each call against a timer, as it does in the API.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// One way of making the business step. Add a variant here (with its calls and its
/// request in [`Rig::request`]) and every report shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Baseline: a consistent read and a conditional put, no event at all.
    PlainPut,
    /// Baseline: the plain put, then `SendMessage` of the event. Not atomic (a crash
    /// between the two loses the event, a failed send after the write leaves it unsent):
    /// the cost floor of publishing, without the guarantee.
    DualWrite,
    /// The outbox, inline publishing off: the control worker publishes about a second
    /// later (the first check's delay).
    OutboxOff,
    /// The outbox with inline publishing: the request publishes and marks the record
    /// dispatched itself before answering.
    OutboxInline,
}

impl Variant {
    /// Every variant, in the order reported.
    pub const ALL: [Variant; 4] = [
        Variant::PlainPut,
        Variant::DualWrite,
        Variant::OutboxOff,
        Variant::OutboxInline,
    ];

    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Variant::PlainPut => "plain-put",
            Variant::DualWrite => "dual-write",
            Variant::OutboxOff => "off",
            Variant::OutboxInline => "inline",
        }
    }

    /// The AWS calls one request makes, in order: what the model column adds up.
    pub fn calls(self) -> &'static [Call] {
        match self {
            Variant::PlainPut => &[Call::Get, Call::Put],
            Variant::DualWrite => &[Call::Get, Call::Put, Call::Send],
            Variant::OutboxOff => &[Call::Send, Call::Get, Call::Transact],
            Variant::OutboxInline => &[Call::Send, Call::Get, Call::Transact, Call::SendBatch, Call::Update],
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Variant {
    type Err = String;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Variant::ALL
            .into_iter()
            .find(|variant| variant.name() == input)
            .ok_or_else(|| {
                let known: Vec<&str> = Variant::ALL.iter().map(|variant| variant.name()).collect();
                format!("unknown variant {input:?} (known: {})", known.join(", "))
            })
    }
}

/// A fresh embedded deployment for one variant, wrapped in the latencies, with its items
/// already written. Each request `index` works on its own item, so no two requests
/// contend and every conditional write succeeds.
pub struct Rig {
    variant: Variant,
    clock: Arc<dyn Clock>,
    store: Arc<SlowStore>,
    events: SlowQueue,
    events_name: DestinationName,
    outbox: Option<Outbox>,
}

impl Rig {
    /// A rig for `variant` over a new backend, its items `0..items` written once (at
    /// version 1) without latency, so that every request reads an existing item.
    pub async fn new(variant: Variant, delays: Arc<Delays>, items: usize) -> Result<Self, BenchError> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let events_name: DestinationName = EVENTS.parse().expect("a valid destination name");
        let backend = EmbeddedBackend::new(clock.clone(), [(events_name.clone(), false)]);
        seed(&backend, clock.clone(), items).await?;

        let store = Arc::new(SlowStore::new(backend.store.clone(), delays.clone()));
        let events_queue = backend
            .publisher
            .queue(&events_name)
            .expect("the backend was built with this destination")
            .clone();
        let outbox = match variant {
            Variant::PlainPut | Variant::DualWrite => None,
            Variant::OutboxOff | Variant::OutboxInline => {
                let ports = RequestPorts {
                    store: store.clone(),
                    control_queue: Arc::new(SlowControlQueue::new(backend.control_queue.clone(), delays.clone())),
                    clock: clock.clone(),
                    ids: Arc::new(outbox::ports::RandomIds),
                };
                let outbox = Outbox::new(ports, Timing::default(), TransactionLimits::default());
                Some(if variant == Variant::OutboxInline {
                    outbox
                        .with_inline_publisher(Arc::new(SlowPublisher::new(backend.publisher.clone(), delays.clone())))
                } else {
                    outbox
                })
            }
        };
        Ok(Self {
            variant,
            clock,
            store,
            events: SlowQueue::new(events_queue, delays),
            events_name,
            outbox,
        })
    }

    /// One request on item `index`.
    pub async fn request(&self, index: usize) -> Result<(), BenchError> {
        let key = item_key(index);
        match &self.outbox {
            Some(outbox) => self.outbox_request(outbox, key).await,
            None => self.plain_request(key).await,
        }
    }

    /// The orders example's shape: begin (the control message), read, put under the
    /// version read, emit one event, commit.
    async fn outbox_request(&self, outbox: &Outbox, key: ItemKey) -> Result<(), BenchError> {
        let deadline = self.clock.now().plus(REQUEST_DEADLINE);
        let mut txn = outbox.begin_within(deadline).await?;
        let item = txn.get(&key).await?.ok_or(BenchError::Missing(key.clone()))?;
        let count = item.data["count"].as_u64().unwrap_or(0) + 1;
        txn.put(
            key.clone(),
            json!({ "count": count }),
            ExpectedVersion::Exactly(item.version),
        );
        let event = json!({ "type": "ItemCounted", "item": key.as_str(), "count": count });
        txn.emit(Message::json(self.events_name.clone(), &event)?);
        let committed = txn.commit().await?;
        let expected = match self.variant {
            Variant::OutboxInline => InlineDispatch::Dispatched,
            _ => InlineDispatch::Off,
        };
        // Anything else means the variant did not measure what it claims (a publish left
        // to the worker is cheaper or dearer than the path being measured).
        if committed.inline != expected {
            return Err(BenchError::UnexpectedDispatch {
                variant: self.variant,
                got: committed.inline.as_str(),
            });
        }
        Ok(())
    }

    /// The baselines: a consistent read through the slowed store (real), a conditional
    /// put (its latency only, see [`SlowStore::simulated_conditional_put`]), and for the
    /// dual write a real `SendMessage` to the events queue.
    async fn plain_request(&self, key: ItemKey) -> Result<(), BenchError> {
        let items = self.store.get_items(std::slice::from_ref(&key)).await?;
        let item = items.get(&key).ok_or(BenchError::Missing(key.clone()))?;
        let count = item.data["count"].as_u64().unwrap_or(0) + 1;
        self.store.simulated_conditional_put().await;
        if self.variant == Variant::DualWrite {
            let event = json!({ "type": "ItemCounted", "item": key.as_str(), "count": count });
            self.events
                .send_message(SendRequest {
                    body: event.to_string(),
                    ..SendRequest::default()
                })
                .await?;
        }
        Ok(())
    }
}

/// The key of item `index`.
fn item_key(index: usize) -> ItemKey {
    format!("ITEM#{index}").parse().expect("a valid item key")
}

/// Writes items `0..items` at version 1 through an outbox over the bare backend.
async fn seed(backend: &EmbeddedBackend, clock: Arc<dyn Clock>, items: usize) -> Result<(), BenchError> {
    let outbox = Outbox::new(
        backend.request_ports(clock),
        Timing::default(),
        TransactionLimits::default(),
    );
    for index in 0..items {
        let mut txn = outbox.begin().await?;
        txn.put(item_key(index), json!({ "count": 0 }), ExpectedVersion::Absent);
        txn.commit().await?;
    }
    Ok(())
}
