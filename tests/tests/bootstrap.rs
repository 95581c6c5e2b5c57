//! The bootstrap of a consumer on the emulators, whatever its name, its source and its
//! destinations: what `control-worker bootstrap STACK --consumer NAME [--source DEST]
//! [--publishes DEST]...` makes and prints.

use aws_sdk_sqs::types::QueueAttributeName;
use outbox::aws::{bootstrap, queue_retention, AwsClients, ConsumerResource, ResourceNames};
use outbox::consumer::consumer_vars;
use outbox::destination::Target;
use outbox::protocol::DestinationName;
use outbox::settings::vars;
use outbox_tests::emulator::{emulator, unique_name};

fn destination(name: &str) -> DestinationName {
    name.parse().unwrap()
}

/// The URL of the queue `name`, which must exist.
async fn queue_url(clients: &AwsClients, name: &str) -> String {
    clients
        .sqs
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .unwrap_or_else(|error| panic!("queue {name} does not exist: {error:?}"))
        .queue_url()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_any_name_gets_its_queues_and_its_settings() {
    let clients = AwsClients::new(&emulator().sdk_config().await);
    let stack = unique_name("chain");
    // The worked consumer first (`--consumer shipping --publishes shipments`), then
    // `--consumer billing --source shipments --publishes invoices --publishes events` on the
    // same stack, whose events go through a topic: billing reads what shipping publishes.
    let shipping = bootstrap(
        &clients,
        &ResourceNames::for_stack(&stack).with_consumer(ConsumerResource::for_stack(
            &stack,
            "shipping".parse().unwrap(),
            destination("events"),
            [destination("shipments")],
        )),
    )
    .await
    .expect("bootstrap of shipping");
    let names = ResourceNames::for_stack(&stack)
        .with_events_via("sns")
        .unwrap()
        .with_consumer(ConsumerResource::for_stack(
            &stack,
            "billing".parse().unwrap(),
            destination("shipments"),
            [destination("invoices"), destination("events"), destination("invoices")],
        ));
    let resources = bootstrap(&clients, &names).await.expect("bootstrap of billing");
    let billing = resources.consumer.as_ref().expect("the consumer");

    // Its own destination's queue exists, named after the stack and the destination; the
    // stack's own destination keeps its target (the topic).
    let invoices = queue_url(&clients, &format!("{stack}-invoices")).await;
    let events = &resources.destinations[&destination("events")];
    assert!(matches!(events, Target::SnsTopic { .. }), "{events:?}");
    // Its source is the queue shipping publishes to, made as a destination's: with a
    // dead-letter queue that keeps messages 14 days.
    let shipments = queue_url(&clients, &format!("{stack}-shipments")).await;
    assert_eq!(
        shipping.consumer.as_ref().unwrap().destinations[&destination("shipments")],
        Target::SqsQueue {
            url: shipments.clone(),
            fifo: false
        }
    );
    let redrive = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&shipments)
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap()
        .attributes()
        .and_then(|attributes| attributes.get(&QueueAttributeName::RedrivePolicy).cloned())
        .unwrap_or_default();
    assert!(redrive.contains(&format!("{stack}-shipments-dlq")), "{redrive:?}");
    let source_retention = queue_retention(&clients.sqs, &shipments).await.unwrap();

    // What `control-worker bootstrap --consumer billing ...` prints, as `export` lines.
    let printed: Vec<String> = billing
        .variables()
        .into_iter()
        .map(|(variable, value)| format!("export {variable}={value}"))
        .collect();
    assert_eq!(
        printed,
        [
            format!("export {}=billing", consumer_vars::NAME),
            format!("export {}={shipments}", consumer_vars::QUEUE_URL),
            format!(
                "export {}={}",
                consumer_vars::SOURCE_RETENTION_SECONDS,
                source_retention.as_secs()
            ),
            format!("export {}={}", consumer_vars::DLQ_RETENTION_SECONDS, 14 * 24 * 3600),
            format!("export {}=events={events},invoices=sqs:{invoices}", vars::DESTINATIONS),
        ]
    );
}
