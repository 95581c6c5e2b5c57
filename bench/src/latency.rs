//! Per-call latencies modelled on DynamoDB and SQS, with seeded jitter.
//!
//! The defaults are round numbers from AWS's published figures for calls made from
//! inside the same region, not measurements of any one account:
//!
//! - DynamoDB: "single-digit millisecond" reads and writes; a strongly consistent
//!   `GetItem`/`BatchGetItem` of one small item is taken as 5 ms, a `PutItem`,
//!   `UpdateItem` or `BatchWriteItem` as 8 ms (writes go to a quorum of replicas).
//! - `TransactWriteItems`: a transaction costs two underlying writes per item (prepare and
//!   commit) and runs a coordinator, so about twice a write's latency and more: 25 ms.
//! - SQS: `SendMessage` of a small message about 10 ms in-region (8 ms here), a
//!   `SendMessageBatch` a little more (10 ms).
//!
//! Every figure is settable (`--latency get=5ms,transact=25ms`, or `OUTBOX_BENCH_LATENCY`)
//! so that numbers measured in a real account can replace them.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A kind of AWS call, as the request path makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Strongly consistent `GetItem` / `BatchGetItem` (store reads).
    Get,
    /// Conditional `PutItem` (a tombstone; a plain write of one item).
    Put,
    /// `UpdateItem` / `BatchWriteItem` (marking a record dispatched).
    Update,
    /// `TransactWriteItems` (the commit).
    Transact,
    /// SQS `SendMessage` (the control message; a naive dual write's event).
    Send,
    /// SQS `SendMessageBatch` (publishing a transaction's messages).
    SendBatch,
}

impl Call {
    /// Every call, in the order settings are printed.
    pub const ALL: [Call; 6] = [
        Call::Get,
        Call::Put,
        Call::Update,
        Call::Transact,
        Call::Send,
        Call::SendBatch,
    ];

    /// The name used in `--latency` (`get=5ms`).
    pub fn key(self) -> &'static str {
        match self {
            Call::Get => "get",
            Call::Put => "put",
            Call::Update => "update",
            Call::Transact => "transact",
            Call::Send => "send",
            Call::SendBatch => "batch",
        }
    }

    /// The AWS API call it stands for.
    pub fn aws_name(self) -> &'static str {
        match self {
            Call::Get => "GetItem",
            Call::Put => "PutItem",
            Call::Update => "UpdateItem/BatchWriteItem",
            Call::Transact => "TransactWriteItems",
            Call::Send => "SendMessage",
            Call::SendBatch => "SendMessageBatch",
        }
    }

    fn index(self) -> usize {
        Call::ALL.iter().position(|call| *call == self).expect("listed")
    }
}

/// How a modelled latency is waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// `tokio::time::sleep`, which wakes on a whole millisecond tick and so about 1 ms
    /// late on average: every modelled call would pay that on top of its latency.
    Tokio,
    /// `tokio::time::sleep` to [`PRECISE_MARGIN`] before the end, then yielding to the
    /// scheduler until the end: on time to some microseconds, for a little CPU.
    Precise,
}

/// How early [`Timer::Precise`] stops sleeping, to absorb the timer's lateness.
pub const PRECISE_MARGIN: Duration = Duration::from_millis(2);

impl Timer {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Timer::Tokio => "tokio",
            Timer::Precise => "precise",
        }
    }

    /// Waits until `until`.
    pub async fn wait_until(self, until: Instant) {
        match self {
            Timer::Tokio => tokio::time::sleep_until(until.into()).await,
            Timer::Precise => {
                if let Some(coarse) = until.checked_sub(PRECISE_MARGIN) {
                    if coarse > Instant::now() {
                        tokio::time::sleep_until(coarse.into()).await;
                    }
                }
                // Each yield lets every other ready task run first, so waiting tasks
                // share the workers rather than hold them.
                while Instant::now() < until {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

impl FromStr for Timer {
    type Err = String;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        [Timer::Precise, Timer::Tokio]
            .into_iter()
            .find(|timer| timer.name() == input)
            .ok_or_else(|| format!("unknown timer {input:?} (known: precise, tokio)"))
    }
}

/// The nominal latency of each call, how much it varies, and how it is waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Latencies {
    nominal: [Duration; 6],
    /// Each call takes its nominal latency times a factor drawn uniformly from
    /// `1 - jitter ..= 1 + jitter` (0.2 is ±20%), so that percentiles spread.
    pub jitter: f64,
    /// How each latency is waited.
    pub timer: Timer,
}

impl Default for Latencies {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Self {
            // In the order of Call::ALL; the module doc says where they come from.
            nominal: [ms(5), ms(8), ms(8), ms(25), ms(8), ms(10)],
            jitter: 0.2,
            timer: Timer::Precise,
        }
    }
}

impl Latencies {
    /// Every call instantaneous and no jitter: what the embedded backend costs alone.
    pub fn zero() -> Self {
        Self {
            nominal: [Duration::ZERO; 6],
            jitter: 0.0,
            timer: Timer::Precise,
        }
    }

    /// The nominal latency of `call`.
    pub fn nominal(&self, call: Call) -> Duration {
        self.nominal[call.index()]
    }

    /// Sets the nominal latency of `call`.
    pub fn set(&mut self, call: Call, latency: Duration) {
        self.nominal[call.index()] = latency;
    }

    /// Applies `spec`, a comma-separated list of `call=duration` (`get=5ms,batch=12.5ms`);
    /// calls it does not name keep their latency.
    pub fn apply(&mut self, spec: &str) -> Result<(), String> {
        for pair in spec.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("latency {pair:?} is not call=duration"))?;
            let call = Call::ALL
                .into_iter()
                .find(|call| call.key() == key.trim())
                .ok_or_else(|| format!("unknown call {key:?} in --latency (known: {})", known_keys()))?;
            self.set(call, parse_duration(value.trim())?);
        }
        Ok(())
    }

    /// The sum of the nominal latencies of `calls`: what a path costs in the model.
    pub fn model(&self, calls: &[Call]) -> Duration {
        calls.iter().map(|call| self.nominal(*call)).sum()
    }

    /// What a path of `stages` costs in the model: the stages one after another, the
    /// calls of one stage overlapped (the slowest one's latency).
    pub fn staged_model(&self, stages: &[&[Call]]) -> Duration {
        stages
            .iter()
            .map(|stage| stage.iter().map(|call| self.nominal(*call)).max().unwrap_or_default())
            .sum()
    }
}

impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for call in Call::ALL {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{}={}", call.key(), format_duration(self.nominal(call)))?;
        }
        Ok(())
    }
}

fn known_keys() -> String {
    Call::ALL.map(Call::key).join(", ")
}

/// Parses `5ms`, `2.5ms`, `800us`, `1s` or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("duration {text:?} is not a number followed by us, ms or s");
    let (number, scale) = if let Some(number) = text.strip_suffix("us") {
        (number, 1e-6)
    } else if let Some(number) = text.strip_suffix("ms") {
        (number, 1e-3)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1.0)
    } else if text == "0" {
        ("0", 0.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 || value * scale > 60.0 {
        return Err(format!("duration {text:?} must be between 0 and 60 s"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// `5ms`, `2.5ms` (to the microsecond): a form that `parse_duration` reads back.
pub fn format_duration(duration: Duration) -> String {
    let micros = duration.as_micros();
    if micros % 1000 == 0 {
        format!("{}ms", micros / 1000)
    } else {
        // Exact for whole microseconds: f64 holds them with room to spare.
        format!("{}ms", micros as f64 / 1000.0)
    }
}

/// Draws each call's latency and waits for it. Shared by every wrapped port of a run.
#[derive(Debug)]
pub struct Delays {
    latencies: Latencies,
    // A std mutex: held only to draw one number, never across an await.
    rng: Mutex<fastrand::Rng>,
}

impl Delays {
    /// Delays drawn from `latencies`, with jitter from a generator seeded with `seed`.
    /// Under concurrency the order of draws follows scheduling, so a seed fixes the
    /// distribution exactly and the sequence only for sequential runs.
    pub fn new(latencies: Latencies, seed: u64) -> Self {
        Self {
            latencies,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    /// The latencies these delays follow.
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    /// One draw of `call`'s latency.
    pub fn sample(&self, call: Call) -> Duration {
        let nominal = self.latencies.nominal(call);
        let jitter = self.latencies.jitter;
        if jitter == 0.0 || nominal.is_zero() {
            return nominal;
        }
        let unit = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).f64();
        nominal.mul_f64(1.0 + jitter * (2.0 * unit - 1.0))
    }

    /// Waits as long as one `call` takes. A zero latency does not touch the timer, so
    /// that a run with every latency at zero measures the embedded backend alone.
    pub async fn wait(&self, call: Call) {
        let latency = self.sample(call);
        if !latency.is_zero() {
            self.latencies.timer.wait_until(Instant::now() + latency).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_published_figures() {
        let latencies = Latencies::default();
        assert_eq!(
            latencies.to_string(),
            "get=5ms,put=8ms,update=8ms,transact=25ms,send=8ms,batch=10ms"
        );
        assert_eq!(latencies.jitter, 0.2);
    }

    #[test]
    fn a_spec_overrides_only_the_calls_it_names() {
        let mut latencies = Latencies::default();
        latencies.apply("get=3ms, transact=12.5ms,batch=800us").unwrap();
        assert_eq!(
            latencies.to_string(),
            "get=3ms,put=8ms,update=8ms,transact=12.5ms,send=8ms,batch=0.8ms"
        );
        assert!(latencies.apply("scan=3ms").is_err());
        assert!(latencies.apply("get").is_err());
        assert!(latencies.apply("get=fast").is_err());
        assert!(latencies.apply("get=-1ms").is_err());
    }

    #[test]
    fn durations_read_back_as_written() {
        for text in ["0ms", "5ms", "2.5ms", "0.75ms", "1000ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_its_band_and_is_seeded() {
        let draws = |seed| {
            let delays = Delays::new(Latencies::default(), seed);
            (0..1000).map(|_| delays.sample(Call::Transact)).collect::<Vec<_>>()
        };
        let first = draws(7);
        assert_eq!(first, draws(7));
        let (low, high) = (Duration::from_millis(20), Duration::from_millis(30));
        assert!(first.iter().all(|d| (low..=high).contains(d)));
        assert!(first.iter().any(|d| *d < Duration::from_millis(21)));
        assert!(first.iter().any(|d| *d > Duration::from_millis(29)));
    }

    #[tokio::test]
    async fn the_precise_timer_is_never_early() {
        for timer in [Timer::Precise, Timer::Tokio] {
            let started = Instant::now();
            timer.wait_until(started + Duration::from_millis(3)).await;
            assert!(started.elapsed() >= Duration::from_millis(3), "{timer:?}");
        }
        assert_eq!("tokio".parse::<Timer>().unwrap(), Timer::Tokio);
        assert!("fast".parse::<Timer>().is_err());
    }

    #[test]
    fn overlapped_calls_cost_the_slowest_one() {
        let latencies = Latencies::default();
        let ms = Duration::from_millis;
        assert_eq!(latencies.model(&[Call::Get, Call::Put, Call::Send]), ms(21));
        assert_eq!(
            latencies.staged_model(&[&[Call::Send, Call::Get], &[Call::Transact]]),
            ms(33)
        );
        assert_eq!(latencies.staged_model(&[&[], &[Call::Get]]), ms(5));
    }

    #[test]
    fn no_jitter_means_the_nominal_latency() {
        let delays = Delays::new(Latencies::zero(), 1);
        assert_eq!(delays.sample(Call::Get), Duration::ZERO);
    }
}
