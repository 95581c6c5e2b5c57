//! The inventory example, a service written on `outbox::service`, run whole in this
//! process on the embedded backend (its control worker and its ledger consumer
//! included), through its router; and the optimistic retry it relies on, with the
//! conflict forced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use http_body_util::BodyExt;
use outbox::http::{Answer, HttpError, RequestScope};
use outbox::ports::{ExpectedVersion, ItemKey};
use outbox::service::Running;
use outbox::testing::TestService;
use serde_json::{json, Value};

/// `method uri` with `body` as JSON (none: an empty body) and `headers`, through the
/// harness; the answer as (status, headers, body).
async fn call_with(
    service: &TestService,
    method: &str,
    uri: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let method = method.parse().expect("a method");
    let answer = service.send(method, uri, &body.unwrap_or(Value::Null), headers).await;
    (answer.status, answer.headers, answer.body)
}

async fn call(
    service: &TestService,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    call_with(service, method, uri, body, &[]).await
}

/// The target of an answer's `Link: <...>; rel="status"`.
fn status_link(headers: &axum::http::HeaderMap) -> String {
    let links: Vec<&str> = headers
        .get_all("link")
        .iter()
        .map(|value| value.to_str().unwrap())
        .collect();
    let link = links
        .iter()
        .find(|link| link.ends_with("rel=\"status\""))
        .unwrap_or_else(|| panic!("no status link in {headers:?}"));
    link[1..link.find('>').unwrap()].to_owned()
}

/// The inventory under test ([`outbox::testing`]): its ledger in the same process.
async fn inventory_under_test() -> TestService {
    let service = outbox::testing::service()
        .consumer("ledger", "events", inventory::ledger::Ledger)
        .expect("a valid consumer");
    TestService::start(service, inventory::router()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_serves_reserves_and_tallies_each_reservation_once_with_no_aws() {
    let service = inventory_under_test().await;
    service.backend().record();
    let product = service.post("/products", json!({"product_id": "p1", "stock": 3})).await;
    assert_eq!(product.status, StatusCode::CREATED, "{product:?}");
    let again = service.post("/products", json!({"product_id": "p1", "stock": 9})).await;
    assert_eq!(
        (again.status, again.problem_type()),
        (StatusCode::CONFLICT, Some("/problems/product-exists"))
    );
    assert!(
        again.body["transaction_id"].is_null(),
        "a refusal decided by the read names no transaction (nothing of it was sent): {again:?}"
    );

    // Six reservations of one unit at once on a stock of three: three are made, three
    // are refused for the stock (never for a concurrent change).
    let service = Arc::new(service);
    let reservations = (0..6).map(|_| {
        let service = service.clone();
        tokio::spawn(async move { service.post("/products/p1/reservations", json!({"quantity": 1})).await })
    });
    let answers: Vec<_> = futures::future::join_all(reservations)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let made: Vec<_> = answers
        .iter()
        .filter(|answer| answer.status == StatusCode::CREATED)
        .collect();
    let refused = answers
        .iter()
        .filter(|answer| {
            answer.status == StatusCode::CONFLICT && answer.problem_type() == Some("/problems/out-of-stock")
        })
        .count();
    assert_eq!((made.len(), refused), (3, 3), "{answers:?}");

    // The ledger, in the same process, counts each reservation once.
    service.drain().await;
    assert_eq!(service.item("TALLY#p1").await.unwrap()["reserved"], 3);
    let reserved: Vec<_> = service
        .sent("events")
        .into_iter()
        .filter(|event| event["type"] == "StockReserved")
        .collect();
    assert_eq!(reserved.len(), 3, "{reserved:?}");

    // The ready status route, reached by the link every answer naming a transaction
    // carries: a reservation (begun on its product: the link carries the item) reads
    // dispatched.
    let txn = made[0].body["reservation_id"].as_str().unwrap();
    let link = status_link(&made[0].headers);
    assert!(link.starts_with(&format!("/transactions/{txn}?item=")), "{link}");
    // Dispatched once what was published after the answer is settled (soon after the
    // ledger saw it, not necessarily before).
    let started = Instant::now();
    loop {
        let read = service.get(&link).await;
        assert_eq!(read.status, StatusCode::OK, "{read:?}");
        if read.body["status"] == "dispatched" {
            break;
        }
        assert_eq!(read.body["status"], "pending", "{read:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "{read:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A refusal decided by the read names no transaction (nothing of it was sent); one
    // whose read still saw a unit, and that met the bound in the write (the last units
    // went meanwhile), names its transaction in its body and header, and links its status.
    for refused in answers.iter().filter(|answer| answer.status == StatusCode::CONFLICT) {
        match refused.transaction_id() {
            None => {
                assert!(refused.body["transaction_id"].is_null(), "{refused:?}");
                assert!(refused.header("link").is_none(), "{refused:?}");
            }
            Some(txn) => {
                assert_eq!(refused.body["transaction_id"], txn, "{refused:?}");
                assert!(
                    status_link(&refused.headers).starts_with(&format!("/transactions/{txn}")),
                    "{refused:?}"
                );
            }
        }
    }

    // Refusals decided by the read cost it alone: the product that exists, the stock that
    // is gone, a product that is missing send no control message and write nothing (no
    // tombstone), and name no transaction.
    let embedded = service.backend();
    let sent = embedded.control_queue.queue().sent().len();
    let tombstones = || {
        embedded
            .store
            .history()
            .into_iter()
            .filter(|event| matches!(event, outbox::embedded::StoreEvent::Tombstoned { .. }))
            .count()
    };
    let tombstoned = tombstones();
    for (uri, body, kind) in [
        ("/products", json!({"product_id": "p1", "stock": 9}), "product-exists"),
        ("/products/p1/reservations", json!({"quantity": 1}), "out-of-stock"),
        ("/products/p7/reservations", json!({"quantity": 1}), "not-found"),
    ] {
        let read = service.post(uri, body).await;
        assert_eq!(read.body["type"], format!("/problems/{kind}"), "{read:?}");
        assert!(read.body["transaction_id"].is_null(), "{read:?}");
        assert!(read.transaction_id().is_none(), "{read:?}");
    }
    assert_eq!(embedded.control_queue.queue().sent().len(), sent, "no control message");
    assert_eq!(tombstones(), tombstoned, "no tombstone");
    let read = service.get("/transactions/not-an-id").await;
    assert_eq!(
        (read.status, read.problem_type()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("/problems/validation"))
    );

    // Bad bodies are problem+json, as every other refusal.
    let read = service.post("/products", json!({"product_id": "p2"})).await;
    assert_eq!(
        (read.status, read.problem_type()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("/problems/validation"))
    );
    Arc::into_inner(service).expect("the calls are done").stop().await;
}

/// A consumer tested alone, through the harness: a `StockReserved` the ledger receives
/// twice (the queue delivers at least once) adds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_tallies_a_reservation_once_however_often_it_arrives() {
    let service = inventory_under_test().await;
    let reserved = json!({"type": "StockReserved", "product_id": "p3", "quantity": 2});
    let message = outbox::protocol::Message::json("events".parse().unwrap(), &reserved).unwrap();
    service.emit(message.clone()).await;
    service.drain().await;
    let events = service
        .backend()
        .publisher
        .queue(&"events".parse().unwrap())
        .unwrap()
        .clone();
    let copy = events.sent().last().unwrap().request.clone();
    events.send(copy).unwrap();
    service.drain().await;
    assert_eq!(service.item("TALLY#p3").await.unwrap()["reserved"], 2);
    service.stop().await;
}

/// A stop on the embedded backend lets the in-process consumers take what their
/// destinations hold first: those queues go with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_the_consumers_take_what_their_destinations_hold() {
    let service = inventory_under_test().await;
    let outbox = service.outbox().clone();
    let (status, ..) = call(
        &service,
        "POST",
        "/products",
        Some(json!({"product_id": "p9", "stock": 50})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    for _ in 0..20 {
        let (status, ..) = call(
            &service,
            "POST",
            "/products/p9/reservations",
            Some(json!({"quantity": 1})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    service.stop().await;
    let key: ItemKey = "TALLY#p9".parse().unwrap();
    let items = outbox.store().get_items(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(
        items.get(&key).map(|item| item.data["reserved"].clone()),
        Some(json!(20))
    );
}

/// A destination is one queue: a second consumer on it would take half the messages, so
/// the service refuses it, naming the first.
#[test]
fn a_second_consumer_of_one_destination_is_refused() {
    let refused = outbox::testing::service()
        .consumer("ledger", "events", inventory::ledger::Ledger)
        .unwrap()
        .consumer("audit", "events", inventory::ledger::Ledger)
        .err()
        .expect("refused");
    assert!(
        refused.to_string().contains("consumer ledger reads events already"),
        "{refused}"
    );
    assert!(outbox::testing::service()
        .consumer("ledger", "events", inventory::ledger::Ledger)
        .unwrap()
        .consumer("audit", "audit", inventory::ledger::Ledger)
        .is_ok());
}

/// Two requests of two processes read the same version of an item before either
/// commits; the later commit meets a version conflict, and its step runs again and
/// commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_met_a_version_conflict_runs_again_and_commits() {
    let running = outbox::testing::service().start().await.unwrap();
    let key: ItemKey = "COUNTER#1".parse().unwrap();
    let mut txn = running.outbox.begin().await.unwrap();
    txn.put(key.clone(), json!({"n": 0}), ExpectedVersion::Absent);
    txn.commit().await.unwrap();

    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let increment = |scope: RequestScope| {
        let (key, both_read) = (key.clone(), both_read.clone());
        async move {
            let rounds = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let counted = rounds.clone();
            let answer = scope
                .retry_conflicts(Some(key.clone()), None, |mut txn| {
                    let (key, both_read, rounds) = (key.clone(), both_read.clone(), counted.clone());
                    async move {
                        let item = txn.get(&key).await?.expect("the counter exists");
                        // The first round of each waits until both have read.
                        if rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                            both_read.wait().await;
                        }
                        let n = item.data["n"].as_u64().unwrap();
                        txn.put(key, json!({"n": n + 1}), ExpectedVersion::Exactly(item.version));
                        Ok::<_, HttpError>((txn, Answer::json(StatusCode::OK, &json!({"n": n + 1}))))
                    }
                })
                .await;
            (
                answer.map(|response| response.status()),
                rounds.load(std::sync::atomic::Ordering::SeqCst),
            )
        }
    };
    // Two processes (requests of one process take turns, and would not meet).
    let first = tokio::spawn(increment(RequestScope::new(running.outbox.clone(), None)));
    let second = tokio::spawn(increment(RequestScope::new(running.outbox.as_another_process(), None)));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    let statuses = [&first.0, &second.0].map(|result| result.as_ref().map_err(|error| error.to_string()).copied());
    assert_eq!(
        statuses,
        [Ok(StatusCode::OK), Ok(StatusCode::OK)],
        "{first:?} {second:?}"
    );
    let mut rounds = [first.1, second.1];
    rounds.sort();
    assert_eq!(rounds, [1, 2], "one ran once, the other again after the conflict");
    assert_eq!(counter(&running, &key).await, 2, "both increments landed");
    running.stop().await;
}

/// `Command::run_on` hands each attempt the key, a clone of the body and a clone of what
/// `with` added, owned: two requests of two processes read one counter before either
/// commits, the later one meets a version conflict, and its second attempt is handed the
/// same values as its first; both additions land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commands_attempts_are_each_handed_the_key_the_body_and_its_extra() {
    use outbox::http::Command;
    use std::sync::Mutex;
    let running = outbox::testing::service().start().await.unwrap();
    let key: ItemKey = "COUNTER#command".parse().unwrap();
    new_counter(&running, &key).await;

    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let increment = |scope: RequestScope, by: u64| {
        let command = Command {
            scope,
            idempotency: None,
            body: json!({"by": by}),
        };
        let handed = Arc::new(Mutex::new(Vec::new()));
        let extra = (both_read.clone(), handed.clone(), format!("request {by}"));
        let key = key.clone();
        async move {
            let answer = command
                .with(extra)
                .run_on(key, |mut txn, key, (body, (both_read, handed, name))| async move {
                    let item = txn.get(&key).await?.expect("the counter exists");
                    let round = {
                        let mut handed = handed.lock().unwrap();
                        handed.push((key.as_str().to_owned(), body.clone(), name));
                        handed.len()
                    };
                    if round == 1 {
                        both_read.wait().await;
                    }
                    let n = item.data["n"].as_u64().unwrap() + body["by"].as_u64().unwrap();
                    txn.put(key, json!({"n": n}), ExpectedVersion::of(Some(&item)));
                    Ok((txn, Answer::json(StatusCode::OK, &json!({"n": n}))))
                })
                .await;
            let handed = handed.lock().unwrap().clone();
            (
                answer
                    .map(|response| response.status())
                    .map_err(|error| error.to_string()),
                handed,
            )
        }
    };
    let first = tokio::spawn(increment(RequestScope::new(running.outbox.clone(), None), 1));
    let second = tokio::spawn(increment(
        RequestScope::new(running.outbox.as_another_process(), None),
        2,
    ));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((&first.0, &second.0), (&Ok(StatusCode::OK), &Ok(StatusCode::OK)));
    let mut rounds = [first.1.len(), second.1.len()];
    rounds.sort();
    assert_eq!(
        rounds,
        [1, 2],
        "one ran once, the other again after the conflict: {first:?} {second:?}"
    );
    for (by, handed) in [(1, &first.1), (2, &second.1)] {
        for attempt in handed {
            assert_eq!(
                attempt,
                &("COUNTER#command".to_owned(), json!({"by": by}), format!("request {by}")),
                "every attempt is handed the same values: {handed:?}"
            );
        }
    }
    assert_eq!(counter(&running, &key).await, 3, "both additions landed");
    running.stop().await;
}

/// Adds 1 to `key`'s `n` through `retry_conflicts`, pausing `think` between the read and
/// the stage; `before_stage` runs there too (a rival's write, say). The answer and how
/// many times the step ran.
async fn increment_in(
    scope: RequestScope,
    key: ItemKey,
    think: Duration,
    before_stage: impl Fn() -> futures::future::BoxFuture<'static, ()>,
) -> (Result<axum::response::Response, HttpError>, u32) {
    let rounds = std::sync::atomic::AtomicU32::new(0);
    let answer = scope
        .retry_conflicts(Some(key.clone()), None, |mut txn| {
            let (key, rounds, before_stage) = (key.clone(), &rounds, &before_stage);
            async move {
                rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let item = txn.get(&key).await?.expect("the counter exists");
                tokio::time::sleep(think).await;
                before_stage().await;
                let n = item.data["n"].as_u64().unwrap();
                txn.put(key, json!({"n": n + 1}), ExpectedVersion::Exactly(item.version));
                Ok::<_, HttpError>((txn, Answer::json(StatusCode::OK, &json!({"n": n + 1}))))
            }
        })
        .await;
    (answer, rounds.load(std::sync::atomic::Ordering::SeqCst))
}

async fn counter(running: &Running, key: &ItemKey) -> u64 {
    let items = running
        .outbox
        .store()
        .get_items(std::slice::from_ref(key))
        .await
        .unwrap();
    items[key].data["n"].as_u64().unwrap()
}

async fn new_counter(running: &Running, key: &ItemKey) {
    let mut txn = running.outbox.begin().await.unwrap();
    txn.put(key.clone(), json!({"n": 0}), ExpectedVersion::Absent);
    txn.commit().await.unwrap();
}

/// Requests of one process that change one entity take turns for their whole step:
/// the second reads what the first committed, however long the first takes to decide,
/// and neither meets a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_one_process_on_one_entity_take_turns_and_never_conflict() {
    let running = outbox::testing::service().start().await.unwrap();
    let key: ItemKey = "COUNTER#turns".parse().unwrap();
    new_counter(&running, &key).await;
    let nothing = || -> futures::future::BoxFuture<'static, ()> { Box::pin(async {}) };
    let both = (0..2).map(|_| {
        let (scope, key) = (RequestScope::new(running.outbox.clone(), None), key.clone());
        tokio::spawn(async move {
            let (answer, rounds) = increment_in(scope, key, Duration::from_millis(100), nothing).await;
            (
                answer
                    .map(|response| response.status())
                    .map_err(|error| error.to_string()),
                rounds,
            )
        })
    });
    let results: Vec<_> = futures::future::join_all(both)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        results,
        [(Ok(StatusCode::OK), 1), (Ok(StatusCode::OK), 1)],
        "each step ran once: the second waited for the first instead of racing it"
    );
    assert_eq!(counter(&running, &key).await, 2);
    running.stop().await;
}

/// A step that meets a conflict at every commit (a rival of another process changes
/// the item between its read and its commit, each time) runs again for as long as the
/// request's deadline leaves room, not a fixed number of times, and then answers a 503
/// naming its last transaction, with nothing of it written: never a 409 for a change
/// the business rule allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_keeps_meeting_conflicts_retries_until_its_deadline_then_answers_503_with_nothing_written() {
    let running = outbox::testing::service().start().await.unwrap();
    let key: ItemKey = "COUNTER#rival".parse().unwrap();
    new_counter(&running, &key).await;
    let rival = running.outbox.clone();
    let rivals = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bump = {
        let (key, rivals) = (key.clone(), rivals.clone());
        move || -> futures::future::BoxFuture<'static, ()> {
            let (rival, key, rivals) = (rival.clone(), key.clone(), rivals.clone());
            Box::pin(async move {
                let mut txn = rival.begin_entity(key.clone()).await.unwrap();
                let item = txn.get(&key).await.unwrap().unwrap();
                let n = item.data["n"].as_u64().unwrap();
                txn.put(key, json!({"n": n + 1}), ExpectedVersion::Exactly(item.version));
                txn.commit().await.unwrap();
                rivals.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        }
    };
    let clock = running.outbox.clock().clone();
    let deadline = clock.now().plus(Duration::from_millis(1500));
    let scope = RequestScope::new(running.outbox.as_another_process(), Some(deadline));
    let started = Instant::now();
    let (answer, rounds) = increment_in(scope, key.clone(), Duration::from_millis(5), bump).await;
    let took = started.elapsed();
    let response = axum::response::IntoResponse::into_response(answer.expect_err("never committed"));
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/timeout")),
        "{body}"
    );
    assert!(body["transaction_id"].is_string(), "names its transaction: {body}");
    assert!(
        rounds > 4,
        "ran again until the deadline, not a fixed count: {rounds} rounds"
    );
    assert!(took < Duration::from_millis(1500), "answered by its deadline: {took:?}");
    assert_eq!(
        counter(&running, &key).await,
        rivals.load(std::sync::atomic::Ordering::SeqCst),
        "only the rival's changes were written"
    );
    running.stop().await;
}

/// `POST /loans/{book}` under an `Idempotency-Key`, as a lending service writes it: a
/// copy free is lent (201); none free is a refusal the service decides (409); a book
/// marked `unreachable` answers 503, as a store that cannot be read does.
async fn lend(
    scope: RequestScope,
    axum::extract::Path(book): axum::extract::Path<String>,
    outbox::http::Idempotent { idempotency, .. }: outbox::http::Idempotent<axum::body::Bytes>,
) -> Result<axum::response::Response, HttpError> {
    let key: ItemKey = format!("BOOK#{book}").parse().expect("a valid key");
    let mut txn = match scope.begin(idempotency).await? {
        outbox::http::Begun::Replay(answer) => return Ok(answer),
        outbox::http::Begun::Started(txn) => txn,
    };
    let txn_id = txn.id();
    let item = txn.get(&key).await?.expect("the book exists");
    if item.data["unreachable"] == true {
        let unavailable = outbox::ports::StoreError::Unavailable("the catalogue is unreachable".into());
        return Err(HttpError::Unavailable(unavailable).in_transaction(txn_id));
    }
    let free = item.data["free"].as_u64().unwrap_or(0);
    if free == 0 {
        let problem = outbox::http::Problem::new(StatusCode::CONFLICT, "no-copy-free", "No copy free");
        return Err(HttpError::from(problem).in_transaction(txn_id));
    }
    txn.put(key, json!({"free": free - 1}), ExpectedVersion::Exactly(item.version));
    scope
        .commit(txn, Answer::json(StatusCode::CREATED, &json!({"lent": book})))
        .await
}

async fn set_book(outbox: &outbox::request::Outbox, book: &str, data: Value) {
    let key: ItemKey = format!("BOOK#{book}").parse().unwrap();
    let mut txn = outbox.begin().await.unwrap();
    let expected = match txn.get(&key).await.unwrap() {
        Some(item) => ExpectedVersion::Exactly(item.version),
        None => ExpectedVersion::Absent,
    };
    txn.put(key, data, expected);
    txn.commit().await.unwrap();
}

async fn lend_under(service: &TestService, book: &str, key: &str) -> (StatusCode, axum::http::HeaderMap, Value) {
    call_with(
        service,
        "POST",
        &format!("/loans/{book}"),
        None,
        &[("idempotency-key", key)],
    )
    .await
}

/// Under an `Idempotency-Key` the first completed answer is the key's, a refusal the
/// service decided included: a loan refused for want of a copy is refused again on its
/// repeat, replayed with the first refusal's transaction, after a copy came back too; a
/// new key is lent that copy. A 503 is never the key's answer: its repeat runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replays_its_first_answer_a_refusal_included_and_never_a_503() {
    let service = TestService::start(
        outbox::testing::service(),
        Router::new().route("/loans/{book}", axum::routing::post(lend)),
    )
    .await;
    set_book(service.outbox(), "dune", json!({"free": 0})).await;

    let (status, headers, first) = lend_under(&service, "dune", "loan-1").await;
    assert_eq!(
        (status, first["type"].as_str()),
        (StatusCode::CONFLICT, Some("/problems/no-copy-free")),
        "{first}"
    );
    assert!(!headers.contains_key("idempotent-replayed"));
    let (status, headers, again) = lend_under(&service, "dune", "loan-1").await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    assert_eq!(
        headers.get("idempotent-replayed").map(|v| v.to_str().unwrap()),
        Some("true"),
        "{headers:?}"
    );
    assert_eq!(again, first, "the first refusal, its transaction included");

    // A copy comes back: the key still answers as it first did; a new key is lent it.
    set_book(service.outbox(), "dune", json!({"free": 1})).await;
    let (status, headers, later) = lend_under(&service, "dune", "loan-1").await;
    assert_eq!((status, later.clone()), (StatusCode::CONFLICT, first.clone()));
    assert_eq!(headers["idempotent-replayed"], "true");
    let (status, _, lent) = lend_under(&service, "dune", "loan-2").await;
    assert_eq!((status, lent), (StatusCode::CREATED, json!({"lent": "dune"})));

    // A 503 is not final: the repeat runs again, and its answer is the key's.
    set_book(service.outbox(), "arrakis", json!({"free": 1, "unreachable": true})).await;
    let (status, _, unavailable) = lend_under(&service, "arrakis", "loan-3").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{unavailable}");
    set_book(service.outbox(), "arrakis", json!({"free": 1})).await;
    let (status, headers, lent) = lend_under(&service, "arrakis", "loan-3").await;
    assert_eq!((status, lent), (StatusCode::CREATED, json!({"lent": "arrakis"})));
    assert!(!headers.contains_key("idempotent-replayed"));
    let (status, headers, _) = lend_under(&service, "arrakis", "loan-3").await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::CREATED, &"true".parse().unwrap())
    );
    service.stop().await;
}

async fn call_under(
    service: &TestService,
    uri: &str,
    key: &str,
    body: Value,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    call_with(service, "POST", uri, Some(body), &[("idempotency-key", key)]).await
}

/// The inventory under keys: a reservation refused for the stock is refused again on its
/// repeat (replayed), even once the stock would allow it is not a question: the key
/// answered. A request refused before its transaction began (its quantity invalid) is
/// not the key's answer: the corrected request under the same key is served, and its
/// answer is the key's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_replays_a_refused_reservation_but_not_a_request_it_could_not_read() {
    let service = inventory_under_test().await;
    let (status, _, _) = call(
        &service,
        "POST",
        "/products",
        Some(json!({"product_id": "k1", "stock": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let uri = "/products/k1/reservations";

    let (status, _, refused) = call_under(&service, uri, "many", json!({"quantity": 5})).await;
    assert_eq!(
        (status, refused["type"].as_str()),
        (StatusCode::CONFLICT, Some("/problems/out-of-stock")),
        "{refused}"
    );
    let (status, headers, again) = call_under(&service, uri, "many", json!({"quantity": 5})).await;
    assert_eq!((status, &again), (StatusCode::CONFLICT, &refused));
    assert_eq!(headers["idempotent-replayed"], "true");

    let (status, _, invalid) = call_under(&service, uri, "one", json!({"quantity": 0})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{invalid}");
    let (status, headers, made) = call_under(&service, uri, "one", json!({"quantity": 1})).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert!(!headers.contains_key("idempotent-replayed"));
    let (status, headers, _) = call_under(&service, uri, "one", json!({"quantity": 1})).await;
    assert_eq!(
        (status, headers.get("idempotent-replayed").is_some()),
        (StatusCode::CREATED, true)
    );
    service.stop().await;
}

/// A handler that refuses after its transaction's control message went out, without
/// naming it: the answer names it all the same, in its header and its problem+json body.
/// A path no route serves and a method a path does not take answer problem+json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_its_transaction_without_the_handler_saying_so_and_unrouted_requests_answer_problem_json() {
    async fn refuse_after_send(scope: RequestScope) -> Result<axum::response::Response, HttpError> {
        let txn = match scope.begin(None).await? {
            outbox::http::Begun::Started(txn) => txn,
            outbox::http::Begun::Replay(answer) => return Ok(answer),
        };
        txn.send_control().await?;
        let problem = outbox::http::Problem::new(StatusCode::CONFLICT, "no-copy-free", "No copy free");
        Err(problem.into())
    }
    let service = TestService::start(
        outbox::testing::service(),
        Router::new().route("/refusals", axum::routing::post(refuse_after_send)),
    )
    .await;
    let (status, headers, body) = call(&service, "POST", "/refusals", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let named = headers["x-transaction-id"].to_str().unwrap();
    assert_eq!(body["transaction_id"], named, "{body}");

    let (status, _, body) = call(&service, "GET", "/nowhere", None).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("/problems/not-found")),
        "{body}"
    );
    let (status, headers, body) = call(&service, "DELETE", "/refusals", None).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("/problems/method-not-allowed")),
        "{body}"
    );
    assert_eq!(headers["allow"], "POST");
    service.stop().await;
}

/// The ledger applying each product's events in their order (its tally is the same):
/// what the route of `outbox::http::consumers` shows the place of.
struct LedgerInOrder;

#[async_trait::async_trait]
impl outbox::consumer::Handler for LedgerInOrder {
    async fn handle(
        &self,
        message: &outbox::consumer::Incoming,
        staging: &mut outbox::consumer::Staging,
    ) -> Result<(), outbox::consumer::HandlerError> {
        outbox::consumer::Handler::handle(&inventory::ledger::Ledger, message, staging).await
    }

    fn entity(&self, message: &outbox::consumer::Incoming) -> Result<Option<ItemKey>, outbox::consumer::HandlerError> {
        outbox::consumer::Handler::entity(&inventory::ledger::Ledger, message)
    }

    fn in_order(&self) -> bool {
        true
    }
}

/// An in-order consumer's place in an entity's chain, through the route a service mounts:
/// the product's three events (its ProductAdded applied in a transaction of its own, its
/// two StockReserved in the tally's key, entity mode) read as applied through seq 3, by a
/// transaction of the ledger's, with nothing kept waiting; a query without its entity is
/// refused as problem+json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_order_ledgers_place_in_a_products_chain_is_in_sight() {
    let service = outbox::testing::service()
        .consumer("ledger", "events", LedgerInOrder)
        .expect("a valid consumer");
    let router = inventory::router().merge(outbox::http::consumers::routes());
    let service = TestService::start(service, router).await;
    let product = service.post("/products", json!({"product_id": "p1", "stock": 5})).await;
    assert_eq!(product.status, StatusCode::CREATED, "{product:?}");
    for _ in 0..2 {
        let reserved = service.post("/products/p1/reservations", json!({"quantity": 1})).await;
        assert_eq!(reserved.status, StatusCode::CREATED, "{reserved:?}");
    }
    service.drain().await;
    assert_eq!(service.item("TALLY#p1").await.unwrap()["reserved"], 2);

    let state = service
        .get("/consumers/ledger/chain?destination=events&entity=PRODUCT%23p1&item=TALLY%23p1")
        .await;
    assert_eq!(state.status, StatusCode::OK, "{state:?}");
    assert_eq!(state.body["consumer"], "ledger", "{state:?}");
    assert_eq!(state.body["entity"], "PRODUCT#p1", "{state:?}");
    assert_eq!(state.body["applied"]["seq"], 3, "{state:?}");
    assert_eq!(state.body["applied"]["kept_in"], "TALLY#p1", "{state:?}");
    let txn = state.body["applied"]["transaction_id"]
        .as_str()
        .expect("the transaction that applied it");
    assert!(txn.parse::<outbox::protocol::TxnId>().is_ok(), "{state:?}");
    assert_eq!(state.body["kept"], json!([]), "{state:?}");

    let refused = service.get("/consumers/ledger/chain?destination=events").await;
    assert_eq!(
        (refused.status, refused.header("content-type")),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("application/problem+json")),
        "{refused:?}"
    );
    assert!(
        refused.body.to_string().contains("\"entity\""),
        "names the field missing: {refused:?}"
    );
    service.stop().await;
}
