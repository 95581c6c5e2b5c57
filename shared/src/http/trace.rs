//! The trace an HTTP request continues: its W3C `traceparent` (with `tracestate`), else
//! the X-Ray header API Gateway adds (`X-Amzn-Trace-Id`), else, on Lambda, the
//! invocation's (feature `lambda`). The request's span becomes a child of it, so that the
//! transaction, its control message and every message it commits carry that trace.

use axum::http::{HeaderMap, Request};

use crate::protocol::TraceContext;
#[cfg(test)]
use crate::protocol::{TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE};

/// X-Ray's trace header on an HTTP request (API Gateway and ALB add it).
pub const XRAY_HEADER: &str = "x-amzn-trace-id";

/// The trace context `headers` carry: `traceparent` (and `tracestate`), else
/// `X-Amzn-Trace-Id` when it names a parent span. An invalid one is ignored.
pub fn from_headers(headers: &HeaderMap) -> Option<TraceContext> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    TraceContext::from_message(header, header(XRAY_HEADER))
}

/// The trace context of `request`: its headers' ([`from_headers`]), else (feature
/// `lambda`) the Lambda invocation's X-Ray trace.
pub fn of_request<B>(request: &Request<B>) -> Option<TraceContext> {
    let found = from_headers(request.headers());
    #[cfg(feature = "lambda")]
    let found = found.or_else(|| {
        request
            .extensions()
            .get::<lambda_http::Context>()
            .and_then(|context| context.xray_trace_id.as_deref())
            .and_then(|header| TraceContext::from_xray(header).ok())
    });
    found
}

/// Makes `span` (the request's, before it is entered) a child of the trace `request`
/// continues, if any ([`crate::telemetry::continue_from`]).
pub fn continue_request<B>(span: &tracing::Span, request: &Request<B>) {
    if let Some(parent) = of_request(request) {
        crate::telemetry::continue_from(span, &parent);
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_traceparent_wins_over_the_xray_header_and_bad_ones_are_ignored() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers), None);
        headers.insert(
            XRAY_HEADER,
            HeaderValue::from_static("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"),
        );
        assert_eq!(
            from_headers(&headers).unwrap().traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        headers.insert(TRACEPARENT_ATTRIBUTE, HeaderValue::from_static(PARENT));
        headers.insert(TRACESTATE_ATTRIBUTE, HeaderValue::from_static("congo=t61rcWkgMzE"));
        let read = from_headers(&headers).unwrap();
        assert_eq!(
            (read.traceparent().as_str(), read.tracestate()),
            (PARENT, Some("congo=t61rcWkgMzE"))
        );
        headers.insert(TRACEPARENT_ATTRIBUTE, HeaderValue::from_static("garbage"));
        assert_eq!(
            from_headers(&headers).unwrap().trace_id()[0],
            0x57,
            "the X-Ray header, then"
        );
        headers.remove(XRAY_HEADER);
        assert_eq!(from_headers(&headers), None);
    }
}
