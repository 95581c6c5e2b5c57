//! One `use outbox::prelude::*;` for a service's handlers and consumers: the types a
//! handler reads, decides, stages and answers with, and those of a consumer. The serde
//! derives it brings need `serde` among the crate's own dependencies, as deriving does.

pub use async_trait::async_trait;
pub use serde::{Deserialize, Serialize};
pub use serde_json::{json, Value};

pub use crate::consumer::{Handler, HandlerError, Incoming, Staging};
pub use crate::counter::{Add, Refusal};
pub use crate::ports::{ExpectedVersion, ItemKey};
pub use crate::protocol::Message;
pub use crate::request::TxnError;

#[cfg(feature = "axum")]
pub use crate::http::{key_for, Answer, Command, FieldError, HttpError, Idempotent, JsonBody, Problem, RequestScope};
#[cfg(feature = "axum")]
pub use axum::{
    extract::Path,
    http::{header, StatusCode},
    response::Response,
};
