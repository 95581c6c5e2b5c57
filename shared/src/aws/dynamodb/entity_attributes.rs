//! The attributes the entity mode keeps in a business item, below both the entity
//! mode's commits (`entity`) and its fence (`fence`): their names, the item's raw read,
//! and how each reads back: the outbox entries (`outbox`), the sent marks (`outbox_sent`)
//! and the fence mark (`outbox_fence`).

use std::collections::BTreeMap;

use super::{unavailable, DynamoStore};
use crate::aws::item::{Item, Reader};
use crate::ports::{ItemKey, StoreError};
use crate::protocol::{OutboxRecord, OutboxState, TxnId};
use crate::settings::TableLayout;
use crate::time::Timestamp;

/// The attribute that holds an item's outbox entries.
pub(crate) const OUTBOX_ATTRIBUTE: &str = "outbox";

/// The attribute that holds an item's sent marks: a map of transaction id to the time
/// (N, milliseconds) its proof may be forgotten. Every commit in entity form reserves
/// it (an empty map) so that settling an entry can set one mark in it.
pub(crate) const SENT_ATTRIBUTE: &str = "outbox_sent";

/// The attribute that holds an item's fence mark.
pub(crate) const FENCE_ATTRIBUTE: &str = "outbox_fence";

/// The mark of an item that no fence reached: below every transaction id, and as long as
/// one, so that a fence replacing it never grows the item (a near-full item can still be
/// fenced). Every write of the portable form reserves it where the item has no mark.
pub(crate) const NO_FENCE: &str = "00000000-0000-0000-0000-000000000000";

/// The entries of an item as stored, read back.
pub(crate) fn entries_of(layout: &TableLayout, item: &Item) -> Result<BTreeMap<TxnId, OutboxRecord>, StoreError> {
    let reader = Reader::new(layout, item);
    let Some(map) = item.get(OUTBOX_ATTRIBUTE) else {
        return Ok(BTreeMap::new());
    };
    let map = map.as_m().map_err(|_| reader.corrupt("outbox is not a map"))?;
    map.iter()
        .map(|(txn, value)| {
            let txn_id: TxnId = txn
                .parse()
                .map_err(|_| reader.corrupt(format!("bad entry key {txn}")))?;
            let json = value
                .as_s()
                .map_err(|_| reader.corrupt(format!("entry {txn} is not a string")))?;
            let record: OutboxRecord =
                serde_json::from_str(json).map_err(|error| reader.corrupt(format!("entry {txn}: {error}")))?;
            if record.txn_id != txn_id {
                return Err(reader.corrupt(format!("entry {txn} names {}", record.txn_id)));
            }
            // An entry is a commit: the protocol writes no other kind.
            if record.state == OutboxState::Tombstone {
                return Err(reader.corrupt(format!("entry {txn} is a tombstone")));
            }
            Ok((txn_id, record))
        })
        .collect::<Result<_, _>>()
        // A counter commit's entry is placed from what it kept beside it.
        .and_then(|mut entries| super::counter::place(layout, item, &mut entries).map(|()| entries))
}

/// The sent marks of an item as stored, read back.
pub(crate) fn sent_of(layout: &TableLayout, item: &Item) -> Result<BTreeMap<TxnId, Timestamp>, StoreError> {
    let reader = Reader::new(layout, item);
    let Some(map) = item.get(SENT_ATTRIBUTE) else {
        return Ok(BTreeMap::new());
    };
    let map = map.as_m().map_err(|_| reader.corrupt("outbox_sent is not a map"))?;
    map.iter()
        .map(|(txn, value)| {
            let txn_id: TxnId = txn
                .parse()
                .map_err(|_| reader.corrupt(format!("bad sent mark {txn}")))?;
            let millis: u64 = value
                .as_n()
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| reader.corrupt(format!("sent mark {txn} is not a number")))?;
            Ok((txn_id, Timestamp::from_millis(millis)))
        })
        .collect()
}

/// An item's fence mark, `None` where no fence reached it.
pub(crate) fn fence_of(layout: &TableLayout, item: &Item) -> Result<Option<TxnId>, StoreError> {
    match item.get(FENCE_ATTRIBUTE) {
        None => Ok(None),
        Some(value) => {
            let reader = Reader::new(layout, item);
            let text = value
                .as_s()
                .map_err(|_| reader.corrupt("outbox_fence is not a string"))?;
            if text == NO_FENCE {
                return Ok(None);
            }
            text.parse()
                .map(Some)
                .map_err(|_| reader.corrupt(format!("bad fence mark {text}")))
        }
    }
}

impl DynamoStore {
    /// Item `key` as stored (a vacant key's fence mark included), strongly consistent.
    pub(super) async fn read_raw(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.key(key.as_str())))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::dynamodb::chain::CHAIN_PREFIX;
    use crate::settings::{RESERVED_ATTRIBUTES, RESERVED_PREFIXES};

    /// The layout refuses every name the items keep: the names here and the layout's
    /// reserved names cannot drift apart.
    #[test]
    fn the_layout_reserves_what_items_keep() {
        for name in [OUTBOX_ATTRIBUTE, SENT_ATTRIBUTE, FENCE_ATTRIBUTE] {
            assert!(RESERVED_ATTRIBUTES.contains(&name), "{name}");
            assert!(TableLayout::dedicated("t").with_ttl_attribute(name).validate().is_err());
        }
        assert!(RESERVED_PREFIXES.contains(&CHAIN_PREFIX));
        assert!(RESERVED_PREFIXES.contains(&crate::aws::dynamodb::applied::APPLIED_PREFIX));
        let head = format!("{CHAIN_PREFIX}events");
        assert!(TableLayout::dedicated("t").with_partition_key(head).validate().is_err());
    }
}
