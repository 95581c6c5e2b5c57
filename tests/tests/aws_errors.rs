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
