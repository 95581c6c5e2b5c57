//! Problem+json for what no route serves: a path no route matches (404) and a method its
//! routes do not take (405, with the router's `Allow`), which the router answers with an
//! empty body. An answer with a body of its own (a route's, the application's own
//! fallback's) is left as it is.

use axum::extract::Request;
use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;

/// The middleware: install it with `.layer(axum::middleware::from_fn(problem_for_unrouted))`
/// (`outbox::service` does).
pub async fn problem_for_unrouted(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    let status = response.status();
    if !matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED)
        || response.headers().contains_key(CONTENT_TYPE)
    {
        return response;
    }
    let problem = if status == StatusCode::NOT_FOUND {
        Problem::new(status, "not-found", "Not found").with_detail(format!("no route serves {method} {path}"))
    } else {
        Problem::new(status, "method-not-allowed", "Method not allowed")
            .with_detail(format!("{path} does not take {method}"))
    };
    let allow = response.headers().get(ALLOW).cloned();
    let mut answer = problem.into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(ALLOW, allow);
    }
    answer
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, Option<String>, serde_json::Value) {
        let request = Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let (status, allow) = (
            response.status(),
            response
                .headers()
                .get(ALLOW)
                .map(|allow| allow.to_str().unwrap().to_owned()),
        );
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        if !body.is_empty() {
            assert_eq!(content_type.unwrap(), "application/problem+json");
        }
        (status, allow, serde_json::from_slice(&body).unwrap_or_default())
    }

    /// A path no route serves and a method a path does not take answer problem+json; a
    /// route's own 404 with a body stays as it is.
    #[tokio::test]
    async fn unrouted_paths_and_methods_answer_problem_json() {
        let app = Router::new()
            .route("/things", get(|| async { "things" }))
            .route("/gone", get(|| async { (StatusCode::NOT_FOUND, "gone, and says so") }))
            .layer(axum::middleware::from_fn(problem_for_unrouted));
        let (status, _, body) = call(&app, "GET", "/nothing").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["type"], "/problems/not-found");
        assert_eq!(body["detail"], "no route serves GET /nothing");
        let (status, allow, body) = call(&app, "DELETE", "/things").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(body["type"], "/problems/method-not-allowed");
        assert_eq!(allow.as_deref(), Some("GET,HEAD"));
        let request = Request::builder().uri("/gone").body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"gone, and says so");
    }
}
