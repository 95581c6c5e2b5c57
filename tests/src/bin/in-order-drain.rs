//! How long an in-order consumer takes to apply an entity's messages delivered shuffled,
//! every message twice, against the same messages delivered in order: the drain ratio.
//!
//! `cargo run --release -p outbox-tests --bin in-order-drain -- [--backend embedded|standard|fifo]
//! [--messages M] [--entities E] [--seed S]` (`scripts/in-order-drain` runs each backend).
//!
//! For each of E entities, messages `seq` 1 to M of its chain (placed as the request path
//! places them), each sent twice to the consumer's source queue (a producer's re-send: the
//! same `outbox-message-id`), all entities' messages mixed. Once in order (seq 1, 1, 2, 2,
//! ... per entity), once shuffled (seeded). A local poller (batches of 10, each message of a
//! batch concurrently, as the Lambda event source mapping hands them) consumes them until
//! every entity's handler item says M applied. The handler checks order itself: it fails a
//! message whose predecessor is not the last it applied (the consumer must never let one
//! through early), and counts each application in its item, committed with the position.
//!
//! Backends: `embedded` (the embedded store and queue), `standard` and `fifo` (DynamoDB
//! Local and an SQS queue on moto, standard or FIFO grouped by entity: a message's copy
//! gets a deduplication id of its own, as a re-send after the deduplication window would).
//! Prints one line per delivery order, then `ratio shuffled/in order: X`; exits non-zero if
//! a count is wrong or the run does not finish within its bound.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox::consumer::{poll_once, Consumer, ConsumerPorts, Handler, HandlerError, Inbox, Incoming, Requeue, Staging};
use outbox::embedded::{EmbeddedBackend, EmbeddedInbox, SendRequest};
use outbox::ports::{Clock, ExpectedVersion, ItemKey, RandomIds, Store, SystemClock};
use outbox::protocol::{Position, MESSAGE_ID_ATTRIBUTE};
use serde_json::json;

/// Applies each message once, in its chain's order: `APPLIED#{entity}` holds the last seq
/// applied and how many were applied; a message whose predecessor is not the last applied
/// fails (the consumer let it through early).
struct Ordered;

#[async_trait]
impl Handler for Ordered {
    async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        let position = message.position()?.ok_or("an unplaced message")?;
        let key: ItemKey = format!("APPLIED#{}", position.entity).parse()?;
        let read = staging.get(&key).await?;
        let (last, count) = read.as_ref().map_or((0, 0), |item| {
            (
                item.data["last"].as_u64().unwrap_or(0),
                item.data["count"].as_u64().unwrap_or(0),
            )
        });
        // Let through early: the consumer broke its order. (At or below the last: a copy
        // racing the one that applied it; its commit meets the position's condition, and
        // the consumer finds it a duplicate.)
        if position.seq > last + 1 {
            return Err(format!("seq {} let through after seq {last}", position.seq).into());
        }
        let expected = read.map_or(ExpectedVersion::Absent, |item| ExpectedVersion::Exactly(item.version));
        staging.put(key, json!({ "last": position.seq, "count": count + 1 }), expected);
        Ok(())
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// Message `seq` of `entity`'s chain on `events`: its body, attributes and FIFO group.
fn placed(entity: &str, seq: u64) -> (String, BTreeMap<String, String>) {
    let position = Position {
        producer: None,
        entity: entity.parse().expect("a valid key"),
        chain: "events".parse().expect("a valid name"),
        seq,
        version: seq + 1,
        after: seq,
        previous: None,
    };
    let mut attributes: BTreeMap<String, String> = position
        .attributes()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), format!("{entity}:{seq}"));
    (json!({ "entity": entity, "seq": seq }).to_string(), attributes)
}

/// The deliveries of one run: (entity, seq, copy), every message twice.
fn schedule(entities: usize, messages: u64, shuffled: bool, seed: u64) -> Vec<(String, u64, u8)> {
    let mut all = Vec::new();
    for seq in 1..=messages {
        for entity in 0..entities {
            for copy in 0..2 {
                all.push((format!("ENTITY#{entity}"), seq, copy));
            }
        }
    }
    if shuffled {
        fastrand::Rng::with_seed(seed).shuffle(&mut all);
    }
    all
}

struct Settings {
    backend: String,
    messages: u64,
    entities: usize,
    seed: u64,
}

fn settings() -> Settings {
    let mut settings = Settings {
        backend: "embedded".into(),
        messages: 200,
        entities: 1,
        seed: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{arg} takes a value"));
        match arg.as_str() {
            "--backend" => settings.backend = value.clone(),
            "--messages" => settings.messages = value.parse().expect("--messages N"),
            "--entities" => settings.entities = value.parse().expect("--entities N"),
            "--seed" => settings.seed = value.parse().expect("--seed N"),
            other => panic!("unknown option {other}"),
        }
    }
    settings
}

/// One message to send: its body, its attributes, and two more strings as each source
/// takes them.
type Outgoing = (String, BTreeMap<String, String>, String, String);

/// Sends a batch of messages to the source's queue.
type SendBatch = Box<dyn Fn(Vec<Outgoing>) -> futures::future::BoxFuture<'static, ()>>;

/// Where one run's messages go and come from, and the store the consumer writes.
struct Source {
    store: Arc<dyn Store>,
    inbox: Arc<dyn Inbox>,
    requeue: Option<Arc<dyn Requeue>>,
    send: SendBatch,
}

fn embedded_source(clock: Arc<dyn Clock>) -> (Source, EmbeddedBackend) {
    let backend = EmbeddedBackend::new(clock.clone(), [("events".parse().expect("valid"), false)]);
    let queue = backend
        .publisher
        .queue(&"events".parse().expect("valid"))
        .expect("events")
        .clone();
    let inbox = EmbeddedInbox::new(queue.clone(), clock);
    let send = Box::new(move |batch: Vec<Outgoing>| {
        for (body, attributes, _, _) in batch {
            queue
                .send(SendRequest {
                    body,
                    attributes,
                    delay: Duration::ZERO,
                    group_id: None,
                    deduplication_id: None,
                })
                .expect("the queue takes it");
        }
        Box::pin(async {}) as futures::future::BoxFuture<'static, ()>
    });
    let store: Arc<dyn Store> = backend.store.clone();
    (
        Source {
            store,
            inbox: Arc::new(inbox.clone()),
            requeue: Some(Arc::new(inbox)),
            send,
        },
        backend,
    )
}

async fn emulator_source(fifo: bool, clock: Arc<dyn Clock>) -> Source {
    let emulator = outbox_tests::emulator::emulator();
    let clients = outbox::aws::AwsClients::new(&emulator.sdk_config().await);
    let stack = outbox_tests::emulator::unique_name("drain");
    let names = outbox::aws::ResourceNames::for_stack(&stack)
        .with_events_via(if fifo { "sqs-fifo" } else { "sqs" })
        .expect("a kind");
    let resources = outbox::aws::bootstrap(&clients, &names).await.expect("bootstrap");
    let url = resources.delivery_queues[&"events".parse().expect("valid")].clone();
    let inbox = outbox::aws::SqsInbox::new(clients.sqs.clone(), url.clone());
    let store: Arc<dyn Store> = Arc::new(outbox::aws::DynamoStore::new(
        clients.dynamodb.clone(),
        resources.layout.clone(),
        clock,
    ));
    let sqs = clients.sqs.clone();
    let send = Box::new(move |batch: Vec<Outgoing>| {
        let (sqs, url) = (sqs.clone(), url.clone());
        Box::pin(async move {
            for chunk in batch.chunks(10) {
                let entries = chunk
                    .iter()
                    .enumerate()
                    .map(|(index, (body, attributes, group, dedup))| {
                        let mut entry = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                            .id(index.to_string())
                            .message_body(body);
                        for (name, value) in attributes {
                            entry = entry.message_attributes(
                                name,
                                aws_sdk_sqs::types::MessageAttributeValue::builder()
                                    .data_type("String")
                                    .string_value(value)
                                    .build()
                                    .expect("an attribute"),
                            );
                        }
                        if fifo {
                            entry = entry.message_group_id(group).message_deduplication_id(dedup);
                        }
                        entry.build().expect("an entry")
                    })
                    .collect();
                let sent = sqs
                    .send_message_batch()
                    .queue_url(&url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .expect("the queue takes the batch");
                assert!(sent.failed().is_empty(), "{:?}", sent.failed());
            }
        }) as futures::future::BoxFuture<'static, ()>
    });
    let requeue: Option<Arc<dyn Requeue>> = Some(Arc::new(inbox.clone()));
    Source {
        store,
        inbox: Arc::new(inbox),
        requeue,
        send,
    }
}

/// One run: sends the schedule, consumes until every entity applied M messages; returns
/// how long the consumer took and the deliveries it handled.
async fn run(settings: &Settings, shuffled: bool) -> Result<(Duration, usize, BTreeMap<String, usize>), String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (source, backend) = match settings.backend.as_str() {
        "embedded" => {
            let (source, backend) = embedded_source(clock.clone());
            (source, Some(backend))
        }
        "standard" => (emulator_source(false, clock.clone()).await, None),
        "fifo" => (emulator_source(true, clock.clone()).await, None),
        other => return Err(format!("--backend embedded, standard or fifo, not {other}")),
    };
    let publisher = match &backend {
        Some(backend) => backend.publisher.clone(),
        None => EmbeddedBackend::new(clock.clone(), []).publisher,
    };
    let ports = ConsumerPorts {
        store: source.store.clone(),
        publisher,
        clock: clock.clone(),
        ids: Arc::new(RandomIds),
    };
    let mut consumer = Consumer::new(
        "drain".parse().expect("valid"),
        ports,
        Arc::new(Ordered),
        Duration::from_secs(4 * 24 * 3600),
    );
    if let Some(requeue) = source.requeue.clone() {
        consumer = consumer.with_requeue(requeue);
    }
    let batch: Vec<_> = schedule(settings.entities, settings.messages, shuffled, settings.seed)
        .into_iter()
        .map(|(entity, seq, copy)| {
            let (body, attributes) = placed(&entity, seq);
            let dedup = format!("{entity}:{seq}:{copy}").replace('#', "-");
            (body, attributes, entity.replace('#', "-"), dedup)
        })
        .collect();
    let deliveries_sent = batch.len();
    (source.send)(batch).await;
    let started = Instant::now();
    let bound = Duration::from_secs(600);
    let keys: Vec<ItemKey> = (0..settings.entities)
        .map(|entity| format!("APPLIED#ENTITY#{entity}").parse().expect("valid"))
        .collect();
    let mut handled = 0;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        let items = source.store.get_items(&keys).await.map_err(|error| error.to_string())?;
        let done = keys.iter().all(|key| {
            items
                .get(key)
                .is_some_and(|item| item.data["last"].as_u64() == Some(settings.messages))
        });
        if done {
            for key in &keys {
                let count = items[key].data["count"].as_u64();
                if count != Some(settings.messages) {
                    return Err(format!("{key}: {count:?} applications, not {}", settings.messages));
                }
            }
            break;
        }
        if started.elapsed() > bound {
            return Err(format!(
                "not drained within {bound:?}: {:?}",
                keys.iter()
                    .map(|key| items.get(key).map(|item| item.data.clone()))
                    .collect::<Vec<_>>()
            ));
        }
        let report = poll_once(source.inbox.as_ref(), &consumer, Duration::from_millis(100))
            .await
            .map_err(|error| error.to_string())?;
        handled += report.items.len();
        for item in &report.items {
            let name = match &item.result {
                Ok(outcome) => outcome.as_str().to_owned(),
                Err(error) => format!("failed: {error}"),
            };
            *outcomes.entry(name).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    outcomes.insert("sent".to_owned(), deliveries_sent);
    Ok((elapsed, handled, outcomes))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let settings = settings();
    let mut times = Vec::new();
    for shuffled in [false, true] {
        match run(&settings, shuffled).await {
            Ok((elapsed, handled, outcomes)) => {
                println!(
                    "{} {}: {} entities x {} messages, each twice: {} deliveries handled in {:.3} s ({:.0} per second); outcomes {outcomes:?}",
                    settings.backend,
                    if shuffled { "shuffled" } else { "in order" },
                    settings.entities,
                    settings.messages,
                    handled,
                    elapsed.as_secs_f64(),
                    handled as f64 / elapsed.as_secs_f64(),
                );
                times.push(elapsed.as_secs_f64());
            }
            Err(error) => {
                eprintln!("{}: {error}", settings.backend);
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{} ratio shuffled/in order: {:.2} ({} entities x {} messages)",
        settings.backend,
        times[1] / times[0],
        settings.entities,
        settings.messages
    );
    std::process::ExitCode::SUCCESS
}
