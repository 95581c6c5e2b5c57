//! `POST /products` adds a product with its stock and emits `ProductAdded`;
//! `POST /products/{id}/reservations` takes units off its stock and emits
//! `StockReserved`. Each reads, decides and stages; a reservation adds to the stock as a
//! counter under a bound, so reservations of one product never conflict, and a
//! concurrent change met by an add (a create of the same product) makes the step run
//! again rather than answer 409. A refusal decided by the read (the product exists, is
//! missing, or is out of stock) costs the read alone: the transaction's control message
//! goes out with its commit, so nothing of it was sent, and the answer names no
//! transaction.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use outbox::counter::{Add, Refusal};
use outbox::http::{Answer, FieldError, HttpError, Idempotent, JsonBody, Problem, RequestScope};
use outbox::ports::{ExpectedVersion, ItemKey};
use outbox::protocol::Message;
use outbox::request::TxnError;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The body of `POST /products`.
#[derive(Debug, Deserialize)]
pub struct NewProduct {
    /// Its id: letters, digits, `-` and `_`.
    pub product_id: String,
    /// Units in stock.
    pub stock: u64,
}

/// The body of `POST /products/{id}/reservations`.
#[derive(Debug, Deserialize)]
pub struct NewReservation {
    /// Units to reserve, at least 1.
    pub quantity: u64,
}

/// A product as stored and answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Product {
    /// Its id.
    pub product_id: String,
    /// Units left.
    pub stock: u64,
}

/// The item of product `id`.
pub fn product_key(id: &str) -> Result<ItemKey, HttpError> {
    let valid =
        !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let invalid = || HttpError::Validation(vec![FieldError::new("product_id", "1 to 64 of A-Z a-z 0-9 - _")]);
    match valid {
        true => format!("PRODUCT#{id}").parse().map_err(|_| invalid()),
        false => Err(invalid()),
    }
}

fn event(body: serde_json::Value) -> Message {
    let kind = body["type"].as_str().unwrap_or_default().to_owned();
    let destination = "events".parse().expect("a valid destination name");
    Message::json(destination, &body)
        .expect("JSON")
        .with_event("com.example.inventory", &kind)
}

fn refusal(status: StatusCode, kind: &str, title: &str, detail: &str) -> HttpError {
    Problem::new(status, kind, title).with_detail(detail).into()
}

/// `POST /products`.
pub async fn create(
    scope: RequestScope,
    Idempotent { idempotency, body }: Idempotent<JsonBody<NewProduct>>,
) -> Result<Response, HttpError> {
    let product = Product {
        product_id: body.value.product_id,
        stock: body.value.stock,
    };
    let (key, product) = (&product_key(&product.product_id)?, &product);
    scope
        .retry_conflicts(None, idempotency, |mut txn| async move {
            if txn.get(key).await?.is_some() {
                let exists = refusal(
                    StatusCode::CONFLICT,
                    "product-exists",
                    "Product exists",
                    "nothing was written",
                );
                return Err(exists);
            }
            txn.put(key.clone(), json!(product), ExpectedVersion::Absent);
            txn.emit(event(
                json!({"type": "ProductAdded", "product_id": product.product_id, "stock": product.stock}),
            ));
            Ok((txn, Answer::json(StatusCode::CREATED, product)))
        })
        .await
}

/// `POST /products/{id}/reservations`: the stock is a counter under a bound, so the
/// reservation adds to it ([`outbox::request::Transaction::add`]) rather than writing the
/// product it read: reservations of one product never conflict, and their events keep
/// their place in its history. The read first lets a sold-out product refuse for the read
/// alone; a reservation that passes it may still meet the bound in the write (the last
/// units went meanwhile), and is then refused as out of stock, naming its transaction.
pub async fn reserve(
    scope: RequestScope,
    Path(id): Path<String>,
    Idempotent { idempotency, body }: Idempotent<JsonBody<NewReservation>>,
) -> Result<Response, HttpError> {
    let (key, quantity) = (&product_key(&id)?, body.value.quantity);
    let Some(amount) = i64::try_from(quantity).ok().filter(|amount| *amount > 0) else {
        return Err(HttpError::Validation(vec![FieldError::new("quantity", "at least 1")]));
    };
    scope
        .retry_conflicts(Some(key.clone()), idempotency, |mut txn| async move {
            let txn_id = txn.id();
            let Some(item) = txn.get(key).await? else {
                return Err(not_found());
            };
            let product: Product = serde_json::from_value(item.data)
                .map_err(|_| HttpError::Misconfigured { problem: "a stored product cannot be read" })?;
            if product.stock < quantity {
                return Err(out_of_stock(product.stock));
            }
            txn.add(Add::take("stock", amount));
            let reserved = json!({"type": "StockReserved", "reservation_id": txn_id.to_string(), "product_id": product.product_id, "quantity": quantity});
            txn.emit(event(reserved.clone()));
            Ok((txn, Answer::json(StatusCode::CREATED, &reserved)))
        })
        .await
        .map_err(|error| match error {
            // The bound, met in the write: the units went since the read. The answer
            // names the transaction (the middleware adds it).
            HttpError::Transaction(TxnError::Refused {
                refusal: Refusal::OutOfBounds { value, .. },
                ..
            }) => out_of_stock(value.max(0).unsigned_abs()),
            HttpError::Transaction(TxnError::NoSuchItem { .. }) => not_found(),
            other => other,
        })
}

fn not_found() -> HttpError {
    refusal(StatusCode::NOT_FOUND, "not-found", "Not found", "no such product")
}

fn out_of_stock(left: u64) -> HttpError {
    let detail = format!("{left} left; nothing was written");
    refusal(StatusCode::CONFLICT, "out-of-stock", "Out of stock", &detail)
}
