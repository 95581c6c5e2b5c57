//! `POST /products` adds a product with its stock and emits `ProductAdded`;
//! `POST /products/{id}/reservations` takes units off its stock and emits
//! `StockReserved`. Each step runs on the product's item alone (entity mode: its outbox
//! inside the item, one conditional write, or one transaction with an
//! `Idempotency-Key`'s record), reads, decides and stages. A reservation
//! adds to the stock as a counter under a bound, so reservations of one product never
//! conflict. A refusal decided by the read (the product exists, is missing, or is out of
//! stock) costs the read alone: the transaction's control message goes out with its
//! commit, so nothing of it was sent, and the answer names no transaction.

use outbox::prelude::*;

/// The inventory's events' source on an EventBridge bus.
const SOURCE: &str = "com.example.inventory";

/// A product as stored and answered, and the body of `POST /products`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Product {
    /// Its id: 1 to 64 letters, digits, `-` or `_`.
    pub product_id: String,
    /// Units in stock.
    pub stock: u64,
}

/// The body of `POST /products/{id}/reservations`.
#[derive(Debug, Clone, Deserialize)]
pub struct Reservation {
    /// Units to reserve, at least 1.
    pub quantity: std::num::NonZeroU32,
}

/// `POST /products`.
pub async fn create(command: Command<Product>) -> Result<Response, HttpError> {
    let key = key_for("PRODUCT", "product_id", &command.body.product_id)?;
    command
        .run_on(key, |mut txn, key, product| async move {
            if txn.get(&key).await?.is_some() {
                return Err(Problem::conflict("product-exists", "Product exists").into());
            }
            txn.put(key, json!(product), ExpectedVersion::Absent);
            let added = json!({"type": "ProductAdded", "product_id": product.product_id, "stock": product.stock});
            txn.emit(Message::event("events", SOURCE, &added)?);
            Ok((txn, Answer::json(StatusCode::CREATED, &product)))
        })
        .await
}

/// `POST /products/{id}/reservations`: the stock is a counter under a bound, so the
/// reservation adds to it ([`outbox::request::Transaction::add`]) rather than writing the
/// product it read: reservations of one product never conflict, and their events keep
/// their place in its history. The read first lets a sold-out product refuse for the read
/// alone; a reservation that passes it may still meet the bound in the write (the last
/// units went meanwhile), and is then refused as out of stock, naming its transaction.
pub async fn reserve(Path(id): Path<String>, command: Command<Reservation>) -> Result<Response, HttpError> {
    let key = key_for("PRODUCT", "product_id", &id)?;
    let quantity = i64::from(command.body.quantity.get());
    command
        .run_on(key, |mut txn, key, _| async move {
            let Some(item) = txn.get(&key).await? else {
                return Err(Problem::not_found("not-found", "Not found").with_detail("no such product").into());
            };
            let stock = item.data["stock"].as_i64().unwrap_or(0);
            if stock < quantity {
                return Err(out_of_stock(stock));
            }
            txn.add(Add::take("stock", quantity));
            let reserved = json!({"type": "StockReserved", "reservation_id": txn.id().to_string(), "product_id": item.data["product_id"], "quantity": quantity});
            txn.emit(Message::event("events", SOURCE, &reserved)?);
            Ok((txn, Answer::json(StatusCode::CREATED, &reserved)))
        })
        .await
        .map_err(|error| error.out_of_bounds_as(|_stock, left| out_of_stock(left)))
}

fn out_of_stock(left: i64) -> HttpError {
    let detail = format!("{left} left; nothing was written");
    Problem::conflict("out-of-stock", "Out of stock")
        .with_detail(detail)
        .into()
}
