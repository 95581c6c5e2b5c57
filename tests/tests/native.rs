//! Native DynamoDB actions committed with the outbox, on the emulator, in a single-table
//! design the application made itself (`PK` + `SK`, a GSI, TTL on `ttl`): the
//! application's `Update ... ADD` and conditional `Put` go in the outbox's one
//! `TransactWriteItems`, and every way the commit can end is reported truthfully.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};
use outbox::aws::AwsClients;
use outbox::native::{NativeOutbox, NativeUnsupported};
use outbox::ports::{Clock, CommitError, CommitRequest, ExpectedVersion, ItemKey, TombstoneOutcome};
use outbox::protocol::{IdempotencyKey, IdempotencySlot, Message, OutboxRecord, Place, StoredResponse};
use outbox::request::{TxnError, TxnStatus};
use outbox::settings::Timing;
use outbox_tests::conformance::{events, Backend};
use outbox_tests::emulator::{emulator, unique_name};
use outbox_tests::single_table::{create_single_table, single_table_layout};
use serde_json::json;

struct Shop {
    backend: Backend,
    dynamodb: aws_sdk_dynamodb::Client,
    table: String,
    outbox: NativeOutbox,
}

fn timing() -> Timing {
    Timing {
        first_check_delay: Duration::ZERO,
        ..Timing::default()
    }
}

fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_owned())
}

/// A fresh shop table with one product, `PRODUCT#1`, whose `reserved` counter is 0.
async fn shop() -> Shop {
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let table = unique_name("shop");
    create_single_table(&clients.dynamodb, &table).await;
    clients
        .dynamodb
        .put_item()
        .table_name(&table)
        .item("PK", s("PRODUCT#1"))
        .item("SK", s("PRODUCT#1"))
        .item("GSI1PK", s("CATEGORY#tools"))
        .item("GSI1SK", s("PRODUCT#1"))
        .item("reserved", AttributeValue::N("0".into()))
        .send()
        .await
        .expect("seed the product");
    let backend = Backend::aws_on(clients.clone(), Some(single_table_layout(&table))).await;
    let outbox = NativeOutbox::new(backend.outbox(timing())).expect("the DynamoDB store runs native actions");
    Shop {
        backend,
        dynamodb: clients.dynamodb,
        table,
        outbox,
    }
}

impl Shop {
    /// `ADD reserved :n` on the product, which must exist.
    fn reserve(&self, quantity: u32) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .key("PK", s("PRODUCT#1"))
            .key("SK", s("PRODUCT#1"))
            .update_expression("ADD reserved :n")
            .condition_expression("attribute_exists(PK)")
            .expression_attribute_values(":n", AttributeValue::N(quantity.to_string()))
            .build()
            .expect("complete update");
        TransactWriteItem::builder().update(update).build()
    }

    /// A put of reservation `id`, which must not exist yet; the old item comes back when
    /// it does.
    fn new_reservation(&self, id: &str) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.table)
            .item("PK", s(&format!("RESERVATION#{id}")))
            .item("SK", s("PRODUCT#1"))
            .item("GSI1PK", s("PRODUCT#1"))
            .item("GSI1SK", s(&format!("RESERVATION#{id}")))
            .condition_expression("attribute_not_exists(PK)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("complete put");
        TransactWriteItem::builder().put(put).build()
    }

    async fn reserved(&self) -> String {
        let item = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("PK", s("PRODUCT#1"))
            .key("SK", s("PRODUCT#1"))
            .consistent_read(true)
            .send()
            .await
            .expect("read the product");
        item.item().expect("the product exists")["reserved"]
            .as_n()
            .expect("a number")
            .clone()
    }

    async fn reservation_exists(&self, id: &str) -> bool {
        self.dynamodb
            .get_item()
            .table_name(&self.table)
            .key("PK", s(&format!("RESERVATION#{id}")))
            .key("SK", s("PRODUCT#1"))
            .consistent_read(true)
            .send()
            .await
            .expect("read the reservation")
            .item()
            .is_some()
    }
}

fn reserved_event(id: &str) -> Message {
    Message::json(events(), &json!({"type": "StockReserved", "reservation": id})).expect("serialisable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_update_and_conditional_put_commit_with_the_outbox_and_their_event_is_dispatched() {
    let shop = shop().await;
    let mut txn = shop.outbox.begin().await.expect("begin");
    assert_eq!(txn.action(shop.reserve(2)), 0);
    assert_eq!(txn.action(shop.new_reservation("r1")), 1);
    let message_id = txn.emit(reserved_event("r1"));
    let committed = txn.commit().await.expect("commit");

    assert_eq!(shop.reserved().await, "2");
    assert!(shop.reservation_exists("r1").await);
    assert_eq!(
        shop.outbox.outbox().status(committed.txn_id).await.unwrap(),
        TxnStatus::Pending
    );
    shop.backend.settle(timing()).await;
    let delivered = shop.backend.drain(&events()).await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].message_id.as_deref(), Some(message_id.as_str()));
    assert_eq!(
        shop.outbox.outbox().status(committed.txn_id).await.unwrap(),
        TxnStatus::Dispatched
    );
}

/// A transaction that changes one portable item it read places its messages in that
/// item's history whether or not it also runs native actions (here on another key of
/// the table): one chain across both kinds, and the commit with native actions moves the
/// item's heads in its own write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_transaction_that_changes_one_item_it_read_continues_that_items_chain() {
    let shop = shop().await;
    let order: ItemKey = format!("ORDER#{}", outbox::protocol::TxnId::new_v7()).parse().unwrap();

    // 1: portable only, a create of the order read as absent.
    let mut portable = shop.outbox.outbox().begin().await.expect("begin");
    assert!(portable.get(&order).await.expect("read").is_none());
    portable.put(order.clone(), json!({"n": 1}), ExpectedVersion::Absent);
    portable.emit(reserved_event("portable"));
    portable.commit().await.expect("the portable commit");

    // 2: the order changed at the version read, with a native action on another key.
    let mut native = shop.outbox.begin().await.expect("begin");
    let read = native.get(&order).await.expect("read").expect("the order");
    native.put(order.clone(), json!({"n": 2}), ExpectedVersion::Exactly(read.version));
    native.action(shop.reserve(1));
    native.emit(reserved_event("native"));
    native.commit().await.expect("the native commit");
    assert_eq!(shop.reserved().await, "1");

    shop.backend.settle(timing()).await;
    let places: Vec<Place> = shop
        .backend
        .drain(&events())
        .await
        .into_iter()
        .map(|delivered| {
            let position = delivered.position.expect("a position");
            assert_eq!(position.entity, order);
            position.place()
        })
        .collect();
    assert_eq!(
        places,
        [
            Place {
                seq: 1,
                version: 1,
                after: 0
            },
            Place {
                seq: 2,
                version: 2,
                after: 1
            }
        ],
        "one chain, in commit order"
    );
    let keys = shop
        .backend
        .store
        .get_keys(std::slice::from_ref(&order))
        .await
        .expect("read the order");
    let head = keys[&order].heads.get(&events()).expect("a head for events");
    assert_eq!((head.seq, head.version), (2, 2), "the native commit moved the heads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_condition_failing_is_reported_with_its_index_and_nothing_is_written() {
    let shop = shop().await;
    let mut first = shop.outbox.begin().await.expect("begin");
    first.action(shop.new_reservation("r1"));
    first.commit().await.expect("first reservation");

    let mut txn = shop.outbox.begin().await.expect("begin");
    txn.action(shop.reserve(5));
    txn.action(shop.new_reservation("r1"));
    txn.emit(reserved_event("r1"));
    let txn_id = txn.id();
    match txn.commit().await {
        Err(TxnError::ActionCancelled {
            txn_id: named,
            index,
            code,
            item,
        }) => {
            assert_eq!((named, index, code.as_str()), (txn_id, 1, "ConditionalCheckFailed"));
            let old = item.expect("ALL_OLD was asked for");
            assert_eq!(old["PK"], s("RESERVATION#r1"));
        }
        other => panic!("expected the action's cancellation, got {other:?}"),
    }
    assert_eq!(shop.reserved().await, "0", "the counter was not touched");
    assert_eq!(
        shop.outbox.outbox().status(txn_id).await.unwrap(),
        TxnStatus::Tombstoned,
        "no outbox record: the request path settled it with its tombstone"
    );
    shop.backend.settle(timing()).await;
    assert!(shop.backend.drain(&events()).await.is_empty(), "nothing published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_after_its_tombstone_is_refused_and_writes_nothing() {
    let shop = shop().await;
    let mut txn = shop.outbox.begin().await.expect("begin");
    txn.action(shop.reserve(1));
    txn.emit(reserved_event("late"));
    // The control worker gave up on this transaction while the handler still ran.
    let now = shop.backend.clock.now();
    let tombstoned = shop
        .backend
        .store
        .put_tombstone(txn.id(), now, now.plus(Duration::from_secs(3600)))
        .await
        .expect("tombstone");
    assert_eq!(tombstoned, TombstoneOutcome::Written);
    match txn.commit().await {
        Err(TxnError::CommitWindowExpired { .. }) => {}
        other => panic!("expected the commit window to have expired, got {other:?}"),
    }
    assert_eq!(shop.reserved().await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_lets_the_native_change_happen_once() {
    let shop = shop().await;
    let key: IdempotencyKey = "reserve-r1".parse().unwrap();
    let slot = IdempotencySlot::new("shop", &key);
    let response = StoredResponse {
        status: 201,
        headers: vec![],
        body: "{}".into(),
    };
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let mut txn = shop.outbox.begin().await.expect("begin");
        txn.action(shop.reserve(3));
        txn.emit(reserved_event("r1"));
        txn.remember_response(slot.clone(), "fp".into(), response.clone());
        outcomes.push(txn.commit().await);
    }
    assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
    match &outcomes[1] {
        Err(TxnError::IdempotencyKeyUsed { slot: used, .. }) => assert_eq!(used, &slot),
        other => panic!("expected the key to be used, got {other:?}"),
    }
    assert_eq!(shop.reserved().await, "3", "the counter moved once");
    let record = shop
        .backend
        .store
        .get_idempotency(&slot)
        .await
        .unwrap()
        .expect("record");
    assert_eq!(record.response, response);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_over_the_transaction_budget_is_refused_before_it_is_sent_saying_what_the_outbox_took() {
    let shop = shop().await;
    let mut txn = shop.outbox.begin().await.expect("begin");
    for id in 0..99 {
        txn.action(shop.new_reservation(&id.to_string()));
    }
    txn.emit(reserved_event("many"));
    txn.remember_response(
        IdempotencySlot::new("shop", &"budget".parse().unwrap()),
        "fp".into(),
        StoredResponse {
            status: 201,
            headers: vec![],
            body: "{}".into(),
        },
    );
    match txn.commit().await {
        Err(TxnError::TooLarge { reason, .. }) => {
            assert!(reason.contains("101 actions, at most 100"), "{reason}");
            assert!(reason.contains("the application's 99"), "{reason}");
            assert!(reason.contains("the outbox's records take 2 action(s)"), "{reason}");
        }
        other => panic!("expected the budget to be exceeded, got {other:?}"),
    }
    assert!(!shop.reservation_exists("0").await, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_native_action_is_a_definite_failure_with_dynamodbs_reason() {
    let shop = shop().await;
    let mut txn = shop.outbox.begin().await.expect("begin");
    // A key without the table's sort key: DynamoDB refuses the whole request.
    let broken = Update::builder()
        .table_name(&shop.table)
        .key("PK", s("PRODUCT#1"))
        .update_expression("ADD reserved :n")
        .expression_attribute_values(":n", AttributeValue::N("1".into()))
        .build()
        .expect("complete update");
    txn.action(TransactWriteItem::builder().update(broken).build());
    match txn.commit().await {
        Err(TxnError::NotCommitted {
            source: CommitError::Invalid { reason },
            ..
        }) => assert!(!reason.is_empty(), "DynamoDB's reason is kept"),
        other => panic!("expected a definite refusal, got {other:?}"),
    }
    assert_eq!(shop.reserved().await, "0");
}

#[tokio::test]
async fn the_embedded_backend_refuses_native_actions_by_type_and_by_store() {
    let backend = Backend::embedded();
    assert_eq!(
        NativeOutbox::new(backend.outbox(timing())).err(),
        Some(NativeUnsupported)
    );
    let txn = outbox::protocol::TxnId::new_v7();
    let now = backend.clock.now();
    let request = CommitRequest {
        txn_id: txn,
        writes: vec![],
        outbox: OutboxRecord::committed(txn, vec![], now, now.plus(Duration::from_secs(60))),
        idempotency: None,
    };
    let action = TransactWriteItem::builder()
        .condition_check(
            aws_sdk_dynamodb::types::ConditionCheck::builder()
                .table_name("any")
                .key("pk", s("x"))
                .condition_expression("attribute_exists(pk)")
                .build()
                .unwrap(),
        )
        .build();
    assert!(matches!(
        backend.store.commit_native(&request, &[action]).await,
        Err(CommitError::NativeUnsupported)
    ));
    assert!(
        backend.store.get_outboxes(&[txn]).await.unwrap().is_empty(),
        "nothing written"
    );
}
