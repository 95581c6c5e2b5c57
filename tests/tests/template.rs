//! `template.yaml` against the code: every environment variable the code reads is set on
//! the function that reads it, every AWS action the code calls (counted on the wire
//! against the emulator) is granted to the function that calls it, on named resources,
//! and the queue and event settings follow the rules of DESIGN.md section 7.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::app::{router, HttpConfig};
use api::state::AppState;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use outbox::ports::Clock;
use outbox::protocol::{ControlMessage, TxnId};
use outbox::settings::{Settings, Timing};
use outbox::time::Timestamp;
use outbox::worker::lambda::handle_event;
use outbox_tests::calls::CallCounter;
use outbox_tests::conformance::Backend;
use outbox_tests::emulator::emulator;
use serde_json::json;
use tower::ServiceExt;
use yaml_rust2::{Yaml, YamlLoader};

const FUNCTIONS: [&str; 2] = ["ApiFunction", "ControlWorkerFunction"];

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

#[test]
fn every_variable_the_code_reads_is_set_on_each_function() {
    let template = template();
    let globals = names(&template["Globals"]["Function"]["Environment"]["Variables"]);
    let mut needed = variables_the_settings_read();
    assert!(needed.len() >= 12, "the recorder saw too little: {needed:?}");
    needed.insert("RUST_LOG".into());
    for function in FUNCTIONS {
        let mut set = globals.clone();
        set.extend(names(
            &template["Resources"][function]["Properties"]["Environment"]["Variables"],
        ));
        let missing: Vec<_> = needed.difference(&set).collect();
        assert!(missing.is_empty(), "{function} lacks {missing:?}");
    }
}

/// The IAM actions an SDK operation needs.
fn iam_actions(operation: &str) -> Vec<&'static str> {
    match operation {
        "BatchGetItem" => vec!["dynamodb:BatchGetItem"],
        "GetItem" => vec!["dynamodb:GetItem"],
        "PutItem" => vec!["dynamodb:PutItem"],
        "UpdateItem" => vec!["dynamodb:UpdateItem"],
        // A transaction is authorised action by action; the store's commits put, delete
        // and condition-check items.
        "TransactWriteItems" => vec!["dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem"],
        "BatchWriteItem" => vec!["dynamodb:BatchWriteItem", "dynamodb:PutItem", "dynamodb:DeleteItem"],
        "SendMessage" | "SendMessageBatch" => vec!["sqs:SendMessage"],
        "ChangeMessageVisibility" | "ChangeMessageVisibilityBatch" => vec!["sqs:ChangeMessageVisibility"],
        other => panic!("the code calls {other}: add its IAM actions to this table"),
    }
}

/// Grants of a function: action → the resources named for it.
fn grants(template: &Yaml, function: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut grants: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for policy in template["Resources"][function]["Properties"]["Policies"]
        .as_vec()
        .expect("inline policies")
    {
        for statement in policy["Statement"].as_vec().expect("statements") {
            assert_eq!(statement["Effect"].as_str(), Some("Allow"));
            let resources = strings(&statement["Resource"]);
            assert!(!resources.is_empty(), "{function}: a statement without resources");
            for action in strings(&statement["Action"]) {
                assert!(!action.contains('*'), "{function}: wildcard action {action}");
                for resource in &resources {
                    assert!(resource != "*", "{function}: wildcard resource for {action}");
                    grants.entry(action.clone()).or_default().insert(resource.clone());
                }
            }
        }
    }
    grants
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

/// Runs the API's routes and the control worker's handler on the emulator and returns
/// the operations each made.
async fn operations_by_function() -> BTreeMap<&'static str, BTreeSet<String>> {
    let counter = CallCounter::default();
    let backend = Backend::aws_with(counter.clients(&emulator().sdk_config().await)).await;
    let timing = Timing::default();
    counter.reset();
    let outbox = backend.outbox(timing);
    let app = router(
        AppState {
            outbox: Arc::new(outbox),
            events: "events".parse().unwrap(),
        },
        &HttpConfig::default(),
    );
    let send = |method: Method, uri: String, body: Option<serde_json::Value>| {
        let app = app.clone();
        async move {
            let mut request = Request::builder()
                .method(method)
                .uri(uri)
                .header("idempotency-key", "template-test");
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
    let txn = TxnId::new_v7();
    assert_eq!(
        send(Method::GET, format!("/transactions/{txn}"), None).await.0,
        StatusCode::OK
    );
    let mut operations = BTreeMap::new();
    operations.insert("ApiFunction", counter.counts().into_keys().collect());

    counter.reset();
    let control = backend.control(timing);
    let received = backend.inbox.receive(10, Duration::from_secs(3)).await.unwrap();
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
    operations.insert("ControlWorkerFunction", counter.counts().into_keys().collect());
    operations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_the_code_calls_is_granted_to_its_function_on_named_resources() {
    let template = template();
    let operations = operations_by_function().await;
    println!("operations on the wire: {operations:?}");
    for function in FUNCTIONS {
        let granted = grants(&template, function);
        for operation in &operations[function] {
            for action in iam_actions(operation) {
                let resources = granted
                    .get(action)
                    .unwrap_or_else(|| panic!("{function} calls {operation} but is not granted {action}"));
                let service_resource = if action.starts_with("dynamodb:") {
                    "Table"
                } else {
                    "Queue"
                };
                assert!(
                    resources.iter().all(|r| r.contains(service_resource)),
                    "{function}: {action} on {resources:?}"
                );
            }
        }
    }
    let worker = grants(&template, "ControlWorkerFunction");
    let targets: Vec<&String> = worker["sqs:SendMessage"].iter().collect();
    assert_eq!(
        targets.len(),
        2,
        "the worker sends to the control queue (deferrals) and the events queue: {targets:?}"
    );
    let api = grants(&template, "ApiFunction");
    assert_eq!(
        api["sqs:SendMessage"].len(),
        2,
        "the API sends control messages, and with inline publishing the events"
    );
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
        Some(i64::from(outbox::redelivery::MAX_RECEIVE_COUNT)),
        "the control queue's redrive policy is the one the worker's retry backoff is sized for"
    );
    for queue in ["ControlQueue", "EventsQueue"] {
        let redrive = &resources[queue]["Properties"]["RedrivePolicy"];
        assert!(
            redrive["maxReceiveCount"].as_i64().unwrap() >= 5,
            "{queue}: maxReceiveCount under 5"
        );
    }
    let event = &resources["ControlWorkerFunction"]["Properties"]["Events"]["ControlQueue"]["Properties"];
    assert!(event["BatchSize"].as_i64().unwrap() <= 10);
    assert_eq!(strings(&event["FunctionResponseTypes"]), ["ReportBatchItemFailures"]);
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
    for function in FUNCTIONS {
        assert_eq!(
            resources[function]["Metadata"]["BuildMethod"].as_str(),
            Some("rust-cargolambda")
        );
    }
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
