//! A handler that emits a message no destination takes fails its message with nothing
//! written, in both modes: no record, no change, nothing published.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::{copy, events, RETENTION};
use crate::consumer::{ConsumeError, Consumer, Handler, HandlerError, Incoming, Staging};
use crate::embedded::{EmbeddedBackend, ManualClock};
use crate::ports::{ExpectedVersion, ItemKey, Store};
use crate::protocol::{Message, Unsendable};
use crate::time::Timestamp;

/// Writes `SEEN#{order}` and emits a message whose body carries U+FFFF.
struct EmitsUnsendable {
    entity_mode: bool,
}

fn seen() -> ItemKey {
    "SEEN#o-1".parse().unwrap()
}

#[async_trait]
impl Handler for EmitsUnsendable {
    async fn handle(&self, _message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        staging.get(&seen()).await?;
        staging.put(seen(), json!({"seen": true}), ExpectedVersion::Absent);
        let mut message = Message::json(events(), &json!({}))?;
        message.body = "{\"name\":\"\u{FFFF}\"}".to_owned();
        staging.emit(message);
        Ok(())
    }

    fn entity(&self, _message: &Incoming) -> Result<Option<ItemKey>, HandlerError> {
        Ok(self.entity_mode.then(seen))
    }
}

#[tokio::test]
async fn a_handler_that_emits_an_unsendable_message_fails_its_message_with_nothing_written() {
    for entity_mode in [false, true] {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), [(events(), false)]);
        let consumer = Consumer::new(
            "unsendable".parse().unwrap(),
            backend.consumer_ports(clock.clone()),
            Arc::new(EmitsUnsendable { entity_mode }),
            RETENTION,
        );
        let failed = consumer.consume(&copy("q-1", "m-1", "o-1")).await;
        assert!(
            matches!(
                failed,
                Err(ConsumeError::Unsendable(Unsendable::Character { code: 0xFFFF, .. }))
            ),
            "entity mode {entity_mode}: {failed:?}"
        );
        let items = backend.store.get_items(&[seen()]).await.unwrap();
        assert_eq!(items, BTreeMap::new(), "entity mode {entity_mode}: nothing written");
        let sizes = backend.store.sizes();
        assert_eq!(
            (sizes.business_items, sizes.records),
            (0, 0),
            "entity mode {entity_mode}: no item, no record"
        );
        assert!(
            backend.publisher.queue(&events()).unwrap().is_empty(),
            "entity mode {entity_mode}: nothing published"
        );
    }
}
