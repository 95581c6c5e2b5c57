//! What a batch send to SQS, SNS or EventBridge answers, as the publisher port reports it:
//! the whole call failed, or some entries did (shared by the three senders).

use crate::ports::{EntryFailure, PublishError};
use crate::protocol::{DestinationName, OutgoingMessage};

/// The error of a whole batch call to `destination` that failed: no entry can be assumed
/// sent, nor assumed unsent.
pub(crate) fn unavailable<E>(destination: &DestinationName) -> impl FnOnce(E) -> PublishError + '_
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |error| PublishError::Unavailable {
        destination: destination.clone(),
        source: Box::new(error),
    }
}

/// The failed entries of a batch answer that names each failure by the entry id the
/// request gave it (the message's index in `messages`): `(id, sender's fault, code)`.
pub(crate) fn failed_by_index<'a>(
    messages: &[OutgoingMessage],
    failed: impl IntoIterator<Item = (&'a str, bool, &'a str)>,
) -> Vec<EntryFailure> {
    failed
        .into_iter()
        .filter_map(|(id, sender_fault, code)| {
            let message = id.parse::<usize>().ok().and_then(|index| messages.get(index))?;
            Some(EntryFailure {
                id: message.id.clone(),
                sender_fault,
                code: code.to_owned(),
            })
        })
        .collect()
}
