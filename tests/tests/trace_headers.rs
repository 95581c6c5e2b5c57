//! On Lambda Managed Instances several invocations run in one process at once, and
//! `lambda_runtime` puts no invocation's trace header in the process's `_X_AMZN_TRACE_ID`:
//! a control message sent without a trace context of its own carries the X-Ray header of
//! the invocation that sent it, from that invocation's context. Driven through a fake
//! Lambda Runtime API (`outbox_tests::fake_lambda`) in the Managed Instances model: two
//! invocations, each with its own trace header, are in their handlers at once and each
//! sends a control message; each send's `AWSTraceHeader` is its own invocation's. The
//! function's process has a process-wide `_X_AMZN_TRACE_ID` of its own, which no send may
//! carry. Both runtime loops are driven: the HTTP one (`outbox::http::lambda::run`, the
//! API's) and the SQS one (`outbox::telemetry::lambda::run`, the control worker's and the
//! consumers').

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use outbox::aws::SqsControlQueue;
use outbox::ports::ControlQueue;
use outbox::protocol::{ControlMessage, TxnId};
use outbox::time::Timestamp;
use outbox_tests::calls::CallCounter;
use outbox_tests::fake_lambda::{call, FakeLambda, Invoke, Model, Seen};
use serde_json::{json, Value};

/// What the function's process finds in its environment, as a process-wide header no
/// invocation of it owns.
const PROCESS_WIDE: &str = "Root=1-00000000-process0wide0header00000000;Parent=00000000000000ff;Sampled=1";

/// The role the function's process plays: `http` or `sqs`.
const ROLE: &str = "OUTBOX_TESTS_LAMBDA_FUNCTION";

/// Sends one control message without a trace context of its own, after `count`
/// invocations are inside at once, to an endpoint that refuses it (the send's request is
/// what matters, read before it goes out); the `AWSTraceHeader` it carried, if any.
async fn send_once_all_are_inside(runtime_api: &str, count: usize) -> Option<String> {
    call(runtime_api, &format!("/test/gate/sends/{count}"))
        .await
        .expect("the gate");
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url("http://127.0.0.1:9")
        .retry_config(RetryConfig::disabled())
        .load()
        .await;
    let counter = CallCounter::default();
    let queue = SqsControlQueue::new(counter.clients(&config).sqs, "http://127.0.0.1:9/123456789012/control");
    let message = ControlMessage::first(
        TxnId::from_parts(Timestamp::from_millis(1), [7; 10]),
        Timestamp::from_millis(1),
    );
    let _refused = queue.send(&message, Duration::ZERO).await;
    let body = counter.bodies("SendMessage").pop().expect("the send went out");
    let body: Value = serde_json::from_slice(&body).expect("SQS's JSON protocol");
    body["MessageSystemAttributes"]["AWSTraceHeader"]["StringValue"]
        .as_str()
        .map(str::to_owned)
}

/// The Lambda function of the tests below, as a process of its own (this test binary,
/// running this test alone, with the variables Lambda sets, and a `_X_AMZN_TRACE_ID` set
/// by itself before anything runs). As `http`: a router under `outbox::http::lambda::run`
/// whose `GET /send` sends; as `sqs`: an SQS handler under
/// `outbox::telemetry::lambda::run` that sends. Each answers the header its send carried
/// and its invocation's own. Does nothing when run otherwise.
#[test]
#[ignore = "the function's process of the trace header tests, which start it"]
fn trace_function_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    // One thread so far: what a process-wide header would be, were one set.
    std::env::set_var("_X_AMZN_TRACE_ID", PROCESS_WIDE);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let runtime_api = std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap();
    if role == "sqs" {
        use aws_lambda_events::event::sqs::SqsEvent;
        use lambda_http::lambda_runtime::{service_fn, LambdaEvent};
        let handler = service_fn(move |event: LambdaEvent<SqsEvent>| {
            let runtime_api = runtime_api.clone();
            async move {
                let sent = send_once_all_are_inside(&runtime_api, 2).await;
                Ok::<_, lambda_http::Error>(json!({"sent": sent, "own": event.context.xray_trace_id}))
            }
        });
        let stopped = runtime.block_on(outbox::telemetry::lambda::run(handler));
        panic!("the function stopped: {stopped:?}");
    }
    let stopped = runtime.block_on(async move {
        let app = axum::Router::new().route(
            "/send",
            axum::routing::get(move |request: axum::extract::Request| async move {
                use lambda_http::RequestExt;
                let own = request
                    .lambda_context_ref()
                    .and_then(|context| context.xray_trace_id.clone());
                let sent = send_once_all_are_inside(&runtime_api, 2).await;
                axum::Json(json!({"sent": sent, "own": own}))
            }),
        );
        outbox::http::lambda::run(app, None).await
    });
    panic!("the function stopped: {stopped:?}");
}

/// Runs the function as `role` on Managed Instances (two at once) with two invocations
/// made by `invoke`, and checks that each send carried its own invocation's header.
async fn each_send_carries_its_own_invocations_header(role: &str, invoke: impl Fn(&str) -> Invoke) {
    let lambda = FakeLambda::start(Model::ManagedInstances).await;
    let invocations = ["first-invocation", "second-invocation"];
    for id in invocations {
        lambda.invoke(invoke(id));
    }
    let _function = lambda.start_function("trace_function_process", role, Some(2), "warn");
    let mut sent = Vec::new();
    for id in invocations {
        let answer = lambda
            .wait_for(
                Duration::from_secs(30),
                |seen| matches!(seen, Seen::Answered(answered, _) if answered == id),
            )
            .await
            .unwrap_or_else(|timeline| panic!("{id} was not answered:\n{timeline}"));
        let Seen::Answered(_, body) = answer.seen else {
            unreachable!()
        };
        // An HTTP answer carries the handler's JSON as its body.
        let body = match body.get("body").and_then(Value::as_str) {
            Some(text) => serde_json::from_str::<Value>(text).expect("the handler's JSON"),
            None => body,
        };
        let own = body["own"].as_str().expect("the invocation's trace header").to_owned();
        assert_eq!(
            body["sent"].as_str(),
            Some(own.as_str()),
            "{role}: {id}'s control message carried another header than its own ({PROCESS_WIDE} is the process's)\n{}",
            lambda.describe()
        );
        sent.push(own);
    }
    assert_ne!(sent[0], sent[1], "the fake gives each invocation a header of its own");
    assert!(!sent.iter().any(|header| header == PROCESS_WIDE));
    println!("{role}: two invocations at once, each control message with its own header: {sent:?}");
}

/// The API's runtime loop (`outbox::http::lambda::run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_managed_instances_each_requests_control_message_carries_its_own_trace_header() {
    each_send_carries_its_own_invocations_header("http", |id| Invoke::http_get(id, "/send", Duration::from_secs(60)))
        .await;
}

/// The control worker's and the consumers' runtime loop (`outbox::telemetry::lambda::run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_managed_instances_each_batchs_control_message_carries_its_own_trace_header() {
    each_send_carries_its_own_invocations_header("sqs", |id| Invoke::sqs(id, Duration::from_secs(60))).await;
}
