//! Compressed answers on Lambda, by front door: a REST API would hand a compressed answer
//! to the client as base64 text, so a request that came through one is answered plain.
//!
//! `lambda_http` returns a body with a `Content-Encoding` as binary: base64, with
//! `isBase64Encoded: true`. An HTTP API, a function URL and an ALB decode it, and the
//! client gets the gzip it asked for. A REST API's Lambda proxy integration decodes it only
//! when the API's binary media types match the request's first `Accept`; otherwise the
//! client gets the base64 text under `Content-Encoding: gzip`, which it cannot read (AWS,
//! "Binary media types for REST APIs in API Gateway"). A REST API compresses answers
//! itself once its `MinimumCompressionSize` is set.
//!
//! [`UncompressedThroughRestApiLayer`], placed outside the compression layer (tower-http's
//! `CompressionLayer`), shows that layer `Accept-Encoding: identity` on a request that came
//! through a REST API (a v1 proxy event), so that its answer goes out plain; every other
//! request, on Lambda or not, passes unchanged.

use std::task::{Context, Poll};

use axum::http::header::ACCEPT_ENCODING;
use axum::http::{HeaderValue, Request};
use lambda_http::request::RequestContext;
use lambda_http::tower::{Layer, Service};

/// Whether the front door `request` came through decodes a base64 answer for the client:
/// false for a REST API (a v1 proxy event), true for an HTTP API, a function URL, an ALB,
/// and a request that did not come through `lambda_http`.
pub fn front_door_decodes_base64<B>(request: &Request<B>) -> bool {
    !matches!(
        request.extensions().get::<RequestContext>(),
        Some(RequestContext::ApiGatewayV1(_))
    )
}

/// The layer of [`UncompressedThroughRestApi`]: put it outside the compression layer (in
/// a `ServiceBuilder`, before it).
#[derive(Debug, Clone, Copy, Default)]
pub struct UncompressedThroughRestApiLayer;

impl<S> Layer<S> for UncompressedThroughRestApiLayer {
    type Service = UncompressedThroughRestApi<S>;

    fn layer(&self, inner: S) -> Self::Service {
        UncompressedThroughRestApi { inner }
    }
}

/// `inner`, asked for an uncompressed answer (`Accept-Encoding: identity`) when the request
/// came through a REST API (see the module's documentation).
#[derive(Debug, Clone)]
pub struct UncompressedThroughRestApi<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for UncompressedThroughRestApi<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if !front_door_decodes_base64(&request) {
            request
                .headers_mut()
                .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use lambda_http::tower::ServiceExt;

    use super::*;

    async fn accepted(context: Option<RequestContext>) -> String {
        let mut request = Request::builder().header(ACCEPT_ENCODING, "gzip, deflate");
        if let Some(context) = context {
            request = request.extension(context);
        }
        let echo = lambda_http::service_fn(|request: Request<()>| async move {
            Ok::<_, Infallible>(request.headers()[ACCEPT_ENCODING].to_str().unwrap().to_owned())
        });
        UncompressedThroughRestApiLayer
            .layer(echo)
            .oneshot(request.body(()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn only_a_rest_api_request_is_asked_for_a_plain_answer() {
        assert_eq!(
            accepted(Some(RequestContext::ApiGatewayV1(Default::default()))).await,
            "identity"
        );
        assert_eq!(
            accepted(Some(RequestContext::ApiGatewayV2(Default::default()))).await,
            "gzip, deflate"
        );
        assert_eq!(
            accepted(Some(RequestContext::Alb(Default::default()))).await,
            "gzip, deflate"
        );
        assert_eq!(accepted(None).await, "gzip, deflate");
    }
}
