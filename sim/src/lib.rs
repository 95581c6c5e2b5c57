//! A deterministic simulation of the outbox.
//!
//! Actors (API requests running the request path, control workers running the poller
//! and the control path) are futures polled by hand on one thread. Every call they make
//! to a port goes through a *gate*: the actor parks there, and the scheduler decides
//! which parked actor moves next, whether the clock moves instead, and which fault the
//! operation meets (none, a crash before it, a crash after it, applied with the reply
//! lost, refused, or, for a commit, timed out with the request still on its way: a
//! *ghost* actor then applies it at a later step, racing whatever settles it). A [`Chooser`] makes every decision, so the same choices replay the
//! same schedule: exhaustively (depth-first over all choices) or from a seed.
//!
//! After the chaotic phase, recovery runs with no faults: crashed workers are replaced,
//! the clock advances to each next delivery, and the dead-letter queue is redriven, until
//! nothing is left to do. Then [`invariants`] checks I1 to I7 and the business state.
//!
//! Message handlers (docs/PROTOCOL.md section 10) have a schedule of their own
//! ([`run_consumer_schedule`]): copies of one incoming message, each a consumer over the
//! same gated ports, delivered again until acknowledged; then C1 to C5. The same
//! schedules run in entity mode (section 11, [`ConsumerSimConfig::entity`]), where the
//! checks also find no entry left behind or brought back.
//!
//! Every request-path schedule also checks its entities' chains (each committed
//! message's place: seq 1 to n per entity and destination, versions and `after`s as the
//! history committed them, across deletes and re-creates) and the publish order on the
//! FIFO destination (first deliveries of an entity's entity-form commits in seq order).
//! The in-order consumer has a world of its own ([`run_in_order_schedule`]): the placed
//! messages the real request path published, delivered in any order with a duplicate,
//! each applied once, in chain order, none skipped.
//!
//! Past the first hop ([`run_hop_schedule`]): the request path's two transactions on one
//! entity, through a consumer that publishes, to an in-order consumer of its messages,
//! each hop's source a FIFO or standard queue with a dead-letter queue behind it; the
//! last consumer must apply each once, in chain order, with every dead-letter queue empty.
//!
//! The entity mode's fence meeting a commit of a split record runs on the real DynamoDB
//! adapter over a double of DynamoDB's wire protocol that evaluates the conditions
//! ([`run_fence_split_schedule`]), every interleaving explored.

mod chooser;
mod consumer;
mod entity;
mod expression;
mod fence_split;
mod gate;
mod hop;
mod in_order;
mod in_order_effects;
pub mod invariants;
mod ports;
mod split;
mod step_checks;
mod world;

pub use chooser::{Chooser, DepthFirst, FaultsDepthFirst, Seeded};
pub use consumer::{
    consumer_faults, entity_faults, run_consumer_schedule, ConsumerCounts, ConsumerOutcome, ConsumerSimConfig,
    CONSUMER, INCOMING_ID, RETENTION,
};
pub use fence_split::{
    fence_split_faults, run_fence_split_schedule, FenceSplitConfig, FenceSplitCounts, FenceSplitOutcome, ITEM_BYTES,
};
pub use gate::{Fault, Op};
pub use hop::{
    hop_faults, hop_produced, run_hop_schedule, HopConfig, HopCounts, HopInput, HopOutcome, BILLING, MAX_RECEIVE_COUNT,
    SHIPPING,
};
pub use in_order::{in_order_faults, produced, run_in_order_schedule, InOrderConfig, InOrderCounts, InOrderOutcome};
pub use in_order_effects::pair_faults;
pub use split::{run_split_schedule, SplitConfig, SplitCounts, SplitOutcome};
pub use world::{
    run_schedule, sim_timing, AfterAnswerRuns, ApiResult, ChainCounts, LateOps, LoopEnds, Outcome, SimConfig,
    UnknownCommits,
};
