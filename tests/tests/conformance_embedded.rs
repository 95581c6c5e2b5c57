//! The conformance suite on the embedded backend.

use outbox_tests::conformance::Backend;

outbox_tests::conformance_suite!(Backend::embedded());
