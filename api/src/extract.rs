//! Extractors that turn bad input into the API's problem responses: path parameters, and
//! a JSON body that names the failing field. (`If-Match` and `Idempotency-Key` come from
//! [`outbox::http::headers`].)

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::openapi::schema::{ArrayItems, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::error::{ApiError, FieldError};

/// A route's path parameters, as axum's `Path` reads them, except that a path it cannot
/// read (a parameter that is not UTF-8 once percent-decoded, as in `/orders/%FF`) is a
/// 400 problem like every other error, not axum's plain-text rejection.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// A JSON body of type `T`, with its raw bytes (for the idempotency fingerprint).
/// Not JSON → 400; JSON of the wrong shape or types → 422 naming the field; not
/// `application/json` → 415; over the body limit → 413.
///
/// The body is held to `T`'s schema in the OpenAPI document before serde reads it, where
/// the two disagree: serde's derive reads a struct from a JSON array too (its fields in
/// order, at any depth), which the document does not allow, so anything but an object
/// where the schema says object is refused, naming where (`body`, `items[0]`); and JSON
/// Schema's `integer` admits `2.0`, which serde's integers do not, so such numbers are read
/// as the integers they are.
pub struct JsonBody<T> {
    /// The parsed body.
    pub value: T,
    /// The bytes as received.
    pub raw: Bytes,
}

impl<S: Send + Sync, T: DeserializeOwned + ToSchema> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

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
            return Err(ApiError::UnsupportedMediaType);
        }
        let raw = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| match rejection {
                BytesRejection::FailedToBufferBody(ref failed) if failed.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::PayloadTooLarge
                }
                other => ApiError::MalformedBody(other.body_text()),
            })?;
        let mut value: Value = serde_json::from_slice(&raw)
            .map_err(|error| ApiError::MalformedBody(strip_position(&error.to_string())))?;
        let schema = crate::openapi::document()
            .components
            .as_ref()
            .and_then(|components| components.schemas.get(T::name().as_ref()))
            .ok_or_else(|| ApiError::Internal(format!("the document has no schema {}", T::name())))?;
        as_the_document_says(&mut value, schema, "")?;
        // A field given twice has already taken its last value, as in most JSON parsers.
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(value) => Ok(Self { value, raw }),
            Err(error) => {
                let path = error.path().to_string();
                let field = if path == "." { "body".to_owned() } else { path };
                Err(ApiError::Validation(vec![FieldError::new(
                    field,
                    error.into_inner().to_string(),
                )]))
            }
        }
    }
}

/// Holds `value` to `schema` (a schema of the document, or a reference into its
/// components) where serde would read it differently, descending into properties and array
/// elements: an object where the schema says object, and an integral number where it says
/// integer written as one. `at` is where `value` sits in the body, in serde_path_to_error's
/// notation.
fn as_the_document_says(value: &mut Value, schema: &RefOr<Schema>, at: &str) -> Result<(), ApiError> {
    let schema = match schema {
        RefOr::T(schema) => schema,
        RefOr::Ref(reference) => {
            let name = reference.ref_location.trim_start_matches("#/components/schemas/");
            let resolved = crate::openapi::document()
                .components
                .as_ref()
                .and_then(|components| components.schemas.get(name))
                .ok_or_else(|| ApiError::Internal(format!("the document has no schema {name}")))?;
            return as_the_document_says(value, resolved, at);
        }
    };
    match schema {
        Schema::Object(object) if object.schema_type == SchemaType::Type(Type::Object) => {
            let Value::Object(fields) = value else {
                let field = if at.is_empty() { "body" } else { at };
                return Err(ApiError::Validation(vec![FieldError::new(
                    field,
                    "must be a JSON object",
                )]));
            };
            for (name, property) in &object.properties {
                if let Some(field) = fields.get_mut(name) {
                    let path = if at.is_empty() {
                        name.clone()
                    } else {
                        format!("{at}.{name}")
                    };
                    as_the_document_says(field, property, &path)?;
                }
            }
            Ok(())
        }
        Schema::Object(object) if object.schema_type == SchemaType::Type(Type::Integer) => {
            if let Some(integral) = value.as_f64().filter(|_| value.is_f64()).and_then(integer) {
                *value = integral;
            }
            Ok(())
        }
        Schema::Array(array) => match (&array.items, value) {
            (ArrayItems::RefOrSchema(items), Value::Array(elements)) => {
                for (index, element) in elements.iter_mut().enumerate() {
                    as_the_document_says(element, items, &format!("{at}[{index}]"))?;
                }
                Ok(())
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// `number` as a JSON integer, when it is one that an `i64` or a `u64` holds.
fn integer(number: f64) -> Option<Value> {
    // 2^64 and -2^63 are exact in an f64; every integral f64 between them converts exactly.
    const TWO_TO_THE_64: f64 = 18_446_744_073_709_551_616.0;
    if number.fract() != 0.0 {
        None
    } else if (0.0..TWO_TO_THE_64).contains(&number) {
        Some(Value::from(number as u64))
    } else if (i64::MIN as f64..0.0).contains(&number) {
        Some(Value::from(number as i64))
    } else {
        None
    }
}

/// serde_json's messages end in " at line L column C": useful, but only after the text.
fn strip_position(message: &str) -> String {
    message.split(" at line ").next().unwrap_or(message).to_owned()
}
