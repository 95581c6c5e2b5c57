//! What the HTTP glue fails with, and its answer.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::problem::{respond, transaction_problem, FieldError, Problem, OUTCOME_UNKNOWN};
use super::progress::Progress;
use crate::ports::StoreError;
use crate::request::TxnError;

/// Why the glue could not answer a request as asked. Answered as problem+json; a service
/// with its own error type converts from it and keeps [`HttpError::problem`] as the
/// answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The transaction failed, or its outcome is unknown.
    #[error(transparent)]
    Transaction(#[from] TxnError),
    /// The transaction failed, and the client had sent `If-Match`: a failed business
    /// condition is answered 412 instead of 409.
    #[error("{0} (under If-Match)")]
    Precondition(#[source] TxnError),
    /// A header is malformed (400).
    #[error("invalid header {header}: {detail}")]
    InvalidHeader {
        /// Which header.
        header: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The request carries no verified caller, and the service requires one (401,
    /// [`super::caller::Authentication::Jwt`]).
    #[error("no verified caller")]
    Unauthenticated,
    /// The caller was not granted the scope the route needs (403,
    /// [`super::authorization::RequireScope`]).
    #[error("the caller lacks scope {scope}")]
    InsufficientScope {
        /// The scope the route needs.
        scope: String,
    },
    /// The caller's front door authorized a route (IAM) that is not the one served, or
    /// none (a catch-all or greedy route, a function URL): 403.
    #[error("the front door authorized {authorized:?}, not the route served")]
    RouteNotAuthorized {
        /// The route the front door authorized, as it named it.
        authorized: Option<String>,
    },
    /// The request's path is one the front door and the service could read as two
    /// different routes: dot segments, encoded slashes (400, [`super::paths`]).
    #[error("ambiguous path: {detail}")]
    AmbiguousPath {
        /// What is ambiguous in it.
        detail: &'static str,
    },
    /// The idempotency key was used for a different request (422).
    #[error("idempotency key reused for a different request")]
    IdempotencyKeyReused,
    /// A read of the table failed: the stored answer of an idempotency key, or any read a
    /// handler makes before it decides (`scope.outbox().store()`, a transaction's `get`
    /// maps its own failure through [`HttpError::Transaction`]). A 503 saying that nothing
    /// was written and the request may be retried.
    #[error("a read of the table failed")]
    Unavailable(#[source] StoreError),
    /// The handler overran the request's deadline and the deadline middleware answered
    /// for it, from how far its transaction got (503).
    #[error("the request timed out ({0:?})")]
    Timeout(Progress),
    /// The service is built wrong (a handler takes a [`super::RequestScope`] without the
    /// deadline middleware, say): a 500, the problem logged, never answered.
    #[error("misconfigured: {problem}")]
    Misconfigured {
        /// What is wrong.
        problem: &'static str,
    },
    /// The body is not JSON (`Content-Type` `application/json` or `application/*+json`):
    /// 415.
    #[error("unsupported media type")]
    UnsupportedMediaType,
    /// The body is JSON but not the shape or types the route takes: 422, naming each
    /// field that failed.
    #[error("invalid fields")]
    Validation(Vec<FieldError>),
    /// The request's body could not be read (400), or is over the body limit (413).
    #[error("the body could not be read: {detail}")]
    Body {
        /// 400 or 413.
        status: StatusCode,
        /// Why.
        detail: String,
    },
    /// An event the handler made could not be made (a destination name that breaks the
    /// rule, a body that is not JSON): a bug of the service's; a 500 whose cause is
    /// logged.
    #[error("an event could not be made")]
    Event(#[from] crate::protocol::EventError),
    /// The service refused the request by its own rules (not found, out of stock):
    /// answered with its problem. After a transaction began, wrap it with
    /// [`HttpError::in_transaction`] so that the answer names it.
    #[error("refused: {}", .0.title)]
    Refused(Box<Problem>),
    /// `error`, met after transaction `txn_id` began: answered naming it.
    #[error("in transaction {txn_id}")]
    InTransaction {
        /// The transaction.
        txn_id: crate::protocol::TxnId,
        /// What failed.
        #[source]
        error: Box<HttpError>,
    },
}

impl From<Problem> for HttpError {
    fn from(problem: Problem) -> Self {
        Self::Refused(Box::new(problem))
    }
}

impl HttpError {
    /// A body that could not be buffered: over the body limit (413), or unreadable (400).
    pub fn unreadable_body(rejection: &axum::extract::rejection::BytesRejection) -> Self {
        use axum::extract::rejection::BytesRejection;
        let status = match rejection {
            BytesRejection::FailedToBufferBody(failed) if failed.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            _ => StatusCode::BAD_REQUEST,
        };
        Self::Body {
            status,
            detail: rejection.body_text(),
        }
    }

    /// This error, met after transaction `txn_id` began.
    pub fn in_transaction(self, txn_id: crate::protocol::TxnId) -> Self {
        Self::InTransaction {
            txn_id,
            error: Box::new(self),
        }
    }

    /// This error, or the service's own refusal `refuse(field, value)` when it is a
    /// bound an addition met in the commit ([`crate::counter::Refusal::OutOfBounds`]: the
    /// field holds `value`, and the addition would take it out of its bounds): out of
    /// stock, no seat left, rather than the generic 409 `out-of-bounds` (under `If-Match`
    /// too). Nothing was written; the answer still names the transaction.
    ///
    /// ```
    /// # use outbox::http::{HttpError, Problem};
    /// fn out_of_stock(left: i64) -> HttpError {
    ///     Problem::conflict("out-of-stock", "Out of stock").with_detail(format!("{left} left")).into()
    /// }
    /// # async fn step() -> Result<axum::response::Response, HttpError> { Err(HttpError::Unauthenticated) }
    /// # async fn handler() -> Result<axum::response::Response, HttpError> {
    /// step().await.map_err(|error| error.out_of_bounds_as(|_field, left| out_of_stock(left)))
    /// # }
    /// ```
    pub fn out_of_bounds_as(self, refuse: impl FnOnce(&str, i64) -> HttpError) -> Self {
        match self {
            Self::Transaction(TxnError::Refused {
                txn_id,
                refusal: crate::counter::Refusal::OutOfBounds { field, value },
            })
            | Self::Precondition(TxnError::Refused {
                txn_id,
                refusal: crate::counter::Refusal::OutOfBounds { field, value },
            }) => refuse(&field, value).in_transaction(txn_id),
            Self::InTransaction { txn_id, error } => error.out_of_bounds_as(refuse).in_transaction(txn_id),
            other => other,
        }
    }

    /// The answer.
    pub fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            Self::Transaction(error) => transaction_problem(error, false),
            Self::Precondition(error) => transaction_problem(error, true),
            Self::InvalidHeader { header, detail } => Problem::new(S::BAD_REQUEST, "invalid-header", "Invalid header")
                .with_detail(format!("{header}: {detail}")),
            Self::Unauthenticated => Problem::new(S::UNAUTHORIZED, "unauthenticated", "Unauthenticated")
                .with_detail("this request carries no verified token; sign in and send it as Authorization: Bearer"),
            Self::InsufficientScope { scope } => Problem::new(S::FORBIDDEN, "insufficient-scope", "Insufficient scope")
                .with_detail(format!(
                    "this route needs the scope {scope}, which the caller was not granted"
                )),
            Self::RouteNotAuthorized { authorized } => {
                let authorized = authorized
                    .as_deref()
                    .map_or_else(|| "no route".to_owned(), |route| format!("the route {route}"));
                Problem::new(S::FORBIDDEN, "route-not-authorized", "Route not authorized").with_detail(format!(
                    "the front door authorized {authorized} for this caller, not the one served; authorize each route of the API itself"
                ))
            }
            Self::AmbiguousPath { detail } => Problem::new(S::BAD_REQUEST, "ambiguous-path", "Ambiguous path")
                .with_detail(format!("{detail}; send the path as it is routed, without them")),
            Self::IdempotencyKeyReused => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency key reused",
            )
            .with_detail("this Idempotency-Key was used for a different request"),
            Self::Unavailable(_) => Problem::new(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
                .with_detail("nothing was written; retry the request")
                .retryable(),
            Self::Timeout(progress) => timeout_problem(*progress),
            Self::Misconfigured { .. } | Self::Event(_) => {
                Problem::new(S::INTERNAL_SERVER_ERROR, "about:blank", "Internal Server Error")
            }
            Self::UnsupportedMediaType => Problem::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            )
            .with_detail("send application/json"),
            Self::Validation(errors) => {
                let mut problem = Problem::new(S::UNPROCESSABLE_ENTITY, "validation", "Invalid request");
                problem.errors = errors.clone();
                problem
            }
            Self::Body { status, detail } if *status == S::PAYLOAD_TOO_LARGE => {
                Problem::new(S::PAYLOAD_TOO_LARGE, "payload-too-large", "Request body too large")
                    .with_detail(detail.clone())
            }
            Self::Body { detail, .. } => {
                Problem::new(S::BAD_REQUEST, "malformed-body", "Malformed request body").with_detail(detail.clone())
            }
            Self::Refused(problem) => (**problem).clone(),
            Self::InTransaction { txn_id, error } => error.problem().naming(*txn_id),
        }
    }
}

/// The answer the deadline middleware gives for a handler that overran, by how far its
/// transaction got: a plain timeout before it began; a timeout naming it (nothing
/// written, it can no longer commit) once it began; "outcome unknown" naming it once its
/// commit was tried.
pub fn timeout_problem(progress: Progress) -> Problem {
    let problem = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", "Request timed out").retryable();
    match progress {
        Progress::NotBegun => problem.with_detail("nothing was written; retry the request"),
        Progress::Begun(txn) => problem
            .with_detail("nothing was written, and this transaction can no longer commit; retry the request")
            .naming(txn),
        Progress::Committing(txn) => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown", "Outcome unknown")
                .with_detail(format!(
                    "the request ran out of time while its change was being committed; {OUTCOME_UNKNOWN}"
                ))
                .retryable()
                .naming(txn)
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = respond(&self, self.problem());
        let challenge = match &self {
            Self::Unauthenticated => Some(axum::http::HeaderValue::from_static("Bearer")),
            // RFC 6750, section 3.1: the scope the request lacked.
            Self::InsufficientScope { scope } => {
                axum::http::HeaderValue::from_str(&format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\""))
                    .ok()
            }
            _ => None,
        };
        if let Some(challenge) = challenge {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::CommitError;
    use crate::protocol::TxnId;
    use crate::test_log::Logged;

    /// A bound an addition met in the commit is the service's own refusal, with or
    /// without `If-Match`, naming the transaction; any other error, a refusal that is not
    /// a bound among them, is left as it was.
    #[test]
    fn a_bound_met_in_the_commit_is_answered_as_the_service_says_naming_its_transaction() {
        let txn_id = TxnId::new_v7();
        let refused = |refusal| TxnError::Refused { txn_id, refusal };
        let bound = || crate::counter::Refusal::OutOfBounds {
            field: "stock".into(),
            value: 2,
        };
        let sold_out = |field: &str, left: i64| -> HttpError {
            Problem::conflict("out-of-stock", "Out of stock")
                .with_detail(format!("{field}: {left} left"))
                .into()
        };
        for error in [
            HttpError::Transaction(refused(bound())),
            HttpError::Precondition(refused(bound())),
        ] {
            let problem = error.out_of_bounds_as(sold_out).problem();
            assert_eq!(problem.problem_type, "/problems/out-of-stock");
            assert_eq!(problem.detail.as_deref(), Some("stock: 2 left"));
            assert_eq!(problem.transaction_id, Some(txn_id.to_string()));
        }
        let not_a_number =
            HttpError::Transaction(refused(crate::counter::Refusal::NotANumber { field: "stock".into() }));
        assert_eq!(
            not_a_number.out_of_bounds_as(sold_out).problem().problem_type,
            "/problems/out-of-bounds"
        );
        let other = HttpError::Unauthenticated.out_of_bounds_as(sold_out);
        assert!(matches!(other, HttpError::Unauthenticated));
    }

    fn logged_while(answer: impl FnOnce()) -> String {
        let logged = Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        crate::test_log::keep_callsites_interested();
        tracing::subscriber::with_default(subscriber, answer);
        logged.text()
    }

    #[test]
    fn a_5xx_logs_its_whole_chain_of_causes_once() {
        let txn_id = TxnId::new_v7();
        let error = HttpError::Transaction(TxnError::NotCommitted {
            txn_id,
            source: CommitError::Unavailable("connection refused by the endpoint".into()),
        })
        .in_transaction(txn_id);
        let log = logged_while(|| {
            let response = error.into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        });
        for level in [
            format!("in transaction {txn_id}"),
            "the store did not take the commit".to_owned(),
            "the store is unavailable".to_owned(),
            "connection refused by the endpoint".to_owned(),
        ] {
            assert!(log.contains(&level), "{level:?} missing from the log: {log}");
        }
        assert_eq!(log.lines().count(), 1, "logged once: {log}");
    }

    #[test]
    fn a_refusal_is_logged_as_information_in_one_line_with_its_reason() {
        let txn_id = TxnId::new_v7();
        let refusal = HttpError::Transaction(TxnError::VersionConflict {
            txn_id,
            key: "ORDER#1".parse().unwrap(),
        })
        .in_transaction(txn_id);
        let log = logged_while(|| {
            let response = refusal.into_response();
            assert_eq!(response.status(), StatusCode::CONFLICT);
        });
        assert!(log.contains("INFO") && log.contains("request refused"), "{log}");
        assert!(
            log.contains(&format!("in transaction {txn_id}")) && log.contains("item ORDER#1 changed concurrently"),
            "the reason, not only the transaction: {log}"
        );
        assert_eq!(log.lines().count(), 1, "{log}");
    }
}
