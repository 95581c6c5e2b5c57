//! The `Command<T>` extractor: what a handler that changes state takes (its request's
//! scope, its `Idempotency-Key` and its JSON body), and the step it runs with them, each
//! attempt handed what it needs by value.

use std::future::Future;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::HttpError;
use super::idempotency::Idempotency;
use super::idempotent::Idempotent;
use super::json::JsonBody;
use super::problem::FieldError;
use super::scope::{Answer, RequestScope};
use crate::ports::ItemKey;
use crate::request::Transaction;

/// A request that changes state: its [`RequestScope`], its `Idempotency-Key` (as
/// [`Idempotent`] reads it) and its JSON body as a `T` (as [`JsonBody`] reads it, refusing
/// a body that is not a `T` with a problem+json 400, 415 or 422). As an extractor it reads
/// the body, so it comes last among a handler's arguments.
///
/// [`Command::run`] and [`Command::run_on`] run the handler's step: read, decide, stage,
/// answer. They retry it on a version conflict as [`RequestScope::retry_conflicts`] does,
/// and hand each attempt a clone of the body (and, on an entity, its key), so that the
/// closure takes what it needs with nothing borrowed beforehand; [`Command::with`] adds
/// a value of the handler's to what each attempt is handed.
///
/// ```
/// use axum::{extract::Path, http::StatusCode, response::Response};
/// use outbox::http::{Answer, Command, HttpError, Problem};
/// use outbox::ports::ExpectedVersion;
/// use serde_json::json;
///
/// #[derive(Clone, serde::Deserialize)]
/// struct Rename {
///     name: String,
/// }
///
/// /// `POST /shelves/{id}/name`: renames a shelf that exists.
/// async fn rename(Path(id): Path<String>, command: Command<Rename>) -> Result<Response, HttpError> {
///     let key = outbox::http::key_for("SHELF", "id", &id)?;
///     command
///         .with(id) // handed to each attempt beside the body
///         .run_on(key, |mut txn, key, (rename, id)| async move {
///             let Some(shelf) = txn.get(&key).await? else {
///                 return Err(Problem::not_found("no-such-shelf", "No such shelf").into());
///             };
///             txn.put(key, json!({"name": rename.name}), ExpectedVersion::Exactly(shelf.version));
///             Ok((txn, Answer::json(StatusCode::OK, &json!({"id": id, "name": rename.name}))))
///         })
///         .await
/// }
/// # let _ = axum::Router::<()>::new().route("/shelves/{id}/name", axum::routing::post(rename));
/// ```
#[derive(Debug)]
pub struct Command<T> {
    /// The request's scope.
    pub scope: RequestScope,
    /// The request's key and fingerprint, when it sent a key.
    pub idempotency: Option<Idempotency>,
    /// The body.
    pub body: T,
}

impl<S, T> FromRequest<S> for Command<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let scope = RequestScope::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Idempotent { idempotency, body } =
            Idempotent::<JsonBody<T>>::from_request(Request::from_parts(parts, body), state).await?;
        Ok(Self {
            scope,
            idempotency,
            body: body.value,
        })
    }
}

impl<T> Command<T> {
    /// This command with `extra` handed to each attempt beside the body, as `(body,
    /// extra)`: a value of the handler's (an id from the path, a value derived before the
    /// step) that the attempts need, without borrowing it.
    pub fn with<X>(self, extra: X) -> Command<(T, X)> {
        Command {
            scope: self.scope,
            idempotency: self.idempotency,
            body: (self.body, extra),
        }
    }
}

impl<T: Clone> Command<T> {
    /// Runs the step in one transaction (the portable form): `attempt` reads, decides
    /// and stages in the transaction it is given, with a clone of the body, and returns
    /// it with the answer, which is committed with it. On a version conflict it runs
    /// again on fresh reads within the request's deadline; a repeat under the same
    /// `Idempotency-Key` is answered as the first time, without running it
    /// ([`RequestScope::retry_conflicts`] in full). A refusal it returns is the answer,
    /// naming the transaction once anything of it may be known outside. (A service with
    /// an error type of its own, converting from [`HttpError`], calls
    /// [`RequestScope::retry_conflicts`] itself.)
    pub async fn run<F, Fut>(self, attempt: F) -> Result<Response, HttpError>
    where
        F: FnMut(Transaction, T) -> Fut,
        Fut: Future<Output = Result<(Transaction, Answer), HttpError>>,
    {
        self.retry(None, attempt).await
    }

    /// Runs the step on one item, in entity mode (its outbox inside the item, one
    /// conditional write): as [`Command::run`], with the item's key handed to each
    /// attempt beside the body. The requests of this process on the item take turns.
    pub async fn run_on<F, Fut>(self, entity: ItemKey, mut attempt: F) -> Result<Response, HttpError>
    where
        F: FnMut(Transaction, ItemKey, T) -> Fut,
        Fut: Future<Output = Result<(Transaction, Answer), HttpError>>,
    {
        let key = entity.clone();
        self.retry(Some(entity), move |txn, body| attempt(txn, key.clone(), body))
            .await
    }

    /// [`RequestScope::retry_conflicts`] with a clone of the body handed to each attempt.
    async fn retry<F, Fut>(self, entity: Option<ItemKey>, mut attempt: F) -> Result<Response, HttpError>
    where
        F: FnMut(Transaction, T) -> Fut,
        Fut: Future<Output = Result<(Transaction, Answer), HttpError>>,
    {
        let Self {
            scope,
            idempotency,
            body,
        } = self;
        scope
            .retry_conflicts(entity, idempotency, |txn| attempt(txn, body.clone()))
            .await
    }
}

/// The longest id [`key_for`] takes.
pub const KEY_ID_MAX: usize = 64;

/// The key `{kind}#{id}` of an item a request names by `id` (from its path or its body),
/// or a problem+json 422 naming `field` when the id is not 1 to [`KEY_ID_MAX`] letters,
/// digits, `-` or `_`: an id never reaches into the keys of another kind (no `#`), nor is
/// it a path segment of its own (`.`, `..`) that a route could not name. A `kind` that
/// makes a key of the protocol's own (`TXN`, `IN`, `IDEM`) is the service's mistake: a
/// 500, the problem logged.
///
/// ```
/// let key = outbox::http::key_for("PRODUCT", "product_id", "p-1").unwrap();
/// assert_eq!(key.as_str(), "PRODUCT#p-1");
/// assert!(outbox::http::key_for("PRODUCT", "product_id", "p#1").is_err());
/// ```
pub fn key_for(kind: &str, field: &str, id: &str) -> Result<ItemKey, HttpError> {
    let valid =
        (1..=KEY_ID_MAX).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if !valid {
        return Err(HttpError::Validation(vec![FieldError::new(
            field,
            format!("1 to {KEY_ID_MAX} letters, digits, '-' or '_'"),
        )]));
    }
    format!("{kind}#{id}").parse().map_err(|_| HttpError::Misconfigured {
        problem: "key_for was given a kind that makes a key of the protocol's own",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id is 1 to 64 of the characters the rule names; each broken rule is a 422
    /// naming the field; the kind is the key's prefix.
    #[test]
    fn an_id_makes_a_key_of_its_kind_or_a_problem_naming_its_field() {
        assert_eq!(key_for("PRODUCT", "id", "p_1-b2").unwrap().as_str(), "PRODUCT#p_1-b2");
        let longest = "x".repeat(KEY_ID_MAX);
        assert!(key_for("PRODUCT", "id", &longest).is_ok());
        for bad in [
            "",
            "p#1",
            "a/b",
            "é",
            "p 1",
            ".",
            "..",
            "p.1",
            &"x".repeat(KEY_ID_MAX + 1),
        ] {
            match key_for("PRODUCT", "product_id", bad) {
                Err(HttpError::Validation(errors)) => {
                    assert_eq!(errors.len(), 1, "{bad:?}");
                    assert_eq!(errors[0].field, "product_id", "{bad:?}");
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        // A kind that makes a protocol key is the service's mistake, not the client's.
        assert!(matches!(
            key_for("TXN", "id", "1"),
            Err(HttpError::Misconfigured { .. })
        ));
    }
}
