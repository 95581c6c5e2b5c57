//! Time and randomness, injected so that tests and the simulation control them.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::protocol::TxnId;
use crate::time::Timestamp;

/// Wall-clock time and waiting.
#[async_trait]
pub trait Clock: Send + Sync {
    /// The current wall-clock instant.
    fn now(&self) -> Timestamp;

    /// Waits for `duration` (backoff between retries, long-poll pauses).
    async fn sleep(&self, duration: Duration);

    /// Completes once `duration` of real time has passed: the timer that cuts an
    /// operation in flight short at a deadline. Unlike [`Clock::sleep`] it is raced
    /// against other work, never awaited alone; a simulated clock may leave it pending
    /// forever and model a cut-short operation as a lost reply instead.
    async fn timer(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

/// The operating system's clock and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

/// Where transaction ids come from.
pub trait IdSource: Send + Sync {
    /// A new, unique transaction id for a transaction beginning at `now`.
    fn next_txn_id(&self, now: Timestamp) -> TxnId;
}

/// UUID v7 ids from the system's random source.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn next_txn_id(&self, now: Timestamp) -> TxnId {
        let mut random = [0u8; 10];
        random.iter_mut().for_each(|byte| *byte = fastrand::u8(..));
        TxnId::from_parts(now, random)
    }
}
