//! A fault run on the emulator: the request path commits through a proxy
//! ([`outbox_tests::fault_proxy`]) that hides the outcome of most commit attempts (the
//! reply lost after the commit applied, the request held until the client gave up and
//! forwarded late, or the request dropped), and every answer is checked against the
//! table once the late forwards have landed (I7). It counts how many commits of unknown
//! outcome the request path's settling write (docs/PROTOCOL.md section 3, "Settling in the
//! request path") turned into a definite answer.
//!
//! The DynamoDB client going through the proxy has SDK retries disabled, so each
//! attempt the request path makes is one request the proxy sees and each injected fault
//! reaches the request path, and an operation timeout of [`CLIENT_TIMEOUT`], which cuts a
//! held request short. Transactions run one after another, and the proxy passes
//! requests to DynamoDB Local one at a time, so that a late forward never overlaps the
//! next transaction's calls. DynamoDB Local honours `ClientRequestToken`: an attempt
//! repeated after an earlier one applied is answered with success and applies nothing
//! (moto, which ignores the token, answers it with a cancellation instead); the checks
//! hold on both.
//!
//! `FAULT_SEED` picks another seed for the plan.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use outbox::aws::{bootstrap, AwsClients, DynamoStore, ResourceNames, SqsControlQueue};
use outbox::ports::{Clock, ExpectedVersion, ItemKey, RandomIds, SystemClock};
use outbox::protocol::{Message, TxnId};
use outbox::request::{Committed, Outbox, RequestPorts, TxnError, TxnStatus};
use outbox::settings::{Timing, TransactionLimits};
use outbox_tests::emulator::{emulator, unique_name};
use outbox_tests::fault_proxy::{Fault, FaultProxy, Intercepted, TRANSACT_WRITE_ITEMS};
use serde_json::json;

/// Transactions in the run.
const TRANSACTIONS: usize = 60;
/// The plan's seed unless `FAULT_SEED` names another.
const DEFAULT_SEED: u64 = 7_2024;
/// The proxied DynamoDB client's operation timeout: how long the client waits for a
/// held commit before giving up on it. Late forwards come after it (260 ms to 1.5 s
/// after the request arrived).
const CLIENT_TIMEOUT: Duration = Duration::from_millis(250);
/// Each transaction's deadline, from its begin.
const REQUEST_BUDGET: Duration = Duration::from_secs(2);
/// Out of 100: forward, reply lost, late, dropped (the rest).
const FORWARD: u32 = 30;
const REPLY_LOST: u32 = 25;
const LATE: u32 = 25;

/// What the request path answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Committed,
    Fenced,
    /// Another definite "not committed" (named).
    NotCommitted(String),
    Ambiguous,
}

impl Answer {
    fn of(result: &Result<Committed, TxnError>) -> Self {
        let error = match result {
            Ok(_) => return Self::Committed,
            Err(error) => error,
        };
        match error {
            TxnError::Fenced { .. } => Self::Fenced,
            TxnError::Ambiguous { .. } => Self::Ambiguous,
            other => {
                assert!(other.is_definite(), "{other:?}");
                let name = format!("{other:?}");
                Self::NotCommitted(name.split([' ', '{', '(']).next().unwrap_or_default().to_owned())
            }
        }
    }
}

/// One transaction of the run, and what is known of it afterwards.
struct Run {
    txn_id: TxnId,
    key: ItemKey,
    answer: Answer,
    error: Option<String>,
    faults: Vec<Intercepted>,
}

impl Run {
    fn met_unknown_outcome(&self) -> bool {
        self.faults.iter().any(|attempt| attempt.fault.hides_outcome())
    }

    fn met(&self, kind: &str) -> bool {
        self.faults.iter().any(|attempt| attempt.fault.as_str() == kind)
    }

    /// Commit attempts the engine answered with success, as seen on the wire. DynamoDB
    /// answers success to every attempt under the token of a commit that applied (within
    /// ten minutes) and applies it once: so this is the first to apply plus its repeats.
    fn accepted_on_the_wire(&self) -> usize {
        self.faults
            .iter()
            .filter(|attempt| matches!(&attempt.upstream, Some(Ok(reply)) if reply.applied()))
            .count()
    }
}

fn plan(seed: u64) -> impl FnMut(Option<&str>) -> Fault + Send + 'static {
    let mut rng = fastrand::Rng::with_seed(seed);
    move |_token| {
        let roll = rng.u32(0..100);
        if roll < FORWARD {
            Fault::Forward
        } else if roll < FORWARD + REPLY_LOST {
            Fault::ReplyLost
        } else if roll < FORWARD + REPLY_LOST + LATE {
            // Half land while the request path still retries or settles, half after it
            // has answered.
            let late = if rng.bool() {
                rng.u64(260..=450)
            } else {
                rng.u64(450..=1500)
            };
            Fault::Late(Duration::from_millis(late))
        } else {
            Fault::Drop
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_commit_of_unknown_outcome_gets_a_definite_and_truthful_answer() {
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let emulator = emulator();
    let sdk = emulator.sdk_config().await;
    let direct = AwsClients::new(&sdk);
    let resources = bootstrap(&direct, &ResourceNames::for_stack(&unique_name("ambiguous")))
        .await
        .expect("bootstrap on the emulator");
    let proxy = FaultProxy::start(&emulator.dynamodb_endpoint, plan(seed)).await;
    let proxied = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(proxy.endpoint())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(CLIENT_TIMEOUT)
                    .operation_attempt_timeout(CLIENT_TIMEOUT)
                    .connect_timeout(CLIENT_TIMEOUT)
                    .build(),
            )
            .build(),
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let request_path = |dynamodb: aws_sdk_dynamodb::Client| {
        Outbox::new(
            RequestPorts {
                store: Arc::new(DynamoStore::new(dynamodb, resources.layout.clone(), clock.clone())),
                control_queue: Arc::new(SqsControlQueue::new(
                    direct.sqs.clone(),
                    resources.control_queue_url.clone(),
                )),
                clock: clock.clone(),
                ids: Arc::new(RandomIds),
            },
            Timing::default(),
            TransactionLimits::default(),
        )
    };
    let outbox = request_path(proxied);
    // The truth, read past the proxy.
    let truth = request_path(direct.dynamodb.clone());

    let started = Instant::now();
    let mut runs = Vec::new();
    for n in 0..TRANSACTIONS {
        let deadline = clock.now().plus(REQUEST_BUDGET);
        let mut txn = outbox
            .begin_within(deadline)
            .await
            .expect("begin (the control queue is not faulted)");
        let txn_id = txn.id();
        let key: ItemKey = format!("ORDER#{n}").parse().expect("a valid key");
        txn.put(
            key.clone(),
            json!({"n": n, "status": "placed"}),
            ExpectedVersion::Absent,
        );
        txn.emit(
            Message::json(
                "events".parse().expect("valid"),
                &json!({"type": "OrderPlaced", "n": n}),
            )
            .expect("json"),
        );
        let result = txn.commit().await;
        if let Err(error) = &result {
            assert_eq!(error.txn_id(), txn_id, "the error names its transaction");
        }
        runs.push(Run {
            txn_id,
            key,
            answer: Answer::of(&result),
            error: result.as_ref().err().map(|error| format!("{error:?}")),
            faults: Vec::new(),
        });
    }
    let answered_in = started.elapsed();
    // Every late forward reaches the emulator and is answered before the truth is read.
    proxy.quiesce(Duration::from_secs(10)).await;

    let mut by_token: BTreeMap<String, Vec<Intercepted>> = BTreeMap::new();
    let intercepted = proxy.intercepted();
    for attempt in &intercepted {
        let token = attempt.token.clone().expect("every commit carries its token");
        by_token.entry(token).or_default().push(attempt.clone());
    }
    for run in &mut runs {
        run.faults = by_token.remove(&run.txn_id.to_string()).unwrap_or_default();
        assert!(
            !run.faults.is_empty(),
            "{}: its commit never reached the proxy",
            run.txn_id
        );
    }
    assert!(by_token.is_empty(), "commits of unknown transactions: {by_token:?}");

    // I7: every answer against the table.
    let mut violations = Vec::new();
    for run in &runs {
        let status = truth.status(run.txn_id).await.expect("status");
        let committed = matches!(status, TxnStatus::Pending | TxnStatus::Dispatched);
        let written = truth
            .store()
            .get_items(std::slice::from_ref(&run.key))
            .await
            .expect("read the item");
        assert_eq!(
            written.contains_key(&run.key),
            committed,
            "{}: the business write and the outbox record are one commit",
            run.txn_id
        );
        assert_eq!(
            run.accepted_on_the_wire() > 0,
            committed,
            "{}: the engine accepted {} of its attempts ({:?}), the table says {status:?}",
            run.txn_id,
            run.accepted_on_the_wire(),
            run.faults
        );
        let truthful = match &run.answer {
            Answer::Committed => committed,
            Answer::Fenced => status == TxnStatus::Tombstoned,
            Answer::NotCommitted(_) => !committed,
            Answer::Ambiguous => true,
        };
        if !truthful {
            violations.push(format!(
                "{}: answered {:?} ({:?}), table says {status:?}, attempts {:?}",
                run.txn_id, run.answer, run.error, run.faults
            ));
        }
    }
    assert!(violations.is_empty(), "I7 violated:\n{}", violations.join("\n"));

    let unknown: Vec<&Run> = runs.iter().filter(|run| run.met_unknown_outcome()).collect();
    let count = |answer: &dyn Fn(&Answer) -> bool| unknown.iter().filter(|run| answer(&run.answer)).count();
    let committed = count(&|answer| *answer == Answer::Committed);
    let fenced = count(&|answer| *answer == Answer::Fenced);
    let other_definite = count(&|answer| matches!(answer, Answer::NotCommitted(_)));
    let ambiguous = count(&|answer| *answer == Answer::Ambiguous);
    let others = if other_definite > 0 {
        format!(", {other_definite} answered not committed (other)")
    } else {
        String::new()
    };
    println!(
        "emulator fault run: {} transactions, {} met an unknown outcome: {committed} answered committed, \
         {fenced} answered not committed (fenced){others}, {ambiguous} outcome unknown; truth matched every answer",
        runs.len(),
        unknown.len(),
    );

    // The breakdown: which faults, which decided by the settling write, how late
    // forwards fared, and what the emulator returned on a failed condition.
    let attempts_by = |kind: &str| {
        intercepted
            .iter()
            .filter(|attempt| attempt.fault.as_str() == kind)
            .count()
    };
    let late_applied = intercepted
        .iter()
        .filter(|attempt| matches!(attempt.fault, Fault::Late(_)))
        .filter(|attempt| matches!(&attempt.upstream, Some(Ok(reply)) if reply.applied()))
        .count();
    let every_attempt_hidden: Vec<&&Run> = unknown
        .iter()
        .filter(|run| run.faults.iter().all(|attempt| attempt.fault.hides_outcome()))
        .collect();
    let settled_committed = every_attempt_hidden
        .iter()
        .filter(|run| run.answer == Answer::Committed)
        .count();
    // The faults after which the commit may really have applied (a dropped request never
    // does, though the client cannot tell it from a lost reply).
    let may_have_applied: Vec<&&Run> = unknown
        .iter()
        .filter(|run| run.met("reply_lost") || run.met("late"))
        .collect();
    let answered = |answer: Answer| may_have_applied.iter().filter(|run| run.answer == answer).count();
    println!(
        "  met a lost reply or a late commit (may have applied): {} transactions: {} answered committed, {} fenced, \
         {} outcome unknown",
        may_have_applied.len(),
        answered(Answer::Committed),
        answered(Answer::Fenced),
        answered(Answer::Ambiguous),
    );
    println!(
        "  seed {seed}; {} commit attempts: {} forwarded, {} reply lost, {} late ({late_applied} of them answered success \
         when they landed: applied, or a repeat under the token of an attempt that had), {} dropped; transactions meeting reply lost {}, late {}, dropped {}; {} had every attempt's \
         outcome hidden, decided by the settling write: {settled_committed} found committed, {} fenced; \
         answered in {answered_in:.1?}",
        intercepted.len(),
        attempts_by("forward"),
        attempts_by("reply_lost"),
        attempts_by("late"),
        attempts_by("drop"),
        unknown.iter().filter(|run| run.met("reply_lost")).count(),
        unknown.iter().filter(|run| run.met("late")).count(),
        unknown.iter().filter(|run| run.met("drop")).count(),
        every_attempt_hidden.len(),
        every_attempt_hidden
            .iter()
            .filter(|run| run.answer == Answer::Fenced)
            .count(),
    );
    let condition_failures = |replies: Vec<Result<outbox_tests::fault_proxy::Upstream, String>>, kind: &str| {
        let failed: Vec<_> = replies
            .into_iter()
            .flatten()
            .filter(|reply| reply.error_type.as_deref() == Some(kind))
            .collect();
        let with_item = failed.iter().filter(|reply| reply.body.contains("\"Item\"")).count();
        (failed.len(), with_item)
    };
    let (tombstones_blocked, tombstones_with_item) = condition_failures(
        proxy.replies("DynamoDB_20120810.PutItem"),
        "ConditionalCheckFailedException",
    );
    let (commits_cancelled, commits_with_item) = condition_failures(
        intercepted
            .iter()
            .filter_map(|attempt| attempt.upstream.clone())
            .collect(),
        "TransactionCanceledException",
    );
    println!(
        "  emulator: {tombstones_blocked} settling writes (PutItem) found a record, {tombstones_with_item} of them \
         returned it (ReturnValuesOnConditionCheckFailure ALL_OLD); {commits_cancelled} forwarded commits \
         ({TRANSACT_WRITE_ITEMS}) were cancelled, {commits_with_item} of them returned the blocking record"
    );

    assert!(
        unknown.len() * 2 > runs.len(),
        "most transactions should meet a hidden outcome: {}",
        unknown.len()
    );
    let undecided: Vec<String> = unknown
        .iter()
        .filter(|run| run.answer == Answer::Ambiguous)
        .map(|run| format!("{}: {:?}, attempts {:?}", run.txn_id, run.error, run.faults))
        .collect();
    assert!(
        undecided.is_empty(),
        "the settling write is never faulted, so every commit of unknown outcome should be decided:\n{}",
        undecided.join("\n")
    );
}
