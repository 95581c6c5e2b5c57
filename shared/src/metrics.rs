//! Metrics in CloudWatch Embedded Metric Format: one JSON line on standard output per
//! record, which CloudWatch Logs turns into metrics with no API call and no agent.
//!
//! Hand-written because the format is a dozen lines of JSON and the crates that emit it
//! bring a metrics facade this project does not otherwise need.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use crate::time::Timestamp;

/// The namespace of every metric of this system.
pub const NAMESPACE: &str = "ControlMessageOutbox";

/// A metric's unit, as CloudWatch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A count.
    Count,
    /// Milliseconds.
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Milliseconds => "Milliseconds",
        }
    }
}

/// One EMF record: several metrics under one `Service` dimension at one instant.
#[derive(Debug, Clone)]
pub struct MetricRecord {
    service: Cow<'static, str>,
    at: Timestamp,
    metrics: Vec<(&'static str, Unit, Vec<f64>)>,
}

impl MetricRecord {
    /// An empty record for `service` (`api`, `control-worker`) at `at`.
    pub fn new(service: impl Into<Cow<'static, str>>, at: Timestamp) -> Self {
        Self {
            service: service.into(),
            at,
            metrics: Vec::new(),
        }
    }

    /// Adds a metric with one or more values (EMF allows up to 100 per metric).
    pub fn add(mut self, name: &'static str, unit: Unit, values: impl IntoIterator<Item = f64>) -> Self {
        let values: Vec<f64> = values.into_iter().take(100).collect();
        if !values.is_empty() {
            self.metrics.push((name, unit, values));
        }
        self
    }

    /// Adds a count.
    pub fn count(self, name: &'static str, count: usize) -> Self {
        self.add(name, Unit::Count, [count as f64])
    }

    /// Whether the record holds any metric.
    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty()
    }

    /// The record as an EMF JSON document.
    pub fn to_json(&self) -> Value {
        let definitions: Vec<Value> = self
            .metrics
            .iter()
            .map(|(name, unit, _)| json!({"Name": name, "Unit": unit.as_str()}))
            .collect();
        let mut document = Map::new();
        document.insert(
            "_aws".into(),
            json!({
                "Timestamp": self.at.as_millis(),
                "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [["Service"]], "Metrics": definitions}],
            }),
        );
        document.insert("Service".into(), Value::from(self.service.as_ref()));
        for (name, _, values) in &self.metrics {
            let value = if values.len() == 1 {
                json!(values[0])
            } else {
                json!(values)
            };
            document.insert((*name).into(), value);
        }
        Value::Object(document)
    }

    /// Writes the record to standard output on Lambda (or wherever `OUTBOX_EMF=1`),
    /// where the log capture turns it into metrics; elsewhere logs it at debug level, so
    /// that a local console shows logs rather than metric documents.
    pub fn emit(&self) {
        static TO_STDOUT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let to_stdout = *TO_STDOUT.get_or_init(|| {
            std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some()
                || std::env::var("OUTBOX_EMF").is_ok_and(|v| v == "1")
        });
        if self.is_empty() {
            return;
        }
        if to_stdout {
            println!("{}", self.to_json());
        } else {
            tracing::debug!(metrics = %self.to_json(), "metrics");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_embedded_metric_format() {
        let record = MetricRecord::new("control-worker", Timestamp::from_millis(1_700_000_000_000))
            .count("Tombstones", 2)
            .add("DispatchLag", Unit::Milliseconds, [120.0, 80.0])
            .count("Nothing", 0);
        let json = record.to_json();
        assert_eq!(json["_aws"]["Timestamp"], 1_700_000_000_000u64);
        let directive = &json["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(directive["Dimensions"], json!([["Service"]]));
        assert_eq!(
            directive["Metrics"][1],
            json!({"Name": "DispatchLag", "Unit": "Milliseconds"})
        );
        assert_eq!(json["Service"], "control-worker");
        assert_eq!(json["Tombstones"], 2.0);
        assert_eq!(json["DispatchLag"], json!([120.0, 80.0]));
        assert_eq!(json["Nothing"], 0.0, "a zero count is still reported");
    }
}
