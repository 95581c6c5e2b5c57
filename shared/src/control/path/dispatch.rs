//! The control path's publishing of a batch's decisions: every message in one pass, in
//! commit order, each transaction's dispatch a span of its own trace; then the records
//! marked dispatched and the entries settled, a result per transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::join_all;
use tracing::Instrument;

use super::decide::Decision;
use super::ControlPath;
use crate::control::outcome::{ControlError, ControlOutcome};
use crate::earlier::Earlier;
use crate::ports::{ItemKey, StoreError};
use crate::protocol::{commit_order, OutboxRecord, TraceContext, TxnId};
use crate::publish::{publish_all_with, OnRefused, PublishFailure};

/// The trace context a transaction's messages were emitted in, if traced.
fn stored_trace(record: &OutboxRecord) -> Option<&TraceContext> {
    record.messages.iter().find_map(|message| message.trace.as_ref())
}

/// The span of one transaction's dispatch by the worker: in the transaction's trace, a
/// child of the span that emitted its messages.
fn dispatch_span(record: &OutboxRecord) -> tracing::Span {
    let span = tracing::info_span!(
        "dispatch",
        txn_id = %record.txn_id,
        messages = record.messages.len(),
        committed_at = record.created_at.as_millis()
    );
    if let Some(trace) = stored_trace(record) {
        crate::telemetry::continue_from(&span, trace);
    }
    span
}

/// Sorts a batch's records in commit order: by commit time, and the records of one entity
/// by its versions (their place in its history), whatever the clocks of the hosts that
/// committed them, so that its messages go out in the order its changes happened.
fn in_commit_order(records: &mut [OutboxRecord]) {
    records.sort_by_key(|record| (record.created_at, record.txn_id));
    let mut by_entity: BTreeMap<ItemKey, Vec<usize>> = BTreeMap::new();
    for (index, record) in records.iter().enumerate() {
        if let Some(position) = record.messages.iter().find_map(|message| message.position.as_ref()) {
            by_entity.entry(position.entity.clone()).or_default().push(index);
        }
    }
    for slots in by_entity.values().filter(|slots| slots.len() > 1) {
        let mut ordered: Vec<OutboxRecord> = slots.iter().map(|index| records[*index].clone()).collect();
        ordered.sort_by_key(commit_order);
        for (index, record) in slots.iter().zip(ordered) {
            records[*index] = record;
        }
    }
}

impl ControlPath {
    /// An entry whose messages went out leaves its entity, which keeps the transaction's
    /// sent mark ([`Store::settle_entry`](crate::ports::Store::settle_entry)). Beside a
    /// tombstone record the record is put dispatched over it instead, then the entry
    /// removed: a record that says tombstone must not outlive the proof of the commit.
    async fn finish_entry(
        &self,
        key: &ItemKey,
        entry: &OutboxRecord,
        beside_tombstone: bool,
    ) -> Result<ControlOutcome, ControlError> {
        let now = self.ports.clock.now();
        let store = &self.ports.store;
        let expires_at = now.plus(self.timing.retention);
        let settled = if beside_tombstone {
            match store.put_dispatched(entry.txn_id, entry.created_at, expires_at).await {
                Ok(()) => store.remove_entry(key, entry.txn_id).await,
                Err(error) => Err(error),
            }
        } else {
            store
                .settle_entry(key, entry.txn_id, entry.created_at, expires_at, self.sent_marks)
                .await
        };
        settled.map_err(|error| ControlError::Mark(Arc::new(error)))?;
        let (messages, committed_at) = (entry.messages.len(), entry.created_at);
        Ok(if beside_tombstone {
            ControlOutcome::DispatchedBesideTombstone { messages, committed_at }
        } else {
            ControlOutcome::Dispatched { messages, committed_at }
        })
    }

    /// Publishes every pending record's messages in one pass, then marks the records
    /// whose messages all went out.
    pub(super) async fn dispatch(
        &self,
        decisions: BTreeMap<TxnId, Decision>,
    ) -> BTreeMap<TxnId, Result<ControlOutcome, ControlError>> {
        let mut outcomes = BTreeMap::new();
        let mut pending = Vec::new();
        let mut entities: BTreeMap<TxnId, (ItemKey, bool)> = BTreeMap::new();
        // Earlier transactions of an entity, published first for a transaction of the
        // batch: their own control messages report on them, not this batch.
        let mut earlier_only: BTreeMap<TxnId, OutboxRecord> = BTreeMap::new();
        let mut take_earlier = |earlier: Vec<Earlier>, entities: &mut BTreeMap<TxnId, (ItemKey, bool)>| {
            for earlier in earlier {
                match earlier {
                    Earlier::Entry(key, entry) => {
                        entities.entry(entry.txn_id).or_insert_with(|| (key, false));
                        earlier_only.insert(entry.txn_id, entry);
                    }
                    Earlier::Record(record) => {
                        earlier_only.insert(record.txn_id, record);
                    }
                }
            }
        };
        for (txn_id, decision) in decisions {
            match decision {
                Decision::Done(outcome) => {
                    outcomes.insert(txn_id, outcome);
                }
                Decision::Publish(record, earlier) => {
                    take_earlier(earlier, &mut entities);
                    pending.push(record);
                }
                Decision::PublishEntry(key, entry, beside_tombstone, earlier) => {
                    take_earlier(earlier, &mut entities);
                    entities.insert(txn_id, (key, beside_tombstone));
                    pending.push(entry);
                }
            }
        }
        let extra: Vec<TxnId> = earlier_only
            .keys()
            .filter(|txn_id| !pending.iter().any(|record| record.txn_id == **txn_id))
            .copied()
            .collect();
        pending.extend(extra.iter().filter_map(|txn_id| earlier_only.remove(txn_id)));
        let own_decisions: BTreeMap<TxnId, Result<ControlOutcome, ControlError>> = extra
            .iter()
            .filter_map(|txn_id| outcomes.get(txn_id).map(|outcome| (*txn_id, outcome.clone())))
            .collect();
        if pending.is_empty() {
            return outcomes;
        }
        in_commit_order(&mut pending);
        // Each transaction's dispatch is a span of its own trace, a child of the span that
        // emitted its messages (stored with them), however late and wherever it runs. The
        // batch's publish is a child of the one dispatch, or, where a batch mixes
        // transactions, a span of its own linking each dispatch.
        let spans: BTreeMap<TxnId, tracing::Span> = pending
            .iter()
            .map(|record| (record.txn_id, dispatch_span(record)))
            .collect();
        let messages: Vec<_> = pending.iter().flat_map(|record| &record.messages).collect();
        let publish_span = match &pending[..] {
            [only] => spans[&only.txn_id].clone(),
            _ => {
                let span = tracing::info_span!("publish_batch", transactions = pending.len());
                for dispatch in spans.values().filter_map(crate::telemetry::of) {
                    crate::telemetry::link(&span, &dispatch);
                }
                span
            }
        };
        let on_refused = if self.release_refused {
            OnRefused::Skip
        } else {
            OnRefused::Block
        };
        let report = publish_all_with(
            self.ports.publisher.as_ref(),
            self.ports.clock.as_ref(),
            &messages,
            self.retry,
            on_refused,
        )
        .instrument(publish_span)
        .await;

        let mut to_mark = Vec::new();
        let mut entries_out = Vec::new();
        for record in &pending {
            let failures: Vec<&PublishFailure> = record
                .messages
                .iter()
                .filter_map(|message| {
                    let failure = report.failed.get(&message.id)?;
                    if let (true, PublishFailure::Refused { code }) = (self.release_refused, failure) {
                        tracing::error!(
                            txn_id = %record.txn_id,
                            message_id = %message.id,
                            destination = %message.destination,
                            code = %code,
                            "released by an operator: a message the destination refuses for good was skipped"
                        );
                        return None;
                    }
                    Some(failure)
                })
                .collect();
            if let Some(PublishFailure::Refused { code }) = failures.first() {
                tracing::error!(
                    txn_id = %record.txn_id,
                    code = %code,
                    "parked: a destination refuses a message of this transaction for good; it and every later \
                     transaction of its entity wait until an operator releases it (control-worker release)"
                );
            }
            match failures.first() {
                None if entities.contains_key(&record.txn_id) => entries_out.push(record),
                None => to_mark.push(record),
                Some(first) => {
                    outcomes.insert(
                        record.txn_id,
                        Err(ControlError::Publish {
                            failed: failures.len(),
                            total: record.messages.len(),
                            first: (*first).clone(),
                        }),
                    );
                }
            }
        }
        // Each entry's record and removal on its own, all at once.
        let finished = entries_out.into_iter().map(|entry| {
            let (key, beside_tombstone) = &entities[&entry.txn_id];
            let span = spans[&entry.txn_id].clone();
            async move { (entry.txn_id, self.finish_entry(key, entry, *beside_tombstone).await) }.instrument(span)
        });
        outcomes.extend(join_all(finished).await);
        if !to_mark.is_empty() {
            self.mark(to_mark, &mut outcomes).await;
        }
        for txn_id in &extra {
            if let Some(Err(error)) = outcomes.remove(txn_id) {
                tracing::warn!(earlier = %txn_id, error = %error, "an earlier transaction published first was not settled; its control message will");
            }
            if let Some(own) = own_decisions.get(txn_id) {
                outcomes.insert(*txn_id, own.clone());
            }
        }
        outcomes
    }

    /// Marks the records whose messages all went out dispatched, each with its outcome.
    async fn mark(
        &self,
        to_mark: Vec<&OutboxRecord>,
        outcomes: &mut BTreeMap<TxnId, Result<ControlOutcome, ControlError>>,
    ) {
        let records: Vec<OutboxRecord> = to_mark.iter().map(|record| (*record).clone()).collect();
        let expires_at = self.ports.clock.now().plus(self.timing.retention);
        let results = self.ports.store.mark_dispatched(&records, expires_at).await;
        // A store that answers fewer results than asked leaves the rest failed, never
        // silently acknowledged.
        let results = results.into_iter().map(Some).chain(std::iter::repeat_with(|| None));
        for (record, result) in to_mark.into_iter().zip(results) {
            let result = result.unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "the store gave no result for this record".into(),
                ))
            });
            let outcome = result
                .map(|()| ControlOutcome::Dispatched {
                    messages: record.messages.len(),
                    committed_at: record.created_at,
                })
                .map_err(|error| ControlError::Mark(Arc::new(error)));
            outcomes.insert(record.txn_id, outcome);
        }
    }
}
