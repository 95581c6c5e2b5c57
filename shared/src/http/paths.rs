//! Paths that the front door and the function could route apart, refused before routing.
//!
//! API Gateway matches a route on the path as the client sent it; `lambda_http` then
//! rebuilds the request's URL with a URL parser, which resolves dot segments, encoded
//! ones included: `/x/%2e%2e/orders` matches no route at API Gateway (a catch-all route
//! would forward it under its own authorization) and reaches the router as `/orders`.
//! Whatever the front door does with such a path, the function does not depend on it:
//! [`refuse_ambiguous_paths`] answers 400 (`ambiguous-path`) to a path, as the front door
//! handed it over, with a segment that is `.` or `..` in any spelling, an encoded slash or
//! backslash (`%2F`, `%5C`), a backslash, a control character (the URL parser drops tabs
//! and line breaks), `?` or `#`; and to any request whose path, once `lambda_http` built
//! its URL (from the `Host` header too), is not the path the front door handed over, less
//! the stage it puts in front. No route of a REST API needs any of them.
//! `outbox::http::lambda::run` and [`super::serve_under_stage`] put it in front of the
//! router; a router served otherwise can add it with `axum::middleware::from_fn`.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lambda_http::request::RequestContext;
use lambda_http::RequestExt;
use percent_encoding::percent_decode_str;

use super::error::HttpError;

/// The middleware: 400 for an ambiguous path (see the module's documentation), else the
/// router's answer.
pub async fn refuse_ambiguous_paths(request: Request, next: Next) -> Response {
    let raw = request.raw_http_path();
    let found = ambiguity(raw)
        .or_else(|| ambiguity(request.uri().path()))
        .or_else(|| rewritten(&request, raw));
    match found {
        Some(detail) => {
            tracing::info!(path = %request.uri().path(), raw_path = %raw.escape_debug(), "an ambiguous path refused: {detail}");
            HttpError::AmbiguousPath { detail }.into_response()
        }
        None => next.run(request).await,
    }
}

/// What makes `path` ambiguous, if anything.
pub fn ambiguity(path: &str) -> Option<&'static str> {
    if path.chars().any(char::is_control) {
        return Some("the path has a control character");
    }
    if path.contains('?') || path.contains('#') {
        return Some("the path has a ? or a #");
    }
    if path.contains('\\') {
        return Some("the path has a backslash");
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") {
        return Some("the path has an encoded slash or backslash");
    }
    let dots = path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    });
    dots.then_some("the path has a dot segment")
}

/// Whether the path the router sees is not `raw`, the one the front door handed over
/// (both percent-decoded, since the URL parser encodes what the front door may hand over
/// decoded), less the stage `lambda_http` puts in front.
fn rewritten(request: &Request, raw: &str) -> Option<&'static str> {
    if raw.is_empty() {
        return None;
    }
    let decoded = |path: &str| percent_decode_str(path).decode_utf8_lossy().into_owned();
    let (routed, raw) = (decoded(request.uri().path()), decoded(raw));
    let stage = match request.extensions().get::<RequestContext>() {
        Some(RequestContext::ApiGatewayV1(context)) => context.stage.clone(),
        Some(RequestContext::ApiGatewayV2(context)) => context.stage.clone(),
        _ => None,
    };
    let staged = stage.map(|stage| format!("/{stage}{raw}"));
    (routed != raw && staged.as_deref() != Some(routed.as_str()))
        .then_some("the path was rewritten on its way to the router")
}

#[cfg(test)]
mod tests {
    use super::ambiguity;

    #[test]
    fn dot_segments_in_every_spelling_and_encoded_slashes_are_ambiguous() {
        for path in [
            "/x/../orders",
            "/x/%2e%2e/orders",
            "/x/%2E%2E/orders",
            "/x/.%2e/orders",
            "/x/%2e./orders",
            "/./orders",
            "/%2e/orders",
            "/orders/..",
            "/orders/a%2Fb/items",
            "/orders/a%2fb",
            "/orders/a%5Cb",
            "/orders\\..\\x",
            "/x/.\t./orders",
            "/x/..\n/orders",
            "/x/\r../orders",
            "/orders#/x",
            "/orders?/x",
        ] {
            assert!(ambiguity(path).is_some(), "{path}");
        }
        for path in [
            "/orders",
            "/orders/1/items/SKU-1",
            "/orders/a.b",
            "/orders/...",
            "/orders/%2e%2e%2e",
            "/",
        ] {
            assert_eq!(ambiguity(path), None, "{path}");
        }
    }
}
