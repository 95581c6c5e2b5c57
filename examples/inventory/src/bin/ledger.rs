//! The ledger as its own process or function on AWS (on the embedded backend it runs
//! inside the service).

#[tokio::main]
async fn main() -> Result<(), outbox::consumer::ServeError> {
    outbox::logging::init();
    outbox::consumer::serve(std::sync::Arc::new(inventory::ledger::Ledger)).await
}
