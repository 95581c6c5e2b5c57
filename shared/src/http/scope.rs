//! Every request's deadline, and its transaction from `begin` to the answer, so that an
//! answer names the transaction even when time runs out.
//!
//! A request must be answered before its end: on Lambda the invocation's deadline (after
//! it the function is frozen and the client gets a gateway error, not an answer), locally
//! a timeout. The invocation's deadline is read from `lambda_http`'s context with feature
//! `lambda` (the service must use the same `lambda_http` as this crate); without it, the
//! timeout alone holds. [`enforce_deadline`] computes that end once per request and gives the
//! handler a deadline a margin before it ([`RequestScope::deadline`]), which the outbox's
//! commit and its retries keep to. If the handler still has not answered half a margin
//! before the end (a stalled read, say), the middleware answers instead, from the
//! progress the scope recorded: before the transaction's control message was sent, a plain
//! timeout (nothing of it left the process, and nothing of it ever will); after it was
//! sent but before the commit was tried, a timeout that names it and says nothing was
//! written; once its commit was in flight, "outcome unknown" naming it, unless the
//! transaction's tombstone can still be written, which makes it "nothing written". A 503
//! that cannot name its transaction is thus given only while nothing of it was sent.
//!
//! A transaction the handler began and did not commit (it answered 404, or found nothing
//! to change) is settled by the middleware before the answer goes out
//! ([`Outbox::abandon`]). If its control message was not sent (the default: it goes out
//! with the first commit attempt), nothing is written or sent: the refusal costs the
//! handler's reads alone, and the answer names no transaction, since none exists outside
//! the process. If it was sent ([`Transaction::send_control`]), the middleware writes the
//! transaction's tombstone, so that the control message finds it settled at its first
//! check instead of deferring until the commit window ends, and the answer names it. Either
//! way a commit of it is refused from then on (a task the handler spawned that commits
//! after the answer gets [`TxnError::Abandoned`], nothing sent or written); one that began
//! before is fenced, in its item in entity mode.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::LINK;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use super::answer::Answer;
use super::error::{timeout_problem, HttpError};
use super::idempotency::{is_final_refusal, stored, Idempotency};
use super::problem::{encode_item_key, naming_in_body, TRANSACTION_ID_HEADER, TRANSACTION_ITEM_HEADER};
pub use super::progress::Progress;
use crate::native::{NativeOutbox, NativeTransaction};
use crate::ports::ItemKey;
use crate::protocol::TxnId;
use crate::request::{watch_begins, Abandoned, BeginWatch, Committable, Outbox, Settlement, Transaction, TxnError};
use crate::time::Timestamp;

/// How long before a request's end the handler must stop working, to answer in time.
pub const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// A request's transaction, from its begin to the answer: how it begins (through the
/// request path [`Deadlines`] names, within the request's deadline), what it commits
/// with (the answer, stored under the request's idempotency key), and how far it got.
/// An extractor: the scope [`enforce_deadline`] gave the request (a handler without the
/// middleware is refused, with a 500 that says so in the log).
#[derive(Clone)]
pub struct RequestScope {
    /// When the handler must have finished, if the request has a deadline.
    pub deadline: Option<Timestamp>,
    outbox: Outbox,
    state: Arc<Mutex<ScopeState>>,
    status_route: Option<Arc<str>>,
}

/// What a scope records as its request runs.
#[derive(Default)]
struct ScopeState {
    progress: Progress,
    /// The transaction admitted and beginning, if any: the request's one place is taken.
    beginning: Option<TxnId>,
    /// The request path the transaction began on (through the scope or not), to abandon
    /// it through.
    begun_on: Option<Outbox>,
    /// The item the transaction commits into, if it was begun in entity mode: its
    /// settling write is the fence there.
    begun_entity: Option<crate::ports::ItemKey>,
    /// The transaction's control message was sent (the queue acknowledged it): abandoning
    /// it once it is no longer live writes its tombstone, and without this nothing (while
    /// it is live, the request path's own state decides).
    sent: bool,
    /// The request's key and fingerprint, given at begin: the answer is stored under it.
    idempotency: Option<Idempotency>,
    /// The middleware answered for a handler that overran: no transaction begins in this
    /// request any more, and one that was beginning then is abandoned as it starts.
    closed: bool,
}

impl std::fmt::Debug for RequestScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestScope")
            .field("deadline", &self.deadline)
            .field("progress", &self.progress())
            .finish_non_exhaustive()
    }
}

/// What [`RequestScope::begin`] found: a repeat of a request that was answered already,
/// or a new transaction.
#[must_use]
pub enum Begun<T> {
    /// The request repeats one, under the same idempotency key, that committed: its
    /// stored answer, with `Idempotent-Replayed: true`. Nothing began.
    Replay(Response),
    /// The transaction began (nothing of it is sent yet: its control message goes out
    /// with its commit, or with [`Transaction::send_control`]).
    Started(T),
}

impl RequestScope {
    /// A scope whose transactions begin on `outbox`, by `deadline`.
    pub fn new(outbox: Outbox, deadline: Option<Timestamp>) -> Self {
        Self {
            deadline,
            outbox,
            state: Arc::default(),
            status_route: None,
        }
    }

    /// The request path its transactions begin on.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScopeState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that transaction `txn_id` began.
    pub fn begun(&self, txn_id: TxnId) {
        self.set(Progress::Begun(txn_id));
    }

    /// Records that transaction `txn_id`'s commit is about to be tried.
    pub fn committing(&self, txn_id: TxnId) {
        self.set(Progress::Committing(txn_id));
    }

    /// How far the transaction got.
    pub fn progress(&self) -> Progress {
        self.state().progress
    }

    fn set(&self, progress: Progress) {
        self.state().progress = progress;
    }

    /// The request's transaction, begun within its deadline with its progress recorded;
    /// or, when `idempotency` names a request that was answered already, that answer to
    /// give again (the same key on a different request is
    /// [`HttpError::IdempotencyKeyReused`]). Under a key, [`Self::commit`] stores the
    /// answer with the transaction.
    pub async fn begin(&self, idempotency: Option<Idempotency>) -> Result<Begun<Transaction>, HttpError> {
        if let Some(replay) = self.replay(idempotency).await? {
            return Ok(Begun::Replay(replay));
        }
        let begin = async {
            match self.deadline {
                Some(deadline) => self.outbox.begin_within(deadline).await,
                None => self.outbox.begin().await,
            }
        };
        // The middleware watches the whole request already; this covers a begin on
        // another task.
        Ok(Begun::Started(watch_begins(Arc::new(self.clone()), begin).await?))
    }

    /// [`Self::begin`] for a transaction that changes one existing item, `key`, in entity
    /// mode ([`Outbox::begin_entity`]): one conditional write instead of a transaction
    /// where its staging allows, the transactional form otherwise (with a key, its
    /// idempotency record needs the transaction).
    pub async fn begin_entity(
        &self,
        key: ItemKey,
        idempotency: Option<Idempotency>,
    ) -> Result<Begun<Transaction>, HttpError> {
        if let Some(replay) = self.replay(idempotency).await? {
            return Ok(Begun::Replay(replay));
        }
        let begin = async {
            match self.deadline {
                Some(deadline) => self.outbox.begin_entity_within(key, deadline).await,
                None => self.outbox.begin_entity(key).await,
            }
        };
        Ok(Begun::Started(watch_begins(Arc::new(self.clone()), begin).await?))
    }

    /// [`Self::begin`] for a transaction with native actions (the request path must be on
    /// the DynamoDB store, see [`NativeOutbox::new`]).
    pub async fn begin_native(&self, idempotency: Option<Idempotency>) -> Result<Begun<NativeTransaction>, HttpError> {
        let outbox = NativeOutbox::new(self.outbox.clone()).map_err(|_| HttpError::Misconfigured {
            problem: "native actions need the request path on the DynamoDB store",
        })?;
        if let Some(replay) = self.replay(idempotency).await? {
            return Ok(Begun::Replay(replay));
        }
        let begin = async {
            match self.deadline {
                Some(deadline) => outbox.begin_within(deadline).await,
                None => outbox.begin().await,
            }
        };
        Ok(Begun::Started(watch_begins(Arc::new(self.clone()), begin).await?))
    }

    /// The stored answer of a repeated request (see [`Idempotency::replay`]); `None`
    /// without a key, or for a new one, which the scope then keeps for the commit.
    async fn replay(&self, idempotency: Option<Idempotency>) -> Result<Option<Response>, HttpError> {
        let Some(idempotency) = idempotency else {
            return Ok(None);
        };
        let replay = idempotency.replay(self.outbox.store().as_ref()).await?;
        if replay.is_none() {
            self.state().idempotency = Some(idempotency);
        }
        Ok(replay)
    }

    /// Names transaction `txn_id` in an answer's `headers`: its id (unless there), its
    /// item if it was begun in entity mode, and the link to its status if the scope has a
    /// status route.
    fn name_in(&self, headers: &mut HeaderMap, txn_id: TxnId) {
        if !headers.contains_key(TRANSACTION_ID_HEADER) {
            let value = HeaderValue::from_str(&txn_id.to_string()).expect("transaction ids are ASCII");
            headers.insert(TRANSACTION_ID_HEADER, value);
        }
        let entity = self.state().begun_entity.clone();
        if let Some(key) = &entity {
            let value = HeaderValue::from_str(&encode_item_key(key)).expect("percent-encoded is ASCII");
            headers.insert(TRANSACTION_ITEM_HEADER, value);
        }
        add_status_link(headers, self.status_route.as_deref(), txn_id, entity.as_ref());
    }

    /// Frees the request's one place after transaction `failed` definitely failed to
    /// commit (nothing of it was written, and its settling is done), so that a retry
    /// begins another. `false`, and nothing changed, if the scope is closed or holds
    /// another transaction.
    pub(super) fn reopen(&self, failed: TxnId) -> bool {
        let mut state = self.state();
        if state.closed || state.progress != Progress::Committing(failed) {
            return false;
        }
        state.progress = Progress::NotBegun;
        state.beginning = None;
        state.begun_on = None;
        state.begun_entity = None;
        state.sent = false;
        true
    }

    /// Settles transaction `txn_id`, begun in this scope (see [`Outbox::abandon`]): with
    /// nothing if nothing of it was sent ([`Settlement::NothingSent`]), else with its
    /// tombstone by `deadline`: how far the transaction had got when it was abandoned
    /// (final: no send or commit of it starts after), and the settlement, `None` when no
    /// transaction began in it.
    async fn abandon(&self, txn_id: TxnId, deadline: Timestamp) -> (Progress, Option<Settlement>) {
        // Decided under the scope's lock, which the commit hook takes too, so that what
        // the request path says and what the scope saw agree: from here on a commit of
        // the transaction that has not begun is refused. The progress read under the
        // same lock is the one to answer by: one read before it may miss a commit that a
        // task holding the transaction started in between.
        let (progress, outbox, entity) = {
            let state = self.state();
            let mut progress = state.progress;
            let Some(outbox) = state.begun_on.clone() else {
                return (progress, None);
            };
            let committing = matches!(progress, Progress::Committing(_));
            let entity = match outbox.claim_abandoned(txn_id) {
                // Its control message and its commit are refused from now on: nothing of
                // it left the process, nor ever will, and nothing needs writing.
                Abandoned::Unsent => return (progress, Some(Settlement::NothingSent)),
                // Dropped without a commit, before its control message was sent (its hook
                // would have said so): the same.
                Abandoned::Unknown if !committing && !state.sent => return (progress, Some(Settlement::NothingSent)),
                // Nothing of it can land: its tombstone record settles it (a fence raises
                // the item's mark, which costs a transaction and sends older transactions
                // on the item to the transactional form).
                Abandoned::BeforeCommit => None,
                // A commit under way, or cut off midway (a task the handler spawned):
                // fenced in its entity. It may have begun before its hook told the scope
                // (the request path marks it committing, then tells the hooks, and on a
                // multi-threaded runtime the abandon can come in between): the scope
                // answers by what the request path saw, never "nothing written" for it
                // unless the settling write decides so.
                Abandoned::WhileCommitting(begun_in) => {
                    progress = Progress::Committing(txn_id);
                    begun_in
                }
                // No longer live: dropped without a commit (the hook would have said so)
                // after its control message was sent, or its commit ended (the handler
                // overran it): the fence finds its entry.
                Abandoned::Unknown => state.begun_entity.clone().filter(|_| committing),
            };
            (progress, outbox, entity)
        };
        (
            progress,
            Some(outbox.settle_abandoned(txn_id, entity.as_ref(), deadline).await),
        )
    }

    /// Closes the scope for a handler that overran, under its lock: from now on no
    /// transaction is admitted, and one still beginning is abandoned as it starts (its
    /// control message and its commit refused: nothing of it is ever sent). Returns how
    /// far the request got.
    fn close(&self) -> Progress {
        let mut state = self.state();
        state.closed = true;
        state.progress
    }

    /// Commits `txn` with `answer` (stored for replays under the idempotency key given at
    /// begin) and answers with it, naming the transaction. When a concurrent request with
    /// the same key committed first, answers as it did. A failure names the transaction;
    /// under `If-Match` ([`Answer::under_precondition`]) a failed business condition is a
    /// 412.
    pub async fn commit<T: Committable>(&self, mut txn: T, answer: Answer) -> Result<Response, HttpError> {
        let txn_id = txn.id();
        let idempotency = self.state().idempotency.clone();
        let idempotency = idempotency.as_ref();
        let Answer {
            status,
            mut headers,
            body,
            precondition,
        } = answer;
        headers.insert(
            TRANSACTION_ID_HEADER,
            HeaderValue::from_str(&txn_id.to_string()).expect("transaction ids are ASCII"),
        );
        // The item, too, for a transaction begun in entity mode: the middleware adds it to
        // the answer, and the stored answer a replay gives must carry it as well.
        let entity = self.state().begun_entity.clone();
        if let Some(key) = &entity {
            let value = HeaderValue::from_str(&encode_item_key(key)).expect("percent-encoded is ASCII");
            headers.insert(TRANSACTION_ITEM_HEADER, value);
        }
        // Stored with the answer too: a replay links the same status.
        add_status_link(&mut headers, self.status_route.as_deref(), txn_id, entity.as_ref());
        if let Some(idempotency) = idempotency {
            txn.remember_response(
                idempotency.slot.clone(),
                idempotency.fingerprint.clone(),
                stored(status, &headers, &body),
            );
        }
        // For a transaction begun without this scope: from here on it may commit.
        self.committing(txn_id);
        match txn.commit().await {
            Ok(_) => Ok((status, headers, body).into_response()),
            // A concurrent request with the same key committed first: answer as it did.
            Err(TxnError::IdempotencyKeyUsed { .. }) if idempotency.is_some() => {
                let idempotency = idempotency.expect("checked");
                let replay = idempotency
                    .replay(self.outbox.store().as_ref())
                    .await
                    .map_err(|error| error.in_transaction(txn_id))?;
                // Its record expired in between: nothing of this request was written.
                replay.ok_or_else(|| {
                    HttpError::Unavailable(crate::ports::StoreError::Unavailable(
                        "the idempotency record that refused the commit is gone".into(),
                    ))
                    .in_transaction(txn_id)
                })
            }
            Err(error) if precondition => Err(HttpError::Precondition(error)),
            Err(error) => Err(HttpError::Transaction(error)),
        }
    }
}

/// The scope sees every transaction begun while its request runs on the request's task:
/// through it, or with [`Outbox::begin`] directly (a task the handler spawns is not
/// watched, unless it begins through the scope). One per request: a second is refused
/// ([`TxnError::SecondInRequest`]), even after the first was refused or abandoned, since
/// the answer, the idempotency record and the middleware's settling all concern one
/// transaction.
impl BeginWatch for RequestScope {
    fn admit(&self, txn_id: TxnId) -> Result<(), TxnError> {
        let mut state = self.state();
        if state.closed {
            // The request was answered already (a timeout): nothing of it may begin now.
            return Err(TxnError::DeadlineExceeded { txn_id });
        }
        match (state.progress, state.beginning) {
            (Progress::Begun(first) | Progress::Committing(first), _) | (Progress::NotBegun, Some(first)) => {
                Err(TxnError::SecondInRequest { txn_id: first })
            }
            // The first to get here takes the place, even against a begin running at once.
            (Progress::NotBegun, None) => {
                state.beginning = Some(txn_id);
                Ok(())
            }
        }
    }

    fn started(&self, outbox: &Outbox, txn: &mut Transaction) {
        {
            let mut state = self.state();
            if state.closed {
                // Begun while the middleware answered for the overrun, which told the
                // client nothing was written: nothing of it may be sent now.
                let _ = outbox.claim_abandoned(txn.id());
                tracing::warn!(txn_id = %txn.id(), "a transaction began after its request was answered; its control message and its commit will be refused");
            }
            state.begun_on = Some(outbox.clone());
            state.begun_entity = txn.entity().cloned();
            state.progress = Progress::Begun(txn.id());
        }
        let state = self.state.clone();
        txn.on_control_send(move |_| {
            state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).sent = true;
        });
        let state = self.state.clone();
        txn.on_commit_attempt(move |txn_id| {
            state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).progress = Progress::Committing(txn_id);
        });
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RequestScope {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RequestScope>()
            .cloned()
            .ok_or(HttpError::Misconfigured {
                problem: "a handler takes a RequestScope, and the enforce_deadline middleware is not installed",
            })
    }
}

/// The margin for a request that may last `timeout`: [`ANSWER_MARGIN`], or a quarter of
/// a shorter timeout.
pub fn margin(timeout: Duration) -> Duration {
    ANSWER_MARGIN.min(timeout / 4)
}

/// The instant a request that arrived at `now` must be answered by: `timeout` after it,
/// or the Lambda invocation's deadline (milliseconds since the epoch) if that is sooner.
///
/// A Lambda deadline that has already passed when the request arrives is not one: Lambda
/// never hands out an invocation after its deadline, while `cargo lambda watch` sends its
/// own timeout there (`600000`, a duration), which would make every request time out at
/// once. Such a value is ignored and the local timeout holds.
pub fn request_end(now: Timestamp, timeout: Duration, lambda_deadline_millis: Option<u64>) -> Timestamp {
    let local = now.plus(timeout);
    match lambda_deadline_millis.map(Timestamp::from_millis) {
        Some(deadline) if deadline > now => local.min(deadline),
        Some(deadline) => {
            tracing::debug!(
                lambda_deadline_millis = deadline.as_millis(),
                "the Lambda deadline had passed on arrival; using the timeout"
            );
            local
        }
        None => local,
    }
}

/// The state of [`enforce_deadline`]: the request path the requests' transactions begin
/// on (its clock times them), and how long a request may take (locally; on Lambda the
/// invocation's deadline may end it sooner).
#[derive(Clone)]
pub struct Deadlines {
    outbox: Outbox,
    timeout: Duration,
    status_route: Option<Arc<str>>,
}

impl Deadlines {
    /// Requests of at most `timeout`, their transactions on `outbox`.
    pub fn new(outbox: Outbox, timeout: Duration) -> Self {
        Self {
            outbox,
            timeout,
            status_route: None,
        }
    }

    /// These deadlines, and every answer that names a transaction links to its status at
    /// `route` (a path with `{id}`, such as [`super::status::STATUS_PATH`], which the
    /// service serves): `Link: </transactions/{id}?item=…>; rel="status"`, the item
    /// included for a transaction begun on one, so that a client reads the status of
    /// any transaction by following the link, without knowing where its proof lives.
    pub fn with_status_links(mut self, route: &str) -> Self {
        self.status_route = Some(route.into());
        self
    }
}

/// The `Link` to transaction `txn_id`'s status at `route`, with `item` if it was begun
/// on one.
pub fn status_link(route: &str, txn_id: TxnId, item: Option<&ItemKey>) -> HeaderValue {
    let mut target = route.replace("{id}", &txn_id.to_string());
    if let Some(item) = item {
        target.push_str("?item=");
        target.push_str(&encode_item_key(item));
    }
    HeaderValue::from_str(&format!("<{target}>; rel=\"status\"")).expect("an ASCII link")
}

/// Adds the status link to `headers` unless one is there.
fn add_status_link(headers: &mut HeaderMap, route: Option<&str>, txn_id: TxnId, item: Option<&ItemKey>) {
    let Some(route) = route else { return };
    let linked = headers
        .get_all(LINK)
        .iter()
        .any(|value| value.to_str().is_ok_and(|value| value.contains("rel=\"status\"")));
    if !linked {
        headers.append(LINK, status_link(route, txn_id, item));
    }
}

/// The Lambda invocation's deadline, when the request came through `lambda_http`.
fn lambda_deadline(request: &Request) -> Option<u64> {
    #[cfg(feature = "lambda")]
    {
        request
            .extensions()
            .get::<lambda_http::Context>()
            .map(|context| context.deadline)
    }
    #[cfg(not(feature = "lambda"))]
    {
        let _ = request;
        None
    }
}

/// The middleware: gives each request its [`RequestScope`], answers for a handler that
/// overruns, and settles a transaction the handler began and left without committing
/// (a 404, a no-op, an early return on an error): nothing to write if its control message
/// was not sent (its send and its commit are refused from then on), else its tombstone,
/// written before answering, so that its control message finds it settled. Install it with
/// `axum::middleware::from_fn_with_state(Deadlines::new(outbox, timeout), enforce_deadline)`.
pub async fn enforce_deadline(State(deadlines): State<Deadlines>, mut request: Request, next: Next) -> Response {
    let clock = deadlines.outbox.clock().clone();
    let now = clock.now();
    let end = request_end(now, deadlines.timeout, lambda_deadline(&request));
    let margin = margin(deadlines.timeout);
    let mut scope = RequestScope::new(deadlines.outbox.clone(), Some(end.minus(margin)));
    scope.status_route = deadlines.status_route.clone();
    request.extensions_mut().insert(scope.clone());
    let backstop = end.minus(margin / 2).since(now);
    // Settling writes by then, leaving the rest of the margin to answer.
    let settle_by = end.minus(margin / 4);
    // The handler's future is dropped when the backstop wins: its transaction is then
    // in nobody's hands.
    let watched = watch_begins(Arc::new(scope.clone()), next.run(request));
    // The handler's answer wins when both are ready: it is the real one.
    let answered = tokio::select! {
        biased;
        response = watched => Some(response),
        () = clock.timer(backstop) => None,
    };
    let progress = scope.progress();
    match answered {
        Some(mut response) => {
            let mut nothing_sent = false;
            if let Progress::Begun(txn_id) = progress {
                // A write here only spares the control worker its deferrals: it may delay
                // the answer by a moment, no more.
                let by = crate::request::settle_bound(clock.now(), Some(settle_by));
                nothing_sent = scope.abandon(txn_id, by).await.1 == Some(Settlement::NothingSent);
            }
            // Once something of a transaction may be out, every answer names it: a 404 or
            // a no-op too; in entity mode with its item, where a status read finds it after
            // dispatch. One that sent nothing has nothing to ask about.
            if let Progress::Begun(txn_id) | Progress::Committing(txn_id) = progress {
                if !nothing_sent {
                    scope.name_in(response.headers_mut(), txn_id);
                    response = naming_in_body(response, txn_id).await;
                }
                // A refusal decided after the begin, under a key: the key's answer too.
                let idempotency = scope.state().idempotency.clone();
                if let Some(idempotency) = idempotency.filter(|_| is_final_refusal(response.status())) {
                    let outbox = scope.outbox();
                    let retention = outbox.timing().retention;
                    let store = outbox.store().clone();
                    response = idempotency
                        .keep_refusal(store.as_ref(), txn_id, clock.now(), retention, response)
                        .await;
                }
            }
            response
        }
        None => {
            // Read under the scope's lock, which closes it: nothing begins from here on.
            let progress = scope.close();
            tracing::warn!(?progress, "the handler overran its deadline; answering for it");
            let answer = match progress {
                Progress::Begun(txn_id) | Progress::Committing(txn_id) => {
                    match scope.abandon(txn_id, settle_by).await {
                        // Nothing of it was sent, nor ever will be: a plain timeout.
                        (_, Some(Settlement::NothingSent)) => Progress::NotBegun,
                        // Settled now: nothing was written and nothing can be.
                        (_, Some(settlement)) if settlement.never_committed() => Progress::Begun(txn_id),
                        // It committed, but the handler's answer is lost with it.
                        (_, Some(Settlement::Committed(_))) => Progress::Committing(txn_id),
                        // Begun without the scope and handed to its commit: as far as the
                        // scope saw it get.
                        (_, None) => progress,
                        // Not settled: as far as it had got when it was abandoned.
                        (seen, _) => seen,
                    }
                }
                Progress::NotBegun => progress,
            };
            let mut response = timeout_problem(answer).into_response();
            if let Progress::Begun(txn_id) | Progress::Committing(txn_id) = answer {
                scope.name_in(response.headers_mut(), txn_id);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_the_sooner_of_the_timeout_and_the_lambda_deadline() {
        let now = Timestamp::from_millis(1_000_000);
        let timeout = Duration::from_secs(10);
        assert_eq!(request_end(now, timeout, None).as_millis(), 1_010_000);
        assert_eq!(request_end(now, timeout, Some(1_003_000)).as_millis(), 1_003_000);
        assert_eq!(request_end(now, timeout, Some(1_020_000)).as_millis(), 1_010_000);
        // What `cargo lambda watch` sends: its timeout, not an instant.
        assert_eq!(request_end(now, timeout, Some(600_000)).as_millis(), 1_010_000);
        assert_eq!(margin(timeout), ANSWER_MARGIN);
        assert_eq!(margin(Duration::from_secs(1)), Duration::from_millis(250));
    }

    /// The request path marks a commit as begun, then tells its hooks (the scope's among
    /// them); an abandon in between, from the deadline's backstop on another thread, finds
    /// the commit under way while the scope still says "begun". If its settling write
    /// cannot decide (here: its deadline is past), the answer must be "outcome unknown",
    /// never "nothing written" for a commit that may land.
    #[tokio::test]
    async fn an_abandon_between_the_commits_start_and_its_hook_answers_by_the_commit() {
        use crate::embedded::{EmbeddedBackend, ManualClock};
        use crate::ports::Clock;
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let backend = EmbeddedBackend::new(clock.clone(), [("events".parse().unwrap(), false)]);
        let outbox = Outbox::new(
            backend.request_ports(clock.clone()),
            crate::settings::Timing::default(),
            crate::settings::TransactionLimits::default(),
        );
        let scope = RequestScope::new(outbox.clone(), Some(clock.now().plus(Duration::from_secs(10))));
        let key: crate::ports::ItemKey = "ORDER#1".parse().unwrap();
        let Ok(Begun::Started(txn)) = scope.begin_entity(key, None).await else {
            panic!("begun");
        };
        let txn_id = txn.id();
        txn.send_control().await.expect("the control message");
        assert_eq!(scope.progress(), Progress::Begun(txn_id));
        // The commit's start, before its hooks run.
        assert!(outbox.start_commit_unhooked(txn_id));
        let past = clock.now().minus(Duration::from_secs(1));
        let (progress, settlement) = scope.abandon(txn_id, past).await;
        assert!(
            settlement.as_ref().is_some_and(|settled| !settled.never_committed()),
            "{settlement:?}"
        );
        assert_eq!(
            progress,
            Progress::Committing(txn_id),
            "answered by the commit under way"
        );
        drop(txn);
    }
}
