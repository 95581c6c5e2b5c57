//! DynamoDB answers the emulator cannot give, through the real SDK client: a stub
//! endpoint on loopback answers every `TransactWriteItems` with one error, in DynamoDB's
//! wire format (`__type` and `message`), and each is told apart as definite ("nothing was
//! written") or ambiguous ("may have committed"), as I7 needs.

use std::sync::Arc;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::Client;
use axum::http::{header, StatusCode};
use outbox::aws::DynamoStore;
use outbox::embedded::ManualClock;
use outbox::ports::{CommitError, CommitRequest, Store};
use outbox::protocol::{OutboxRecord, TxnId};
use outbox::time::Timestamp;

/// The commit's error when DynamoDB answers `status` with error `kind` every time.
async fn commit_answered_with(status: StatusCode, kind: &'static str) -> CommitError {
    let body = format!(r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{kind}","message":"stubbed {kind}"}}"#);
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { (status, [(header::CONTENT_TYPE, "application/x-amz-json-1.0")], body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "stub"))
        .endpoint_url(endpoint)
        .build();
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let store = DynamoStore::new(Client::from_conf(config), "outbox", clock);
    let txn = TxnId::new_v7();
    let now = Timestamp::from_millis(1_700_000_000_000);
    let request = CommitRequest {
        txn_id: txn,
        writes: vec![],
        outbox: OutboxRecord::committed(txn, vec![], now, now),
        idempotency: None,
    };
    let error = store.commit(&request).await.expect_err("the stub refuses every commit");
    server.abort();
    error
}

#[tokio::test]
async fn an_earlier_attempt_still_running_or_run_with_other_parameters_may_have_committed() {
    let in_progress = commit_answered_with(StatusCode::BAD_REQUEST, "TransactionInProgressException").await;
    assert!(matches!(in_progress, CommitError::Ambiguous(_)), "{in_progress:?}");
    let mismatch = commit_answered_with(StatusCode::BAD_REQUEST, "IdempotentParameterMismatchException").await;
    assert!(matches!(mismatch, CommitError::Ambiguous(_)), "{mismatch:?}");
}

#[tokio::test]
async fn refusals_before_anything_ran_are_definite() {
    match commit_answered_with(StatusCode::BAD_REQUEST, "ValidationException").await {
        CommitError::Invalid { reason } => {
            assert_eq!(reason, "stubbed ValidationException", "DynamoDB's message is kept")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let denied = commit_answered_with(StatusCode::BAD_REQUEST, "AccessDeniedException").await;
    assert!(matches!(denied, CommitError::Unavailable(_)), "{denied:?}");
    let throttled = commit_answered_with(StatusCode::BAD_REQUEST, "ThrottlingException").await;
    assert!(matches!(throttled, CommitError::Contention(_)), "{throttled:?}");
}

#[tokio::test]
async fn an_internal_error_may_have_committed() {
    let internal = commit_answered_with(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError").await;
    assert!(matches!(internal, CommitError::Ambiguous(_)), "{internal:?}");
}

// Publishing to SNS topics and EventBridge buses, through the real SDK clients: a stub
// endpoint on loopback answers each `PublishBatch` (awsQuery: a form-encoded request, an
// XML answer) or `PutEvents` (JSON 1.1) with per-entry failures, and `publish_all` must
// retry exactly the entries that failed for a reason that may pass, and report the ones
// refused as the sender's fault.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_sns::config::SharedCredentialsProvider;
use axum::body::Bytes;
use axum::http::HeaderMap;
use outbox::aws::{AwsClients, AwsPublisher};
use outbox::destination::Target;
use outbox::ports::SystemClock;
use outbox::protocol::{DestinationName, Message, OutgoingMessage};
use outbox::publish::{publish_all, PublishFailure, PublishReport, RetryPolicy};
use serde_json::{json, Value};

/// One request the stub received.
struct Received {
    headers: HeaderMap,
    body: Bytes,
}

/// A loopback endpoint that records every request and answers the `n`th (from 0) with
/// `answer(n, body)`, as `content_type`.
struct Stub {
    endpoint: String,
    requests: Arc<Mutex<Vec<Received>>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Stub {
    async fn start(
        content_type: &'static str,
        answer: impl Fn(usize, &[u8]) -> String + Send + Sync + 'static,
    ) -> Self {
        let requests: Arc<Mutex<Vec<Received>>> = Arc::default();
        let answer = Arc::new(answer);
        let recorded = requests.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let recorded = recorded.clone();
            let answer = answer.clone();
            async move {
                let call = {
                    let mut requests = recorded.lock().unwrap();
                    requests.push(Received {
                        headers,
                        body: body.clone(),
                    });
                    requests.len() - 1
                };
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, content_type)],
                    answer(call, &body),
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            endpoint,
            requests,
            server,
        }
    }

    /// Every client pointed at the stub.
    fn clients(&self) -> AwsClients {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "test", "test", None, None, "stub",
            )))
            .endpoint_url(&self.endpoint)
            .build();
        AwsClients::new(&config)
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|request| request.body.clone())
            .collect()
    }

    fn header(&self, call: usize, name: &str) -> Option<String> {
        let requests = self.requests.lock().unwrap();
        requests[call]
            .headers
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Retries soon, so that the tests do not wait.
const QUICK: RetryPolicy = RetryPolicy {
    attempts: 3,
    base_delay: Duration::from_millis(1),
    max_delay: Duration::from_millis(5),
};

fn destination() -> DestinationName {
    "events".parse().unwrap()
}

/// `count` messages of one transaction to [`destination`], each passed through `shape`.
fn outgoing(count: u32, shape: impl Fn(u32, Message) -> Message) -> Vec<OutgoingMessage> {
    let txn = outbox::protocol::TxnId::new_v7();
    (0..count)
        .map(|position| {
            let message = Message::json(destination(), &json!({"order_id": format!("o-{position}")})).unwrap();
            OutgoingMessage::new(txn, position, shape(position, message))
        })
        .collect()
}

async fn publish(stub: &Stub, target: Target, messages: &[OutgoingMessage]) -> PublishReport {
    let publisher = AwsPublisher::new(stub.clients(), BTreeMap::from([(destination(), target)]));
    let refs: Vec<&OutgoingMessage> = messages.iter().collect();
    publish_all(&publisher, &SystemClock, &refs, QUICK).await
}

// --- EventBridge ---------------------------------------------------------------------

const BUS: &str = "orders-bus";

/// A `PutEvents` answer: one result entry per element of `results` (`None` accepted,
/// `Some(code)` failed with that code).
fn put_events_answer(failed_entry_count: usize, results: &[Option<&str>]) -> String {
    let entries: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(index, result)| match result {
            None => json!({"EventId": format!("event-{index}")}),
            Some(code) => json!({"ErrorCode": code, "ErrorMessage": format!("stubbed {code}")}),
        })
        .collect();
    json!({"FailedEntryCount": failed_entry_count, "Entries": entries}).to_string()
}

/// The entries of a recorded `PutEvents` request.
fn put_events_entries(body: &[u8]) -> Vec<Value> {
    let request: Value = serde_json::from_slice(body).expect("PutEvents sends JSON");
    request["Entries"].as_array().expect("an Entries array").clone()
}

/// The stable id in an entry's `Detail`.
fn detail_message_id(entry: &Value) -> String {
    let detail: Value =
        serde_json::from_str(entry["Detail"].as_str().expect("Detail is a string")).expect("Detail is JSON");
    detail["metadata"]["outbox-message-id"]
        .as_str()
        .expect("metadata.outbox-message-id")
        .to_owned()
}

/// A stub bus whose first answer is `first` and whose later answers accept every entry.
async fn bus_answering_first(first: String) -> Stub {
    Stub::start("application/x-amz-json-1.1", move |call, body| {
        if call == 0 {
            first.clone()
        } else {
            put_events_answer(0, &vec![None; put_events_entries(body).len()])
        }
    })
    .await
}

/// The stub's bus.
fn bus_target() -> Target {
    Target::EventBus {
        name_or_arn: BUS.into(),
    }
}

/// A stub topic.
fn topic_target(arn: &str, fifo: bool) -> Target {
    Target::SnsTopic { arn: arn.into(), fifo }
}

#[tokio::test]
async fn eventbridge_retries_a_throttled_entry_alone_and_reports_a_malformed_one_as_refused() {
    let stub = bus_answering_first(put_events_answer(
        2,
        &[None, Some("ThrottlingException"), Some("MalformedDetail")],
    ))
    .await;
    let messages = outgoing(3, |_, message| message.with_event("shop.orders", "OrderPlaced"));
    let report = publish(&stub, bus_target(), &messages).await;

    let bodies = stub.bodies();
    assert_eq!(report.calls, 2, "one call, then one retry");
    assert_eq!(bodies.len(), 2, "the SDK sent exactly the calls publish_all counted");
    for call in 0..2 {
        assert_eq!(
            stub.header(call, "x-amz-target").as_deref(),
            Some("AWSEvents.PutEvents")
        );
    }

    let first = put_events_entries(&bodies[0]);
    assert_eq!(first.len(), 3);
    for (entry, message) in first.iter().zip(&messages) {
        assert_eq!(entry["EventBusName"], BUS);
        assert_eq!(entry["Source"], "shop.orders");
        assert_eq!(entry["DetailType"], "OrderPlaced");
        assert_eq!(detail_message_id(entry), message.id.as_str(), "in request order");
    }

    let second = put_events_entries(&bodies[1]);
    assert_eq!(second.len(), 1, "only the throttled entry is sent again: {second:?}");
    assert_eq!(detail_message_id(&second[0]), messages[1].id.as_str());
    assert_eq!(second[0]["EventBusName"], BUS);

    assert_eq!(
        report.failed,
        BTreeMap::from([(
            messages[2].id.clone(),
            PublishFailure::Refused {
                code: "MalformedDetail".into()
            }
        )]),
        "the malformed entry is refused, not retried; the others went"
    );
}

#[tokio::test]
async fn eventbridge_entries_the_answer_leaves_out_are_retried() {
    let stub = bus_answering_first(put_events_answer(0, &[None])).await;
    let messages = outgoing(3, |_, message| message);
    let report = publish(&stub, bus_target(), &messages).await;

    let bodies = stub.bodies();
    assert_eq!(report.calls, 2);
    assert_eq!(bodies.len(), 2);
    assert_eq!(put_events_entries(&bodies[0]).len(), 3);
    let retried: Vec<String> = put_events_entries(&bodies[1]).iter().map(detail_message_id).collect();
    assert_eq!(
        retried,
        [messages[1].id.as_str(), messages[2].id.as_str()],
        "the two entries with no result are sent again, and only they"
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
}

#[tokio::test]
async fn eventbridge_a_failure_count_that_names_no_failed_entry_retries_every_entry() {
    let stub = bus_answering_first(put_events_answer(1, &[None, None, None])).await;
    let messages = outgoing(3, |_, message| message);
    let report = publish(&stub, bus_target(), &messages).await;

    let bodies = stub.bodies();
    assert_eq!(report.calls, 2);
    let retried: Vec<String> = put_events_entries(&bodies[1]).iter().map(detail_message_id).collect();
    assert_eq!(
        retried,
        messages.iter().map(|message| message.id.as_str()).collect::<Vec<_>>(),
        "which entry failed is unknown, so every one is sent again"
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
}

// --- SNS -------------------------------------------------------------------------------

const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:events";
const FIFO_TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:t.fifo";

/// Decodes one `application/x-www-form-urlencoded` component.
fn url_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'+' => {
                out.push(b' ');
                at += 1;
            }
            b'%' => {
                let hex = std::str::from_utf8(&bytes[at + 1..at + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).expect("a percent escape"));
                at += 3;
            }
            byte => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

/// A recorded awsQuery request, decoded: its parameters by name.
fn form(body: &[u8]) -> BTreeMap<String, String> {
    std::str::from_utf8(body)
        .expect("a form is text")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (url_decode(name), url_decode(value))
        })
        .collect()
}

/// The `Id`s of a `PublishBatch` request's entries, in order.
fn entry_ids(form: &BTreeMap<String, String>) -> Vec<String> {
    (1..)
        .map_while(|member| {
            form.get(&format!("PublishBatchRequestEntries.member.{member}.Id"))
                .cloned()
        })
        .collect()
}

/// The string value of message attribute `name` on entry `member` (from 1); the SDK
/// writes the attribute map in no set order.
fn sns_attribute(form: &BTreeMap<String, String>, member: usize, name: &str) -> Option<String> {
    let prefix = format!("PublishBatchRequestEntries.member.{member}.MessageAttributes.entry.");
    let key = form
        .iter()
        .find(|(key, value)| key.starts_with(&prefix) && key.ends_with(".Name") && value.as_str() == name)?
        .0;
    let index = key.strip_prefix(&prefix)?.strip_suffix(".Name")?;
    form.get(&format!("{prefix}{index}.Value.StringValue")).cloned()
}

/// A `PublishBatch` answer for the entries `ids`, failing `failed` (an id, its code and
/// whether it is the sender's fault) and accepting the others.
fn publish_batch_answer(ids: &[String], failed: Option<(&str, &str, bool)>) -> String {
    let mut successful = String::new();
    let mut failures = String::new();
    for id in ids {
        match failed {
            Some((failed_id, code, sender_fault)) if failed_id == id => failures.push_str(&format!(
                "<member><Id>{id}</Id><Code>{code}</Code><Message>stubbed {code}</Message>\
                 <SenderFault>{sender_fault}</SenderFault></member>"
            )),
            _ => successful.push_str(&format!(
                "<member><Id>{id}</Id><MessageId>sns-{id}</MessageId></member>"
            )),
        }
    }
    format!(
        r#"<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>{successful}</Successful><Failed>{failures}</Failed></PublishBatchResult><ResponseMetadata><RequestId>stub-request</RequestId></ResponseMetadata></PublishBatchResponse>"#
    )
}

/// A stub topic that fails entry `failed` of the first `PublishBatch` and accepts every
/// entry of later ones.
async fn topic_failing_first(failed: Option<(&'static str, &'static str, bool)>) -> Stub {
    Stub::start("text/xml", move |call, body| {
        let ids = entry_ids(&form(body));
        publish_batch_answer(&ids, if call == 0 { failed } else { None })
    })
    .await
}

#[tokio::test]
async fn sns_retries_an_entry_failed_by_an_internal_error_alone() {
    let stub = topic_failing_first(Some(("1", "InternalError", false))).await;
    let messages = outgoing(3, |_, message| message);
    let report = publish(&stub, topic_target(TOPIC, false), &messages).await;

    let bodies = stub.bodies();
    assert_eq!(report.calls, 2, "one call, then one retry");
    assert_eq!(bodies.len(), 2);
    let first = form(&bodies[0]);
    assert_eq!(first["Action"], "PublishBatch");
    assert_eq!(first["TopicArn"], TOPIC);
    assert_eq!(entry_ids(&first), ["0", "1", "2"]);
    for (member, message) in (1..).zip(&messages) {
        assert_eq!(
            sns_attribute(&first, member, "outbox-message-id").as_deref(),
            Some(message.id.as_str())
        );
        assert_eq!(
            sns_attribute(&first, member, "outbox-txn-id"),
            Some(message.txn_id.to_string())
        );
        assert_eq!(
            first[&format!("PublishBatchRequestEntries.member.{member}.Message")],
            message.body
        );
        for fifo_only in ["MessageGroupId", "MessageDeduplicationId"] {
            assert!(
                !first.contains_key(&format!("PublishBatchRequestEntries.member.{member}.{fifo_only}")),
                "a standard topic takes no {fifo_only}"
            );
        }
    }

    let second = form(&bodies[1]);
    assert_eq!(second["Action"], "PublishBatch");
    assert_eq!(entry_ids(&second), ["0"], "only the failed entry is sent again");
    assert_eq!(
        sns_attribute(&second, 1, "outbox-message-id").as_deref(),
        Some(messages[1].id.as_str()),
        "and it is the message whose entry failed"
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
}

#[tokio::test]
async fn sns_an_entry_failed_as_the_senders_fault_is_refused_without_a_retry() {
    let stub = topic_failing_first(Some(("1", "InvalidParameter", true))).await;
    let messages = outgoing(3, |_, message| message);
    let report = publish(&stub, topic_target(TOPIC, false), &messages).await;

    assert_eq!(report.calls, 1, "nothing is left to retry");
    assert_eq!(stub.bodies().len(), 1);
    assert_eq!(
        report.failed,
        BTreeMap::from([(
            messages[1].id.clone(),
            PublishFailure::Refused {
                code: "InvalidParameter".into()
            }
        )])
    );
}

#[tokio::test]
async fn sns_fifo_entries_carry_their_group_and_their_stable_id_as_deduplication_id() {
    let stub = topic_failing_first(None).await;
    // Three groups: a FIFO destination takes at most one message of a group per call.
    let messages = outgoing(3, |position, message| match position {
        1 => message.with_group_id("order-6"),
        2 => message.with_group_id("order-7"),
        _ => message,
    });
    let report = publish(&stub, topic_target(FIFO_TOPIC, true), &messages).await;

    assert_eq!(report.calls, 1);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let bodies = stub.bodies();
    assert_eq!(bodies.len(), 1);
    let first = form(&bodies[0]);
    assert_eq!(first["TopicArn"], FIFO_TOPIC);
    assert_eq!(entry_ids(&first).len(), 3);
    for (member, message) in (1..).zip(&messages) {
        let field = |name: &str| first.get(&format!("PublishBatchRequestEntries.member.{member}.{name}"));
        assert_eq!(field("MessageDeduplicationId"), Some(&message.id.as_str().to_owned()));
        assert_eq!(field("MessageGroupId"), Some(&message.fifo_group()));
    }
    let group = |member: usize| first[&format!("PublishBatchRequestEntries.member.{member}.MessageGroupId")].clone();
    assert_eq!(group(1), messages[0].txn_id.to_string(), "by default, the transaction");
    assert_eq!(group(3), "order-7", "or the group the message chose");
}

// A commit whose first request the SDK gave up on (a timeout) may still apply, however
// definitely the later requests are refused (docs/PROTOCOL.md section 3: "An attempt's outcome
// is unknown whenever any request of it may still reach the table"). Through the real
// SDK client with the production timeouts and retries, a stub DynamoDB holds the first
// `TransactWriteItems` past the attempt timeout, throttles every later one, and answers
// the settling tombstone's `PutItem` with `TransactionConflict` (the held transaction
// still has the item): the answer must be "outcome unknown", never "nothing written".

use outbox::embedded::EmbeddedBackend;
use outbox::ports::{Clock, ExpectedVersion, ItemKey, RandomIds};
use outbox::request::{Outbox, RequestPorts, TxnError};
use outbox::settings::{Timing, TransactionLimits};

/// A DynamoDB error answer in the JSON 1.0 protocol.
fn dynamodb_error(kind: &str) -> String {
    format!(r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{kind}","message":"stubbed {kind}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_request_the_sdk_gave_up_on_leaves_the_outcome_unknown_however_the_rest_end() {
    let calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorded = calls.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let recorded = recorded.clone();
        async move {
            let operation =
                outbox_tests::calls::operation_of(headers.get("x-amz-target").and_then(|value| value.to_str().ok()));
            let earlier = {
                let mut calls = recorded.lock().unwrap();
                calls.push(operation.clone());
                calls.iter().filter(|call| **call == operation).count() - 1
            };
            let (status, body) = match (operation.as_str(), earlier) {
                // Held on a hot partition: it answers (applied) long after the client gave up.
                ("TransactWriteItems", 0) => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    (StatusCode::OK, "{}".to_owned())
                }
                ("TransactWriteItems", _) => (StatusCode::BAD_REQUEST, dynamodb_error("ThrottlingException")),
                ("PutItem", _) => (StatusCode::BAD_REQUEST, dynamodb_error("TransactionConflictException")),
                _ => (StatusCode::BAD_REQUEST, dynamodb_error("ValidationException")),
            };
            (status, [(header::CONTENT_TYPE, "application/x-amz-json-1.0")], body)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // The production client, as `load_sdk_config` builds it: half the operation timeout
    // per attempt, standard retries (3 attempts, jittered backoff of at most 1 s and then
    // 2 s) for every call but the commit, which the store sends once per call. With 8 s,
    // the held request is given up after 4 s; were the SDK retrying the commit, both
    // throttled retries would always fit in the rest, and the call would end with the
    // throttle, hiding the held request (the bug this test was written against).
    let config = outbox::aws::sdk_config_loader(Duration::from_secs(8))
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "stub"))
        .load()
        .await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let queues = EmbeddedBackend::new(clock.clone(), []);
    let outbox = Outbox::new(
        RequestPorts {
            store: Arc::new(DynamoStore::new(Client::new(&config), "outbox", clock.clone())),
            control_queue: queues.control_queue.clone(),
            clock: clock.clone(),
            ids: Arc::new(RandomIds),
        },
        Timing::default(),
        TransactionLimits::default(),
    );
    let mut txn = outbox
        .begin_within(clock.now().plus(Duration::from_secs(40)))
        .await
        .expect("begin");
    let key: ItemKey = "ORDER#1".parse().unwrap();
    txn.put(key, json!({"status": "placed"}), ExpectedVersion::Absent);
    let answer = txn.commit().await;
    server.abort();
    let calls = calls.lock().unwrap().clone();
    assert!(
        matches!(answer, Err(TxnError::Ambiguous { .. })),
        "the first commit request may still apply, so the answer must be \"outcome unknown\", got {answer:?} \
         after {calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|call| *call == "TransactWriteItems").count(),
        outbox::request::COMMIT_ATTEMPTS as usize,
        "one request per attempt of the request path, each counted: {calls:?}"
    );
    assert!(
        calls.iter().any(|call| call == "PutItem"),
        "the settling write was tried: {calls:?}"
    );
}

/// Entries of a visibility change that SQS answers `MessageNotInflight` or
/// `ReceiptHandleIsInvalid` (the receiver no longer holds the message) are returned by
/// receipt, for the lease to tell an acknowledged message from a lease that ran out.
#[tokio::test]
async fn receipts_sqs_no_longer_counts_as_held_are_returned() {
    use outbox::aws::SqsControlQueue;
    use outbox::ports::ControlInbox;

    let stub = Stub::start("application/x-amz-json-1.0", |_, _| {
        json!({
            "Successful": [{"Id": "0"}],
            "Failed": [
                {"Id": "1", "Code": "MessageNotInflight", "SenderFault": true, "Message": "not in flight"},
                {"Id": "2", "Code": "ReceiptHandleIsInvalid", "SenderFault": true, "Message": "invalid"}
            ]
        })
        .to_string()
    })
    .await;
    let queue = SqsControlQueue::new(stub.clients().sqs, "http://queue.example/123/control");
    let receipts: Vec<(String, Duration)> = ["a", "b", "c"]
        .iter()
        .map(|receipt| (receipt.to_string(), Duration::from_secs(30)))
        .collect();
    let gone = queue.set_visibility(&receipts).await.expect("the call succeeded");
    assert_eq!(gone, ["b", "c"]);
}
