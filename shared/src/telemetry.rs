//! Traces across the outbox's hops: the context a span hands to the messages it emits,
//! and the spans that continue it (docs/PROTOCOL.md section 14).
//!
//! With feature `otel`, `tracing` spans are OpenTelemetry spans (through
//! `tracing-opentelemetry`) and [`current`] reads the context of the span in hand;
//! [`continue_from`] makes a span a child of a received context, [`link`] links one.
//! [`export`] sends the spans over OTLP/HTTP as the standard `OTEL_*` variables say.
//! Without the feature (or with export off) spans have no OpenTelemetry context: [`current`]
//! is `None`, messages carry none, and the other calls do nothing.

use crate::protocol::TraceContext;

#[cfg(feature = "otel")]
pub mod export;
#[cfg(any(feature = "consumer", feature = "otel", feature = "worker"))]
pub mod lambda;
#[cfg(all(test, feature = "otel"))]
mod tests;

/// The context of the current span, the one a message emitted now carries: the
/// innermost traced one (a span below the exported level, such as a DEBUG span, passes
/// the context of the traced span entered around it on this thread); `None` when spans are
/// not traced (feature `otel` off, or export off).
pub fn current() -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    {
        of(&tracing::Span::current()).or_else(|| from_otel(&opentelemetry::Context::current()))
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// The context of `span`, `None` when it is not traced (or without feature `otel`).
pub fn of(span: &tracing::Span) -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    {
        of_traced(span)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = span;
        None
    }
}

#[cfg(feature = "otel")]
fn of_traced(span: &tracing::Span) -> Option<TraceContext> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    from_otel(&span.context())
}

/// The span context an OpenTelemetry context holds, if valid.
#[cfg(feature = "otel")]
fn from_otel(context: &opentelemetry::Context) -> Option<TraceContext> {
    use opentelemetry::trace::TraceContextExt;

    let otel_span = context.span();
    let found = otel_span.span_context();
    if !found.is_valid() {
        return None;
    }
    let state = found.trace_state().header();
    TraceContext::new(
        found.trace_id().to_bytes(),
        found.span_id().to_bytes(),
        found.is_sampled(),
    )
    .map(|context| context.with_tracestate(Some(&state)))
}

#[cfg(feature = "otel")]
fn span_context(context: &TraceContext) -> opentelemetry::trace::SpanContext {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    let state = context
        .tracestate()
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    let flags = if context.sampled() {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    SpanContext::new(
        TraceId::from_bytes(context.trace_id()),
        SpanId::from_bytes(context.span_id()),
        flags,
        true,
        state,
    )
}

/// Makes `span` a child of `parent` (a received message's or request's context). Call it
/// before the span is first entered; afterwards, or without feature `otel`, it does
/// nothing.
pub fn continue_from(span: &tracing::Span, parent: &TraceContext) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        let parent = opentelemetry::Context::new().with_remote_span_context(span_context(parent));
        if let Err(error) = span.set_parent(parent) {
            tracing::debug!(%error, "span not continued from its received context");
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, parent);
}

/// Links `span` to `other`: a context it follows from without being its child (a
/// control message's transaction, one message of a batch that mixes traces).
pub fn link(span: &tracing::Span, other: &TraceContext) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.add_link(span_context(other));
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, other);
}

/// Sets attribute `key` of `span` to `value` on the exported span (an outcome known
/// only at the end, such as a duplicate or an adopted run). Without feature `otel`,
/// nothing.
pub fn set_attribute(span: &tracing::Span, key: &'static str, value: String) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.set_attribute(key, value);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, key, value);
}

#[cfg(all(test, feature = "otel"))]
mod span_tests {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    use super::*;

    #[test]
    fn a_span_continued_from_a_context_hands_on_its_trace() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        // The logs keep DEBUG spans, the exported spans stop at INFO (as logging::init).
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::sink)
                    .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
            )
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(provider.tracer("test"))
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            );
        tracing::subscriber::with_default(subscriber, || {
            assert_eq!(current(), None, "no span, no context");
            let parent = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .unwrap()
                .with_tracestate(Some("congo=t61rcWkgMzE"));
            let span = tracing::info_span!("consumed");
            continue_from(&span, &parent);
            let inside = span.in_scope(current).expect("a traced span has a context");
            assert_eq!(inside.trace_id(), parent.trace_id(), "same trace");
            assert_ne!(inside.span_id(), parent.span_id(), "its own span");
            assert_eq!(inside.tracestate(), Some("congo=t61rcWkgMzE"));
            let fresh = tracing::info_span!("unrelated").in_scope(current).unwrap();
            assert_ne!(fresh.trace_id(), parent.trace_id(), "a root span starts its own trace");
            // Below the exported level, the traced parent's context.
            let below = span.in_scope(|| tracing::debug_span!("detail").in_scope(current));
            assert_eq!(below, Some(inside), "the debug span passes its parent's");
        });
    }
}
