//! A Lambda function's runtime loop, `lambda_runtime::run_concurrent`: several invocations
//! at once on Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY` above 1), one at a
//! time elsewhere; with each invocation's spans flushed after it. On Lambda (default), that
//! is after the response is posted and before the runtime asks for the next event, so that
//! the environment never freezes with spans buffered, and no answer waits for the export;
//! on Managed Instances, whose environments are never frozen, on a task of its own, so
//! that no invocation waits for the export either. Each invocation runs in the scope of
//! its own X-Ray trace header ([`crate::aws::InvocationTrace`]), which `lambda_runtime`
//! does not put in the process's environment when several run at once.

use std::fmt;
use std::future::Future;

use lambda_runtime::{Diagnostic, LambdaEvent, Service};
use serde::{Deserialize, Serialize};

/// Runs `handler` as `lambda_runtime::run_concurrent` does (with the runtime's own tracing
/// layer), each invocation on a clone of it: several at once on Lambda Managed Instances,
/// one at a time elsewhere. With feature `otel` and export on, each invocation is a span
/// (`faas.*` attributes, as `lambda_runtime`'s OpenTelemetry layer makes it) and the
/// exporter is flushed after each one.
pub async fn run<A, R, F>(handler: F) -> Result<(), lambda_runtime::Error>
where
    F: Service<LambdaEvent<A>, Response = R> + Clone + Send + 'static,
    F::Future: Future<Output = Result<R, F::Error>> + Send + 'static,
    F::Error: Into<Diagnostic> + fmt::Debug,
    A: for<'de> Deserialize<'de> + Send + 'static,
    R: Serialize + Send + 'static,
{
    let runtime = lambda_runtime::Runtime::new(handler)
        .layer(lambda_runtime::layers::TracingLayer::new())
        .layer(traces::InvocationTraces);
    #[cfg(feature = "otel")]
    if super::export::enabled() {
        return runtime
            .layer(spans::InvocationSpans::new(frozen_between_invocations()))
            .run_concurrent()
            .await;
    }
    runtime.run_concurrent().await
}

/// Each invocation in the scope of the X-Ray trace header Lambda gave it, so that the
/// control messages its handler sends carry it ([`crate::aws::InvocationTrace`]).
mod traces {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use lambda_runtime::tower::Layer;
    use lambda_runtime::{LambdaInvocation, Service};

    use crate::aws::InvocationTrace;

    /// The layer.
    pub(super) struct InvocationTraces;

    impl<S> Layer<S> for InvocationTraces {
        type Service = Scoped<S>;

        fn layer(&self, inner: S) -> Scoped<S> {
            Scoped(inner)
        }
    }

    /// The runtime's service, each invocation in its trace header's scope.
    #[derive(Clone)]
    pub(super) struct Scoped<S>(S);

    impl<S> Service<LambdaInvocation> for Scoped<S>
    where
        S: Service<LambdaInvocation, Response = ()>,
        S::Future: Send + 'static,
    {
        type Response = ();
        type Error = S::Error;
        type Future = Pin<Box<dyn Future<Output = Result<(), S::Error>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, invocation: LambdaInvocation) -> Self::Future {
            let trace = InvocationTrace::new(invocation.context.xray_trace_id.as_deref());
            // In scope both while the handler's future is made and while it runs.
            let future = trace.clone().sync_scope(|| self.0.call(invocation));
            Box::pin(trace.scope(future))
        }
    }
}

/// Whether Lambda may freeze this environment between invocations: not on Lambda Managed
/// Instances (`AWS_LAMBDA_INITIALIZATION_TYPE=lambda-managed-instances`), the only place
/// `AWS_LAMBDA_MAX_CONCURRENCY` can be above 1.
#[cfg(feature = "otel")]
fn frozen_between_invocations() -> bool {
    let managed = std::env::var("AWS_LAMBDA_INITIALIZATION_TYPE").is_ok_and(|kind| kind == "lambda-managed-instances");
    let concurrent = std::env::var("AWS_LAMBDA_MAX_CONCURRENCY")
        .ok()
        .and_then(|value| value.trim().parse::<u32>().ok())
        .is_some_and(|concurrency| concurrency > 1);
    !managed && !concurrent
}

/// Each invocation a span, flushed after it. `lambda_runtime`'s own OpenTelemetry layer
/// makes the same span but its service is not `Clone`, which `run_concurrent` needs.
#[cfg(feature = "otel")]
mod spans {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use lambda_runtime::tower::Layer;
    use lambda_runtime::{LambdaInvocation, Service};
    use tracing::Instrument;

    use crate::telemetry::export::flush_blocking;

    /// The layer: whether the environment may freeze between invocations.
    pub(super) struct InvocationSpans {
        frozen_between: bool,
    }

    impl InvocationSpans {
        pub(super) fn new(frozen_between: bool) -> Self {
            Self { frozen_between }
        }
    }

    impl<S> Layer<S> for InvocationSpans {
        type Service = Spanned<S>;

        fn layer(&self, inner: S) -> Spanned<S> {
            Spanned {
                inner,
                cold: Arc::new(AtomicBool::new(true)),
                frozen_between: self.frozen_between,
            }
        }
    }

    /// The runtime's service, each invocation in its span. Clones (one per concurrent
    /// worker) share whether the environment's first invocation is still to come.
    #[derive(Clone)]
    pub(super) struct Spanned<S> {
        inner: S,
        cold: Arc<AtomicBool>,
        frozen_between: bool,
    }

    impl<S> Service<LambdaInvocation> for Spanned<S>
    where
        S: Service<LambdaInvocation, Response = ()>,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        type Response = ();
        type Error = S::Error;
        type Future = Pin<Box<dyn Future<Output = Result<(), S::Error>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, invocation: LambdaInvocation) -> Self::Future {
            let context = &invocation.context;
            let span = tracing::info_span!(
                "Lambda function invocation",
                "otel.name" = %context.env_config.function_name,
                "faas.name" = %context.env_config.function_name,
                "faas.trigger" = "pubsub",
                "faas.invocation_id" = %context.request_id,
                "faas.coldstart" = self.cold.swap(false, Ordering::Relaxed),
            );
            let future = {
                // Entered while the handler's future is made, so that spans made then
                // are its children too.
                let _entered = span.enter();
                self.inner.call(invocation)
            };
            let frozen_between = self.frozen_between;
            Box::pin(async move {
                // The span ends with the invocation, before the flush that sends it.
                let result = future.instrument(span).await;
                if frozen_between {
                    flush_blocking().await;
                } else {
                    tokio::spawn(flush_blocking());
                }
                result
            })
        }
    }
}
