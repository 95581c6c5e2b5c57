//! The API's one error type and its one mapping to RFC 9457 `application/problem+json`.
//!
//! Every handler error ends here, so every failure has the same shape. A 5xx body never
//! says more than its title: the cause is logged with the request id instead.

use axum::extract::rejection::PathRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox::request::TxnError;
use serde::Serialize;
use utoipa::ToSchema;

/// The header that carries a transaction id on answers that concern one.
pub const TRANSACTION_ID_HEADER: &str = "x-transaction-id";

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the problem type.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What happened this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The invalid fields, for validation problems.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The transaction concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::rules::schema::transaction_id)]
    pub transaction_id: Option<String>,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or not the JSON this route takes.
    #[error("malformed request body: {0}")]
    MalformedBody(String),
    /// The body is not `application/json`.
    #[error("unsupported media type")]
    UnsupportedMediaType,
    /// The body is larger than the limit.
    #[error("request body too large")]
    PayloadTooLarge,
    /// Fields are invalid.
    #[error("invalid fields")]
    Validation(Vec<FieldError>),
    /// The path's parameters cannot be read (not UTF-8 once percent-decoded).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// A header is invalid.
    #[error("invalid header {header}: {detail}")]
    InvalidHeader {
        /// Which header.
        header: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// No such resource or route.
    #[error("not found")]
    NotFound(String),
    /// The route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The state forbids the change (for example, changing a cancelled order).
    #[error("conflict: {0}")]
    Conflict(String),
    /// `If-Match` did not match, or the version moved while the request ran and the
    /// client asked for a precondition.
    #[error("precondition failed")]
    PreconditionFailed,
    /// The idempotency key was used for a different request.
    #[error("idempotency key reused for a different request")]
    IdempotencyKeyReused,
    /// The request path could not finish; see the transaction error.
    #[error(transparent)]
    Transaction(#[from] TxnError),
    /// A refusal decided after the request's transaction began: answered as `error`,
    /// naming the transaction (which never commits).
    #[error("{error} (transaction {txn_id})")]
    InTransaction {
        /// The transaction.
        txn_id: outbox::protocol::TxnId,
        /// The refusal.
        error: Box<ApiError>,
    },
    /// A read failed.
    #[error("the store is unavailable")]
    Unavailable(#[source] outbox::ports::StoreError),
    /// The handler overran the request's deadline and the deadline middleware answered
    /// for it, from how far its transaction got.
    #[error("the request timed out ({0:?})")]
    Timeout(crate::deadline::Progress),
    /// Anything else: reported as a bare 500.
    #[error("internal error: {0}")]
    Internal(String),
}

fn problem(status: StatusCode, kind: &str, title: &str) -> Problem {
    Problem {
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
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        // axum answers 500 for a route whose parameters do not fit the handler's type: a
        // bug here, not the client's.
        if rejection.status().is_server_error() {
            Self::Internal(rejection.body_text())
        } else {
            Self::InvalidPath(rejection.body_text())
        }
    }
}

impl ApiError {
    /// This error, decided after transaction `txn_id` began.
    pub fn in_transaction(self, txn_id: outbox::protocol::TxnId) -> Self {
        match self {
            Self::Transaction(_) | Self::InTransaction { .. } => self,
            error => Self::InTransaction {
                txn_id,
                error: Box::new(error),
            },
        }
    }

    /// Whether the client had asked for a precondition (`If-Match`): a lost version race
    /// is then 412 rather than 409.
    pub fn with_precondition(self, precondition: bool) -> Self {
        match self {
            Self::Transaction(TxnError::VersionConflict { .. }) if precondition => Self::PreconditionFailed,
            other => other,
        }
    }

    /// The problem document and whether to add `Retry-After`.
    pub fn problem(&self) -> (Problem, bool) {
        use StatusCode as S;
        let with_detail = |mut p: Problem, detail: String| {
            p.detail = Some(detail);
            p
        };

        match self {
            Self::MalformedBody(detail) => (
                with_detail(
                    problem(S::BAD_REQUEST, "malformed-body", "Malformed request body"),
                    detail.clone(),
                ),
                false,
            ),
            Self::UnsupportedMediaType => (
                with_detail(
                    problem(
                        S::UNSUPPORTED_MEDIA_TYPE,
                        "unsupported-media-type",
                        "Unsupported media type",
                    ),
                    "send application/json".into(),
                ),
                false,
            ),
            Self::PayloadTooLarge => (
                problem(S::PAYLOAD_TOO_LARGE, "payload-too-large", "Request body too large"),
                false,
            ),
            Self::Validation(errors) => {
                let mut p = problem(S::UNPROCESSABLE_ENTITY, "validation", "Invalid request");
                p.errors = errors.clone();
                (p, false)
            }
            Self::InvalidPath(detail) => (
                with_detail(problem(S::BAD_REQUEST, "invalid-path", "Invalid path"), detail.clone()),
                false,
            ),
            Self::InvalidHeader { header, detail } => (
                with_detail(
                    problem(S::BAD_REQUEST, "invalid-header", "Invalid header"),
                    format!("{header}: {detail}"),
                ),
                false,
            ),
            Self::NotFound(detail) => (
                with_detail(problem(S::NOT_FOUND, "not-found", "Not found"), detail.clone()),
                false,
            ),
            Self::MethodNotAllowed => (
                problem(S::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed"),
                false,
            ),
            Self::Conflict(detail) => (
                with_detail(problem(S::CONFLICT, "conflict", "Conflict"), detail.clone()),
                false,
            ),
            Self::PreconditionFailed => (
                with_detail(
                    problem(S::PRECONDITION_FAILED, "precondition-failed", "Precondition failed"),
                    "the resource's version differs from If-Match".into(),
                ),
                false,
            ),
            Self::IdempotencyKeyReused => (
                with_detail(
                    problem(
                        S::UNPROCESSABLE_ENTITY,
                        "idempotency-key-reused",
                        "Idempotency key reused",
                    ),
                    "this Idempotency-Key was used for a different request".into(),
                ),
                false,
            ),
            Self::Transaction(error) => Self::transaction_problem(error),
            Self::InTransaction { txn_id, error } => {
                let (mut problem, retry) = error.problem();
                problem.transaction_id.get_or_insert_with(|| txn_id.to_string());
                (problem, retry)
            }
            Self::Unavailable(_) => (
                problem(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
                true,
            ),
            Self::Timeout(progress) => (Self::timeout_problem(*progress), true),
            Self::Internal(_) => (
                problem(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error"),
                false,
            ),
        }
    }

    fn timeout_problem(progress: crate::deadline::Progress) -> Problem {
        use crate::deadline::Progress;
        let (kind, title, detail, txn) = match progress {
            Progress::NotBegun => ("timeout", "Request timed out", "nothing was written; retry the request", None),
            Progress::Begun(txn) => (
                "timeout",
                "Request timed out",
                "nothing was written, and this transaction can no longer commit; retry the request",
                Some(txn),
            ),
            Progress::Committing(txn) => (
                "outcome-unknown",
                "Outcome unknown",
                "the request ran out of time while its change was being committed; it may or may not have happened; GET /transactions/{transaction_id} tells which once it is settled",
                Some(txn),
            ),
        };
        let mut p = problem(StatusCode::SERVICE_UNAVAILABLE, kind, title);
        p.detail = Some(detail.to_owned());
        p.transaction_id = txn.map(|txn| txn.to_string());
        p
    }

    fn transaction_problem(error: &TxnError) -> (Problem, bool) {
        use StatusCode as S;
        let txn = error.txn_id();
        let with = |status, kind: &str, title: &str, detail: &str| {
            let mut p = problem(status, kind, title);
            p.detail = Some(detail.to_owned());
            p.transaction_id = Some(txn.to_string());
            p
        };
        match error {
            TxnError::ControlSend { .. } => (
                with(S::SERVICE_UNAVAILABLE, "control-queue-unavailable", "Service unavailable", "nothing was written; retry the request"),
                true,
            ),
            TxnError::CommitWindowExpired { .. } => (
                with(S::SERVICE_UNAVAILABLE, "commit-window-expired", "Commit window expired", "the request took too long and nothing was written; retry it"),
                true,
            ),
            TxnError::DeadlineExceeded { .. } => (
                with(S::SERVICE_UNAVAILABLE, "timeout", "Request timed out", "the request ran out of time before its change was committed; nothing was written; retry it"),
                true,
            ),
            // The orders API stages no native actions; a service that does maps its own.
            TxnError::ActionCancelled { .. } => (
                with(S::CONFLICT, "conflict", "Conflict", "the change conflicts with the resource's current state; nothing was written"),
                false,
            ),
            TxnError::VersionConflict { .. } => (
                with(S::CONFLICT, "version-conflict", "Conflict", "the resource changed while the request ran; nothing was written"),
                false,
            ),
            TxnError::TooLarge { reason, .. } => (with(S::PAYLOAD_TOO_LARGE, "transaction-too-large", "Transaction too large", reason), false),
            TxnError::Ambiguous { .. } => (
                with(
                    S::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    "Outcome unknown",
                    "the change may or may not have happened; GET /transactions/{transaction_id} tells which once it is settled",
                ),
                true,
            ),
            TxnError::Read { .. } | TxnError::NotCommitted { .. } | TxnError::IdempotencyKeyUsed { .. } => (
                with(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable", "nothing was written; retry the request"),
                true,
            ),
            // A kind of failure this API does not know yet: say only what the library
            // says of it, whether it is definite.
            other if other.is_definite() => (
                with(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable", "nothing was written; retry the request"),
                true,
            ),
            _ => (
                with(
                    S::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    "Outcome unknown",
                    "the change may or may not have happened; GET /transactions/{transaction_id} tells which once it is settled",
                ),
                true,
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (problem, retry) = self.problem();
        if problem.status >= 500 {
            tracing::error!(error = %self, source = ?std::error::Error::source(&self).map(ToString::to_string), "request failed");
        } else {
            tracing::info!(error = %self, "request refused");
        }
        let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, serde_json::to_string(&problem).unwrap_or_default()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if retry {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(crate::rules::RETRY_AFTER_SECONDS),
            );
        }
        if let Some(txn) = problem
            .transaction_id
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert(TRANSACTION_ID_HEADER, txn);
        }
        response
    }
}
