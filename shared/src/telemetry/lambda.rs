//! A Lambda function's runtime loop with its spans flushed after each invocation: after
//! the response is posted and before the runtime asks for the next event, so that the
//! environment never freezes with spans buffered, and no answer waits for the export.

use std::fmt;
use std::future::Future;

use lambda_runtime::{Diagnostic, LambdaEvent, Service};
use serde::{Deserialize, Serialize};

/// Runs `handler` as `lambda_runtime::run` does (with the runtime's own tracing layer);
/// with feature `otel` and export on, each invocation is a span (`faas.*` attributes,
/// `lambda_runtime`'s OpenTelemetry layer) and the exporter is flushed after each one.
pub async fn run<A, R, F>(handler: F) -> Result<(), lambda_runtime::Error>
where
    F: Service<LambdaEvent<A>, Response = R>,
    F::Future: Future<Output = Result<R, F::Error>>,
    F::Error: Into<Diagnostic> + fmt::Debug,
    A: for<'de> Deserialize<'de>,
    R: Serialize,
{
    let runtime = lambda_runtime::Runtime::new(handler).layer(lambda_runtime::layers::TracingLayer::new());
    #[cfg(feature = "otel")]
    if super::export::enabled() {
        use lambda_runtime::layers::{OpenTelemetryFaasTrigger, OpenTelemetryLayer};
        return runtime
            .layer(OpenTelemetryLayer::new(super::export::flush).with_trigger(OpenTelemetryFaasTrigger::PubSub))
            .run()
            .await;
    }
    runtime.run().await
}
