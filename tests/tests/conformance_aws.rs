//! The conformance suite on the AWS adapters, against the emulator (`moto[server]`),
//! through the real `aws-sdk-dynamodb` and `aws-sdk-sqs` clients.

use outbox_tests::conformance::Backend;

outbox_tests::conformance_suite!(Backend::aws().await);
