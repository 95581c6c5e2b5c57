//! Settings read once from the environment at start-up and validated, with errors that
//! name the variable and the rule. The names are the ones `template.yaml` sets.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::destination::Target;
use crate::protocol::DestinationName;
pub use crate::protocol::FifoGrouping;
use reader::{BackendKind, Reader};

pub mod help;
mod layout;
pub(crate) mod reader;

pub use layout::{
    LayoutError, SortKey, SortKeyValue, TableLayout, DEFAULT_PARTITION_KEY, DEFAULT_TTL_ATTRIBUTE, RESERVED_ATTRIBUTES,
    RESERVED_PREFIXES,
};

/// Whether and when the request path publishes a committed transaction's messages
/// itself (docs/PROTOCOL.md section 3, "Settling in the request path"). The control
/// worker publishes whatever it did not, whichever is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InlinePublish {
    /// Right after the answer (the default): the client does not wait for the publish,
    /// and events still leave milliseconds after the commit. On Lambda an internal
    /// extension holds the environment until it is done.
    #[default]
    AfterAnswer,
    /// Before the answer: for a client that reads its own events as soon as it has its
    /// answer.
    BeforeAnswer,
    /// Not at all: the control worker publishes, after the first check delay.
    Off,
}

/// What a request to the service's API gets when it carries no caller its front door
/// verified (a JWT, IAM or Lambda authorizer): `OUTBOX_AUTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Authentication {
    /// Every caller must come verified by the front door: without one, 401 (`jwt`, the
    /// default on Lambda).
    Jwt,
    /// Nobody signs in: a request without a verified caller is the development caller
    /// (`off`, the default elsewhere). Anyone who can reach the service is that caller;
    /// refused on Lambda unless `OUTBOX_AUTH_OFF_EXPOSED=allow`.
    Off,
}

impl Authentication {
    /// The value of `OUTBOX_AUTH` that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Jwt => "jwt",
            Self::Off => "off",
        }
    }
}

impl std::str::FromStr for Authentication {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "jwt" => Ok(Self::Jwt),
            "off" => Ok(Self::Off),
            other => Err(format!("must be jwt or off, not {other:?}")),
        }
    }
}

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
        /// The one Region that writes the table where it has replicas in other Regions
        /// (`OUTBOX_WRITE_REGION`); checked against the table and this process's Region at
        /// start-up.
        write_region: Option<String>,
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
    /// Whether and when the request path publishes a committed transaction's messages
    /// itself (and marks it dispatched): after the answer by default; the control worker
    /// remains the guarantee either way.
    pub inline_publish: InlinePublish,
    /// How messages without a group of their own go in FIFO groups: by the entity whose
    /// history they are placed in (the default: each entity's messages in commit order),
    /// or by transaction.
    pub fifo_groups: FifoGrouping,
    /// The first pause before a request's step that met a version conflict runs again
    /// (drawn at random up to it, then up to twice as long each time, until the request's
    /// deadline): it spreads requests of other processes that contend for one item.
    pub conflict_retry_pause: Duration,
    /// The `Service` dimension of the request path's metrics: this service's name, so
    /// that each service committing through the outbox counts its own.
    pub service_name: String,
    /// What an API request without a verified caller gets: 401 on Lambda by default, the
    /// development caller elsewhere.
    pub authentication: Authentication,
    /// Whether the operator allowed sign-in off where others can reach the service
    /// (`OUTBOX_AUTH_OFF_EXPOSED=allow`).
    pub auth_off_exposed: bool,
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
    /// The one AWS Region whose processes write the table, where it is a global table
    /// replicated to other Regions (`us-east-1`); unset, such a table is refused at
    /// start-up ([`crate::aws::RegionError`]), and when set, a process in another Region
    /// is refused.
    pub const WRITE_REGION: &str = "OUTBOX_WRITE_REGION";
    /// `name=kind:target` entries separated by commas (see [`crate::destination`]); the
    /// older `name=queue-url` still works.
    pub const DESTINATIONS: &str = "OUTBOX_DESTINATIONS";
    /// Seconds, 0 to 900, default 1.
    pub const FIRST_CHECK_DELAY_SECONDS: &str = "OUTBOX_FIRST_CHECK_DELAY_SECONDS";
    /// Seconds, 1 to 900, default 8.
    pub const BACKOFF_CAP_SECONDS: &str = "OUTBOX_BACKOFF_CAP_SECONDS";
    /// Seconds, default 30.
    pub const MAX_COMMIT_DURATION_SECONDS: &str = "OUTBOX_MAX_COMMIT_DURATION_SECONDS";
    /// Seconds, 60 to a year; default 604800 (7 days), or 60 on the embedded backend.
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
    /// `after` (default), `before` or `off`: whether and when the request path publishes
    /// committed messages itself (`true` and `false`, the earlier values, mean `before` and
    /// `off`).
    pub const INLINE_PUBLISH: &str = "OUTBOX_INLINE_PUBLISH";
    /// `entity` (default) or `transaction`: the FIFO group of a message its emitter gave
    /// none.
    pub const FIFO_GROUPS: &str = "OUTBOX_FIFO_GROUPS";
    /// Milliseconds, 1 to 1000, default 10: the first pause before a request's step that
    /// met a version conflict runs again.
    pub const CONFLICT_RETRY_PAUSE_MS: &str = "OUTBOX_CONFLICT_RETRY_PAUSE_MS";
    /// The `Service` dimension of the request path's metrics; by default the
    /// executable's name (`api`, `shop`), or `outbox`.
    pub const SERVICE_NAME: &str = "OUTBOX_SERVICE_NAME";
    /// `jwt` or `off`: whether an API request must carry a caller its front door
    /// verified (401 without one), or is served as the development caller; by default
    /// `jwt` on Lambda, `off` elsewhere. `off` is refused where others can reach the
    /// service (on Lambda, or a local server listening beyond loopback) unless
    /// [`AUTH_OFF_EXPOSED`] is `allow`.
    pub const AUTH: &str = "OUTBOX_AUTH";
    /// `allow`: the operator means `OUTBOX_AUTH=off` where others can reach the service
    /// (a demo stack open to anyone, `cargo lambda watch`, a container's server on
    /// `0.0.0.0`); without it, `off` there is refused at start.
    pub const AUTH_OFF_EXPOSED: &str = "OUTBOX_AUTH_OFF_EXPOSED";
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

/// The service name when neither `OUTBOX_SERVICE_NAME`, the executable's name nor the
/// Lambda function's name gives one: the `Service` dimension of the metrics.
pub const DEFAULT_SERVICE: &str = "outbox";

/// How long the embedded backend keeps finished records unless told otherwise: long
/// enough for a client to replay an idempotent request or read a transaction's status
/// during development, short enough that a local server's memory stays flat.
pub const EMBEDDED_RETENTION: Duration = Duration::from_secs(60);

/// How long after signing AWS takes a request (SigV4 refuses one dated more than 15
/// minutes from AWS's clock): on AWS, tombstone records are kept at least this long past
/// the commit window. Entity mode does not rest on it (its fence mark never expires).
pub const SIGNED_REQUEST_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// Set by AWS Lambda in every function's environment: where its runtime API is.
const LAMBDA_RUNTIME_API: &str = "AWS_LAMBDA_RUNTIME_API";
/// Lambda's variable naming the function.
const LAMBDA_FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";

impl Settings {
    /// Whether a local server of these settings may listen on `address`: not with sign-in
    /// off beyond loopback (anyone who reaches the address would be the development
    /// caller), unless the operator allowed it ([`vars::AUTH_OFF_EXPOSED`]).
    pub fn check_listen_address(&self, address: std::net::SocketAddr) -> Result<(), SettingError> {
        if self.authentication != Authentication::Off || address.ip().is_loopback() || self.auth_off_exposed {
            return Ok(());
        }
        Err(SettingError {
            variable: vars::AUTH.to_owned(),
            problem: format!(
                "off while listening on {address}, beyond loopback, serves whoever reaches it as the one development \
                 caller; listen on 127.0.0.1, require sign-in, or set {}=allow to mean it",
                vars::AUTH_OFF_EXPOSED
            ),
        })
    }

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

        let backend = match reader.backend_kind() {
            Some(BackendKind::Embedded) => Some(Backend::Embedded),
            Some(BackendKind::Aws) => {
                let layout = reader.layout(None);
                let control_queue_url = reader.required(vars::CONTROL_QUEUE_URL, "the control queue's URL");
                let write_region = reader.write_region();
                match (layout, control_queue_url) {
                    (Some(layout), Some(control_queue_url)) => Some(Backend::Aws {
                        layout,
                        control_queue_url,
                        write_region,
                    }),
                    _ => None,
                }
            }
            None => None,
        };
        let destinations = reader.destinations();
        // The embedded backend is for development: a long-running local server keeps
        // finished records only briefly, so that its memory stays flat.
        let default_retention = match backend {
            Some(Backend::Embedded) => EMBEDDED_RETENTION,
            _ => defaults.retention,
        };
        let timing = Timing {
            first_check_delay: reader.seconds(vars::FIRST_CHECK_DELAY_SECONDS, defaults.first_check_delay, 0, 900),
            backoff_cap: reader.seconds(vars::BACKOFF_CAP_SECONDS, defaults.backoff_cap, 1, 900),
            max_commit_duration: reader.seconds(
                vars::MAX_COMMIT_DURATION_SECONDS,
                defaults.max_commit_duration,
                1,
                3600,
            ),
            retention: reader.seconds(vars::RETENTION_SECONDS, default_retention, 60, 365 * 24 * 3600),
        };
        let limits = TransactionLimits {
            max_messages: reader.count(vars::MAX_MESSAGES_PER_TRANSACTION, limits.max_messages, 1, 10_000),
            max_message_bytes: reader.count(vars::MAX_TRANSACTION_BYTES, limits.max_message_bytes, 1, 4_000_000),
        };
        let api_timeout = reader.seconds(vars::API_TIMEOUT_SECONDS, Duration::from_secs(10), 1, 900);
        let sdk_operation_timeout = reader.seconds(vars::SDK_OPERATION_TIMEOUT_SECONDS, Duration::from_secs(5), 1, 300);
        let cors_allowed_origins = reader.origins();
        let max_request_bytes = reader.count(vars::MAX_REQUEST_BYTES, 64 * 1024, 1024, 1024 * 1024);
        // After the answer by default: events leave in milliseconds instead of after the
        // first check delay, and the client does not wait for them (docs/HOW_IT_WORKS.md,
        // "Settling in the request path", gives the measurements).
        let inline_publish = match reader.text(vars::INLINE_PUBLISH).as_deref() {
            None | Some("after") => InlinePublish::AfterAnswer,
            Some("before" | "true") => InlinePublish::BeforeAnswer,
            Some("off" | "false") => InlinePublish::Off,
            Some(other) => {
                reader.fail(
                    vars::INLINE_PUBLISH,
                    format!("must be after, before or off, not {other:?}"),
                );
                InlinePublish::AfterAnswer
            }
        };
        let fifo_groups = match reader.text(vars::FIFO_GROUPS).as_deref() {
            None | Some("entity") => FifoGrouping::Entity,
            Some("transaction") => FifoGrouping::Transaction,
            Some(other) => {
                reader.fail(
                    vars::FIFO_GROUPS,
                    format!("must be entity or transaction, not {other:?}"),
                );
                FifoGrouping::Entity
            }
        };
        let conflict_retry_pause = Duration::from_millis(reader.count(
            vars::CONFLICT_RETRY_PAUSE_MS,
            crate::request::CONFLICT_RETRY_PAUSE.as_millis() as usize,
            1,
            1000,
        ) as u64);
        let on_lambda = lookup(LAMBDA_RUNTIME_API).is_some();
        let authentication = match reader.text(vars::AUTH) {
            None if on_lambda => Authentication::Jwt,
            None => Authentication::Off,
            Some(text) => text.parse().unwrap_or_else(|problem| {
                reader.fail(vars::AUTH, problem);
                Authentication::Jwt
            }),
        };
        // Where others can reach the service, sign-in off makes every caller the one
        // development caller, who reads and changes whatever any caller could: only an
        // operator who says so gets it (a local server's address is checked where it
        // binds, `Settings::check_listen_address`).
        let off_allowed = match reader.text(vars::AUTH_OFF_EXPOSED).as_deref() {
            None => false,
            Some("allow") => true,
            Some(other) => {
                reader.fail(vars::AUTH_OFF_EXPOSED, format!("must be allow or unset, not {other:?}"));
                false
            }
        };
        if on_lambda && authentication == Authentication::Off && !off_allowed {
            reader.fail(
                vars::AUTH,
                format!(
                    "off on Lambda serves every request as the one development caller, who reads and changes what \
                     every caller owns; behind a JWT, IAM or Lambda authorizer leave it jwt (the caller comes from \
                     whichever verified it), or set {}=allow to mean it",
                    vars::AUTH_OFF_EXPOSED
                ),
            );
        }
        let service_name = lookup(vars::SERVICE_NAME)
            .filter(|name| !name.trim().is_empty())
            .or_else(|| {
                // On Lambda every executable is `bootstrap`: the function's name says more.
                Some(executable_name()).filter(|name| !name.is_empty() && name != "bootstrap")
            })
            .or_else(|| lookup(LAMBDA_FUNCTION_NAME))
            .unwrap_or_else(|| DEFAULT_SERVICE.to_owned());

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
        } else if backend != Some(Backend::Embedded)
            && timing.retention <= timing.max_commit_duration + SIGNED_REQUEST_LIFETIME
        {
            // On AWS a request may still arrive after the window, for as long as AWS takes
            // a signed request: a tombstone record must outlive it, or a commit in the
            // transactional form held in the network could apply after it expired.
            reader.fail(
                &format!("{} and {}", vars::RETENTION_SECONDS, vars::MAX_COMMIT_DURATION_SECONDS),
                format!(
                    "the retention must exceed the max commit duration plus {} s (how long AWS takes a signed request), or a tombstone could expire while a late request of its transaction may still arrive",
                    SIGNED_REQUEST_LIFETIME.as_secs()
                ),
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
                fifo_groups,
                conflict_retry_pause,
                service_name,
                authentication,
                auth_off_exposed: off_allowed,
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

/// `OUTBOX_WRITE_REGION` through `lookup`, for commands that create the table rather
/// than use it (the bootstrap): the one Region that writes a replicated table, if named.
pub fn write_region_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<String>, SettingsError> {
    let mut reader = Reader {
        lookup: &lookup,
        errors: Vec::new(),
    };
    let region = reader.write_region();
    match reader.errors.is_empty() {
        true => Ok(region),
        false => Err(SettingsError { errors: reader.errors }),
    }
}

#[cfg(test)]
mod tests;
