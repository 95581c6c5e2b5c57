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
}
