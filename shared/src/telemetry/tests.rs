//! One trace through the hops, in process on the embedded backend, with the spans
//! collected as an OTLP exporter would send them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde_json::json;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

use crate::consumer::{Consumer, Delivery, Handler, HandlerError, Incoming, Staging};
use crate::control::ControlPath;
use crate::embedded::{EmbeddedBackend, EmbeddedInbox, ManualClock};
use crate::ports::{ControlInbox, ExpectedVersion, Inbox, ItemKey};
use crate::protocol::{DestinationName, Message, TraceContext, TxnId};
use crate::request::Outbox;
use crate::settings::{Timing, TransactionLimits};
use crate::time::Timestamp;

/// Keeps every span that ends.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Collected {
    fn named(&self, name: &str) -> Vec<SpanData> {
        let spans = self.0.lock().unwrap();
        spans.iter().filter(|span| span.name == name).cloned().collect()
    }
}

fn events() -> DestinationName {
    "events".parse().unwrap()
}

fn shipments() -> DestinationName {
    "shipments".parse().unwrap()
}

/// Emits one ShipmentRequested per message.
struct Shipping;

#[async_trait]
impl Handler for Shipping {
    async fn handle(&self, _message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
        staging.emit(Message::json(shipments(), &json!({"type": "ShipmentRequested"}))?);
        Ok(())
    }
}

/// The `outcome` attribute of a consumed message's span.
fn outcome(span: &SpanData) -> String {
    span.attributes
        .iter()
        .find(|attribute| attribute.key.as_str() == "outcome")
        .map(|attribute| attribute.value.to_string())
        .unwrap_or_default()
}

fn context_of(span: &SpanData) -> (TraceId, SpanId) {
    (span.span_context.trace_id(), span.span_context.span_id())
}

fn ids(context: &TraceContext) -> (TraceId, SpanId) {
    (
        TraceId::from_bytes(context.trace_id()),
        SpanId::from_bytes(context.span_id()),
    )
}

/// A request in entity mode and one in the transactional form, each continuing its
/// caller's trace, published by the control worker and consumed: every hop in the
/// request's trace, with the parents the issue asks for, what the consumer emits carrying
/// the consumer's span, and a redelivered copy's span saying it was a duplicate.
#[tokio::test]
async fn the_worker_and_the_consumer_continue_the_trace_the_request_stored() {
    let collected = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(collected.clone())
        .build();
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _guard = tracing::subscriber::set_default(subscriber);

    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = EmbeddedBackend::new(clock.clone(), [(events(), false), (shipments(), false)]);
    let outbox = Outbox::new(
        backend.request_ports(clock.clone()),
        Timing::default(),
        TransactionLimits::default(),
    );
    let control = ControlPath::new(backend.control_ports(clock.clone()), Timing::default());
    let order: ItemKey = "ORDER#1".parse().unwrap();

    let callers = [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ]
    .map(|parent| TraceContext::from_traceparent(parent).unwrap());
    let mut txns: Vec<TxnId> = Vec::new();
    for (index, caller) in callers.iter().enumerate() {
        let request = tracing::info_span!("request", index);
        super::continue_from(&request, caller);
        let committed = async {
            let mut txn = if index == 0 {
                outbox.begin().await.unwrap()
            } else {
                outbox.begin_entity(order.clone()).await.unwrap()
            };
            let expected = if index == 0 {
                ExpectedVersion::Absent
            } else {
                ExpectedVersion::Exactly(1)
            };
            txn.put(order.clone(), json!({"lines": index}), expected);
            txn.emit(Message::json(events(), &json!({"type": "OrderChanged", "index": index})).unwrap());
            txn.commit().await.unwrap()
        }
        .instrument(request)
        .await;
        txns.push(committed.txn_id);
    }

    // The control worker, minutes later, in no span of the request's.
    clock.advance(Timing::default().first_check_delay + Duration::from_secs(120));
    let lease = Duration::from_secs(30);
    let controls = ControlInbox::receive(backend.control_queue.as_ref(), 10, Duration::ZERO, lease)
        .await
        .unwrap();
    assert_eq!(controls.len(), 2);
    for report in control.handle_batch(&controls).await.items {
        report.result.unwrap();
    }

    // The consumer, on what the worker published, as the events queue delivers it.
    let consumer = Consumer::new(
        "shipping".parse().unwrap(),
        backend.consumer_ports(clock.clone()),
        Arc::new(Shipping),
        Duration::from_secs(3600),
    );
    let events_queue = EmbeddedInbox::new(backend.publisher.queue(&events()).unwrap().clone(), clock.clone());
    let published = events_queue.receive(10, Duration::ZERO, lease).await.unwrap();
    assert_eq!(published.len(), 2);
    for delivery in published {
        consumer.consume(&delivery).await.unwrap();
        // A copy of it, redelivered: acknowledged, and seen as a duplicate on its span.
        let copy = Delivery {
            message_id: format!("{}-copy", delivery.message_id),
            ..delivery
        };
        consumer.consume(&copy).await.unwrap();
    }
    let shipped: BTreeMap<String, String> = backend
        .publisher
        .queue(&shipments())
        .unwrap()
        .receive(10)
        .into_iter()
        .map(|message| {
            let parent = message.attributes.get("traceparent").cloned().unwrap_or_default();
            (parent, message.body)
        })
        .collect();
    provider.force_flush().unwrap();

    let requests = collected.named("request");
    let dispatches = collected.named("dispatch");
    let (consumed, copies): (Vec<SpanData>, Vec<SpanData>) = collected
        .named("consumed_message")
        .into_iter()
        .partition(|span| outcome(span) == "processed");
    assert_eq!(
        copies.iter().map(outcome).collect::<Vec<_>>(),
        ["duplicate", "duplicate"]
    );
    let controls = collected.named("control_message");
    assert_eq!(
        (requests.len(), dispatches.len(), consumed.len(), controls.len()),
        (2, 2, 2, 2)
    );
    for (caller, txn_id) in callers.iter().zip(&txns) {
        let (trace, caller_span) = ids(caller);
        let request = requests
            .iter()
            .find(|span| span.span_context.trace_id() == trace)
            .expect("the request continues its caller's trace");
        assert_eq!(
            request.parent_span_id, caller_span,
            "the caller's span is the request's parent"
        );
        let (_, request_span) = context_of(request);
        let in_trace = |spans: &[SpanData]| -> SpanData {
            let found: Vec<_> = spans
                .iter()
                .filter(|span| span.span_context.trace_id() == trace)
                .cloned()
                .collect();
            assert_eq!(found.len(), 1, "{found:#?}");
            found.into_iter().next().unwrap()
        };
        let dispatch = in_trace(&dispatches);
        assert_eq!(
            dispatch.parent_span_id, request_span,
            "{txn_id}: the worker's dispatch is the emitting span's child"
        );
        let consumed = in_trace(&consumed);
        assert_eq!(
            consumed.parent_span_id, request_span,
            "{txn_id}: the consumer continues the emitting span"
        );
        let (_, consumed_span) = context_of(&consumed);
        let expected_parent = format!("00-{trace}-{consumed_span}-01");
        assert!(
            shipped.contains_key(&expected_parent),
            "{expected_parent} not among {shipped:?}"
        );
        // The worker's span for the control message is in a trace of its own, linking
        // the request's (its `begin`).
        let control = controls
            .iter()
            .find(|span| {
                span.links
                    .links
                    .iter()
                    .any(|link| link.span_context.trace_id() == trace)
            })
            .expect("a control message span links the transaction's trace");
        assert_ne!(control.span_context.trace_id(), trace);
        let begin = collected
            .named("begin")
            .into_iter()
            .find(|span| span.span_context.trace_id() == trace)
            .expect("begin");
        assert_eq!(begin.parent_span_id, request_span);
        assert_eq!(
            control.links.links[0].span_context.span_id(),
            begin.span_context.span_id()
        );
    }
    // The worker's decision for a message (its own reads of the item) is under that
    // message's span; the batch's read of the records is not.
    let decides = collected.named("decide");
    assert!(!decides.is_empty(), "entity mode decides in a span");
    for decide in &decides {
        let parent = decide.parent_span_id;
        assert!(
            controls.iter().any(|control| control.span_context.span_id() == parent),
            "a decide span outside its control message's: {decide:#?}"
        );
    }
    // Both control messages came in one batch: the worker published both transactions in
    // one pass, under a publish_batch span linking each dispatch. Every publish is under
    // that span or a consumed message's.
    let batch = collected.named("publish_batch");
    assert_eq!(batch.len(), 1, "{batch:#?}");
    let linked: Vec<SpanId> = batch[0]
        .links
        .links
        .iter()
        .map(|link| link.span_context.span_id())
        .collect();
    for dispatch in &dispatches {
        assert!(
            linked.contains(&dispatch.span_context.span_id()),
            "the batch does not link {dispatch:#?}"
        );
    }
    for publish in collected.named("publish") {
        let parent = publish.parent_span_id;
        let known = std::iter::once(&batch[0])
            .chain(&consumed)
            .any(|span| span.span_context.span_id() == parent);
        assert!(
            known,
            "a publish under neither the worker's batch nor a consumed message: {publish:#?}"
        );
    }
}
