//! What the items a commit deletes keep of the protocol (a fence mark, sent marks), read
//! before the commit: a delete's condition follows them, and its commit moves the
//! sent marks to their transactions' records.

use crate::aws::dynamodb::entity_attributes::{fence_of, sent_of};
use crate::aws::dynamodb::DynamoStore;
use crate::ports::{BusinessWrite, CommitError, CommitRequest, ItemKey};
use crate::protocol::TxnId;
use crate::time::Timestamp;

/// What an item a commit deletes holds of the protocol, as read before the commit: a
/// fence mark, which the deleted item keeps in a vacant item, and sent marks, which the
/// commit moves to their transactions' records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Kept {
    /// Its fence mark (`None`: no mark).
    pub(super) fence: Option<TxnId>,
    /// Its sent marks.
    pub(super) sent: std::collections::BTreeMap<TxnId, Timestamp>,
}

/// What each item a commit deletes keeps, read before the commit.
pub(super) type Marks = std::collections::BTreeMap<ItemKey, Kept>;

impl DynamoStore {
    /// The fence marks of the items `request` deletes, read before the commit (deletes are
    /// rare; the read costs nothing otherwise).
    pub(super) async fn marks_of_deleted(&self, request: &CommitRequest) -> Result<Marks, CommitError> {
        let deleted: Vec<&ItemKey> = request
            .writes
            .iter()
            .filter_map(|write| match write {
                BusinessWrite::Delete { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        let mut marks = Marks::new();
        for key in deleted {
            // Nothing was sent yet: a failed read writes nothing.
            let item = self
                .read_raw(key)
                .await
                .map_err(|error| CommitError::Unavailable(Box::new(error)))?;
            let kept = match &item {
                Some(item) => Kept {
                    fence: fence_of(&self.layout, item).map_err(|error| CommitError::Unavailable(Box::new(error)))?,
                    sent: sent_of(&self.layout, item).map_err(|error| CommitError::Unavailable(Box::new(error)))?,
                },
                None => Kept::default(),
            };
            marks.insert(key.clone(), kept);
        }
        Ok(marks)
    }
}
