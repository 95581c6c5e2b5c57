//! A clock that moves only when told to, for tests.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::ports::Clock;
use crate::time::Timestamp;

/// A manually driven clock. `sleep` advances it by the duration slept, so code that
/// backs off finishes at once while time still passes as it would. `timer` waits in
/// tokio time (so that tests with paused time can stall an operation past a deadline)
/// and, when it fires, advances this clock by as much: the deadline has passed on both.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        let mut now = self.now.lock().expect("clock lock");
        *now = now.plus(duration);
    }

    /// Sets the clock to `instant` (forward or back: wall clocks jump).
    pub fn set(&self, instant: Timestamp) {
        *self.now.lock().expect("clock lock") = instant;
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().expect("clock lock")
    }

    async fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }

    async fn timer(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
        self.advance(duration);
    }
}
