//! `GET /transactions/{id}`: what became of a transaction, for clients that got an
//! ambiguous 503 naming it.

use axum::extract::State;
use axum::Json;
use outbox::protocol::TxnId;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, FieldError, Problem};
use crate::extract::Path;
use crate::state::AppState;

/// A transaction's status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TransactionStatus {
    /// The transaction.
    pub transaction_id: String,
    /// `pending` (committed, publishing), `dispatched` (committed and published),
    /// `tombstoned` (never committed, never will) or `unknown` (not settled yet, or
    /// forgotten after the retention).
    #[schema(example = "dispatched")]
    pub status: String,
}

/// What became of a transaction.
#[utoipa::path(get, path = "/transactions/{id}", tag = "transactions", params(("id" = String, Path, description = "A transaction id (UUID v7)")),
    responses(
        (status = 200, description = "The status", body = TransactionStatus),
        (status = 422, description = "Not a transaction id", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn transactions_get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TransactionStatus>, ApiError> {
    let txn_id: TxnId = id
        .parse()
        .map_err(|_| ApiError::Validation(vec![FieldError::new("id", "must be a UUID v7")]))?;
    let status = state.outbox.status(txn_id).await.map_err(ApiError::Unavailable)?;
    Ok(Json(TransactionStatus {
        transaction_id: txn_id.to_string(),
        status: status.as_str().to_owned(),
    }))
}
