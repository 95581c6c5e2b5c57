//! The control worker's binary: thin, over [`outbox::control::worker::cli`] (deploy it
//! unchanged; it reads the `OUTBOX_*` settings). `control-worker --help` lists its
//! commands: the worker itself (inside Lambda, or polling), redrive, release,
//! consumer-state and bootstrap.

fn main() -> std::process::ExitCode {
    outbox::control::worker::cli::main()
}
