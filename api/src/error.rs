//! The API's one error type and its one mapping to RFC 9457 `application/problem+json`.
//!
//! Every handler error ends here, so every failure has the same shape. The outbox's own
//! failures (a transaction's, a header's, a deadline's) are answered as the library's
//! [`outbox::http`] glue answers them; this adds the API's own (bodies, paths, the order
//! domain). A 5xx body never says more than its title and whether anything was written:
//! the cause is logged with the request id instead.

use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox::http::HttpError;
use outbox::request::TxnError;

pub use outbox::http::{FieldError, Problem, TRANSACTION_ID_HEADER};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Fields are invalid. (A body that is not JSON, not `application/json` or too large
    /// is the library's [`HttpError`], answered as it answers it.)
    #[error("invalid fields")]
    Validation(Vec<FieldError>),
    /// The path's parameters cannot be read (not UTF-8 once percent-decoded).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// No such resource or route.
    #[error("not found")]
    NotFound(String),
    /// The route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The state forbids the change (for example, changing a cancelled order).
    #[error("conflict: {0}")]
    Conflict(String),
    /// `If-Match` did not match the version read.
    #[error("precondition failed")]
    PreconditionFailed,
    /// The outbox's glue failed: a transaction, a header, an idempotency key, the deadline.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A refusal decided after the request's transaction began: answered as `error`,
    /// naming the transaction (which never commits).
    #[error("in transaction {txn_id}")]
    InTransaction {
        /// The transaction.
        txn_id: outbox::protocol::TxnId,
        /// The refusal.
        #[source]
        error: Box<ApiError>,
    },
    /// A read failed.
    #[error("the store is unavailable")]
    Unavailable(#[source] outbox::ports::StoreError),
    /// Anything else: reported as a bare 500.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<TxnError> for ApiError {
    fn from(error: TxnError) -> Self {
        Self::Http(HttpError::Transaction(error))
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
            Self::Http(HttpError::Transaction(_) | HttpError::Precondition(_) | HttpError::InTransaction { .. })
            | Self::InTransaction { .. } => self,
            error => Self::InTransaction {
                txn_id,
                error: Box::new(error),
            },
        }
    }

    /// The problem document.
    pub fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            Self::Validation(errors) => {
                let mut problem = Problem::new(S::UNPROCESSABLE_ENTITY, "validation", "Invalid request");
                problem.errors = errors.clone();
                problem
            }
            Self::InvalidPath(detail) => {
                Problem::new(S::BAD_REQUEST, "invalid-path", "Invalid path").with_detail(detail.clone())
            }
            Self::NotFound(detail) => Problem::new(S::NOT_FOUND, "not-found", "Not found").with_detail(detail.clone()),
            Self::MethodNotAllowed => Problem::new(S::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed"),
            Self::Conflict(detail) => Problem::new(S::CONFLICT, "conflict", "Conflict").with_detail(detail.clone()),
            Self::PreconditionFailed => {
                Problem::new(S::PRECONDITION_FAILED, "precondition-failed", "Precondition failed")
                    .with_detail("the resource's version differs from If-Match")
            }
            Self::Http(error) => error.problem(),
            Self::InTransaction { txn_id, error } => error.problem().naming(*txn_id),
            Self::Unavailable(_) => {
                Problem::new(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable").retryable()
            }
            Self::Internal(_) => Problem::new(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        outbox::http::problem::respond(&self, self.problem())
    }
}
