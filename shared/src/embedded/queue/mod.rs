//! An in-process queue with the SQS semantics the protocol relies on: per-message delay,
//! visibility timeout, receive counts, a dead-letter queue after a maximum receive count,
//! and for FIFO queues message groups and deduplication ids.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::ports::Clock;
use crate::time::Timestamp;

/// SQS's longest per-message delay.
pub const MAX_DELAY: Duration = Duration::from_secs(900);
/// SQS's largest message (body plus attributes).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long a FIFO queue remembers a deduplication id.
pub const DEDUPLICATION_WINDOW: Duration = Duration::from_secs(300);

/// A queue's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Its name (FIFO names end in `.fifo` on SQS; here it is only a label).
    pub name: String,
    /// Whether it is a FIFO queue.
    pub fifo: bool,
    /// How long a received message stays invisible.
    pub visibility_timeout: Duration,
    /// Most messages it holds: a send beyond drops the oldest (counted in
    /// [`EmbeddedQueue::dropped`]). `None`, as SQS, holds everything; the embedded
    /// server bounds the destinations nobody receives from.
    pub max_messages: Option<usize>,
}

impl QueueConfig {
    /// A standard queue with SQS's default visibility timeout.
    pub fn standard(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            fifo: false,
            visibility_timeout: Duration::from_secs(30),
            max_messages: None,
        }
    }

    /// This configuration, holding at most `max` messages (the oldest dropped).
    pub fn holding_at_most(mut self, max: usize) -> Self {
        self.max_messages = Some(max.max(1));
        self
    }

    /// A FIFO queue with SQS's default visibility timeout.
    pub fn fifo(name: &str) -> Self {
        Self {
            fifo: true,
            ..Self::standard(name)
        }
    }
}

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendRequest {
    /// The body.
    pub body: String,
    /// String attributes.
    pub attributes: BTreeMap<String, String>,
    /// Invisible for this long after the send (standard queues only).
    pub delay: Duration,
    /// FIFO: the message group (required).
    pub group_id: Option<String>,
    /// FIFO: the deduplication id (required; no content-based deduplication here).
    pub deduplication_id: Option<String>,
}

/// Why a send was refused, as SQS would refuse it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFault {
    /// A parameter breaks a rule (SQS `InvalidParameterValue` and friends).
    #[error("invalid parameter: {0}")]
    InvalidParameter(&'static str),
}

/// A message as sent and accepted, kept in the queue's log for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// The queue's id for it.
    pub message_id: String,
    /// What was sent.
    pub request: SendRequest,
    /// When it was accepted.
    pub sent_at: Timestamp,
    /// Whether a FIFO deduplication id suppressed it (accepted, not enqueued).
    pub deduplicated: bool,
}

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The queue's id for the message.
    pub message_id: String,
    /// The handle for deleting this receipt.
    pub receipt: String,
    /// The body.
    pub body: String,
    /// The attributes.
    pub attributes: BTreeMap<String, String>,
    /// The FIFO message group, on a FIFO queue.
    pub group_id: Option<String>,
    /// Receives so far, this one included.
    pub receive_count: u32,
}

#[derive(Debug, Clone)]
struct Stored {
    message_id: String,
    request: SendRequest,
    visible_at: Timestamp,
    receive_count: u32,
    receipt: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    messages: VecDeque<Stored>,
    next_id: u64,
    /// Every message sent, when a test asked for it ([`EmbeddedQueue::record_sends`]).
    log: Option<Vec<SentMessage>>,
    deduplication: BTreeMap<String, (Timestamp, String)>,
    dropped: usize,
}

impl State {
    fn record(&mut self, sent: impl FnOnce() -> SentMessage) {
        if let Some(log) = &mut self.log {
            log.push(sent());
        }
    }

    /// Adds `message`, dropping the oldest beyond `max`.
    fn push(&mut self, message: Stored, max: Option<usize>) {
        self.messages.push_back(message);
        if let Some(max) = max {
            while self.messages.len() > max {
                self.messages.pop_front();
                self.dropped += 1;
            }
        }
    }
}

/// An in-process queue.
pub struct EmbeddedQueue {
    config: QueueConfig,
    clock: Arc<dyn Clock>,
    dead_letter: Option<(Arc<EmbeddedQueue>, u32)>,
    state: Mutex<State>,
}

impl EmbeddedQueue {
    /// An empty queue whose delays and timeouts follow `clock`.
    pub fn new(config: QueueConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            clock,
            dead_letter: None,
            state: Mutex::new(State::default()),
        }
    }

    /// Adds a redrive policy: a message received `max_receive_count` times and not
    /// deleted moves to `dead_letter` instead of being received again.
    pub fn with_dead_letter_queue(mut self, dead_letter: Arc<EmbeddedQueue>, max_receive_count: u32) -> Self {
        self.dead_letter = Some((dead_letter, max_receive_count.max(1)));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The dead-letter queue, if any.
    pub fn dead_letter_queue(&self) -> Option<&Arc<EmbeddedQueue>> {
        self.dead_letter.as_ref().map(|(queue, _)| queue)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends a message; returns its id (for a deduplicated FIFO send, the id of the
    /// message it duplicates, as SQS does).
    pub fn send(&self, request: SendRequest) -> Result<String, QueueFault> {
        let size = request.body.len() + request.attributes.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > MAX_MESSAGE_BYTES {
            return Err(QueueFault::InvalidParameter("message larger than 1 MiB"));
        }
        if request.body.is_empty() {
            return Err(QueueFault::InvalidParameter("empty message body"));
        }
        if request.delay > MAX_DELAY {
            return Err(QueueFault::InvalidParameter("delay longer than 900 seconds"));
        }
        if self.config.fifo {
            if !request.delay.is_zero() {
                return Err(QueueFault::InvalidParameter("FIFO queues take no per-message delay"));
            }
            if request.group_id.is_none() || request.deduplication_id.is_none() {
                return Err(QueueFault::InvalidParameter(
                    "FIFO messages need a group id and a deduplication id",
                ));
            }
        }
        let now = self.clock.now();
        let mut state = self.lock();
        if let Some(id) = request.deduplication_id.as_ref().filter(|_| self.config.fifo) {
            state
                .deduplication
                .retain(|_, (at, _)| now.since(*at) < DEDUPLICATION_WINDOW);
            if let Some((_, message_id)) = state.deduplication.get(id) {
                let message_id = message_id.clone();
                state.record(|| SentMessage {
                    message_id: message_id.clone(),
                    request,
                    sent_at: now,
                    deduplicated: true,
                });
                return Ok(message_id);
            }
        }
        state.next_id += 1;
        let message_id = format!("{}-{:08}", self.config.name, state.next_id);
        if let Some(id) = request.deduplication_id.as_ref().filter(|_| self.config.fifo) {
            state.deduplication.insert(id.clone(), (now, message_id.clone()));
        }
        state.record(|| SentMessage {
            message_id: message_id.clone(),
            request: request.clone(),
            sent_at: now,
            deduplicated: false,
        });
        let visible_at = now.plus(request.delay);
        state.push(
            Stored {
                message_id: message_id.clone(),
                request,
                visible_at,
                receive_count: 0,
                receipt: None,
            },
            self.config.max_messages,
        );
        Ok(message_id)
    }

    /// Receives up to `max` visible messages, oldest first, making each invisible for
    /// the visibility timeout. A message already received the maximum number of times
    /// moves to the dead-letter queue instead. On a FIFO queue, a group with a message in
    /// flight yields nothing until that message is deleted or visible again.
    pub fn receive(&self, max: usize) -> Vec<Received> {
        self.receive_for(max, self.config.visibility_timeout)
    }

    /// [`EmbeddedQueue::receive`], each message invisible for `visibility` instead of
    /// the queue's visibility timeout (SQS's `VisibilityTimeout` of a receive).
    pub fn receive_for(&self, max: usize, visibility: Duration) -> Vec<Received> {
        let now = self.clock.now();
        let mut to_dead_letter = Vec::new();
        let mut received = Vec::new();
        {
            let mut state = self.lock();
            let mut blocked_groups: BTreeSet<String> = BTreeSet::new();
            if self.config.fifo {
                for message in state
                    .messages
                    .iter()
                    .filter(|m| m.visible_at > now && m.receipt.is_some())
                {
                    blocked_groups.extend(message.request.group_id.clone());
                }
            }
            let mut index = 0;
            while index < state.messages.len() && received.len() < max {
                let message = &state.messages[index];
                let group_blocked = message
                    .request
                    .group_id
                    .as_ref()
                    .is_some_and(|g| blocked_groups.contains(g));
                if message.visible_at > now || group_blocked {
                    if self.config.fifo {
                        // Later messages of a group wait for earlier ones.
                        blocked_groups.extend(message.request.group_id.clone());
                    }
                    index += 1;
                    continue;
                }
                if let Some((_, max_receives)) = &self.dead_letter {
                    if message.receive_count >= *max_receives {
                        let moved = state.messages.remove(index).expect("index is in range");
                        to_dead_letter.push(moved);
                        continue;
                    }
                }
                let message = &mut state.messages[index];
                message.receive_count += 1;
                message.visible_at = now.plus(visibility);
                let receipt = format!("{}#{}", message.message_id, message.receive_count);
                message.receipt = Some(receipt.clone());
                received.push(Received {
                    message_id: message.message_id.clone(),
                    receipt,
                    body: message.request.body.clone(),
                    attributes: message.request.attributes.clone(),
                    group_id: message.request.group_id.clone(),
                    receive_count: message.receive_count,
                });
                index += 1;
            }
        }
        if let Some((dead_letter, _)) = &self.dead_letter {
            for message in to_dead_letter {
                dead_letter.enqueue_moved(message);
            }
        }
        received
    }

    /// Deletes the message received with `receipt`; a stale receipt (the message was
    /// received again since) or an unknown one deletes nothing. Returns whether a
    /// message was deleted.
    pub fn delete(&self, receipt: &str) -> bool {
        let mut state = self.lock();
        let before = state.messages.len();
        state
            .messages
            .retain(|message| message.receipt.as_deref() != Some(receipt));
        state.messages.len() != before
    }

    /// Makes the message received with `receipt` visible again after `timeout`.
    pub fn change_visibility(&self, receipt: &str, timeout: Duration) -> bool {
        let now = self.clock.now();
        let mut state = self.lock();
        match state
            .messages
            .iter_mut()
            .find(|message| message.receipt.as_deref() == Some(receipt))
        {
            Some(message) => {
                message.visible_at = now.plus(timeout);
                true
            }
            None => false,
        }
    }

    /// Moves every message of this queue to `target`, as new messages with their bodies
    /// and attributes (SQS's `StartMessageMoveTask`, which redrives a dead-letter queue).
    /// Returns how many moved.
    pub fn move_all_to(&self, target: &EmbeddedQueue) -> usize {
        let messages: Vec<Stored> = self.lock().messages.drain(..).collect();
        let count = messages.len();
        for message in messages {
            target.enqueue_moved(message);
        }
        count
    }

    fn enqueue_moved(&self, mut message: Stored) {
        let now = self.clock.now();
        message.visible_at = now;
        message.receive_count = 0;
        message.receipt = None;
        let mut state = self.lock();
        state.record(|| SentMessage {
            message_id: message.message_id.clone(),
            request: SendRequest {
                delay: Duration::ZERO,
                ..message.request.clone()
            },
            sent_at: now,
            deduplicated: false,
        });
        state.push(message, self.config.max_messages);
    }

    /// Messages in the queue, visible or not.
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// Messages a receive takes within `horizon` from now, or that a receiver holds: the
    /// queue's messages but those sent with a delay that ends later than that (a kept
    /// message's reminder, due minutes later, say).
    pub fn due_within(&self, horizon: Duration) -> usize {
        let until = self.clock.now().plus(horizon);
        self.lock()
            .messages
            .iter()
            .filter(|message| message.visible_at <= until || message.receive_count > 0)
            .count()
    }

    /// Whether the queue holds no message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a receive now would return something.
    pub fn has_visible(&self) -> bool {
        let now = self.clock.now();
        self.lock().messages.iter().any(|message| message.visible_at <= now)
    }

    /// The earliest future instant at which a message becomes visible.
    pub fn next_visible_at(&self) -> Option<Timestamp> {
        let now = self.clock.now();
        self.lock()
            .messages
            .iter()
            .map(|message| message.visible_at)
            .filter(|at| *at > now)
            .min()
    }

    /// Keeps a log of every message accepted from now on, for [`Self::sent`]: for tests
    /// (a long-running process would hold every message it ever sent).
    pub fn record_sends(&self) {
        self.lock().log.get_or_insert_with(Vec::new);
    }

    /// Every message accepted since [`Self::record_sends`], in order (including moved
    /// ones and, flagged, deduplicated ones).
    ///
    /// # Panics
    ///
    /// If sends are not recorded: a test that reads the log must ask for it.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.lock()
            .log
            .clone()
            .unwrap_or_else(|| panic!("queue {}: call record_sends() before reading sent()", self.config.name))
    }

    /// Messages dropped because the queue held [`QueueConfig::max_messages`].
    pub fn dropped(&self) -> usize {
        self.lock().dropped
    }

    /// The bodies of the messages now in the queue, oldest first.
    pub fn bodies(&self) -> Vec<String> {
        self.lock()
            .messages
            .iter()
            .map(|message| message.request.body.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests;
