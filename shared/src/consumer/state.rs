//! What an in-order consumer did with one entity's chain, for whoever operates it: the
//! message it applied last, the transaction of that message's effect, and the messages
//! kept waiting for a predecessor, with how long each has waited.
//!
//! Read by [`chain_state`]; served by the route of `outbox::http::consumers` (mounted by
//! the service, behind its own sign-in) and printed by `control-worker consumer-state`.
//!
//! ```
//! # async fn show(outbox: outbox::request::Outbox) -> Result<(), outbox::ports::StoreError> {
//! use outbox::consumer::state::{chain_state, ChainQuery};
//! let mut query = ChainQuery::new("ledger".parse().unwrap(), "events".parse().unwrap(), "PRODUCT#p1".parse().unwrap())
//!     // The ledger applies in entity mode: its place is kept in the tally it writes.
//!     .applied_in("TALLY#p1".parse().unwrap());
//! // The chain the service's own table keeps (positions name the table that stamped them).
//! if let Some(table) = outbox.store().producer() {
//!     query = query.producer(table);
//! }
//! let state = chain_state(outbox.store().as_ref(), outbox.clock().as_ref(), &query).await?;
//! println!("applied through {:?}, {} waiting", state.applied.map(|a| a.seq), state.kept.len());
//! # Ok(()) }
//! ```

use futures_util::future::join_all;
use serde::Serialize;

use super::in_order::{applied_name, kept_key, position_key};
use super::ConsumerName;
use crate::ports::{Clock, ItemKey, Store, StoreError};
use crate::protocol::{DestinationName, Position, Producer};

/// How many `seq`s past the one applied last [`chain_state`] looks for kept messages:
/// each is one read, and a chain with more waiting than this has a predecessor missing
/// long enough for the consumer's wait alarm to have said so.
pub const KEPT_LOOKAHEAD: u64 = 32;

/// Which consumer and which chain: the consumer's name, the destination it consumes (the
/// chain's), the producer that names the chain where it names one (the table of the
/// entity's chain heads; see [`Position::producer`]), and the entity.
#[derive(Debug, Clone)]
pub struct ChainQuery {
    consumer: ConsumerName,
    destination: DestinationName,
    producer: Option<Producer>,
    entity: ItemKey,
    applied_in: Option<ItemKey>,
}

impl ChainQuery {
    /// Consumer `consumer`'s state of `entity`'s chain on `destination`, as an unnamed
    /// producer stamped it.
    pub fn new(consumer: ConsumerName, destination: DestinationName, entity: ItemKey) -> Self {
        Self {
            consumer,
            destination,
            producer: None,
            entity,
            applied_in: None,
        }
    }

    /// The chain as `producer` named it (the `producer=` of the messages' position).
    pub fn producer(mut self, producer: Producer) -> Self {
        self.producer = Some(producer);
        self
    }

    /// Whether the query names the chain's producer.
    pub fn names_producer(&self) -> bool {
        self.producer.is_some()
    }

    /// The item the consumer applies the entity's messages to, where it applies them in
    /// entity mode ([`super::Handler::entity`]): it keeps its place in that item's key.
    pub fn applied_in(mut self, item: ItemKey) -> Self {
        self.applied_in = Some(item);
        self
    }

    /// The chain as a position names it, at `seq`.
    fn position(&self, seq: u64) -> Position {
        Position {
            producer: self.producer.clone(),
            entity: self.entity.clone(),
            chain: self.destination.clone(),
            seq,
            version: 0,
            after: 0,
            previous: None,
        }
    }
}

/// A consumer's state of one chain ([`chain_state`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChainState {
    /// The consumer.
    pub consumer: String,
    /// The chain: its destination, and `@` and its producer where it names one.
    pub chain: String,
    /// The entity whose chain it is.
    pub entity: String,
    /// The message applied last, if any.
    pub applied: Option<AppliedMessage>,
    /// The messages kept waiting for a predecessor, in `seq` order (looked for up to
    /// `looked_through`).
    pub kept: Vec<KeptMessage>,
    /// The last `seq` looked for among the kept ones.
    pub looked_through: u64,
}

/// The message a consumer applied last of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AppliedMessage {
    /// Its place in the chain.
    pub seq: u64,
    /// The transaction that applied it (its effect): the consumer's own, whose status
    /// the service's status route tells. Absent where it was applied by a version of the
    /// library that did not keep it.
    pub transaction_id: Option<String>,
    /// Where the consumer keeps its place: its position item, or the item it applies to
    /// (entity mode).
    pub kept_in: String,
}

/// A message kept until its predecessor is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeptMessage {
    /// Its place in the chain.
    pub seq: u64,
    /// Its id on the queue it came from.
    pub queue_message_id: String,
    /// When it was kept, in milliseconds since the Unix epoch.
    pub kept_at_ms: u64,
    /// How long it has waited, in seconds.
    pub waiting_s: u64,
}

/// The message applied last of `position`'s chain, as consumer `consumer` keeps it: its
/// `seq`, the transaction that applied it and where it is kept; the greater of its
/// position item's and, with `key` (entity mode), the key's.
async fn applied_of(
    store: &dyn Store,
    consumer: &str,
    position: &Position,
    key: Option<&ItemKey>,
) -> Result<Option<(u64, Option<String>, String)>, StoreError> {
    // The position item, where the consumer applies in a transaction: the seq, and the
    // transaction that moved it there.
    let item = position_key(consumer, position);
    let mut applied = store
        .get_items(std::slice::from_ref(&item))
        .await?
        .remove(&item)
        .and_then(|read| {
            let seq = read.data["applied"].as_u64()?;
            Some((seq, read.data["txn"].as_str().map(str::to_owned), item.to_string()))
        });
    let Some(key) = key else {
        return Ok(applied);
    };
    let read = match store.get_keys(std::slice::from_ref(key)).await {
        Ok(mut keys) => keys.remove(key).unwrap_or_default(),
        // A store that keeps no positions in keys: the item alone.
        Err(StoreError::Unsupported(_)) => return Ok(applied),
        Err(error) => return Err(error),
    };
    if let Some(held) = read.applied.get(&applied_name(consumer, position)) {
        if applied.as_ref().is_none_or(|(seq, _, _)| held.seq >= *seq) {
            applied = Some((held.seq, held.txn.map(|txn| txn.to_string()), key.to_string()));
        }
    }
    Ok(applied)
}

/// Consumer `query`'s state of `query`'s chain: the message applied last (the greater of
/// its position item's and, with [`ChainQuery::applied_in`], its entity's key's), and the
/// messages kept past it (up to [`KEPT_LOOKAHEAD`] `seq`s on). A chain that names its
/// producer and has no position of its own yet stands where the unnamed chain does, as
/// the consumer continues it. A message that waits on
/// its queue rather than kept (too large to keep, or on a FIFO source) is not listed:
/// the consumer's `InOrderWaitAge` metric measures the oldest of those.
pub async fn chain_state(store: &dyn Store, clock: &dyn Clock, query: &ChainQuery) -> Result<ChainState, StoreError> {
    let consumer = query.consumer.as_str();
    let named = query.position(0);
    let mut applied = applied_of(store, consumer, &named, query.applied_in.as_ref()).await?;
    // A chain its producer names with no position of its own yet continues the unnamed
    // one (what the consumer kept before the producer named itself), as the consumer
    // does: that is where it stands.
    if applied.is_none() && named.producer.is_some() {
        applied = applied_of(store, consumer, &named.unnamed(), query.applied_in.as_ref()).await?;
    }
    let from = applied.as_ref().map_or(0, |(seq, _, _)| *seq);
    let looked_through = from + KEPT_LOOKAHEAD;
    let reads = ((from + 1)..=looked_through).map(|seq| {
        let key = kept_key(consumer, &named, seq);
        async move { (seq, store.get_kept(&key).await) }
    });
    let now = clock.now();
    let mut kept = Vec::new();
    for (seq, read) in join_all(reads).await {
        match read {
            Ok(Some(message)) => kept.push(KeptMessage {
                seq,
                queue_message_id: message.delivery.message_id,
                kept_at_ms: message.kept_at.as_millis(),
                waiting_s: now.since(message.kept_at).as_secs(),
            }),
            Ok(None) | Err(StoreError::Unsupported(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(ChainState {
        consumer: consumer.to_owned(),
        chain: match &query.producer {
            Some(producer) => format!("{}@{producer}", query.destination),
            None => query.destination.to_string(),
        },
        entity: query.entity.to_string(),
        applied: applied.map(|(seq, transaction_id, kept_in)| AppliedMessage {
            seq,
            transaction_id,
            kept_in,
        }),
        kept,
        looked_through,
    })
}
