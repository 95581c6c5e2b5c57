//! A transaction's control message, sent when the transaction first needs it: just before
//! its first commit attempt, or earlier when its handler asks ([`Transaction::send_control`]).
//!
//! Until then nothing of the transaction has left the process: no control message, no
//! write. A transaction that never tries to commit (a handler that refuses after its reads:
//! not found, not yours, out of stock, a failed precondition) needs no fence, since nothing
//! of it can ever land; abandoning it writes nothing and sends nothing, and the request
//! path's live state refuses a send or a commit of it from then on.

use std::sync::{Mutex, OnceLock};

use super::settle::within;
use super::{Transaction, TxnError};
use crate::ports::QueueError;
use crate::protocol::{ControlMessage, TxnId};
use crate::time::Timestamp;

/// A hook told once, just before a transaction's control message is sent.
type Hook = Box<dyn FnOnce(TxnId) + Send + Sync + 'static>;

/// A transaction's control message and what became of its send.
pub(super) struct ControlSend {
    /// The message, built at begin (its trace links the request's `begin`), its
    /// `first_sent_at` set when it is sent.
    message: ControlMessage,
    /// How the send ended, once it did: when the message was sent (its commit window
    /// starts there), or why it was not. Final: a transaction whose send failed is never
    /// sent again, as one whose begin failed never was.
    outcome: tokio::sync::OnceCell<Result<Timestamp, Unsent>>,
    /// When its first send began: every send of it carries that instant, so that a send
    /// cut off and tried again never moves its window later.
    first_sent_at: OnceLock<Timestamp>,
    /// Told once, when the queue has acknowledged the message.
    hooks: Mutex<Vec<Hook>>,
}

/// Why a transaction's control message was not sent.
#[derive(Debug, Clone)]
enum Unsent {
    /// The transaction was abandoned first: nothing of it may leave the process.
    Abandoned,
    /// The queue did not take it (its reason as first reported).
    Failed(String),
}

impl ControlSend {
    /// A control message not yet sent.
    pub(super) fn new(message: ControlMessage) -> Self {
        Self {
            message,
            outcome: tokio::sync::OnceCell::new(),
            first_sent_at: OnceLock::new(),
            hooks: Mutex::default(),
        }
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Vec<Hook>> {
        self.hooks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Transaction {
    /// Sends its control message now, unless it was sent already, and returns once the
    /// queue has acknowledged it (within the deadline it was begun with, if any).
    ///
    /// Not needed for correctness: the commit sends it first if it was not sent. A handler
    /// that will write for sure calls it beside its reads (`tokio::join!`), so that the send
    /// overlaps them instead of delaying the commit; the price is that a refusal decided
    /// after it costs the message and a tombstone write, where a transaction never sent
    /// costs nothing. A send that failed is final ([`TxnError::ControlSend`], here and at
    /// the commit; nothing was written); one of a transaction abandoned first is refused
    /// ([`TxnError::Abandoned`]).
    pub async fn send_control(&self) -> Result<(), TxnError> {
        self.send_control_by(self.deadline).await.map(|_| ())
    }

    /// Has `hook` told, once, when its control message was sent (the queue acknowledged
    /// it): from then on abandoning the transaction writes its tombstone (the HTTP glue
    /// records it, to settle the request by what was sent). A send that failed or was cut
    /// short counts as not sent, as a failed begin always did: a control message that got
    /// through anyway only tombstones a transaction that can no longer commit. Hooks add
    /// up.
    pub fn on_control_send(&mut self, hook: impl FnOnce(TxnId) + Send + Sync + 'static) {
        self.control.hooks().push(Box::new(hook));
    }

    /// Whether its control message was sent (acknowledged), and when: its commit window
    /// starts then.
    pub(super) fn sent_at(&self) -> Option<Timestamp> {
        self.control
            .outcome
            .get()
            .and_then(|outcome| outcome.as_ref().ok().copied())
    }

    /// Sends its control message unless it was sent already, cut short at `deadline`:
    /// when it was sent.
    #[tracing::instrument(name = "send_control", skip_all, fields(txn_id = %self.txn_id))]
    pub(super) async fn send_control_by(&self, deadline: Option<Timestamp>) -> Result<Timestamp, TxnError> {
        let txn_id = self.txn_id;
        let ports = &self.outbox.ports;
        let timing = &self.outbox.timing;
        // The error of this call's own send, to report as it came; a later call reports
        // the stored reason.
        let mut failure: Option<QueueError> = None;
        let failed = &mut failure;
        let outcome = self
            .control
            .outcome
            .get_or_init(|| async move {
                let first_sent_at = *self.control.first_sent_at.get_or_init(|| ports.clock.now());
                // Under the request path's lock: an abandon before this point refuses the
                // send (nothing of the transaction leaves the process); one while it is
                // on its way writes the tombstone that settles whatever the message finds.
                let window_end = first_sent_at.plus(timing.max_commit_duration);
                if !self.outbox.live.start_send(txn_id, window_end) {
                    return Err(Unsent::Abandoned);
                }
                let mut message = self.control.message.clone();
                message.first_sent_at = first_sent_at;
                let send = ports.control_queue.send(&message, timing.first_check_delay);
                // Whether or not a send cut short reached the queue, nothing will be
                // committed: a control message for a transaction that never commits only
                // tombstones it.
                let reason = match within(ports.clock.as_ref(), deadline, send).await {
                    Some(Ok(())) => {
                        for hook in std::mem::take(&mut *self.control.hooks()) {
                            hook(txn_id);
                        }
                        return Ok(first_sent_at);
                    }
                    Some(Err(error)) => {
                        let reason = error.to_string();
                        *failed = Some(error);
                        reason
                    }
                    None => "the request's deadline passed during the send".to_owned(),
                };
                // Not sent, for good: an abandon from now on has nothing to settle.
                self.outbox.live.send_failed(txn_id);
                Err(Unsent::Failed(reason))
            })
            .await;
        match outcome {
            Ok(sent_at) => Ok(*sent_at),
            Err(Unsent::Abandoned) => {
                tracing::warn!("the transaction was abandoned before its control message was sent; nothing was sent");
                Err(TxnError::Abandoned { txn_id })
            }
            Err(Unsent::Failed(reason)) => Err(TxnError::ControlSend {
                txn_id,
                source: failure.unwrap_or_else(|| QueueError::Unavailable(reason.clone().into())),
            }),
        }
    }
}
