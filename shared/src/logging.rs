//! One logging set-up for every binary on the outbox (feature `logging`): on Lambda as
//! Lambda's advanced logging controls say, elsewhere readable lines with their time.
//!
//! - **On Lambda** (`AWS_LAMBDA_RUNTIME_API` set): the level is `AWS_LAMBDA_LOG_LEVEL`,
//!   else `RUST_LOG`, else `info`; the format is JSON (with the current span, so each line
//!   carries the request's or control message's fields) unless `AWS_LAMBDA_LOG_FORMAT` is
//!   `Text`; no timestamps, which CloudWatch adds, and no colours.
//! - **Elsewhere**: `RUST_LOG` (default `info`), text with timestamps, on standard error;
//!   in colour only where standard error is a terminal and `NO_COLOR` is unset, so that a
//!   log file or a pipe gets plain text.
//!
//! Whatever the level asked for, nothing secret is written: the crates that log what they
//! carry at `trace` are held at `debug` ([`CAPPED`]). At `trace`, the Lambda runtime logs
//! each raw event (an API request's `Authorization` header and body included), and the
//! AWS SDK each request it signs. A directive that names one of them
//! (`RUST_LOG=lambda_runtime=trace`) does not lift the cap.

use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The crates whose `trace` lines carry what they transport (events, requests, headers,
/// signatures): never more verbose than `debug`, whatever the filter says.
pub const CAPPED: &[&str] = &[
    // The raw event of every invocation ("raw JSON event received from Lambda").
    "lambda_runtime",
    "lambda_runtime_api_client",
    "lambda_http",
    "lambda_extension",
    // Each request as signed, and what the SDK sends and receives.
    "aws_sigv4",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "aws_smithy_http",
    "aws_smithy_http_client",
    "aws_smithy_types",
    "aws_runtime",
    "aws_config",
    "aws_credential_types",
    "aws_sdk_dynamodb",
    "aws_sdk_sqs",
    "aws_sdk_sns",
    "aws_sdk_eventbridge",
    "aws_sdk_sts",
    "aws_sdk_sso",
    "aws_sdk_ssooidc",
    // The HTTP clients and servers underneath, and axum's rejections (a body's
    // deserialization error can quote its value).
    "axum",
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "rustls",
];

/// The filter that holds [`CAPPED`] at `debug` and lets everything else through.
pub fn caps() -> Targets {
    CAPPED
        .iter()
        .fold(Targets::new().with_default(LevelFilter::TRACE), |targets, target| {
            targets.with_target(*target, LevelFilter::DEBUG)
        })
}

/// The level and format the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The filter directives (`info`, `outbox=debug,info`, ...).
    pub filter: String,
    /// JSON lines instead of text.
    pub json: bool,
    /// Each line with its time.
    pub timestamps: bool,
    /// Colour codes in the text.
    pub ansi: bool,
}

impl LogSettings {
    /// What `lookup` (a variable's value, or `None`) asks for, inside Lambda or not, for
    /// standard error that is a terminal or not (`terminal`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, terminal: bool) -> Self {
        let on_lambda = lookup("AWS_LAMBDA_RUNTIME_API").is_some();
        // Lambda's levels are TRACE, DEBUG, INFO, WARN, ERROR and FATAL; tracing has no
        // FATAL, and anything else would be read as a target's name and silence everything.
        let level = if on_lambda {
            lookup("AWS_LAMBDA_LOG_LEVEL").map(|level| match level.to_ascii_lowercase().as_str() {
                "fatal" => "error".to_owned(),
                level @ ("trace" | "debug" | "info" | "warn" | "error") => level.to_owned(),
                _ => "info".to_owned(),
            })
        } else {
            None
        };
        Self {
            filter: level
                .or_else(|| lookup("RUST_LOG"))
                .filter(|filter| !filter.trim().is_empty())
                .unwrap_or_else(|| "info".to_owned()),
            // JSON on Lambda unless its logging controls ask for text.
            json: on_lambda
                && !lookup("AWS_LAMBDA_LOG_FORMAT").is_some_and(|format| format.eq_ignore_ascii_case("text")),
            timestamps: !on_lambda,
            ansi: !on_lambda && terminal && lookup("NO_COLOR").is_none_or(|value| value.is_empty()),
        }
    }
}

/// Installs the process's subscriber (once; later calls change nothing) as the environment asks ([`LogSettings`]); with
/// feature `otel`, also the span exporter where the `OTEL_*` variables turn it on
/// ([`crate::telemetry::export`]).
pub fn init() {
    use std::io::IsTerminal;
    let settings = LogSettings::from_lookup(|name| std::env::var(name).ok(), std::io::stderr().is_terminal());
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .parse_lossy(&settings.filter);
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(settings.ansi);
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match (settings.json, settings.timestamps) {
        (true, _) => lines.json().with_current_span(true).without_time().boxed(),
        (false, true) => lines.boxed(),
        (false, false) => lines.without_time().boxed(),
    };
    let subscriber = tracing_subscriber::registry().with(lines.with_filter(filter.and(caps())));
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(crate::telemetry::export::layer());
    // A second call (a test, a service built twice) keeps the first subscriber.
    let _ = subscriber.try_init();
}

/// At a process's end: sends the spans still buffered (feature `otel`, export on),
/// waiting at most 5 seconds. Without them, nothing.
pub fn finish() {
    #[cfg(feature = "otel")]
    crate::telemetry::export::shutdown(std::time::Duration::from_secs(5));
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> LogSettings {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LogSettings::from_lookup(|name| map.get(name).cloned(), false)
    }

    #[test]
    fn lambdas_logging_controls_win_inside_lambda_only() {
        let lambda = ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001");
        let both = settings(&[
            lambda,
            ("AWS_LAMBDA_LOG_LEVEL", "DEBUG"),
            ("RUST_LOG", "warn"),
            ("AWS_LAMBDA_LOG_FORMAT", "JSON"),
        ]);
        assert_eq!(
            both,
            LogSettings {
                filter: "debug".into(),
                json: true,
                timestamps: false,
                ansi: false
            }
        );
        assert_eq!(settings(&[lambda, ("RUST_LOG", "warn")]).filter, "warn");
        let text = settings(&[lambda, ("AWS_LAMBDA_LOG_FORMAT", "Text")]);
        assert_eq!(
            (text.filter.as_str(), text.json, text.timestamps),
            ("info", false, false)
        );
        assert!(settings(&[lambda]).json, "JSON on Lambda by default");
        assert_eq!(settings(&[lambda, ("AWS_LAMBDA_LOG_LEVEL", "FATAL")]).filter, "error");
        assert_eq!(settings(&[lambda, ("AWS_LAMBDA_LOG_LEVEL", "LOUD")]).filter, "info");
        // Locally Lambda's controls mean nothing: RUST_LOG, text, timestamps.
        let local = settings(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG"), ("AWS_LAMBDA_LOG_FORMAT", "JSON")]);
        assert_eq!(
            local,
            LogSettings {
                filter: "info".into(),
                json: false,
                timestamps: true,
                ansi: false
            }
        );
    }

    #[test]
    fn colours_only_for_a_terminal_that_did_not_say_no_color() {
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let ansi = |pairs: &[(&str, &str)], terminal: bool| {
            let vars = map(pairs);
            LogSettings::from_lookup(|name| vars.get(name).cloned(), terminal).ansi
        };
        assert!(ansi(&[], true), "a terminal");
        assert!(!ansi(&[], false), "a file or a pipe");
        assert!(!ansi(&[("NO_COLOR", "1")], true), "NO_COLOR");
        assert!(ansi(&[("NO_COLOR", "")], true), "NO_COLOR empty means unset");
        assert!(!ansi(&[("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")], true), "Lambda");
    }
}
