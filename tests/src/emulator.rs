//! The emulators of the tests, started once per test binary on free loopback ports and
//! stopped when the binary exits:
//! - DynamoDB Local (AWS's own engine, `scripts/dynamodb-local`) for DynamoDB;
//! - `moto[server]` from PyPI for SQS, SNS and EventBridge.
//!
//! `./scripts/test` installs both (moto into the project's `.venv`, DynamoDB Local into
//! `.dynamodb-local`); `MOTO_SERVER` may name another `moto_server` executable. When
//! either cannot start, tests fail and say how to get it: they never skip.
//!
//! The SDK configuration sends DynamoDB to DynamoDB Local the way the SDK's per-service
//! endpoint does (`AWS_ENDPOINT_URL_DYNAMODB`): through its service configuration, so
//! that every client built from it the production way (`AwsClients::new`) finds its
//! engine. `OUTBOX_TEST_DYNAMODB=moto` sends DynamoDB to moto instead, to show what a
//! test catches on one engine and not the other.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;
use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};

/// The running emulators.
#[derive(Debug)]
pub struct Emulator {
    /// moto's endpoint URL, `http://127.0.0.1:<port>`: SQS, SNS, EventBridge.
    pub endpoint: String,
    /// DynamoDB's endpoint URL: DynamoDB Local's (or moto's, under
    /// `OUTBOX_TEST_DYNAMODB=moto`).
    pub dynamodb_endpoint: String,
    /// Which engine serves DynamoDB.
    pub dynamodb_engine: DynamoDbEngine,
    _watchdogs: Vec<Child>,
}

/// The engine behind DynamoDB in the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamoDbEngine {
    /// DynamoDB Local, AWS's own engine: the default.
    DynamoDbLocal,
    /// moto, chosen with `OUTBOX_TEST_DYNAMODB=moto`.
    Moto,
}

impl DynamoDbEngine {
    fn from_env() -> Self {
        match std::env::var("OUTBOX_TEST_DYNAMODB").as_deref() {
            Err(_) | Ok("" | "dynamodb-local") => Self::DynamoDbLocal,
            Ok("moto") => Self::Moto,
            Ok(other) => panic!("OUTBOX_TEST_DYNAMODB must be dynamodb-local or moto, not {other:?}"),
        }
    }

    /// A name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DynamoDbLocal => "DynamoDB Local",
            Self::Moto => "moto",
        }
    }
}

static EMULATOR: OnceLock<Emulator> = OnceLock::new();

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn moto_server() -> PathBuf {
    if let Ok(path) = std::env::var("MOTO_SERVER") {
        return PathBuf::from(path);
    }
    root().join(".venv/bin/moto_server")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The emulators of this test binary, started on first use.
pub fn emulator() -> &'static Emulator {
    EMULATOR.get_or_init(start)
}

/// A server started under a watchdog shell that stops it when this test process is
/// gone, since a static's destructor never runs.
struct Started {
    name: &'static str,
    port: u16,
    log: PathBuf,
    watchdog: Child,
}

fn spawn(name: &'static str, program: &Path, args: &[String], port: u16) -> Started {
    let log = std::env::temp_dir().join(format!("{}-{port}.log", name.replace(' ', "-")));
    let script = r#""$@" >"$LOG" 2>&1 &
child=$!
trap 'kill $child 2>/dev/null' EXIT INT TERM
while kill -0 "$PARENT" 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done"#;
    let watchdog = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg("watchdog")
        .arg(program)
        .args(args)
        .env("LOG", &log)
        .env("PARENT", std::process::id().to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("could not start {name} ({}): {error}", program.display()));
    Started {
        name,
        port,
        log,
        watchdog,
    }
}

impl Started {
    fn wait_listening(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} did not listen on 127.0.0.1:{} within {} s; its log is {}:\n{}",
                self.name,
                self.port,
                within.as_secs(),
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn start_moto() -> Started {
    let moto = moto_server();
    assert!(
        moto.exists(),
        "the AWS emulator is not installed: {} is missing.\n\
         Install it with `./scripts/test` (which does it for you) or by hand:\n  \
         python3 -m venv .venv && .venv/bin/pip install 'moto[server]'\n\
         or point MOTO_SERVER at a moto_server executable.",
        moto.display()
    );
    let port = free_port();
    let args = ["-H", "127.0.0.1", "-p", &port.to_string()].map(str::to_owned);
    spawn("moto_server", &moto, &args, port)
}

fn start_dynamodb_local() -> Started {
    let script = root().join("scripts/dynamodb-local");
    // Installed already, or fail saying how: the tests install nothing themselves.
    let check = Command::new(&script)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("could not run {}: {error}", script.display()));
    assert!(
        check.status.success(),
        "DynamoDB Local is not ready:\n{}\
         Install it with `./scripts/test` (which does it for you) or `./scripts/dynamodb-local install`.",
        String::from_utf8_lossy(&check.stderr)
    );
    let port = free_port();
    spawn("DynamoDB Local", &script, &["run".to_owned(), port.to_string()], port)
}

fn start() -> Emulator {
    let engine = DynamoDbEngine::from_env();
    let moto = start_moto();
    let dynamodb = (engine == DynamoDbEngine::DynamoDbLocal).then(start_dynamodb_local);
    // Both start at once; the JVM takes about two seconds, moto about one.
    moto.wait_listening(Duration::from_secs(60));
    let endpoint = format!("http://127.0.0.1:{}", moto.port);
    let mut watchdogs = vec![moto.watchdog];
    let dynamodb_endpoint = match dynamodb {
        Some(started) => {
            started.wait_listening(Duration::from_secs(60));
            watchdogs.push(started.watchdog);
            format!("http://127.0.0.1:{}", started.port)
        }
        None => endpoint.clone(),
    };
    Emulator {
        endpoint,
        dynamodb_endpoint,
        dynamodb_engine: engine,
        _watchdogs: watchdogs,
    }
}

/// The endpoints as the SDK's service configuration gives them: what
/// `AWS_ENDPOINT_URL_DYNAMODB` and `AWS_ENDPOINT_URL` in the environment would say,
/// without touching the process's environment (tests run on threads).
#[derive(Debug)]
struct Endpoints {
    dynamodb: String,
    other: String,
}

impl LoadServiceConfig for Endpoints {
    fn load_config(&self, key: ServiceConfigKey<'_>) -> Option<String> {
        (key.env() == "AWS_ENDPOINT_URL").then(|| {
            if key.service_id() == "DynamoDB" {
                self.dynamodb.clone()
            } else {
                self.other.clone()
            }
        })
    }
}

impl Emulator {
    /// SDK configuration for the emulators: their endpoints, a region, dummy
    /// credentials, and the timeouts the adapters use in production.
    pub async fn sdk_config(&self) -> SdkConfig {
        self.sdk_config_with(Duration::from_secs(10)).await
    }

    /// SDK configuration for the emulators with the timeouts that `operation_timeout`
    /// gives in production (`outbox::aws::timeouts`).
    pub async fn sdk_config_with(&self, operation_timeout: Duration) -> SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "emulator"))
            .timeout_config(outbox::aws::timeouts(operation_timeout))
            .load()
            .await
            .into_builder()
            // Not set through the loader, whose endpoint would override every service's.
            .endpoint_url(&self.endpoint)
            .service_config(Endpoints {
                dynamodb: self.dynamodb_endpoint.clone(),
                other: self.endpoint.clone(),
            })
            .build()
    }
}

/// A name no other test of this run uses, for isolating resources.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
