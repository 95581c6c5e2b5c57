//! The protocol's vocabulary: transaction ids, item keys, control messages, outgoing
//! messages, outbox and idempotency records. Pure data with validation and encodings; no
//! I/O.

mod control_message;
mod idempotency;
mod item_key;
mod message;
mod outbox_record;
mod position;
pub mod sendable;
pub mod sent_marks;
mod trace_context;
mod txn_id;

pub use control_message::{ControlMessage, DecodeError, CONTROL_MESSAGE_VERSION};
pub use idempotency::{IdempotencyKey, IdempotencyRecord, IdempotencySlot, InvalidIdempotencyKey, StoredResponse};
pub use item_key::{InvalidItemKey, ItemKey, RESERVED_KEY_PREFIXES};
pub use message::{
    fifo_group_of, DestinationName, EventError, EventType, FifoGrouping, InvalidDestination, Message, MessageId,
    OutgoingMessage, MAX_MESSAGE_ATTRIBUTES, MESSAGE_ID_ATTRIBUTE, TXN_ID_ATTRIBUTE,
};
pub use outbox_record::{commit_order, OutboxRecord, OutboxState};
pub use position::{
    advance as advance_chain, stamp as stamp_chain, stamp_named as stamp_chain_named, Applied, AppliedPositions,
    ChainHead, ChainHeads, InvalidPosition, InvalidProducer, Place, Position, Producer, ENTITY_ATTRIBUTE,
    POSITION_ATTRIBUTE,
};
pub use sendable::Unsendable;
pub use trace_context::{InvalidTraceContext, TraceContext, TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE};
pub use txn_id::{InvalidTxnId, TxnId};
