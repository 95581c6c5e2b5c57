//! Where a destination's messages go, named explicitly: an SQS queue, an SNS topic or an
//! EventBridge bus, FIFO stated rather than guessed from a suffix.
//!
//! One entry of `OUTBOX_DESTINATIONS` is `name=kind:target`:
//!
//! | kind | target | example |
//! |---|---|---|
//! | `sqs` | a standard queue's URL | `events=sqs:https://sqs.us-east-1.amazonaws.com/123456789012/events` |
//! | `sqs-fifo` | a FIFO queue's URL (ends in `.fifo`) | `audit=sqs-fifo:https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo` |
//! | `sns` | a standard topic's ARN | `events=sns:arn:aws:sns:us-east-1:123456789012:events` |
//! | `sns-fifo` | a FIFO topic's ARN (ends in `.fifo`) | `audit=sns-fifo:arn:aws:sns:us-east-1:123456789012:audit.fifo` |
//! | `eventbridge` | a bus's name or ARN | `events=eventbridge:orders` |
//!
//! The older form `name=queue-url` still works: it is an SQS queue, FIFO when the URL ends
//! in `.fifo` as before, and [`Target::parse`] says how to write it in the new form.
//!
//! [`crate::aws::AwsPublisher`] sends to each kind; the embedded backend stands in for
//! every kind with a queue ([`crate::embedded::EmbeddedBackend::for_targets`]).

use std::fmt;

/// Where one destination's messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An SQS queue, by URL.
    SqsQueue {
        /// The queue's URL.
        url: String,
        /// Whether it is a FIFO queue.
        fifo: bool,
    },
    /// An SNS topic, by ARN.
    SnsTopic {
        /// The topic's ARN.
        arn: String,
        /// Whether it is a FIFO topic.
        fifo: bool,
    },
    /// An EventBridge event bus, by name or ARN.
    EventBus {
        /// The bus's name or ARN, as `PutEvents` takes it.
        name_or_arn: String,
    },
}

/// A target that breaks its kind's rule. Its text names the rule; the settings name the
/// variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The kind before the first `:` is none of the known ones.
    #[error(
        "unknown destination kind {kind:?}: write sqs:, sqs-fifo:, sns:, sns-fifo: or eventbridge: before the target"
    )]
    UnknownKind {
        /// What was written.
        kind: String,
    },
    /// Nothing after the kind.
    #[error("{kind}: names no target")]
    Empty {
        /// The kind.
        kind: &'static str,
    },
    /// An SQS target that is not an http(s) URL.
    #[error("{kind}: the target must be the queue's URL (http:// or https://), not {target:?}")]
    NotAQueueUrl {
        /// The kind.
        kind: &'static str,
        /// What was written.
        target: String,
    },
    /// An SNS target that is not a topic ARN.
    #[error("{kind}: the target must be a topic ARN (arn:<partition>:sns:<region>:<account>:<topic>), not {target:?}")]
    NotATopicArn {
        /// The kind.
        kind: &'static str,
        /// What was written.
        target: String,
    },
    /// An EventBridge target that is neither a bus name nor a bus ARN.
    #[error("eventbridge: the target must be a bus name (1 to 256 of A-Z a-z 0-9 . _ - /) or a bus ARN (arn:<partition>:events:<region>:<account>:event-bus/<name>), not {target:?}")]
    NotABus {
        /// What was written.
        target: String,
    },
    /// The FIFO kind and the name's `.fifo` suffix disagree.
    #[error("{kind}: {target:?} {rule}")]
    FifoMismatch {
        /// The kind.
        kind: &'static str,
        /// What was written.
        target: String,
        /// Which way they disagree.
        rule: &'static str,
    },
}

/// The result of reading one target: the target, and, for the older form, how to write
/// it in the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The target.
    pub target: Target,
    /// For an entry in the older `name=queue-url` form: the same entry in the new form.
    pub migrate_to: Option<String>,
}

const FIFO_SUFFIX: &str = ".fifo";
const NEEDS_FIFO_KIND: &str = "ends in .fifo: a FIFO target takes the -fifo kind";
const NEEDS_FIFO_SUFFIX: &str = "does not end in .fifo, which every FIFO queue and topic name does";

impl Target {
    /// Reads one entry's target (what follows `name=`).
    pub fn parse(text: &str) -> Result<Parsed, TargetError> {
        let text = text.trim();
        // The older form: a bare queue URL.
        if text.starts_with("http://") || text.starts_with("https://") {
            let fifo = text.ends_with(FIFO_SUFFIX);
            let kind = if fifo { "sqs-fifo" } else { "sqs" };
            return Ok(Parsed {
                target: Target::SqsQueue {
                    url: text.to_owned(),
                    fifo,
                },
                migrate_to: Some(format!("{kind}:{text}")),
            });
        }
        let (kind, target) = text.split_once(':').unwrap_or((text, ""));
        let target = target.trim();
        let parsed = match kind.trim() {
            "sqs" => Self::queue("sqs", target, false)?,
            "sqs-fifo" => Self::queue("sqs-fifo", target, true)?,
            "sns" => Self::topic("sns", target, false)?,
            "sns-fifo" => Self::topic("sns-fifo", target, true)?,
            "eventbridge" => Self::bus(target)?,
            other => return Err(TargetError::UnknownKind { kind: other.to_owned() }),
        };
        Ok(Parsed {
            target: parsed,
            migrate_to: None,
        })
    }

    /// Whether messages to it are ordered and deduplicated (FIFO).
    pub fn is_fifo(&self) -> bool {
        match self {
            Self::SqsQueue { fifo, .. } | Self::SnsTopic { fifo, .. } => *fifo,
            Self::EventBus { .. } => false,
        }
    }

    fn queue(kind: &'static str, target: &str, fifo: bool) -> Result<Self, TargetError> {
        nonempty(kind, target)?;
        if !(target.starts_with("http://") || target.starts_with("https://")) {
            return Err(TargetError::NotAQueueUrl {
                kind,
                target: target.to_owned(),
            });
        }
        fifo_agrees(kind, target, fifo)?;
        Ok(Self::SqsQueue {
            url: target.to_owned(),
            fifo,
        })
    }

    fn topic(kind: &'static str, target: &str, fifo: bool) -> Result<Self, TargetError> {
        nonempty(kind, target)?;
        let parts: Vec<&str> = target.splitn(6, ':').collect();
        let valid = parts.len() == 6
            && parts[0] == "arn"
            && !parts[1].is_empty()
            && parts[2] == "sns"
            && !parts[3].is_empty()
            && parts[4].len() == 12
            && parts[4].bytes().all(|byte| byte.is_ascii_digit())
            && valid_topic_name(parts[5]);
        if !valid {
            return Err(TargetError::NotATopicArn {
                kind,
                target: target.to_owned(),
            });
        }
        fifo_agrees(kind, target, fifo)?;
        Ok(Self::SnsTopic {
            arn: target.to_owned(),
            fifo,
        })
    }

    fn bus(target: &str) -> Result<Self, TargetError> {
        nonempty("eventbridge", target)?;
        let name = match target.strip_prefix("arn:") {
            Some(rest) => {
                let parts: Vec<&str> = rest.splitn(5, ':').collect();
                let valid = parts.len() == 5
                    && !parts[0].is_empty()
                    && parts[1] == "events"
                    && !parts[2].is_empty()
                    && parts[3].len() == 12
                    && parts[3].bytes().all(|byte| byte.is_ascii_digit());
                parts
                    .get(4)
                    .and_then(|resource| resource.strip_prefix("event-bus/"))
                    .filter(|_| valid)
            }
            None => Some(target),
        };
        match name {
            Some(name) if valid_bus_name(name) => Ok(Self::EventBus {
                name_or_arn: target.to_owned(),
            }),
            _ => Err(TargetError::NotABus {
                target: target.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Target {
    /// The target in the form `OUTBOX_DESTINATIONS` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SqsQueue { url, fifo: false } => write!(f, "sqs:{url}"),
            Self::SqsQueue { url, fifo: true } => write!(f, "sqs-fifo:{url}"),
            Self::SnsTopic { arn, fifo: false } => write!(f, "sns:{arn}"),
            Self::SnsTopic { arn, fifo: true } => write!(f, "sns-fifo:{arn}"),
            Self::EventBus { name_or_arn } => write!(f, "eventbridge:{name_or_arn}"),
        }
    }
}

fn nonempty(kind: &'static str, target: &str) -> Result<(), TargetError> {
    if target.is_empty() {
        Err(TargetError::Empty { kind })
    } else {
        Ok(())
    }
}

fn fifo_agrees(kind: &'static str, target: &str, fifo: bool) -> Result<(), TargetError> {
    match (fifo, target.ends_with(FIFO_SUFFIX)) {
        (false, true) => Err(TargetError::FifoMismatch {
            kind,
            target: target.to_owned(),
            rule: NEEDS_FIFO_KIND,
        }),
        (true, false) => Err(TargetError::FifoMismatch {
            kind,
            target: target.to_owned(),
            rule: NEEDS_FIFO_SUFFIX,
        }),
        _ => Ok(()),
    }
}

/// SNS topic names: 1 to 256 of A-Z a-z 0-9 _ - (a FIFO topic's ends in `.fifo`).
fn valid_topic_name(name: &str) -> bool {
    let base = name.strip_suffix(FIFO_SUFFIX).unwrap_or(name);
    (1..=256).contains(&name.len())
        && !base.is_empty()
        && base
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// EventBridge bus names: 1 to 256 of A-Z a-z 0-9 . _ - / (partner buses contain `/`).
fn valid_bus_name(name: &str) -> bool {
    (1..=256).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Target {
        let parsed = Target::parse(text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
        assert_eq!(parsed.migrate_to, None, "{text:?} is in the new form");
        parsed.target
    }

    #[test]
    fn every_kind_is_read_and_written_back_the_same() {
        let entries = [
            "sqs:https://sqs.us-east-1.amazonaws.com/123456789012/events",
            "sqs-fifo:https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo",
            "sns:arn:aws:sns:us-east-1:123456789012:events",
            "sns-fifo:arn:aws:sns:us-east-1:123456789012:audit.fifo",
            "eventbridge:orders",
            "eventbridge:arn:aws:events:us-east-1:123456789012:event-bus/orders",
            "eventbridge:aws.partner/example.com/123/stream",
        ];
        for entry in entries {
            assert_eq!(parse(entry).to_string(), entry);
        }
        assert!(parse(entries[1]).is_fifo() && parse(entries[3]).is_fifo());
        assert!(!parse(entries[0]).is_fifo() && !parse(entries[2]).is_fifo() && !parse(entries[4]).is_fifo());
    }

    #[test]
    fn the_older_form_still_reads_as_a_queue_and_says_how_to_migrate() {
        let standard = Target::parse("http://127.0.0.1:4566/123456789012/events").unwrap();
        assert_eq!(
            standard.target,
            Target::SqsQueue {
                url: "http://127.0.0.1:4566/123456789012/events".into(),
                fifo: false
            }
        );
        assert_eq!(
            standard.migrate_to.as_deref(),
            Some("sqs:http://127.0.0.1:4566/123456789012/events")
        );
        let fifo = Target::parse("https://sqs.eu-west-1.amazonaws.com/123456789012/audit.fifo").unwrap();
        assert!(fifo.target.is_fifo());
        assert_eq!(
            fifo.migrate_to.as_deref(),
            Some("sqs-fifo:https://sqs.eu-west-1.amazonaws.com/123456789012/audit.fifo")
        );
    }

    #[test]
    fn each_broken_rule_is_named() {
        let cases: [(&str, &str); 10] = [
            ("kafka:topic", "unknown destination kind \"kafka\""),
            ("sqs:", "sqs: names no target"),
            ("sqs:events", "must be the queue's URL"),
            ("sqs:https://q/audit.fifo", "a FIFO target takes the -fifo kind"),
            ("sqs-fifo:https://q/audit", "does not end in .fifo"),
            ("sns:arn:aws:sqs:us-east-1:123456789012:events", "must be a topic ARN"),
            ("sns:arn:aws:sns:us-east-1:12345:events", "must be a topic ARN"),
            (
                "sns:arn:aws:sns:us-east-1:123456789012:audit.fifo",
                "a FIFO target takes the -fifo kind",
            ),
            ("eventbridge:orders bus", "must be a bus name"),
            (
                "eventbridge:arn:aws:events:us-east-1:123456789012:rule/orders",
                "must be a bus name",
            ),
        ];
        for (text, expected) in cases {
            let error = Target::parse(text).expect_err(text).to_string();
            assert!(
                error.contains(expected),
                "{text:?}: {error:?} does not say {expected:?}"
            );
        }
    }
}
