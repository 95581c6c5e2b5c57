//! `request-path`: reads the options, starts a multi-threaded tokio runtime and prints
//! what `outbox_bench::run` measured. `request-path --help` lists the options.

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
