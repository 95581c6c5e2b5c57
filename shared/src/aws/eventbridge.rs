//! Sends to destination buses on EventBridge.

use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use aws_sdk_eventbridge::Client;

use super::send_outcome::unavailable;
use crate::event_detail::detail;
use crate::ports::{EntryFailure, PublishError};
use crate::protocol::{DestinationName, OutgoingMessage, TraceContext};

/// The per-entry error codes that AWS documents as not retryable: the same entry would
/// fail again. Every other code (`InternalFailure`, `ThrottlingException`, and any code
/// AWS adds later) is retried.
const NOT_RETRYABLE: [&str; 7] = [
    "AccessDeniedException",
    "InvalidAccountIdException",
    "InvalidArgument",
    "MalformedDetail",
    "RedactionFailure",
    "NotAuthorizedForSourceException",
    "NotAuthorizedForDetailTypeException",
];

/// The code of an entry that the answer did not account for.
const NO_RESULT: &str = "NoResultEntry";

/// Puts `messages` on the bus `bus` (a name or an ARN) in one `PutEvents`: each as an
/// event whose `Source` and `DetailType` are the message's, and whose `Detail` carries
/// its stable id and transaction id beside its body ([`crate::event_detail`]). Returns
/// the entries EventBridge failed.
pub(crate) async fn put_on_bus(
    client: &Client,
    destination: &DestinationName,
    bus: &str,
    messages: &[OutgoingMessage],
) -> Result<Vec<EntryFailure>, PublishError> {
    let entries = messages.iter().map(|message| bus_entry(message, bus)).collect();
    let output = client
        .put_events()
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(unavailable(destination))?;
    Ok(failures(
        messages,
        output
            .entries()
            .iter()
            .map(|entry| entry.error_code().filter(|code| !code.is_empty())),
        output.failed_entry_count(),
    ))
}

fn bus_entry(message: &OutgoingMessage, bus: &str) -> PutEventsRequestEntry {
    let event = message.event_type();
    PutEventsRequestEntry::builder()
        .event_bus_name(bus)
        .source(event.source)
        .detail_type(event.detail_type)
        .detail(detail(message))
        .set_trace_header(message.trace.as_ref().map(TraceContext::xray))
        .build()
}

/// The failed entries of an answer whose result entries, in request order, carry
/// `codes` (`None` for an accepted entry). An entry the answer has no result for counts
/// as failed and is retried; so are all the entries of an answer whose
/// `FailedEntryCount` exceeds the failures it lists.
fn failures<'a>(
    messages: &[OutgoingMessage],
    codes: impl Iterator<Item = Option<&'a str>>,
    failed_entry_count: i32,
) -> Vec<EntryFailure> {
    let mut codes: Vec<Option<&str>> = codes.collect();
    codes.resize(messages.len(), Some(NO_RESULT));
    let listed = codes.iter().filter(|code| code.is_some()).count();
    let unaccounted = usize::try_from(failed_entry_count).unwrap_or(0) > listed;
    messages
        .iter()
        .zip(codes)
        .filter_map(|(message, code)| {
            let code = code.or(unaccounted.then_some(NO_RESULT))?;
            Some(EntryFailure {
                id: message.id.clone(),
                sender_fault: NOT_RETRYABLE.contains(&code),
                code: code.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, TxnId};
    use crate::time::Timestamp;

    fn messages(count: u32) -> Vec<OutgoingMessage> {
        let txn = TxnId::from_parts(Timestamp::from_millis(9), [4; 10]);
        (0..count)
            .map(|position| {
                OutgoingMessage::new(
                    txn,
                    position,
                    Message::json("events".parse().unwrap(), &serde_json::json!({"n": position})).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_traced_event_goes_with_its_xray_trace_header() {
        let trace = TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        let traced = messages(1).remove(0).with_trace(Some(trace.clone()));
        let entry = bus_entry(&traced, "default");
        assert_eq!(entry.trace_header(), Some(trace.xray().as_str()));
        assert!(
            entry.detail().unwrap().contains(&trace.traceparent()),
            "and in detail.metadata"
        );
        assert_eq!(bus_entry(&messages(1).remove(0), "default").trace_header(), None);
    }

    #[test]
    fn each_failed_entry_is_named_and_only_the_documented_ones_are_final() {
        let sent = messages(4);
        let failed = failures(
            &sent,
            [
                None,
                Some("ThrottlingException"),
                Some("MalformedDetail"),
                Some("SomethingNew"),
            ]
            .into_iter(),
            3,
        );
        let seen: Vec<(&str, bool, &str)> = failed
            .iter()
            .map(|failure| (failure.id.as_str(), failure.sender_fault, failure.code.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (sent[1].id.as_str(), false, "ThrottlingException"),
                (sent[2].id.as_str(), true, "MalformedDetail"),
                (sent[3].id.as_str(), false, "SomethingNew"),
            ]
        );
    }

    #[test]
    fn entries_the_answer_does_not_account_for_are_retried() {
        let sent = messages(3);
        let short = failures(&sent, [None].into_iter(), 0);
        assert_eq!(
            short.iter().map(|failure| failure.id.clone()).collect::<Vec<_>>(),
            [sent[1].id.clone(), sent[2].id.clone()]
        );
        assert!(short.iter().all(|failure| !failure.sender_fault));
        let miscounted = failures(&sent, [None, None, None].into_iter(), 1);
        assert_eq!(
            miscounted.len(),
            3,
            "a failure count with no failed entry named: retry all"
        );
        assert!(failures(&sent, [None, None, None].into_iter(), 0).is_empty());
    }
}
