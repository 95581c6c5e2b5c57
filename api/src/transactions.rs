//! `GET /transactions/{id}`: what became of a transaction, for clients that got an
//! ambiguous 503 naming it.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use outbox::ports::ItemKey;
use outbox::protocol::TxnId;
use outbox::request::TxnStatus;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

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
    /// Not settled yet, forgotten after the retention, or (a change of one order) asked
    /// without its `item`.
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

/// Where to look for a transaction besides its own record.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// The item a change of one order committed into (the `x-transaction-item` header of
    /// its answer): after dispatch its proof lives there, not in a record of its own.
    #[param(schema_with = schema::transaction_item, required = false)]
    pub item: Option<String>,
}

/// What became of a transaction.
#[utoipa::path(get, path = "/transactions/{id}", tag = "transactions",
    params(("id" = inline(schema::TransactionId), Path, description = "A transaction id (UUID v7)"), StatusQuery),
    responses(
        (status = 200, description = "The status", body = TransactionStatus),
        (status = 400, description = "The path or the query cannot be read (not UTF-8)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a transaction id, or not an order's item", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The status cannot be read now, or the request timed out", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)))),
    ))]
pub async fn transactions_get(
    State(state): State<AppState>,
    // Any caller may ask: the id is unguessable, and the status tells nothing of what
    // the transaction changed.
    _caller: outbox::http::Caller,
    Path(id): Path<String>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Json<TransactionStatus>, ApiError> {
    let invalid = || ApiError::Validation(vec![FieldError::new("id", "must be a UUID v7")]);
    if !rules::TRANSACTION_ID.allows(&id) {
        return Err(invalid());
    }
    let txn_id: TxnId = id.parse().map_err(|_| invalid())?;
    let Query(query) = query.map_err(|rejection| ApiError::InvalidPath(rejection.body_text()))?;
    let item = match query.item {
        None => None,
        Some(item) if rules::TRANSACTION_ITEM.allows(&item) => Some(
            item.parse::<ItemKey>()
                .map_err(|_| ApiError::Validation(vec![FieldError::new("item", "must be an order's item")]))?,
        ),
        Some(_) => {
            return Err(ApiError::Validation(vec![FieldError::new(
                "item",
                "must be an order's item, `ORDER#` and its id",
            )]))
        }
    };
    let status = match &item {
        Some(item) => state.outbox.status_in(txn_id, item).await,
        None => state.outbox.status(txn_id).await,
    }
    .map_err(ApiError::Unavailable)?;
    Ok(Json(TransactionStatus {
        transaction_id: txn_id.to_string(),
        status: status.into(),
    }))
}
