//! The conformance suite on the AWS adapters, against the emulator (`moto[server]`),
//! through the real `aws-sdk-dynamodb` and `aws-sdk-sqs` clients, in two layouts of the
//! protocol's records: a dedicated table keyed `pk`, and the application's single-table
//! design keyed `PK` + `SK`.

use outbox_tests::conformance::Backend;

mod dedicated_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws().await);
}

mod single_table {
    use super::*;
    outbox_tests::conformance_suite!(Backend::aws_single_table().await);
}
