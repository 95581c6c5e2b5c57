//! `request-path`: reads the options, starts a multi-threaded tokio runtime and prints
//! what `outbox_bench::run` measured, and with `--json PATH` writes the samples and the
//! summary there. `request-path --help` lists the options.

use std::process::ExitCode;

use outbox_bench::config::{Command, HELP};

fn main() -> ExitCode {
    let config = match Command::parse(std::env::args().skip(1), |name| std::env::var(name).ok()) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("request-path: {error} (see --help)");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_time().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("request-path: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(outbox_bench::run(&config)) {
        Ok(report) => {
            print!("{report}");
            if let Some(path) = &config.json {
                let text = serde_json::to_string_pretty(&report.to_json()).expect("a JSON value serialises");
                if let Err(error) = std::fs::write(path, text + "\n") {
                    eprintln!("request-path: cannot write {}: {error}", path.display());
                    return ExitCode::FAILURE;
                }
                eprintln!("request-path: samples and summary written to {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("request-path: {message}");
            ExitCode::FAILURE
        }
    }
}
