//! Running a rig's requests one at a time (latency) and C at a time (throughput), and
//! summarising what was timed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::latency::Timer;
use crate::variants::Rig;
use crate::BenchError;

/// Latency percentiles of one set of requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many requests.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
}

impl Summary {
    /// Nearest-rank percentiles of `samples` (at least one).
    pub fn of(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "no samples to summarise");
        samples.sort_unstable();
        Self {
            count: samples.len(),
            p50: percentile(&samples, 0.50),
            p90: percentile(&samples, 0.90),
            p99: percentile(&samples, 0.99),
        }
    }
}

/// The nearest-rank percentile `q` (0 to 1) of `sorted`, which is not empty.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Requests `first..first + count`, one after another: each one's latency.
pub async fn sequential(rig: &Rig, first: usize, count: usize) -> Result<Vec<Duration>, BenchError> {
    let mut samples = Vec::with_capacity(count);
    for index in first..first + count {
        let started = Instant::now();
        rig.request(index).await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// What a concurrent run gives: each request's latency, and the time for all of them.
#[derive(Debug)]
pub struct Concurrent {
    /// Each request's latency, in completion order.
    pub samples: Vec<Duration>,
    /// From the first start to the last finish.
    pub elapsed: Duration,
}

impl Concurrent {
    /// Requests per second over the whole run.
    pub fn throughput(&self) -> f64 {
        self.samples.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Requests `first..first + count`, `concurrency` at a time (each of `concurrency` tasks
/// takes the next index as soon as its previous request is answered: a closed loop, as
/// that many clients would).
pub async fn concurrent(
    rig: Arc<Rig>,
    first: usize,
    count: usize,
    concurrency: usize,
) -> Result<Concurrent, BenchError> {
    let next = Arc::new(AtomicUsize::new(first));
    let end = first + count;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (rig, next) = (rig.clone(), next.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= end {
                        return Ok::<_, BenchError>(samples);
                    }
                    let began = Instant::now();
                    rig.request(index).await?;
                    samples.push(began.elapsed());
                }
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(count);
    for task in tasks {
        samples.extend(task.await.map_err(BenchError::Task)??);
    }
    Ok(Concurrent {
        samples,
        elapsed: started.elapsed(),
    })
}

/// How much later than asked `timer` ends a wait of `nominal` on this machine: paid once
/// per modelled call (for `tokio::time::sleep`, its 1 ms granularity and the wake-up).
pub async fn timer_lateness(timer: Timer, nominal: Duration, count: usize) -> Summary {
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        timer.wait_until(started + nominal).await;
        samples.push(started.elapsed().saturating_sub(nominal));
    }
    Summary::of(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let summary = Summary::of(samples);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50, Duration::from_millis(50));
        assert_eq!(summary.p90, Duration::from_millis(90));
        assert_eq!(summary.p99, Duration::from_millis(99));
        let one = Summary::of(vec![Duration::from_millis(7)]);
        assert_eq!((one.p50, one.p99), (Duration::from_millis(7), Duration::from_millis(7)));
    }
}
