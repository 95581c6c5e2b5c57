//! The commit: one `TransactWriteItems`, its actions, and a cancellation explained item
//! by item.
//!
//! - `deleted_marks`: what the items it deletes keep, read before it; `actions`: its
//!   actions, within DynamoDB's budget; `cancellation`: its cancellation's reasons read.
//!   Here: its token, and the request and its errors.

mod actions;
mod cancellation;
mod deleted_marks;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;

use crate::ports::{CommitError, CommitRequest, NativeAction};
use crate::protocol::TxnId;
use actions::Actions;
use cancellation::Explained;
use deleted_marks::{Kept, Marks};

use super::DynamoStore;

impl DynamoStore {
    /// The commit's `ClientRequestToken`: the transaction (or the attempt's own id, where
    /// several attempts race for one record: a consumed message's). DynamoDB answers
    /// `IdempotentParameterMismatch` to one token sent with other parameters, and a
    /// delete's condition (and the records it puts) follows the marks read before it,
    /// which a fence or a settle may change between attempts: so the marks read are part
    /// of the token when there are any.
    /// Nothing relies on the token to commit once: the outbox record's condition does.
    fn client_token(request: &CommitRequest, marks: &Marks) -> String {
        use sha2::{Digest, Sha256};
        let base = request.outbox.attempt.unwrap_or(request.txn_id).to_string();
        let marked: Vec<String> = marks
            .iter()
            .filter(|(_, kept)| **kept != Kept::default())
            .map(|(key, kept)| {
                let fence = kept.fence.map(|mark| mark.to_string()).unwrap_or_default();
                let sent: Vec<String> = kept.sent.keys().map(TxnId::to_string).collect();
                format!("{key}={fence}+{}", sent.join(","))
            })
            .collect();
        if marked.is_empty() {
            return base;
        }
        let digest = Sha256::new()
            .chain_update(base.as_bytes())
            .chain_update(marked.join("\0").as_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
    }

    pub(super) async fn transact(&self, request: &CommitRequest, native: &[NativeAction]) -> Result<(), CommitError> {
        let marks = self.marks_of_deleted(request).await?;
        let Actions { items, roles } = self.actions(request, native, &marks)?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // The attempt's own token where several attempts race for one record (a
            // consumed message's): a rival's commit is then a cancellation naming the
            // winner's record, not a repeat of it.
            .client_request_token(Self::client_token(request, &marks))
            // One request per call: the SDK would retry a timed-out request and return
            // only the last request's error, hiding one that may still apply (docs/PROTOCOL.md
            // section 3). The request path retries instead, and counts every request.
            .customize()
            .config_override(aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled()))
            .send()
            .await;
        let error = match result {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        match &error {
            SdkError::ServiceError(service) => match service.err() {
                TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                    let reasons = cancelled.cancellation_reasons().to_vec();
                    match Self::explain(request, &roles, &reasons, Box::new(error)) {
                        Explained::Decided(result) => result,
                        Explained::ReadRecord { otherwise } => self.blocked_by(&request.outbox, otherwise).await,
                    }
                }
                TransactWriteItemsError::ProvisionedThroughputExceededException(_)
                | TransactWriteItemsError::RequestLimitExceeded(_)
                | TransactWriteItemsError::ThrottlingException(_) => Err(CommitError::Contention(Box::new(error))),
                // An earlier attempt under this token is still running, or one with other
                // parameters ran: either may have committed. Trying again settles it.
                TransactWriteItemsError::TransactionInProgressException(_)
                | TransactWriteItemsError::IdempotentParameterMismatchException(_) => {
                    Err(CommitError::Ambiguous(Box::new(error)))
                }
                TransactWriteItemsError::ResourceNotFoundException(_) => Err(CommitError::Unavailable(Box::new(error))),
                // Refused before anything ran: the function may not write there.
                other
                    if matches!(
                        other.code(),
                        Some("AccessDeniedException" | "UnrecognizedClientException")
                    ) =>
                {
                    Err(CommitError::Unavailable(Box::new(error)))
                }
                // A request DynamoDB refused before doing anything: a malformed
                // expression, a key that does not match the table's schema, two actions
                // on one item. Its message is for the developer who wrote the action.
                other if other.code() == Some("ValidationException") => Err(CommitError::Invalid {
                    reason: other.message().unwrap_or("DynamoDB refused the request").to_owned(),
                }),
                // An internal error may or may not have applied the commit.
                _ => Err(CommitError::Ambiguous(Box::new(error))),
            },
            // Never sent.
            SdkError::ConstructionFailure(_) => Err(CommitError::Invalid {
                reason: "the request could not be built".into(),
            }),
            // Sent, or maybe sent: a timeout, a lost connection, an unreadable reply.
            _ => Err(CommitError::Ambiguous(Box::new(error))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::{BusinessWrite, ItemKey};
    use crate::protocol::OutboxRecord;
    use crate::time::Timestamp;

    /// A delete's condition follows the marks read before it: attempts that read different marks
    /// send different tokens (one token with other parameters is refused by DynamoDB);
    /// without a mark the token is the transaction's id, as before.
    #[test]
    fn the_token_follows_the_marks_of_deleted_items() {
        let txn_id = TxnId::new_v7();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let key: ItemKey = "ORDER#1".parse().unwrap();
        let request = CommitRequest {
            txn_id,
            writes: vec![BusinessWrite::Delete {
                key: key.clone(),
                version: 1,
            }],
            outbox: OutboxRecord::committed(txn_id, vec![], now, now),
            idempotency: None,
        };
        let token = |fence: Option<TxnId>, sent: &[TxnId]| {
            let sent = sent.iter().map(|txn_id| (*txn_id, now)).collect();
            DynamoStore::client_token(&request, &Marks::from([(key.clone(), Kept { fence, sent })]))
        };
        assert_eq!(token(None, &[]), txn_id.to_string());
        let (first, second) = (token(Some(TxnId::new_v7()), &[]), token(Some(TxnId::new_v7()), &[]));
        assert_ne!(first, second);
        // The sent marks read decide the records the commit puts.
        let (one, other) = (token(None, &[TxnId::new_v7()]), token(None, &[TxnId::new_v7()]));
        assert_ne!(one, other);
        assert_ne!(one, txn_id.to_string());
        assert_ne!(first, txn_id.to_string());
        assert!(
            first.len() <= 36,
            "DynamoDB takes tokens of at most 36 characters: {first}"
        );
    }
}
