//! The example domain, orders, and its routes: how a user's own handlers use the outbox.

pub mod handlers;
pub mod model;
