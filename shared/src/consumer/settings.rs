//! A consumer's settings (docs/PROTOCOL.md section 10): its name, where its table and
//! destinations are, how its messages' ids are found, and the retention of its dedup
//! data, derived from the source queue's, its dead-letter queue's and the producer's
//! re-send window (C4), and refused at start-up when shorter than the source queue's.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{ConsumerName, MessageIds, Retention};
use crate::destination::Target;
use crate::protocol::DestinationName;
use crate::settings::reader::{BackendKind, Reader};
use crate::settings::{vars, SettingsError, TableLayout, TransactionLimits};

/// The variables only a consumer reads.
pub mod consumer_vars {
    /// The consumer's name (required): part of every record and outgoing id it derives.
    pub const NAME: &str = "OUTBOX_CONSUMER_NAME";
    /// The queue the local poller receives from (outside Lambda, where the event source
    /// mapping does it).
    pub const QUEUE_URL: &str = "OUTBOX_CONSUMER_QUEUE_URL";
    /// Where each message's id is: `outbox` (default), `attribute:NAME`, `json:/POINTER`,
    /// `sqs-message-id`.
    pub const MESSAGE_ID: &str = "OUTBOX_CONSUMER_MESSAGE_ID";
    /// The source queue's `MessageRetentionPeriod`, in seconds (SQS's default: 4 days).
    pub const SOURCE_RETENTION_SECONDS: &str = "OUTBOX_CONSUMER_SOURCE_RETENTION_SECONDS";
    /// Its dead-letter queue's, in seconds (14 days, the most SQS allows, by default).
    pub const DLQ_RETENTION_SECONDS: &str = "OUTBOX_CONSUMER_DLQ_RETENTION_SECONDS";
    /// How long the producer may send a message again, in seconds (1 day by default).
    pub const RESEND_WINDOW_SECONDS: &str = "OUTBOX_CONSUMER_RESEND_WINDOW_SECONDS";
    /// How long each message's dedup data is kept from its dispatch, in seconds, when set
    /// rather than derived from the three above; refused when shorter than the source
    /// queue's retention.
    pub const RETENTION_SECONDS: &str = "OUTBOX_CONSUMER_RETENTION_SECONDS";
}

use consumer_vars as cv;

/// Which adapters a consumer uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerBackend {
    /// In process, for tests and local runs beside an embedded producer.
    Embedded,
    /// DynamoDB, SQS and the destinations' services (or the emulators).
    Aws {
        /// Its table, and how the records are keyed in it.
        layout: TableLayout,
        /// The queue the local poller receives from, if it runs one.
        queue_url: Option<String>,
        /// The one Region that writes the table where it has replicas in other Regions
        /// (`OUTBOX_WRITE_REGION`), checked at start-up as the producer's processes check it.
        write_region: Option<String>,
    },
}

/// Every setting of a consumer, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSettings {
    /// Which adapters.
    pub backend: ConsumerBackend,
    /// Its name.
    pub name: ConsumerName,
    /// Where each message's id is.
    pub message_ids: MessageIds,
    /// Where its outgoing messages go.
    pub destinations: BTreeMap<DestinationName, Target>,
    /// What copies of a message its retention must outlive.
    pub sources: Retention,
    /// How long each message's dedup data is kept from its dispatch.
    pub retention: Duration,
    /// Whether `retention` was set (`OUTBOX_CONSUMER_RETENTION_SECONDS`) rather than
    /// derived from `sources`.
    pub retention_set: bool,
    /// What one message may emit.
    pub limits: TransactionLimits,
    /// The SDK's per-operation timeout.
    pub sdk_operation_timeout: Duration,
}

const DAY: u64 = 24 * 3600;

impl ConsumerSettings {
    /// These settings, with the source queue's real message retention (read from the
    /// queue at start-up): a derived retention is derived again from the longer of it
    /// and the configured figure; a set one is refused when shorter than the real one,
    /// naming both (C4).
    pub fn with_source_queue_retention(mut self, real: Duration) -> Result<Self, super::RetentionError> {
        self.sources.source_queue = self.sources.source_queue.max(real);
        if self.retention_set {
            self.sources.check(self.retention)?;
        } else {
            self.retention = self.sources.derived();
        }
        Ok(self)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (a variable's value, or `None` when unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let mut reader = Reader {
            lookup: &lookup,
            errors: Vec::new(),
        };
        let backend = match reader.backend_kind() {
            Some(BackendKind::Embedded) => Some(ConsumerBackend::Embedded),
            Some(BackendKind::Aws) => {
                let write_region = reader.write_region();
                reader.layout(None).map(|layout| ConsumerBackend::Aws {
                    layout,
                    queue_url: reader.text(cv::QUEUE_URL),
                    write_region,
                })
            }
            None => None,
        };
        let name = match reader.text(cv::NAME).map(|text| text.parse::<ConsumerName>()) {
            Some(Ok(name)) => Some(name),
            Some(Err(error)) => {
                reader.fail(cv::NAME, error.to_string());
                None
            }
            None => {
                reader.fail(cv::NAME, "is required: the consumer's name".to_owned());
                None
            }
        };
        let message_ids = match reader.text(cv::MESSAGE_ID).map(|text| text.parse::<MessageIds>()) {
            None => MessageIds::Outbox,
            Some(Ok(ids)) => ids,
            Some(Err(error)) => {
                reader.fail(cv::MESSAGE_ID, error.to_string());
                MessageIds::Outbox
            }
        };
        let destinations = reader.destinations();
        let sources = Retention {
            source_queue: reader.seconds(cv::SOURCE_RETENTION_SECONDS, Duration::from_secs(4 * DAY), 60, 14 * DAY),
            dead_letter_queue: reader.seconds(cv::DLQ_RETENTION_SECONDS, Duration::from_secs(14 * DAY), 0, 14 * DAY),
            resend_window: reader.seconds(cv::RESEND_WINDOW_SECONDS, Duration::from_secs(DAY), 0, 365 * DAY),
        };
        let retention_set = reader.text(cv::RETENTION_SECONDS).is_some();
        let retention = match reader.text(cv::RETENTION_SECONDS) {
            None => sources.derived(),
            Some(_) => {
                let asked = reader.seconds(cv::RETENTION_SECONDS, sources.derived(), 60, 2 * 365 * DAY);
                match sources.check(asked) {
                    Ok(retention) => retention,
                    Err(error) => {
                        reader.fail(
                            &format!("{} and {}", cv::RETENTION_SECONDS, cv::SOURCE_RETENTION_SECONDS),
                            error.to_string(),
                        );
                        asked
                    }
                }
            }
        };
        // The producer's retention (the API's records), read by consumers before they had
        // their own name: where it would shorten what this consumer keeps, it is most
        // likely exported for the API beside it, and is refused rather than obeyed or
        // silently dropped; otherwise it does not concern a consumer.
        if !retention_set {
            if let Some(text) = reader.text(vars::RETENTION_SECONDS) {
                match text.parse::<u64>() {
                    Ok(seconds) if seconds >= retention.as_secs() => {}
                    Err(_) => reader.fail(
                        vars::RETENTION_SECONDS,
                        format!(
                            "is {text:?}, not a number of seconds (and it is the producer's, not a consumer's: unset it here, or set {})",
                            cv::RETENTION_SECONDS
                        ),
                    ),
                    Ok(_) => reader.fail(
                        vars::RETENTION_SECONDS,
                        format!(
                            "is {text:?}, shorter than this consumer's dedup retention of {} s: it is the \
                             producer's (the API's records), not a consumer's; unset it here, or set {} \
                             to keep dedup data for less (at least the source queue's {} s)",
                            retention.as_secs(),
                            cv::RETENTION_SECONDS,
                            sources.source_queue.as_secs()
                        ),
                    ),
                }
            }
        }
        let defaults = TransactionLimits::default();
        let limits = TransactionLimits {
            max_messages: reader.count(vars::MAX_MESSAGES_PER_TRANSACTION, defaults.max_messages, 1, 10_000),
            max_message_bytes: reader.count(vars::MAX_TRANSACTION_BYTES, defaults.max_message_bytes, 1, 4_000_000),
        };
        let sdk_operation_timeout = reader.seconds(vars::SDK_OPERATION_TIMEOUT_SECONDS, Duration::from_secs(5), 1, 300);
        match (reader.errors.is_empty(), backend, name) {
            (true, Some(backend), Some(name)) => Ok(Self {
                backend,
                name,
                message_ids,
                destinations,
                sources,
                retention,
                retention_set,
                limits,
                sdk_operation_timeout,
            }),
            _ => Err(SettingsError { errors: reader.errors }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<ConsumerSettings, SettingsError> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        ConsumerSettings::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn the_retention_is_derived_from_the_queues_and_the_producer() {
        let settings = read(&[
            (cv::NAME, "shipping"),
            (cv::SOURCE_RETENTION_SECONDS, "345600"),
            (cv::DLQ_RETENTION_SECONDS, "1209600"),
            (cv::RESEND_WINDOW_SECONDS, "3600"),
        ])
        .unwrap();
        assert_eq!(settings.retention, Duration::from_secs(345_600 + 1_209_600 + 3600));
        assert_eq!(settings.backend, ConsumerBackend::Embedded);
        assert_eq!(settings.message_ids, MessageIds::Outbox);
        // With the defaults: 4 days + 14 days + 1 day.
        assert_eq!(
            read(&[(cv::NAME, "shipping")]).unwrap().retention,
            Duration::from_secs(19 * DAY)
        );
    }

    #[test]
    fn a_retention_shorter_than_the_source_queues_is_refused_naming_both() {
        let error = read(&[
            (cv::NAME, "shipping"),
            (cv::SOURCE_RETENTION_SECONDS, "345600"),
            (cv::RETENTION_SECONDS, "86400"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(cv::RETENTION_SECONDS) && error.contains(cv::SOURCE_RETENTION_SECONDS),
            "{error}"
        );
        assert!(error.contains("86400 s") && error.contains("345600 s"), "{error}");
        // As long as the queue's is allowed (no dead-letter redrive, no re-sends).
        let settings = read(&[
            (cv::NAME, "shipping"),
            (cv::SOURCE_RETENTION_SECONDS, "345600"),
            (cv::RETENTION_SECONDS, "345600"),
        ])
        .unwrap();
        assert_eq!(settings.retention, Duration::from_secs(345_600));
    }

    #[test]
    fn the_producers_retention_variable_never_shortens_a_consumers() {
        // Exported for the API beside it (7 days), it would cut the derived 19 days.
        let error = read(&[(cv::NAME, "shipping"), (vars::RETENTION_SECONDS, "604800")])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(vars::RETENTION_SECONDS) && error.contains(cv::RETENTION_SECONDS),
            "{error}"
        );
        assert!(error.contains(&format!("{} s", 19 * DAY)), "{error}");
        let unreadable = read(&[(cv::NAME, "shipping"), (vars::RETENTION_SECONDS, "a week")]).unwrap_err();
        assert!(unreadable.to_string().contains(vars::RETENTION_SECONDS), "{unreadable}");
        // Longer than the derived figure, or beside the consumer's own variable, it is
        // the producer's business and changes nothing here.
        let longer = read(&[(cv::NAME, "shipping"), (vars::RETENTION_SECONDS, "31536000")]).unwrap();
        assert_eq!(
            (longer.retention, longer.retention_set),
            (Duration::from_secs(19 * DAY), false)
        );
        let beside = read(&[
            (cv::NAME, "shipping"),
            (vars::RETENTION_SECONDS, "604800"),
            (cv::RETENTION_SECONDS, "432000"),
        ])
        .unwrap();
        assert_eq!(
            (beside.retention, beside.retention_set),
            (Duration::from_secs(432_000), true)
        );
        // Empty, as a template that clears a global for its consumer has it: unset.
        assert!(read(&[(cv::NAME, "shipping"), (vars::RETENTION_SECONDS, "")]).is_ok());
    }

    #[test]
    fn the_source_queues_real_retention_wins_over_the_configured_one() {
        let configured = read(&[(cv::NAME, "shipping")]).unwrap();
        // A queue that keeps messages 14 days where 4 were configured: derived again.
        let real = configured
            .clone()
            .with_source_queue_retention(Duration::from_secs(14 * DAY))
            .unwrap();
        assert_eq!(real.retention, Duration::from_secs((14 + 14 + 1) * DAY));
        // A shorter real queue changes nothing: the configured figure still counts.
        let shorter = configured
            .with_source_queue_retention(Duration::from_secs(DAY))
            .unwrap();
        assert_eq!(shorter.retention, Duration::from_secs(19 * DAY));
        // A set retention is checked against the real figure.
        let set = read(&[(cv::NAME, "shipping"), (cv::RETENTION_SECONDS, "432000")]).unwrap();
        let error = set
            .with_source_queue_retention(Duration::from_secs(14 * DAY))
            .unwrap_err();
        assert_eq!(
            (error.retention_seconds, error.source_queue_seconds),
            (432_000, 1_209_600)
        );
    }

    #[test]
    fn each_broken_rule_is_named() {
        let error = read(&[
            (vars::BACKEND, "aws"),
            (cv::MESSAGE_ID, "json:id"),
            ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
        ])
        .unwrap_err()
        .to_string();
        for variable in [vars::TABLE_NAME, cv::NAME, cv::MESSAGE_ID] {
            assert!(error.contains(variable), "{variable} not named: {error}");
        }
        let on_lambda = read(&[(cv::NAME, "shipping"), ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")]).unwrap_err();
        assert!(on_lambda.to_string().contains(vars::BACKEND), "{on_lambda}");
        let aws = read(&[
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "shipping-table"),
            (cv::NAME, "shipping"),
            (cv::QUEUE_URL, "http://127.0.0.1:4566/1/events"),
            (cv::MESSAGE_ID, "attribute:event-id"),
        ])
        .unwrap();
        assert_eq!(aws.message_ids, MessageIds::Attribute("event-id".into()));
        assert!(matches!(aws.backend, ConsumerBackend::Aws { queue_url: Some(_), .. }));
    }
}
