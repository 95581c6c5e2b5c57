//! Clients built the production way (standard chain, `AWS_ENDPOINT_URL`, and
//! `AWS_ENDPOINT_URL_DYNAMODB` for DynamoDB) reach the emulators, and the resource
//! bootstrap is idempotent. Alone in its binary because it
//! sets environment variables.

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use outbox::aws::{bootstrap, load_sdk_config, AwsClients, ConsumerResource, ResourceNames};
use outbox_tests::emulator::{emulator, unique_name};

#[tokio::test]
async fn clients_from_the_standard_chain_honour_aws_endpoint_url_and_bootstrap_is_idempotent() {
    let endpoint = emulator().endpoint.clone();
    let dynamodb_endpoint = emulator().dynamodb_endpoint.clone();
    // Nothing else runs in this binary, so no thread reads the environment meanwhile.
    for (name, value) in [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ] {
        std::env::set_var(name, value);
    }
    let config = load_sdk_config(Duration::from_secs(4)).await;
    assert_eq!(
        config.timeout_config().and_then(|t| t.operation_timeout()),
        Some(Duration::from_secs(4))
    );
    assert_eq!(
        config.timeout_config().and_then(|t| t.operation_attempt_timeout()),
        Some(Duration::from_secs(2))
    );
    assert_eq!(config.endpoint_url(), Some(endpoint.as_str()));
    let clients = AwsClients::new(&config);

    // The worked consumer too, as the scripts bootstrap it (`--consumer shipping
    // --publishes shipments`).
    let stack = unique_name("env");
    let names = ResourceNames::for_stack(&stack).with_consumer(ConsumerResource::for_stack(
        &stack,
        "shipping".parse().unwrap(),
        "events".parse().unwrap(),
        ["shipments".parse().unwrap()],
    ));
    // An events queue an earlier bootstrap made with the emulator's default visibility
    // (30 s): brought to the template's.
    let (_, events) = &names.destinations[0];
    clients
        .sqs
        .create_queue()
        .queue_name(events.queue())
        .attributes(QueueAttributeName::VisibilityTimeout, "30")
        .send()
        .await
        .expect("an older events queue");
    let first = bootstrap(&clients, &names).await.expect("bootstrap");
    let again = bootstrap(&clients, &names).await.expect("bootstrap again");
    assert_eq!(first, again, "a second bootstrap finds everything in place");
    // The events queue's visibility timeout is the template's (six times the consumer's
    // timeout), and the worked consumer's own queue is there.
    let visibility = |url: String| {
        let sqs = clients.sqs.clone();
        async move {
            sqs.get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::VisibilityTimeout)
                .send()
                .await
                .expect("attributes")
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout).cloned())
        }
    };
    for url in first.delivery_queues.values() {
        assert_eq!(visibility(url.clone()).await.as_deref(), Some("60"), "{url}");
    }
    let shipments: Vec<String> = first
        .consumer
        .as_ref()
        .expect("the consumer")
        .destinations
        .iter()
        .map(|(name, target)| format!("{name}={target}"))
        .collect();
    assert_eq!(shipments.len(), 1, "{shipments:?}");
    assert!(
        shipments[0].starts_with("shipments=sqs:") && shipments[0].ends_with("-shipments"),
        "{shipments:?}"
    );
    let shipments_url = shipments[0].trim_start_matches("shipments=sqs:").to_owned();
    assert!(visibility(shipments_url).await.is_some(), "the shipments queue exists");
    // The dead-letter queues keep messages 14 days, as template.yaml's: a consumer's
    // retention counts them (C4), and `control-worker bootstrap` prints it from them.
    for url in [&first.control_dead_letter_queue_url]
        .into_iter()
        .chain(first.delivery_dead_letter_queues.values())
    {
        assert_eq!(
            outbox::aws::queue_retention(&clients.sqs, url)
                .await
                .expect("retention"),
            Duration::from_secs(14 * 24 * 3600),
            "{url}"
        );
    }

    let ttl = clients
        .dynamodb
        .describe_time_to_live()
        .table_name(&names.layout.table)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description().and_then(|d| d.attribute_name()),
        Some("expires_at")
    );
    // The table is where AWS_ENDPOINT_URL_DYNAMODB points, and only there.
    let direct = |url: &str| {
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .endpoint_url(url)
                .build(),
        )
    };
    let tables_at = |url: String| async move {
        direct(&url)
            .list_tables()
            .send()
            .await
            .expect("list tables")
            .table_names()
            .to_vec()
    };
    assert!(tables_at(dynamodb_endpoint.clone()).await.contains(&names.layout.table));
    if dynamodb_endpoint != endpoint {
        assert!(
            !tables_at(endpoint.clone()).await.contains(&names.layout.table),
            "the table went to AWS_ENDPOINT_URL instead of AWS_ENDPOINT_URL_DYNAMODB"
        );
    }
    let attributes = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&first.control_queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    let attributes = attributes.attributes().unwrap();
    let redrive = &attributes[&QueueAttributeName::RedrivePolicy];
    assert!(
        redrive.contains("\"maxReceiveCount\"")
            && redrive.contains(&format!(
                "{}-control-dlq",
                names.layout.table.trim_end_matches("-table")
            )),
        "{redrive}"
    );
    assert_eq!(attributes[&QueueAttributeName::VisibilityTimeout], "60");
}
