//! API Gateway's stage in the path, both ways: routes match whatever the stage, and a
//! `Location` the service answers with works for the client.
//!
//! `lambda_http` puts the stage in front of every path of an API Gateway event whose stage
//! is not `$default` (`/prod/orders` for a REST API's stage `prod`), whether or not the
//! client's URL had it: a router with `/orders` answers 404 to everything. And an answer's
//! `Location: /orders/1` sends a client of `https://…/prod/orders` to a path without its
//! stage. [`serve_under_stage`] wraps a router so that the stage is taken off the path
//! before routing (and off `OriginalUri`), and what the client's URL had before the route
//! (the stage, on the default endpoint) is put back in front of a `Location` that is an
//! absolute path, and of each `Link` to one (a transaction's status).
//!
//! Not handled: a custom domain's base path mapping (API Gateway leaves it in the path, so
//! the routes must include it), and `AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH` (nothing is
//! stripped then, and `Location` gets no prefix).

use axum::extract::Request;
use axum::http::header::{LINK, LOCATION};
use axum::http::{HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use lambda_http::request::RequestContext;
use lambda_http::RequestExt;

/// `router`, served under API Gateway's stage (see the module's documentation). Requests
/// that did not come through API Gateway pass unchanged.
///
/// Paths the front door and the function could route apart are refused first
/// ([`super::paths`]).
pub fn serve_under_stage(router: Router) -> Router {
    Router::new()
        .fallback_service(router)
        .layer(axum::middleware::from_fn(strip_stage))
        .layer(axum::middleware::from_fn(super::paths::refuse_ambiguous_paths))
}

/// What to take off the path before routing, and what the client's URL had before the
/// route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct StagePaths {
    /// `/prod`: `lambda_http` put it in front of the path.
    strip: String,
    /// What the client's URL had before the route: put in front of a `Location`.
    client_prefix: String,
}

fn stage_paths(request: &Request) -> Option<StagePaths> {
    let (stage, client_path) = match request.extensions().get::<RequestContext>()? {
        RequestContext::ApiGatewayV1(context) => (context.stage.clone()?, context.path.clone()),
        RequestContext::ApiGatewayV2(context) => (
            context.stage.clone()?,
            Some(request.raw_http_path().to_owned()).filter(|raw| !raw.is_empty()),
        ),
        _ => return None,
    };
    if stage == "$default" {
        return None;
    }
    let strip = format!("/{stage}");
    let path = request.uri().path();
    // Without the stage (AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH), the path routes as it is.
    let route = match path.strip_prefix(&strip) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => return None,
    };
    let route = if route.is_empty() { "/" } else { route };
    // The client's path ends with the route; what comes before it is the client's.
    let client_prefix = client_path
        .as_deref()
        .and_then(|client| client.strip_suffix(route))
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_owned();
    Some(StagePaths { strip, client_prefix })
}

fn without_prefix(uri: &Uri, prefix: &str) -> Option<Uri> {
    let path_and_query = uri.path_and_query()?.as_str();
    let rest = path_and_query.strip_prefix(prefix)?;
    let rest = if rest.is_empty() || rest.starts_with('?') {
        format!("/{rest}")
    } else {
        rest.to_owned()
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(rest.parse().ok()?);
    Uri::from_parts(parts).ok()
}

async fn strip_stage(mut request: Request, next: Next) -> Response {
    let Some(paths) = stage_paths(&request) else {
        return next.run(request).await;
    };
    if let Some(uri) = without_prefix(request.uri(), &paths.strip) {
        // What the handlers see as the request's URI (idempotency fingerprints, say) is
        // the same whichever front door it came through.
        request.extensions_mut().insert(axum::extract::OriginalUri(uri.clone()));
        *request.uri_mut() = uri;
    }
    let mut response = next.run(request).await;
    if paths.client_prefix.is_empty() {
        return response;
    }
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|value| value.to_str().ok())
        .filter(|location| location.starts_with('/') && !location.starts_with("//"))
        .map(|location| format!("{}{location}", paths.client_prefix));
    if let Some(value) = location.and_then(|location| HeaderValue::from_str(&location).ok()) {
        response.headers_mut().insert(LOCATION, value);
    }
    // Links to absolute paths (a transaction's status) get the same prefix.
    let links: Vec<HeaderValue> = response
        .headers()
        .get_all(LINK)
        .iter()
        .map(|value| match value.to_str() {
            Ok(link) if link.starts_with("</") && !link.starts_with("<//") => {
                HeaderValue::from_str(&format!("<{}{}", paths.client_prefix, &link[1..]))
                    .unwrap_or_else(|_| value.clone())
            }
            _ => value.clone(),
        })
        .collect();
    if !links.is_empty() {
        response.headers_mut().remove(LINK);
        for link in links {
            response.headers_mut().append(LINK, link);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_comes_off_the_path_and_its_query_stays() {
        let uri: Uri = "/prod/orders/1?x=1".parse().unwrap();
        assert_eq!(without_prefix(&uri, "/prod").unwrap(), "/orders/1?x=1");
        let uri: Uri = "/prod".parse().unwrap();
        assert_eq!(without_prefix(&uri, "/prod").unwrap(), "/");
        let uri: Uri = "/prod?x=1".parse().unwrap();
        assert_eq!(without_prefix(&uri, "/prod").unwrap(), "/?x=1");
    }
}
