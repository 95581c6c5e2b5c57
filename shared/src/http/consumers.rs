//! A route that shows what an in-order consumer did with one entity's chain
//! ([`crate::consumer::state`]): `GET /consumers/{consumer}/chain?destination=…&entity=…`
//! (`&item=…` for a consumer that applies in entity mode: the item it applies the
//! entity's messages to; `&producer=…` for a chain another table keeps: the chain is the
//! service's own table's unless it names another, and the answer's `chain` says which it
//! read). It shows the
//! consumer's records, so the service mounts it where its operators sign in:
//!
//! ```
//! # fn wire(app: axum::Router) -> axum::Router {
//! use outbox::http::{consumers, RequireScope};
//! app.merge(consumers::routes().route_layer(RequireScope::new("operations")))
//! # }
//! ```

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::{FieldError, HttpError, RequestScope};
use crate::consumer::state::{chain_state, ChainQuery, ChainState};

/// The route's path.
pub const CHAIN_PATH: &str = "/consumers/{consumer}/chain";

/// Which chain ([`ChainQuery`]).
#[derive(Debug, Deserialize)]
pub struct ChainParams {
    /// The destination the consumer consumes (the chain's); required.
    pub destination: Option<String>,
    /// The entity whose chain it is (its key, such as `ORDER#42`, `#` written `%23`);
    /// required.
    pub entity: Option<String>,
    /// The table that keeps the chain (the `producer=` of the messages' position): by
    /// default the service's own.
    pub producer: Option<String>,
    /// The item the consumer applies the entity's messages to, in entity mode.
    pub item: Option<String>,
}

/// `GET /consumers/{consumer}/chain?destination=…&entity=…[&producer=…][&item=…]`: the
/// consumer's state of the chain ([`ChainState`]), for any caller the route lets in (the
/// service puts it behind its own sign-in and scope).
pub async fn consumer_chain(
    _caller: super::Caller,
    scope: RequestScope,
    consumer: Result<Path<String>, PathRejection>,
    params: Result<Query<ChainParams>, QueryRejection>,
) -> Result<Json<ChainState>, HttpError> {
    let invalid = |field: &str, rule: &str| HttpError::Validation(vec![FieldError::new(field, rule)]);
    let Path(consumer) = consumer.map_err(|_| invalid("consumer", "must be a consumer's name"))?;
    let consumer = consumer
        .parse()
        .map_err(|_| invalid("consumer", "must be a consumer's name"))?;
    let Query(params) = params.map_err(|_| invalid("query", "must be destination=…&entity=…[&producer=…][&item=…]"))?;
    let destination = params
        .destination
        .ok_or_else(|| invalid("destination", "is required: the destination the consumer consumes"))?
        .parse()
        .map_err(|_| invalid("destination", "must be a destination's name"))?;
    let entity = params
        .entity
        .ok_or_else(|| invalid("entity", "is required: the key of the entity whose chain it is"))?
        .parse()
        .map_err(|_| invalid("entity", "must be an item key"))?;
    let outbox = scope.outbox();
    let mut query = ChainQuery::new(consumer, destination, entity);
    let producer = match params.producer {
        Some(producer) => Some(
            producer
                .parse()
                .map_err(|_| invalid("producer", "must be a table's name"))?,
        ),
        None => outbox.store().producer(),
    };
    if let Some(producer) = producer {
        query = query.producer(producer);
    }
    if let Some(item) = params.item {
        query = query.applied_in(item.parse().map_err(|_| invalid("item", "must be an item key"))?);
    }
    let state = chain_state(outbox.store().as_ref(), outbox.clock().as_ref(), &query)
        .await
        .map_err(HttpError::Unavailable)?;
    Ok(Json(state))
}

/// The route alone, to merge into a service's router (its state is the service's: the
/// route reads through the request's [`RequestScope`]).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route(CHAIN_PATH, get(consumer_chain))
}
