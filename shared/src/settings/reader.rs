//! Reading variables: each value parsed and checked, each problem recorded with the
//! variable it is about, so that one start-up reports them all.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{vars, SettingError, SortKeyValue, TableLayout};
use crate::destination::{Parsed, Target};
use crate::protocol::DestinationName;

pub(crate) struct Reader<'a, F: Fn(&str) -> Option<String>> {
    pub(crate) lookup: &'a F,
    pub(crate) errors: Vec<SettingError>,
}

/// Which kind of backend `OUTBOX_BACKEND` names.
pub(crate) enum BackendKind {
    Embedded,
    Aws,
}

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    /// `OUTBOX_BACKEND`: `embedded` (the default) or `aws`; inside Lambda (its runtime
    /// API is in the environment) only `aws`, since the embedded backend would serve from
    /// one sandbox's memory and lose everything with it.
    pub(crate) fn backend_kind(&mut self) -> Option<BackendKind> {
        let on_lambda = (self.lookup)(super::LAMBDA_RUNTIME_API).is_some();
        match self.text(vars::BACKEND).as_deref() {
            None | Some("embedded") if on_lambda => {
                self.fail(
                    vars::BACKEND,
                    "must be `aws` inside AWS Lambda (AWS_LAMBDA_RUNTIME_API is set): the embedded backend keeps \
                     everything in one sandbox's memory"
                        .to_owned(),
                );
                None
            }
            None | Some("embedded") => Some(BackendKind::Embedded),
            Some("aws") => Some(BackendKind::Aws),
            Some(other) => {
                self.fail(vars::BACKEND, format!("must be `embedded` or `aws`, not {other:?}"));
                None
            }
        }
    }

    pub(crate) fn fail(&mut self, variable: &str, problem: String) {
        self.errors.push(SettingError {
            variable: variable.to_owned(),
            problem,
        });
    }

    /// The trimmed value; an empty one counts as unset.
    pub(crate) fn text(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    }

    pub(crate) fn required(&mut self, name: &str, what: &str) -> Option<String> {
        let value = self.text(name);
        if value.is_none() {
            self.fail(name, format!("is required with {}=aws: {what}", vars::BACKEND));
        }
        value
    }

    /// The table and its layout; `None` (with the errors recorded) when it is wrong. The
    /// table name is required unless there is a `default_table`.
    pub(crate) fn layout(&mut self, default_table: Option<&str>) -> Option<TableLayout> {
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

    /// `OUTBOX_WRITE_REGION`: an AWS Region's name (lowercase letters, digits and
    /// hyphens, such as `us-east-1`), or unset.
    pub(crate) fn write_region(&mut self) -> Option<String> {
        let region = self.text(vars::WRITE_REGION)?;
        let plausible = region.contains('-')
            && region.chars().any(|c| c.is_ascii_digit())
            && region
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !plausible {
            self.fail(
                vars::WRITE_REGION,
                format!("must be an AWS Region's name such as us-east-1, not {region:?}"),
            );
            return None;
        }
        Some(region)
    }

    pub(crate) fn count(&mut self, name: &str, default: usize, min: usize, max: usize) -> usize {
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

    pub(crate) fn seconds(&mut self, name: &str, default: Duration, min: u64, max: u64) -> Duration {
        let Some(text) = self.text(name) else { return default };
        match text.parse::<u64>() {
            Ok(value) if (min..=max).contains(&value) => Duration::from_secs(value),
            _ => {
                self.fail(name, format!("must be whole seconds from {min} to {max}, not {text:?}"));
                default
            }
        }
    }

    pub(crate) fn origins(&mut self) -> Vec<String> {
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

    pub(crate) fn destinations(&mut self) -> BTreeMap<DestinationName, Target> {
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
