//! A table replicated to other Regions, as DynamoDB describes a global table, is refused
//! where a process starts on AWS and by the bootstrap, unless `OUTBOX_WRITE_REGION` names
//! the process's own Region; one with multi-Region strong consistency is refused whatever
//! is named. DynamoDB Local makes no replicas (it has no Regions), so a fault proxy in
//! front of it gives its `DescribeTable` answers the `Replicas`, `GlobalTableVersion` and
//! `MultiRegionConsistency` that a global table's carry, and the real SDK client reads
//! them. The cold starts run in a process of their own (this test binary, started again),
//! whose SDK configuration comes from the environment as on Lambda.

use std::process::Command;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType};
use outbox::aws::{AwsBackend, AwsClients, BackendError, BootstrapError, RegionError, ResourceNames, TableRegions};
use outbox::control::worker::setup::{SetupError, Worker};
use outbox::settings::{vars, Settings};
use outbox_tests::emulator::{emulator, unique_name};
use outbox_tests::fault_proxy::{Fault, FaultProxy};
use serde_json::json;

const DESCRIBE_TABLE: &str = "DynamoDB_20120810.DescribeTable";

/// A table in DynamoDB Local, keyed as the outbox's default layout.
async fn new_table() -> String {
    let table = unique_name("regions");
    let client = aws_sdk_dynamodb::Client::new(&emulator().sdk_config().await);
    client
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("the table is created");
    table
}

/// A proxy in front of DynamoDB Local whose `DescribeTable` answers say the table is a
/// global table (version 2019.11.21) with replicas in `regions`, in `consistency` mode
/// when given.
async fn global_table_proxy(regions: &[&str], consistency: Option<&str>) -> FaultProxy {
    let proxy = FaultProxy::start(&emulator().dynamodb_endpoint, |_| Fault::Forward).await;
    let replicas: Vec<serde_json::Value> = regions
        .iter()
        .map(|region| json!({"RegionName": region, "ReplicaStatus": "ACTIVE"}))
        .collect();
    let consistency = consistency.map(str::to_owned);
    proxy.rewrite_replies(DESCRIBE_TABLE, move |body| {
        let Some(table) = body.get_mut("Table") else {
            return;
        };
        table["GlobalTableVersion"] = json!("2019.11.21");
        table["Replicas"] = json!(replicas);
        if let Some(consistency) = &consistency {
            table["MultiRegionConsistency"] = json!(consistency);
        }
    });
    proxy
}

/// SDK configuration for a process in `region` whose every call goes to `endpoint`.
async fn config(region: &'static str, endpoint: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(endpoint)
        .timeout_config(outbox::aws::timeouts(Duration::from_secs(10)))
        .load()
        .await
}

/// The settings of a process on table `table`, with `write_region` named or not.
fn settings(table: &str, write_region: Option<&str>) -> Settings {
    Settings::from_lookup(|name| match name {
        vars::BACKEND => Some("aws".to_owned()),
        vars::TABLE_NAME => Some(table.to_owned()),
        vars::CONTROL_QUEUE_URL => Some("http://127.0.0.1:9/control".to_owned()),
        vars::WRITE_REGION => write_region.map(str::to_owned),
        _ => None,
    })
    .expect("valid settings")
}

fn described(proxy: &FaultProxy) -> usize {
    proxy.replies(DESCRIBE_TABLE).len()
}

/// With replicas in eu-west-1, the worker's start, the backend's (the API's and a
/// service's) and `native_outbox` are refused, naming the table, the other Region and the
/// setting; named to write it from here (us-east-1), each starts; a process in eu-west-1
/// named that way is refused before it calls anything. The same table described as it is
/// (no replicas) starts with nothing named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_replicated_to_other_regions_is_refused_at_start_unless_this_region_writes_it() {
    let table = new_table().await;
    let proxy = global_table_proxy(&["us-east-1", "eu-west-1"], None).await;
    let here = config("us-east-1", proxy.endpoint()).await;

    let refused = match Worker::connect(&settings(&table, None), &here).await {
        Err(SetupError::Table(refused)) => refused,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("the worker started on a table replicated to eu-west-1"),
    };
    let RegionError::Replicated {
        replicas, here: region, ..
    } = &refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (replicas.as_slice(), region.as_deref()),
        (&["eu-west-1".to_owned()][..], Some("us-east-1"))
    );
    let told = refused.to_string();
    for named in [table.as_str(), "eu-west-1", vars::WRITE_REGION] {
        assert!(told.contains(named), "{named} is not named: {told}");
    }
    assert!(
        matches!(
            AwsBackend::connect(&settings(&table, None), &here).await,
            Err(BackendError::Table(RegionError::Replicated { .. }))
        ),
        "the API's and a service's backend start on it"
    );
    assert!(
        matches!(
            outbox::wiring::native_outbox(&settings(&table, None), &here).await,
            Err(BackendError::Table(RegionError::Replicated { .. }))
        ),
        "native_outbox starts on it"
    );

    let named = settings(&table, Some("us-east-1"));
    Worker::connect(&named, &here)
        .await
        .unwrap_or_else(|error| panic!("named to write it from here, the worker is refused: {error}"));
    let backend = AwsBackend::connect(&named, &here).await.expect("the backend starts");
    assert_eq!(
        backend.check_table().await.unwrap(),
        TableRegions::WrittenInOneRegion {
            write_region: "us-east-1".to_owned(),
            replicas: vec!["eu-west-1".to_owned()],
        }
    );

    let before = described(&proxy);
    let elsewhere = config("eu-west-1", proxy.endpoint()).await;
    match Worker::connect(&named, &elsewhere).await {
        Err(SetupError::Table(RegionError::NotTheWriteRegion { write_region, here, .. })) => {
            assert_eq!(
                (write_region.as_str(), here.as_deref()),
                ("us-east-1", Some("eu-west-1"))
            );
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a worker in eu-west-1 started on a table written from us-east-1"),
    }
    assert_eq!(described(&proxy), before, "a process out of its Region calls nothing");

    // The same table as DynamoDB Local describes it: one Region.
    let plain = config("us-east-1", &emulator().dynamodb_endpoint).await;
    let backend = AwsBackend::connect(&settings(&table, None), &plain)
        .await
        .expect("a table in one Region is taken");
    assert_eq!(backend.check_table().await.unwrap(), TableRegions::Single);
    println!(
        "refused: {told}\n{} DescribeTable answers rewritten with replicas",
        described(&proxy)
    );
}

/// Described with multi-Region strong consistency, the table is refused with or without
/// a Region named: it takes no transactions and no TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strongly_consistent_global_table_is_refused_whatever_is_named() {
    let table = new_table().await;
    let proxy = global_table_proxy(&["us-east-1", "us-east-2"], Some("STRONG")).await;
    let here = config("us-east-1", proxy.endpoint()).await;
    for write_region in [None, Some("us-east-1")] {
        match AwsBackend::connect(&settings(&table, write_region), &here).await {
            Err(BackendError::Table(refused @ RegionError::StronglyConsistent { .. })) => {
                assert!(refused.to_string().contains("no transactions and no TTL"), "{refused}");
            }
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("started on a strongly consistent global table ({write_region:?} named)"),
        }
    }
    assert_eq!(described(&proxy), 2);
}

/// The bootstrap that finds the table existing, replicated to eu-west-1, refuses it
/// before it creates anything else; named to be written from another Region, it refuses
/// before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_refuses_an_existing_table_replicated_to_other_regions() {
    let table = new_table().await;
    let proxy = global_table_proxy(&["eu-west-1"], None).await;
    let clients = AwsClients::new(&config("us-east-1", proxy.endpoint()).await);
    let mut names = ResourceNames::for_stack(&unique_name("regions-stack"));
    names.layout = outbox::aws::TableLayout::dedicated(&table);
    match outbox::aws::bootstrap(&clients, &names).await {
        Err(BootstrapError::Regions(RegionError::Replicated { table: named, .. })) => assert_eq!(named, table),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("the bootstrap went on with a table replicated to eu-west-1"),
    }
    names.write_region = Some("eu-west-1".to_owned());
    let before = described(&proxy);
    assert!(matches!(
        outbox::aws::bootstrap(&clients, &names).await,
        Err(BootstrapError::Regions(RegionError::NotTheWriteRegion { .. }))
    ));
    assert_eq!(described(&proxy), before);
}

/// The variable that makes this test binary the starting process, and which start.
const ROLE: &str = "OUTBOX_TESTS_REGIONS_PROCESS";

/// A process's cold start as on Lambda, its SDK configuration from the environment (the
/// proxy as `AWS_ENDPOINT_URL_DYNAMODB`): the API's (`api::runtime::start`), the control
/// worker's (`Worker::from_settings`), a consumer's (`Setup::new`) and a service's
/// (`Service::start`), each on a table replicated to eu-west-1. Each start's outcome is
/// one line on standard output. Does nothing when run otherwise.
#[test]
#[ignore = "the starting process of the cold-start test, which runs it"]
fn cold_start_process() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let told = |name: &str, outcome: Result<(), String>| match outcome {
            Ok(()) => println!("{name}: started"),
            Err(refused) => println!("{name}: refused: {refused}"),
        };
        let settings = Settings::from_env().expect("the settings");
        told(
            "api",
            api::runtime::start(&settings, std::future::pending())
                .await
                .map(|_| ())
                .map_err(|error| error.to_string()),
        );
        told(
            "worker",
            Worker::from_settings(&settings)
                .await
                .map(|_| ())
                .map_err(|error| error.to_string()),
        );
        let consumer = outbox::consumer::ConsumerSettings::from_env().expect("the consumer's settings");
        told(
            "consumer",
            outbox::consumer::Setup::new(consumer, std::sync::Arc::new(shipping::Shipping))
                .await
                .map(|_| ())
                .map_err(|error| error.to_string()),
        );
        let service = outbox::service::Service::new(settings).start().await;
        told("service", service.map(|_| ()).map_err(|error| error.to_string()));
    });
}

/// Started as on Lambda, with its settings in the environment, each process refuses a
/// table replicated to eu-west-1, naming it; with `OUTBOX_WRITE_REGION` naming its own
/// Region, each starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_refuses_a_replicated_table_at_its_cold_start() {
    let table = new_table().await;
    let proxy = global_table_proxy(&["us-east-1", "eu-west-1"], None).await;
    let start = |write_region: Option<&str>| {
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command
            .args([
                "cold_start_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, "all")
            .env("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env(vars::BACKEND, "aws")
            .env(vars::TABLE_NAME, &table)
            .env(vars::CONTROL_QUEUE_URL, "http://127.0.0.1:9/control")
            .env("OUTBOX_CONSUMER_NAME", "shipping")
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_PROFILE")
            .env_remove(vars::WRITE_REGION);
        if let Some(region) = write_region {
            command.env(vars::WRITE_REGION, region);
        }
        let output = command.output().expect("the process runs");
        // The outcomes, one a line (the first one after the test harness's own words).
        let out: String = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| line.strip_prefix("test cold_start_process ... ").unwrap_or(line))
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(
            output.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    };
    let refused = start(None);
    for process in ["api", "worker", "consumer", "service"] {
        let line = refused
            .lines()
            .find(|line| line.starts_with(&format!("{process}: ")))
            .unwrap_or_else(|| panic!("no outcome for {process}:\n{refused}"));
        assert!(
            line.starts_with(&format!(
                "{process}: refused: table {table} is a global table with replicas in eu-west-1"
            )),
            "{line}"
        );
    }
    let started = start(Some("us-east-1"));
    for process in ["api", "worker", "consumer", "service"] {
        assert!(
            started.lines().any(|line| line == format!("{process}: started")),
            "{process} did not start:\n{started}"
        );
    }
    println!("{refused}{started}");
}
