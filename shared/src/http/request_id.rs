//! The id of a request, as its front door gave it: behind API Gateway, the `requestId`
//! its access log carries, so that one id finds a request in the access log and in the
//! service's own log; elsewhere a new UUID, unless the client sent one.
//!
//! [`prefer_front_door`] puts that id in the request's id header before a layer that
//! makes ids (`tower_http`'s `SetRequestIdLayer`, which keeps a header it finds) runs.
//! Behind API Gateway (feature `lambda`) it replaces a client's header of the same name,
//! which would otherwise name the request in the service's log differently from the
//! access log, whose id the client cannot choose.

use axum::http::{HeaderName, HeaderValue, Request};

/// The request id API Gateway gave `request` (its context's `requestId`: an HTTP API's or
/// a REST API's), if it came through one (feature `lambda`).
pub fn front_door_id<B>(request: &Request<B>) -> Option<String> {
    #[cfg(feature = "lambda")]
    {
        use lambda_http::request::RequestContext;
        let id = match request.extensions().get::<RequestContext>()? {
            RequestContext::ApiGatewayV2(context) => context.request_id.clone(),
            RequestContext::ApiGatewayV1(context) => context.request_id.clone(),
            _ => None,
        };
        id.filter(|id| !id.is_empty())
    }
    #[cfg(not(feature = "lambda"))]
    {
        let _ = request;
        None
    }
}

/// Sets `header` on `request` to the front door's id, replacing the client's: a
/// middleware step before `SetRequestIdLayer`, which keeps a header it finds.
pub fn prefer_front_door<B>(header: &HeaderName, request: &mut Request<B>) {
    if let Some(value) = front_door_id(request).and_then(|id| HeaderValue::from_str(&id).ok()) {
        request.headers_mut().insert(header.clone(), value);
    }
}
