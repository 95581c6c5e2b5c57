//! The order routes. They use only the public API of the outbox library, the way a
//! user's own handlers would: read, decide, stage the write and its event, commit.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{ETAG, LOCATION};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox::http::HttpError;
use outbox::metrics::{MetricRecord, Unit};
use outbox::ports::{ExpectedVersion, ItemKey, KeyRead, StoreError};
use outbox::protocol::Message;
use outbox::request::{Transaction, TxnError};
use uuid::Uuid;

use outbox::http::{etag, Answer, Begun, Caller, Idempotency, Idempotent, IfMatch, RequestScope};

use super::model::{self, CreateOrder, Event, LineItem, Order, OrderView};
use crate::error::{ApiError, FieldError, Problem};
use crate::extract::{JsonBody, Path};
use crate::rules::{self, schema};
use crate::state::AppState;

/// The `source` of the orders' events on an EventBridge bus.
pub const EVENT_SOURCE: &str = "com.example.orders";

fn order_key(id: Uuid) -> ItemKey {
    format!("ORDER#{id}").parse().expect("a UUID makes a valid key")
}

fn parse_id(text: &str) -> Result<Uuid, ApiError> {
    let invalid = || ApiError::Validation(vec![FieldError::new("id", "must be a UUID")]);
    if !rules::ORDER_ID.allows(text) {
        return Err(invalid());
    }
    Uuid::try_parse(text).map_err(|_| invalid())
}

/// Order `id` as `caller` may see it: none when it is another caller's, exactly as when
/// there is no such order, so that nobody learns which ids other callers hold.
fn owned_by(order: Option<(Order, u64)>, caller: &Caller) -> Option<(Order, u64)> {
    order.filter(|(order, _)| order.owner == caller.id())
}

/// Order `id` as read, with what its key keeps across its lives (its version and its
/// events' chains), for the transaction that changes it ([`Transaction::note_read`]):
/// `None` where the store does not read keys across their lives.
async fn read(state: &AppState, id: Uuid) -> Result<(Option<(Order, u64)>, Option<KeyRead>), ApiError> {
    let key = order_key(id);
    let store = state.outbox.store();
    let (item, read) = match store.get_keys(std::slice::from_ref(&key)).await {
        Ok(mut keys) => {
            let read = keys.remove(&key).unwrap_or_default();
            (read.item.clone(), Some(read))
        }
        Err(StoreError::Unsupported(_)) => {
            let mut items = store
                .get_items(std::slice::from_ref(&key))
                .await
                .map_err(ApiError::Unavailable)?;
            (items.remove(&key), None)
        }
        Err(error) => return Err(ApiError::Unavailable(error)),
    };
    let order = match item {
        None => None,
        Some(item) => {
            let order: Order = serde_json::from_value(item.data)
                .map_err(|error| ApiError::Internal(format!("stored order {id}: {error}")))?;
            Some((order, item.version))
        }
    };
    Ok((order, read))
}

fn order_response(status: StatusCode, view: &OrderView, location: bool) -> Answer {
    let answer = Answer::json(status, view).header(ETAG, &etag(view.version));
    if location {
        answer.header(LOCATION, &format!("/orders/{}", view.id))
    } else {
        answer
    }
}

/// What a request decided to commit.
struct Change {
    status: StatusCode,
    view: OrderView,
    created: bool,
    write: Option<(Order, ExpectedVersion, Event)>,
}

/// Stages the change and its event, commits them (with the answer, under an
/// idempotency key), and answers.
async fn commit(
    state: &AppState,
    scope: &RequestScope,
    mut txn: Transaction,
    change: Change,
    precondition: bool,
) -> Result<Response, ApiError> {
    let answer = order_response(change.status, &change.view, change.created).under_precondition(precondition);
    if let Some((order, expected, event)) = change.write {
        txn.put(
            order_key(order.id),
            serde_json::to_value(&order).expect("orders serialise"),
            expected,
        );
        let message = Message::json(state.events.clone(), &event.body)
            .expect("events serialise")
            .with_attribute("event-type", event.name)
            .with_group_id(order.id.to_string())
            // On an EventBridge bus: rules match `source` and `detail-type`.
            .with_event(EVENT_SOURCE, event.name);
        txn.emit(message);
    }
    // Nothing of the transaction was sent before: a refusal decided by the reads cost
    // them alone. Its control message goes out now, timed on its own (the commit would
    // send it first anyway).
    let started = Instant::now();
    let sent = txn.send_control().await;
    MetricRecord::new(state.outbox.service_name().to_owned(), state.outbox.clock().now())
        .add(
            "ControlSendLatency",
            Unit::Milliseconds,
            [started.elapsed().as_secs_f64() * 1000.0],
        )
        .emit();
    sent.map_err(|error| match precondition {
        true => HttpError::Precondition(error),
        false => HttpError::Transaction(error),
    })?;
    let started = Instant::now();
    let result = scope.commit(txn, answer).await;
    let refused_late = matches!(
        &result,
        Err(HttpError::Transaction(TxnError::CommitWindowExpired { .. })
            | HttpError::Precondition(TxnError::CommitWindowExpired { .. }))
    );
    MetricRecord::new(state.outbox.service_name().to_owned(), state.outbox.clock().now())
        .add(
            "CommitLatency",
            Unit::Milliseconds,
            [started.elapsed().as_secs_f64() * 1000.0],
        )
        .count("Commits", usize::from(result.is_ok()))
        .count("CommitWindowRejections", usize::from(refused_late))
        .emit();
    Ok(result?)
}

/// Begins the request's transaction within its deadline (recorded in the request's
/// scope), or finds the request a repeat to replay; `entity`: in entity mode, for a change
/// to that one existing item (one conditional write instead of a transaction, where it
/// can be). Nothing is sent yet: the control message goes out with the commit.
async fn begin(
    scope: &RequestScope,
    entity: Option<ItemKey>,
    idempotency: Option<Idempotency>,
) -> Result<Begun<Transaction>, ApiError> {
    let result = match entity {
        Some(key) => scope.begin_entity(key, idempotency).await,
        None => scope.begin(idempotency).await,
    };
    Ok(result?)
}

/// Places an order; emits `OrderPlaced`.
#[utoipa::path(post, path = "/orders", tag = "orders", request_body = CreateOrder,
    params(schema::Idempotent),
    responses(
        (status = 201, description = "Placed", body = OrderView, headers(
            ("Location" = inline(schema::Location)), ("ETag" = inline(schema::ETag)),
            ("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
            ("Link" = inline(schema::StatusLink)), ("Idempotent-Replayed" = inline(schema::Replayed)))),
        (status = 400, description = "Malformed JSON, or an invalid Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields, or an idempotency key reused", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 503, description = "Nothing written, or outcome unknown (see transaction_id)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)), ("x-transaction-id" = inline(schema::TransactionId)),
                ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)))),
    ))]
pub async fn orders_create(
    State(state): State<AppState>,
    caller: Caller,
    scope: RequestScope,
    Idempotent { idempotency, body }: Idempotent<JsonBody<CreateOrder>>,
) -> Result<Response, ApiError> {
    body.value.validate()?;
    // A new order: its key was never written (a fresh UUID v7), so the create needs no
    // read to expect it absent at version 0, and commits into the order itself in one
    // write, as a change does (an Idempotency-Key's record takes the transactional form).
    let id = Uuid::now_v7();
    let txn = match begin(&scope, Some(order_key(id)), idempotency).await? {
        Begun::Replay(replay) => return Ok(replay),
        Begun::Started(txn) => txn,
    };
    let (order, event) = model::place(id, &caller, body.value);
    let change = Change {
        status: StatusCode::CREATED,
        view: order.view(1),
        created: true,
        write: Some((order, ExpectedVersion::AbsentAt(0), event)),
    };
    commit(&state, &scope, txn, change, false).await
}

/// Reads an order.
#[utoipa::path(get, path = "/orders/{id}", tag = "orders",
    params(("id" = inline(schema::OrderId), Path, description = "The order's id")),
    responses(
        (status = 200, description = "The order", body = OrderView, headers(("ETag" = inline(schema::ETag)))),
        (status = 400, description = "The path cannot be read (not UTF-8)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The order cannot be read now, or the request timed out", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)))),
    ))]
pub async fn orders_get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let (order, version) =
        owned_by(read(&state, id).await?.0, &caller).ok_or_else(|| ApiError::NotFound(format!("no order {id}")))?;
    Ok(order_response(StatusCode::OK, &order.view(version), false).into_response())
}

/// Reads, decides and commits a change of one order.
async fn change_order(
    state: &AppState,
    scope: &RequestScope,
    caller: &Caller,
    id: Uuid,
    if_match: IfMatch,
    idempotency: Option<Idempotency>,
    decide: impl FnOnce(&Order) -> Result<Option<(Order, Event)>, ApiError>,
) -> Result<Response, ApiError> {
    let keyed = idempotency.is_some();
    // A change to one existing order: entity mode. The transaction begins beside the
    // order's read (under a key, its look-up of a repeat overlaps the read), and nothing
    // of it is sent until the commit: a refusal decided by the read (no such order,
    // another caller's, If-Match failed) or by the rules costs the read alone, sends no
    // control message, writes no tombstone, and names no transaction, since none exists
    // outside the process.
    let (txn, loaded) = tokio::join!(begin(scope, Some(order_key(id)), idempotency), read(state, id));
    let txn = match txn {
        Ok(Begun::Replay(replay)) => return Ok(replay),
        Ok(Begun::Started(txn)) => Ok(txn),
        Err(error) => Err(error),
    };
    let (loaded, key_read) = loaded?;
    let (order, version) = owned_by(loaded, caller).ok_or_else(|| ApiError::NotFound(format!("no order {id}")))?;
    if !if_match.allows(version) {
        return Err(ApiError::PreconditionFailed);
    }
    let mut txn = txn?;
    // Read beside the begin: the transaction places its event in the order's history
    // from this read, as if it had read the order itself.
    if let Some(key_read) = key_read {
        txn.note_read(order_key(id), key_read);
    }
    let change = match decide(&order)? {
        Some((next, event)) => Change {
            status: StatusCode::OK,
            view: next.view(version + 1),
            created: false,
            write: Some((next, ExpectedVersion::Exactly(version), event)),
        },
        // Nothing changes, nothing is emitted. Without a key there is nothing to commit,
        // and nothing of the transaction was sent (the deadline middleware finds nothing
        // to settle); with one, the answer is committed so that repeats replay it.
        None if !keyed => {
            let Answer {
                status, headers, body, ..
            } = order_response(StatusCode::OK, &order.view(version), false);
            return Ok((status, headers, body).into_response());
        }
        None => Change {
            status: StatusCode::OK,
            view: order.view(version),
            created: false,
            write: None,
        },
    };
    commit(state, scope, txn, change, if_match.is_present()).await
}

/// Adds a line, or changes the line of the same SKU; emits `ItemAdded` when the order
/// changed.
#[utoipa::path(post, path = "/orders/{id}/items", tag = "orders", request_body = LineItem,
    params(
        ("id" = inline(schema::OrderId), Path, description = "The order's id"),
        schema::Preconditions,
    ),
    responses(
        (status = 200, description = "The order after the change (or as it was, when it already held the line)", body = OrderView, headers(
            ("ETag" = inline(schema::ETag)), ("x-transaction-id" = inline(schema::TransactionId)),
            ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)),
            ("Idempotent-Replayed" = inline(schema::Replayed)))),
        (status = 400, description = "The path cannot be read, malformed JSON, or an invalid header", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Cancelled, or changed concurrently", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 412, description = "If-Match does not match", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id or fields, a full order, or an idempotency key reused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Nothing written, or outcome unknown (see transaction_id)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)), ("x-transaction-id" = inline(schema::TransactionId)),
                ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)))),
    ))]
pub async fn orders_add_item(
    State(state): State<AppState>,
    caller: Caller,
    scope: RequestScope,
    Path(id): Path<String>,
    if_match: IfMatch,
    Idempotent { idempotency, body }: Idempotent<JsonBody<LineItem>>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    body.value.validate()?;
    let item = body.value;
    change_order(&state, &scope, &caller, id, if_match, idempotency, move |order| {
        model::add_item(order, item)
    })
    .await
}

/// Removes the line of a SKU; emits `ItemRemoved` when there was one.
#[utoipa::path(delete, path = "/orders/{id}/items/{sku}", tag = "orders",
    params(
        ("id" = inline(schema::OrderId), Path, description = "The order's id"),
        ("sku" = inline(schema::Sku), Path, description = "The line's SKU"),
        schema::Preconditions,
    ),
    responses(
        (status = 200, description = "The order after the change (or as it was, when it had no such line)", body = OrderView, headers(
            ("ETag" = inline(schema::ETag)), ("x-transaction-id" = inline(schema::TransactionId)),
            ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)),
            ("Idempotent-Replayed" = inline(schema::Replayed)))),
        (status = 400, description = "The path cannot be read, or an invalid header", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Cancelled, or changed concurrently", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 412, description = "If-Match does not match", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 422, description = "Invalid id or SKU, or an idempotency key reused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Nothing written, or outcome unknown (see transaction_id)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)), ("x-transaction-id" = inline(schema::TransactionId)),
                ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)))),
    ))]
pub async fn orders_remove_item(
    State(state): State<AppState>,
    caller: Caller,
    scope: RequestScope,
    Path((id, sku)): Path<(String, String)>,
    if_match: IfMatch,
    Idempotent { idempotency, .. }: Idempotent<Bytes>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    model::check_sku(&sku, "sku").map_err(|error| ApiError::Validation(vec![error]))?;
    change_order(&state, &scope, &caller, id, if_match, idempotency, move |order| {
        model::remove_item(order, &sku)
    })
    .await
}

/// Cancels an order; emits `OrderCancelled` unless it already was.
#[utoipa::path(post, path = "/orders/{id}/cancel", tag = "orders",
    params(
        ("id" = inline(schema::OrderId), Path, description = "The order's id"),
        schema::Preconditions,
    ),
    responses(
        (status = 200, description = "The cancelled order", body = OrderView, headers(
            ("ETag" = inline(schema::ETag)), ("x-transaction-id" = inline(schema::TransactionId)),
            ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)),
            ("Idempotent-Replayed" = inline(schema::Replayed)))),
        (status = 400, description = "The path cannot be read, or an invalid header", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 412, description = "If-Match does not match", body = Problem, content_type = "application/problem+json",
            headers(("x-transaction-id" = inline(schema::TransactionId)), ("x-transaction-item" = inline(schema::TransactionItem)),
                ("Link" = inline(schema::StatusLink)))),
        (status = 422, description = "Invalid id, or an idempotency key reused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Nothing written, or outcome unknown (see transaction_id)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = inline(schema::RetryAfter)), ("x-transaction-id" = inline(schema::TransactionId)),
                ("x-transaction-item" = inline(schema::TransactionItem)), ("Link" = inline(schema::StatusLink)))),
    ))]
pub async fn orders_cancel(
    State(state): State<AppState>,
    caller: Caller,
    scope: RequestScope,
    Path(id): Path<String>,
    if_match: IfMatch,
    Idempotent { idempotency, .. }: Idempotent<Bytes>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    change_order(&state, &scope, &caller, id, if_match, idempotency, |order| {
        Ok(model::cancel(order))
    })
    .await
}
