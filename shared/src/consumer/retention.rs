//! How long a consumer keeps each message's dedup data (C4): from its dispatch, for
//! longer than any copy of the message can still arrive.

use std::time::Duration;

/// Where copies of a message can come from, and for how long: the figures the retention
/// must outlive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// The source queue's `MessageRetentionPeriod`: a copy delivered late (a long
    /// redelivery chain) can arrive until it ends.
    pub source_queue: Duration,
    /// The dead-letter queue's `MessageRetentionPeriod`: a copy parked there can be
    /// redriven to the source queue until it ends.
    pub dead_letter_queue: Duration,
    /// How long the producer may send a message again (its own retries, a replay).
    pub resend_window: Duration,
}

/// A retention that does not outlive the source queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the consumer's retention of {retention_seconds} s is shorter than its source queue's message retention of {source_queue_seconds} s: a copy delivered late would be processed again"
)]
pub struct RetentionError {
    /// The retention asked for, in seconds.
    pub retention_seconds: u64,
    /// The source queue's, in seconds.
    pub source_queue_seconds: u64,
}

impl Retention {
    /// The retention that outlives them all: their sum, since a copy can wait out the
    /// source queue, then the dead-letter queue, and a producer can send it again after
    /// both.
    pub fn derived(&self) -> Duration {
        self.source_queue + self.dead_letter_queue + self.resend_window
    }

    /// `retention`, if it outlives at least the source queue; else the error naming both
    /// figures. Shorter than [`Self::derived`] is allowed (a dead-letter queue that is
    /// never redriven, a producer that never re-sends), never shorter than the queue.
    pub fn check(&self, retention: Duration) -> Result<Duration, RetentionError> {
        if retention < self.source_queue {
            Err(RetentionError {
                retention_seconds: retention.as_secs(),
                source_queue_seconds: self.source_queue.as_secs(),
            })
        } else {
            Ok(retention)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn the_retention_outlives_the_queue_its_dead_letters_and_the_producer() {
        let figures = Retention {
            source_queue: 4 * DAY,
            dead_letter_queue: 14 * DAY,
            resend_window: DAY,
        };
        assert_eq!(figures.derived(), 19 * DAY);
        assert_eq!(figures.check(figures.derived()), Ok(19 * DAY));
        assert_eq!(figures.check(4 * DAY), Ok(4 * DAY));
        let error = figures.check(3 * DAY).unwrap_err();
        assert_eq!(error.retention_seconds, 259_200);
        assert!(
            error.to_string().contains("259200 s") && error.to_string().contains("345600 s"),
            "{error}"
        );
    }
}
