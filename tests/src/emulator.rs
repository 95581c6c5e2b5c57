//! The AWS-compatible emulator for tests: `moto[server]` from PyPI, started once per test
//! binary on a free loopback port and stopped when the binary exits.
//!
//! `./scripts/test` installs it into the project's `.venv`; `MOTO_SERVER` may name
//! another `moto_server` executable. When it cannot start, tests fail and say how to get
//! it: they never skip.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;

/// A running emulator.
#[derive(Debug)]
pub struct Emulator {
    /// Its endpoint URL, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    _watchdog: Child,
}

static EMULATOR: OnceLock<Emulator> = OnceLock::new();

fn moto_server() -> PathBuf {
    if let Ok(path) = std::env::var("MOTO_SERVER") {
        return PathBuf::from(path);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/moto_server")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The emulator of this test binary, started on first use.
pub fn emulator() -> &'static Emulator {
    EMULATOR.get_or_init(start)
}

fn start() -> Emulator {
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
    let log = std::env::temp_dir().join(format!("moto-{port}.log"));
    // A watchdog shell owns the server and stops it when this test process is gone,
    // since a static's destructor never runs.
    let script = r#""$MOTO" -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 &
child=$!
trap 'kill $child 2>/dev/null' EXIT INT TERM
while kill -0 "$PARENT" 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done"#;
    let watchdog = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("MOTO", &moto)
        .env("PORT", port.to_string())
        .env("LOG", &log)
        .env("PARENT", std::process::id().to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("could not start {}: {error}", moto.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto_server did not listen on 127.0.0.1:{port} within 60 s; its log is {}:\n{}",
            log.display(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Emulator {
        endpoint: format!("http://127.0.0.1:{port}"),
        _watchdog: watchdog,
    }
}

impl Emulator {
    /// SDK configuration for the emulator: its endpoint, a region, dummy credentials,
    /// and the timeouts the adapters use in production.
    pub async fn sdk_config(&self) -> SdkConfig {
        self.sdk_config_with(Duration::from_secs(10)).await
    }

    /// SDK configuration for the emulator with the timeouts that `operation_timeout`
    /// gives in production (`outbox::aws::timeouts`).
    pub async fn sdk_config_with(&self, operation_timeout: Duration) -> SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "emulator"))
            .timeout_config(outbox::aws::timeouts(operation_timeout))
            .load()
            .await
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
