//! The in-order consumer's own outbox in the simulation: two placed messages of one
//! entity (`ORDER#a`'s seq 1 and 2) alone on the queue, a handler that emits one message
//! to `out` for each it applies, and the checks of C2 to C5 beside O3 (C1 and O3 are the
//! in-order world's own check: each applied once, in chain order, with its effect).
//!
//! C5 is checked at each acknowledgement: a delivery acknowledged as applied (processed,
//! resumed, adopted, a duplicate) finds the commit that applied its `seq` and every
//! message of it gone out; one acknowledged as kept finds its kept item in the store, or
//! its `seq` applied by then (a drain that took it from there) with its messages out. C2
//! to C4 after the queue is empty: every message of every commit went out under its id
//! with its body, nothing went out that no commit holds or before its commit, each
//! commit's record is dispatched with its expiry the retention from a time no earlier
//! than its messages went out, and no kept item is left behind.

use futures::FutureExt;
use outbox::consumer::in_order::{kept_key, position_key};
use outbox::consumer::ConsumeOutcome;
use outbox::embedded::{EmbeddedBackend, SendRequest, StoreEvent};
use outbox::ports::{BusinessWrite, Store};
use outbox::protocol::{DestinationName, OutboxState, OutgoingMessage, Position, MESSAGE_ID_ATTRIBUTE};
use outbox::time::Timestamp;

use super::gate::{Fault, Op};

/// The destination the handler emits to.
pub(super) const OUT: &str = "out";

/// [`OUT`], named.
pub(super) fn out() -> DestinationName {
    OUT.parse().expect("valid")
}

/// One crash anywhere: before or after any operation of a consumer (its reads, including
/// a kept message's; its commit; its mark, keep and removal of a kept message; its
/// publish; its reminder or requeue). Nothing else fails.
pub fn pair_faults(op: Op) -> Vec<Fault> {
    match op {
        Op::Read => vec![Fault::CrashBefore],
        Op::Commit | Op::Mark | Op::Publish | Op::ControlSend => vec![Fault::CrashBefore, Fault::CrashAfter],
        _ => vec![],
    }
}

/// The pair's queue: `ORDER#a`'s seq 1 and seq 2 of `produced`, in that order (the
/// chooser delivers them in any).
pub(super) fn pair(produced: &[SendRequest]) -> Vec<SendRequest> {
    produced
        .iter()
        .filter(|request| {
            Position::from_attributes(&request.attributes)
                .ok()
                .flatten()
                .is_some_and(|position| position.entity.as_str() == "ORDER#a" && position.seq <= 2)
        })
        .cloned()
        .collect()
}

/// The commits of the consumer in the history that moved `position`'s chain, each with
/// the `seq` it moved to, its messages and when it applied.
fn commits(
    backend: &EmbeddedBackend,
    consumer: &str,
    position: &Position,
) -> Vec<(u64, Vec<OutgoingMessage>, Timestamp)> {
    let key = position_key(consumer, position);
    backend
        .store
        .history()
        .into_iter()
        .filter_map(|event| match event {
            StoreEvent::Committed { request, at, .. } => request.writes.iter().find_map(|write| match write {
                BusinessWrite::Put { key: put, data, .. } if *put == key => Some((
                    data["applied"].as_u64().unwrap_or(0),
                    request.outbox.messages.clone(),
                    at,
                )),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// Whether every message of `messages` went out on `out`, under its id, with its body.
fn all_out(backend: &EmbeddedBackend, messages: &[OutgoingMessage]) -> Result<(), String> {
    let sent = backend.publisher.queue(&out()).expect("out").sent();
    for message in messages {
        let id = message.id.to_string();
        let found = sent
            .iter()
            .find(|send| send.request.attributes.get(MESSAGE_ID_ATTRIBUTE) == Some(&id));
        match found {
            None => return Err(format!("message {id} never went out")),
            Some(send) if send.request.body != message.body => {
                return Err(format!(
                    "message {id} went out as {}, but its commit holds {}",
                    send.request.body, message.body
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// C5 at the acknowledgement of a delivery of `position` that ended `outcome`.
pub(super) fn check_ack(
    backend: &EmbeddedBackend,
    consumer: &str,
    position: &Position,
    outcome: &ConsumeOutcome,
) -> Result<(), String> {
    let applied = commits(backend, consumer, position)
        .into_iter()
        .find(|(seq, _, _)| *seq == position.seq);
    let violated = |detail: String| {
        Err(format!(
            "C5 truthful acknowledgement: {} seq {} acknowledged ({}): {detail}",
            position.entity,
            position.seq,
            outcome.as_str()
        ))
    };
    match outcome {
        ConsumeOutcome::Kept { .. } => {
            let key = kept_key(consumer, position, position.seq);
            let kept = Store::get_kept(backend.store.as_ref(), &key)
                .now_or_never()
                .expect("the embedded store answers at once")
                .map_err(|error| error.to_string())?;
            match (kept, applied) {
                (Some(_), _) => Ok(()),
                (None, Some((_, messages, _))) => match all_out(backend, &messages) {
                    Ok(()) => Ok(()),
                    Err(detail) => violated(format!("applied by a drain, but {detail}")),
                },
                (None, None) => violated(format!("neither kept ({key} is absent) nor applied")),
            }
        }
        // A copy went back to the queue: the message is not acknowledged yet.
        ConsumeOutcome::Waiting { .. } => Ok(()),
        _ => match applied {
            None => violated("no commit applied it".into()),
            Some((_, messages, _)) => match all_out(backend, &messages) {
                Ok(()) => Ok(()),
                Err(detail) => violated(detail),
            },
        },
    }
}

/// C2 to C4 and the kept items after the queue is empty, over the chain of `position`
/// up to `length`; returns how many messages went out on `out` (copies included).
pub(super) fn check_effects(
    backend: &EmbeddedBackend,
    consumer: &str,
    position: &Position,
    length: u64,
    retention: std::time::Duration,
) -> Result<usize, String> {
    let commits = commits(backend, consumer, position);
    // C2: every commit's messages went out under their ids, with their bodies.
    for (seq, messages, _) in &commits {
        if messages.is_empty() {
            return Err(format!(
                "C2 winner's messages: the commit of seq {seq} holds no message"
            ));
        }
        all_out(backend, messages).map_err(|detail| format!("C2 winner's messages: seq {seq}: {detail}"))?;
    }
    // C3: nothing went out that no commit holds, or before its commit.
    let sent = backend.publisher.queue(&out()).expect("out").sent();
    for send in &sent {
        let id = send.request.attributes.get(MESSAGE_ID_ATTRIBUTE);
        let holder = commits.iter().find_map(|(_, messages, at)| {
            messages
                .iter()
                .find(|message| Some(&message.id.to_string()) == id && message.body == send.request.body)
                .map(|_| *at)
        });
        match holder {
            None => {
                return Err(format!(
                    "C3 nothing before the commit: {id:?} went out as {}, which no commit holds (a losing run's)",
                    send.request.body
                ))
            }
            Some(at) if send.sent_at < at => {
                return Err(format!(
                    "C3 nothing before the commit: {id:?} went out at {} before its commit at {at}",
                    send.sent_at
                ))
            }
            Some(_) => {}
        }
    }
    // C4: each commit's record dispatched, its expiry the retention from no earlier than
    // its messages went out.
    let records = backend.store.outbox_records();
    for (seq, messages, _) in &commits {
        let txn_id = messages[0].txn_id;
        let record = records
            .iter()
            .find(|record| record.txn_id == txn_id)
            .ok_or_else(|| format!("C4 deterministic retention: the record of seq {seq} is gone"))?;
        if record.state != OutboxState::Dispatched {
            return Err(format!(
                "C4 deterministic retention: the record of seq {seq} is {:?}, not dispatched",
                record.state
            ));
        }
        let expires_at = record.expires_at.ok_or("C4: a dispatched record without a TTL")?;
        let first = sent
            .iter()
            .filter(|send| {
                messages
                    .iter()
                    .any(|m| Some(&m.id.to_string()) == send.request.attributes.get(MESSAGE_ID_ATTRIBUTE))
            })
            .map(|send| send.sent_at)
            .min()
            .ok_or("C4: a dispatched record whose messages never went out")?;
        if expires_at < first.plus(retention) {
            return Err(format!(
                "C4 deterministic retention: the record of seq {seq} expires at {expires_at}, less than the retention after its messages went out at {first}"
            ));
        }
    }
    // No kept message left behind once its chain is applied.
    for seq in 1..=length {
        let key = kept_key(consumer, position, seq);
        let kept = Store::get_kept(backend.store.as_ref(), &key)
            .now_or_never()
            .expect("the embedded store answers at once")
            .map_err(|error| error.to_string())?;
        if kept.is_some() {
            return Err(format!("a kept message was left behind: {key}"));
        }
    }
    Ok(sent.len())
}
