//! `dispatch-lag-sim`: the dispatch lag of each protocol configuration on a virtual
//! clock (see `outbox_bench::lag`). Prints a table; with `--json PATH` writes every
//! configuration's lags and summary there. `dispatch-lag-sim --help` lists the options.

use std::process::ExitCode;
use std::time::Instant;

use outbox_bench::lag::model::{Command, HELP};
use outbox_bench::lag::{report, run};

fn main() -> ExitCode {
    let config = match Command::parse(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("dispatch-lag-sim: {error} (see --help)");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let outcomes = run(&config);
    print!("{}", report::table(&config, &outcomes));
    eprintln!(
        "dispatch-lag-sim: {} configurations simulated in {:.2} s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &config.json {
        let text = serde_json::to_string_pretty(&report::to_json(&config, &outcomes)).expect("a JSON value serialises");
        if let Err(error) = std::fs::write(path, text + "\n") {
            eprintln!("dispatch-lag-sim: cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("dispatch-lag-sim: lags and summary written to {}", path.display());
    }
    if outcomes.iter().all(report::Outcome::is_clean) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
