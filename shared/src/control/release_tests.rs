//! A transaction whose message a destination refuses for good parks its entity's chain
//! on a destination that keeps order, visibly, until an operator releases it.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::{ControlError, ControlOutcome, ControlPath, ControlPorts, ReleaseError};
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{Clock, ControlDelivery, EntryFailure, ExpectedVersion, ItemKey, PublishError, Publisher};
use crate::protocol::{ControlMessage, DestinationName, Message, OutgoingMessage, TxnId};
use crate::publish::PublishFailure;
use crate::request::Outbox;
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

fn events() -> DestinationName {
    "events".parse().unwrap()
}

/// Refuses for good (as SQS refuses `InvalidMessageContents`) every message whose body
/// says `refuse`; fails the others for a while (not for good) when `unavailable`.
struct Refusing {
    inner: Arc<dyn Publisher>,
    unavailable: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Publisher for Refusing {
    async fn send_batch(
        &self,
        destination: &DestinationName,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<EntryFailure>, PublishError> {
        let unavailable = self.unavailable.load(std::sync::atomic::Ordering::SeqCst);
        let (refused, taken): (Vec<&OutgoingMessage>, Vec<&OutgoingMessage>) =
            messages.iter().partition(|message| message.body.contains("refuse"));
        let (failing, taken): (Vec<&OutgoingMessage>, Vec<OutgoingMessage>) = if unavailable {
            (taken, Vec::new())
        } else {
            (Vec::new(), taken.into_iter().cloned().collect())
        };
        let mut failures = self.inner.send_batch(destination, &taken).await?;
        failures.extend(refused.into_iter().map(|message| EntryFailure {
            id: message.id.clone(),
            sender_fault: true,
            code: "InvalidMessageContents".into(),
        }));
        failures.extend(failing.into_iter().map(|message| EntryFailure {
            id: message.id.clone(),
            sender_fault: false,
            code: "ServiceUnavailable".into(),
        }));
        Ok(failures)
    }
    fn keeps_order(&self, destination: &DestinationName) -> bool {
        self.inner.keeps_order(destination)
    }
}

struct World {
    backend: EmbeddedBackend,
    outbox: Outbox,
    control: ControlPath,
    publisher: Arc<Refusing>,
    clock: Arc<ManualClock>,
}

fn world() -> World {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), true)]);
    backend.publisher.queue(&events()).unwrap().record_sends();
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let publisher = Arc::new(Refusing {
        inner: backend.publisher.clone(),
        unavailable: false.into(),
    });
    let control = ControlPath::new(
        ControlPorts {
            publisher: publisher.clone(),
            ..backend.control_ports(clock.clone())
        },
        Timing::default(),
    )
    .with_retry_policy(crate::publish::RetryPolicy {
        attempts: 1,
        ..Default::default()
    });
    World {
        backend,
        outbox,
        control,
        publisher,
        clock,
    }
}

impl World {
    /// Commits a change of `ORDER#1` that emits one message per body, in entity mode or in
    /// the transactional form.
    async fn change(&self, entity_mode: bool, n: u64, bodies: &[&str]) -> TxnId {
        let order: ItemKey = "ORDER#1".parse().unwrap();
        let mut txn = if entity_mode {
            self.outbox.begin_entity(order.clone()).await.unwrap()
        } else {
            self.outbox.begin().await.unwrap()
        };
        let expected = match n {
            0 => ExpectedVersion::Absent,
            _ => ExpectedVersion::Exactly(n),
        };
        txn.get(&order).await.unwrap();
        txn.put(order, json!({"n": n}), expected);
        for body in bodies {
            txn.emit(Message::json(events(), &json!({ "say": body })).unwrap());
        }
        txn.commit().await.unwrap().txn_id
    }

    fn control_message(&self, txn_id: TxnId, entity_mode: bool) -> ControlDelivery {
        let mut message = ControlMessage::first(txn_id, self.clock.now());
        if entity_mode {
            message = message.with_entity("ORDER#1".parse().unwrap());
        }
        ControlDelivery {
            message_id: format!("c-{txn_id}"),
            receipt: String::new(),
            body: message.encode(),
            receive_count: 1,
        }
    }

    async fn work(&self, txn_id: TxnId, entity_mode: bool) -> Result<ControlOutcome, ControlError> {
        self.control
            .handle(&self.control_message(txn_id, entity_mode))
            .await
            .result
    }

    /// What the events queue took, in order: each message's `say`.
    fn sent(&self) -> Vec<String> {
        self.backend
            .publisher
            .queue(&events())
            .unwrap()
            .sent()
            .iter()
            .filter(|sent| !sent.deduplicated)
            .map(|sent| serde_json::from_str::<serde_json::Value>(&sent.request.body).unwrap()["say"].to_string())
            .collect()
    }
}

/// T0 emits a message the destination refuses for good between two it takes; T1, later on
/// the same entity, emits one more. The worker parks T0 (its control message fails with
/// the refusal, counted as parked) and T1 behind it: nothing of either goes out, not even
/// T0's first message's successors ahead of the refused one's place. A release that meets
/// a destination unavailable skips nothing and leaves T0 pending; the release that
/// follows sends what the destination takes, skips the refused message and settles T0;
/// then T1's control message sends T1's message, after T0's. Releasing it again, or a
/// transaction never committed, is refused: nothing is pending.
#[tokio::test]
async fn a_refused_message_parks_its_chain_until_an_operator_releases_it() {
    for entity_mode in [false, true] {
        let world = world();
        let t0 = world.change(entity_mode, 0, &["first", "refuse me", "third"]).await;
        let t1 = world.change(entity_mode, 1, &["later"]).await;
        let parked = world.work(t0, entity_mode).await;
        assert!(
            matches!(
                &parked,
                Err(ControlError::Publish {
                    first: PublishFailure::Refused { code },
                    ..
                }) if code == "InvalidMessageContents"
            ),
            "entity mode {entity_mode}: {parked:?}"
        );
        let report = crate::control::BatchReport {
            items: vec![crate::control::ItemReport {
                message_id: "c".into(),
                txn_id: Some(t0),
                attempt: Some(1),
                result: parked,
            }],
        };
        let metrics = crate::control::worker::batch_metrics::for_batch(&report, world.clock.now()).to_json();
        assert_eq!(
            metrics["ParkedTransactions"], 1.0,
            "entity mode {entity_mode}: {metrics}"
        );
        let behind = world.work(t1, entity_mode).await;
        assert!(
            behind.is_err(),
            "entity mode {entity_mode}: T1 waits behind T0: {behind:?}"
        );
        assert_eq!(
            world.sent(),
            ["\"first\""],
            "entity mode {entity_mode}: nothing after the refused message goes out"
        );
        let entity = entity_mode.then(|| "ORDER#1".parse().unwrap());

        world
            .publisher
            .unavailable
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let unavailable = world.control.release(t0, entity.clone()).await;
        assert!(
            matches!(unavailable, Err(ReleaseError::Dispatch { .. })),
            "entity mode {entity_mode}: a failure that is not a refusal is never skipped: {unavailable:?}"
        );
        world
            .publisher
            .unavailable
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let released = world.control.release(t0, entity.clone()).await;
        assert!(
            matches!(released, Ok(ControlOutcome::Dispatched { messages: 3, .. })),
            "entity mode {entity_mode}: {released:?}"
        );
        let resumed = world.work(t1, entity_mode).await;
        assert!(
            matches!(resumed, Ok(ControlOutcome::Dispatched { messages: 1, .. })),
            "entity mode {entity_mode}: {resumed:?}"
        );
        assert_eq!(
            world.sent(),
            ["\"first\"", "\"third\"", "\"later\""],
            "entity mode {entity_mode}: the refused message skipped, the rest in order"
        );
        assert!(
            matches!(
                world.control.release(t0, entity.clone()).await,
                Err(ReleaseError::NothingPending { .. })
            ),
            "entity mode {entity_mode}"
        );
        assert!(
            matches!(
                world.control.release(TxnId::new_v7(), entity).await,
                Err(ReleaseError::NothingPending { .. })
            ),
            "entity mode {entity_mode}"
        );
    }
}
