//! `template.yaml` against the code: every environment variable the code reads is set on
//! the function that reads it, every AWS action the code calls (counted on the wire
//! against the emulator) is granted to the function that calls it, on named resources,
//! and the queue and event settings follow the rules of docs/PROTOCOL.md section 7.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::app::{router, HttpConfig};
use api::state::AppState;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use outbox::aws::AwsPublisher;
use outbox::consumer::{ConsumeOutcome, Consumer, ConsumerPorts, Delivery};
use outbox::control::worker::lambda::handle_event;
use outbox::destination::Target;
use outbox::ports::{Clock, RandomIds};
use outbox::protocol::DestinationName;
use outbox::protocol::{ControlMessage, TxnId, ENTITY_ATTRIBUTE, MESSAGE_ID_ATTRIBUTE, POSITION_ATTRIBUTE};
use outbox::settings::vars;
use outbox::settings::{Settings, Timing};
use outbox::time::Timestamp;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::{audit, bus, events, fanout, Backend};
use outbox_tests::emulator::emulator;
use serde_json::json;
use tower::ServiceExt;
use yaml_rust2::{Yaml, YamlLoader};

/// The functions that commit through the outbox, and the consumers: shipping of the
/// events, billing of shipping's shipments.
const PRODUCERS: [&str; 2] = ["ApiFunction", "ControlWorkerFunction"];
const CONSUMERS: [&str; 2] = ["ShippingFunction", "BillingFunction"];
const FUNCTIONS: [&str; 4] = [
    "ApiFunction",
    "ControlWorkerFunction",
    "ShippingFunction",
    "BillingFunction",
];

fn template() -> Yaml {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).expect("template.yaml");
    YamlLoader::load_from_str(&text).expect("valid YAML").remove(0)
}

fn names(yaml: &Yaml) -> BTreeSet<String> {
    yaml.as_hash()
        .map(|hash| hash.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn strings(yaml: &Yaml) -> Vec<String> {
    match yaml {
        Yaml::Array(items) => items.iter().flat_map(strings).collect(),
        Yaml::String(text) => vec![text.clone()],
        _ => vec![],
    }
}

/// The variables `Settings::from_env` reads, found by reading them through a recorder.
fn variables_the_settings_read() -> BTreeSet<String> {
    let seen = Mutex::new(BTreeSet::new());
    // With the aws backend, so that the variables only it reads are seen too.
    let _ = Settings::from_lookup(|name| {
        seen.lock().unwrap().insert(name.to_owned());
        (name == outbox::settings::vars::BACKEND).then(|| "aws".to_owned())
    });
    seen.into_inner().unwrap()
}

fn variables_the_consumer_settings_read() -> BTreeSet<String> {
    let seen = Mutex::new(BTreeSet::new());
    let _ = outbox::consumer::ConsumerSettings::from_lookup(|name| {
        seen.lock().unwrap().insert(name.to_owned());
        (name == vars::BACKEND).then(|| "aws".to_owned())
    });
    let mut seen = seen.into_inner().unwrap();
    // The producer's retention is read only to refuse it where it would shorten the
    // consumer's: a consumer's function must not set it.
    assert!(
        seen.remove(vars::RETENTION_SECONDS),
        "the consumer looks for the producer's retention"
    );
    seen
}

#[test]
fn every_variable_the_code_reads_is_set_on_each_function() {
    let template = template();
    let globals = names(&template["Globals"]["Function"]["Environment"]["Variables"]);
    let mut needed = variables_the_settings_read();
    assert!(needed.len() >= 12, "the recorder saw too little: {needed:?}");
    // Set by Lambda itself in every function (the settings read it to refuse the
    // embedded backend there), never by the template.
    assert!(needed.remove("AWS_LAMBDA_RUNTIME_API"), "the settings look for Lambda");
    // Set by Lambda too: the service name's fallback on Lambda (read only there).
    needed.remove("AWS_LAMBDA_FUNCTION_NAME");
    needed.insert("RUST_LOG".into());
    let mut consumer = variables_the_consumer_settings_read();
    consumer.remove("AWS_LAMBDA_RUNTIME_API");
    consumer.insert("RUST_LOG".into());
    assert!(
        consumer.contains("OUTBOX_CONSUMER_NAME"),
        "the recorder saw too little: {consumer:?}"
    );
    for function in FUNCTIONS {
        let needed = if CONSUMERS.contains(&function) {
            &consumer
        } else {
            &needed
        };
        let mut set = globals.clone();
        set.extend(names(
            &template["Resources"][function]["Properties"]["Environment"]["Variables"],
        ));
        let missing: Vec<_> = needed.difference(&set).collect();
        assert!(missing.is_empty(), "{function} lacks {missing:?}");
        if CONSUMERS.contains(&function) {
            assert!(
                !set.contains(vars::RETENTION_SECONDS),
                "the consumer gets the API's {}",
                vars::RETENTION_SECONDS
            );
        }
    }
}

/// The IAM actions an SDK operation needs.
fn iam_actions(operation: &str) -> Vec<&'static str> {
    match operation {
        "BatchGetItem" => vec!["dynamodb:BatchGetItem"],
        "GetItem" => vec!["dynamodb:GetItem"],
        "PutItem" => vec!["dynamodb:PutItem"],
        "UpdateItem" => vec!["dynamodb:UpdateItem"],
        // A transaction is authorised action by action.
        "TransactWriteItems:Put" => vec!["dynamodb:PutItem"],
        "TransactWriteItems:Update" => vec!["dynamodb:UpdateItem"],
        "TransactWriteItems:Delete" => vec!["dynamodb:DeleteItem"],
        "TransactWriteItems:ConditionCheck" => vec!["dynamodb:ConditionCheckItem"],
        "BatchWriteItem" => vec!["dynamodb:BatchWriteItem", "dynamodb:PutItem", "dynamodb:DeleteItem"],
        "SendMessage" | "SendMessageBatch" => vec!["sqs:SendMessage"],
        "ChangeMessageVisibility" | "ChangeMessageVisibilityBatch" => vec!["sqs:ChangeMessageVisibility"],
        // A batch publish is authorised as one sns:Publish per entry.
        "Publish" | "PublishBatch" => vec!["sns:Publish"],
        "PutEvents" => vec!["events:PutEvents"],
        "GetQueueAttributes" => vec!["sqs:GetQueueAttributes"],
        "DescribeTable" => vec!["dynamodb:DescribeTable"],
        "ReceiveMessage" => vec!["sqs:ReceiveMessage"],
        "DeleteMessage" | "DeleteMessageBatch" => vec!["sqs:DeleteMessage"],
        other => panic!("the code calls {other}: add its IAM actions to this table"),
    }
}

/// One grant: a resource an action is allowed on, and the condition the statement is
/// under (`None` for a statement that always applies).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    resource: String,
    condition: Option<String>,
}

/// Grants of a function: action → the resources named for it, each with the condition
/// of its statement (a statement may be `!If [Condition, statement, !Ref AWS::NoValue]`).
fn grants(template: &Yaml, function: &str) -> BTreeMap<String, BTreeSet<Grant>> {
    let mut grants: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for policy in template["Resources"][function]["Properties"]["Policies"]
        .as_vec()
        .expect("inline policies")
    {
        for entry in policy["Statement"].as_vec().expect("statements") {
            let (statement, condition) = match entry {
                Yaml::Array(branches) => {
                    assert_eq!(branches.len(), 3, "{function}: an !If of a statement");
                    assert_eq!(
                        branches[2].as_str(),
                        Some("AWS::NoValue"),
                        "{function}: a conditional statement's else is no statement"
                    );
                    (&branches[1], branches[0].as_str().map(str::to_owned))
                }
                statement => (statement, None),
            };
            assert_eq!(statement["Effect"].as_str(), Some("Allow"));
            let resources = strings(&statement["Resource"]);
            assert!(!resources.is_empty(), "{function}: a statement without resources");
            for action in strings(&statement["Action"]) {
                assert!(!action.contains('*'), "{function}: wildcard action {action}");
                for resource in &resources {
                    assert!(resource != "*", "{function}: wildcard resource for {action}");
                    grants.entry(action.clone()).or_default().insert(Grant {
                        resource: resource.clone(),
                        condition: condition.clone(),
                    });
                }
            }
        }
    }
    grants
}

/// The events destination's kinds, as `EventsDestinationKind` names them: the parameter
/// value, the condition that holds for it, the backend's destination of that kind, and
/// what names the resource its publish action is granted on.
fn kinds() -> [(&'static str, &'static str, DestinationName, &'static str); 4] {
    [
        ("sqs", "PublishesToQueue", events(), "EventsQueue"),
        ("sqs-fifo", "PublishesToFifoQueue", audit(), "EventsQueue"),
        ("sns", "PublishesToTopic", fanout(), "EventsTopic"),
        ("eventbridge", "PublishesToBus", bus(), "EventsBus"),
    ]
}

fn event_of(bodies: &[String]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for (index, body) in bodies.iter().enumerate() {
        let mut message = SqsMessage::default();
        message.message_id = Some(format!("m-{index}"));
        message.body = Some(body.clone());
        event.records.push(message);
    }
    event
}

/// The operations `counter` saw, a transaction named by each kind of action it carried
/// (`TransactWriteItems:Update`): IAM authorises a transaction action by action.
fn called(counter: &CallCounter) -> BTreeSet<String> {
    let mut called = BTreeSet::new();
    for operation in counter.counts().into_keys() {
        if operation == "TransactWriteItems" {
            for body in counter.bodies(&operation) {
                let request: serde_json::Value = serde_json::from_slice(&body).expect("a JSON request");
                for action in request["TransactItems"].as_array().into_iter().flatten() {
                    for kind in action.as_object().into_iter().flat_map(|kinds| kinds.keys()) {
                        called.insert(format!("TransactWriteItems:{kind}"));
                    }
                }
            }
        } else {
            called.insert(operation);
        }
    }
    called
}

/// One item a request named: the IAM action that authorises it on that item and the
/// item's partition key value (what `dynamodb:LeadingKeys` is).
type KeyNamed = (String, String);

/// The partition key values (`partition_key`'s) of the items the DynamoDB requests
/// `counter` saw named, each with the IAM action that authorises it there: a
/// transaction's actions and a batch's items one by one, a batch write's items as the
/// batch and as the put or delete each carries (as [`iam_actions`] grants them).
fn keys_named(counter: &CallCounter, partition_key: &str) -> BTreeSet<KeyNamed> {
    let mut named = BTreeSet::new();
    for operation in counter.counts().into_keys() {
        for body in counter.bodies(&operation) {
            let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
                continue;
            };
            let mut add = |action: &str, item: &serde_json::Value| {
                let key = item[partition_key]["S"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{operation}: no string {partition_key} in {item}"));
                named.insert((format!("dynamodb:{action}"), key.to_owned()));
            };
            let tables = || {
                request["RequestItems"]
                    .as_object()
                    .into_iter()
                    .flat_map(|tables| tables.values())
            };
            match operation.as_str() {
                "GetItem" | "UpdateItem" | "DeleteItem" => add(&operation, &request["Key"]),
                "PutItem" => add("PutItem", &request["Item"]),
                "BatchGetItem" => {
                    for key in tables().flat_map(|table| table["Keys"].as_array().into_iter().flatten()) {
                        add("BatchGetItem", key);
                    }
                }
                "BatchWriteItem" => {
                    for write in tables().flat_map(|table| table.as_array().into_iter().flatten()) {
                        if let Some(put) = write.get("PutRequest") {
                            add("BatchWriteItem", &put["Item"]);
                            add("PutItem", &put["Item"]);
                        }
                        if let Some(delete) = write.get("DeleteRequest") {
                            add("BatchWriteItem", &delete["Key"]);
                            add("DeleteItem", &delete["Key"]);
                        }
                    }
                }
                "TransactWriteItems" => {
                    for action in request["TransactItems"].as_array().into_iter().flatten() {
                        for (kind, write) in action.as_object().into_iter().flatten() {
                            match kind.as_str() {
                                "Put" => add("PutItem", &write["Item"]),
                                "Update" => add("UpdateItem", &write["Key"]),
                                "Delete" => add("DeleteItem", &write["Key"]),
                                "ConditionCheck" => add("ConditionCheckItem", &write["Key"]),
                                other => panic!("a transaction's {other}: say which item it names"),
                            }
                        }
                    }
                }
                "TransactGetItems"
                | "Query"
                | "Scan"
                | "ExecuteStatement"
                | "BatchExecuteStatement"
                | "ExecuteTransaction" => {
                    panic!("the code calls {operation}: say here which partition keys it names")
                }
                _ => {}
            }
        }
    }
    named
}

/// The `dynamodb:LeadingKeys` patterns under which `function` is granted each DynamoDB
/// action: one entry per statement granting it, `None` for a statement without the
/// condition (or without its guard against a request that names no key).
fn leading_keys(template: &Yaml, function: &str) -> BTreeMap<String, Vec<Option<Vec<String>>>> {
    let mut conditions: BTreeMap<String, Vec<Option<Vec<String>>>> = BTreeMap::new();
    for policy in template["Resources"][function]["Properties"]["Policies"]
        .as_vec()
        .expect("inline policies")
    {
        for entry in policy["Statement"].as_vec().expect("statements") {
            let statement = match entry {
                Yaml::Array(branches) => &branches[1],
                statement => statement,
            };
            let condition = &statement["Condition"];
            let patterns = strings(&condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]);
            // ForAllValues holds for a request without keys: the statement asks for them.
            let guarded = condition["Null"]["dynamodb:LeadingKeys"].as_str() == Some("false");
            let patterns = (!patterns.is_empty() && guarded).then_some(patterns);
            for action in strings(&statement["Action"]) {
                if action.starts_with("dynamodb:") {
                    conditions.entry(action).or_default().push(patterns.clone());
                }
            }
        }
    }
    conditions
}

/// Whether `text` matches IAM's `StringLike` `pattern` (`*` any run of characters, `?`
/// any one).
fn like(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // matches[j]: whether the pattern so far matches text[..j].
    let mut matches = vec![false; text.len() + 1];
    matches[0] = true;
    for symbol in pattern {
        let mut next = vec![false; text.len() + 1];
        for j in 0..=text.len() {
            next[j] = match symbol {
                '*' => matches[j] || (j > 0 && next[j - 1]),
                '?' => j > 0 && matches[j - 1],
                literal => j > 0 && matches[j - 1] && text[j - 1] == literal,
            };
        }
        matches = next;
    }
    matches[text.len()]
}

/// What each function was seen doing on the wire: its operations, and the items its
/// DynamoDB requests named.
type SeenByFunction = (
    BTreeMap<&'static str, BTreeSet<String>>,
    BTreeMap<&'static str, BTreeSet<KeyNamed>>,
);

/// Runs the API's routes (publishing the orders' events to `destination`, inline or not)
/// and the control worker's handler on the emulator and returns the operations each made
/// and the items each named.
async fn operations_by_function(destination: DestinationName, inline: bool) -> SeenByFunction {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let partition_key = backend.layout.as_ref().expect("the AWS layout").partition_key.clone();
    let mut keys = BTreeMap::new();
    let timing = Timing::default();
    counter.reset();
    let mut outbox = backend.outbox(timing);
    if inline {
        outbox = outbox.with_inline_publisher(backend.publisher.clone());
    }
    let app = router(
        AppState {
            outbox: Arc::new(outbox),
            events: destination.clone(),
        },
        &HttpConfig::default(),
    );
    let send = |method: Method, uri: String, body: Option<serde_json::Value>| {
        let app = app.clone();
        async move {
            let mut request = Request::builder()
                .method(method)
                .uri(uri)
                .header("idempotency-key", format!("template-test-{}", TxnId::new_v7()));
            if body.is_some() {
                request = request.header("content-type", "application/json");
            }
            let request = request
                .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
                .unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
            )
        }
    };
    let (status, order) = send(
        Method::POST,
        "/orders".into(),
        Some(json!({"customer_id": "c-1", "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 5}]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = order["id"].as_str().unwrap().to_owned();
    assert_eq!(send(Method::GET, format!("/orders/{id}"), None).await.0, StatusCode::OK);
    // A change to the existing order: its put is an update (which keeps the entity mode's
    // entries), and a cancel.
    let (status, _) = send(
        Method::POST,
        format!("/orders/{id}/items"),
        Some(json!({"sku": "SKU-2", "quantity": 2, "unit_price_cents": 7})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "a line added");
    let txn = TxnId::new_v7();
    assert_eq!(
        send(Method::GET, format!("/transactions/{txn}"), None).await.0,
        StatusCode::OK
    );
    let mut operations = BTreeMap::new();
    operations.insert("ApiFunction", called(&counter));
    keys.insert("ApiFunction", keys_named(&counter, &partition_key));

    counter.reset();
    let control = backend.control(timing);
    let received = backend
        .inbox
        .receive(10, Duration::from_secs(3), backend.visibility_timeout)
        .await
        .unwrap();
    assert!(!received.is_empty(), "the order's control message");
    counter.reset();
    let now = backend.clock.now();
    let old = Timestamp::from_millis(now.as_millis() - 60_000);
    let mut bodies: Vec<String> = received.iter().map(|d| d.body.clone()).collect();
    bodies.push(ControlMessage::first(TxnId::new_v7(), now).encode());
    bodies.push(ControlMessage::first(TxnId::new_v7(), old).encode());
    // A message that fails: the worker makes it come back soon.
    bodies.push("not a control message".into());
    let response = handle_event(
        &control,
        backend.inbox.as_ref(),
        backend.clock.as_ref(),
        event_of(&bodies),
    )
    .await;
    assert_eq!(
        response.batch_item_failures.len(),
        1,
        "only the undecodable message fails"
    );
    operations.insert("ControlWorkerFunction", called(&counter));
    keys.insert("ControlWorkerFunction", keys_named(&counter, &partition_key));

    // The shipping consumer: its start-up check of the source queue, then the order's
    // event as the events queue delivers it (twice: a copy is acknowledged).
    let delivered = backend.drain(&destination).await;
    let placed = delivered
        .iter()
        .find(|message| message.body.contains("OrderPlaced"))
        .expect("the order's event was published");
    counter.reset();
    let (Target::SqsQueue { url: audit_url, .. }, clients) = (
        &backend.targets[&audit()],
        counter.clients(&emulator().sdk_config().await),
    ) else {
        panic!("audit is a queue")
    };
    outbox::aws::queue_retention(&clients.sqs, audit_url)
        .await
        .expect("the queue's retention");
    let shipments: DestinationName = shipping::SHIPMENTS.parse().unwrap();
    let consumer = Consumer::new(
        "shipping".parse().unwrap(),
        ConsumerPorts {
            store: backend.store.clone(),
            publisher: Arc::new(AwsPublisher::new(
                clients.clone(),
                BTreeMap::from([(
                    shipments,
                    Target::SqsQueue {
                        url: audit_url.clone(),
                        fifo: true,
                    },
                )]),
            )),
            clock: backend.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(shipping::Shipping),
        Duration::from_secs(3600),
    );
    let copy = |n: usize| Delivery {
        message_id: format!("q-{n}"),
        receipt: String::new(),
        body: placed.body.clone(),
        attributes: placed
            .message_id
            .iter()
            .map(|id| (MESSAGE_ID_ATTRIBUTE.to_owned(), id.clone()))
            .collect(),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    };
    let report = consumer.consume_batch(&[copy(0)]).await;
    assert!(report.failed_message_ids().is_empty(), "{report:?}");
    assert_eq!(
        consumer.consume_batch(&[copy(1)]).await.items[0]
            .result
            .as_ref()
            .unwrap(),
        &ConsumeOutcome::Duplicate
    );
    operations.insert("ShippingFunction", called(&counter));
    keys.insert("ShippingFunction", keys_named(&counter, &partition_key));
    // Its local poller: the start-up read of the queue's lease, a receive and the
    // acknowledgement (here of the shipment it published, a message like any other).
    counter.reset();
    outbox::aws::queue_visibility_timeout(&clients.sqs, audit_url)
        .await
        .expect("the queue's visibility timeout");
    let inbox = outbox::aws::SqsInbox::new(clients.sqs.clone(), audit_url.clone());
    let report = outbox::consumer::poll_once(&inbox, &consumer, Duration::from_secs(2))
        .await
        .expect("polled");
    // (The FIFO queue may hold this run's shipment back behind an earlier run's in flight:
    // the acknowledgement is looked for over all runs.)
    assert!(report.failed_message_ids().is_empty(), "{report:?}");
    operations.insert(SHIPPING_POLLER, called(&counter));
    keys.insert(SHIPPING_POLLER, keys_named(&counter, &partition_key));

    // The billing consumer: its start-up check of the source queue, then a shipment's
    // messages as shipping sends them (each with its place in the shipment's history),
    // the first twice. It publishes nothing.
    counter.reset();
    outbox::aws::queue_retention(&clients.sqs, audit_url)
        .await
        .expect("the queue's retention");
    let billing = Consumer::new(
        "billing".parse().unwrap(),
        ConsumerPorts {
            store: backend.store.clone(),
            publisher: Arc::new(AwsPublisher::new(clients.clone(), BTreeMap::new())),
            clock: backend.clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Arc::new(billing::Billing),
        Duration::from_secs(3600),
    );
    let order = TxnId::new_v7().to_string();
    let shipment = |seq: u64, kind: &str| Delivery {
        message_id: format!("s-{seq}"),
        receipt: String::new(),
        body: json!({"type": kind, "order_id": order, "shipment_id": "s-1", "items": 1}).to_string(),
        attributes: BTreeMap::from([
            (MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{}:0", TxnId::new_v7())),
            (ENTITY_ATTRIBUTE.to_owned(), format!("SHIPMENT#{order}")),
            (
                POSITION_ATTRIBUTE.to_owned(),
                format!("chain=shipments;seq={seq};version={};after={seq}", seq + 1),
            ),
        ]),
        group_id: None,
        receive_count: 1,
        trace_header: None,
    };
    let requested = shipment(1, "ShipmentRequested");
    for (delivery, outcome) in [
        (&requested, None),
        (&requested, Some(ConsumeOutcome::Duplicate)),
        (&shipment(2, "ShipmentCancelled"), None),
    ] {
        let report = billing.consume_batch(std::slice::from_ref(delivery)).await;
        let result = report.items[0].result.as_ref().expect("consumed");
        if let Some(outcome) = outcome {
            assert_eq!(result, &outcome);
        }
    }
    operations.insert("BillingFunction", called(&counter));
    keys.insert("BillingFunction", keys_named(&counter, &partition_key));
    (operations, keys)
}

/// The shipping consumer's local poller, beside its function.
const SHIPPING_POLLER: &str = "the shipping consumer's poller";

/// The document that lists the IAM each function needs (the API's, the control worker's
/// and a consumer's): the guide to using the library.
const IAM_DOCUMENT: &str = "docs/GUIDE.md";

/// The `service:Action`s of the line of [`IAM_DOCUMENT`] that starts with `starts`.
fn documented_actions(starts: &str) -> BTreeSet<String> {
    let path = format!("{}/../{IAM_DOCUMENT}", env!("CARGO_MANIFEST_DIR"));
    let document = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
    let start = document
        .find(starts)
        .unwrap_or_else(|| panic!("{IAM_DOCUMENT} has no {starts:?}"));
    // The item runs to the next one (a line starting with `  - ` or `- `).
    let rest = &document[start + starts.len()..];
    let end = rest
        .find("\n  - ")
        .into_iter()
        .chain(rest.find("\n- "))
        .min()
        .unwrap_or(rest.len());
    rest[..end]
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|word| {
            word.split_once(':').is_some_and(|(service, action)| {
                ["dynamodb", "sqs", "sns", "events"].contains(&service) && !action.is_empty()
            })
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_the_code_calls_is_granted_to_its_function_on_named_resources() {
    let template = template();
    let granted: BTreeMap<&str, _> = FUNCTIONS
        .iter()
        .map(|function| (*function, grants(&template, function)))
        .collect();
    let mut seen_on_lambda = BTreeSet::new();
    let mut seen_polling = BTreeSet::new();
    let mut keys: BTreeMap<&str, BTreeSet<KeyNamed>> = BTreeMap::new();
    for (kind, condition, destination, publish_resource) in kinds() {
        // Inline publishing on, the API publishes; off, the control worker does.
        let mut operations: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for inline in [false, true] {
            let (called, named) = operations_by_function(destination.clone(), inline).await;
            for (function, called) in called {
                operations.entry(function).or_default().extend(called);
            }
            for (function, named) in named {
                // The local poller runs under the consumer's grants (and its own).
                let function = if function == SHIPPING_POLLER {
                    "ShippingFunction"
                } else {
                    function
                };
                keys.entry(function).or_default().extend(named);
            }
        }
        println!("{kind}: operations on the wire: {operations:?}");
        for (function, seen) in [
            ("ShippingFunction", &mut seen_on_lambda),
            (SHIPPING_POLLER, &mut seen_polling),
        ] {
            for operation in &operations[function] {
                seen.extend(iam_actions(operation).into_iter().map(str::to_owned));
            }
        }
        for function in FUNCTIONS {
            let grants = &granted[function];
            let mut needed = BTreeSet::new();
            for operation in &operations[function] {
                for action in iam_actions(operation) {
                    needed.insert(action);
                    // The grants that hold when EventsDestinationKind is `kind`.
                    let holding: Vec<&Grant> = grants
                        .get(action)
                        .into_iter()
                        .flatten()
                        .filter(|grant| grant.condition.as_deref().is_none_or(|c| c == condition))
                        .collect();
                    assert!(
                        !holding.is_empty(),
                        "{kind}: {function} calls {operation} but is not granted {action}"
                    );
                    let on = match action.split(':').next() {
                        Some("dynamodb") => "Table",
                        Some("sqs") => "Queue",
                        _ => publish_resource,
                    };
                    assert!(
                        holding.iter().all(|grant| grant.resource.contains(on)),
                        "{kind}: {function}: {action} on {holding:?}, not only on {on}"
                    );
                }
            }
            // Least privilege: what a kind's condition grants, that kind's code calls.
            for (action, grants) in grants {
                for grant in grants
                    .iter()
                    .filter(|grant| grant.condition.as_deref() == Some(condition))
                {
                    assert!(
                        needed.contains(action.as_str()),
                        "{kind}: {function} is granted {action} on {} but never calls it",
                        grant.resource
                    );
                    println!("{kind}: {function} granted {action} on {}", grant.resource);
                }
            }
        }
    }
    // Every item a function's requests named is within the dynamodb:LeadingKeys of the
    // statement that grants the action on it, every statement granting an item action
    // has that condition, and every prefix granted was needed.
    for function in FUNCTIONS {
        let conditions = leading_keys(&template, function);
        let mut needed = BTreeSet::new();
        for (action, key) in &keys[function] {
            let statements = conditions
                .get(action)
                .unwrap_or_else(|| panic!("{function} names {key:?} with {action}, which it is not granted"));
            let matched: Vec<&String> = statements
                .iter()
                .flat_map(|patterns| {
                    patterns.as_ref().unwrap_or_else(|| {
                        panic!("{function} is granted {action} without a dynamodb:LeadingKeys condition")
                    })
                })
                .filter(|pattern| like(pattern, key))
                .collect();
            assert!(
                !matched.is_empty(),
                "{function}: {action} on the item {key:?}, outside its dynamodb:LeadingKeys {statements:?}"
            );
            needed.extend(matched.into_iter().cloned());
        }
        let granted: BTreeSet<String> = conditions.values().flatten().flatten().flatten().cloned().collect();
        println!("{function}: keys needed {needed:?}, granted {granted:?}");
        let unneeded: Vec<_> = granted.difference(&needed).collect();
        assert!(
            unneeded.is_empty(),
            "{function} is granted the keys {unneeded:?} but named none of them"
        );
    }

    // The consumer's IAM in the guide: the function's grants, and every action the
    // consumer and its poller were seen to call on the wire.
    let on_lambda = documented_actions("  - on Lambda: ");
    let poller = documented_actions("  - the local poller, besides: ");
    let shipping_granted: BTreeSet<String> = granted["ShippingFunction"].keys().cloned().collect();
    let publish_elsewhere = BTreeSet::from(["sns:Publish".to_owned(), "events:PutEvents".to_owned()]);
    assert_eq!(
        on_lambda
            .difference(&publish_elsewhere)
            .cloned()
            .collect::<BTreeSet<_>>(),
        shipping_granted,
        "{IAM_DOCUMENT}'s IAM for a consumer on Lambda is ShippingFunction's (its destination a queue)"
    );
    let missing: Vec<_> = seen_on_lambda.difference(&on_lambda).collect();
    assert!(missing.is_empty(), "{IAM_DOCUMENT}'s IAM on Lambda lacks {missing:?}");
    for action in ["sqs:ReceiveMessage", "sqs:DeleteMessage"] {
        assert!(
            seen_polling.contains(action),
            "the poller was never seen calling {action}"
        );
    }
    let missing: Vec<_> = seen_polling
        .iter()
        .filter(|action| !on_lambda.contains(*action) && !poller.contains(*action))
        .collect();
    assert!(
        missing.is_empty(),
        "{IAM_DOCUMENT}'s IAM for the poller lacks {missing:?}"
    );
    // Its lease renewal (shown in the library's poller tests, not on this wire).
    assert_eq!(
        poller,
        BTreeSet::from([
            "sqs:ReceiveMessage".to_owned(),
            "sqs:DeleteMessage".to_owned(),
            "sqs:ChangeMessageVisibility".to_owned()
        ])
    );

    // Sending control messages is always granted, on the control queue alone.
    for function in PRODUCERS {
        let always: Vec<&Grant> = granted[function]["sqs:SendMessage"]
            .iter()
            .filter(|grant| grant.condition.is_none())
            .collect();
        assert_eq!(
            always,
            [&Grant {
                resource: "ControlQueue.Arn".into(),
                condition: None
            }],
            "{function}"
        );
    }
}

/// Evaluates `value`'s `!If`s for the one events destination condition that holds.
fn when(value: &Yaml, holding: &str) -> Yaml {
    match value {
        Yaml::Array(branches)
            if branches.len() == 3 && branches[0].as_str().is_some_and(|c| c.starts_with("Publishes")) =>
        {
            let branch = if branches[0].as_str() == Some(holding) { 1 } else { 2 };
            when(&branches[branch], holding)
        }
        other => other.clone(),
    }
}

fn to_json(yaml: &Yaml) -> serde_json::Value {
    match yaml {
        Yaml::Hash(hash) => hash
            .iter()
            .map(|(key, value)| (key.as_str().expect("string keys").to_owned(), to_json(value)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Yaml::Array(items) => items.iter().map(to_json).collect(),
        Yaml::String(text) => text.clone().into(),
        Yaml::Boolean(flag) => (*flag).into(),
        Yaml::Integer(number) => (*number).into(),
        other => panic!("unexpected YAML {other:?}"),
    }
}

#[test]
fn each_kind_of_events_destination_is_named_for_the_code_and_delivered_to_the_events_queue() {
    let template = template();
    let parameter = &template["Parameters"]["EventsDestinationKind"];
    assert_eq!(parameter["Default"].as_str(), Some("sqs"));
    assert_eq!(
        strings(&parameter["AllowedValues"]),
        kinds().map(|(kind, ..)| kind.to_owned())
    );
    let variable = &template["Globals"]["Function"]["Environment"]["Variables"][vars::DESTINATIONS];
    let resources = &template["Resources"];
    for (kind, condition, ..) in kinds() {
        assert_eq!(
            template["Conditions"][condition]
                .as_vec()
                .map(|equals| strings(&Yaml::Array(equals.clone()))),
            Some(vec!["EventsDestinationKind".to_owned(), kind.to_owned()]),
            "{condition}"
        );
        let destinations = when(variable, condition);
        let entry = destinations.as_str().expect("a string");
        assert!(entry.starts_with(&format!("events={kind}:")), "{kind}: {entry}");
        // The entry the settings read, with the stack's references filled in.
        let filled = entry
            .replace(
                "${EventsQueue}",
                match kind {
                    "sqs-fifo" => "https://sqs.us-east-1.amazonaws.com/123456789012/s-events.fifo",
                    _ => "https://sqs.us-east-1.amazonaws.com/123456789012/s-events",
                },
            )
            .replace("${EventsTopic}", "arn:aws:sns:us-east-1:123456789012:s-events")
            .replace("${EventsBus}", "s-events");
        let settings = Settings::from_lookup(|name| match name {
            vars::BACKEND => Some("aws".to_owned()),
            vars::TABLE_NAME => Some("t".to_owned()),
            vars::CONTROL_QUEUE_URL => Some("https://sqs.us-east-1.amazonaws.com/123456789012/c".to_owned()),
            vars::DESTINATIONS => Some(filled.clone()),
            _ => None,
        })
        .unwrap_or_else(|error| panic!("{kind}: {filled}: {error}"));
        assert_eq!(settings.destinations[&events()].to_string(), filled["events=".len()..]);
    }
    let subscription = &resources["EventsSubscription"];
    assert_eq!(subscription["Condition"].as_str(), Some("PublishesToTopic"));
    assert_eq!(subscription["Properties"]["RawMessageDelivery"].as_bool(), Some(true));
    assert_eq!(strings(&subscription["Properties"]["Endpoint"]), ["EventsQueue.Arn"]);
    let rule = &resources["EventsRule"];
    assert_eq!(rule["Condition"].as_str(), Some("PublishesToBus"));
    // What the bootstrap's rule matches (and the emulator test proves), narrowed to the
    // stack's source and account (the_shipping_consumer_takes_only_the_stacks_events).
    assert_eq!(
        to_json(&rule["Properties"]["EventPattern"]["detail"]),
        serde_json::from_str::<serde_json::Value>(&outbox::aws::outbox_event_pattern()).unwrap()["detail"],
        "the rule matches outbox events as the bootstrap's rule does"
    );
    assert_eq!(strings(&rule["Properties"]["Targets"][0]["Arn"]), ["EventsQueue.Arn"]);
    let statement = &resources["EventsQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"][0];
    let principal = &statement["Principal"]["Service"];
    let source = &statement["Condition"]["ArnEquals"]["aws:SourceArn"];
    assert_eq!(when(principal, "PublishesToTopic").as_str(), Some("sns.amazonaws.com"));
    assert_eq!(when(source, "PublishesToTopic").as_str(), Some("EventsTopic"));
    assert_eq!(when(principal, "PublishesToBus").as_str(), Some("events.amazonaws.com"));
    assert_eq!(when(source, "PublishesToBus").as_str(), Some("EventsRule.Arn"));
}

/// A FIFO events destination (`EventsDestinationKind` sqs-fifo): the events queue is a FIFO
/// queue named `{stack}-events.fifo` with a FIFO dead-letter queue, the functions that
/// publish name it `sqs-fifo` (each entity's events in one message group, the settings'
/// default) and may send to it alone, no service delivers to it (no queue policy), and the
/// shipping consumer reads it.
#[test]
fn a_fifo_events_destination_is_a_fifo_queue_grouped_by_entity() {
    let stack = Deployment::with(&[("EventsDestinationKind", "sqs-fifo")]);
    let resources = stack.resources();
    let queue = &resources["EventsQueue"]["Properties"];
    assert_eq!(queue["FifoQueue"], json!(true));
    assert_eq!(queue["QueueName"], json!({"Fn::Sub": "${AWS::StackName}-events.fifo"}));
    let dead_letters = &resources["EventsDeadLetterQueue"]["Properties"];
    assert_eq!(dead_letters["FifoQueue"], json!(true));
    assert_eq!(
        dead_letters["QueueName"],
        json!({"Fn::Sub": "${AWS::StackName}-events-dlq.fifo"})
    );
    for function in PRODUCERS {
        let destinations = stack.environment(function)[vars::DESTINATIONS].clone();
        assert_eq!(
            destinations,
            json!({"Fn::Sub": "events=sqs-fifo:${EventsQueue}"}),
            "{function}"
        );
        let sends: Vec<serde_json::Value> = resources[function]["Properties"]["Policies"][0]["Statement"]
            .as_array()
            .expect("statements")
            .iter()
            .filter(|statement| statement["Resource"] == json!({"Fn::GetAtt": ["EventsQueue", "Arn"]}))
            .cloned()
            .collect();
        assert_eq!(
            sends.len(),
            1,
            "{function}: one statement on the events queue: {sends:?}"
        );
        assert_eq!(sends[0]["Action"], json!(["sqs:SendMessage"]), "{function}");
    }
    let settings = Settings::from_lookup(|name| match name {
        vars::BACKEND => Some("aws".to_owned()),
        vars::TABLE_NAME => Some("t".to_owned()),
        vars::CONTROL_QUEUE_URL => Some("https://sqs.us-east-1.amazonaws.com/123456789012/c".to_owned()),
        vars::DESTINATIONS => {
            Some("events=sqs-fifo:https://sqs.us-east-1.amazonaws.com/123456789012/s-events.fifo".to_owned())
        }
        _ => None,
    })
    .expect("the settings read the FIFO destination");
    assert_eq!(
        settings.fifo_groups,
        outbox::protocol::FifoGrouping::Entity,
        "grouped by entity"
    );
    assert!(
        !resources.contains_key("EventsQueuePolicy"),
        "no service delivers to a FIFO events queue"
    );
    assert_eq!(
        stack.environment("ShippingFunction")["OUTBOX_CONSUMER_QUEUE_URL"],
        json!({"Ref": "EventsQueue"})
    );
}

/// EventBridge (`EventsDestinationKind` eventbridge): the events go to a bus the stack
/// creates, never the account's default one; the functions may put onto that bus only,
/// and only events of the orders API's source; every rule that reaches the events queue
/// is on that bus and matches only that source from this account; the events queue's
/// policy lets only that rule send to it; and the shipping consumer reads that queue and
/// no other, and cannot put events itself. So the consumer's input is what the stack's
/// functions published, and its IAM and the rule are held to each other here.
#[test]
fn the_shipping_consumer_takes_only_the_stacks_events() {
    let stack = Deployment::with(&[("EventsDestinationKind", "eventbridge")]);
    let resources = stack.resources();
    let bus = resources
        .get("EventsBus")
        .expect("with eventbridge, the stack creates a bus of its own, EventsBus");
    assert_eq!(bus["Type"], "AWS::Events::EventBus");
    assert_eq!(
        bus["Properties"]["Name"],
        json!({"Fn::Sub": "${AWS::StackName}-events"})
    );
    let source = api::orders::handlers::EVENT_SOURCE;
    // The API publishes there: its destination names the stack's bus, and both functions
    // that publish may put onto that bus alone, only events of the API's source.
    for function in PRODUCERS {
        assert_eq!(
            stack.environment(function)[vars::DESTINATIONS],
            json!({"Fn::Sub": "events=eventbridge:${EventsBus}"}),
            "{function} publishes to the stack's bus"
        );
        let statements = resources[function]["Properties"]["Policies"][0]["Statement"]
            .as_array()
            .expect("statements")
            .clone();
        let puts: Vec<&serde_json::Value> = statements
            .iter()
            .filter(|statement| statement["Action"].to_string().contains("events:"))
            .collect();
        assert_eq!(puts.len(), 1, "{function}: one statement of EventBridge actions");
        assert_eq!(puts[0]["Action"], json!(["events:PutEvents"]), "{function}");
        assert_eq!(
            puts[0]["Resource"],
            json!({"Fn::GetAtt": ["EventsBus", "Arn"]}),
            "{function} puts onto the stack's bus alone"
        );
        assert_eq!(
            puts[0]["Condition"],
            json!({"StringEquals": {"events:source": source}}),
            "{function} puts only the API's events"
        );
    }
    // Every rule reaching the events queue: on that bus, matching the API's source and
    // this account, and events that carry an outbox message id.
    let rules: Vec<(&String, &serde_json::Value)> = resources
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::Events::Rule")
        .collect();
    assert_eq!(
        rules.len(),
        1,
        "one rule: {:?}",
        rules.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    let (rule_name, rule) = rules[0];
    let rule = &rule["Properties"];
    assert_eq!(
        rule["EventBusName"],
        json!({"Ref": "EventsBus"}),
        "the rule is on the stack's bus"
    );
    let pattern = &rule["EventPattern"];
    assert_eq!(
        pattern["source"],
        json!([source]),
        "the rule matches the API's source alone"
    );
    assert_eq!(
        pattern["account"],
        json!([{"Ref": "AWS::AccountId"}]),
        "and this account alone"
    );
    assert_eq!(
        pattern["detail"],
        serde_json::from_str::<serde_json::Value>(&outbox::aws::outbox_event_pattern()).unwrap()["detail"]
    );
    assert_eq!(
        rule["Targets"],
        json!([{"Id": "events-queue", "Arn": {"Fn::GetAtt": ["EventsQueue", "Arn"]}}]),
        "its one target is the events queue"
    );
    // The events queue's policy: that rule, and nothing else, may send to it.
    let policies: Vec<&serde_json::Value> = resources
        .values()
        .filter(|resource| resource["Type"] == "AWS::SQS::QueuePolicy")
        .collect();
    assert_eq!(policies.len(), 1);
    let policy = &policies[0]["Properties"];
    assert_eq!(policy["Queues"], json!([{"Ref": "EventsQueue"}]));
    assert_eq!(
        policy["PolicyDocument"]["Statement"],
        json!([{
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": ["EventsQueue", "Arn"]},
            "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [rule_name, "Arn"]}}},
        }]),
        "only the rule sends to the events queue"
    );
    // The shipping consumer reads that queue alone (its event source, its settings, its
    // grants), and may put no event on any bus.
    let shipping = &resources["ShippingFunction"]["Properties"];
    let sources: Vec<&serde_json::Value> = shipping["Events"]
        .as_object()
        .expect("event sources")
        .values()
        .map(|event| &event["Properties"]["Queue"])
        .collect();
    assert_eq!(
        sources,
        [&json!({"Fn::GetAtt": ["EventsQueue", "Arn"]})],
        "it reads the events queue"
    );
    assert_eq!(
        stack.environment("ShippingFunction")[outbox::consumer::consumer_vars::QUEUE_URL],
        json!({"Ref": "EventsQueue"})
    );
    for statement in shipping["Policies"][0]["Statement"].as_array().expect("statements") {
        let actions = statement["Action"].to_string();
        assert!(!actions.contains("events:"), "the consumer may put events: {statement}");
        if actions.contains("sqs:GetQueueAttributes") || statement["Sid"] == "SendWaitingEventsBack" {
            assert_eq!(
                statement["Resource"],
                json!({"Fn::GetAtt": ["EventsQueue", "Arn"]}),
                "{statement}: the consumer's source is the rule's target"
            );
        }
    }
}

#[test]
fn the_bootstrap_makes_what_the_template_declares() {
    let template = template();
    let resources = &template["Resources"];
    // The worked consumer as the scripts bootstrap it: `--consumer shipping --publishes
    // shipments`, its source the default `events`.
    let shipping_consumer = outbox::aws::ConsumerResource::for_stack(
        "stack",
        "shipping".parse().unwrap(),
        "events".parse().unwrap(),
        [shipping::SHIPMENTS.parse().unwrap()],
    );
    let names = outbox::aws::ResourceNames::for_stack("stack").with_consumer(shipping_consumer);
    // The name a deployment with `holding` gives (the events queues' names depend on
    // EventsDestinationKind: FIFO with sqs-fifo).
    let queue_name_when = |resource: &str, holding: &str| {
        when(&resources[resource]["Properties"]["QueueName"], holding)
            .as_str()
            .unwrap_or_else(|| panic!("{resource} has no QueueName"))
            .replace("${AWS::StackName}", "stack")
    };
    let queue_name = |resource: &str| queue_name_when(resource, "PublishesToQueue");
    // The bootstrap's FIFO events destination is the template's.
    let fifo = outbox::aws::ResourceNames::for_stack("stack")
        .with_events_via("sqs-fifo")
        .expect("a kind the bootstrap makes")
        .with_consumer(outbox::aws::ConsumerResource::for_stack(
            "stack",
            "shipping".parse().unwrap(),
            "events".parse().unwrap(),
            [shipping::SHIPMENTS.parse().unwrap()],
        ));
    let fifo_queue = fifo.destinations[0].1.queue().to_owned();
    assert_eq!(fifo_queue, queue_name_when("EventsQueue", "PublishesToFifoQueue"));
    assert_eq!(
        "stack-events-dlq.fifo",
        queue_name_when("EventsDeadLetterQueue", "PublishesToFifoQueue")
    );
    assert_eq!(
        fifo.consumer.expect("the worked consumer").source_queue,
        fifo_queue,
        "the consumer reads the FIFO events queue"
    );
    let seconds = |resource: &str, attribute: &str| {
        std::time::Duration::from_secs(resources[resource]["Properties"][attribute].as_i64().unwrap() as u64)
    };
    assert_eq!(names.control_queue, queue_name("ControlQueue"));
    assert_eq!(names.control_dead_letter_queue, queue_name("ControlDeadLetterQueue"));
    assert_eq!(
        names.control_visibility_timeout,
        seconds("ControlQueue", "VisibilityTimeout")
    );
    assert_eq!(
        i64::from(names.max_receive_count),
        resources["ControlQueue"]["Properties"]["RedrivePolicy"]["maxReceiveCount"]
            .as_i64()
            .unwrap()
    );
    let (events, resource) = &names.destinations[0];
    assert_eq!(
        (events.as_str(), resource.queue()),
        ("events", queue_name("EventsQueue").as_str())
    );
    assert_eq!(format!("{}-dlq", resource.queue()), queue_name("EventsDeadLetterQueue"));
    assert_eq!(
        names.destination_visibility_timeout,
        seconds("EventsQueue", "VisibilityTimeout")
    );
    // The worked consumer: its name, its source and what it publishes to.
    assert_eq!(
        names.destinations.len(),
        1,
        "the consumer reads a destination of the stack"
    );
    let consumer = names.consumer.expect("the worked consumer");
    let shipping = &resources["ShippingFunction"]["Properties"]["Environment"]["Variables"];
    assert_eq!(
        Some(consumer.name.as_str()),
        shipping[outbox::consumer::consumer_vars::NAME].as_str()
    );
    assert_eq!(consumer.source, *events);
    assert_eq!(consumer.source_queue, resource.queue());
    assert_eq!(
        shipping[outbox::consumer::consumer_vars::QUEUE_URL].as_str(),
        Some("EventsQueue"),
        "it consumes the events queue (!Ref)"
    );
    let (shipments, queue) = &consumer.destinations[0];
    assert_eq!(consumer.destinations.len(), 1);
    assert_eq!(
        shipping[vars::DESTINATIONS].as_str(),
        Some(format!("{shipments}=sqs:${{ShipmentsQueue}}").as_str())
    );
    assert_eq!(*queue, queue_name("ShipmentsQueue"));

    // The billing consumer as the scripts bootstrap it: `--consumer billing --source
    // shipments`: the shipments queue becomes a destination of the stack's, with its
    // dead-letter queue, as the template has them.
    let billing_consumer = outbox::aws::ConsumerResource::for_stack(
        "stack",
        "billing".parse().unwrap(),
        shipping::SHIPMENTS.parse().unwrap(),
        [],
    );
    let billing_names = outbox::aws::ResourceNames::for_stack("stack").with_consumer(billing_consumer);
    let (source, resource) = &billing_names.destinations[1];
    assert_eq!(source.as_str(), shipping::SHIPMENTS);
    assert_eq!(resource.queue(), queue_name("ShipmentsQueue"));
    assert_eq!(
        format!("{}-dlq", resource.queue()),
        queue_name("ShipmentsDeadLetterQueue")
    );
    assert_eq!(
        billing_names.destination_visibility_timeout,
        seconds("ShipmentsQueue", "VisibilityTimeout")
    );
    assert_eq!(
        resources["ShipmentsQueue"]["Properties"]["RedrivePolicy"]["maxReceiveCount"].as_i64(),
        resources["EventsQueue"]["Properties"]["RedrivePolicy"]["maxReceiveCount"].as_i64(),
        "the bootstrap makes every destination's queue alike"
    );
    let billing = &resources["BillingFunction"]["Properties"]["Environment"]["Variables"];
    let consumer = billing_names.consumer.expect("the billing consumer");
    assert_eq!(
        Some(consumer.name.as_str()),
        billing[outbox::consumer::consumer_vars::NAME].as_str()
    );
    assert_eq!(consumer.source_queue, resource.queue());
    assert_eq!(
        billing[outbox::consumer::consumer_vars::QUEUE_URL].as_str(),
        Some("ShipmentsQueue"),
        "it consumes the shipments queue (!Ref)"
    );
    assert!(consumer.destinations.is_empty());
    assert_eq!(billing[vars::DESTINATIONS].as_str(), Some(""), "it publishes nothing");
}

#[test]
fn the_queues_and_the_event_source_follow_the_rules() {
    let template = template();
    let resources = &template["Resources"];
    let worker_timeout = resources["ControlWorkerFunction"]["Properties"]["Timeout"]
        .as_i64()
        .expect("a fixed timeout");
    let control = &resources["ControlQueue"]["Properties"];
    assert!(
        control["VisibilityTimeout"].as_i64().unwrap() >= 6 * worker_timeout,
        "visibility timeout under 6 × the worker's timeout"
    );
    assert_eq!(
        control["RedrivePolicy"]["maxReceiveCount"].as_i64(),
        Some(i64::from(outbox::control::redelivery::MAX_RECEIVE_COUNT)),
        "the control queue's redrive policy is the one the worker's retry backoff is sized for"
    );
    for queue in ["ControlQueue", "EventsQueue", "ShipmentsQueue"] {
        let redrive = &resources[queue]["Properties"]["RedrivePolicy"];
        assert!(
            redrive["maxReceiveCount"].as_i64().unwrap() >= 5,
            "{queue}: maxReceiveCount under 5"
        );
    }
    let event = &resources["ControlWorkerFunction"]["Properties"]["Events"]["ControlQueue"]["Properties"];
    assert!(event["BatchSize"].as_i64().unwrap() <= 10);
    assert_eq!(strings(&event["FunctionResponseTypes"]), ["ReportBatchItemFailures"]);
    // The shipping consumer on the events queue: the same rules, and its dedup data
    // outlives the queue's retention (its settings derive it from the same parameter).
    let shipping = &resources["ShippingFunction"]["Properties"];
    let events_queue = &resources["EventsQueue"]["Properties"];
    assert!(
        events_queue["VisibilityTimeout"].as_i64().unwrap() >= 6 * shipping["Timeout"].as_i64().unwrap(),
        "events queue: visibility timeout under 6 × the consumer's timeout"
    );
    let event = &shipping["Events"]["EventsQueue"]["Properties"];
    assert!(event["BatchSize"].as_i64().unwrap() <= 10);
    assert_eq!(strings(&event["FunctionResponseTypes"]), ["ReportBatchItemFailures"]);
    let consumer = &shipping["Environment"]["Variables"];
    assert_eq!(
        (
            to_json(&events_queue["MessageRetentionPeriod"]),
            to_json(&consumer[outbox::consumer::consumer_vars::SOURCE_RETENTION_SECONDS])
        ),
        (
            json!("EventsQueueRetentionSeconds"),
            json!("EventsQueueRetentionSeconds")
        ),
        "the consumer's retention is derived from the events queue's own (both !Ref the parameter)"
    );
    assert_eq!(
        consumer[outbox::consumer::consumer_vars::DLQ_RETENTION_SECONDS]
            .as_str()
            .and_then(|seconds| seconds.parse::<i64>().ok()),
        resources["EventsDeadLetterQueue"]["Properties"]["MessageRetentionPeriod"].as_i64(),
        "and from its dead-letter queue's"
    );
    // The billing consumer on the shipments queue: the same rules.
    let billing = &resources["BillingFunction"]["Properties"];
    let shipments_queue = &resources["ShipmentsQueue"]["Properties"];
    assert!(
        shipments_queue["VisibilityTimeout"].as_i64().unwrap() >= 6 * billing["Timeout"].as_i64().unwrap(),
        "shipments queue: visibility timeout under 6 × the consumer's timeout"
    );
    let event = &billing["Events"]["ShipmentsQueue"]["Properties"];
    assert!(event["BatchSize"].as_i64().unwrap() <= 10);
    assert_eq!(strings(&event["FunctionResponseTypes"]), ["ReportBatchItemFailures"]);
    let consumer = &billing["Environment"]["Variables"];
    let number = |yaml: &Yaml| {
        yaml.as_i64()
            .or_else(|| yaml.as_str().and_then(|text| text.parse().ok()))
    };
    assert_eq!(
        number(&consumer[outbox::consumer::consumer_vars::SOURCE_RETENTION_SECONDS]),
        shipments_queue["MessageRetentionPeriod"].as_i64(),
        "the billing consumer's retention is derived from the shipments queue's own"
    );
    assert_eq!(
        number(&consumer[outbox::consumer::consumer_vars::DLQ_RETENTION_SECONDS]),
        resources["ShipmentsDeadLetterQueue"]["Properties"]["MessageRetentionPeriod"].as_i64(),
        "and from its dead-letter queue's"
    );
    let table = &resources["Table"]["Properties"];
    // The table's TTL, keys and the settings that name them come from the same parameters,
    // whose defaults are the library's.
    assert_eq!(
        table["TimeToLiveSpecification"]["AttributeName"].as_str(),
        Some("TtlAttribute"),
        "the TTL attribute is the parameter's"
    );
    let parameter_default = |name: &str| template["Parameters"][name]["Default"].as_str().map(str::to_owned);
    assert_eq!(
        parameter_default("TtlAttribute").as_deref(),
        Some(outbox::aws::DEFAULT_TTL_ATTRIBUTE)
    );
    assert_eq!(
        parameter_default("PartitionKeyAttribute").as_deref(),
        Some(outbox::aws::DEFAULT_PARTITION_KEY)
    );
    let variables = &template["Globals"]["Function"]["Environment"]["Variables"];
    for (variable, parameter) in [
        (outbox::settings::vars::PARTITION_KEY, "PartitionKeyAttribute"),
        (outbox::settings::vars::SORT_KEY, "SortKeyAttribute"),
        (outbox::settings::vars::SORT_KEY_VALUE, "SortKeyValue"),
        (outbox::settings::vars::TTL_ATTRIBUTE, "TtlAttribute"),
    ] {
        assert_eq!(strings(&variables[variable]), [parameter], "{variable}");
    }
    assert_eq!(table["BillingMode"].as_str(), Some("PAY_PER_REQUEST"));
    assert_eq!(
        table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"].as_bool(),
        Some(true)
    );
    // Built by the Makefile: one cargo invocation for every binary, each function's
    // target copying its own bootstrap.
    let makefile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile")).expect("the Makefile");
    for (function, binary) in FUNCTIONS
        .into_iter()
        .zip(["api", "control-worker", "shipping", "billing"])
    {
        assert_eq!(
            resources[function]["Metadata"]["BuildMethod"].as_str(),
            Some("makefile")
        );
        let copy = format!(
            "build-{function}: bootstraps\n\tcp $(TARGET_DIR)/lambda/{binary}/bootstrap \"$(ARTIFACTS_DIR)/bootstrap\""
        );
        assert!(makefile.contains(&copy), "the Makefile lacks {copy:?}");
    }
    assert!(
        makefile.contains("FUNCTIONS := api control-worker shipping billing"),
        "one invocation builds them all"
    );
    assert_eq!(
        template["Globals"]["Function"]["Runtime"].as_str(),
        Some("provided.al2023")
    );
    assert_eq!(
        template["Parameters"]["Architecture"]["Default"].as_str(),
        Some("arm64")
    );
    // Every combination of the timing parameters is valid: the ranges make the commit
    // window outlast the API timeout plus the SDK timeout.
    let max = |name: &str| template["Parameters"][name]["MaxValue"].as_i64().unwrap();
    let min = |name: &str| template["Parameters"][name]["MinValue"].as_i64().unwrap();
    assert!(min("MaxCommitDurationSeconds") > max("ApiTimeoutSeconds") + max("SdkOperationTimeoutSeconds"));
    assert!(min("BackoffCapSeconds") >= max("FirstCheckDelaySeconds"));
    assert!(min("RetentionSeconds") > max("MaxCommitDurationSeconds"));
}

/// What a platform team asks of the stack: the HTTP API logs each request as one JSON
/// line into a log group with a retention; the API function's reserved concurrency and
/// both SQS event sources' concurrency are bounded by parameters within Lambda's ranges;
/// each finding of checkov the template skips says why, next to its resource.
#[test]
fn the_api_logs_each_request_the_concurrency_is_bounded_and_each_skip_says_why() {
    let template = template();
    let resources = &template["Resources"];
    let parameters = &template["Parameters"];
    let access = &resources["HttpApiStage"]["Properties"]["AccessLogSettings"];
    assert_eq!(access["DestinationArn"].as_str(), Some("ApiAccessLogGroup.Arn"));
    let group = &resources["ApiAccessLogGroup"];
    assert_eq!(group["Type"].as_str(), Some("AWS::Logs::LogGroup"));
    assert_eq!(
        group["Properties"]["RetentionInDays"].as_str(),
        Some("ApiAccessLogRetentionDays")
    );
    let format: serde_json::Value =
        serde_json::from_str(access["Format"].as_str().expect("a format")).expect("the access log's lines are JSON");
    for field in [
        "requestId",
        "caller",
        "issuer",
        "ip",
        "requestTime",
        "httpMethod",
        "routeKey",
        "status",
        "protocol",
        "responseLength",
        "integrationError",
        "authorizerError",
    ] {
        assert!(format.get(field).is_some(), "the access log lacks {field}");
    }
    // Always reserved, by a parameter the operator must give (no default fits every
    // account's quota), within Lambda's range.
    assert_eq!(
        strings(&resources["ApiFunction"]["Properties"]["ReservedConcurrentExecutions"]),
        ["ApiReservedConcurrency"],
        "the API's reserved concurrency is the parameter's, always"
    );
    let reserved = &parameters["ApiReservedConcurrency"];
    assert_eq!(reserved["Type"].as_str(), Some("Number"));
    assert!(reserved["Default"].is_badvalue(), "required: {reserved:?}");
    assert!(reserved["MinValue"].as_i64() >= Some(1), "0 would refuse every request");
    for (function, event, parameter) in [
        ("ControlWorkerFunction", "ControlQueue", "ControlWorkerMaxConcurrency"),
        ("ShippingFunction", "EventsQueue", "ShippingMaxConcurrency"),
        ("BillingFunction", "ShipmentsQueue", "BillingMaxConcurrency"),
    ] {
        let bound = &resources[function]["Properties"]["Events"][event]["Properties"]["ScalingConfig"];
        assert_eq!(bound["MaximumConcurrency"].as_str(), Some(parameter), "{function}");
        // Lambda's range for an SQS event source's MaximumConcurrency.
        let (min, default, max) = (
            parameters[parameter]["MinValue"].as_i64().unwrap(),
            parameters[parameter]["Default"].as_i64().unwrap(),
            parameters[parameter]["MaxValue"].as_i64().unwrap(),
        );
        assert!(
            2 <= min && min <= default && default <= max && max <= 1000,
            "{parameter}"
        );
    }
    let mut skips = 0;
    for (name, resource) in resources.as_hash().expect("resources") {
        for skip in resource["Metadata"]["checkov"]["skip"].as_vec().into_iter().flatten() {
            let id = skip["id"].as_str().unwrap_or_default();
            assert!(
                id.starts_with("CKV_"),
                "{name:?}: a checkov skip without its check {skip:?}"
            );
            let comment = skip["comment"].as_str().unwrap_or_default();
            assert!(comment.len() > 40, "{name:?}: {id} is skipped without its reason");
            skips += 1;
        }
    }
    assert!(
        skips > 0,
        "the template's checkov skips are where the test looks for them"
    );
}

/// The table the stack creates outlives a mistake: DynamoDB's deletion protection is on
/// unless `TableDeletionProtection` turns it off, and CloudFormation retains the table
/// when the stack is deleted or an update would replace it (its pending records and the
/// orders are in it).
#[test]
fn the_table_is_protected_from_deletion_by_default() {
    let template = cloudformation();
    let table = &template["Resources"]["Table"];
    assert_eq!(table["DeletionPolicy"], "Retain");
    assert_eq!(table["UpdateReplacePolicy"], "Retain");
    let parameter = &template["Parameters"]["TableDeletionProtection"];
    assert_eq!(parameter["AllowedValues"], json!(["true", "false"]));
    for (given, protected) in [(None, "true"), (Some("false"), "false"), (Some("true"), "true")] {
        let parameters: Vec<(&str, &str)> = given
            .map(|value| ("TableDeletionProtection", value))
            .into_iter()
            .collect();
        let stack = Deployment::with(&parameters);
        assert_eq!(
            stack.resources()["Table"]["Properties"]["DeletionProtectionEnabled"],
            protected,
            "TableDeletionProtection {given:?}"
        );
    }
}

/// The alarms on the control worker's metrics watch what it emits: the same namespace,
/// name and service dimension as its EMF records (a failed control message; an entry
/// found beside its tombstone, entity mode).
#[test]
fn the_control_worker_alarms_watch_what_the_worker_emits() {
    let template = template();
    let failed = outbox::control::BatchReport {
        items: vec![outbox::control::ItemReport {
            message_id: "m-1".into(),
            txn_id: None,
            attempt: None,
            result: Err(outbox::control::ControlError::Decode(std::sync::Arc::new(
                outbox::protocol::ControlMessage::decode("not a control message").unwrap_err(),
            ))),
        }],
    };
    let beside = outbox::control::BatchReport {
        items: vec![outbox::control::ItemReport {
            message_id: "m-2".into(),
            txn_id: None,
            attempt: None,
            result: Ok(outbox::control::ControlOutcome::DispatchedBesideTombstone {
                messages: 1,
                committed_at: outbox::time::Timestamp::from_millis(0),
            }),
        }],
    };
    let parked = outbox::control::BatchReport {
        items: vec![outbox::control::ItemReport {
            message_id: "m-3".into(),
            txn_id: None,
            attempt: None,
            result: Err(outbox::control::ControlError::Publish {
                failed: 1,
                total: 1,
                first: outbox::publish::PublishFailure::Refused {
                    code: "InvalidMessageContents".into(),
                },
            }),
        }],
    };
    for (alarm, metric, report) in [
        ("FailedControlMessagesAlarm", "FailedControlMessages", failed),
        ("EntriesBesideTombstonesAlarm", "EntriesBesideTombstones", beside),
        ("ParkedTransactionsAlarm", "ParkedTransactions", parked),
    ] {
        alarm_watches_what_the_worker_emits(&template, alarm, metric, &report);
    }
}

fn alarm_watches_what_the_worker_emits(
    template: &Yaml,
    alarm: &str,
    metric: &str,
    report: &outbox::control::BatchReport,
) {
    let alarm = &template["Resources"][alarm]["Properties"];
    assert_eq!(alarm["Namespace"].as_str(), Some(outbox::metrics::NAMESPACE));
    assert_eq!(alarm["MetricName"].as_str(), Some(metric));
    let dimensions: Vec<(String, String)> = alarm["Dimensions"]
        .as_vec()
        .expect("the alarm's dimensions")
        .iter()
        .map(|dimension| {
            let text = |key: &str| dimension[key].as_str().expect("a string").to_owned();
            (text("Name"), text("Value"))
        })
        .collect();
    let record = outbox::control::worker::batch_metrics::for_batch(report, outbox::time::Timestamp::from_millis(0));
    let emitted = record.to_json();
    assert_eq!(emitted[metric].as_f64(), Some(1.0), "{emitted}");
    // Exactly the dimensions the record declares, with its values: an extra one would
    // select no metric, and the alarm would never fire.
    let declared: Vec<(String, String)> = emitted["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
        .as_array()
        .expect("the record's dimension set")
        .iter()
        .map(|name| {
            let name = name.as_str().expect("a dimension name").to_owned();
            let value = emitted[name.as_str()].as_str().expect("its value").to_owned();
            (name, value)
        })
        .collect();
    assert_eq!(dimensions, declared, "{emitted}");
}

/// The guide's IAM lists for the API and the control worker are exactly what
/// `template.yaml` grants `ApiFunction` and `ControlWorkerFunction` (the destinations'
/// publish actions included: the API publishes after its answer); the actions each is
/// seen calling are held to those grants by
/// `every_action_the_code_calls_is_granted_to_its_function_on_named_resources`.
#[test]
fn the_guides_iam_lists_are_the_templates_grants() {
    let template = template();
    for (function, starts) in [
        ("ApiFunction", "- IAM for your API function: "),
        ("ControlWorkerFunction", "- IAM for the control worker: "),
    ] {
        let granted: BTreeSet<String> = grants(&template, function).keys().cloned().collect();
        let listed = documented_actions(starts);
        assert_eq!(listed, granted, "{IAM_DOCUMENT}'s IAM for {function}");
    }
}

/// The fence (the control worker's, and the API's settling write in entity mode) sends
/// each of its forms in the conformance case that drives it on DynamoDB Local, among them
/// a `ConditionCheck` (a mark at or above the transaction already, or its record a
/// tombstone already); every action of those transactions is granted to both functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_form_of_the_fence_is_granted_to_the_worker_and_the_api() {
    use outbox_tests::conformance::{cases, Backend};
    let backend = Backend::aws().await;
    cases::a_fence_in_the_entity_blocks_a_late_commit_and_finds_a_committed_one(&backend).await;
    let sent: BTreeSet<String> = called(backend.wire.as_ref().expect("counted"))
        .into_iter()
        .filter(|operation| operation.starts_with("TransactWriteItems:"))
        .collect();
    assert!(
        sent.contains("TransactWriteItems:ConditionCheck"),
        "the fence's checking forms were sent: {sent:?}"
    );
    let template = template();
    for function in PRODUCERS {
        let granted = grants(&template, function);
        for operation in &sent {
            for action in iam_actions(operation) {
                assert!(
                    granted.contains_key(action),
                    "{function} may fence, which sends {operation}, but is not granted {action}"
                );
            }
        }
    }
}

/// Where the documents name the prefixes the protocol's records take, they name all of
/// them, as the code has them (`RESERVED_KEY_PREFIXES`).
#[test]
fn the_documents_quote_every_reserved_key_prefix() {
    use outbox::protocol::RESERVED_KEY_PREFIXES;
    for (document, marker) in [
        ("docs/GUIDE.md", "The records' partition keys start with"),
        ("docs/PROTOCOL.md", "not starting with"),
    ] {
        let text = std::fs::read_to_string(format!("{}/../{document}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let start = text
            .find(marker)
            .unwrap_or_else(|| panic!("{document} no longer says {marker:?}"));
        let sentence = &text[start..];
        let sentence = &sentence[..sentence
            .find(';')
            .or_else(|| sentence.find(')'))
            .unwrap_or(sentence.len())];
        for prefix in RESERVED_KEY_PREFIXES {
            assert!(
                sentence.contains(&format!("`{prefix}`")),
                "{document}: {sentence:?} does not name {prefix}"
            );
        }
    }
}

/// The documents speak to users, who have no issue tracker of this project's: no
/// `issue 28`, `issues 20 and 21` or `issue "ordered"` in the README or under `docs/`
/// (the design history is in the commit log).
#[test]
fn no_user_facing_document_names_an_issue() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut documents = vec![format!("{root}/README.md")];
    for entry in std::fs::read_dir(format!("{root}/docs")).expect("docs/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "md") {
            documents.push(path.display().to_string());
        }
    }
    let mut found = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap().to_lowercase();
        for (line, content) in text.lines().enumerate() {
            for (at, _) in content.match_indices("issue") {
                let rest = content[at + "issue".len()..].trim_start_matches('s');
                let named = rest
                    .strip_prefix(' ')
                    .is_some_and(|after| after.starts_with(|c: char| c.is_ascii_digit() || c == '"' || c == '#'));
                if named {
                    found.push(format!("{document}:{}: {}", line + 1, content.trim()));
                }
            }
        }
    }
    assert!(documents.len() > 3, "{documents:?}");
    assert!(found.is_empty(), "documents name issues:\n{}", found.join("\n"));
}

/// The deployment guide's list of the template's parameters (its paragraph that starts
/// `Parameters:`, in `docs/RUNNING.md`) names every parameter `template.yaml` declares,
/// and nothing else that looks like one.
#[test]
fn the_deployment_guide_names_every_parameter_of_the_template() {
    let template = template();
    let declared: BTreeSet<String> = names(&template["Parameters"]);
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/RUNNING.md")).unwrap();
    let start = guide
        .find("\nParameters: ")
        .expect("docs/RUNNING.md's paragraph of parameters");
    let paragraph = &guide[start..];
    let paragraph = &paragraph[..paragraph[1..].find("\n\n").map_or(paragraph.len(), |end| end + 1)];
    let named: BTreeSet<String> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.starts_with(|c: char| c.is_ascii_uppercase()) && word.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = declared.difference(&named).collect();
    assert!(missing.is_empty(), "docs/RUNNING.md's parameters lack {missing:?}");
    let unknown: Vec<_> = named.difference(&declared).collect();
    assert!(
        unknown.is_empty(),
        "docs/RUNNING.md names parameters the template lacks: {unknown:?}"
    );
}

/// The README's list of the library's features (its line that starts `Features:`) is
/// exactly the features `shared/Cargo.toml` declares.
#[test]
fn the_readme_lists_every_feature_of_the_library() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/Cargo.toml")).unwrap();
    let table = &manifest[manifest.find("[features]").expect("features")..];
    let table = &table["[features]".len()..table[1..].find("\n[").map_or(table.len(), |end| end + 1)];
    let declared: BTreeSet<String> = table
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.starts_with('#') && name != "default")
        .collect();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("\nFeatures: ").expect("the README's line of features");
    let paragraph = &readme[start..];
    let paragraph = &paragraph[..paragraph[1..].find("\n\n").map_or(paragraph.len(), |end| end + 1)];
    // Each feature is a backticked word directly followed by its parenthesised summary.
    let parts: Vec<&str> = paragraph.split('`').collect();
    let listed: BTreeSet<String> = (1..parts.len().saturating_sub(1))
        .step_by(2)
        .filter(|index| parts[index + 1].starts_with(" ("))
        .map(|index| parts[index].to_owned())
        .collect();
    assert!(declared.len() >= 7, "{declared:?}");
    assert_eq!(listed, declared, "the README's features");
}

/// The README's dependency block for your own service is what `examples/inventory`, the
/// service it describes, depends on, each at the workspace's major version.
#[test]
fn the_readmes_dependencies_are_the_inventory_examples() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let block = readme
        .split("```toml\n[dependencies]\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's dependency block");
    let listed: BTreeMap<String, String> = block
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .map(|(name, spec)| (name.trim().to_owned(), spec.trim().to_owned()))
        .collect();
    let manifest = std::fs::read_to_string(format!("{root}/examples/inventory/Cargo.toml")).unwrap();
    let dependencies = manifest
        .split("[dependencies]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("inventory's dependencies");
    let used: BTreeSet<String> = dependencies
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .map(|(name, _)| name.trim().trim_end_matches(".workspace").to_owned())
        .collect();
    assert_eq!(
        listed.keys().cloned().collect::<BTreeSet<_>>(),
        used,
        "the README's dependencies"
    );
    let workspace = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    for (name, spec) in &listed {
        if name == "outbox" {
            assert!(spec.contains(r#"features = ["service"]"#), "{spec}");
            continue;
        }
        let declared = workspace
            .lines()
            .find(|line| line.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("the workspace declares no {name}"));
        let version = |text: &str| text.split('"').nth(1).map(str::to_owned);
        assert_eq!(
            version(spec),
            version(declared.split_once(" = ").unwrap().1),
            "{name}: {spec} against {declared}"
        );
    }
}

// ----------------------------------------------------------------------------------------
// The template as CloudFormation reads it, and what a deployment with given parameters
// holds: the tests below look at the stack a parameter builds, not only at its text.

/// Builds JSON from the YAML parser's events, keeping each short-form intrinsic
/// function (`!Ref`, `!If`, `!Sub`...) as CloudFormation's long form, which
/// [`template`] (plain YAML) drops.
#[derive(Default)]
struct CloudFormationJson {
    open: Vec<(Open, Option<yaml_rust2::parser::Tag>)>,
    done: Option<serde_json::Value>,
}

enum Open {
    Sequence(Vec<serde_json::Value>),
    Mapping(serde_json::Map<String, serde_json::Value>, Option<String>),
}

impl CloudFormationJson {
    fn add(&mut self, value: serde_json::Value) {
        match self.open.last_mut() {
            None => self.done = Some(value),
            Some((Open::Sequence(items), _)) => items.push(value),
            Some((Open::Mapping(map, key), _)) => match key.take() {
                None => *key = Some(value.as_str().expect("string keys").to_owned()),
                Some(key) => {
                    map.insert(key, value);
                }
            },
        }
    }
}

/// `value` under its tag: `!Ref X` is `{"Ref": "X"}`, `!GetAtt A.B` is
/// `{"Fn::GetAtt": ["A", "B"]}`, `!Name v` is `{"Fn::Name": v}`.
fn long_form(tag: Option<yaml_rust2::parser::Tag>, value: serde_json::Value) -> serde_json::Value {
    let Some(tag) = tag.filter(|tag| tag.handle == "!") else {
        return value;
    };
    match tag.suffix.as_str() {
        "Ref" | "Condition" => json!({ tag.suffix.clone(): value }),
        "GetAtt" => match value.as_str().and_then(|text| text.split_once('.')) {
            Some((resource, attribute)) => json!({"Fn::GetAtt": [resource, attribute]}),
            None => json!({"Fn::GetAtt": value}),
        },
        other => json!({ format!("Fn::{other}"): value }),
    }
}

impl yaml_rust2::parser::MarkedEventReceiver for CloudFormationJson {
    fn on_event(&mut self, event: yaml_rust2::Event, _: yaml_rust2::scanner::Marker) {
        use yaml_rust2::scanner::TScalarStyle;
        use yaml_rust2::Event;
        match event {
            Event::Scalar(text, style, _, tag) => {
                let value = if style != TScalarStyle::Plain || tag.is_some() {
                    json!(text)
                } else if let Ok(number) = text.parse::<i64>() {
                    json!(number)
                } else if let Ok(number) = text.parse::<f64>() {
                    json!(number)
                } else {
                    match text.as_str() {
                        "true" => json!(true),
                        "false" => json!(false),
                        "" | "~" | "null" => serde_json::Value::Null,
                        _ => json!(text),
                    }
                };
                self.add(long_form(tag, value));
            }
            Event::SequenceStart(_, tag) => self.open.push((Open::Sequence(Vec::new()), tag)),
            Event::MappingStart(_, tag) => self.open.push((Open::Mapping(serde_json::Map::new(), None), tag)),
            Event::SequenceEnd | Event::MappingEnd => {
                let (open, tag) = self.open.pop().expect("an open collection");
                let value = match open {
                    Open::Sequence(items) => serde_json::Value::Array(items),
                    Open::Mapping(map, _) => serde_json::Value::Object(map),
                };
                self.add(long_form(tag, value));
            }
            Event::Alias(_) => panic!("the template uses no YAML aliases"),
            _ => {}
        }
    }
}

fn cloudformation() -> serde_json::Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).expect("template.yaml");
    let mut builder = CloudFormationJson::default();
    yaml_rust2::parser::Parser::new_from_str(&text)
        .load(&mut builder, false)
        .expect("valid YAML");
    builder.done.expect("a document")
}

/// The stack a deployment of the template makes with `parameters` (the others at their
/// defaults): which conditions hold, which resources and outputs exist, and their
/// properties with every `Fn::If` decided and every parameter filled in.
struct Deployment {
    template: serde_json::Value,
    parameters: BTreeMap<String, serde_json::Value>,
}

impl Deployment {
    fn with(parameters: &[(&str, &str)]) -> Self {
        let template = cloudformation();
        let mut values = BTreeMap::new();
        for (name, declared) in template["Parameters"].as_object().expect("parameters") {
            let given = parameters
                .iter()
                .find(|(parameter, _)| parameter == name)
                .map(|(_, value)| json!(value));
            let value = given.unwrap_or_else(|| declared["Default"].clone());
            let value = if declared["Type"] == "CommaDelimitedList" {
                let text = value.as_str().map(str::to_owned).unwrap_or_default();
                json!(text.split(',').map(str::trim).collect::<Vec<_>>())
            } else {
                value
            };
            values.insert(name.clone(), value);
        }
        for (name, _) in parameters {
            assert!(values.contains_key(*name), "the template has no parameter {name}");
        }
        Self {
            template,
            parameters: values,
        }
    }

    fn holds(&self, condition: &str) -> bool {
        let definition = &self.template["Conditions"][condition];
        assert!(!definition.is_null(), "no condition {condition}");
        self.truth(definition)
    }

    fn truth(&self, expression: &serde_json::Value) -> bool {
        let text = |value: &serde_json::Value| match self.resolve(value) {
            Some(serde_json::Value::String(text)) => text,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let (function, arguments) = expression
            .as_object()
            .and_then(|object| object.iter().next())
            .unwrap_or_else(|| panic!("a condition: {expression}"));
        match function.as_str() {
            "Fn::Equals" => text(&arguments[0]) == text(&arguments[1]),
            "Fn::Not" => !self.truth(&arguments[0]),
            "Fn::And" => arguments.as_array().unwrap().iter().all(|c| self.truth(c)),
            "Fn::Or" => arguments.as_array().unwrap().iter().any(|c| self.truth(c)),
            "Condition" => self.holds(arguments.as_str().unwrap()),
            other => panic!("{other} in a condition"),
        }
    }

    /// `value` as deployed: `Fn::If` decided, parameters filled in, `AWS::NoValue`
    /// gone (`None`); references to resources and attributes as they are.
    fn resolve(&self, value: &serde_json::Value) -> Option<serde_json::Value> {
        match value {
            serde_json::Value::Object(object) if object.len() == 1 && object.contains_key("Fn::If") => {
                let branches = object["Fn::If"].as_array().expect("Fn::If's branches");
                let holds = self.holds(branches[0].as_str().expect("a condition's name"));
                self.resolve(&branches[if holds { 1 } else { 2 }])
            }
            serde_json::Value::Object(object) if object.len() == 1 && object.contains_key("Ref") => {
                let name = object["Ref"].as_str().expect("a name");
                if name == "AWS::NoValue" {
                    None
                } else {
                    Some(self.parameters.get(name).cloned().unwrap_or_else(|| value.clone()))
                }
            }
            serde_json::Value::Object(object) if object.len() == 1 && object.contains_key("Fn::Split") => {
                let arguments = self.resolve(&object["Fn::Split"]).expect("Fn::Split's arguments");
                Some(match (arguments[0].as_str(), arguments[1].as_str()) {
                    (Some(separator), Some(text)) => json!(text.split(separator).collect::<Vec<_>>()),
                    _ => json!({ "Fn::Split": arguments }),
                })
            }
            serde_json::Value::Object(object) if object.len() == 1 && object.contains_key("Fn::Select") => {
                let arguments = self.resolve(&object["Fn::Select"]).expect("Fn::Select's arguments");
                let index = arguments[0]
                    .as_u64()
                    .or_else(|| arguments[0].as_str().and_then(|text| text.parse().ok()));
                Some(match (index, arguments[1].as_array()) {
                    (Some(index), Some(items)) => items
                        .get(index as usize)
                        .cloned()
                        .unwrap_or_else(|| panic!("Fn::Select {index} past the end of {items:?}")),
                    _ => json!({ "Fn::Select": arguments }),
                })
            }
            // `!Sub [text, {Name: value}]`: each variable whose value is known filled in
            // (references to resources and pseudo parameters are left as they are).
            serde_json::Value::Object(object)
                if object.len() == 1
                    && object
                        .get("Fn::Sub")
                        .and_then(serde_json::Value::as_array)
                        .is_some_and(|form| form.len() == 2) =>
            {
                let arguments = self.resolve(&object["Fn::Sub"]).expect("Fn::Sub's arguments");
                let mut text = arguments[0].as_str().expect("Fn::Sub's text").to_owned();
                let mut variables = serde_json::Map::new();
                for (name, value) in arguments[1].as_object().expect("Fn::Sub's variables") {
                    match value.as_str() {
                        Some(known) => text = text.replace(&format!("${{{name}}}"), known),
                        None => {
                            variables.insert(name.clone(), value.clone());
                        }
                    }
                }
                Some(if variables.is_empty() {
                    json!({ "Fn::Sub": text })
                } else {
                    json!({ "Fn::Sub": [text, variables] })
                })
            }
            serde_json::Value::Object(object) if object.len() == 1 && object.contains_key("Fn::Join") => {
                let arguments = self.resolve(&object["Fn::Join"]).expect("Fn::Join's arguments");
                let parts: Option<Vec<&str>> = arguments[1]
                    .as_array()
                    .and_then(|parts| parts.iter().map(serde_json::Value::as_str).collect());
                Some(match (arguments[0].as_str(), parts) {
                    (Some(separator), Some(parts)) => json!(parts.join(separator)),
                    _ => json!({ "Fn::Join": arguments }),
                })
            }
            serde_json::Value::Object(object) => Some(serde_json::Value::Object(
                object
                    .iter()
                    .filter_map(|(key, value)| Some((key.clone(), self.resolve(value)?)))
                    .collect(),
            )),
            serde_json::Value::Array(items) => Some(serde_json::Value::Array(
                items.iter().filter_map(|item| self.resolve(item)).collect(),
            )),
            other => Some(other.clone()),
        }
    }

    /// The entries of `section` (`Resources`, `Outputs`) that exist, resolved.
    fn section(&self, section: &str) -> BTreeMap<String, serde_json::Value> {
        self.template[section]
            .as_object()
            .expect("a section")
            .iter()
            .filter(|(_, entry)| {
                entry["Condition"]
                    .as_str()
                    .is_none_or(|condition| self.holds(condition))
            })
            .map(|(name, entry)| (name.clone(), self.resolve(entry).expect("an entry")))
            .collect()
    }

    fn resources(&self) -> BTreeMap<String, serde_json::Value> {
        self.section("Resources")
    }

    fn outputs(&self) -> BTreeMap<String, serde_json::Value> {
        self.section("Outputs")
    }

    /// A function's environment: the globals' variables with its own over them.
    fn environment(&self, function: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut variables = self
            .resolve(&self.template["Globals"]["Function"]["Environment"]["Variables"])
            .and_then(|value| value.as_object().cloned())
            .unwrap_or_default();
        if let Some(own) = self.resources()[function]["Properties"]["Environment"]["Variables"].as_object() {
            variables.extend(own.clone());
        }
        variables
    }

    /// The HTTP API's routes: route key → the route's properties.
    fn routes(&self) -> BTreeMap<String, serde_json::Value> {
        self.resources()
            .into_values()
            .filter(|resource| resource["Type"] == "AWS::ApiGatewayV2::Route")
            .map(|route| {
                let properties = route["Properties"].clone();
                (
                    properties["RouteKey"].as_str().expect("a route key").to_owned(),
                    properties,
                )
            })
            .collect()
    }
}

/// The operations of the API's OpenAPI document (`GET /orders/{id}`, as an HTTP API
/// names a route), each with the scopes its security requirement states.
fn documented_operations() -> BTreeMap<String, BTreeSet<String>> {
    let document = serde_json::to_value(api::openapi::document()).expect("the document as JSON");
    let mut operations = BTreeMap::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in ["get", "put", "post", "delete", "options", "head", "patch", "trace"] {
            let Some(operation) = item.get(method) else { continue };
            let scopes: BTreeSet<String> = operation["security"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|requirement| requirement[api::openapi::SECURITY_SCHEME].as_array().cloned())
                .flatten()
                .map(|scope| scope.as_str().expect("a scope").to_owned())
                .collect();
            operations.insert(format!("{} {path}", method.to_uppercase()), scopes);
        }
    }
    operations
}

/// The route that serves the OpenAPI document itself, public (it is not one of the
/// document's operations).
const DOCUMENT_ROUTE: &str = "GET /openapi.json";

/// The route of a browser's CORS preflight, with `CorsAllowedOrigins`: the only greedy
/// route, for `OPTIONS` alone.
const PREFLIGHT_ROUTE: &str = "OPTIONS /{proxy+}";

/// Sign-in on by default (`Authentication` cognito): the HTTP API's routes are exactly
/// the operations of the API's OpenAPI document (so that a new operation without its
/// route fails here) and the document's own route; each asks the JWT authorizer for
/// exactly the scopes the document states; only the document's route is public; all go
/// to the API function. No route catches what the others do not name (`$default`, `ANY`,
/// a greedy path): API Gateway answers an unknown method or path itself, so no request
/// reaches a handler under a weaker scope than its own route's. The one greedy route is
/// the CORS preflight's, `OPTIONS` only, where origins are allowed.
#[tokio::test]
async fn every_route_needs_a_token_with_the_scope_its_operation_states_but_the_document() {
    let stack = Deployment::with(&[]);
    assert_eq!(
        stack.parameters["Authentication"], "cognito",
        "sign-in is on by default"
    );
    let operations = documented_operations();
    assert!(operations.len() >= 6, "{operations:?}");
    let routes = stack.routes();
    let mut expected: BTreeSet<String> = operations.keys().cloned().collect();
    expected.insert(DOCUMENT_ROUTE.to_owned());
    assert_eq!(
        routes.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "the HTTP API's routes are the document's operations and its own route, no catch-all"
    );
    for (key, route) in &routes {
        assert_eq!(
            route["Target"],
            json!({"Fn::Sub": "integrations/${ApiIntegration}"}),
            "{key}"
        );
        if key == DOCUMENT_ROUTE {
            assert_eq!(route["AuthorizationType"], "NONE", "{key} is public");
            assert!(route.get("AuthorizerId").is_none(), "{key}");
            continue;
        }
        assert_eq!(route["AuthorizationType"], "JWT", "{key} needs a token");
        assert_eq!(route["AuthorizerId"], json!({"Ref": "JwtAuthorizer"}), "{key}");
        let scopes: BTreeSet<String> = route["AuthorizationScopes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|scope| scope.as_str().unwrap().to_owned())
            .collect();
        let stated = operations.get(key).cloned().unwrap_or_default();
        assert_eq!(scopes, stated, "{key}: the route's scopes are the document's");
        assert!(!scopes.is_empty(), "{key} states no scope");
    }
    let integration = &stack.resources()["ApiIntegration"]["Properties"];
    assert_eq!(
        integration["IntegrationUri"],
        json!({"Fn::GetAtt": ["ApiFunction", "Arn"]})
    );
    assert_eq!(integration["PayloadFormatVersion"], "2.0");

    // A browser's CORS preflight (it never carries a token) reaches the function only
    // where origins are allowed, and only as OPTIONS.
    let with_cors = Deployment::with(&[("CorsAllowedOrigins", "https://shop.example")]);
    let cors_routes = with_cors.routes();
    let preflight = &cors_routes[PREFLIGHT_ROUTE];
    assert_eq!(preflight["AuthorizationType"], "NONE");
    for (authentication, cors) in [("cognito", ""), ("issuer", "*"), ("off", "*")] {
        let stack = Deployment::with(&[
            ("Authentication", authentication),
            ("JwtIssuer", "https://issuer.example"),
            ("JwtAudience", "a"),
            ("CorsAllowedOrigins", cors),
        ]);
        for key in stack.routes().keys() {
            let catches_all = key == "$default" || key.starts_with("ANY ") || key.contains("+}");
            assert!(
                !catches_all || key == PREFLIGHT_ROUTE,
                "{authentication}: the route {key} forwards what no other route names"
            );
        }
    }

    // The router serves the document to anyone, and nothing else without a caller.
    let clock = Arc::new(outbox::embedded::ManualClock::new(Timestamp::from_millis(
        1_700_000_000_000,
    )));
    let backend = outbox::embedded::EmbeddedBackend::new(clock.clone(), [(events(), false)]);
    let outbox = outbox::request::Outbox::new(
        backend.request_ports(clock),
        Timing::default(),
        outbox::settings::TransactionLimits::default(),
    );
    let app = router(
        AppState {
            outbox: Arc::new(outbox),
            events: events(),
        },
        &HttpConfig {
            authentication: outbox::http::Authentication::Jwt,
            ..HttpConfig::default()
        },
    );
    let (method, path) = DOCUMENT_ROUTE.split_once(' ').unwrap();
    let get = |path: &str| Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
    assert_eq!(app.clone().oneshot(get(path)).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        app.oneshot(get("/orders/018bcfe5-6800-7000-8000-000000000000"))
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
}

/// `Authentication`'s three ways: cognito and issuer put the JWT authorizer in front of
/// the API and tell it so (`OUTBOX_AUTH=jwt`); off removes the authorizer from every
/// route, tells the API (`off`, the development caller) and says the API is open in an
/// output named `Warning`.
#[test]
fn authentication_off_removes_the_authorizer_and_says_the_api_is_open() {
    let parameter = &cloudformation()["Parameters"]["Authentication"];
    assert_eq!(parameter["AllowedValues"], json!(["cognito", "issuer", "off"]));
    for (authentication, mode) in [
        ("cognito", outbox::settings::Authentication::Jwt),
        ("issuer", outbox::settings::Authentication::Jwt),
        ("off", outbox::settings::Authentication::Off),
    ] {
        let stack = Deployment::with(&[
            ("Authentication", authentication),
            ("JwtIssuer", "https://issuer.example"),
            ("JwtAudience", "a,b"),
        ]);
        let resources = stack.resources();
        let variable = stack.environment("ApiFunction")[vars::AUTH].clone();
        assert_eq!(
            variable.as_str().map(str::parse::<outbox::settings::Authentication>),
            Some(Ok(mode)),
            "{authentication}: {}",
            vars::AUTH
        );
        let warning = stack.outputs().get("Warning").cloned();
        let user_pool = resources.contains_key("UserPool");
        assert_eq!(
            user_pool,
            authentication == "cognito",
            "{authentication}: the user pool"
        );
        if authentication == "off" {
            assert!(!resources.contains_key("JwtAuthorizer"), "off: no authorizer");
            for (key, route) in stack.routes() {
                assert_eq!(route["AuthorizationType"], "NONE", "off: {key}");
                assert!(route.get("AuthorizerId").is_none(), "off: {key}");
                assert!(route.get("AuthorizationScopes").is_none(), "off: {key}");
            }
            let warning = warning.expect("off: an output named Warning");
            let text = warning["Value"].as_str().expect("a sentence");
            assert!(text.contains("open to anyone"), "{text}");
            continue;
        }
        assert!(warning.is_none(), "{authentication}: no warning");
        let authorizer = &resources["JwtAuthorizer"]["Properties"];
        assert_eq!(authorizer["AuthorizerType"], "JWT");
        assert_eq!(authorizer["IdentitySource"], json!(["$request.header.Authorization"]));
        let jwt = &authorizer["JwtConfiguration"];
        if authentication == "issuer" {
            assert_eq!(jwt["Issuer"], "https://issuer.example");
            assert_eq!(jwt["Audience"], json!(["a", "b"]));
        } else {
            assert_eq!(jwt["Issuer"], json!({"Fn::Sub": "https://${UserPool.ProviderURL}"}));
            assert_eq!(jwt["Audience"], json!([{"Ref": "MachineClient"}]));
        }
        for (key, route) in stack.routes() {
            if key != DOCUMENT_ROUTE {
                assert_eq!(route["AuthorizationType"], "JWT", "{authentication}: {key}");
            }
        }
    }
}

/// Authentication cognito: the user pool's resource server defines exactly the scopes
/// the routes ask for (`orders/read`, `orders/write`), the machines' client may ask for
/// them with the client credentials grant and is the authorizer's audience, and the
/// outputs give what a caller needs for a token but never the client's secret.
#[test]
fn the_user_pool_grants_the_routes_scopes_to_machines_and_no_output_names_a_secret() {
    let stack = Deployment::with(&[]);
    let resources = stack.resources();
    let server = &resources["OrdersResourceServer"]["Properties"];
    let identifier = server["Identifier"].as_str().unwrap();
    let defined: BTreeSet<String> = server["Scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|scope| format!("{identifier}/{}", scope["ScopeName"].as_str().unwrap()))
        .collect();
    let asked: BTreeSet<String> = documented_operations().into_values().flatten().collect();
    assert_eq!(defined, asked, "the resource server's scopes are the routes'");
    assert_eq!(
        asked,
        BTreeSet::from([
            api::openapi::READ_SCOPE.to_owned(),
            api::openapi::WRITE_SCOPE.to_owned()
        ])
    );
    let client = &resources["MachineClient"];
    assert_eq!(client["DependsOn"], "OrdersResourceServer", "its scopes exist first");
    let client = &client["Properties"];
    assert_eq!(client["AllowedOAuthFlows"], json!(["client_credentials"]));
    assert_eq!(client["GenerateSecret"], true);
    assert_eq!(client["AllowedOAuthFlowsUserPoolClient"], true);
    let granted: BTreeSet<String> = client["AllowedOAuthScopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|scope| scope.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(granted, asked);
    // The domain's prefix (unique across Cognito) and the token URL are the same.
    let domain = &resources["UserPoolDomain"]["Properties"]["Domain"]["Fn::Sub"];
    let outputs = stack.outputs();
    let token_url = &outputs["TokenUrl"]["Value"]["Fn::Sub"];
    assert_eq!(domain[1], token_url[1], "the same prefix");
    let prefix = domain[0].as_str().unwrap();
    assert!(
        token_url[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("https://{prefix}.auth.")),
        "{token_url}"
    );
    assert!(token_url[0]
        .as_str()
        .unwrap()
        .ends_with(".amazoncognito.com/oauth2/token"));
    for output in ["ApiUrl", "UserPoolId", "MachineClientId", "TokenUrl"] {
        assert!(outputs.contains_key(output), "no output {output}");
    }
    for (name, output) in &outputs {
        assert!(
            !output.to_string().contains("ClientSecret"),
            "output {name} gives a client's secret"
        );
    }
}

/// The app clients of the services calling the API (`MachineClientNames`, cognito): one
/// client per name, named `<stack>-<name>`, every one the same as the first but for its
/// name (client credentials, both scopes, an hour's token, no refresh), all of them and
/// only they in the authorizer's audience, each named with its id in the output
/// `MachineClients`. The parameter's pattern admits exactly as many names as clients are
/// declared, so no name is left without one; the first client keeps the logical id
/// `MachineClient` (a stack deployed with one client keeps its id). With `issuer`, the
/// audience is the list `JwtAudience` names.
#[test]
fn each_service_named_gets_an_app_client_of_its_own_in_the_authorizers_audience() {
    let template = cloudformation();
    let parameter = &template["Parameters"]["MachineClientNames"];
    assert_eq!(
        parameter["Type"], "String",
        "a pattern over the whole list bounds its length"
    );
    let declared: Vec<String> = template["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::Cognito::UserPoolClient")
        .map(|(name, _)| name.clone())
        .collect();
    let bound = declared.len();
    assert!(bound >= 5, "room for a few services: {declared:?}");
    assert_eq!(
        parameter["AllowedPattern"],
        format!(
            "^[a-z0-9][a-z0-9-]{{0,31}}(,[a-z0-9][a-z0-9-]{{0,31}}){{0,{}}}$",
            bound - 1
        ),
        "the pattern admits at most as many names as there are clients"
    );
    let client_of = |index: usize| {
        if index == 0 {
            "MachineClient".to_owned()
        } else {
            format!("MachineClient{}", index + 1)
        }
    };
    let all: Vec<String> = (0..bound).map(|index| format!("svc-{index}")).collect();
    for names in [
        vec!["machines".to_owned()],
        vec!["billing".to_owned(), "shipping".to_owned()],
        all,
    ] {
        let stack = Deployment::with(&[("MachineClientNames", &names.join(","))]);
        let resources = stack.resources();
        let clients: Vec<&String> = resources
            .iter()
            .filter(|(_, resource)| resource["Type"] == "AWS::Cognito::UserPoolClient")
            .map(|(name, _)| name)
            .collect();
        let expected: Vec<String> = (0..names.len()).map(client_of).collect();
        assert_eq!(
            clients.iter().map(|name| name.as_str()).collect::<BTreeSet<_>>(),
            expected.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            "{names:?}: one client per name"
        );
        let first = &resources["MachineClient"];
        for (index, (name, client)) in names.iter().zip(&expected).enumerate() {
            let resource = &resources[client];
            assert_eq!(
                resource["Properties"]["ClientName"],
                json!({"Fn::Sub": format!("${{AWS::StackName}}-{name}")}),
                "{names:?}: client {index} is {name}'s"
            );
            let mut same = resource.clone();
            same["Properties"]["ClientName"] = first["Properties"]["ClientName"].clone();
            same.as_object_mut().unwrap().remove("Condition");
            let mut reference = first.clone();
            reference.as_object_mut().unwrap().remove("Condition");
            assert_eq!(same, reference, "{client} is the first client but for its name");
        }
        let audience = &resources["JwtAuthorizer"]["Properties"]["JwtConfiguration"]["Audience"];
        let expected_audience: Vec<serde_json::Value> = expected.iter().map(|client| json!({"Ref": client})).collect();
        assert_eq!(
            audience,
            &json!(expected_audience),
            "{names:?}: the authorizer accepts every client"
        );
        let listed = &stack.outputs()["MachineClients"]["Value"]["Fn::Join"];
        assert_eq!(listed[0], ",");
        let pairs: Vec<serde_json::Value> = names
            .iter()
            .zip(&expected)
            .map(|(name, client)| json!({"Fn::Sub": format!("{name}=${{{client}}}")}))
            .collect();
        assert_eq!(listed[1], json!(pairs), "{names:?}: the output names each client's id");
    }
    let issuer = Deployment::with(&[
        ("Authentication", "issuer"),
        ("JwtIssuer", "https://issuer.example"),
        ("JwtAudience", "billing-app,shipping-app"),
    ]);
    let resources = issuer.resources();
    assert!(
        !resources
            .values()
            .any(|resource| resource["Type"] == "AWS::Cognito::UserPoolClient"),
        "issuer: no client of the stack's"
    );
    assert_eq!(
        resources["JwtAuthorizer"]["Properties"]["JwtConfiguration"]["Audience"],
        json!(["billing-app", "shipping-app"])
    );
    assert!(!issuer.outputs().contains_key("MachineClients"));
}

/// The stage's throttling is the parameters' (both limits: without one a route throttles
/// everything), its detailed metrics on for the dashboard's per-route panels; the body
/// limit the functions enforce is the parameter's, whose bounds are what the settings
/// accept; the access log names the caller.
#[test]
fn the_stage_throttles_by_the_parameters_and_the_body_limit_is_the_settings() {
    let stack = Deployment::with(&[("ThrottlingRateLimit", "7"), ("ThrottlingBurstLimit", "9")]);
    let stage = &stack.resources()["HttpApiStage"]["Properties"];
    assert_eq!(stage["StageName"], "$default");
    assert_eq!(stage["AutoDeploy"], true);
    let settings = &stage["DefaultRouteSettings"];
    assert_eq!(
        (&settings["ThrottlingRateLimit"], &settings["ThrottlingBurstLimit"]),
        (&json!("7"), &json!("9"))
    );
    assert_eq!(settings["DetailedMetricsEnabled"], true);
    let format: serde_json::Value =
        serde_json::from_str(stage["AccessLogSettings"]["Format"].as_str().unwrap()).expect("JSON lines");
    assert_eq!(format["caller"], "$context.authorizer.claims.sub");
    assert_eq!(format["issuer"], "$context.authorizer.claims.iss");
    assert_eq!(format["requestId"], "$context.requestId");

    let parameter = &cloudformation()["Parameters"]["MaxRequestBytes"];
    let stack = Deployment::with(&[("MaxRequestBytes", "4096")]);
    for function in PRODUCERS {
        assert_eq!(
            stack.environment(function)[vars::MAX_REQUEST_BYTES],
            "4096",
            "{function}"
        );
    }
    let read = |value: Option<i64>| {
        Settings::from_lookup(|name| match name {
            vars::BACKEND => Some("embedded".to_owned()),
            vars::MAX_REQUEST_BYTES => value.map(|bytes| bytes.to_string()),
            _ => None,
        })
        .map(|settings| settings.max_request_bytes)
    };
    let (min, default, max) = (
        parameter["MinValue"].as_i64().unwrap(),
        parameter["Default"].as_i64().unwrap(),
        parameter["MaxValue"].as_i64().unwrap(),
    );
    assert_eq!(read(None).ok(), Some(default as usize), "the default is the settings'");
    assert_eq!(read(Some(min)).ok(), Some(min as usize));
    assert_eq!(read(Some(max)).ok(), Some(max as usize));
    assert!(read(Some(min - 1)).is_err(), "below the range the settings refuse");
    assert!(read(Some(max + 1)).is_err(), "above it too");
}

/// The words of `document`'s paragraph that starts with `starts` (to its blank line)
/// that are written as code and look like a name of the template's (`ApiUrl`).
fn named_in_paragraph(document: &str, starts: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(format!("{}/../{document}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let start = text
        .find(starts)
        .unwrap_or_else(|| panic!("{document} has no paragraph {starts:?}"));
    let paragraph = &text[start..];
    let paragraph = &paragraph[..paragraph[1..].find("\n\n").map_or(paragraph.len(), |end| end + 1)];
    paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.starts_with(|c: char| c.is_ascii_uppercase()) && word.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(str::to_owned)
        .collect()
}

/// The deployment guide's list of the stack's outputs (its paragraph that starts
/// `Outputs:`) names every output, and otherwise only parameters.
#[test]
fn the_deployment_guide_names_every_output_of_the_template() {
    let template = cloudformation();
    let keys = |section: &str| -> BTreeSet<String> { template[section].as_object().unwrap().keys().cloned().collect() };
    let (outputs, parameters) = (keys("Outputs"), keys("Parameters"));
    let named = named_in_paragraph("docs/RUNNING.md", "\nOutputs: ");
    let missing: Vec<_> = outputs.difference(&named).collect();
    assert!(missing.is_empty(), "docs/RUNNING.md's outputs lack {missing:?}");
    let unknown: Vec<_> = named
        .iter()
        .filter(|word| !outputs.contains(*word) && !parameters.contains(*word))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/RUNNING.md names outputs the template lacks: {unknown:?}"
    );
}

/// The guide's table of the API's routes names each route's scope as the OpenAPI
/// document (and so the deployed route) has it, and the document's own route as public.
#[test]
fn the_guides_routes_table_gives_each_routes_scope() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/RUNNING.md")).unwrap();
    let mut listed = BTreeMap::new();
    for line in guide.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let route = cells[1].trim_matches('`');
        if !route.starts_with(|c: char| c.is_ascii_uppercase()) || !route.contains(" /") {
            continue;
        }
        let scope = cells[cells.len() - 2];
        listed.insert(route.to_owned(), scope.to_owned());
    }
    let mut expected: BTreeMap<String, String> = documented_operations()
        .into_iter()
        .map(|(route, scopes)| {
            let scopes: Vec<String> = scopes.into_iter().map(|scope| format!("`{scope}`")).collect();
            (route, scopes.join(", "))
        })
        .collect();
    expected.insert(DOCUMENT_ROUTE.to_owned(), "none: public".to_owned());
    assert_eq!(listed, expected, "docs/RUNNING.md's routes and their scopes");
}

/// The names of the metrics the code emits: each literal name handed to
/// `MetricRecord::count` or `MetricRecord::add`, and each `..._METRIC` constant, in the
/// sources of the library, the orders API, the control worker and the examples (their
/// unit tests left out).
fn metrics_the_code_emits() -> BTreeSet<String> {
    fn sources(directory: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(directory).unwrap_or_else(|error| panic!("{}: {error}", directory.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut files = Vec::new();
    for directory in ["shared/src", "api/src", "control-worker/src"] {
        sources(&root.join(directory), &mut files);
    }
    for example in std::fs::read_dir(root.join("examples")).unwrap() {
        let source = example.unwrap().path().join("src");
        if source.is_dir() {
            sources(&source, &mut files);
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
        for call in [".count(", ".add("] {
            for (at, _) in text.match_indices(call) {
                let rest = text[at + call.len()..].trim_start();
                if let Some(literal) = rest.strip_prefix('"') {
                    names.insert(literal[..literal.find('"').unwrap()].to_owned());
                }
            }
        }
        for line in text.lines() {
            if let Some((_, value)) = line.split_once("_METRIC: &str = \"") {
                names.insert(value[..value.find('"').unwrap()].to_owned());
            }
        }
    }
    names
}

/// The dashboard's body as CloudWatch gets it, `!Sub` done: `${Queue.QueueName}` as
/// `queue:Queue`, `${HttpApi}` as `api:HttpApi`, `${!x}` as `${x}` (a dynamic label).
fn dashboard(stack: &Deployment) -> serde_json::Value {
    let body = stack.resources()["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
        .as_str()
        .expect("a body to substitute")
        .to_owned();
    let mut filled = String::new();
    let mut rest = body.as_str();
    while let Some(at) = rest.find("${") {
        filled.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after.find('}').expect("a closed ${");
        let name = &after[..end];
        let resources = stack.resources();
        filled.push_str(&match name.split_once('.') {
            _ if name.starts_with('!') => format!("${{{}}}", &name[1..]),
            _ if name == "AWS::Region" => "us-east-1".to_owned(),
            Some((queue, "QueueName")) if resources.contains_key(queue) => format!("queue:{queue}"),
            None if resources.contains_key(name) => format!("{}:{name}", resources[name]["Type"].as_str().unwrap()),
            _ => panic!("the dashboard substitutes {name}, which names nothing of the stack"),
        });
        rest = &after[end + 1..];
    }
    filled.push_str(rest);
    serde_json::from_str(&filled).unwrap_or_else(|error| panic!("the dashboard's body is not JSON: {error}"))
}

/// One metric a dashboard's widget shows: its namespace, name and dimensions (a search
/// expression's dimensions are its schema's, their values those it filters on).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Shown {
    namespace: String,
    name: String,
    dimensions: Vec<(String, String)>,
}

fn shown(row: &serde_json::Value) -> Shown {
    let row = row.as_array().expect("a metric row");
    if let Some(expression) = row[0]["expression"].as_str() {
        // SEARCH('{Namespace,Dim,...} Dim="value" MetricName="name"', 'Stat', period)
        let query = expression
            .strip_prefix("SEARCH('{")
            .unwrap_or_else(|| panic!("not a search: {expression}"));
        let (schema, filters) = query.split_once('}').unwrap();
        let mut schema = schema.split(',');
        let namespace = schema.next().unwrap().to_owned();
        let filters = filters[..filters.find('\'').unwrap()].trim();
        let filter = |key: &str| {
            filters
                .split_whitespace()
                .find_map(|term| term.strip_prefix(&format!("{key}=\"")))
                .map(|value| value.trim_end_matches('"').to_owned())
        };
        let name = filter("MetricName").unwrap_or_else(|| panic!("a search for no metric: {expression}"));
        let dimensions = schema
            .map(|dimension| (dimension.to_owned(), filter(dimension).unwrap_or_default()))
            .collect();
        return Shown {
            namespace,
            name,
            dimensions,
        };
    }
    let texts: Vec<&str> = row.iter().map_while(|cell| cell.as_str()).collect();
    assert!(texts.len() >= 2 && texts.len() % 2 == 0, "a metric row: {row:?}");
    Shown {
        namespace: texts[0].to_owned(),
        name: texts[1].to_owned(),
        dimensions: texts[2..]
            .chunks(2)
            .map(|pair| (pair[0].to_owned(), pair[1].to_owned()))
            .collect(),
    }
}

/// Every metric each widget of the dashboard shows, by the widget's title.
fn dashboard_panels(stack: &Deployment) -> BTreeMap<String, Vec<Shown>> {
    dashboard(stack)["widgets"]
        .as_array()
        .expect("widgets")
        .iter()
        .map(|widget| {
            let properties = &widget["properties"];
            let title = properties["title"].as_str().expect("a title").to_owned();
            let metrics = properties["metrics"]
                .as_array()
                .expect("metrics")
                .iter()
                .map(shown)
                .collect();
            (title, metrics)
        })
        .collect()
}

/// The metrics HTTP APIs send (AWS/ApiGateway), and those of SQS the dashboard reads.
const API_GATEWAY_METRICS: [&str; 6] = ["Count", "4xx", "5xx", "Latency", "IntegrationLatency", "DataProcessed"];
const SQS_METRICS: [&str; 4] = [
    "ApproximateNumberOfMessagesVisible",
    "ApproximateAgeOfOldestMessage",
    "NumberOfMessagesSent",
    "NumberOfMessagesReceived",
];

/// The dashboard shows what the stack really has: each of its own metrics
/// (`ControlMessageOutbox`) is one the code emits, under the `Service` of a function of
/// the stack; each queue panel names a queue of the stack; the per-route panels search
/// the stack's HTTP API by its detailed metrics' dimensions. And it shows what an operator
/// needs: requests and errors by route, commit latency, events out, the control queue's
/// depth and age, both dead-letter queues, entries beside tombstones and the in-order
/// consumer's oldest wait, each of the last two as its alarm watches it.
#[test]
fn the_dashboard_shows_metrics_the_code_emits_and_queues_of_the_stack() {
    let stack = Deployment::with(&[]);
    let emitted = metrics_the_code_emits();
    assert!(
        emitted.is_superset(&BTreeSet::from([
            "FailedControlMessages".to_owned(),
            "CommitLatency".to_owned(),
            "InOrderWaitAge".to_owned(),
            "LeasesLost".to_owned()
        ])),
        "the scan of the sources found too little: {emitted:?}"
    );
    assert!(!emitted.contains("Nothing"), "unit tests' records are not emitted");
    let resources = stack.resources();
    let services: BTreeSet<String> = FUNCTIONS
        .iter()
        .map(|function| {
            stack.environment(function)["OUTBOX_SERVICE_NAME"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let queues: BTreeSet<String> = resources
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::SQS::Queue")
        .map(|(name, _)| format!("queue:{name}"))
        .collect();
    let panels = dashboard_panels(&stack);
    let mut all = BTreeSet::new();
    for (title, metrics) in &panels {
        assert!(!metrics.is_empty(), "{title}: no metric");
        for metric in metrics {
            let Shown {
                namespace,
                name,
                dimensions,
            } = metric;
            match namespace.as_str() {
                outbox::metrics::NAMESPACE => {
                    assert!(emitted.contains(name), "{title}: the code emits no metric {name}");
                    assert!(
                        matches!(dimensions.as_slice(), [(key, service)] if key == "Service" && services.contains(service)),
                        "{title}: {name} under {dimensions:?}, not one Service of the stack's functions {services:?}"
                    );
                }
                "AWS/SQS" => {
                    assert!(SQS_METRICS.contains(&name.as_str()), "{title}: SQS sends no {name}");
                    assert!(
                        matches!(dimensions.as_slice(), [(key, queue)] if key == "QueueName" && queues.contains(queue)),
                        "{title}: {name} of {dimensions:?}, not a queue of the stack"
                    );
                }
                "AWS/ApiGateway" => {
                    assert!(
                        API_GATEWAY_METRICS.contains(&name.as_str()),
                        "{title}: an HTTP API sends no {name}"
                    );
                    let keys: Vec<&str> = dimensions.iter().map(|(key, _)| key.as_str()).collect();
                    assert_eq!(keys, ["ApiId", "Method", "Resource", "Stage"], "{title}: by route");
                    assert_eq!(
                        dimensions[0].1, "AWS::ApiGatewayV2::Api:HttpApi",
                        "{title}: the stack's API"
                    );
                }
                other => panic!("{title}: a metric of {other}"),
            }
            all.insert(metric.clone());
        }
    }
    let sqs = |name: &str, queue: &str| Shown {
        namespace: "AWS/SQS".into(),
        name: name.into(),
        dimensions: vec![("QueueName".into(), format!("queue:{queue}"))],
    };
    let own = |name: &str, service: &str| Shown {
        namespace: outbox::metrics::NAMESPACE.into(),
        name: name.into(),
        dimensions: vec![("Service".into(), service.into())],
    };
    let mut needed = vec![
        sqs("ApproximateNumberOfMessagesVisible", "ControlQueue"),
        sqs("ApproximateAgeOfOldestMessage", "ControlQueue"),
        sqs("ApproximateNumberOfMessagesVisible", "ControlDeadLetterQueue"),
        sqs("ApproximateNumberOfMessagesVisible", "EventsDeadLetterQueue"),
        sqs("ApproximateNumberOfMessagesVisible", "ShipmentsDeadLetterQueue"),
        own("CommitLatency", "api"),
    ];
    // Entries beside tombstones and the oldest wait, as their alarms watch them.
    for alarm in [
        "EntriesBesideTombstonesAlarm",
        "ShippingWaitsAlarm",
        "BillingWaitsAlarm",
    ] {
        let alarm = &resources[alarm]["Properties"];
        let dimensions = alarm["Dimensions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|dimension| {
                let text = |key: &str| dimension[key].as_str().unwrap().to_owned();
                (text("Name"), text("Value"))
            })
            .collect();
        needed.push(Shown {
            namespace: alarm["Namespace"].as_str().unwrap().into(),
            name: alarm["MetricName"].as_str().unwrap().into(),
            dimensions,
        });
    }
    for metric in needed {
        assert!(all.contains(&metric), "the dashboard does not show {metric:?}");
    }
    let by_route: BTreeSet<&str> = all
        .iter()
        .filter(|metric| metric.namespace == "AWS/ApiGateway")
        .map(|metric| metric.name.as_str())
        .collect();
    assert_eq!(
        by_route,
        BTreeSet::from(["Count", "4xx", "5xx"]),
        "requests and errors by route"
    );
}

/// Each function logs to a log group of its own that the stack creates with the
/// retention `FunctionLogRetentionDays` (so that Lambda never creates an unbounded one),
/// and the guide explains each panel of the dashboard.
#[test]
fn every_function_logs_to_a_group_with_a_retention_and_the_guide_explains_each_panel() {
    let stack = Deployment::with(&[("FunctionLogRetentionDays", "14")]);
    let resources = stack.resources();
    let mut groups = BTreeSet::new();
    for function in FUNCTIONS {
        let group = resources[function]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{function} names no log group of the stack"));
        assert_eq!(resources[group]["Type"], "AWS::Logs::LogGroup", "{function}");
        assert_eq!(resources[group]["Properties"]["RetentionInDays"], "14", "{function}");
        assert!(groups.insert(group.to_owned()), "{function} shares its log group");
    }
    let parameters = &cloudformation()["Parameters"];
    assert_eq!(
        parameters["FunctionLogRetentionDays"]["AllowedValues"],
        parameters["ApiAccessLogRetentionDays"]["AllowedValues"],
        "CloudWatch Logs' retentions"
    );

    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/RUNNING.md")).unwrap();
    let start = guide
        .find("| panel | shows | when it is abnormal |")
        .expect("the guide's table of panels");
    let explained: BTreeSet<String> = guide[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert!(cells[3].len() > 10, "{line}: what to do?");
            cells[1].to_owned()
        })
        .collect();
    let panels: BTreeSet<String> = dashboard_panels(&stack).into_keys().collect();
    assert_eq!(explained, panels, "docs/RUNNING.md's panels are the dashboard's");
}

/// Lambda Managed Instances, off by default: without `CapacityProviderSubnetIds` there is
/// no capacity provider and every function runs on Lambda's own (256 MB, the API invoked
/// unqualified). With subnets and security groups, the stack creates the provider in them
/// and every function of the template runs on it: its `CapacityProviderConfig` names the
/// provider, it is published behind the alias `live`, which the routes' integration and
/// the event sources invoke, with Lambda Managed Instances' 2 GB. The `Fn::If`s around
/// SAM's properties are decided before the SAM transform, by `AWS::LanguageExtensions`.
#[test]
fn lambda_managed_instances_are_off_by_default_and_on_every_function_when_set() {
    let template = cloudformation();
    assert_eq!(
        template["Transform"],
        json!(["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]),
        "the language extensions decide the Fn::Ifs SAM cannot take, before it runs"
    );
    let functions: BTreeSet<String> = template["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::Serverless::Function")
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(
        functions,
        FUNCTIONS.map(str::to_owned).into_iter().collect(),
        "the template's functions"
    );

    let off = Deployment::with(&[]);
    assert!(!off.holds("UsesCapacityProvider"), "off by default");
    let resources = off.resources();
    for resource in resources.values() {
        let kind = resource["Type"].as_str().unwrap();
        assert!(!kind.contains("CapacityProvider"), "off: a {kind}");
    }
    for function in &functions {
        let properties = &resources[function]["Properties"];
        assert!(properties.get("CapacityProviderConfig").is_none(), "off: {function}");
        assert!(properties.get("AutoPublishAlias").is_none(), "off: {function}");
        assert_eq!(properties["MemorySize"], 256, "off: {function}");
    }
    assert_eq!(
        resources["ApiIntegration"]["Properties"]["IntegrationUri"],
        json!({"Fn::GetAtt": ["ApiFunction", "Arn"]})
    );

    let on = Deployment::with(&[
        (
            "CapacityProviderSubnetIds",
            "subnet-0aaaaaaaaaaaaaaa1,subnet-0aaaaaaaaaaaaaaa2",
        ),
        ("CapacityProviderSecurityGroupIds", "sg-0bbbbbbbbbbbbbbb1"),
    ]);
    let resources = on.resources();
    let provider = &resources["CapacityProvider"];
    assert_eq!(provider["Type"], "AWS::Lambda::CapacityProvider");
    let vpc = &provider["Properties"]["VpcConfig"];
    assert_eq!(
        vpc["SubnetIds"],
        json!(["subnet-0aaaaaaaaaaaaaaa1", "subnet-0aaaaaaaaaaaaaaa2"])
    );
    assert_eq!(vpc["SecurityGroupIds"], json!(["sg-0bbbbbbbbbbbbbbb1"]));
    assert_eq!(
        provider["Properties"]["PermissionsConfig"]["CapacityProviderOperatorRoleArn"],
        json!({"Fn::GetAtt": ["CapacityProviderOperatorRole", "Arn"]})
    );
    for function in &functions {
        let properties = &resources[function]["Properties"];
        assert_eq!(
            properties["CapacityProviderConfig"],
            json!({"Arn": {"Fn::GetAtt": ["CapacityProvider", "Arn"]}}),
            "on: {function} runs on the provider"
        );
        assert_eq!(properties["AutoPublishAlias"], "live", "on: {function}");
        assert!(properties["MemorySize"].as_i64() >= Some(2048), "on: {function}");
    }
    assert_eq!(
        resources["ApiIntegration"]["Properties"]["IntegrationUri"],
        json!({"Ref": "ApiFunction.Alias"}),
        "the routes invoke the published version"
    );
    assert_eq!(
        resources["ApiInvokePermission"]["Properties"]["FunctionName"],
        json!({"Ref": "ApiFunction.Alias"})
    );
    // Subnets without security groups are refused before anything is created.
    let rule = &template["Rules"]["ACapacityProviderHasSecurityGroups"];
    // The rule applies exactly where the condition turns the option on, and refuses an
    // empty subnet as well as missing security groups.
    assert_eq!(
        rule["RuleCondition"],
        json!({"Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "CapacityProviderSubnetIds"}]}, ""]}]})
    );
    let asserted: Vec<&serde_json::Value> = rule["Assertions"]
        .as_array()
        .expect("assertions")
        .iter()
        .map(|assertion| &assertion["Assert"])
        .collect();
    for list in ["CapacityProviderSubnetIds", "CapacityProviderSecurityGroupIds"] {
        assert!(
            asserted.contains(&&json!({"Fn::Not": [{"Fn::Contains": [{"Ref": list}, ""]}]})),
            "the rule refuses an empty entry in {list}: {asserted:?}"
        );
    }
}

/// The control worker's function the guide gives a crate of its own ("A crate of your
/// own") is the template's: its build method, handler, runtime, timeout, its SQS event's
/// batch size and response types, and settings the worker reads.
#[test]
fn the_guides_control_worker_function_is_the_templates() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/GUIDE.md")).unwrap();
    let section = &guide[guide.find("## A crate of your own").expect("the section")..];
    let block = &section[section.find("```yaml\n").expect("its YAML block") + "```yaml\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    let fragment = YamlLoader::load_from_str(block).expect("valid YAML").remove(0);
    let guides = &fragment["ControlWorkerFunction"];
    let template = template();
    let ours = &template["Resources"]["ControlWorkerFunction"];
    let globals = &template["Globals"]["Function"];
    assert_eq!(guides["Metadata"]["BuildMethod"], ours["Metadata"]["BuildMethod"]);
    for (property, want) in [
        ("Handler", &globals["Handler"]),
        ("Runtime", &globals["Runtime"]),
        ("Timeout", &ours["Properties"]["Timeout"]),
    ] {
        assert_eq!(&guides["Properties"][property], want, "{property}");
    }
    let event = |function: &Yaml| {
        let events = function["Properties"]["Events"].as_hash().expect("events").clone();
        events
            .into_iter()
            .map(|(_, event)| event)
            .find(|event| event["Type"].as_str() == Some("SQS"))
            .expect("an SQS event")
    };
    let (guides_event, our_event) = (event(guides), event(ours));
    for property in ["BatchSize", "FunctionResponseTypes"] {
        assert_eq!(
            guides_event["Properties"][property], our_event["Properties"][property],
            "{property}"
        );
    }
    let read = variables_the_settings_read();
    let settings = names(&guides["Properties"]["Environment"]["Variables"]);
    assert!(
        settings.contains("OUTBOX_BACKEND"),
        "the guide's function gives its settings: {settings:?}"
    );
    for name in settings {
        assert!(read.contains(&name), "{name} is no setting the worker reads");
    }
}
