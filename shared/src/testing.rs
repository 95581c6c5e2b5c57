//! A service under test, whole in the test's process (feature `testing`): its routes
//! called as they are served, its consumers drained, its items read, on the embedded
//! backend, with no AWS and no port.
//!
//! A handler's test:
//!
//! ```
//! use axum::{http::StatusCode, response::Response, routing::post, Router};
//! use outbox::http::{Answer, HttpError, RequestScope};
//! use outbox::protocol::Message;
//! use outbox::testing::TestService;
//! use serde_json::json;
//!
//! async fn hello(scope: RequestScope) -> Result<Response, HttpError> {
//!     scope
//!         .retry_conflicts(None, None, |mut txn| async move {
//!             txn.emit(Message::json("events".parse().unwrap(), &json!({"type": "Hello"})).unwrap());
//!             Ok((txn, Answer::json(StatusCode::CREATED, &json!({"hello": "world"}))))
//!         })
//!         .await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let app = Router::new().route("/hello", post(hello));
//! let service = TestService::start(outbox::testing::service(), app).await;
//! let answer = service.post("/hello", json!({})).await;
//! assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
//! service.drain().await;
//! assert_eq!(service.sent("events")[0]["type"], "Hello");
//! # }
//! ```
//!
//! A consumer's test: the message comes through the outbox, committed and published as a
//! producer's are, and the consumer runs in the same process.
//!
//! ```
//! use outbox::consumer::{Handler, HandlerError, Incoming, Staging};
//! use outbox::ports::ExpectedVersion;
//! use outbox::protocol::Message;
//! use outbox::testing::TestService;
//! use serde_json::json;
//!
//! struct Greeter;
//! #[async_trait::async_trait]
//! impl Handler for Greeter {
//!     async fn handle(&self, message: &Incoming, staging: &mut Staging) -> Result<(), HandlerError> {
//!         let name = message.json::<serde_json::Value>()?["name"].as_str().unwrap_or("?").to_owned();
//!         staging.put(format!("GREETED#{name}").parse()?, json!({"greeted": true}), ExpectedVersion::Absent);
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let service = outbox::testing::service().consumer("greeter", "events", Greeter).unwrap();
//! let service = TestService::start(service, axum::Router::new()).await;
//! service.emit(Message::json("events".parse().unwrap(), &json!({"name": "ada"})).unwrap()).await;
//! service.drain().await;
//! assert_eq!(service.item("GREETED#ada").await.unwrap()["greeted"], true);
//! # }
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use serde_json::Value;
use tower::ServiceExt;

use crate::embedded::{EmbeddedBackend, SendRequest};
use crate::ports::ItemKey;
use crate::protocol::{DestinationName, Message, OutgoingMessage, Position, Producer, TxnId};
use crate::request::Outbox;
use crate::service::{Running, Service};
use crate::settings::Settings;

/// How long [`TestService::drain`] waits for the work in flight to settle.
pub const DRAIN_BOUND: Duration = Duration::from_secs(20);

/// The largest answer body a test reads.
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The settings of a service under test: the embedded backend, with the control
/// worker's first check a second after each transaction begins (not the deployed
/// default), so that what the request path could not publish goes out within a test.
pub fn settings() -> Settings {
    Settings::from_lookup(|name| match name {
        crate::settings::vars::FIRST_CHECK_DELAY_SECONDS => Some("1".into()),
        _ => None,
    })
    .expect("the embedded backend's settings are valid")
}

/// A [`Service`] on [`settings`], to register consumers on before
/// [`TestService::start`].
pub fn service() -> Service {
    Service::new(settings())
}

/// A message of another service's, as that service's outbox sends it to a destination
/// this one consumes ([`TestService::deliver`]): for an in-order consumer's test, as the
/// `seq`th message of an entity's chain ([`Upstream::at`]). Delivered twice, it is one
/// message sent twice (its id the same).
#[derive(Debug, Clone)]
pub struct Upstream {
    message: OutgoingMessage,
}

impl Upstream {
    /// `body` on `destination`, from a transaction of its producer's that changed no
    /// entity.
    ///
    /// # Panics
    ///
    /// If `destination` is not a valid destination name.
    pub fn json(destination: &str, body: &Value) -> Self {
        let destination = destination
            .parse()
            .unwrap_or_else(|error| panic!("destination {destination:?}: {error}"));
        let message = Message::json(destination, body).expect("a JSON value serialises");
        Self {
            message: OutgoingMessage::new(TxnId::new_v7(), 0, message),
        }
    }

    /// This message as the `seq`th (from 1) that `producer` (the table its chains live
    /// in) sent about `entity` to the destination, each of the entity's transactions
    /// sending one (the entity at version `seq` after it).
    ///
    /// # Panics
    ///
    /// If `producer` or `entity` is not a valid name, or `seq` is 0.
    pub fn at(mut self, producer: &str, entity: &str, seq: u64) -> Self {
        assert!(seq > 0, "a chain's seqs start at 1");
        self.message.position = Some(Position {
            producer: Some(
                Producer::of_table(producer).unwrap_or_else(|error| panic!("producer {producer:?}: {error}")),
            ),
            entity: entity
                .parse()
                .unwrap_or_else(|error| panic!("entity {entity:?}: {error}")),
            chain: self.message.destination.clone(),
            seq,
            version: seq,
            after: seq - 1,
            previous: None,
        });
        self
    }
}

/// A [`Service`] on [`settings`] that also publishes to `destinations` (besides `events`
/// and the sources of its consumers): each an in-process queue whose messages
/// [`TestService::sent`] reads. A consumer that publishes needs its destinations named,
/// as `OUTBOX_DESTINATIONS` names them in a deployment.
///
/// # Panics
///
/// If a name is not a valid destination name.
pub fn service_publishing_to(destinations: &[&str]) -> Service {
    let mut settings = settings();
    for name in destinations {
        let destination: DestinationName = name
            .parse()
            .unwrap_or_else(|error| panic!("destination {name:?}: {error}"));
        let target = crate::service::queue_target(&destination);
        settings.destinations.insert(destination, target);
    }
    Service::new(settings)
}

/// A started service and its router, as the service serves it (status route, deadline,
/// problem+json for unrouted requests, body limit).
pub struct TestService {
    running: Running,
    app: Router,
}

/// An answer, its body read as JSON (`Null` when empty or not JSON).
#[derive(Debug, Clone)]
pub struct TestAnswer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Value,
}

impl TestAnswer {
    /// A header's value, when it is present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// A problem's `type` (`/problems/...`), when the answer is one.
    pub fn problem_type(&self) -> Option<&str> {
        self.body["type"].as_str()
    }

    /// The transaction the answer names, in its `x-transaction-id` header.
    pub fn transaction_id(&self) -> Option<&str> {
        self.header(crate::http::TRANSACTION_ID_HEADER)
    }
}

impl TestService {
    /// Starts `service` (built on [`settings`], or on settings of the embedded backend
    /// of the test's own), with its consumers running in this process, and serves `app`
    /// under it.
    ///
    /// # Panics
    ///
    /// If the service does not start, or its settings are not the embedded backend's.
    pub async fn start(service: Service, app: Router) -> Self {
        let running = service.start().await.expect("the service starts");
        let backend = running
            .embedded
            .as_ref()
            .expect("a service under test runs on the embedded backend");
        for queue in backend.publisher.destinations().values() {
            queue.record_sends();
        }
        let app = running.router(app);
        Self { running, app }
    }

    /// The request path, as the handlers have it.
    pub fn outbox(&self) -> &Outbox {
        &self.running.outbox
    }

    /// The embedded backend: its table and its queues.
    pub fn backend(&self) -> &EmbeddedBackend {
        self.running.embedded.as_ref().expect("started on the embedded backend")
    }

    /// Calls the service with `request`.
    pub async fn call(&self, request: Request<Body>) -> TestAnswer {
        let response = self
            .app
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let (status, headers) = (response.status(), response.headers().clone());
        let bytes = axum::body::to_bytes(response.into_body(), BODY_LIMIT)
            .await
            .expect("the answer's body is read");
        TestAnswer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// Calls `method uri` with `body` as JSON (none when `Null`) and `headers`.
    pub async fn send(&self, method: Method, uri: &str, body: &Value, headers: &[(&str, &str)]) -> TestAnswer {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = if body.is_null() {
            Body::empty()
        } else {
            request = request.header("content-type", "application/json");
            Body::from(body.to_string())
        };
        self.call(request.body(body).expect("a valid request")).await
    }

    /// `GET uri`.
    pub async fn get(&self, uri: &str) -> TestAnswer {
        self.send(Method::GET, uri, &Value::Null, &[]).await
    }

    /// `POST uri` with `body` as JSON.
    pub async fn post(&self, uri: &str, body: Value) -> TestAnswer {
        self.send(Method::POST, uri, &body, &[]).await
    }

    /// Commits one transaction that emits `message` and writes nothing else, for a
    /// consumer's test; it is published after the commit, as a request's are after its
    /// answer. The message carries no entity's position (the transaction changes no
    /// item): for an in-order consumer's test, commit through [`Self::outbox`] a
    /// transaction that changes the entity and emits the message.
    ///
    /// # Panics
    ///
    /// If the transaction does not commit.
    pub async fn emit(&self, message: Message) -> TxnId {
        let mut txn = self.outbox().begin().await.expect("the transaction begins");
        txn.emit(message);
        txn.commit().await.expect("the transaction commits").txn_id
    }

    /// Sends `message` to its destination's queue as its producer's publisher does (the
    /// same attributes: its id, its entity and place): the service's consumer of the
    /// destination takes it; [`Self::drain`] waits until it did. Deliver an entity's
    /// messages in any order, or one twice, to see what the consumer makes of a queue's
    /// reordering and copies.
    ///
    /// # Panics
    ///
    /// If the backend has no such destination, or its queue refuses the message.
    pub fn deliver(&self, message: &Upstream) {
        let message = &message.message;
        let queue = self
            .backend()
            .publisher
            .destinations()
            .get(&message.destination)
            .cloned()
            .unwrap_or_else(|| panic!("no destination {}", message.destination));
        let fifo = queue.config().fifo;
        queue
            .send(SendRequest {
                body: message.body.clone(),
                attributes: message.send_attributes(),
                delay: Duration::ZERO,
                group_id: fifo.then(|| message.fifo_group()),
                // Each delivery a send of its own, as a publisher's retry after the
                // deduplication window would be.
                deduplication_id: fifo.then(|| TxnId::new_v7().to_string()),
            })
            .unwrap_or_else(|fault| panic!("{} refused the message: {fault}", message.destination));
    }

    /// Waits until what the service started settled: the publishing after each answer
    /// is done and every destination a consumer of the service reads holds nothing to
    /// take within [`DRAIN_BOUND`] or in a consumer's hands (its messages handled, with
    /// what they caused published in turn, a message handed back after a failure or sent
    /// back to wait included; the reminder of a message an in-order consumer keeps until
    /// its predecessor comes, due minutes later, is not waited for).
    ///
    /// # Panics
    ///
    /// After [`DRAIN_BOUND`], naming what is left: a message that keeps failing comes
    /// back until then.
    pub async fn drain(&self) {
        let started = Instant::now();
        loop {
            let after_answer = self.outbox().after_answer().map_or(0, |after| after.running());
            let held = self.held();
            if after_answer == 0 && held.is_empty() {
                // Settled twice in a row, a moment apart: a consumer may be between
                // taking a message and publishing what it caused.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let after_answer = self.outbox().after_answer().map_or(0, |after| after.running());
                if after_answer == 0 && self.held().is_empty() {
                    return;
                }
                continue;
            }
            assert!(
                started.elapsed() < DRAIN_BOUND,
                "not drained within {DRAIN_BOUND:?}: {after_answer} publishing after an answer; messages held: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The messages each consumed destination holds to take within [`DRAIN_BOUND`] or in
    /// a receiver's hands ([`crate::embedded::EmbeddedQueue::due_within`]: not a kept
    /// message's reminder, due minutes later), by destination.
    fn held(&self) -> BTreeMap<DestinationName, usize> {
        self.backend()
            .publisher
            .destinations()
            .iter()
            .filter(|(name, _)| self.running.consumes(name))
            .map(|(name, queue)| (name.clone(), queue.due_within(DRAIN_BOUND)))
            .filter(|(_, held)| *held > 0)
            .collect()
    }

    /// Every message sent to `destination` since the start, as JSON bodies, in order.
    ///
    /// # Panics
    ///
    /// If the backend has no such destination.
    pub fn sent(&self, destination: &str) -> Vec<Value> {
        let name: DestinationName = destination.parse().expect("a valid destination name");
        let queue = self
            .backend()
            .publisher
            .destinations()
            .get(&name)
            .unwrap_or_else(|| panic!("no destination {destination}"));
        queue
            .sent()
            .iter()
            .map(|sent| {
                serde_json::from_str(&sent.request.body).unwrap_or_else(|_| Value::String(sent.request.body.clone()))
            })
            .collect()
    }

    /// The business item `key` (`PRODUCT#p1`), its data, if it exists.
    ///
    /// # Panics
    ///
    /// If `key` is not a valid key.
    pub async fn item(&self, key: &str) -> Option<Value> {
        let key: ItemKey = key.parse().unwrap_or_else(|error| panic!("key {key:?}: {error}"));
        let mut items = self
            .outbox()
            .store()
            .get_items(std::slice::from_ref(&key))
            .await
            .expect("the embedded table answers");
        items.remove(&key).map(|item| item.data)
    }

    /// Stops the service as a process would ([`Running::stop`]).
    pub async fn stop(self) {
        self.running.stop().await;
    }
}
