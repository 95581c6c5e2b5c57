//! Wall-clock instants as milliseconds since the Unix epoch.
//!
//! The protocol stores times in records and messages (`first_sent_at`, TTLs), so they
//! need a plain, serialisable representation that every backend agrees on. Instants are
//! only ever compared to decide latency matters (windows, TTL); safety never depends on
//! them (invariant I5).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// An instant in wall-clock time, in whole milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The instant `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Whole seconds since the Unix epoch, rounded down (DynamoDB's TTL unit).
    pub const fn as_unix_seconds(self) -> u64 {
        self.0 / 1000
    }

    /// The instant `time`, in whole milliseconds (the epoch for a time before it).
    pub fn from_system_time(time: SystemTime) -> Self {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        Self(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    /// This instant moved forward by `duration`, saturating at the far future.
    pub fn plus(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// This instant moved back by `duration`, saturating at the epoch.
    pub fn minus(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_sub(millis))
    }

    /// How long after `earlier` this instant is; zero when it is not after it.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.plus(Duration::from_millis(500)).as_millis(), 1_500);
        assert_eq!(t.since(Timestamp::from_millis(2_000)), Duration::ZERO);
        assert_eq!(
            Timestamp::from_millis(u64::MAX)
                .plus(Duration::from_secs(1))
                .as_millis(),
            u64::MAX
        );
        assert_eq!(Timestamp::from_millis(61_999).as_unix_seconds(), 61);
    }
}
