//! The second worked example: stock reservations on a table the shop made before it
//! adopted the outbox, a single-table design (`PK` + `SK`, a GSI, TTL on `ttl`), with
//! the shop's own native DynamoDB actions (an `Update ... ADD` counter under a bound, a
//! conditional `Put`) committed with the outbox's records, and its events dispatched by
//! the unchanged control worker.
//!
//! Where the orders API (`api/`) shows the portable form, this shows what a team with its
//! own schema writes: [`catalog`] is the shop's own code (its keys, its reads, its
//! writes); [`reservations`] is a handler whose outbox glue is a dozen lines of
//! [`outbox::http`]. The outbox's records share the table: `OUTBOX_TABLE_NAME` is the
//! shop's table, `OUTBOX_PARTITION_KEY=PK`, `OUTBOX_SORT_KEY=SK`, `OUTBOX_TTL_ATTRIBUTE=ttl`.

pub mod catalog;
pub mod reservations;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use outbox::http::{enforce_deadline, Deadlines};
use outbox::native::NativeOutbox;
use outbox::protocol::DestinationName;

use catalog::{Catalog, DynamoCatalog};

/// What the handlers share.
#[derive(Clone)]
pub struct Shop {
    /// The request path, with native actions.
    pub outbox: NativeOutbox,
    /// The shop's reads.
    pub catalog: Arc<dyn Catalog>,
    /// The shop's writes (native actions on its table).
    pub writes: DynamoCatalog,
    /// Where `StockReserved` goes.
    pub events: DestinationName,
}

/// The shop's routes, each request under a deadline of `timeout` (or the Lambda
/// invocation's, if sooner).
pub fn router(shop: Shop, timeout: Duration) -> Router {
    let deadlines = Deadlines::new(shop.outbox.outbox().clone(), timeout);
    Router::new()
        .route("/products/{sku}", get(reservations::product_get))
        .route("/products/{sku}/reservations", post(reservations::reserve))
        .route_layer(axum::middleware::from_fn_with_state(deadlines, enforce_deadline))
        .with_state(shop)
}
