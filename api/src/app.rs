//! The router, built once: routes, fallbacks, and the tower-http layers (request id,
//! tracing, timeout, body limit, CORS, compression, except through a REST API on Lambda).

use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use axum::routing::{delete, get, post};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use outbox::http::{enforce_deadline, Authentication, Deadlines, RequireScope, UncompressedThroughRestApiLayer};

use crate::error::ApiError;
use crate::orders::handlers;
use crate::state::AppState;
use crate::{openapi, transactions};

/// How the HTTP layer behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// How long a request may take (keep it below the commit window); on Lambda the
    /// invocation's deadline may end it sooner. See [`outbox::http::scope`].
    pub timeout: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Origins allowed by CORS; `*` allows any; empty allows none.
    pub cors_origins: Vec<String>,
    /// What a request without a caller verified by API Gateway's authorizer gets: 401,
    /// or the development caller ([`outbox::http::caller`]).
    pub authentication: Authentication,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            cors_origins: Vec::new(),
            authentication: Authentication::Off,
        }
    }
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

fn cors(origins: &[String]) -> CorsLayer {
    let layer = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            axum::http::header::AUTHORIZATION,
            axum::http::header::CONTENT_TYPE,
            axum::http::header::IF_MATCH,
            HeaderName::from_static("idempotency-key"),
        ])
        .expose_headers([
            axum::http::header::ETAG,
            axum::http::header::LOCATION,
            REQUEST_ID,
            HeaderName::from_static("x-transaction-id"),
            HeaderName::from_static("x-transaction-item"),
            axum::http::header::LINK,
        ]);
    if origins.iter().any(|origin| origin == "*") {
        layer.allow_origin(AllowOrigin::any())
    } else {
        layer.allow_origin(
            origins
                .iter()
                .filter_map(|origin| HeaderValue::from_str(origin).ok())
                .collect::<Vec<_>>(),
        )
    }
}

/// Records the route the request matched (`/orders/{id}`) in the request's span, which
/// the trace layer opened before routing.
async fn record_route(request: Request<axum::body::Body>, next: axum::middleware::Next) -> axum::response::Response {
    if let Some(route) = request.extensions().get::<axum::extract::MatchedPath>() {
        tracing::Span::current().record("route", route.as_str());
    }
    next.run(request).await
}

/// The application: every route, with its layers.
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    // Each route checks its caller's scope itself, as the OpenAPI document states it,
    // whatever front-door route or path brought the request.
    let (read, write) = (
        RequireScope::new(openapi::READ_SCOPE),
        RequireScope::new(openapi::WRITE_SCOPE),
    );
    let routes = Router::new()
        .route("/orders", post(handlers::orders_create).route_layer(write.clone()))
        .route("/orders/{id}", get(handlers::orders_get).route_layer(read.clone()))
        .route(
            "/orders/{id}/items",
            post(handlers::orders_add_item).route_layer(write.clone()),
        )
        .route(
            "/orders/{id}/items/{sku}",
            delete(handlers::orders_remove_item).route_layer(write.clone()),
        )
        .route("/orders/{id}/cancel", post(handlers::orders_cancel).route_layer(write))
        .route(
            "/transactions/{id}",
            get(transactions::transactions_get).route_layer(read),
        )
        .route("/openapi.json", get(openapi::openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(axum::middleware::from_fn_with_state(
            Deadlines::new(state.outbox.as_ref().clone(), config.timeout).with_status_links("/transactions/{id}"),
            enforce_deadline,
        ))
        .route_layer(axum::middleware::from_fn(record_route))
        .layer(axum::Extension(config.authentication))
        .with_state(state);
    let routes = outbox::http::serve_under_stage(routes);
    routes.layer(
        ServiceBuilder::new()
            // Behind API Gateway, its request id (the access log's), whatever the client
            // sent; elsewhere the client's, or a new one.
            .map_request(|mut request: Request<axum::body::Body>| {
                outbox::http::request_id::prefer_front_door(&REQUEST_ID, &mut request);
                request
            })
            .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
            // A 5xx is logged once, with its cause, where it is answered
            // (`outbox::http::problem::respond`): not again here.
            .layer(TraceLayer::new_for_http().on_failure(()).make_span_with(|request: &Request<_>| {
                let request_id = request.extensions().get::<RequestId>().and_then(|id| id.header_value().to_str().ok()).unwrap_or("");
                let span = tracing::info_span!("request", request_id = %request_id, method = %request.method(), path = %request.uri().path(), route = tracing::field::Empty, caller = tracing::field::Empty);
                // The caller's trace (traceparent, or X-Ray's header), which the
                // transaction and every message it commits carry on.
                outbox::http::trace::continue_request(&span, request);
                span
            }))
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            // A REST API would hand a compressed answer to the client as base64 text: it
            // gets a plain one, and compresses it itself (`MinimumCompressionSize`).
            .layer(UncompressedThroughRestApiLayer)
            .layer(CompressionLayer::new())
            .layer(cors(&config.cors_origins))
            .layer(DefaultBodyLimit::max(config.max_body_bytes)),
    )
}
