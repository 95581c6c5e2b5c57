//! A batch of deliveries: the messages of one FIFO group one after the other, in order,
//! a failure failing the rest of its group; everything else concurrently. Each message
//! gets its own result, so one failure never fails its neighbours.

use std::collections::BTreeMap;

use futures_util::future::join_all;

use super::{ConsumeError, ConsumeOutcome, Consumer, Delivery};

/// The result for one delivery of a batch.
#[derive(Debug)]
pub struct ItemReport {
    /// The queue's id of the message.
    pub message_id: String,
    /// What happened.
    pub result: Result<ConsumeOutcome, ConsumeError>,
}

/// The results for a batch, one per delivery, in the batch's order.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// One per delivery.
    pub items: Vec<ItemReport>,
}

impl BatchReport {
    /// The queue ids of the messages that must come back (the partial batch response).
    pub fn failed_message_ids(&self) -> Vec<&str> {
        self.items
            .iter()
            .filter(|item| item.result.is_err())
            .map(|item| item.message_id.as_str())
            .collect()
    }
}

impl Consumer {
    /// Processes a batch: each FIFO group in order (after a failure, the rest of that
    /// group fails untried: SQS delivers a group in order only if its failures come back
    /// before what follows them), every group and every message of a standard queue
    /// concurrently.
    pub async fn consume_batch(&self, deliveries: &[Delivery]) -> BatchReport {
        self.consume_batch_with(deliveries, |_, _| {}).await
    }

    /// [`Consumer::consume_batch`], telling `on_done` each delivery's result (by its
    /// index in `deliveries`) as soon as it is known, so that a poller acknowledges each
    /// message when it is done rather than when the slowest of its batch is.
    pub async fn consume_batch_with(
        &self,
        deliveries: &[Delivery],
        on_done: impl Fn(usize, &Result<ConsumeOutcome, ConsumeError>),
    ) -> BatchReport {
        let on_done = &on_done;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut fifo: BTreeMap<&str, usize> = BTreeMap::new();
        for (index, delivery) in deliveries.iter().enumerate() {
            match &delivery.group_id {
                Some(group) => match fifo.get(group.as_str()) {
                    Some(&at) => groups[at].push(index),
                    None => {
                        fifo.insert(group, groups.len());
                        groups.push(vec![index]);
                    }
                },
                None => groups.push(vec![index]),
            }
        }
        let runs = groups.iter().map(|group| async move {
            let mut results = Vec::with_capacity(group.len());
            let mut failed = false;
            for &index in group {
                let result = if failed {
                    Err(ConsumeError::EarlierInGroupFailed)
                } else {
                    self.consume(&deliveries[index]).await
                };
                failed |= result.is_err();
                // Logged before it is acknowledged: a consumer killed mid-batch has
                // logged every message it acknowledged.
                log_outcome(&deliveries[index], &result);
                on_done(index, &result);
                results.push((index, result));
            }
            results
        });
        let mut results: Vec<Option<Result<ConsumeOutcome, ConsumeError>>> =
            std::iter::repeat_with(|| None).take(deliveries.len()).collect();
        for (index, result) in join_all(runs).await.into_iter().flatten() {
            results[index] = Some(result);
        }
        let items = deliveries
            .iter()
            .zip(results)
            .map(|(delivery, result)| {
                let result = result.expect("every delivery is in one group");
                ItemReport {
                    message_id: delivery.message_id.clone(),
                    result,
                }
            })
            .collect();
        BatchReport { items }
    }
}

/// The line each message of a batch gets once it is done: its outcome or its error, and
/// its place where the producer gave one (which entity's message, and which).
fn log_outcome(delivery: &Delivery, result: &Result<ConsumeOutcome, ConsumeError>) {
    let position = crate::protocol::Position::from_attributes(&delivery.attributes)
        .ok()
        .flatten();
    let entity = position.as_ref().map(|position| position.entity.to_string());
    let chain = position.as_ref().map(|position| position.chain.to_string());
    let seq = position.as_ref().map(|position| position.seq);
    match result {
        Ok(outcome) => tracing::info!(
            queue_message_id = %delivery.message_id,
            outcome = outcome.as_str(),
            entity,
            chain,
            seq,
            "message consumed"
        ),
        Err(error) => tracing::warn!(
            queue_message_id = %delivery.message_id,
            entity,
            chain,
            seq,
            error = %aws_smithy_types::error::display::DisplayErrorContext(error),
            "message failed"
        ),
    }
}
