//! The OpenAPI 3.1 document, generated from the handlers' annotations and the types
//! they take and return, so that it cannot drift from the code. The input rules it states
//! come from [`crate::rules`], which the handlers check; request bodies are held to it by
//! [`crate::extract::JsonBody`] with the rules of [`crate::strict`].

use std::sync::OnceLock;

use axum::Json;
use utoipa::OpenApi;

use crate::error::{FieldError, Problem};
use crate::orders::handlers;
use crate::orders::model::{CreateOrder, LineItem, OrderStatus, OrderView};
use crate::transactions::{self, TransactionState, TransactionStatus};

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Orders on the control-message outbox",
        description = "State changes and their events, committed together."
    ),
    paths(
        handlers::orders_create,
        handlers::orders_get,
        handlers::orders_add_item,
        handlers::orders_remove_item,
        handlers::orders_cancel,
        transactions::transactions_get,
    ),
    components(schemas(
        CreateOrder,
        LineItem,
        OrderStatus,
        OrderView,
        TransactionStatus,
        TransactionState,
        Problem,
        FieldError
    ))
)]
pub struct ApiDoc;

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(ApiDoc::openapi)
}

/// `GET /openapi.json`.
pub async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(document())
}
