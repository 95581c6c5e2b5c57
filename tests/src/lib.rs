//! Support for the integration and conformance tests of the outbox (the simulation is a
//! package of its own, `outbox-sim`, built with optimisation).
//!
//! - [`fake_lambda`]: a fake Lambda Runtime and Extensions API, one invocation at a time
//!   or several at once (Lambda Managed Instances), for a function's process started from
//!   the test binary.

pub mod calls;
pub mod compat;
pub mod conformance;
pub mod cost;
pub mod emulator;
pub mod fake_lambda;
pub mod fault_proxy;
pub mod odd_store;
pub mod single_table;
