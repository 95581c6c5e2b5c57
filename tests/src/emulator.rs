//! The emulators of the tests, started once per test binary on free loopback ports and
//! stopped when the binary exits:
//! - DynamoDB Local (AWS's own engine, `scripts/dynamodb-local`) for DynamoDB;
//! - `moto[server]` from PyPI for SQS, SNS and EventBridge, started by `scripts/moto-server`
//!   (moto_server with its SQS queues' deletes and receives under the lock its sends
//!   take: unmended, a send racing a delete is answered as sent and lost).
//!
//! `./scripts/test` installs both (moto into the project's `.venv`, DynamoDB Local into
//! `.dynamodb-local`); `MOTO_SERVER` may name another executable taking moto_server's
//! arguments. When
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

/// The emulators, or why they could not start (kept, so that every later test of the
/// binary fails at once with the same reason instead of starting another moto).
static EMULATOR: OnceLock<Result<Emulator, String>> = OnceLock::new();

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn moto_server() -> PathBuf {
    if let Ok(path) = std::env::var("MOTO_SERVER") {
        return PathBuf::from(path);
    }
    root().join("scripts/moto-server")
}

/// What `./scripts/venv main` installs moto as: `scripts/moto-server` runs it.
fn moto_installed() -> PathBuf {
    root().join(".venv/bin/moto_server")
}

/// Two distinct free loopback ports: both are held while the second is picked.
fn free_ports() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let (first, second) = (bind(), bind());
    let port = |listener: &TcpListener| listener.local_addr().expect("a bound address").port();
    (port(&first), port(&second))
}

/// The emulators of this test binary, started on first use.
///
/// # Panics
///
/// If they could not start, saying why and how to install them.
pub fn emulator() -> &'static Emulator {
    match EMULATOR.get_or_init(start) {
        Ok(emulator) => emulator,
        Err(reason) => panic!("{reason}"),
    }
}

/// A server started under a watchdog shell that stops it when this test process is
/// gone, since a static's destructor never runs.
struct Started {
    name: &'static str,
    port: u16,
    log: PathBuf,
    /// Taken by [`Started::keep`] once every emulator has started.
    watchdog: Option<Child>,
}

impl Drop for Started {
    /// Stops a server whose sibling could not start (its watchdog kills it on exit).
    fn drop(&mut self) {
        if let Some(watchdog) = &mut self.watchdog {
            let _ = watchdog.kill();
        }
    }
}

fn spawn(name: &'static str, program: &Path, args: &[String], port: u16) -> Result<Started, String> {
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
        .map_err(|error| format!("could not start {name} ({}): {error}", program.display()))?;
    Ok(Started {
        name,
        port,
        log,
        watchdog: Some(watchdog),
    })
}

impl Started {
    /// Waits until the server listens, failing at once if it exited (its watchdog ends
    /// with it).
    fn wait_listening(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = matches!(self.watchdog.as_mut().map(Child::try_wait), Some(Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                return Err(format!(
                    "{} {} on 127.0.0.1:{}; its log is {}:\n{}",
                    self.name,
                    if exited {
                        "exited before it listened".to_owned()
                    } else {
                        format!("did not listen within {} s", within.as_secs())
                    },
                    self.port,
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

fn check_moto() -> Result<PathBuf, String> {
    let moto = moto_server();
    let installed = if std::env::var_os("MOTO_SERVER").is_some() {
        moto.clone()
    } else {
        moto_installed()
    };
    if installed.exists() {
        return Ok(moto);
    }
    Err(format!(
        "the AWS emulator is not installed: {} is missing.\n\
         Install it with `./scripts/test` (which does it for you) or by hand, pinned:\n  \
         ./scripts/venv main\n\
         or point MOTO_SERVER at an executable taking moto_server's arguments.",
        installed.display()
    ))
}

/// `scripts/dynamodb-local`, once it says DynamoDB Local is installed: the tests install
/// nothing themselves, they say how.
fn check_dynamodb_local() -> Result<PathBuf, String> {
    let script = root().join("scripts/dynamodb-local");
    let check = Command::new(&script)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("could not run {}: {error}", script.display()))?;
    if check.status.success() {
        return Ok(script);
    }
    Err(format!(
        "DynamoDB Local is not ready:\n{}\
         Install it with `./scripts/test` (which does it for you) or `./scripts/dynamodb-local install`.",
        String::from_utf8_lossy(&check.stderr)
    ))
}

fn start() -> Result<Emulator, String> {
    let engine = DynamoDbEngine::from_env();
    let moto = check_moto()?;
    let dynamodb_local = match engine {
        DynamoDbEngine::DynamoDbLocal => Some(check_dynamodb_local()?),
        DynamoDbEngine::Moto => None,
    };
    let (moto_port, dynamodb_port) = free_ports();
    let args = ["-H", "127.0.0.1", "-p", &moto_port.to_string()].map(str::to_owned);
    let mut moto = spawn("moto_server", &moto, &args, moto_port)?;
    let mut dynamodb = dynamodb_local
        .map(|script| {
            let args = ["run".to_owned(), dynamodb_port.to_string()];
            spawn("DynamoDB Local", &script, &args, dynamodb_port)
        })
        .transpose()?;
    // Both start at once; the JVM takes about two seconds, moto about one.
    moto.wait_listening(Duration::from_secs(60))?;
    if let Some(dynamodb) = &mut dynamodb {
        dynamodb.wait_listening(Duration::from_secs(60))?;
    }
    let endpoint = format!("http://127.0.0.1:{}", moto.port);
    let dynamodb_endpoint = dynamodb.as_ref().map_or_else(
        || endpoint.clone(),
        |started| format!("http://127.0.0.1:{}", started.port),
    );
    // From here on the servers live as long as the test binary.
    let watchdogs = std::iter::once(moto)
        .chain(dynamodb)
        .filter_map(|mut started| started.watchdog.take())
        .collect();
    Ok(Emulator {
        endpoint,
        dynamodb_endpoint,
        dynamodb_engine: engine,
        _watchdogs: watchdogs,
    })
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
            // No shared endpoint: one set through the loader would override every
            // service's, and the service configuration names one for each.
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
