//! Settings read once from the environment at start-up and validated, with errors that
//! name the variable and the rule. The names are the ones `template.yaml` sets.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::destination::{Parsed, Target};
use crate::protocol::DestinationName;

mod layout;

pub use layout::{
    LayoutError, SortKey, SortKeyValue, TableLayout, DEFAULT_PARTITION_KEY, DEFAULT_TTL_ATTRIBUTE, RESERVED_ATTRIBUTES,
};

/// Which adapters the process uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Everything in process: no AWS, no Docker.
    Embedded,
    /// DynamoDB and SQS (or an emulator, through `AWS_ENDPOINT_URL`).
    Aws {
        /// The table of the protocol's records (and of the portable form's business
        /// items), and how they are keyed in it.
        layout: TableLayout,
        /// The control queue's URL.
        control_queue_url: String,
    },
}

/// The timing of the protocol: how soon a transaction is first checked, how the checks
/// back off, and how long a transaction may take to commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Delay of the first control message (`DelaySeconds`).
    pub first_check_delay: Duration,
    /// The longest delay between two checks of an uncommitted transaction.
    pub backoff_cap: Duration,
    /// How long after its first control message a transaction may still commit; after
    /// that the control worker tombstones it.
    pub max_commit_duration: Duration,
    /// How long finished records (dispatched, tombstones, idempotency) are kept.
    pub retention: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            first_check_delay: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(8),
            max_commit_duration: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// What one transaction may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    /// Most messages one transaction may emit.
    pub max_messages: usize,
    /// Most bytes of message payload one transaction may emit.
    pub max_message_bytes: usize,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        // DynamoDB caps a transaction at 100 actions and 4 MB; these defaults leave room
        // for the business writes and the protocol records.
        Self {
            max_messages: 250,
            max_message_bytes: 3 * 1024 * 1024,
        }
    }
}

/// Every setting, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Which adapters.
    pub backend: Backend,
    /// Destination name to where its messages go: an SQS queue, an SNS topic or an
    /// EventBridge bus ([`Target`]).
    pub destinations: BTreeMap<DestinationName, Target>,
    /// The protocol's timing.
    pub timing: Timing,
    /// The limits of one transaction.
    pub limits: TransactionLimits,
    /// The API function's timeout (the Lambda timeout, or the local request timeout).
    pub api_timeout: Duration,
    /// The SDK's per-operation timeout.
    pub sdk_operation_timeout: Duration,
    /// Origins the API allows by CORS (`*` for any); none by default.
    pub cors_allowed_origins: Vec<String>,
    /// The largest request body the API takes.
    pub max_request_bytes: usize,
    /// Whether the request path publishes a committed transaction's messages itself
    /// (and marks its record dispatched) before answering; the control worker remains
    /// the guarantee either way. On by default.
    pub inline_publish: bool,
    /// The `Service` dimension of the request path's metrics: this service's name, so
    /// that each service committing through the outbox counts its own.
    pub service_name: String,
}

/// The variables, by the names `template.yaml` uses.
pub mod vars {
    /// `embedded` (default) or `aws`.
    pub const BACKEND: &str = "OUTBOX_BACKEND";
    /// Table name; required with the `aws` backend.
    pub const TABLE_NAME: &str = "OUTBOX_TABLE_NAME";
    /// The table's partition key attribute (a string); default `pk`.
    pub const PARTITION_KEY: &str = "OUTBOX_PARTITION_KEY";
    /// The table's sort key attribute (a string), if it has one; unset by default.
    pub const SORT_KEY: &str = "OUTBOX_SORT_KEY";
    /// What the protocol's records write in the sort key: a constant, or (unset) the
    /// same string as in the partition key. Only with a sort key.
    pub const SORT_KEY_VALUE: &str = "OUTBOX_SORT_KEY_VALUE";
    /// The table's TTL attribute (unix seconds); default `expires_at`.
    pub const TTL_ATTRIBUTE: &str = "OUTBOX_TTL_ATTRIBUTE";
    /// Control queue URL; required with the `aws` backend.
    pub const CONTROL_QUEUE_URL: &str = "OUTBOX_CONTROL_QUEUE_URL";
    /// `name=kind:target` entries separated by commas (see [`crate::destination`]); the
    /// older `name=queue-url` still works.
    pub const DESTINATIONS: &str = "OUTBOX_DESTINATIONS";
    /// Seconds, 0 to 900, default 1.
    pub const FIRST_CHECK_DELAY_SECONDS: &str = "OUTBOX_FIRST_CHECK_DELAY_SECONDS";
    /// Seconds, 1 to 900, default 8.
    pub const BACKOFF_CAP_SECONDS: &str = "OUTBOX_BACKOFF_CAP_SECONDS";
    /// Seconds, default 30.
    pub const MAX_COMMIT_DURATION_SECONDS: &str = "OUTBOX_MAX_COMMIT_DURATION_SECONDS";
    /// Seconds, default 604800 (7 days).
    pub const RETENTION_SECONDS: &str = "OUTBOX_RETENTION_SECONDS";
    /// Count, default 250.
    pub const MAX_MESSAGES_PER_TRANSACTION: &str = "OUTBOX_MAX_MESSAGES_PER_TRANSACTION";
    /// Bytes, default 3 MiB.
    pub const MAX_TRANSACTION_BYTES: &str = "OUTBOX_MAX_TRANSACTION_BYTES";
    /// Seconds, default 10.
    pub const API_TIMEOUT_SECONDS: &str = "OUTBOX_API_TIMEOUT_SECONDS";
    /// Seconds, default 5.
    pub const SDK_OPERATION_TIMEOUT_SECONDS: &str = "OUTBOX_SDK_OPERATION_TIMEOUT_SECONDS";
    /// Comma-separated origins, or `*`; empty by default.
    pub const CORS_ALLOWED_ORIGINS: &str = "OUTBOX_CORS_ALLOWED_ORIGINS";
    /// Bytes, 1024 to 1048576, default 65536.
    pub const MAX_REQUEST_BYTES: &str = "OUTBOX_MAX_REQUEST_BYTES";
    /// `true` (default) or `false`: the request path publishes committed messages itself.
    pub const INLINE_PUBLISH: &str = "OUTBOX_INLINE_PUBLISH";
    /// The `Service` dimension of the request path's metrics; by default the
    /// executable's name (`api`, `shop`), or `outbox`.
    pub const SERVICE_NAME: &str = "OUTBOX_SERVICE_NAME";
}

/// One setting that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct SettingError {
    /// The variable (or variables, joined by ` and `) at fault.
    pub variable: String,
    /// What is wrong and what the rule is.
    pub problem: String,
}

/// Every setting that is wrong, so one start-up reports them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SettingsError {
    /// The problems, in the order the variables are read.
    pub errors: Vec<SettingError>,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid settings: ")?;
        for (index, error) in self.errors.iter().enumerate() {
            if index > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// Set by AWS Lambda in every function's environment: where its runtime API is.
const LAMBDA_RUNTIME_API: &str = "AWS_LAMBDA_RUNTIME_API";
/// Lambda's variable naming the function.
const LAMBDA_FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (a variable's value, or `None` when unset), so
    /// tests need not touch the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let mut reader = Reader {
            lookup: &lookup,
            errors: Vec::new(),
        };
        let defaults = Timing::default();
        let limits = TransactionLimits::default();

        // Inside Lambda (its runtime API is in the environment) the embedded backend would
        // serve from one sandbox's memory and lose everything with it.
        let on_lambda = lookup(LAMBDA_RUNTIME_API).is_some();
        let backend = match reader.text(vars::BACKEND).as_deref() {
            None | Some("embedded") if on_lambda => {
                reader.fail(
                    vars::BACKEND,
                    "must be `aws` inside AWS Lambda (AWS_LAMBDA_RUNTIME_API is set): the embedded backend keeps \
                     everything in one sandbox's memory"
                        .to_owned(),
                );
                None
            }
            None | Some("embedded") => Some(Backend::Embedded),
            Some("aws") => {
                let layout = reader.layout(None);
                let control_queue_url = reader.required(vars::CONTROL_QUEUE_URL, "the control queue's URL");
                match (layout, control_queue_url) {
                    (Some(layout), Some(control_queue_url)) => Some(Backend::Aws {
                        layout,
                        control_queue_url,
                    }),
                    _ => None,
                }
            }
            Some(other) => {
                reader.fail(vars::BACKEND, format!("must be `embedded` or `aws`, not {other:?}"));
                None
            }
        };
        let destinations = reader.destinations();
        let timing = Timing {
            first_check_delay: reader.seconds(vars::FIRST_CHECK_DELAY_SECONDS, defaults.first_check_delay, 0, 900),
            backoff_cap: reader.seconds(vars::BACKOFF_CAP_SECONDS, defaults.backoff_cap, 1, 900),
            max_commit_duration: reader.seconds(
                vars::MAX_COMMIT_DURATION_SECONDS,
                defaults.max_commit_duration,
                1,
                3600,
            ),
            retention: reader.seconds(vars::RETENTION_SECONDS, defaults.retention, 3600, 365 * 24 * 3600),
        };
        let limits = TransactionLimits {
            max_messages: reader.count(vars::MAX_MESSAGES_PER_TRANSACTION, limits.max_messages, 1, 10_000),
            max_message_bytes: reader.count(vars::MAX_TRANSACTION_BYTES, limits.max_message_bytes, 1, 4_000_000),
        };
        let api_timeout = reader.seconds(vars::API_TIMEOUT_SECONDS, Duration::from_secs(10), 1, 900);
        let sdk_operation_timeout = reader.seconds(vars::SDK_OPERATION_TIMEOUT_SECONDS, Duration::from_secs(5), 1, 300);
        let cors_allowed_origins = reader.origins();
        let max_request_bytes = reader.count(vars::MAX_REQUEST_BYTES, 64 * 1024, 1024, 1024 * 1024);
        // On by default: events leave in milliseconds instead of after the first check delay,
        // for one SendMessageBatch and one BatchWriteItem more in the request (about 18 ms at
        // AWS-like latencies; README, "Settling in the request path", gives the measurements).
        let inline_publish = reader.flag(vars::INLINE_PUBLISH, true);
        let service_name = lookup(vars::SERVICE_NAME)
            .filter(|name| !name.trim().is_empty())
            .or_else(|| {
                // On Lambda every executable is `bootstrap`: the function's name says more.
                Some(executable_name()).filter(|name| !name.is_empty() && name != "bootstrap")
            })
            .or_else(|| lookup(LAMBDA_FUNCTION_NAME))
            .unwrap_or_else(|| crate::request::DEFAULT_SERVICE.to_owned());

        // A commit can reach the table as late as the API's timeout plus one SDK operation
        // after the first control message. The window must outlast that, or the worker
        // would routinely tombstone transactions that are still committing (safe, but every
        // such request would fail).
        if timing.max_commit_duration <= api_timeout + sdk_operation_timeout {
            reader.fail(
                &format!(
                    "{} and {} and {}",
                    vars::MAX_COMMIT_DURATION_SECONDS,
                    vars::API_TIMEOUT_SECONDS,
                    vars::SDK_OPERATION_TIMEOUT_SECONDS
                ),
                format!(
                    "the max commit duration ({}s) must exceed the API timeout plus the SDK operation timeout ({}s)",
                    timing.max_commit_duration.as_secs(),
                    (api_timeout + sdk_operation_timeout).as_secs()
                ),
            );
        }
        if timing.backoff_cap < timing.first_check_delay {
            reader.fail(
                &format!("{} and {}", vars::BACKOFF_CAP_SECONDS, vars::FIRST_CHECK_DELAY_SECONDS),
                "the backoff cap must be at least the first check delay".to_owned(),
            );
        }
        if timing.retention <= timing.max_commit_duration {
            reader.fail(
                &format!("{} and {}", vars::RETENTION_SECONDS, vars::MAX_COMMIT_DURATION_SECONDS),
                "the retention must exceed the max commit duration, or a tombstone could expire while its transaction may still commit".to_owned(),
            );
        }

        match (reader.errors.is_empty(), backend) {
            (true, Some(backend)) => Ok(Self {
                backend,
                destinations,
                timing,
                limits,
                api_timeout,
                sdk_operation_timeout,
                cors_allowed_origins,
                max_request_bytes,
                inline_publish,
                service_name,
            }),
            _ => Err(SettingsError { errors: reader.errors }),
        }
    }
}

/// The running executable's file name without extension.
fn executable_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|stem| stem.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// The protocol table's layout from the environment (`OUTBOX_TABLE_NAME`, defaulting to
/// `default_table`, and the key and TTL attribute variables), for commands that create
/// the table rather than use it.
pub fn layout_from_env(default_table: &str) -> Result<TableLayout, SettingsError> {
    layout_from_lookup(default_table, |name| std::env::var(name).ok())
}

/// [`layout_from_env`] through `lookup`.
pub fn layout_from_lookup(
    default_table: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<TableLayout, SettingsError> {
    let mut reader = Reader {
        lookup: &lookup,
        errors: Vec::new(),
    };
    reader
        .layout(Some(default_table))
        .ok_or(SettingsError { errors: reader.errors })
}

struct Reader<'a, F: Fn(&str) -> Option<String>> {
    lookup: &'a F,
    errors: Vec<SettingError>,
}

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    fn fail(&mut self, variable: &str, problem: String) {
        self.errors.push(SettingError {
            variable: variable.to_owned(),
            problem,
        });
    }

    /// The trimmed value; an empty one counts as unset.
    fn text(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    }

    fn required(&mut self, name: &str, what: &str) -> Option<String> {
        let value = self.text(name);
        if value.is_none() {
            self.fail(name, format!("is required with {}=aws: {what}", vars::BACKEND));
        }
        value
    }

    /// The table and its layout; `None` (with the errors recorded) when it is wrong. The
    /// table name is required unless there is a `default_table`.
    fn layout(&mut self, default_table: Option<&str>) -> Option<TableLayout> {
        let table = match default_table {
            Some(default) => self.text(vars::TABLE_NAME).unwrap_or_else(|| default.to_owned()),
            None => self.required(vars::TABLE_NAME, "the DynamoDB table's name")?,
        };
        let mut layout = TableLayout::dedicated(table);
        if let Some(name) = self.text(vars::PARTITION_KEY) {
            layout = layout.with_partition_key(name);
        }
        if let Some(name) = self.text(vars::TTL_ATTRIBUTE) {
            layout = layout.with_ttl_attribute(name);
        }
        match (self.text(vars::SORT_KEY), self.text(vars::SORT_KEY_VALUE)) {
            (Some(name), None) => layout = layout.with_sort_key(name, SortKeyValue::SameAsPartitionKey),
            (Some(name), Some(value)) => layout = layout.with_sort_key(name, SortKeyValue::Constant(value)),
            (None, Some(_)) => {
                self.fail(
                    vars::SORT_KEY_VALUE,
                    format!("is set, but {} is not: a value needs a sort key", vars::SORT_KEY),
                );
                return None;
            }
            (None, None) => {}
        }
        if let Err(error) = layout.validate() {
            self.fail(
                &format!(
                    "{}, {}, {} and {}",
                    vars::TABLE_NAME,
                    vars::PARTITION_KEY,
                    vars::SORT_KEY,
                    vars::TTL_ATTRIBUTE
                ),
                error.0,
            );
            return None;
        }
        Some(layout)
    }

    fn flag(&mut self, name: &str, default: bool) -> bool {
        match self.text(name).as_deref() {
            None => default,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                self.fail(name, format!("must be true or false, not {other:?}"));
                default
            }
        }
    }

    fn count(&mut self, name: &str, default: usize, min: usize, max: usize) -> usize {
        let Some(text) = self.text(name) else { return default };
        match text.parse::<usize>() {
            Ok(value) if (min..=max).contains(&value) => value,
            _ => {
                self.fail(
                    name,
                    format!("must be a whole number from {min} to {max}, not {text:?}"),
                );
                default
            }
        }
    }

    fn seconds(&mut self, name: &str, default: Duration, min: u64, max: u64) -> Duration {
        let Some(text) = self.text(name) else { return default };
        match text.parse::<u64>() {
            Ok(value) if (min..=max).contains(&value) => Duration::from_secs(value),
            _ => {
                self.fail(name, format!("must be whole seconds from {min} to {max}, not {text:?}"));
                default
            }
        }
    }

    fn origins(&mut self) -> Vec<String> {
        let Some(text) = self.text(vars::CORS_ALLOWED_ORIGINS) else {
            return Vec::new();
        };
        let origins: Vec<String> = text
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(str::to_owned)
            .collect();
        for origin in &origins {
            let valid = origin == "*" || origin.starts_with("https://") || origin.starts_with("http://");
            if !valid {
                self.fail(
                    vars::CORS_ALLOWED_ORIGINS,
                    format!("each origin must be * or start with http:// or https://, not {origin:?}"),
                );
            }
        }
        origins
    }

    fn destinations(&mut self) -> BTreeMap<DestinationName, Target> {
        let mut destinations = BTreeMap::new();
        let Some(text) = self.text(vars::DESTINATIONS) else {
            return destinations;
        };
        for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let Some((name, target)) = pair.split_once('=') else {
                self.fail(
                    vars::DESTINATIONS,
                    format!(
                        "each entry must be name=kind:target (kind sqs, sqs-fifo, sns, sns-fifo or eventbridge), not {pair:?}"
                    ),
                );
                continue;
            };
            let (name, target) = (name.trim(), target.trim());
            let parsed_name = match name.parse::<DestinationName>() {
                Ok(_) if target.is_empty() => {
                    self.fail(vars::DESTINATIONS, format!("destination {name:?} has no target"));
                    continue;
                }
                Ok(parsed) => parsed,
                Err(error) => {
                    self.fail(vars::DESTINATIONS, error.to_string());
                    continue;
                }
            };
            let parsed_target = match Target::parse(target) {
                Ok(Parsed {
                    target: parsed,
                    migrate_to,
                }) => {
                    if let Some(new_form) = migrate_to {
                        tracing::info!(
                            "{}: {name}={target} is read as an SQS queue; write it {name}={new_form}",
                            vars::DESTINATIONS
                        );
                    }
                    parsed
                }
                Err(error) => {
                    self.fail(vars::DESTINATIONS, format!("destination {name:?}: {error}"));
                    continue;
                }
            };
            if destinations.insert(parsed_name, parsed_target).is_some() {
                self.fail(vars::DESTINATIONS, format!("destination {name:?} is named twice"));
            }
        }
        destinations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Settings::from_lookup(|name| map.get(name).cloned())
    }

    fn only_error(pairs: &[(&str, &str)]) -> SettingError {
        let errors = settings(pairs).unwrap_err().errors;
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.into_iter().next().unwrap()
    }

    #[test]
    fn nothing_set_means_embedded_with_the_documented_defaults() {
        let settings = settings(&[]).unwrap();
        assert_eq!(settings.backend, Backend::Embedded);
        assert_eq!(settings.timing.first_check_delay, Duration::from_secs(1));
        assert_eq!(settings.timing.max_commit_duration, Duration::from_secs(30));
        assert_eq!(settings.timing.retention, Duration::from_secs(604_800));
        assert!(settings.destinations.is_empty());
    }

    #[test]
    fn metrics_are_counted_under_the_service_named_or_the_executable() {
        assert_eq!(settings(&[(vars::SERVICE_NAME, "shop")]).unwrap().service_name, "shop");
        // The unit tests' executable is `outbox-<hash>`: never the API's name.
        let default = settings(&[]).unwrap().service_name;
        assert!(default.starts_with("outbox"), "{default}");
        assert_eq!(settings(&[(vars::SERVICE_NAME, " ")]).unwrap().service_name, default);
    }

    #[test]
    fn inside_lambda_the_embedded_backend_is_refused_naming_the_variable() {
        for backend in [None, Some("embedded")] {
            let mut pairs = vec![("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")];
            pairs.extend(backend.map(|backend| (vars::BACKEND, backend)));
            let error = only_error(&pairs);
            assert_eq!(error.variable, vars::BACKEND);
            assert!(error.problem.contains("must be `aws` inside AWS Lambda"), "{error:?}");
        }
        let aws = settings(&[
            ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "t"),
            (vars::CONTROL_QUEUE_URL, "https://sqs.us-east-1.amazonaws.com/1/c"),
        ]);
        assert!(aws.is_ok(), "{aws:?}");
    }

    #[test]
    fn the_aws_backend_needs_its_table_and_queue() {
        let errors = settings(&[(vars::BACKEND, "aws")]).unwrap_err().errors;
        let named: Vec<_> = errors.iter().map(|e| e.variable.as_str()).collect();
        assert_eq!(named, [vars::TABLE_NAME, vars::CONTROL_QUEUE_URL]);
        let ok = settings(&[
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "outbox"),
            (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
            (
                vars::DESTINATIONS,
                "events=http://localhost/events, audit = http://localhost/audit.fifo",
            ),
        ])
        .unwrap();
        assert_eq!(
            ok.backend,
            Backend::Aws {
                layout: TableLayout::dedicated("outbox"),
                control_queue_url: "http://localhost/q".into()
            }
        );
        assert_eq!(ok.destinations.len(), 2);
        assert_eq!(
            ok.destinations[&"audit".parse().unwrap()],
            Target::SqsQueue {
                url: "http://localhost/audit.fifo".into(),
                fifo: true
            }
        );
        // The new form, kind stated; a FIFO queue must say so.
        let aws = [
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "outbox"),
            (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
        ];
        let with = |destinations: &str| {
            let pairs: Vec<(&str, &str)> = aws
                .iter()
                .copied()
                .chain([(vars::DESTINATIONS, destinations)])
                .collect();
            settings(&pairs)
        };
        let new_form = with("events=sqs:http://localhost/events,audit=sqs-fifo:http://localhost/audit.fifo").unwrap();
        assert_eq!(new_form.destinations, ok.destinations);
        let every_kind = with(
            "queue=sqs:http://localhost/events, topic=sns-fifo:arn:aws:sns:us-east-1:123456789012:t.fifo, bus=eventbridge:orders",
        )
        .unwrap();
        let written: Vec<String> = every_kind
            .destinations
            .iter()
            .map(|(name, target)| format!("{name}={target}"))
            .collect();
        assert_eq!(
            written,
            [
                "bus=eventbridge:orders",
                "queue=sqs:http://localhost/events",
                "topic=sns-fifo:arn:aws:sns:us-east-1:123456789012:t.fifo"
            ]
        );
        for (entry, says) in [
            ("audit=sqs:http://localhost/audit.fifo", "takes the -fifo kind"),
            (
                "events=sns:arn:aws:sns:us-east-1:123456789012:events.fifo",
                "takes the -fifo kind",
            ),
            ("events=eventbridge:", "names no target"),
            ("events=kafka:x", "unknown destination kind"),
            ("events", "each entry must be name=kind:target"),
        ] {
            let errors = with(entry).unwrap_err().errors;
            assert_eq!(errors.len(), 1, "{entry}: {errors:?}");
            assert_eq!(errors[0].variable, vars::DESTINATIONS);
            assert!(errors[0].to_string().contains(says), "{entry}: {}", errors[0]);
        }
    }

    #[test]
    fn the_protocol_records_go_where_the_layout_says() {
        let aws = [
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "shop"),
            (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
        ];
        let layout = |extra: &[(&str, &str)]| {
            let pairs: Vec<(&str, &str)> = aws.iter().chain(extra).copied().collect();
            settings(&pairs).map(|settings| match settings.backend {
                Backend::Aws { layout, .. } => layout,
                Backend::Embedded => unreachable!("the aws backend was asked for"),
            })
        };
        assert_eq!(
            layout(&[
                (vars::PARTITION_KEY, "PK"),
                (vars::SORT_KEY, "SK"),
                (vars::TTL_ATTRIBUTE, "ttl")
            ])
            .unwrap(),
            TableLayout::dedicated("shop")
                .with_partition_key("PK")
                .with_sort_key("SK", SortKeyValue::SameAsPartitionKey)
                .with_ttl_attribute("ttl")
        );
        assert_eq!(
            layout(&[(vars::SORT_KEY, "SK"), (vars::SORT_KEY_VALUE, "OUTBOX")]).unwrap(),
            TableLayout::dedicated("shop").with_sort_key("SK", SortKeyValue::Constant("OUTBOX".into()))
        );
        let errors = layout(&[(vars::SORT_KEY_VALUE, "OUTBOX")]).unwrap_err().errors;
        assert_eq!(errors[0].variable, vars::SORT_KEY_VALUE);
        let errors = layout(&[(vars::PARTITION_KEY, "state")]).unwrap_err().errors;
        assert!(errors[0].variable.contains(vars::PARTITION_KEY), "{errors:?}");
        assert!(errors[0].problem.contains("\"state\""), "{errors:?}");
    }

    #[test]
    fn each_bad_value_names_its_variable_and_rule() {
        let error = only_error(&[(vars::FIRST_CHECK_DELAY_SECONDS, "901")]);
        assert_eq!(error.variable, vars::FIRST_CHECK_DELAY_SECONDS);
        assert!(error.problem.contains("0 to 900"), "{error}");
        assert_eq!(only_error(&[(vars::BACKEND, "gcp")]).variable, vars::BACKEND);
        assert_eq!(
            only_error(&[(vars::MAX_MESSAGES_PER_TRANSACTION, "many")]).variable,
            vars::MAX_MESSAGES_PER_TRANSACTION
        );
        assert_eq!(
            only_error(&[(vars::DESTINATIONS, "events")]).variable,
            vars::DESTINATIONS
        );
        assert_eq!(
            only_error(&[(vars::DESTINATIONS, "bad name=http://x")]).variable,
            vars::DESTINATIONS
        );
        assert_eq!(
            only_error(&[(vars::DESTINATIONS, "a=http://x,a=http://y")]).variable,
            vars::DESTINATIONS
        );
    }

    #[test]
    fn the_commit_window_must_outlast_the_api_and_sdk_timeouts() {
        let error = only_error(&[
            (vars::MAX_COMMIT_DURATION_SECONDS, "15"),
            (vars::API_TIMEOUT_SECONDS, "10"),
            (vars::SDK_OPERATION_TIMEOUT_SECONDS, "5"),
        ]);
        assert!(error.variable.contains(vars::MAX_COMMIT_DURATION_SECONDS), "{error}");
        assert!(error.problem.contains("must exceed"), "{error}");
        assert!(settings(&[(vars::MAX_COMMIT_DURATION_SECONDS, "16")]).is_ok());
    }

    #[test]
    fn inconsistent_backoff_and_retention_are_refused() {
        assert!(only_error(&[
            (vars::FIRST_CHECK_DELAY_SECONDS, "20"),
            (vars::BACKOFF_CAP_SECONDS, "10")
        ])
        .variable
        .contains(vars::BACKOFF_CAP_SECONDS));
        assert!(only_error(&[
            (vars::RETENTION_SECONDS, "3600"),
            (vars::MAX_COMMIT_DURATION_SECONDS, "3600")
        ])
        .variable
        .contains(vars::RETENTION_SECONDS));
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let errors = settings(&[(vars::BACKEND, "aws"), (vars::RETENTION_SECONDS, "x")]).unwrap_err();
        assert_eq!(errors.errors.len(), 3);
        assert!(errors.to_string().starts_with("invalid settings: "));
    }
}
