//! The `JsonBody<T>` extractor: a JSON request body whose refusals are problem+json
//! answers like every other error of the glue, not axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::HttpError;
use super::problem::FieldError;

/// A JSON body of type `T`, with its bytes as received. Refused as problem+json: not
/// `application/json` (or `application/*+json`) → 415; not JSON → 400; JSON of the
/// wrong shape or types → 422, naming the field (`items[0].quantity`); over the body limit
/// → 413. Put it inside [`super::Idempotent`] to take an `Idempotency-Key` too.
///
/// ```
/// use outbox::http::JsonBody;
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct NewProduct {
///     name: String,
///     stock: u32,
/// }
///
/// async fn create(JsonBody { value, .. }: JsonBody<NewProduct>) -> String {
///     format!("{} ({} in stock)", value.name, value.stock)
/// }
/// # let _ = axum::Router::<()>::new().route("/products", axum::routing::post(create));
/// ```
#[derive(Debug)]
pub struct JsonBody<T> {
    /// The parsed body.
    pub value: T,
    /// The bytes as received.
    pub raw: Bytes,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|media| {
                let media = media.trim().to_ascii_lowercase();
                media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
            });
        if !is_json {
            return Err(HttpError::UnsupportedMediaType);
        }
        let raw = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| HttpError::unreadable_body(&rejection))?;
        // Syntax first (400), then the shape (422). A field given twice has already taken
        // its last value, as in most JSON parsers.
        let json: serde_json::Value = serde_json::from_slice(&raw).map_err(|error| HttpError::Body {
            status: StatusCode::BAD_REQUEST,
            detail: without_position(&error.to_string()),
        })?;
        match serde_path_to_error::deserialize::<_, T>(json) {
            Ok(value) => Ok(Self { value, raw }),
            Err(error) => {
                let path = error.path().to_string();
                let field = if path == "." { "body".to_owned() } else { path };
                Err(HttpError::Validation(vec![FieldError::new(
                    field,
                    error.into_inner().to_string(),
                )]))
            }
        }
    }
}

/// serde_json's messages end in " at line L column C": useful, but only after the text.
fn without_position(message: &str) -> String {
    message.split(" at line ").next().unwrap_or(message).to_owned()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
        quantity: u32,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Order {
        items: Vec<Line>,
    }

    async fn answer(content_type: Option<&str>, body: &str) -> (StatusCode, String, serde_json::Value) {
        let mut request = Request::builder().method("POST").uri("/orders");
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        let request = request.body(Body::from(body.to_owned())).unwrap();
        let response = match JsonBody::<Order>::from_request(request, &()).await {
            Ok(_) => return (StatusCode::OK, String::new(), serde_json::Value::Null),
            Err(error) => error.into_response(),
        };
        let status = response.status();
        let kind = response.headers()[CONTENT_TYPE].to_str().unwrap().to_owned();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, kind, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn bad_bodies_are_problems_naming_what_failed() {
        let good = r#"{"items":[{"sku":"A","quantity":1}]}"#;
        assert_eq!(answer(Some("application/json"), good).await.0, StatusCode::OK);
        assert_eq!(answer(Some("application/problem+json"), good).await.0, StatusCode::OK);
        let (status, kind, problem) = answer(Some("text/plain"), good).await;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "application/problem+json")
        );
        assert_eq!(problem["type"], "/problems/unsupported-media-type");
        assert_eq!(answer(None, good).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let (status, _, problem) = answer(Some("application/json"), "{not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(problem["type"], "/problems/malformed-body");
        let (status, _, problem) = answer(Some("application/json"), r#"{"items":[{"sku":"A","quantity":-1}]}"#).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem["type"], "/problems/validation");
        assert_eq!(problem["errors"][0]["field"], "items[0].quantity", "{problem}");
    }
}
