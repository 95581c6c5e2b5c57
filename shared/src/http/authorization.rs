//! What each route needs of its caller, checked by the function itself: a route layer
//! that refuses a caller without the route's scope, whatever path or front-door route
//! brought the request.
//!
//! A front door checks the scopes of the routes it knows, and only those: a catch-all
//! route that forwards everything, or a path that the front door and the function read
//! differently (dot segments, encoded slashes), brings a request to a handler under
//! another route's scope. [`RequireScope`] on each route makes the function the judge:
//!
//! ```
//! use axum::routing::{get, post};
//! use axum::Router;
//! use outbox::http::RequireScope;
//!
//! async fn list() {}
//! async fn place() {}
//!
//! let app: Router = Router::new().route(
//!     "/orders",
//!     get(list).route_layer(RequireScope::new("orders/read"))
//!         .merge(post(place).route_layer(RequireScope::new("orders/write"))),
//! );
//! ```
//!
//! A request is served when its [`Caller`] has the scope ([`Caller::has_scope`]: the
//! development caller has all of them), or, for a caller whose front door authorized the
//! route itself (IAM, [`Scopes::Route`]), when the route the front door authorized is the
//! route being served (`POST /orders/{id}/items`, as API Gateway names it: the route's
//! parameters named as the router names them, no `ANY` method, no greedy `{proxy+}` or
//! catch-all route, no base path of a custom domain). Else 403 (`insufficient-scope`, or
//! `route-not-authorized` for such a caller), or 401 without a caller where the service
//! requires one.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use futures_util::future::{ready, Either, Ready};

use super::caller::{Caller, Scopes};
use super::error::HttpError;

/// The route layer that serves only callers with `scope` (see the module's documentation).
#[derive(Debug, Clone)]
pub struct RequireScope {
    scope: Arc<str>,
}

impl RequireScope {
    /// Serves only callers granted `scope` (`orders/write`).
    pub fn new(scope: impl Into<Arc<str>>) -> Self {
        Self { scope: scope.into() }
    }

    /// The scope it requires.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Whether `request` may be served: `Ok`, or the answer that refuses it.
    pub fn check(&self, request: &Request) -> Result<(), HttpError> {
        let caller = Caller::required(request.extensions())?;
        if caller.has_scope(&self.scope) {
            return Ok(());
        }
        match caller.scopes() {
            Scopes::Route(_) if authorized_route(&caller, request) => Ok(()),
            Scopes::Route(authorized) => Err(HttpError::RouteNotAuthorized {
                authorized: authorized.clone(),
            }),
            _ => Err(HttpError::InsufficientScope {
                scope: self.scope.to_string(),
            }),
        }
    }
}

/// Whether the front door authorized the very route served (IAM's callers).
fn authorized_route(caller: &Caller, request: &Request) -> bool {
    let Scopes::Route(Some(authorized)) = caller.scopes() else {
        return false;
    };
    let Some(served) = request.extensions().get::<MatchedPath>() else {
        return false;
    };
    *authorized == format!("{} {}", request.method(), served.as_str())
}

impl<S> tower::Layer<S> for RequireScope {
    type Service = ScopeChecked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ScopeChecked {
            inner,
            required: self.clone(),
        }
    }
}

/// A route's service behind [`RequireScope`].
#[derive(Debug, Clone)]
pub struct ScopeChecked<S> {
    inner: S,
    required: RequireScope,
}

impl<S> tower::Service<Request> for ScopeChecked<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, Ready<Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.required.check(&request) {
            Ok(()) => Either::Left(self.inner.call(request)),
            Err(refusal) => Either::Right(ready(Ok(refusal.into_response()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;
    use crate::http::Authentication;

    fn app() -> Router {
        Router::new()
            .route(
                "/orders",
                post(|| async { "placed" }).route_layer(RequireScope::new("orders/write")),
            )
            .layer(axum::Extension(Authentication::Jwt))
    }

    async fn status(caller: Option<Caller>) -> u16 {
        let mut request = Request::builder()
            .method("POST")
            .uri("/orders")
            .body(Body::empty())
            .unwrap();
        if let Some(caller) = caller {
            request.extensions_mut().insert(caller);
        }
        app().oneshot(request).await.unwrap().status().as_u16()
    }

    #[tokio::test]
    async fn a_caller_without_the_routes_scope_is_refused() {
        assert_eq!(status(None).await, 401, "no caller");
        assert_eq!(status(Some(Caller::new("a"))).await, 403, "no scope");
        assert_eq!(
            status(Some(Caller::new("a").with_scopes(["orders/read"]))).await,
            403,
            "another scope"
        );
        assert_eq!(status(Some(Caller::new("a").with_scopes(["orders/write"]))).await, 200);
        assert_eq!(status(Some(Caller::development())).await, 200);
    }
}
