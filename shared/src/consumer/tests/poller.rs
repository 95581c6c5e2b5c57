//! The local poller on an embedded queue, in real time: each message acknowledged when
//! it is done, and the lease of one still being handled renewed so that no other poller
//! receives it meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::consumer::poller::process;
use crate::consumer::{Consumer, Handler, HandlerError, Incoming, Staging};
use crate::embedded::{EmbeddedBackend, EmbeddedInbox, EmbeddedQueue, QueueConfig, SendRequest};
use crate::ports::{Clock, ExpectedVersion, Inbox, SystemClock};
use crate::protocol::{DestinationName, Message, MESSAGE_ID_ATTRIBUTE};

/// How long the slow message takes.
const SLOW: Duration = Duration::from_secs(4);
/// The poller's lease here: a quarter of the slow message's time.
const LEASE: Duration = Duration::from_secs(1);

/// Ships each order; the order `slow` takes [`SLOW`].
struct Shipping;

#[async_trait]
impl Handler for Shipping {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let order = message.json::<Value>()?["order_id"]
            .as_str()
            .ok_or("no order")?
            .to_owned();
        if order == "slow" {
            tokio::time::sleep(SLOW).await;
        }
        staging.put(
            format!("SHIPMENT#{order}").parse()?,
            json!({ "order_id": order }),
            ExpectedVersion::Absent,
        );
        staging.emit(Message::json(
            "events".parse()?,
            &json!({ "type": "Shipped", "order_id": order }),
        )?);
        Ok(())
    }
}

#[tokio::test]
async fn each_message_is_acknowledged_when_done_and_a_slow_one_keeps_its_lease() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let events: DestinationName = "events".parse().unwrap();
    let backend = EmbeddedBackend::new(clock.clone(), [(events, false)]);
    let consumer = Consumer::new(
        "shipping".parse().unwrap(),
        backend.consumer_ports(clock.clone()),
        Arc::new(Shipping),
        Duration::from_secs(3600),
    );
    let source = Arc::new(EmbeddedQueue::new(QueueConfig::standard("source"), clock.clone()));
    for n in 0..10 {
        let order = if n == 4 { "slow".to_owned() } else { format!("o-{n}") };
        source
            .send(SendRequest {
                body: json!({ "type": "OrderPlaced", "order_id": order }).to_string(),
                attributes: BTreeMap::from([(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("T:{n}"))]),
                ..SendRequest::default()
            })
            .unwrap();
    }
    let inbox = EmbeddedInbox::new(source.clone(), clock.clone());
    let deliveries = inbox.receive(10, Duration::ZERO, LEASE).await.unwrap();
    assert_eq!(deliveries.len(), 10);

    // Another poller on the same queue, while the batch is handled.
    let other_poller = async {
        // The nine quick ones take milliseconds; a loaded machine gets a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left_while_slow_runs = source.len();
        let mut received_by_other = 0;
        while received_by_other == 0 && !source.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            received_by_other += source.receive_for(10, LEASE).len();
        }
        (left_while_slow_runs, received_by_other)
    };
    let (report, (left_while_slow_runs, received_by_other)) =
        futures_util::future::join(process(&inbox, &consumer, &deliveries, LEASE), other_poller).await;
    let report = report.expect("acknowledged");
    assert!(report.items.iter().all(|item| item.result.is_ok()), "{report:?}");
    assert_eq!(
        left_while_slow_runs, 1,
        "the nine quick messages are acknowledged while the slow one still runs"
    );
    assert_eq!(
        received_by_other, 0,
        "the slow message ({SLOW:?}) never came back to another poller under a {LEASE:?} lease"
    );
    assert!(source.is_empty(), "and it is acknowledged once done");
}
