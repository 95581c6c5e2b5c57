//! Creates the table, queues, topics and buses that `template.yaml` declares, for local
//! runs against an emulator (or an account without the stack). Idempotent: what exists
//! is kept, and an existing table (the application's own, in a single-table design) must
//! have the key schema the [`TableLayout`] names.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TimeToLiveSpecification,
    TimeToLiveStatus,
};
use aws_sdk_sqs::types::QueueAttributeName;

use super::AwsClients;
use crate::destination::Target;
use crate::ports::BoxError;
use crate::protocol::{DestinationName, MESSAGE_ID_ATTRIBUTE};
use crate::settings::TableLayout;

/// Receives before a destination queue's consumer gives a message up to its dead-letter
/// queue (`template.yaml`'s events queue).
const DESTINATION_MAX_RECEIVE_COUNT: u32 = 5;

/// A destination queue's visibility timeout: six times its consumer's function timeout
/// (10 s), as `template.yaml`'s events queue (an emulator's default is 30 s).
pub const DESTINATION_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(60);

/// The names of the resources, as `template.yaml` names them for a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    /// The table of the protocol's records, and how they are keyed.
    pub layout: TableLayout,
    /// The control queue.
    pub control_queue: String,
    /// The control queue's dead-letter queue.
    pub control_dead_letter_queue: String,
    /// Each destination and how it is made.
    pub destinations: Vec<(DestinationName, DestinationResource)>,
    /// The control queue's visibility timeout.
    pub control_visibility_timeout: Duration,
    /// Receives before a control message moves to the dead-letter queue.
    pub max_receive_count: u32,
    /// Each destination queue's visibility timeout.
    pub destination_visibility_timeout: Duration,
    /// The worked consumer behind the destinations, and what it publishes to.
    pub consumer: Option<ConsumerResource>,
}

/// A consumer of one destination's queue (`outbox::consumer`), and the queues it
/// publishes to: what `template.yaml` declares for its `ShippingFunction`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerResource {
    /// Its name (`OUTBOX_CONSUMER_NAME`).
    pub name: String,
    /// The destination whose queue it consumes.
    pub source: DestinationName,
    /// Each of its own destinations and the queue that is it.
    pub destinations: Vec<(DestinationName, String)>,
}

impl ResourceNames {
    /// The names for stack `stack`: `{stack}-table`, `{stack}-control`,
    /// `{stack}-control-dlq`, the destination `events` on `{stack}-events`, and the
    /// shipping consumer of it, which publishes `shipments` to `{stack}-shipments`.
    pub fn for_stack(stack: &str) -> Self {
        Self {
            layout: TableLayout::dedicated(format!("{stack}-table")),
            control_queue: format!("{stack}-control"),
            control_dead_letter_queue: format!("{stack}-control-dlq"),
            destinations: vec![(
                "events".parse().expect("valid name"),
                DestinationResource::Queue {
                    queue: format!("{stack}-events"),
                },
            )],
            control_visibility_timeout: Duration::from_secs(60),
            max_receive_count: crate::ports::CONTROL_MAX_RECEIVE_COUNT,
            destination_visibility_timeout: DESTINATION_VISIBILITY_TIMEOUT,
            consumer: Some(ConsumerResource {
                name: "shipping".to_owned(),
                source: "events".parse().expect("valid name"),
                destinations: vec![("shipments".parse().expect("valid name"), format!("{stack}-shipments"))],
            }),
        }
    }
}

impl ResourceNames {
    /// The same names with the `events` destination published through `kind`: `sqs` (the
    /// queue `{stack}-events` itself, as [`ResourceNames::for_stack`] has it), `sns` (a
    /// topic `{stack}-events` the queue subscribes to) or `eventbridge` (a bus
    /// `{stack}-events` whose rule targets the queue), as `template.yaml`'s
    /// `EventsDestinationKind` does. `None` for any other kind.
    pub fn with_events_via(mut self, kind: &str) -> Option<Self> {
        let events: DestinationName = "events".parse().expect("valid name");
        let (_, resource) = self.destinations.iter_mut().find(|(name, _)| *name == events)?;
        let queue = resource.queue().to_owned();
        *resource = match kind {
            "sqs" => DestinationResource::Queue { queue },
            "sns" => DestinationResource::Topic {
                topic: queue.clone(),
                queue,
            },
            "eventbridge" => DestinationResource::Bus {
                bus: queue.clone(),
                queue,
            },
            _ => return None,
        };
        Some(self)
    }
}

/// How one destination is made. Every kind ends in a queue the messages can be read
/// from (FIFO when its name ends in `.fifo`), with a dead-letter queue named with `-dlq`
/// before any `.fifo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationResource {
    /// The destination is the queue.
    Queue {
        /// The queue's name.
        queue: String,
    },
    /// The destination is a topic (FIFO when its name ends in `.fifo`, and then so must
    /// the queue's) that the queue subscribes to with raw message delivery, so that it
    /// receives each body with its attributes.
    Topic {
        /// The topic's name.
        topic: String,
        /// The subscribed queue's name.
        queue: String,
    },
    /// The destination is a bus (`default` is the account's own, which is never
    /// created), with a rule that sends every event the outbox puts on it to the queue.
    Bus {
        /// The bus's name.
        bus: String,
        /// The rule's target queue's name (a standard queue).
        queue: String,
    },
}

impl DestinationResource {
    /// The queue where the destination's messages can be read.
    pub fn queue(&self) -> &str {
        match self {
            Self::Queue { queue } | Self::Topic { queue, .. } | Self::Bus { queue, .. } => queue,
        }
    }
}

/// The pattern of the rule that [`bootstrap`] puts on a bus: every event whose detail
/// carries an outbox message id ([`crate::event_detail`]).
pub fn outbox_event_pattern() -> String {
    serde_json::json!({ "detail": { "metadata": { MESSAGE_ID_ATTRIBUTE: [{ "exists": true }] } } }).to_string()
}

/// What exists after the bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// The table and how the protocol's records are keyed in it.
    pub layout: TableLayout,
    /// The control queue's URL.
    pub control_queue_url: String,
    /// Its dead-letter queue's URL.
    pub control_dead_letter_queue_url: String,
    /// Each destination's target, as `OUTBOX_DESTINATIONS` names it.
    pub destinations: BTreeMap<DestinationName, Target>,
    /// Each destination's queue: the URL where its messages can be read.
    pub delivery_queues: BTreeMap<DestinationName, String>,
    /// Each destination queue's dead-letter queue, where a consumer's failures go.
    pub delivery_dead_letter_queues: BTreeMap<DestinationName, String>,
    /// The consumer's own destinations, as its `OUTBOX_DESTINATIONS` names them.
    pub consumer_destinations: BTreeMap<DestinationName, Target>,
}

/// A resource that could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The layout names attributes that cannot work.
    #[error(transparent)]
    Layout(#[from] crate::settings::LayoutError),
    /// The table exists with another key schema or TTL attribute than the layout names.
    #[error("table {table} does not fit the layout: {problem}")]
    Mismatch {
        /// Its name.
        table: String,
        /// What differs.
        problem: String,
    },
    /// Creating or describing the table failed.
    #[error("creating table {table} failed")]
    Table {
        /// Its name.
        table: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Creating a queue, or reading its ARN, failed.
    #[error("creating queue {queue} failed")]
    Queue {
        /// Its name.
        queue: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Creating a topic or its subscription failed.
    #[error("creating topic {topic} failed")]
    Topic {
        /// Its name.
        topic: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Creating a bus or its rule failed.
    #[error("creating bus {bus} failed")]
    Bus {
        /// Its name.
        bus: String,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// Creates what is missing and returns where everything is.
pub async fn bootstrap(clients: &AwsClients, names: &ResourceNames) -> Result<Resources, BootstrapError> {
    names.layout.validate()?;
    create_table(clients, &names.layout).await?;
    let control_dead_letter_queue_url = create_dead_letter_queue(clients, &names.control_dead_letter_queue).await?;
    let control_queue_url = create_queue(
        clients,
        &names.control_queue,
        Some((&control_dead_letter_queue_url, names.max_receive_count)),
        Some(names.control_visibility_timeout),
    )
    .await?;
    let mut destinations = BTreeMap::new();
    let mut delivery_queues = BTreeMap::new();
    let mut delivery_dead_letter_queues = BTreeMap::new();
    for (destination, resource) in &names.destinations {
        let queue = resource.queue();
        let dead_letter_name = match queue.strip_suffix(".fifo") {
            Some(base) => format!("{base}-dlq.fifo"),
            None => format!("{queue}-dlq"),
        };
        let dead_letter_url = create_dead_letter_queue(clients, &dead_letter_name).await?;
        let url = create_queue(
            clients,
            queue,
            Some((&dead_letter_url, DESTINATION_MAX_RECEIVE_COUNT)),
            Some(names.destination_visibility_timeout),
        )
        .await?;
        let target = match resource {
            DestinationResource::Queue { queue } => Target::SqsQueue {
                url: url.clone(),
                fifo: queue.ends_with(".fifo"),
            },
            DestinationResource::Topic { topic, .. } => create_topic(clients, topic, &url).await?,
            DestinationResource::Bus { bus, .. } => create_bus(clients, bus, &url).await?,
        };
        destinations.insert(destination.clone(), target);
        delivery_queues.insert(destination.clone(), url);
        delivery_dead_letter_queues.insert(destination.clone(), dead_letter_url);
    }
    let mut consumer_destinations = BTreeMap::new();
    for (destination, queue) in names.consumer.iter().flat_map(|consumer| &consumer.destinations) {
        let url = create_queue(clients, queue, None, None).await?;
        let fifo = queue.ends_with(".fifo");
        consumer_destinations.insert(destination.clone(), Target::SqsQueue { url, fifo });
    }
    Ok(Resources {
        layout: names.layout.clone(),
        control_queue_url,
        control_dead_letter_queue_url,
        destinations,
        delivery_queues,
        delivery_dead_letter_queues,
        consumer_destinations,
    })
}

/// The ARN of the queue at `url`.
async fn queue_arn(clients: &AwsClients, url: &str) -> Result<String, BoxError> {
    clients
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes()
        .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or_else(|| "the queue has no ARN".into())
}

/// Lets the service `principal` send to the queue at `url` on behalf of `source_arn`
/// only (AWS's policy for topic subscriptions and rule targets).
async fn allow_sends(
    clients: &AwsClients,
    url: &str,
    queue_arn: &str,
    principal: &str,
    source_arn: &str,
) -> Result<(), BoxError> {
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": { "Service": principal },
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": { "ArnEquals": { "aws:SourceArn": source_arn } },
        }],
    });
    clients
        .sqs
        .set_queue_attributes()
        .queue_url(url)
        .attributes(QueueAttributeName::Policy, policy.to_string())
        .send()
        .await?;
    Ok(())
}

/// Creates topic `name` (FIFO when the name ends in `.fifo`) and subscribes the queue
/// at `queue_url` to it with raw message delivery.
async fn create_topic(clients: &AwsClients, name: &str, queue_url: &str) -> Result<Target, BootstrapError> {
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

/// Creates bus `name` (unless it is `default`) and a rule on it that sends every outbox
/// event ([`outbox_event_pattern`]) to the queue at `queue_url`. The rule is named after
/// the queue (its last 64 characters, the most a rule name takes).
async fn create_bus(clients: &AwsClients, name: &str, queue_url: &str) -> Result<Target, BootstrapError> {
    use aws_sdk_eventbridge::operation::create_event_bus::CreateEventBusError;

    let failed = |source: BoxError| BootstrapError::Bus {
        bus: name.to_owned(),
        source,
    };
    if name != "default" {
        match clients.eventbridge.create_event_bus().name(name).send().await {
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.as_service_error(),
                    Some(CreateEventBusError::ResourceAlreadyExistsException(_))
                ) => {}
            Err(error) => return Err(failed(Box::new(error))),
        }
    }
    let queue_arn = queue_arn(clients, queue_url).await.map_err(failed)?;
    let queue_name = queue_arn.rsplit(':').next().unwrap_or(&queue_arn);
    let rule = &queue_name[queue_name.len().saturating_sub(64)..];
    let rule_arn = clients
        .eventbridge
        .put_rule()
        .name(rule)
        .event_bus_name(name)
        .event_pattern(outbox_event_pattern())
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?
        .rule_arn()
        .map(str::to_owned)
        .ok_or_else(|| failed("no rule ARN in the answer".into()))?;
    allow_sends(clients, queue_url, &queue_arn, "events.amazonaws.com", &rule_arn)
        .await
        .map_err(failed)?;
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id("outbox-queue")
        .arn(&queue_arn)
        .build()
        .map_err(|e| failed(Box::new(e)))?;
    let put = clients
        .eventbridge
        .put_targets()
        .rule(rule)
        .event_bus_name(name)
        .targets(target)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    if put.failed_entry_count() > 0 {
        return Err(failed(
            format!("the rule's target was refused: {:?}", put.failed_entries()).into(),
        ));
    }
    Ok(Target::EventBus {
        name_or_arn: name.to_owned(),
    })
}

fn key_element(name: &str, key_type: KeyType) -> Result<(KeySchemaElement, AttributeDefinition), BoxError> {
    Ok((
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()?,
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()?,
    ))
}

/// Creates the table as the layout keys it, or checks that the existing one fits; then
/// makes sure TTL is on the layout's attribute.
async fn create_table(clients: &AwsClients, layout: &TableLayout) -> Result<(), BootstrapError> {
    let table = layout.table.as_str();
    let failed = |source: BoxError| BootstrapError::Table {
        table: table.to_owned(),
        source,
    };
    let mismatch = |problem: String| BootstrapError::Mismatch {
        table: table.to_owned(),
        problem,
    };
    let mut keys = vec![key_element(&layout.partition_key, KeyType::Hash).map_err(failed)?];
    if let Some(sort_key) = &layout.sort_key {
        keys.push(key_element(&sort_key.attribute, KeyType::Range).map_err(failed)?);
    }
    let (schema, definitions): (Vec<_>, Vec<_>) = keys.into_iter().unzip();
    let result = clients
        .dynamodb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(schema.clone()))
        .set_attribute_definitions(Some(definitions))
        .send()
        .await;
    match result {
        Ok(_) => {}
        Err(error)
            if matches!(
                error.as_service_error(),
                Some(CreateTableError::ResourceInUseException(_))
            ) =>
        {
            let described = clients
                .dynamodb
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| failed(Box::new(e)))?;
            let existing: Vec<(String, KeyType)> = described
                .table()
                .map(|t| t.key_schema())
                .unwrap_or_default()
                .iter()
                .map(|key| (key.attribute_name().to_owned(), key.key_type().clone()))
                .collect();
            let wanted: Vec<(String, KeyType)> = schema
                .iter()
                .map(|key| (key.attribute_name().to_owned(), key.key_type().clone()))
                .collect();
            if existing != wanted {
                return Err(mismatch(format!(
                    "its key schema is {existing:?}, the layout names {wanted:?}"
                )));
            }
            let not_strings: Vec<&str> = described
                .table()
                .map(|t| t.attribute_definitions())
                .unwrap_or_default()
                .iter()
                .filter(|definition| wanted.iter().any(|(name, _)| name == definition.attribute_name()))
                .filter(|definition| definition.attribute_type() != &ScalarAttributeType::S)
                .map(|definition| definition.attribute_name())
                .collect();
            if !not_strings.is_empty() {
                return Err(mismatch(format!("its keys {not_strings:?} are not strings (S)")));
            }
        }
        Err(error) => return Err(failed(Box::new(error))),
    }
    let ttl = clients
        .dynamodb
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let description = ttl.time_to_live_description();
    let status = description.and_then(|d| d.time_to_live_status());
    let enabled = matches!(status, Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling));
    match description.and_then(|d| d.attribute_name()) {
        Some(name) if enabled && name == layout.ttl_attribute => {}
        // A table has one TTL attribute: never move the application's own.
        Some(name) if enabled => {
            return Err(mismatch(format!(
                "its TTL is on {name:?}, the layout names {:?}",
                layout.ttl_attribute
            )))
        }
        _ => {
            clients
                .dynamodb
                .update_time_to_live()
                .table_name(table)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(&layout.ttl_attribute)
                        .enabled(true)
                        .build()
                        .map_err(|e| failed(Box::new(e)))?,
                )
                .send()
                .await
                .map_err(|e| failed(Box::new(e)))?;
        }
    }
    Ok(())
}

/// How long a dead-letter queue keeps a message: SQS's most, as `template.yaml`'s dead-letter
/// queues (a consumer's retention counts it, C4).
const DEAD_LETTER_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// A dead-letter queue keeping messages [`DEAD_LETTER_RETENTION`].
async fn create_dead_letter_queue(clients: &AwsClients, name: &str) -> Result<String, BootstrapError> {
    let url = create_queue(clients, name, None, None).await?;
    clients
        .sqs
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(
            QueueAttributeName::MessageRetentionPeriod,
            DEAD_LETTER_RETENTION.as_secs().to_string(),
        )
        .send()
        .await
        .map_err(|e| BootstrapError::Queue {
            queue: name.to_owned(),
            source: Box::new(e),
        })?;
    Ok(url)
}

async fn create_queue(
    clients: &AwsClients,
    name: &str,
    dead_letter: Option<(&str, u32)>,
    visibility_timeout: Option<Duration>,
) -> Result<String, BootstrapError> {
    let failed = |source: BoxError| BootstrapError::Queue {
        queue: name.to_owned(),
        source,
    };
    let mut attributes = HashMap::new();
    if name.ends_with(".fifo") {
        attributes.insert(QueueAttributeName::FifoQueue, "true".to_owned());
    }
    if let Some(timeout) = visibility_timeout {
        attributes.insert(QueueAttributeName::VisibilityTimeout, timeout.as_secs().to_string());
    }
    if let Some((dead_letter_url, max_receive_count)) = dead_letter {
        let arn = clients
            .sqs
            .get_queue_attributes()
            .queue_url(dead_letter_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| failed(Box::new(e)))?
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| failed("the dead-letter queue has no ARN".into()))?;
        let policy =
            serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count.to_string() });
        attributes.insert(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    let created = clients
        .sqs
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes.clone()))
        .send()
        .await;
    let error = match created {
        Ok(output) => {
            return output
                .queue_url()
                .map(str::to_owned)
                .ok_or_else(|| failed("no queue URL in the answer".into()))
        }
        Err(error) => error,
    };
    // A queue of that name with other attributes (one an earlier bootstrap made before
    // they changed): brought to these, its kind (FIFO or not) aside, which cannot change.
    // SQS names this error QueueNameExists, its query protocol (and moto)
    // QueueAlreadyExists; any other error is the answer.
    use aws_sdk_sqs::error::ProvideErrorMetadata;
    if !matches!(error.code(), Some("QueueNameExists" | "QueueAlreadyExists")) {
        return Err(failed(Box::new(error)));
    }
    let existing = clients
        .sqs
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let url = existing
        .queue_url()
        .map(str::to_owned)
        .ok_or_else(|| failed("no queue URL in the answer".into()))?;
    attributes.remove(&QueueAttributeName::FifoQueue);
    if !attributes.is_empty() {
        clients
            .sqs
            .set_queue_attributes()
            .queue_url(&url)
            .set_attributes(Some(attributes))
            .send()
            .await
            .map_err(|e| failed(Box::new(e)))?;
        tracing::info!(
            queue = name,
            "an existing queue's attributes were brought to the template's"
        );
    }
    Ok(url)
}
