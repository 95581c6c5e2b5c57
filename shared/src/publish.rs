//! Publishing a set of outgoing messages through the [`Publisher`] port: grouping by
//! destination, cutting batches within the limits SQS, SNS and EventBridge share (10
//! entries, 256 KiB per call), and retrying only the entries that failed.
//!
//! This lives above the port so that every adapter gets the same batching and retry
//! behaviour, and the simulation exercises it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::ports::{Clock, Publisher};
use crate::protocol::{DestinationName, MessageId, OutgoingMessage};

/// Most entries in one `SendMessageBatch`, `PublishBatch` or `PutEvents`.
pub const MAX_BATCH_ENTRIES: usize = 10;
/// Most payload bytes in one call (the conservative 256 KiB that every region and
/// account accepts, for SQS, SNS and EventBridge alike), as the publisher counts them
/// ([`Publisher::entry_bytes`]).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// How failed entries are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Sends of one entry at most, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled for each further one.
    pub base_delay: Duration,
    /// Longest wait between two tries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry), with "full jitter"
    /// so that workers that failed together do not retry together.
    pub fn delay(&self, retry: u32) -> Duration {
        let exponential = self.base_delay.saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        let capped = exponential.min(self.max_delay);
        capped.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// Why one message could not be published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishFailure {
    /// The destination kept failing the entry (or the whole call) until retries ran out.
    Exhausted {
        /// The last error seen, for logs.
        last_error: String,
    },
    /// The destination refused the entry as the sender's fault (too large, malformed,
    /// unknown destination); retrying cannot help.
    Refused {
        /// The service's error code.
        code: String,
    },
}

/// What a publishing pass achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PublishReport {
    /// The messages that were not accepted, with why. Every other message was.
    pub failed: BTreeMap<MessageId, PublishFailure>,
    /// Batch calls made (`SendMessageBatch`, `PublishBatch`, `PutEvents`).
    pub calls: usize,
}

/// What a message that a destination refused for good ([`PublishFailure::Refused`]) does
/// to the later messages of its FIFO group in the same pass, on a destination that keeps
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRefused {
    /// They wait, as behind any failure: order is never skipped.
    #[default]
    Block,
    /// They go: an operator released the refused message's transaction
    /// ([`crate::control::ControlPath::releasing_refused`]).
    Skip,
}

/// Sends `messages` (in order within each destination), at most [`MAX_BATCH_ENTRIES`]
/// and [`MAX_BATCH_BYTES`] per call, retrying failed entries as `policy` says.
pub async fn publish_all(
    publisher: &dyn Publisher,
    clock: &dyn Clock,
    messages: &[&OutgoingMessage],
    policy: RetryPolicy,
) -> PublishReport {
    publish_all_with(publisher, clock, messages, policy, OnRefused::Block).await
}

/// [`publish_all`], a message refused for good holding back the later messages of its
/// group or not, as `on_refused` says.
#[tracing::instrument(name = "publish", skip_all, fields(messages = messages.len()))]
pub async fn publish_all_with(
    publisher: &dyn Publisher,
    clock: &dyn Clock,
    messages: &[&OutgoingMessage],
    policy: RetryPolicy,
    on_refused: OnRefused,
) -> PublishReport {
    let mut by_destination: BTreeMap<&DestinationName, Vec<&OutgoingMessage>> = BTreeMap::new();
    for message in messages {
        by_destination.entry(&message.destination).or_default().push(message);
    }
    let mut report = PublishReport::default();
    for (destination, messages) in by_destination {
        let sizes: Vec<usize> = messages
            .iter()
            .map(|message| publisher.entry_bytes(destination, message))
            .collect();
        let in_order = publisher.keeps_order(destination);
        // On a destination that keeps each group's order, a group whose message failed
        // sends nothing more in this pass: its later messages wait for the next.
        let mut failed_groups: BTreeSet<String> = BTreeSet::new();
        for batch in batches(&messages, &sizes, in_order) {
            let (blocked, batch): (Vec<&OutgoingMessage>, Vec<&OutgoingMessage>) = batch
                .into_iter()
                .partition(|message| in_order && failed_groups.contains(&message.fifo_group()));
            for message in blocked {
                report.failed.insert(
                    message.id.clone(),
                    PublishFailure::Exhausted {
                        last_error: "an earlier message of its group was not published".into(),
                    },
                );
            }
            if batch.is_empty() {
                continue;
            }
            let groups: Vec<(MessageId, String)> = batch
                .iter()
                .filter(|_| in_order)
                .map(|message| (message.id.clone(), message.fifo_group()))
                .collect();
            publish_batch(publisher, clock, destination, batch, policy, &mut report).await;
            for (id, group) in groups {
                let holds_back = match report.failed.get(&id) {
                    Some(PublishFailure::Refused { .. }) => on_refused == OnRefused::Block,
                    Some(_) => true,
                    None => false,
                };
                if holds_back {
                    failed_groups.insert(group);
                }
            }
        }
    }
    report
}

/// Cuts `messages` (whose sizes are `sizes`) into consecutive batches within the count
/// and size limits. A message larger than the size limit goes alone and the destination
/// judges it.
fn batches<'a>(messages: &[&'a OutgoingMessage], sizes: &[usize], in_order: bool) -> Vec<Vec<&'a OutgoingMessage>> {
    let mut batches: Vec<Vec<&OutgoingMessage>> = Vec::new();
    let mut bytes = 0;
    for (message, &size) in messages.iter().zip(sizes) {
        // Where the destination keeps each group's order, one message of a group per
        // call: a call's entries fail one by one, and a later one accepted before an
        // earlier one retried would overtake it.
        let fits = batches.last().is_some_and(|batch| {
            batch.len() < MAX_BATCH_ENTRIES
                && bytes + size <= MAX_BATCH_BYTES
                && !(in_order && batch.iter().any(|other| other.fifo_group() == message.fifo_group()))
        });
        if !fits {
            batches.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        batches.last_mut().expect("a batch was just pushed").push(message);
    }
    batches
}

async fn publish_batch(
    publisher: &dyn Publisher,
    clock: &dyn Clock,
    destination: &DestinationName,
    batch: Vec<&OutgoingMessage>,
    policy: RetryPolicy,
    report: &mut PublishReport,
) {
    let mut remaining: Vec<OutgoingMessage> = batch.into_iter().cloned().collect();
    let mut last_error = String::new();
    for attempt in 1..=policy.attempts.max(1) {
        if attempt > 1 {
            clock.sleep(policy.delay(attempt - 1)).await;
        }
        report.calls += 1;
        match publisher.send_batch(destination, &remaining).await {
            Ok(failures) => {
                // One line per message that went out, at info: its id and destination.
                for message in &remaining {
                    if !failures.iter().any(|failure| failure.id == message.id) {
                        tracing::info!(message_id = %message.id, %destination, "published");
                    }
                }
                let mut retry = Vec::new();
                for failure in failures {
                    if failure.sender_fault {
                        tracing::error!(message_id = %failure.id, code = %failure.code, "destination refused a message");
                        report
                            .failed
                            .insert(failure.id.clone(), PublishFailure::Refused { code: failure.code });
                    } else {
                        last_error = failure.code;
                        retry.push(failure.id);
                    }
                }
                remaining.retain(|message| retry.contains(&message.id));
            }
            Err(error) => {
                tracing::warn!(%destination, error = %error, attempt, "publishing a batch failed");
                if matches!(error, crate::ports::PublishError::UnknownDestination { .. }) {
                    for message in remaining.drain(..) {
                        report.failed.insert(
                            message.id,
                            PublishFailure::Refused {
                                code: "UnknownDestination".into(),
                            },
                        );
                    }
                }
                last_error = error.to_string();
            }
        }
        if remaining.is_empty() {
            return;
        }
    }
    for message in remaining {
        report.failed.insert(
            message.id,
            PublishFailure::Exhausted {
                last_error: last_error.clone(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
    use crate::time::Timestamp;

    fn message(position: u32, bytes: usize) -> OutgoingMessage {
        let txn = TxnId::from_parts(Timestamp::from_millis(1), [0; 10]);
        let body = Message {
            destination: "events".parse().unwrap(),
            body: "x".repeat(bytes),
            attributes: Default::default(),
            group_id: None,
            event: None,
        };
        OutgoingMessage::new(txn, position, body)
    }

    fn sizes_of(messages: &[&OutgoingMessage]) -> Vec<usize> {
        messages.iter().map(|message| message.payload_bytes()).collect()
    }

    #[test]
    fn batches_respect_count_and_size_and_keep_order() {
        let small: Vec<_> = (0..23).map(|i| message(i, 10)).collect();
        let refs: Vec<_> = small.iter().collect();
        let counts: Vec<_> = batches(&refs, &sizes_of(&refs), false).iter().map(Vec::len).collect();
        assert_eq!(counts, [10, 10, 3]);

        let big: Vec<_> = (0..5).map(|i| message(i, 100 * 1024)).collect();
        let refs: Vec<_> = big.iter().collect();
        let cut = batches(&refs, &sizes_of(&refs), false);
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        let order: Vec<_> = cut.iter().flatten().map(|m| m.id.clone()).collect();
        assert_eq!(order, big.iter().map(|m| m.id.clone()).collect::<Vec<_>>());
    }

    #[test]
    fn retry_delays_grow_and_stay_capped() {
        let policy = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
        };
        for _ in 0..100 {
            assert!(policy.delay(1) <= Duration::from_millis(100));
            assert!(policy.delay(1) >= Duration::from_millis(50));
            assert!(policy.delay(10) <= Duration::from_millis(300));
        }
    }

    /// A publisher that accepts everything and counts each entry as `entry` bytes, as a
    /// bus counts its events.
    struct Sized {
        entry: usize,
        batches: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait::async_trait]
    impl Publisher for Sized {
        async fn send_batch(
            &self,
            _destination: &DestinationName,
            messages: &[OutgoingMessage],
        ) -> Result<Vec<crate::ports::EntryFailure>, crate::ports::PublishError> {
            self.batches.lock().unwrap().push(messages.len());
            Ok(Vec::new())
        }

        fn entry_bytes(&self, _destination: &DestinationName, _message: &OutgoingMessage) -> usize {
            self.entry
        }
    }

    #[tokio::test]
    async fn batches_are_cut_by_the_size_the_publisher_counts() {
        let small: Vec<_> = (0..5).map(|i| message(i, 10)).collect();
        let refs: Vec<_> = small.iter().collect();
        let publisher = Sized {
            entry: 100 * 1024,
            batches: Default::default(),
        };
        let clock = crate::embedded::ManualClock::new(Timestamp::from_millis(0));
        let report = publish_all(&publisher, &clock, &refs, RetryPolicy::default()).await;
        assert!(report.failed.is_empty());
        assert_eq!(*publisher.batches.lock().unwrap(), [2, 2, 1]);
    }

    /// Refuses the message at position 1 as the sender's fault, accepts the rest.
    struct RefusesOne;

    #[async_trait::async_trait]
    impl Publisher for RefusesOne {
        async fn send_batch(
            &self,
            _destination: &DestinationName,
            messages: &[OutgoingMessage],
        ) -> Result<Vec<crate::ports::EntryFailure>, crate::ports::PublishError> {
            Ok(messages
                .iter()
                .filter(|message| message.id.as_str().ends_with(":1"))
                .map(|message| crate::ports::EntryFailure {
                    id: message.id.clone(),
                    code: "InvalidParameterValue".into(),
                    sender_fault: true,
                })
                .collect())
        }

        fn entry_bytes(&self, _destination: &DestinationName, _message: &OutgoingMessage) -> usize {
            10
        }
    }

    /// Each message that went out is one line at info level, naming its id and its
    /// destination; one the destination refused is not among them.
    #[tokio::test]
    async fn each_published_message_is_one_info_line_with_its_id_and_destination() {
        let logged = crate::test_log::Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_env_filter("info")
            .finish();
        crate::test_log::keep_callsites_interested();
        let _guard = tracing::subscriber::set_default(subscriber);
        let messages: Vec<_> = (0..3).map(|i| message(i, 10)).collect();
        let refs: Vec<_> = messages.iter().collect();
        let clock = crate::embedded::ManualClock::new(Timestamp::from_millis(0));
        let report = publish_all(&RefusesOne, &clock, &refs, RetryPolicy::default()).await;
        assert_eq!(report.failed.len(), 1);
        let text = logged.text();
        let published: Vec<&str> = text
            .lines()
            .filter(|line| line.contains(" INFO ") && line.contains("published"))
            .collect();
        assert_eq!(published.len(), 2, "{text}");
        for (line, message) in published.iter().zip([&messages[0], &messages[2]]) {
            assert!(line.contains(&format!("message_id={}", message.id)), "{line}");
            assert!(line.contains("destination=events"), "{line}");
        }
    }
}
