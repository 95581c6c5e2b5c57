//! A ready route for what became of a transaction, for clients that were answered a 503
//! naming one: `GET /transactions/{id}` (with `?item=`, the `x-transaction-item` of the
//! answer, for a transaction begun on one item), answered `pending`, `dispatched`,
//! `tombstoned` or `unknown`. Every answer that names a transaction links it
//! ([`super::Deadlines::with_status_links`]): `Link: </transactions/{id}?item=…>;
//! rel="status"`, so that a client follows the link and never needs to know the item.
//! `outbox::service` serves the route and the links; by hand:
//!
//! ```
//! # fn wire(app: axum::Router, outbox: outbox::request::Outbox) -> axum::Router {
//! use outbox::http::{enforce_deadline, status, Authentication, Deadlines};
//! let deadlines = Deadlines::new(outbox, std::time::Duration::from_secs(10))
//!     .with_status_links(status::STATUS_PATH);
//! app.merge(status::routes())
//!     .route_layer(axum::middleware::from_fn_with_state(deadlines, enforce_deadline))
//!     // Who may ask (the route takes a `Caller`): here, without sign-in.
//!     .layer(axum::Extension(Authentication::Off))
//! # }
//! ```

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{FieldError, HttpError, RequestScope};
use crate::ports::ItemKey;
use crate::protocol::TxnId;

/// The route's path.
pub const STATUS_PATH: &str = "/transactions/{id}";

/// A transaction's status, as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TransactionStatus {
    /// The transaction.
    pub transaction_id: String,
    /// `pending` (committed, its messages on their way), `dispatched`, `tombstoned`
    /// (never committed, and never will), or `unknown` (not settled yet, or forgotten
    /// after the retention).
    pub status: String,
}

/// Where to look besides the transaction's own record.
#[derive(Debug, Deserialize)]
pub struct StatusQuery {
    /// The item a transaction begun on one item committed into (the answer's
    /// `x-transaction-item`): once dispatched, its proof lives there.
    pub item: Option<String>,
}

/// `GET /transactions/{id}[?item=...]`, for any caller the service accepts
/// ([`super::Caller`]): a transaction's id is not guessable (a UUID v7 whose 32 last
/// bits are random, besides its time and a counter, each guess a throttled request),
/// and its status says only how far the transaction got, nothing of what it changed.
pub async fn transaction_status(
    _caller: super::Caller,
    scope: RequestScope,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Json<TransactionStatus>, HttpError> {
    let invalid = |field: &str, rule: &str| HttpError::Validation(vec![FieldError::new(field, rule)]);
    let Path(id) = id.map_err(|_| invalid("id", "must be a transaction id (a UUID v7)"))?;
    let txn_id: TxnId = id
        .parse()
        .map_err(|_| invalid("id", "must be a transaction id (a UUID v7)"))?;
    let Query(query) = query.map_err(|_| invalid("item", "must be an item key"))?;
    let item = match query.item {
        None => None,
        Some(item) => Some(
            item.parse::<ItemKey>()
                .map_err(|_| invalid("item", "must be an item key (the answer's x-transaction-item)"))?,
        ),
    };
    let outbox = scope.outbox();
    let status = match &item {
        Some(item) => outbox.status_in(txn_id, item).await,
        None => outbox.status(txn_id).await,
    }
    .map_err(HttpError::Unavailable)?;
    Ok(Json(TransactionStatus {
        transaction_id: txn_id.to_string(),
        status: status.as_str().to_owned(),
    }))
}

/// The status route alone, to merge into a service's router (its state is the
/// service's: the route reads through the request's [`RequestScope`]).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route(STATUS_PATH, get(transaction_status))
}
