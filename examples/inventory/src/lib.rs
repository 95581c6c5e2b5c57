//! A worked service on the outbox, written as a team adopting it would: two endpoints
//! that change a product and emit an event ([`products`]), and a consumer that tallies
//! each reservation exactly once ([`ledger`]). `cargo run -p inventory` serves it with
//! no AWS (the embedded backend, the control worker and the ledger in the process); with
//! the `OUTBOX_*` settings of a deployment it serves on DynamoDB and SQS, locally or on
//! Lambda, where the same binary is the ledger's function too, its settings naming the
//! ledger (`OUTBOX_CONSUMER_NAME=ledger`).

pub mod ledger;
pub mod products;

use axum::{routing::post, Router};

/// The service's routes (`outbox::service` adds the status route, `GET /transactions/{id}`).
pub fn router() -> Router {
    Router::new()
        .route("/products", post(products::create))
        .route("/products/{id}/reservations", post(products::reserve))
}
