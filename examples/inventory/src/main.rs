//! The inventory service: `cargo run -p inventory` (no AWS), or on Lambda as it is: the
//! API's function, and with the ledger's settings (`OUTBOX_CONSUMER_NAME=ledger`) the
//! ledger's.

#[tokio::main]
async fn main() -> Result<(), outbox::service::ServiceError> {
    outbox::service::Service::from_env()?
        .consumer("ledger", "events", inventory::ledger::Ledger)?
        .serve(|_outbox| inventory::router())
        .await
}
