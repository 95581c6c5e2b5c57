//! The conformance suite on the AWS adapters, against the emulators (DynamoDB Local for
//! DynamoDB, `moto[server]` for the rest), through the real `aws-sdk-*` clients, in two
//! layouts of the protocol's records: a dedicated table keyed `pk`, and the
//! application's single-table design keyed `PK` + `SK`.

use outbox_tests::conformance::Backend;

mod dedicated_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws().await);
}

mod single_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws_single_table().await);
}

/// Past DynamoDB's ten-minute window a commit's token is new again: a repeat of an
/// applied commit is no longer answered by the token but cancelled by the transaction's
/// own record, which the store must read from `ALL_OLD` and report as success. The
/// window is out of reach in a test, so an interceptor drops the token from every commit.
mod past_the_token_window {
    use outbox::aws::AwsClients;
    use outbox_tests::calls::{CallCounter, ForgetToken};
    use outbox_tests::conformance::cases;
    use outbox_tests::emulator::emulator;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeat_finds_its_own_record_and_succeeds() {
        let config = emulator().sdk_config().await;
        let wire = CallCounter::default();
        let clients = AwsClients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&config)
                    .interceptor(wire.clone())
                    .interceptor(ForgetToken)
                    .build(),
            ),
            ..wire.clients(&config)
        };
        let mut backend = Backend::aws_with(clients).await;
        backend.wire = Some(wire.clone());
        cases::a_retried_commit_finds_its_own_record_and_succeeds(&backend).await;
        // The first attempt applied; both repeats were cancelled by the record and
        // explained, not answered by a token.
        assert_eq!(wire.replies("TransactWriteItems"), [200, 400, 400]);
    }

    /// The same, and a commit after a tombstone, with the old items taken out of every
    /// cancellation (an engine that does not return `ALL_OLD`): the store reads the record
    /// that blocked the commit instead of taking it for a tombstone.
    mod without_the_old_items {
        use outbox_tests::fault_proxy::{Fault, FaultProxy};

        use super::*;

        async fn backend(proxy: &FaultProxy) -> Backend {
            let config = emulator().sdk_config().await;
            let clients = AwsClients {
                dynamodb: aws_sdk_dynamodb::Client::from_conf(
                    aws_sdk_dynamodb::config::Builder::from(&config)
                        .endpoint_url(proxy.endpoint())
                        .interceptor(ForgetToken)
                        .build(),
                ),
                ..AwsClients::new(&config)
            };
            Backend::aws_with(clients).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_repeat_reads_its_own_record_and_succeeds() {
            let proxy = FaultProxy::start(&emulator().dynamodb_endpoint, |_| Fault::WithoutOldItems).await;
            cases::a_retried_commit_finds_its_own_record_and_succeeds(&backend(&proxy).await).await;
            let cancelled: Vec<_> = proxy
                .intercepted()
                .into_iter()
                .filter_map(|attempt| attempt.upstream?.ok())
                .filter(|reply| reply.status == 400)
                .collect();
            assert_eq!(cancelled.len(), 2, "both repeats were cancelled by the record");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_commit_after_a_tombstone_reads_the_tombstone() {
            let proxy = FaultProxy::start(&emulator().dynamodb_endpoint, |_| Fault::WithoutOldItems).await;
            cases::a_commit_after_a_tombstone_is_rejected_with_nothing_written(&backend(&proxy).await).await;
        }
    }
}
