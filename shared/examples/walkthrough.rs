//! One transaction that commits and is dispatched, and one that never commits and is
//! tombstoned, on the embedded backend with a clock this example moves by hand.
//!
//! `cargo run -p outbox --example walkthrough`

use std::sync::Arc;
use std::time::Duration;

use outbox::control::poller::poll_once;
use outbox::control::ControlPath;
use outbox::embedded::{EmbeddedBackend, ManualClock};
use outbox::ports::{Clock, ExpectedVersion};
use outbox::protocol::{DestinationName, Message};
use outbox::request::Outbox;
use outbox::settings::{Timing, TransactionLimits};
use outbox::time::Timestamp;
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(ManualClock::new(Timestamp::from_system_time(
        std::time::SystemTime::now(),
    )));
    let events: DestinationName = "events".parse()?;
    let backend = EmbeddedBackend::new(clock.clone(), [(events.clone(), false)]);
    let timing = Timing::default();
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        timing,
        TransactionLimits::default(),
    );
    let worker = ControlPath::new(backend.control_ports(clock.clone()), timing);
    // The control worker, run until the control queue is empty, moving the clock to each
    // delayed message as it comes due.
    let run_worker = || async {
        let queue = backend.control_queue.queue();
        while !queue.is_empty() {
            if let Some(at) = queue.next_visible_at().filter(|_| !queue.has_visible()) {
                println!("  (clock moves forward {:?})", at.since(clock.now()));
                clock.set(at);
            }
            for item in poll_once(backend.control_queue.as_ref(), &worker, Duration::ZERO)
                .await?
                .items
            {
                println!(
                    "  control worker: attempt {:?} -> {:?}",
                    item.attempt.unwrap_or(0),
                    item.result?
                );
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    };

    println!("1. A transaction that commits: an order and its OrderPlaced event.");
    let mut txn = outbox.begin().await?;
    println!(
        "  began {} (control message sent, delayed {:?})",
        txn.id(),
        timing.first_check_delay
    );
    let key = "ORDER#1".parse()?;
    txn.put(
        key,
        json!({"customer_id": "c-1", "total_cents": 2598}),
        ExpectedVersion::Absent,
    );
    txn.emit(Message::json(
        events.clone(),
        &json!({"type": "OrderPlaced", "order_id": "1"}),
    )?);
    let committed = txn.commit().await?;
    println!(
        "  committed; message ids {:?}; status {:?}",
        committed.message_ids,
        outbox.status(committed.txn_id).await?
    );
    run_worker().await?;
    println!(
        "  status now {:?}; the events queue holds {:?}",
        outbox.status(committed.txn_id).await?,
        backend.publisher.queue(&events).map(|q| q.bodies())
    );

    println!("\n2. A transaction whose API crashed in its commit, once its control message was sent.");
    let crashed = outbox.begin().await?;
    crashed.send_control().await?;
    let abandoned = crashed.id();
    drop(crashed);
    println!(
        "  began {abandoned}, sent its control message, then nothing: the control worker waits out the commit window"
    );
    run_worker().await?;
    println!("  status now {:?}", outbox.status(abandoned).await?);

    println!("\n3. A transaction whose commit comes too late: its control message sent, then the API stalls.");
    let mut late = outbox.begin().await?;
    late.emit(Message::json(
        events.clone(),
        &json!({"type": "OrderCancelled", "order_id": "1"}),
    )?);
    late.send_control().await?;
    run_worker().await?;
    println!(
        "  commit after the window: {:?}",
        late.commit().await.map_err(|error| error.to_string())
    );
    println!(
        "  the events queue still holds only {:?}",
        backend.publisher.queue(&events).map(|q| q.len())
    );
    Ok(())
}
