//! The command line and its environment variables: how many requests, how many at a
//! time, the latencies and their jitter, the seed, the variants.

use std::path::PathBuf;

use crate::latency::Latencies;
use crate::variants::Variant;

/// What `--help` prints.
pub const HELP: &str = "\
request-path: the outbox's request-path latency on the embedded backend, each port call
slowed by the latency of the AWS call it stands for.

USAGE: request-path [OPTIONS]

OPTIONS (each also read from the environment variable shown; a flag wins):
  --requests N        requests per variant and phase, after a short warm-up [OUTBOX_BENCH_REQUESTS, 300]
  --concurrency C     requests in flight in the throughput phase [OUTBOX_BENCH_CONCURRENCY, 8]
  --latency SPEC      call latencies to change, e.g. get=5ms,transact=25ms [OUTBOX_BENCH_LATENCY]
  --jitter F          each call takes its latency times U(1-F, 1+F); 0.2 or 20% [OUTBOX_BENCH_JITTER, 0.2]
  --seed S            seed of the jitter [OUTBOX_BENCH_SEED, 1]
  --timer T           how latencies are waited: precise (tokio sleep to 2 ms before the end, then
                      yield until it) or tokio (sleep alone, ~1 ms late per call) [OUTBOX_BENCH_TIMER, precise]
  --variants LIST     which variants, e.g. dual-write,outbox [OUTBOX_BENCH_VARIANTS, all]
  --json PATH         also write each variant's samples (ms, one at a time) and the summary
                      to PATH as JSON (scripts/plot-benchmarks reads it) [OUTBOX_BENCH_JSON]
  -h, --help          this text

CALLS and their default latencies (round figures from AWS's published numbers for calls
within one region, not measurements; set your own with --latency):
  get=5ms       DynamoDB GetItem/BatchGetItem, strongly consistent (\"single-digit ms\")
  put=8ms       DynamoDB PutItem, conditional (a write: a quorum of replicas; entity mode's
                dispatched record)
  update=8ms    DynamoDB UpdateItem/BatchWriteItem (marking a record dispatched; entity mode's commit,
                a change or a create, and the entry's settle)
  transact=25ms DynamoDB TransactWriteItems (two writes per item, prepare and commit: ~2x a write and more)
  send=8ms      SQS SendMessage (\"about 10 ms\" in-region)
  batch=10ms    SQS SendMessageBatch

VARIANTS (one request each: read one item, write it under its version, publish one event):
  (a) plain-put          GetItem + conditional PutItem, no event (the PutItem is its latency only)
  (b) dual-write         plain-put + SendMessage of the event: not atomic, the cost floor
  (c) outbox-sequential  the outbox's default, the control send with the commit: GetItem, then
                         SendMessage (control), then TransactWriteItems; inline publishing off
  (d) outbox             the control send beside the read (send_control): SendMessage (control)
                         overlapped with GetItem, then TransactWriteItems; inline publishing off
  (e) outbox-inline      (d) + SendMessageBatch + BatchWriteItem (publish and mark dispatched
                         before answering: OUTBOX_INLINE_PUBLISH=before)
  (f) outbox-entity      (d) in entity mode (begin_entity: the control message names the item):
                         SendMessage overlapped with GetItem, then one conditional UpdateItem of
                         the item carrying its outbox entry, no transaction; inline publishing off
  (g) outbox-entity-inline  (f) + SendMessageBatch + UpdateItem (the entry settled into its sent
                         mark), one after the other before answering
  (h) outbox-after       (e) publishing after the answer (OUTBOX_INLINE_PUBLISH=after, the
                         default): the request's calls are (d)'s, the publish and mark follow it
  (i) outbox-entity-after  (g) publishing after the answer: the request's calls are (f)'s
CREATE VARIANTS (one request each: create an item that does not exist yet, publish one event,
publishing after the answer):
  (j) create-entity-after  entity mode (begin_entity on the new item): SendMessage overlapped with
                         the read of its key (no item), then one conditional UpdateItem creating the
                         item with its outbox entry; the publish and the settle follow the answer
  (k) create-after       the transactional form, a blind create: SendMessage, then
                         TransactWriteItems; the publish and the mark follow the answer
The report prints each variant's p50 over (a)'s and (b)'s, whether (d)/(b) <= 1.5,
(f)/(b) <= 1.0, (i)/(b) <= 1.0 and (j)/(b) <= 1.0, and the store calls each variant made per request
(counted: a run whose commits did not take the form its variant claims fails).
";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Print [`HELP`].
    Help,
    /// Run the benchmark.
    Run(Config),
}

/// A run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Requests per variant and phase.
    pub requests: usize,
    /// Requests in flight in the throughput phase.
    pub concurrency: usize,
    /// Call latencies and jitter.
    pub latencies: Latencies,
    /// Seed of the jitter.
    pub seed: u64,
    /// Variants, in the order run and reported.
    pub variants: Vec<Variant>,
    /// Where to write the samples and the summary as JSON, if anywhere.
    pub json: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            requests: 300,
            concurrency: 8,
            latencies: Latencies::default(),
            seed: 1,
            variants: Variant::ALL.to_vec(),
            json: None,
        }
    }
}

/// The options, each with its environment variable.
const OPTIONS: [(&str, &str); 8] = [
    ("--requests", "OUTBOX_BENCH_REQUESTS"),
    ("--concurrency", "OUTBOX_BENCH_CONCURRENCY"),
    ("--latency", "OUTBOX_BENCH_LATENCY"),
    ("--jitter", "OUTBOX_BENCH_JITTER"),
    ("--seed", "OUTBOX_BENCH_SEED"),
    ("--timer", "OUTBOX_BENCH_TIMER"),
    ("--variants", "OUTBOX_BENCH_VARIANTS"),
    ("--json", "OUTBOX_BENCH_JSON"),
];

impl Command {
    /// Reads `args` (without the program name), falling back on `env` for options not
    /// given.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Command, String> {
        let mut given: Vec<(&'static str, String)> = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Ok(Command::Help);
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
                None => (arg, None),
            };
            let (name, _) = OPTIONS
                .iter()
                .find(|(name, _)| *name == flag)
                .ok_or_else(|| format!("unknown argument {flag:?}"))?;
            let value = match inline {
                Some(value) => value,
                None => args.next().ok_or_else(|| format!("{name} needs a value"))?,
            };
            given.push((name, value));
        }
        let mut config = Config::default();
        for (name, variable) in OPTIONS {
            let from_flag = given
                .iter()
                .rev()
                .find(|(flag, _)| *flag == name)
                .map(|(_, v)| v.clone());
            let Some(value) = from_flag.or_else(|| env(variable)) else {
                continue;
            };
            config
                .set(name, value.trim())
                .map_err(|error| format!("{name} ({variable}): {error}"))?;
        }
        Ok(Command::Run(config))
    }
}

impl Config {
    fn set(&mut self, option: &str, value: &str) -> Result<(), String> {
        let count = |value: &str| match value.parse::<usize>() {
            Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
            _ => Err(format!("{value:?} is not a whole number from 1 to 1000000")),
        };
        match option {
            "--requests" => self.requests = count(value)?,
            "--concurrency" => self.concurrency = count(value)?.min(1024),
            "--latency" => self.latencies.apply(value)?,
            "--jitter" => self.latencies.jitter = parse_fraction(value)?,
            "--timer" => self.latencies.timer = value.parse()?,
            "--seed" => self.seed = value.parse().map_err(|_| format!("{value:?} is not a whole number"))?,
            "--json" => {
                if value.is_empty() {
                    return Err("an empty path".into());
                }
                self.json = Some(PathBuf::from(value));
            }
            "--variants" => {
                self.variants = value
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                if self.variants.is_empty() {
                    return Err("no variant named".into());
                }
            }
            _ => unreachable!("every option is listed"),
        }
        Ok(())
    }
}

/// `0.2` or `20%`, from 0 to just under 1 (a latency never reaches zero).
fn parse_fraction(value: &str) -> Result<f64, String> {
    let fraction = match value.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => value.parse::<f64>(),
    }
    .map_err(|_| format!("{value:?} is not a fraction such as 0.2 or 20%"))?;
    if (0.0..1.0).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(format!("{value:?} must be at least 0 and below 1 (100%)"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::latency::Call;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Command, String> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Command::parse(args.iter().map(|a| a.to_string()), move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    fn config(args: &[&str], env: &[(&str, &str)]) -> Config {
        match parse(args, env).unwrap() {
            Command::Run(config) => config,
            Command::Help => panic!("help"),
        }
    }

    #[test]
    fn no_arguments_give_the_defaults() {
        assert_eq!(config(&[], &[]), Config::default());
    }

    #[test]
    fn flags_win_over_the_environment() {
        let config = config(
            &["--requests", "50", "--latency=transact=30ms", "--jitter", "10%"],
            &[
                ("OUTBOX_BENCH_REQUESTS", "7"),
                ("OUTBOX_BENCH_CONCURRENCY", "4"),
                ("OUTBOX_BENCH_LATENCY", "get=1ms"),
            ],
        );
        assert_eq!((config.requests, config.concurrency), (50, 4));
        assert_eq!(config.latencies.nominal(Call::Transact), Duration::from_millis(30));
        // The flag replaced the variable's spec; it did not add to it.
        assert_eq!(config.latencies.nominal(Call::Get), Duration::from_millis(5));
        assert!((config.latencies.jitter - 0.1).abs() < 1e-12);
    }

    #[test]
    fn variants_are_chosen_by_name() {
        let config = config(&["--variants", "dual-write, outbox,outbox-inline"], &[]);
        assert_eq!(
            config.variants,
            vec![Variant::DualWrite, Variant::Outbox, Variant::OutboxInline]
        );
        assert!(parse(&["--variants", "fast"], &[]).is_err());
        assert!(parse(&["--variants", "off"], &[]).is_err());
        let names: Vec<String> = Variant::ALL.iter().map(|variant| variant.label()).collect();
        assert_eq!(
            names,
            [
                "(a) plain-put",
                "(b) dual-write",
                "(c) outbox-sequential",
                "(d) outbox",
                "(e) outbox-inline",
                "(f) outbox-entity",
                "(g) outbox-entity-inline",
                "(h) outbox-after",
                "(i) outbox-entity-after",
                "(j) create-entity-after",
                "(k) create-after"
            ]
        );
    }

    #[test]
    fn the_json_path_comes_from_the_flag_or_the_environment() {
        assert_eq!(config(&[], &[]).json, None);
        let from_env = config(&[], &[("OUTBOX_BENCH_JSON", "/tmp/a.json")]);
        assert_eq!(from_env.json, Some(PathBuf::from("/tmp/a.json")));
        let from_flag = config(&["--json", "b.json"], &[("OUTBOX_BENCH_JSON", "/tmp/a.json")]);
        assert_eq!(from_flag.json, Some(PathBuf::from("b.json")));
        assert!(parse(&["--json", ""], &[]).is_err());
    }

    #[test]
    fn bad_input_is_refused_with_the_option_named() {
        for args in [
            &["--requests", "0"][..],
            &["--jitter", "1.5"],
            &["--seed", "x"],
            &["--timer", "sundial"],
            &["--latency"],
            &["--frobnicate", "1"],
        ] {
            let error = parse(args, &[]).unwrap_err();
            assert!(error.contains(args[0]), "{error}");
        }
        assert_eq!(parse(&["-h"], &[]).unwrap(), Command::Help);
    }
}
