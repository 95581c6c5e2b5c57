//! Exporting spans over OTLP/HTTP (protobuf), as the standard `OTEL_*` variables say
//! (feature `otel`); installed by `outbox::logging::init`.
//!
//! - **On** when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is
//!   set, or `OTEL_TRACES_EXPORTER=otlp` (to the default `http://localhost:4318`, where the
//!   ADOT collector Lambda layer listens). **Off** otherwise, and whenever
//!   `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`: no layer, no span ids,
//!   nothing exported, nothing paid.
//! - The exporter reads the endpoint, headers and timeout variables itself;
//!   `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the service (default: the
//!   Lambda function's name, else the executable's); `OTEL_BSP_*` tune the batch
//!   processor. Only `http/protobuf` is built in: another `OTEL_EXPORTER_OTLP_PROTOCOL` is
//!   reported and ignored.
//! - Spans are batched on the processor's own thread. [`flush`] sends what is buffered:
//!   on Lambda after each invocation, before the environment may freeze
//!   (`outbox::http::lambda::run`, [`crate::consumer::lambda`], the control worker's
//!   handler); [`shutdown`] at a process's end.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// What the environment asks of the exporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSettings {
    /// Whether spans are exported at all.
    pub enabled: bool,
    /// `service.name` when `OTEL_SERVICE_NAME` does not set it.
    pub default_service_name: Option<String>,
    /// An `OTEL_EXPORTER_OTLP_PROTOCOL` other than `http/protobuf`, reported and ignored.
    pub ignored_protocol: Option<String>,
}

impl ExportSettings {
    /// What `lookup` (a variable's value, or `None`) asks for; `executable` names the
    /// service when neither `OTEL_SERVICE_NAME` nor a Lambda function's name does.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, executable: Option<String>) -> Self {
        let set = |name: &str| {
            lookup(name)
                .map(|value| value.trim().to_owned())
                .filter(|value| !value.is_empty())
        };
        let disabled = set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"));
        let exporter = set("OTEL_TRACES_EXPORTER").map(|value| value.to_ascii_lowercase());
        let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let enabled = !disabled
            && match exporter.as_deref() {
                Some("otlp") => true,
                Some(_) => false,
                None => endpoint.is_some(),
            };
        let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
        Self {
            enabled,
            default_service_name: match set("OTEL_SERVICE_NAME") {
                Some(_) => None,
                None => set("AWS_LAMBDA_FUNCTION_NAME").or(executable),
            },
            ignored_protocol: protocol.filter(|protocol| protocol != "http/protobuf"),
        }
    }
}

/// The layer that makes `tracing` spans OpenTelemetry spans and exports them, if the
/// environment turns export on (its spans at level INFO and above, whatever `RUST_LOG`
/// keeps for the logs). `None` when off, or when the exporter cannot be built (said on
/// standard error: logging is not up yet).
pub fn layer<S>() -> Option<impl Layer<S>>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let executable = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|stem| stem.to_string_lossy().into_owned()));
    let settings = ExportSettings::from_lookup(|name| std::env::var(name).ok(), executable);
    if !settings.enabled {
        return None;
    }
    if let Some(protocol) = &settings.ignored_protocol {
        eprintln!("OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: only http/protobuf is built in; exporting with it");
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
    {
        Ok(exporter) => exporter,
        Err(error) => {
            eprintln!("traces are not exported: the OTLP exporter could not be built: {error}");
            return None;
        }
    };
    let mut resource = Resource::builder();
    if let Some(name) = settings.default_service_name {
        resource = resource.with_service_name(name);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("outbox");
    let _ = PROVIDER.set(provider);
    Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_filter(LevelFilter::INFO),
    )
}

/// Whether spans are being exported.
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// Sends every span ended so far and waits for the collector's answer (bounded by the
/// exporter's timeout). Blocking: from async code, call it on a blocking thread
/// ([`flush_blocking`]). Nothing when export is off.
pub fn flush() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(error) = provider.force_flush() {
            eprintln!("traces: flush failed: {error}");
        }
    }
}

/// [`flush`] from async code, on a blocking thread; returns when it is done.
pub async fn flush_blocking() {
    if enabled() {
        let _ = tokio::task::spawn_blocking(flush).await;
    }
}

/// Flushes and stops the exporter, waiting at most `timeout`: at a process's end.
pub fn shutdown(timeout: Duration) {
    if let Some(provider) = PROVIDER.get() {
        if let Err(error) = provider.shutdown_with_timeout(timeout) {
            eprintln!("traces: shutdown failed: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> ExportSettings {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ExportSettings::from_lookup(|name| map.get(name).cloned(), Some("api".into()))
    }

    #[test]
    fn export_is_on_only_where_the_otel_variables_ask_for_it() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(!settings(&[]).enabled, "nothing set: off");
        assert!(settings(&[endpoint]).enabled);
        assert!(settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x:4318/v1/traces")]).enabled);
        assert!(
            settings(&[("OTEL_TRACES_EXPORTER", "otlp")]).enabled,
            "the default endpoint"
        );
        assert!(!settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).enabled);
        assert!(!settings(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]).enabled);
        assert!(settings(&[endpoint, ("OTEL_SDK_DISABLED", "false")]).enabled);
        assert!(
            !settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).enabled,
            "blank is unset"
        );
    }

    #[test]
    fn the_service_is_named_by_otel_then_lambda_then_the_executable() {
        assert_eq!(settings(&[]).default_service_name.as_deref(), Some("api"));
        assert_eq!(
            settings(&[("AWS_LAMBDA_FUNCTION_NAME", "outbox-Api-1")])
                .default_service_name
                .as_deref(),
            Some("outbox-Api-1")
        );
        assert_eq!(
            settings(&[("OTEL_SERVICE_NAME", "orders")]).default_service_name,
            None,
            "left to the SDK"
        );
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
                .ignored_protocol
                .as_deref(),
            Some("grpc")
        );
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).ignored_protocol,
            None
        );
    }
}
