//! `POST /products/{sku}/reservations`: reserve units of a product. The shop reads the
//! product itself, decides, and stages two native actions (the counter's `ADD` under a
//! bound, the reservation's conditional put) and the `StockReserved` event; the outbox
//! commits them with its records in one `TransactWriteItems`. `GET /products/{sku}`
//! reads the stock.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use outbox::http::problem::respond;
use outbox::http::{Answer, Begun, FieldError, HttpError, Idempotent, Problem, RequestScope};
use outbox::protocol::Message;
use outbox::request::TxnError;
use serde::{Deserialize, Serialize};

use crate::catalog::{CatalogError, Product};
use crate::Shop;

/// The body of a reservation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reserve {
    /// The client's id for it: 1 to 64 characters from `A-Z a-z 0-9 - _`.
    pub reservation_id: String,
    /// 1 to 1000 units.
    pub quantity: u64,
}

/// A reservation as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Its id.
    pub reservation_id: String,
    /// The product.
    pub sku: String,
    /// Units reserved.
    pub quantity: u64,
}

/// Where the indexes of the native actions point, to read a cancellation.
const RESERVE_STOCK: usize = 0;
const NEW_RESERVATION: usize = 1;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// The outbox's glue failed (a transaction, a header, the deadline).
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The body is not the JSON this route takes.
    #[error("malformed body: {0}")]
    Malformed(String),
    /// A field breaks its rule.
    #[error("invalid field {}", .0.field)]
    Invalid(FieldError),
    /// No such product.
    #[error("no product {0}")]
    NotFound(String),
    /// Fewer units are available than asked for.
    #[error("only {available} available")]
    OutOfStock {
        /// How many are.
        available: u64,
    },
    /// The catalog could not be read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

impl From<TxnError> for ShopError {
    fn from(error: TxnError) -> Self {
        Self::Http(HttpError::Transaction(error))
    }
}

impl ShopError {
    /// The answer.
    pub fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            // The shop's own conditions, read from the action that failed.
            Self::Http(HttpError::Transaction(TxnError::ActionCancelled {
                txn_id,
                index,
                code,
                item,
            })) => {
                let condition_failed = code == "ConditionalCheckFailed";
                match (*index, condition_failed, item) {
                    // The product's ALL_OLD is absent: it was removed meanwhile.
                    (RESERVE_STOCK, true, None) => Problem::new(S::NOT_FOUND, "not-found", "Not found")
                        .with_detail("the product was removed meanwhile; nothing was written"),
                    (RESERVE_STOCK, true, Some(_)) => Problem::new(S::CONFLICT, "out-of-stock", "Out of stock")
                        .with_detail("the stock changed meanwhile; nothing was written"),
                    (NEW_RESERVATION, true, _) => Problem::new(S::CONFLICT, "reservation-exists", "Reservation exists")
                        .with_detail("a reservation with this id exists; nothing was written"),
                    _ => Problem::new(S::CONFLICT, "conflict", "Conflict").with_detail("nothing was written"),
                }
                .naming(*txn_id)
            }
            Self::Http(error) => error.problem(),
            Self::Malformed(detail) => {
                Problem::new(S::BAD_REQUEST, "malformed-body", "Malformed request body").with_detail(detail.clone())
            }
            Self::Invalid(error) => {
                let mut problem = Problem::new(S::UNPROCESSABLE_ENTITY, "validation", "Invalid request");
                problem.errors = vec![error.clone()];
                problem
            }
            Self::NotFound(sku) => {
                Problem::new(S::NOT_FOUND, "not-found", "Not found").with_detail(format!("no product {sku}"))
            }
            Self::OutOfStock { available } => Problem::new(S::CONFLICT, "out-of-stock", "Out of stock")
                .with_detail(format!("only {available} units are available; nothing was written")),
            Self::Catalog(_) => Problem::new(S::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
                .with_detail("nothing was written; retry the request")
                .retryable(),
        }
    }
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        respond(&self, self.problem())
    }
}

fn valid_id(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn valid_sku(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-')
}

fn parse(sku: &str, body: &[u8]) -> Result<Reserve, ShopError> {
    if !valid_sku(sku) {
        return Err(ShopError::Invalid(FieldError::new(
            "sku",
            "must be 1 to 32 characters from A-Z 0-9 -",
        )));
    }
    let request: Reserve = serde_json::from_slice(body).map_err(|error| ShopError::Malformed(error.to_string()))?;
    if !valid_id(&request.reservation_id) {
        return Err(ShopError::Invalid(FieldError::new(
            "reservation_id",
            "must be 1 to 64 characters from A-Z a-z 0-9 - _",
        )));
    }
    if !(1..=1000).contains(&request.quantity) {
        return Err(ShopError::Invalid(FieldError::new("quantity", "must be 1 to 1000")));
    }
    Ok(request)
}

/// Reserves units of a product; emits `StockReserved`.
pub async fn reserve(
    State(shop): State<Shop>,
    scope: RequestScope,
    sku: Result<Path<String>, PathRejection>,
    Idempotent { idempotency, body }: Idempotent<Bytes>,
) -> Result<Response, ShopError> {
    let Path(sku) = sku.map_err(|rejection| ShopError::Malformed(rejection.body_text()))?;
    let request = parse(&sku, &body)?;
    // Nothing of the transaction is sent until its commit: a refusal decided by the read
    // (no such product, not enough stock) costs the read alone, and names no transaction.
    let mut txn = match scope.begin_native(idempotency).await? {
        Begun::Replay(replay) => return Ok(replay),
        Begun::Started(txn) => txn,
    };
    let product: Product = shop
        .catalog
        .product(&sku)
        .await?
        .ok_or_else(|| ShopError::NotFound(sku.clone()))?;
    if request.quantity > product.available() {
        let available = product.available();
        return Err(ShopError::OutOfStock { available });
    }
    txn.action(shop.writes.reserve_stock(&sku, request.quantity, product.stock));
    txn.action(
        shop.writes
            .new_reservation(&request.reservation_id, &sku, request.quantity),
    );
    let reservation = Reservation {
        reservation_id: request.reservation_id.clone(),
        sku: sku.clone(),
        quantity: request.quantity,
    };
    let event = Message::json(
        shop.events.clone(),
        &serde_json::json!({"type": "StockReserved", "reservation": &reservation}),
    )
    .expect("events serialise")
    .with_attribute("event-type", "StockReserved");
    txn.emit(event);
    let answer = Answer::json(StatusCode::CREATED, &reservation).header(
        LOCATION,
        &format!("/products/{sku}/reservations/{}", reservation.reservation_id),
    );
    Ok(scope.commit(txn, answer).await?)
}

/// A product's stock, as `GET /products/{sku}` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    /// The product.
    pub sku: String,
    /// Units in stock.
    pub stock: u64,
    /// Units reserved.
    pub reserved: u64,
}

/// Reads a product's stock.
pub async fn product_get(
    State(shop): State<Shop>,
    sku: Result<Path<String>, PathRejection>,
) -> Result<Json<Stock>, ShopError> {
    let Path(sku) = sku.map_err(|rejection| ShopError::Malformed(rejection.body_text()))?;
    let product = shop
        .catalog
        .product(&sku)
        .await?
        .ok_or_else(|| ShopError::NotFound(sku.clone()))?;
    Ok(Json(Stock {
        sku: product.sku,
        stock: product.stock,
        reserved: product.reserved,
    }))
}
