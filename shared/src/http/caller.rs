//! Who is calling: the subject of the token API Gateway's JWT authorizer verified, or
//! one development caller where no authorizer runs.
//!
//! The API never verifies a token itself: API Gateway does, before the function runs,
//! and hands the token's claims over in the request's context. [`Caller`] reads the
//! subject (`sub`) from there (feature `lambda`: an HTTP API's JWT authorizer, or a REST
//! API's Cognito authorizer), else takes a `Caller` a middleware of the service's own put
//! in the request's extensions (another front door, a test): the front door's verified
//! subject wins. The function trusts the request's context as Lambda hands it over, so
//! only the API's front door may invoke it (the template grants that to its HTTP API
//! alone). Where no caller is known, the service's [`Authentication`] decides what a
//! handler that asks for one gets: [`Authentication::Jwt`] answers 401 (a front door
//! whose authorizer was removed serves nobody as somebody), [`Authentication::Off`] the
//! development caller (the local server, `cargo lambda watch`, a demo stack deployed
//! without sign-in). A token whose subject is the development caller's name is no
//! caller: no token ever reaches what the development caller owns.
//!
//! The service says which by an [`axum::Extension`] on its router
//! (`router.layer(Extension(Authentication::Off))`; `outbox::service` adds it from
//! `OUTBOX_AUTH`). A router without one answers 401 to a request that carries no caller
//! where a handler asks for one.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::HttpError;

pub use crate::settings::Authentication;

/// The caller of a request: an opaque id, the verified token's subject. Extracting it
/// answers 401 when the request has none and the service requires one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(String);

impl Caller {
    /// The one caller of a service whose [`Authentication`] is off.
    pub const DEVELOPMENT: &'static str = "development";

    /// The caller `id` (a token's subject, as a service's own middleware verified it).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The development caller.
    pub fn development() -> Self {
        Self::new(Self::DEVELOPMENT)
    }

    /// The caller's id.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// The caller as `parts` carry it: the subject the front door's authorizer verified,
    /// else an extension a middleware of the service's put there.
    pub fn of(parts: &Parts) -> Option<Self> {
        #[cfg(feature = "lambda")]
        if let Some(subject) = authorizer_subject(parts) {
            return Some(Self(subject));
        }
        parts.extensions.get::<Caller>().cloned()
    }

    /// Within `scope` (a service's name), the scope of this caller's idempotency keys:
    /// two callers' keys never meet. The id is hashed, so that any subject fits a key.
    pub fn key_scope(&self, scope: &str) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.0.as_bytes());
        let hex: String = digest[..16].iter().map(|byte| format!("{byte:02x}")).collect();
        format!("{scope}@{hex}")
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Says at start, on Lambda, how callers are known: a warning when sign-in is off, since
/// anyone who can reach the function's front door is then the development caller.
pub fn announce(authentication: Authentication) {
    match authentication {
        Authentication::Off => tracing::warn!(
            "OUTBOX_AUTH=off: sign-in is off, every request is served as the development caller, and anyone who \
             can reach this API reads and changes everything it serves"
        ),
        Authentication::Jwt => tracing::info!(
            "OUTBOX_AUTH=jwt: a handler that asks for the caller answers 401 to a request without a token API Gateway's authorizer verified"
        ),
    }
}

/// The `sub` claim of the token the front door's authorizer verified: an HTTP API's JWT
/// authorizer (`requestContext.authorizer.jwt.claims`), or a REST API's Cognito
/// authorizer (`requestContext.authorizer.claims`).
#[cfg(feature = "lambda")]
fn authorizer_subject(parts: &Parts) -> Option<String> {
    use lambda_http::request::RequestContext;
    let subject = match parts.extensions.get::<RequestContext>()? {
        RequestContext::ApiGatewayV2(context) => context.authorizer.as_ref()?.jwt.as_ref()?.claims.get("sub").cloned(),
        RequestContext::ApiGatewayV1(context) => context
            .authorizer
            .jwt
            .as_ref()
            .and_then(|jwt| jwt.claims.get("sub").cloned())
            .or_else(|| {
                let claims = context.authorizer.fields.get("claims")?;
                claims.get("sub")?.as_str().map(str::to_owned)
            }),
        _ => None,
    };
    subject.filter(|subject| !subject.is_empty() && subject != Caller::DEVELOPMENT)
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let caller = match (Self::of(parts), parts.extensions.get::<Authentication>()) {
            (Some(caller), _) => caller,
            (None, Some(Authentication::Off)) => Self::development(),
            (None, _) => return Err(HttpError::Unauthenticated),
        };
        // The request's span, where it has a `caller` field, says who called.
        tracing::Span::current().record("caller", caller.id());
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    async fn caller_of(request: Request<()>) -> Result<Caller, HttpError> {
        let (mut parts, ()) = request.into_parts();
        Caller::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn a_request_without_a_verified_caller_is_refused_unless_authentication_is_off() {
        let bare = || Request::builder().uri("/orders").body(()).unwrap();
        assert!(matches!(caller_of(bare()).await, Err(HttpError::Unauthenticated)));
        let mut jwt = bare();
        jwt.extensions_mut().insert(Authentication::Jwt);
        assert!(matches!(caller_of(jwt).await, Err(HttpError::Unauthenticated)));
        let mut off = bare();
        off.extensions_mut().insert(Authentication::Off);
        assert_eq!(caller_of(off).await.unwrap(), Caller::development());
        let mut verified = bare();
        verified.extensions_mut().insert(Authentication::Jwt);
        verified.extensions_mut().insert(Caller::new("user-1"));
        assert_eq!(caller_of(verified).await.unwrap().id(), "user-1");
    }

    #[test]
    fn two_callers_keys_never_share_a_scope() {
        let (one, other) = (Caller::new("a"), Caller::new("b"));
        assert_ne!(one.key_scope("api"), other.key_scope("api"));
        assert_eq!(one.key_scope("api"), Caller::new("a").key_scope("api"));
        assert!(one.key_scope("api").starts_with("api@"));
    }
}
