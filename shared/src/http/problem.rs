//! RFC 9457 problem documents, and the one mapping from a transaction's failure to its
//! answer.
//!
//! Every answer about a transaction that began names it, in the `x-transaction-id` header
//! and the `transaction_id` member. A 5xx says no more than what the client can act on:
//! whether anything was written, and when to retry (`Retry-After`); causes are logged.

use aws_smithy_types::error::display::DisplayErrorContext;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::ports::CommitError;
use crate::protocol::TxnId;
use crate::request::TxnError;

/// The header that carries a transaction id on answers that concern one.
pub const TRANSACTION_ID_HEADER: &str = "x-transaction-id";
/// The header that names, percent-encoded, the item a transaction begun in entity mode
/// commits into: a status read of the transaction needs it once the transaction's proof
/// lives in that item (`GET /transactions/{id}?item=…` in the orders API).
pub const TRANSACTION_ITEM_HEADER: &str = "x-transaction-item";

/// `key` percent-encoded, for [`TRANSACTION_ITEM_HEADER`] and a query string: every byte
/// but ASCII letters, digits and `-._~` is escaped, so that the value is both a valid
/// header and a valid query parameter, which a query decoder turns back into the key.
pub fn encode_item_key(key: &crate::ports::ItemKey) -> String {
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(key.as_str(), ESCAPED).to_string()
}
/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// How many seconds `Retry-After` asks a client to wait before retrying a 503.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    /// The field's path in the request, for example `items[0].quantity`.
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

impl FieldError {
    /// An error for `field`.
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

/// An RFC 9457 problem document. Answered as `application/problem+json`, with
/// `Retry-After` when [`Self::retry_after`] is set and `x-transaction-id` when it names a
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URI reference naming the problem type (`/problems/{kind}`, or `about:blank`).
    #[serde(rename = "type")]
    pub problem_type: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    #[cfg_attr(feature = "openapi", schema(minimum = 400, maximum = 599))]
    pub status: u16,
    /// What happened this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The invalid fields, for validation problems.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The transaction concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            value_type = Option<String>,
            format = Uuid,
            pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
        )
    )]
    pub transaction_id: Option<String>,
    /// Seconds the client should wait before retrying, sent as `Retry-After`.
    #[serde(skip)]
    pub retry_after: Option<u32>,
}

impl Problem {
    /// A problem of `kind` (its type is `/problems/{kind}`; `about:blank` stays as it is).
    pub fn new(status: StatusCode, kind: &str, title: &str) -> Self {
        Self {
            problem_type: if kind == "about:blank" {
                kind.to_owned()
            } else {
                format!("/problems/{kind}")
            },
            title: title.to_owned(),
            status: status.as_u16(),
            detail: None,
            errors: Vec::new(),
            transaction_id: None,
            retry_after: None,
        }
    }

    /// A 409 of `kind`: the request conflicts with the state (a product that exists, no
    /// stock left), the refusal a business rule decides most often.
    pub fn conflict(kind: &str, title: &str) -> Self {
        Self::new(StatusCode::CONFLICT, kind, title)
    }

    /// A 404 of `kind`: what the request names does not exist.
    pub fn not_found(kind: &str, title: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, kind, title)
    }

    /// This problem with `detail`.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// This problem naming transaction `txn_id`, unless it names one already.
    pub fn naming(mut self, txn_id: TxnId) -> Self {
        self.transaction_id.get_or_insert_with(|| txn_id.to_string());
        self
    }

    /// This problem asking the client to retry after [`RETRY_AFTER_SECONDS`].
    pub fn retryable(mut self) -> Self {
        self.retry_after = Some(RETRY_AFTER_SECONDS);
        self
    }

    /// The status code.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut response = (self.status_code(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(txn) = self
            .transaction_id
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert(TRANSACTION_ID_HEADER, txn);
        }
        response
    }
}

/// `response` named after transaction `txn_id`: a problem+json answer whose body names no
/// transaction gets its `transaction_id` (the deadline middleware does this for every
/// answer of a request whose transaction began and may be known outside, so a refusal
/// names it whether or not its handler said [`super::HttpError::in_transaction`]); any
/// other answer is left as it is.
pub(crate) async fn naming_in_body(response: Response, txn_id: TxnId) -> Response {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The body is the handler's, whole in memory already.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "about:blank",
            "Internal Server Error",
        )
        .naming(txn_id)
        .into_response();
    };
    let named = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut fields)) if !fields.contains_key("transaction_id") => {
            fields.insert("transaction_id".into(), serde_json::Value::String(txn_id.to_string()));
            parts.headers.remove(header::CONTENT_LENGTH);
            serde_json::to_vec(&fields)
                .map(axum::body::Bytes::from)
                .unwrap_or(bytes)
        }
        _ => bytes,
    };
    Response::from_parts(parts, axum::body::Body::from(named))
}

/// Answers `error` with `problem`, logging it: a 5xx (whose body says nothing of the
/// cause) as an error with its whole chain of causes, each with the details an AWS SDK
/// error keeps ([`DisplayErrorContext`]); anything else as information, in one line. The
/// one place every error type of the glue, and of a service built on it, becomes a
/// response, and so the one place a 5xx's cause is logged.
pub fn respond(error: &dyn std::error::Error, problem: Problem) -> Response {
    if problem.status >= 500 {
        tracing::error!(status = problem.status, error = %DisplayErrorContext(error), "request failed");
    } else {
        tracing::info!(status = problem.status, error = %Chain(error), "request refused");
    }
    problem.into_response()
}

/// An error and its sources, each's message after the last's: `in transaction T: item
/// ORDER#1 changed concurrently`.
struct Chain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// "Nothing was written; retry the request."
const NOTHING_WRITTEN: &str = "nothing was written; retry the request";
/// What an answer of unknown outcome tells the client.
pub const OUTCOME_UNKNOWN: &str =
    "the change may or may not have happened; GET /transactions/{transaction_id} tells which once it is settled";

/// The answer to a transaction's failure, naming the transaction. `precondition` says
/// whether the client sent `If-Match`: a business condition that failed is then a 412
/// (the resource is not at the version it named) instead of a 409.
pub fn transaction_problem(error: &TxnError, precondition: bool) -> Problem {
    use StatusCode as S;
    let problem = match error {
        TxnError::ControlSend { .. } => Problem::new(
            S::SERVICE_UNAVAILABLE,
            "control-queue-unavailable",
            "Service unavailable",
        )
        .with_detail(NOTHING_WRITTEN)
        .retryable(),
        TxnError::CommitWindowExpired { .. } => {
            Problem::new(S::SERVICE_UNAVAILABLE, "commit-window-expired", "Commit window expired")
                .with_detail("the request took too long and nothing was written; retry it")
                .retryable()
        }
        TxnError::DeadlineExceeded { .. } => Problem::new(S::SERVICE_UNAVAILABLE, "timeout", "Request timed out")
            .with_detail("the request ran out of time before its change was committed; nothing was written; retry it")
            .retryable(),
        // Under If-Match, the version that moved is the one the client named; a condition
        // of the application's own stays a conflict the application maps.
        TxnError::VersionConflict { .. } if precondition => {
            Problem::new(S::PRECONDITION_FAILED, "precondition-failed", "Precondition failed")
                .with_detail("the resource's version differs from If-Match; nothing was written")
        }
        TxnError::VersionConflict { .. } => Problem::new(S::CONFLICT, "version-conflict", "Conflict")
            .with_detail("the resource changed while the request ran; nothing was written"),
        TxnError::Refused { refusal, .. } => Problem::new(S::CONFLICT, "out-of-bounds", "Out of bounds")
            .with_detail(format!("{refusal}; nothing was written")),
        TxnError::NoSuchItem { .. } => {
            Problem::new(S::NOT_FOUND, "not-found", "Not found").with_detail("no such resource; nothing was written")
        }
        TxnError::ActionCancelled { .. } => Problem::new(S::CONFLICT, "conflict", "Conflict")
            .with_detail("the change conflicts with the resource's current state; nothing was written"),
        TxnError::TooLarge { reason, .. } => {
            Problem::new(S::PAYLOAD_TOO_LARGE, "transaction-too-large", "Transaction too large")
                .with_detail(reason.clone())
        }
        // A message no destination takes, often the request's own text carried into it
        // (a character queues refuse): the request cannot be carried out as it is.
        TxnError::Unsendable { source, .. } => {
            Problem::new(S::UNPROCESSABLE_ENTITY, "unsendable-message", "Unsendable message")
                .with_detail(format!("{source}; nothing was written"))
        }
        // Refused as malformed (an action's expression, two actions on one item): a bug
        // that retrying cannot fix, whose details stay in the log.
        TxnError::NotCommitted {
            source: CommitError::Invalid { .. } | CommitError::NativeUnsupported | CommitError::EntityUnsupported,
            ..
        } => Problem::new(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error")
            .with_detail("nothing was written"),
        // The handler's bug: its request's first transaction stands as it is.
        TxnError::SecondInRequest { .. } => Problem::new(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error")
            .with_detail("the handler began a second transaction, refused with nothing written; the request's transaction stands as it is, and GET /transactions/{id} tells whether it committed"),
        // The handler's bug: it committed a transaction it, or its request, had abandoned.
        TxnError::Abandoned { .. } => Problem::new(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error")
            .with_detail("nothing was written"),
        TxnError::Fenced { .. } => Problem::new(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
            .with_detail("the store did not confirm the change in time, so it was cancelled: nothing was written; retry the request")
            .retryable(),
        TxnError::Ambiguous { .. } => Problem::new(S::SERVICE_UNAVAILABLE, "outcome-unknown", "Outcome unknown")
            .with_detail(OUTCOME_UNKNOWN)
            .retryable(),
        other if other.is_definite() => Problem::new(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
            .with_detail(NOTHING_WRITTEN)
            .retryable(),
        _ => Problem::new(S::SERVICE_UNAVAILABLE, "outcome-unknown", "Outcome unknown")
            .with_detail(OUTCOME_UNKNOWN)
            .retryable(),
    };
    problem.naming(error.txn_id())
}

impl From<&TxnError> for Problem {
    fn from(error: &TxnError) -> Self {
        transaction_problem(error, false)
    }
}

impl IntoResponse for TxnError {
    fn into_response(self) -> Response {
        respond(&self, Problem::from(&self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::QueueError;
    use crate::time::Timestamp;

    fn txn() -> TxnId {
        TxnId::from_parts(Timestamp::from_millis(1_000), [7; 10])
    }

    #[test]
    fn every_transaction_failure_names_its_transaction_and_503s_ask_for_a_retry() {
        let txn_id = txn();
        let errors = [
            TxnError::ControlSend {
                txn_id,
                source: QueueError::Unavailable("down".into()),
            },
            TxnError::CommitWindowExpired { txn_id },
            TxnError::DeadlineExceeded { txn_id },
            TxnError::VersionConflict {
                txn_id,
                key: "ORDER#1".parse().unwrap(),
            },
            TxnError::ActionCancelled {
                txn_id,
                index: 0,
                code: "ConditionalCheckFailed".into(),
                item: None,
            },
            TxnError::TooLarge {
                txn_id,
                reason: "101 actions".into(),
            },
            TxnError::Unsendable {
                txn_id,
                source: crate::protocol::Unsendable::GroupId {
                    message: crate::protocol::MessageId::new(txn_id, 0),
                },
            },
            TxnError::Ambiguous {
                txn_id,
                source: CommitError::Ambiguous("timeout".into()),
            },
        ];
        let statuses: Vec<u16> = errors.iter().map(|e| Problem::from(e).status).collect();
        assert_eq!(statuses, [503, 503, 503, 409, 409, 413, 422, 503]);
        for error in &errors {
            let problem = Problem::from(error);
            assert_eq!(problem.transaction_id, Some(txn_id.to_string()), "{error}");
            assert_eq!(problem.retry_after.is_some(), problem.status == 503, "{error}");
        }
        assert_eq!(transaction_problem(&errors[3], true).status, 412);
        assert_eq!(
            transaction_problem(&errors[4], true).status,
            409,
            "the application's own condition is no If-Match"
        );
        let invalid = TxnError::NotCommitted {
            txn_id,
            source: CommitError::Invalid {
                reason: "Invalid UpdateExpression".into(),
            },
        };
        let problem = Problem::from(&invalid);
        assert_eq!((problem.status, problem.retry_after), (500, None));
        assert!(!problem.detail.unwrap().contains("UpdateExpression"), "no internals");
        let unknown = Problem::from(&errors[7]);
        assert_eq!(unknown.problem_type, "/problems/outcome-unknown");
        let unsendable = Problem::from(&errors[6]);
        assert_eq!(unsendable.problem_type, "/problems/unsendable-message");
        assert!(unsendable.detail.unwrap().ends_with("nothing was written"));
    }

    #[tokio::test]
    async fn a_problem_answers_as_problem_json_with_its_headers() {
        use http_body_util::BodyExt;
        let response = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
            .naming(txn())
            .retryable()
            .into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[TRANSACTION_ID_HEADER], txn().to_string().as_str());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["transaction_id"], txn().to_string());
        assert!(json.get("retry_after").is_none());
    }
}
