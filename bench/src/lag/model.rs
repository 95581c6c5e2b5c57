//! The simulation's settings: the load, the modelled AWS latencies, the event source
//! mapping, and the command line that sets them.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// A modelled AWS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Strongly consistent `GetItem` / `BatchGetItem` (a read; the worker's check).
    Get,
    /// Conditional `PutItem` (a tombstone).
    Put,
    /// `BatchWriteItem` / `UpdateItem` (marking a record dispatched).
    Update,
    /// `TransactWriteItems` (the commit).
    Transact,
    /// SQS `SendMessage` (a control message, first or deferred).
    Send,
    /// SQS `SendMessageBatch` (publishing a transaction's messages).
    SendBatch,
    /// The event source mapping's delay from a control message becoming visible to the
    /// worker's invocation with it (its long poll returning, plus the batching window).
    Receive,
}

/// Nominal latencies in milliseconds and their jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct Latencies {
    /// `GetItem` / `BatchGetItem`, consistent.
    pub get_ms: f64,
    /// `PutItem`.
    pub put_ms: f64,
    /// `UpdateItem` / `BatchWriteItem`.
    pub update_ms: f64,
    /// `TransactWriteItems`.
    pub transact_ms: f64,
    /// `SendMessage`.
    pub send_ms: f64,
    /// `SendMessageBatch`.
    pub batch_ms: f64,
    /// Visible → received by the event source mapping.
    pub receive_ms: f64,
    /// Each latency is its nominal value times a factor uniform in `1 ± jitter`.
    pub jitter: f64,
    /// How long before a call returns its effect happens (the reply's transit): a write
    /// is visible to others, a message is on its queue, this long before the caller
    /// hears of it.
    pub reply_ms: f64,
}

impl Default for Latencies {
    /// The request-path benchmark's round figures for in-region calls (see
    /// `crate::latency`): DynamoDB single-digit-millisecond reads and writes, a
    /// transaction about three writes, SQS sends about 10 ms; 20 ms from visible to
    /// invoked for the event source mapping's long poll with a batching window of 0.
    fn default() -> Self {
        Self {
            get_ms: 5.0,
            put_ms: 8.0,
            update_ms: 8.0,
            transact_ms: 25.0,
            send_ms: 8.0,
            batch_ms: 10.0,
            receive_ms: 20.0,
            jitter: 0.2,
            reply_ms: 1.0,
        }
    }
}

impl Latencies {
    fn nominal(&self, call: Call) -> f64 {
        match call {
            Call::Get => self.get_ms,
            Call::Put => self.put_ms,
            Call::Update => self.update_ms,
            Call::Transact => self.transact_ms,
            Call::Send => self.send_ms,
            Call::SendBatch => self.batch_ms,
            Call::Receive => self.receive_ms,
        }
    }

    /// One line describing them, for the report.
    pub fn describe(&self) -> String {
        format!(
            "get {} ms, put {} ms, update {} ms, transact {} ms, send {} ms, batch {} ms, \
             visible->invoked {} ms, jitter ±{:.0}%, effect {} ms before the reply",
            self.get_ms,
            self.put_ms,
            self.update_ms,
            self.transact_ms,
            self.send_ms,
            self.batch_ms,
            self.receive_ms,
            self.jitter * 100.0,
            self.reply_ms
        )
    }

    fn set(&mut self, key: &str, value: f64) -> Result<(), String> {
        let field = match key {
            "get" => &mut self.get_ms,
            "put" => &mut self.put_ms,
            "update" => &mut self.update_ms,
            "transact" => &mut self.transact_ms,
            "send" => &mut self.send_ms,
            "batch" => &mut self.batch_ms,
            "receive" => &mut self.receive_ms,
            "reply" => &mut self.reply_ms,
            other => return Err(format!("unknown latency {other:?}")),
        };
        *field = value;
        Ok(())
    }
}

/// Seeded draws of call latencies, shared by every port of one run.
pub struct Draws {
    latencies: Latencies,
    rng: Mutex<fastrand::Rng>,
}

impl Draws {
    /// Draws from `latencies` with `seed`.
    pub fn new(latencies: Latencies, seed: u64) -> Self {
        Self {
            latencies,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    /// A latency of `call`, in whole milliseconds (the clock's unit).
    pub fn latency(&self, call: Call) -> Duration {
        let nominal = self.latencies.nominal(call);
        let jitter = self.latencies.jitter.clamp(0.0, 1.0);
        let u = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).f64();
        let ms = nominal * (1.0 - jitter + 2.0 * jitter * u);
        Duration::from_millis(ms.round().max(0.0) as u64)
    }

    /// A latency of `call` split into before its effect and after it (the reply).
    pub fn split(&self, call: Call) -> (Duration, Duration) {
        let total = self.latency(call);
        let reply = Duration::from_millis(self.latencies.reply_ms.round().max(0.0) as u64).min(total);
        (total - reply, reply)
    }
}

/// What one run simulates.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Transactions per configuration.
    pub transactions: usize,
    /// Mean arrivals per second (a Poisson process).
    pub rate: f64,
    /// Seed of the arrivals, latencies and crashes.
    pub seed: u64,
    /// Event source mapping pollers receiving concurrently.
    pub workers: usize,
    /// Share of requests that crash after their commit, in the crash configuration.
    pub crash_fraction: f64,
    /// The call latencies.
    pub latencies: Latencies,
    /// Where to write the JSON, if anywhere.
    pub json: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            transactions: 1000,
            rate: 20.0,
            seed: 12,
            workers: 5,
            crash_fraction: 0.01,
            latencies: Latencies::default(),
            json: None,
        }
    }
}

/// The help text.
pub const HELP: &str = "\
dispatch-lag-sim: the dispatch lag (commit acknowledged -> message on the destination
queue) on a virtual clock, with the real request path and control path on the embedded
backend and modelled AWS latencies. Configurations: inline publishing off with first
check delays 0, 1 and 5 s; inline on (first check 1 s); inline on with a share of the
requests crashing after their commit.

Options:
  --transactions N     transactions per configuration (default 1000)
  --rate R             mean arrivals per second, Poisson (default 20)
  --seed S             seed of arrivals, latencies and crashes (default 12)
  --workers W          event source mapping pollers (default 5)
  --crash-fraction F   share of requests crashing after commit (default 0.01)
  --latency K=MS,...   set latencies: get, put, update, transact, send, batch,
                       receive (visible -> invoked), reply (effect before the reply)
  --jitter J           latency factor uniform in 1 +- J (default 0.2)
  --json PATH          write every configuration's lags and summary there
  --help               this text
";

fn number<T: std::str::FromStr>(name: &str, text: String) -> Result<T, String> {
    text.parse().map_err(|_| format!("{name}: not a number: {text:?}"))
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run with this configuration.
    Run(Config),
    /// Print the help.
    Help,
}

impl Command {
    /// Parses the arguments (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut config = Config::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (name, inline_value) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") && name != "--latency" => {
                    (name.to_owned(), Some(value.to_owned()))
                }
                _ => (arg.clone(), None),
            };
            if name == "--help" || name == "-h" {
                return Ok(Command::Help);
            }
            let mut value = || {
                inline_value
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "--transactions" => config.transactions = number(&name, value()?)?,
                "--rate" => config.rate = number(&name, value()?)?,
                "--seed" => config.seed = number(&name, value()?)?,
                "--workers" => config.workers = number(&name, value()?)?,
                "--crash-fraction" => config.crash_fraction = number(&name, value()?)?,
                "--jitter" => config.latencies.jitter = number(&name, value()?)?,
                "--json" => config.json = Some(PathBuf::from(value()?)),
                "--latency" => {
                    for pair in value()?.split(',').filter(|pair| !pair.is_empty()) {
                        let (key, ms) = pair
                            .split_once('=')
                            .ok_or_else(|| format!("--latency: expected KEY=MS, got {pair:?}"))?;
                        let ms: f64 = number("--latency", ms.trim_end_matches("ms").to_owned())?;
                        config.latencies.set(key, ms)?;
                    }
                }
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        if config.transactions == 0 || config.rate.is_nan() || config.rate <= 0.0 || config.workers == 0 {
            return Err("--transactions, --rate and --workers must be positive".into());
        }
        if !(0.0..=1.0).contains(&config.crash_fraction) {
            return Err("--crash-fraction must be within 0..=1".into());
        }
        Ok(Command::Run(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        Command::parse(args.iter().map(|arg| arg.to_string()))
    }

    #[test]
    fn options_set_the_configuration() {
        let Ok(Command::Run(config)) = parse(&[
            "--transactions",
            "50",
            "--rate=5",
            "--latency",
            "transact=30ms,receive=40",
            "--json",
            "/tmp/x.json",
        ]) else {
            panic!("parses");
        };
        assert_eq!(config.transactions, 50);
        assert_eq!(config.rate, 5.0);
        assert_eq!(config.latencies.transact_ms, 30.0);
        assert_eq!(config.latencies.receive_ms, 40.0);
        assert_eq!(config.json, Some(PathBuf::from("/tmp/x.json")));
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--latency", "nope=3"]).is_err());
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
    }

    #[test]
    fn latencies_stay_within_their_jitter_and_split_off_the_reply() {
        let draws = Draws::new(Latencies::default(), 1);
        for _ in 0..1000 {
            let ms = draws.latency(Call::Transact).as_millis();
            assert!((20..=30).contains(&ms), "{ms}");
            let (before, after) = draws.split(Call::Get);
            assert_eq!(after, Duration::from_millis(1));
            assert!((3..=5).contains(&before.as_millis()));
        }
    }
}
