//! An answer to commit with a transaction, as a handler builds it.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An answer to commit with a transaction: its status, headers and body. The transaction
/// id header is added, and under an idempotency key it is stored for replays.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: String,
    /// Whether the client sent `If-Match`: a business condition that fails is then a 412.
    pub precondition: bool,
}

impl Answer {
    /// A JSON answer.
    ///
    /// # Panics
    ///
    /// If `body`'s `Serialize` fails (a map whose keys are not strings).
    pub fn json(status: StatusCode, body: &impl Serialize) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Self {
            status,
            headers,
            // Only a map with keys that are not strings fails here: a bug in the answer's
            // type, never the request's input.
            body: serde_json::to_string(body).expect("the answer's type serialises to JSON"),
            precondition: false,
        }
    }

    /// This answer with header `name: value` (a value that is not a valid header value is
    /// left out).
    pub fn header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.insert(name, value);
        }
        self
    }

    /// This answer, for a request that sent `If-Match` when `sent` is true.
    pub fn under_precondition(mut self, sent: bool) -> Self {
        self.precondition = sent;
        self
    }
}

/// The answer as it is, for reads and other answers that commit nothing.
impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        (self.status, self.headers, self.body).into_response()
    }
}
