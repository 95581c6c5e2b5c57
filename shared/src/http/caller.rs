//! Who is calling: the issuer and subject that the front door verified, with the scopes
//! it granted, or one development caller where nobody signs in.
//!
//! The API never verifies a credential itself: the front door does, before the function
//! runs, and hands what it verified over in the request's context. [`Caller`] reads it
//! from there (feature `lambda`), from whichever front door verified it:
//!
//! | front door | issuer | subject | scopes |
//! |---|---|---|---|
//! | HTTP API, JWT authorizer | the token's `iss` | its `sub` | the authorizer's `scopes`, and the token's `scope` claim |
//! | REST API, Cognito authorizer | the token's `iss` | its `sub` | its `scope` claim (an access token's) |
//! | Lambda authorizer (HTTP or REST API) | `lambda:` and its context's `iss`, else `lambda-authorizer` | its context's `sub`, else (REST) its `principalId` | its context's `scope` (space-separated) or `scopes` (a list) |
//! | IAM (`AWS_IAM` on a route, or a function URL) | `iam:` and the account | the caller's ARN (an assumed role's session left out: every session of a role is one caller) | none: IAM authorized the route itself ([`Scopes::Route`]) |
//! | IAM with a Cognito identity pool's credentials | `cognito-identity:` and the pool | the identity's id | as IAM |
//!
//! Else the [`Caller`] a middleware of the service's own put in the request's extensions
//! (a front door of its own, a test): the front door's verified caller wins. The function
//! trusts the request's context as Lambda hands it over, so only the API's front door may
//! invoke it (the template grants that to its HTTP API alone). Two callers are the same
//! caller only with the same issuer and subject: two issuers' `sub` never meet (an issuer
//! with white space in it is no caller's, so that no two pairs make one id). HTTP API
//! events of payload format 1.0 and 2.0 are both read.
//!
//! Where no caller is known, the service's [`Authentication`] decides what a handler that
//! asks for one gets: [`Authentication::Jwt`] answers 401 (a front door whose authorizer
//! was removed serves nobody as somebody), [`Authentication::Off`] the development caller
//! (the local server, `cargo lambda watch`; refused where others can reach the service,
//! on Lambda or beyond loopback, unless the operator says so explicitly,
//! `OUTBOX_AUTH_OFF_EXPOSED=allow`). A subject that is the development
//! caller's name is no caller: no credential ever reaches what the development caller owns.
//!
//! The service says which by an [`axum::Extension`] on its router
//! (`router.layer(Extension(Authentication::Off))`; `outbox::service` adds it from
//! `OUTBOX_AUTH`). A router without one answers 401 to a request that carries no caller
//! where a handler asks for one. What each route needs of a caller is
//! [`super::authorization::RequireScope`]'s.

use std::collections::BTreeSet;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::Extensions;

use super::error::HttpError;

pub use crate::settings::Authentication;

/// What a caller may do, as its front door said.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scopes {
    /// Everything: the development caller, where nobody signs in.
    All,
    /// The scopes its token or authorizer granted (`orders/read`, ...).
    Granted(BTreeSet<String>),
    /// No scopes: the front door authorized the route itself (IAM), and named the route it
    /// authorized (`POST /orders`; `None` where it named none, as a function URL). A route
    /// that asks for a scope serves such a caller only where the route the front door
    /// authorized is the route the service serves.
    Route(Option<String>),
}

/// The caller of a request: the issuer and subject its front door verified, and what it
/// may do. Extracting it answers 401 when the request has none and the service requires
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    issuer: String,
    subject: String,
    id: String,
    scopes: Scopes,
}

impl Caller {
    /// The one caller of a service whose [`Authentication`] is off.
    pub const DEVELOPMENT: &'static str = "development";

    /// The caller `id`, of no issuer and with no scope (a subject a service's own
    /// middleware verified; grant scopes with [`Self::with_scopes`]).
    pub fn new(id: impl Into<String>) -> Self {
        Self::verified("", id)
    }

    /// The caller `subject` of `issuer`, with no scope. Its [`id`](Self::id) names both,
    /// so that two issuers' subjects are two callers.
    pub fn verified(issuer: impl Into<String>, subject: impl Into<String>) -> Self {
        let (issuer, subject) = (issuer.into(), subject.into());
        let id = if issuer.is_empty() {
            subject.clone()
        } else {
            format!("{issuer} {subject}")
        };
        Self {
            issuer,
            subject,
            id,
            scopes: Scopes::Granted(BTreeSet::new()),
        }
    }

    /// The development caller, who has every scope.
    pub fn development() -> Self {
        Self::new(Self::DEVELOPMENT).with_all_scopes()
    }

    /// This caller, granted `scopes`.
    pub fn with_scopes<S: Into<String>>(mut self, scopes: impl IntoIterator<Item = S>) -> Self {
        self.scopes = Scopes::Granted(scopes.into_iter().map(Into::into).collect());
        self
    }

    /// This caller, granted every scope.
    pub fn with_all_scopes(mut self) -> Self {
        self.scopes = Scopes::All;
        self
    }

    fn with(mut self, scopes: Scopes) -> Self {
        self.scopes = scopes;
        self
    }

    /// The caller's id: its issuer and subject (the subject alone for a caller of no
    /// issuer). What a service keeps as an owner.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Who verified the caller (a token's `iss`, `iam:<account>`), or empty.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The caller, as its issuer names it.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// What the caller may do.
    pub fn scopes(&self) -> &Scopes {
        &self.scopes
    }

    /// Whether the caller was granted `scope` (the development caller has every one; a
    /// caller authorized per route by IAM has none: see [`Scopes::Route`]).
    pub fn has_scope(&self, scope: &str) -> bool {
        match &self.scopes {
            Scopes::All => true,
            Scopes::Granted(granted) => granted.contains(scope),
            Scopes::Route(_) => false,
        }
    }

    /// The caller as `parts` carry it: the one the front door verified, else an extension
    /// a middleware of the service's put there.
    pub fn of(parts: &Parts) -> Option<Self> {
        Self::in_extensions(&parts.extensions)
    }

    /// [`Self::of`] a request's extensions.
    pub fn in_extensions(extensions: &Extensions) -> Option<Self> {
        #[cfg(feature = "lambda")]
        if let Some(caller) = front_door::caller(extensions) {
            return Some(caller);
        }
        extensions.get::<Caller>().cloned()
    }

    /// Within `scope` (a service's name), the scope of this caller's idempotency keys:
    /// two callers' keys never meet. The id is hashed, so that any subject fits a key.
    pub fn key_scope(&self, scope: &str) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.id.as_bytes());
        let hex: String = digest[..16].iter().map(|byte| format!("{byte:02x}")).collect();
        format!("{scope}@{hex}")
    }

    /// The caller of `parts` as a handler gets it: the verified one, else the development
    /// caller where sign-in is off, else 401.
    pub(crate) fn required(extensions: &Extensions) -> Result<Self, HttpError> {
        match (Self::in_extensions(extensions), extensions.get::<Authentication>()) {
            (Some(caller), _) => Ok(caller),
            (None, Some(Authentication::Off)) => Ok(Self::development()),
            (None, _) => Err(HttpError::Unauthenticated),
        }
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
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
            "OUTBOX_AUTH=jwt: a handler that asks for the caller answers 401 to a request without a caller its front door verified"
        ),
    }
}

/// The callers of each front door, from the request's context as `lambda_http` hands it
/// over.
#[cfg(feature = "lambda")]
mod front_door {
    use std::collections::{BTreeSet, HashMap};

    use axum::http::Extensions;
    use lambda_http::request::RequestContext;
    use serde_json::Value;

    use super::{Caller, Scopes};

    /// A Lambda authorizer's issuer where its context names none; one it names goes
    /// under `lambda:`, so that no Lambda authorizer's caller is another front door's.
    const LAMBDA_AUTHORIZER: &str = "lambda-authorizer";

    pub(super) fn caller(extensions: &Extensions) -> Option<Caller> {
        let caller = match extensions.get::<RequestContext>()? {
            RequestContext::ApiGatewayV2(context) => {
                let authorizer = context.authorizer.as_ref()?;
                let route = context.route_key.clone().filter(|route| route != "$default");
                if let Some(jwt) = &authorizer.jwt {
                    token(&jwt.claims, jwt.scopes.iter().flatten().cloned())
                } else if !authorizer.fields.is_empty() {
                    lambda_authorizer(&authorizer.fields, false)
                } else {
                    let iam = authorizer.iam.as_ref()?;
                    match iam
                        .cognito_identity
                        .as_ref()
                        .and_then(|cognito| cognito.identity_id.as_deref())
                    {
                        Some(identity) => {
                            let pool = iam
                                .cognito_identity
                                .as_ref()
                                .and_then(|c| c.identity_pool_id.as_deref());
                            identity_pool(pool, identity, route)
                        }
                        None => iam_principal(iam.account_id.as_deref(), iam.user_arn.as_deref()?, route),
                    }
                }
            }
            RequestContext::ApiGatewayV1(context) => {
                let route = context
                    .resource_path
                    .as_ref()
                    .map(|resource| format!("{} {resource}", context.http_method));
                let fields = &context.authorizer.fields;
                if let Some(jwt) = &context.authorizer.jwt {
                    token(&jwt.claims, jwt.scopes.iter().flatten().cloned())
                } else if let Some(Value::Object(claims)) = fields.get("claims") {
                    // A REST API's Cognito authorizer: the token's claims, as strings.
                    claims_caller(claims.iter(), None)
                } else if let Some(Value::Object(jwt)) = fields.get("jwt") {
                    // An HTTP API's JWT authorizer, payload format 1.0.
                    let Some(Value::Object(claims)) = jwt.get("claims") else {
                        return None;
                    };
                    let scopes = jwt.get("scopes").and_then(Value::as_array).into_iter().flatten();
                    let mut caller = claims_caller(claims.iter(), None)?;
                    if let Scopes::Granted(granted) = &mut caller.scopes {
                        granted.extend(scopes.filter_map(text));
                    }
                    Some(caller)
                } else if let Some(Value::Object(lambda)) = fields.get("lambda") {
                    // An HTTP API's Lambda authorizer, payload format 1.0.
                    let context: HashMap<String, Value> = lambda.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    lambda_authorizer(&context, false)
                } else if !fields.is_empty() {
                    lambda_authorizer(fields, true)
                } else {
                    // Only IAM authorization fills the caller's ARN in.
                    let identity = &context.identity;
                    match identity.cognito_identity_id.as_deref() {
                        Some(id) => identity_pool(identity.cognito_identity_pool_id.as_deref(), id, route),
                        None => iam_principal(identity.account_id.as_deref(), identity.user_arn.as_deref()?, route),
                    }
                }
            }
            _ => None,
        }?;
        (!caller.subject.is_empty() && caller.subject != Caller::DEVELOPMENT).then_some(caller)
    }

    fn text(value: &Value) -> Option<String> {
        match value {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) => Some(number.to_string()),
            Value::Bool(flag) => Some(flag.to_string()),
            _ => None,
        }
    }

    /// The caller `subject` of `issuer` (none where empty), granted `scopes`; no caller
    /// for an issuer with white space in it, which would make two callers' ids alike.
    fn granted(issuer: Option<String>, subject: String, scopes: BTreeSet<String>) -> Option<Caller> {
        let issuer = issuer.filter(|issuer| !issuer.is_empty()).unwrap_or_default();
        if issuer.chars().any(char::is_whitespace) {
            return None;
        }
        Some(Caller::verified(issuer, subject).with(Scopes::Granted(scopes)))
    }

    /// A token's claims as an HTTP API's JWT authorizer hands them over (strings), with
    /// the scopes it lists beside them; the `scope` claim's scopes too.
    fn token(claims: &HashMap<String, String>, listed: impl Iterator<Item = String>) -> Option<Caller> {
        let mut scopes: BTreeSet<String> = listed.collect();
        scopes.extend(
            claims
                .get("scope")
                .into_iter()
                .flat_map(|scope| scope.split_whitespace())
                .map(str::to_owned),
        );
        granted(claims.get("iss").cloned(), claims.get("sub")?.clone(), scopes)
    }

    /// Claims or a context as JSON: `sub`, `iss` (else `default_issuer`), `scope`
    /// (space-separated) or `scopes` (a list).
    fn claims_caller<'a>(
        claims: impl Iterator<Item = (&'a String, &'a Value)>,
        default_issuer: Option<&str>,
    ) -> Option<Caller> {
        let (mut issuer, mut subject, mut scopes) = (None, None, BTreeSet::new());
        for (name, value) in claims {
            match (name.as_str(), value) {
                ("sub", value) => subject = text(value),
                ("iss", value) => issuer = text(value).filter(|issuer| !issuer.is_empty()),
                ("scope", value) => {
                    scopes.extend(text(value).iter().flat_map(|s| s.split_whitespace()).map(str::to_owned))
                }
                ("scopes", Value::Array(list)) => scopes.extend(list.iter().filter_map(text)),
                _ => {}
            }
        }
        let issuer = match default_issuer {
            // A Lambda authorizer's issuer, in a namespace of its own.
            Some(default) => Some(issuer.map_or_else(|| default.to_owned(), |issuer| format!("lambda:{issuer}"))),
            None => issuer,
        };
        granted(issuer, subject?, scopes)
    }

    /// A Lambda authorizer's context: its `sub`, else (REST) its `principalId`.
    fn lambda_authorizer(fields: &HashMap<String, Value>, rest: bool) -> Option<Caller> {
        let principal = (rest && !fields.contains_key("sub"))
            .then(|| fields.get("principalId"))
            .flatten()
            .map(|principal| ("sub".to_owned(), principal.clone()));
        let principal = principal.as_ref().map(|(name, value)| (name, value));
        claims_caller(fields.iter().chain(principal), Some(LAMBDA_AUTHORIZER))
    }

    /// IAM: the caller's ARN, an assumed role's session left out, of `iam:<account>`. A
    /// session's name is whatever the one who assumed the role chose, so it names no one:
    /// every session of a role is one caller.
    fn iam_principal(account: Option<&str>, arn: &str, route: Option<String>) -> Option<Caller> {
        let subject = match arn.split_once(":assumed-role/") {
            Some((prefix, rest)) => match rest.split_once('/') {
                Some((role, _session)) => format!("{prefix}:assumed-role/{role}"),
                None => arn.to_owned(),
            },
            None => arn.to_owned(),
        };
        let account = account.unwrap_or_default();
        Some(Caller::verified(format!("iam:{account}"), subject).with(Scopes::Route(route)))
    }

    /// IAM with a Cognito identity pool's credentials: the identity Cognito verified,
    /// whose role every user of the pool shares.
    fn identity_pool(pool: Option<&str>, identity: &str, route: Option<String>) -> Option<Caller> {
        let pool = pool.unwrap_or_default();
        Some(Caller::verified(format!("cognito-identity:{pool}"), identity).with(Scopes::Route(route)))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let caller = Self::required(&parts.extensions)?;
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

    #[test]
    fn one_subject_of_two_issuers_is_two_callers() {
        let (one, other) = (Caller::verified("https://a", "42"), Caller::verified("https://b", "42"));
        assert_ne!(one.id(), other.id());
        assert_ne!(one.key_scope("api"), other.key_scope("api"));
        assert_eq!((one.issuer(), one.subject()), ("https://a", "42"));
    }

    #[test]
    fn only_the_development_caller_has_every_scope() {
        assert!(Caller::development().has_scope("orders/write"));
        assert!(!Caller::new("a").has_scope("orders/read"));
        let reader = Caller::new("a").with_scopes(["orders/read"]);
        assert!(reader.has_scope("orders/read") && !reader.has_scope("orders/write"));
        assert!(!Caller::new("a")
            .with(Scopes::Route(Some("POST /orders".into())))
            .has_scope("orders/write"));
    }
}
