//! Support for the integration, conformance and simulation tests of the outbox.
//!
//! - [`sim`]: a deterministic simulation that runs the real request and control paths
//!   on the embedded backend under a controlled clock, a scheduler that picks every
//!   interleaving, and a fault injector, then checks the invariants.
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
pub mod sim;
pub mod single_table;
