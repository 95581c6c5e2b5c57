//! `GET /transactions/{id}`: what became of a transaction, for clients that got an
//! ambiguous 503 naming it.

use axum::extract::State;
use axum::Json;
use outbox::protocol::TxnId;
use outbox::request::TxnStatus;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, FieldError, Problem};
use crate::extract::Path;
use crate::rules::{self, schema};
use crate::state::AppState;

/// A transaction's status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TransactionStatus {
    /// The transaction.
    #[schema(schema_with = schema::transaction_id)]
    pub transaction_id: String,
    /// Where it stands.
    pub status: TransactionState,
}

/// Where a transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransactionState {
    /// Committed; its messages are being published.
    Pending,
    /// Committed and published.
    Dispatched,
    /// Never committed, and never will.
    Tombstoned,
    /// Not settled yet, or forgotten after the retention.
    Unknown,
}

impl From<TxnStatus> for TransactionState {
    fn from(status: TxnStatus) -> Self {
        match status {
            TxnStatus::Pending => Self::Pending,
            TxnStatus::Dispatched => Self::Dispatched,
            TxnStatus::Tombstoned => Self::Tombstoned,
            TxnStatus::Unknown => Self::Unknown,
        }
    }
}

/// What became of a transaction.
#[utoipa::path(get, path = "/transactions/{id}", tag = "transactions",
    params(("id" = inline(schema::TransactionId), Path, description = "A transaction id (UUID v7)")),
    responses(
        (status = 200, description = "The status", body = TransactionStatus),
        (status = 400, description = "The path cannot be read (not UTF-8)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a transaction id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The status cannot be read now, or the request timed out", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)))),
    ))]
pub async fn transactions_get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TransactionStatus>, ApiError> {
    let invalid = || ApiError::Validation(vec![FieldError::new("id", "must be a UUID v7")]);
    if !rules::TRANSACTION_ID.allows(&id) {
        return Err(invalid());
    }
    let txn_id: TxnId = id.parse().map_err(|_| invalid())?;
    let status = state.outbox.status(txn_id).await.map_err(ApiError::Unavailable)?;
    Ok(Json(TransactionStatus {
        transaction_id: txn_id.to_string(),
        status: status.into(),
    }))
}
