//! `--help` for the processes this library runs (a service, a consumer, the control
//! worker): what the process is and where its settings come from, printed, and nothing
//! run. Lambda passes a function no arguments, so a function never takes this path.

/// Where every process's settings come from, printed after its own usage.
pub const SETTINGS: &str = "\
Settings come from the environment, as `control-worker bootstrap` prints them (docs/GUIDE.md, \"Settings\"):
  OUTBOX_BACKEND              embedded (default: no AWS, everything in this process) or aws
  OUTBOX_TABLE_NAME           the DynamoDB table (aws)
  OUTBOX_CONTROL_QUEUE_URL    the control queue (aws)
  OUTBOX_DESTINATIONS         name=kind:target,... where emitted messages go (sqs:, sqs-fifo:, sns:, eventbridge:)
  OUTBOX_CONSUMER_NAME        a consumer's name (a consumer's process)
  OUTBOX_CONSUMER_QUEUE_URL   a consumer's source queue (a consumer's process)
  RUST_LOG                    the log's filter (info by default)
Inside Lambda (AWS_LAMBDA_RUNTIME_API set) it serves its function's events; elsewhere it
listens (a service, on OUTBOX_LISTEN_ADDR or 127.0.0.1:3000) or polls its queue.";

/// Whether `args` (the process's, without its name) ask for help: `--help` or `-h`
/// anywhere.
pub fn asked_in<S: AsRef<str>>(args: &[S]) -> bool {
    args.iter().any(|arg| matches!(arg.as_ref(), "--help" | "-h"))
}

/// Whether this process was asked for help ([`asked_in`] its arguments).
pub fn asked() -> bool {
    asked_in(&std::env::args().skip(1).collect::<Vec<_>>())
}

/// The text `--help` prints: `usage`, then where the settings come from.
pub fn text(usage: &str) -> String {
    format!("{usage}\n\n{SETTINGS}")
}

/// Where this process was asked for help: prints [`text`] to standard output and ends
/// the process with success. Otherwise returns, and the process runs.
pub fn print_if_asked(usage: &str) {
    if asked() {
        println!("{}", text(usage));
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_is_asked_for_anywhere_and_names_the_settings() {
        assert!(asked_in(&["--help"]));
        assert!(asked_in(&["-h"]));
        assert!(asked_in(&["bootstrap", "outbox", "--help"]));
        assert!(!asked_in::<&str>(&[]));
        assert!(!asked_in(&["bootstrap", "--consumer", "help"]));
        let text = text("usage: shipping");
        assert!(text.starts_with("usage: shipping\n"), "{text}");
        for name in [
            super::super::vars::BACKEND,
            super::super::vars::TABLE_NAME,
            super::super::vars::CONTROL_QUEUE_URL,
            super::super::vars::DESTINATIONS,
            crate::consumer::consumer_vars::NAME,
            crate::consumer::consumer_vars::QUEUE_URL,
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
    }
}
