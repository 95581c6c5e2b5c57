//! The backends the conformance suite runs against, and what the suite needs of them
//! beyond the ports: moving time, and reading what reached a destination.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use outbox::aws::{
    bootstrap, AwsClients, AwsPublisher, DestinationResource, DynamoStore, ResourceNames, SqsControlQueue, TableLayout,
};
use outbox::control::{ControlOutcome, ControlPath, ControlPorts};
use outbox::destination::Target;
use outbox::embedded::{EmbeddedBackend, ManualClock, CONTROL_VISIBILITY_TIMEOUT};
use outbox::ports::{ControlDelivery, ControlInbox, ControlQueue, Publisher, RandomIds, Store};
use outbox::protocol::{
    ControlMessage, DestinationName, Position, TraceContext, TxnId, ENTITY_ATTRIBUTE, MESSAGE_ID_ATTRIBUTE,
    POSITION_ATTRIBUTE, TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE, TXN_ID_ATTRIBUTE,
};
use outbox::request::{Outbox, RequestPorts};
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;

use crate::calls::CallCounter;
use crate::emulator::{emulator, unique_name};
use crate::single_table::{create_single_table, single_table_layout};

/// A message as it reached a destination's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Its body as it arrived (for a bus, the event).
    pub body: String,
    /// Its stable id: an attribute, or for a bus in the event's detail.
    pub message_id: Option<String>,
    /// Its transaction id: an attribute, or for a bus in the event's detail.
    pub txn_id: Option<String>,
    /// For a bus, the event's `source`, `detail-type` and `detail.data`.
    pub event: Option<DeliveredEvent>,
    /// The trace context it carried: its `traceparent` and `tracestate` attributes, or
    /// for a bus in the event's detail.
    pub trace: Option<TraceContext>,
    /// Its place in its entity's history: its `outbox-entity` and `outbox-position`
    /// attributes, or for a bus in the event's detail.
    pub position: Option<Position>,
    /// Its FIFO group, on a FIFO queue.
    pub group_id: Option<String>,
}

/// What of an event a rule's queue target received the outbox set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredEvent {
    /// `source`.
    pub source: String,
    /// `detail-type`.
    pub detail_type: String,
    /// `detail.data`: the message's body.
    pub data: serde_json::Value,
}

impl Delivered {
    /// A message that arrived with `body` and `attributes`, from a bus or not.
    fn new(body: String, attribute: impl Fn(&str) -> Option<String>, from_bus: bool) -> Self {
        if !from_bus {
            let (parent, state) = (attribute(TRACEPARENT_ATTRIBUTE), attribute(TRACESTATE_ATTRIBUTE));
            return Self {
                group_id: None,
                position: position(&attribute),
                message_id: attribute(MESSAGE_ID_ATTRIBUTE),
                txn_id: attribute(TXN_ID_ATTRIBUTE),
                trace: trace(parent, state),
                body,
                event: None,
            };
        }
        let event: serde_json::Value = serde_json::from_str(&body).expect("a bus delivers a JSON event");
        let metadata = |name: &str| event["detail"]["metadata"][name].as_str().map(str::to_owned);
        let text = |name: &str| event[name].as_str().expect("the event names it").to_owned();
        Self {
            group_id: None,
            position: position(&metadata),
            message_id: metadata(MESSAGE_ID_ATTRIBUTE),
            txn_id: metadata(TXN_ID_ATTRIBUTE),
            trace: trace(metadata(TRACEPARENT_ATTRIBUTE), metadata(TRACESTATE_ATTRIBUTE)),
            event: Some(DeliveredEvent {
                source: text("source"),
                detail_type: text("detail-type"),
                data: event["detail"]["data"].clone(),
            }),
            body,
        }
    }
}

/// The position the attributes carry; one that cannot be read fails the test.
fn position(attribute: &impl Fn(&str) -> Option<String>) -> Option<Position> {
    let attributes = [ENTITY_ATTRIBUTE, POSITION_ATTRIBUTE]
        .into_iter()
        .filter_map(|name| attribute(name).map(|value| (name.to_owned(), value)))
        .collect();
    Position::from_attributes(&attributes).expect("a position the outbox wrote")
}

/// The context a `traceparent` (and `tracestate`) name; a `traceparent` that is not one
/// fails the test.
fn trace(parent: Option<String>, state: Option<String>) -> Option<TraceContext> {
    parent.map(|parent| {
        TraceContext::from_traceparent(&parent)
            .expect("a traceparent the outbox wrote")
            .with_tracestate(state.as_deref())
    })
}

enum Queues {
    Embedded(EmbeddedBackend),
    Aws {
        sqs: aws_sdk_sqs::Client,
        /// Each destination's queue.
        destinations: BTreeMap<DestinationName, String>,
    },
}

/// The ports of one backend, plus the suite's handles on time and destinations.
pub struct Backend {
    /// `embedded` or `aws`.
    pub name: &'static str,
    /// The clock the store reads TTLs against (and, embedded, the queues' clock too).
    pub clock: Arc<ManualClock>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The control queue, sending side.
    pub control_queue: Arc<dyn ControlQueue>,
    /// The control queue, receiving side.
    pub inbox: Arc<dyn ControlInbox>,
    /// The publisher, to `events` (a standard queue), `audit` (a FIFO queue), `fanout`
    /// (a topic) and `bus` (a bus).
    pub publisher: Arc<dyn Publisher>,
    /// The control queue's visibility timeout.
    pub visibility_timeout: Duration,
    /// Each destination's target: on AWS the real ones, embedded stand-ins.
    pub targets: BTreeMap<DestinationName, Target>,
    /// On AWS, what reached the wire and how it was answered (unless the backend was
    /// built over clients of the caller's).
    pub wire: Option<CallCounter>,
    /// On AWS, where the protocol's records are.
    pub layout: Option<TableLayout>,
    queues: Queues,
}

/// The destinations every backend has.
pub fn events() -> DestinationName {
    "events".parse().expect("valid")
}

/// The FIFO destination every backend has.
pub fn audit() -> DestinationName {
    "audit".parse().expect("valid")
}

/// The SNS topic destination every backend has; on AWS a queue subscribes to it with raw
/// message delivery.
pub fn fanout() -> DestinationName {
    "fanout".parse().expect("valid")
}

/// The EventBridge bus destination every backend has; on AWS a rule sends its events to a
/// queue.
pub fn bus() -> DestinationName {
    "bus".parse().expect("valid")
}

/// The destinations of the embedded backend: every kind, with stand-in addresses.
fn embedded_targets() -> BTreeMap<DestinationName, Target> {
    let parse = |text: &str| Target::parse(text).expect("valid target").target;
    [
        (
            events(),
            parse("sqs:https://sqs.us-east-1.amazonaws.com/123456789012/events"),
        ),
        (
            audit(),
            parse("sqs-fifo:https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo"),
        ),
        (fanout(), parse("sns:arn:aws:sns:us-east-1:123456789012:fanout")),
        (bus(), parse("eventbridge:bus")),
    ]
    .into_iter()
    .collect()
}

fn start_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_system_time(
        std::time::SystemTime::now(),
    )))
}

impl Backend {
    /// The embedded backend.
    pub fn embedded() -> Self {
        let clock = start_clock();
        let targets = embedded_targets();
        let backend = EmbeddedBackend::for_targets(clock.clone(), &targets);
        Self {
            targets,
            name: "embedded",
            store: backend.store.clone(),
            control_queue: backend.control_queue.clone(),
            inbox: backend.control_queue.clone(),
            publisher: backend.publisher.clone(),
            visibility_timeout: CONTROL_VISIBILITY_TIMEOUT,
            clock,
            wire: None,
            layout: None,
            queues: Queues::Embedded(backend),
        }
    }

    /// The AWS adapters on the emulators, with a fresh table and queues, and a record
    /// of the calls on the wire.
    pub async fn aws() -> Self {
        let wire = CallCounter::default();
        let clients = wire.clients(&emulator().sdk_config().await);
        let mut backend = Self::aws_with(clients).await;
        backend.wire = Some(wire);
        backend
    }

    /// The AWS adapters on the emulator, with fresh queues and the protocol's records in
    /// a fresh single-table design (`PK` + `SK`, a GSI, TTL on `ttl`) made the way its
    /// owners would make it.
    pub async fn aws_single_table() -> Self {
        let wire = CallCounter::default();
        let clients = wire.clients(&emulator().sdk_config().await);
        let table = unique_name("single");
        create_single_table(&clients.dynamodb, &table).await;
        let mut backend = Self::aws_on(clients, Some(single_table_layout(&table))).await;
        backend.wire = Some(wire);
        backend
    }

    /// Whether this is the embedded backend: for the cases that name a difference
    /// between the stores ([`super::differences`]) and assert each side's behaviour.
    pub fn is_embedded(&self) -> bool {
        matches!(self.queues, Queues::Embedded(_))
    }

    /// The engine behind the store: `embedded`, `DynamoDB Local` or `moto`.
    pub fn engine(&self) -> &'static str {
        match self.queues {
            Queues::Embedded(_) => "embedded",
            Queues::Aws { .. } => emulator().dynamodb_engine.as_str(),
        }
    }

    /// The AWS adapters over `clients` (which may carry interceptors), with a fresh table
    /// and queues.
    pub async fn aws_with(clients: AwsClients) -> Self {
        Self::aws_on(clients, None).await
    }

    /// The AWS adapters over `clients`, with fresh queues and the protocol's records laid
    /// out as `layout` says (by default a fresh dedicated table).
    pub async fn aws_on(clients: AwsClients, layout: Option<TableLayout>) -> Self {
        let prefix = unique_name("conf");
        let mut names = ResourceNames::for_stack(&prefix);
        if let Some(layout) = layout {
            names.layout = layout;
        }
        names.destinations.extend([
            (
                audit(),
                DestinationResource::Queue {
                    queue: format!("{prefix}-audit.fifo"),
                },
            ),
            (
                fanout(),
                DestinationResource::Topic {
                    topic: format!("{prefix}-fanout"),
                    queue: format!("{prefix}-fanout"),
                },
            ),
            (
                bus(),
                DestinationResource::Bus {
                    bus: format!("{prefix}-bus"),
                    queue: format!("{prefix}-bus"),
                },
            ),
        ]);
        names.control_visibility_timeout = Duration::from_secs(2);
        let resources = bootstrap(&clients, &names).await.expect("bootstrap on the emulator");
        let clock = start_clock();
        let control = Arc::new(SqsControlQueue::new(
            clients.sqs.clone(),
            resources.control_queue_url.clone(),
        ));
        Self {
            name: "aws",
            store: Arc::new(DynamoStore::new(
                clients.dynamodb.clone(),
                resources.layout.clone(),
                clock.clone(),
            )),
            control_queue: control.clone(),
            inbox: control,
            publisher: Arc::new(AwsPublisher::new(clients.clone(), resources.destinations.clone())),
            visibility_timeout: names.control_visibility_timeout,
            clock,
            wire: None,
            layout: Some(resources.layout.clone()),
            targets: resources.destinations,
            queues: Queues::Aws {
                sqs: clients.sqs,
                destinations: resources.delivery_queues,
            },
        }
    }

    /// The request path over this backend.
    pub fn outbox(&self, timing: Timing) -> Outbox {
        let ports = RequestPorts {
            store: self.store.clone(),
            control_queue: self.control_queue.clone(),
            clock: self.clock.clone(),
            ids: Arc::new(RandomIds),
        };
        Outbox::new(ports, timing, TransactionLimits::default())
    }

    /// The control path over this backend.
    pub fn control(&self, timing: Timing) -> ControlPath {
        let ports = ControlPorts {
            store: self.store.clone(),
            control_queue: self.control_queue.clone(),
            publisher: self.publisher.clone(),
            clock: self.clock.clone(),
        };
        ControlPath::new(ports, timing)
    }

    /// Runs the control path (with `timing`) over the control queue until it is empty.
    pub async fn settle(&self, timing: Timing) {
        let control = self.control(timing);
        for _ in 0..10 {
            let report = outbox::control::poller::poll_once(self.inbox.as_ref(), &control, Duration::from_secs(1))
                .await
                .expect("poll the control queue");
            if report.items.is_empty() {
                return;
            }
        }
        panic!("the control queue never emptied");
    }

    /// Lets `duration` pass: the manual clock moves, and on AWS real time passes too,
    /// since the emulator's queues keep their own time.
    pub async fn wait(&self, duration: Duration) {
        self.clock.advance(duration);
        if matches!(self.queues, Queues::Aws { .. }) {
            tokio::time::sleep(duration + Duration::from_millis(200)).await;
        }
    }

    /// Lets `due` pass and receives the one control message then visible, which must be
    /// transaction `txn_id`'s (as a batch of one, the way the control path takes it).
    ///
    /// # Panics
    ///
    /// If the receive brings anything else.
    pub async fn next_control_message(&self, txn_id: TxnId, due: Duration) -> Vec<ControlDelivery> {
        self.wait(due).await;
        // A busy emulator can make a due message visible late: a few long polls before
        // calling it missing.
        let mut deliveries = Vec::new();
        for _ in 0..3 {
            deliveries = self
                .inbox
                .receive(10, Duration::from_secs(2), self.visibility_timeout)
                .await
                .expect("receive");
            if !deliveries.is_empty() {
                break;
            }
        }
        assert_eq!(deliveries.len(), 1, "one control message at a time");
        assert_eq!(ControlMessage::decode(&deliveries[0].body).unwrap().txn_id, txn_id);
        deliveries
    }

    /// Handles transaction `txn_id`'s control messages one at a time as they come due,
    /// the first after `first_check`, until one settles it (dispatched, tombstoned, or
    /// found done); `measure` runs around each handling (`true` before, `false` after),
    /// to count what the control path itself called. Returns how many it handled.
    ///
    /// # Panics
    ///
    /// If a receive brings anything but one control message of `txn_id`, a handling
    /// fails, or ten do not settle it.
    pub async fn handle_until_settled(
        &self,
        control: &ControlPath,
        txn_id: TxnId,
        first_check: Duration,
        mut measure: impl FnMut(bool),
    ) -> usize {
        let mut due = first_check;
        for handled in 1..=10 {
            let deliveries = self.next_control_message(txn_id, due).await;
            measure(true);
            let report = control.handle_batch(&deliveries).await;
            measure(false);
            let receipts: Vec<String> = deliveries.iter().map(|delivery| delivery.receipt.clone()).collect();
            self.inbox.ack(&receipts).await.expect("ack");
            match report.items[0].result.as_ref().expect("handled") {
                ControlOutcome::Deferred { delay, .. } | ControlOutcome::FenceOnBusyItem { delay, .. } => due = *delay,
                ControlOutcome::Tombstoned | ControlOutcome::AlreadyDone { .. } | ControlOutcome::Dispatched { .. } => {
                    return handled
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        panic!("transaction {txn_id} was not settled after 10 control messages")
    }

    /// Receives and deletes everything now visible on `destination`'s queue.
    pub async fn drain(&self, destination: &DestinationName) -> Vec<Delivered> {
        let mut delivered = Vec::new();
        let from_bus = matches!(self.targets.get(destination), Some(Target::EventBus { .. }));
        match &self.queues {
            Queues::Embedded(backend) => {
                let queue = backend.publisher.queue(destination).expect("configured destination");
                loop {
                    let batch = queue.receive(10);
                    if batch.is_empty() {
                        break;
                    }
                    for message in batch {
                        queue.delete(&message.receipt);
                        let attributes = message.attributes;
                        delivered.push(Delivered {
                            group_id: message.group_id,
                            ..Delivered::new(message.body, |name| attributes.get(name).cloned(), from_bus)
                        });
                    }
                }
            }
            Queues::Aws { sqs, destinations } => {
                let url = &destinations[destination];
                loop {
                    let output = sqs
                        .receive_message()
                        .queue_url(url)
                        .max_number_of_messages(10)
                        .wait_time_seconds(1)
                        .message_attribute_names("All")
                        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                        .send()
                        .await
                        .expect("receive from a destination");
                    if output.messages().is_empty() {
                        break;
                    }
                    for message in output.messages() {
                        sqs.delete_message()
                            .queue_url(url)
                            .receipt_handle(message.receipt_handle().unwrap_or_default())
                            .send()
                            .await
                            .expect("delete from a destination");
                        let attribute = |name: &str| {
                            message
                                .message_attributes()
                                .and_then(|attributes| attributes.get(name))
                                .and_then(|value| value.string_value())
                                .map(str::to_owned)
                        };
                        let group_id = message
                            .attributes()
                            .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId))
                            .cloned();
                        delivered.push(Delivered {
                            group_id,
                            ..Delivered::new(message.body().unwrap_or_default().to_owned(), attribute, from_bus)
                        });
                    }
                }
            }
        }
        delivered
    }

    /// Messages waiting in a destination (visible or not), for counting.
    pub async fn destination_depth(&self, destination: &DestinationName) -> usize {
        match &self.queues {
            Queues::Embedded(backend) => backend.publisher.queue(destination).map_or(0, |queue| queue.len()),
            Queues::Aws { sqs, destinations } => {
                let output = sqs
                    .get_queue_attributes()
                    .queue_url(&destinations[destination])
                    .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                    .send()
                    .await
                    .expect("queue attributes");
                output
                    .attributes()
                    .and_then(|attributes| attributes.get(&QueueAttributeName::ApproximateNumberOfMessages))
                    .and_then(|count| count.parse().ok())
                    .unwrap_or(0)
            }
        }
    }
}
