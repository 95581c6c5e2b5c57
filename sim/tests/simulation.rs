//! The deterministic simulation: the real request and control paths on the embedded
//! backend, every interleaving and crash point for one transaction, and thousands of
//! seeded random schedules with several transactions, duplicate deliveries and clock
//! jumps. After each schedule the invariants I1 to I7 and the business state are checked.
//! Every schedule also checks the entities' chains (each committed message's place in its
//! entity's history) and, on the FIFO destination, that the first deliveries of an
//! entity's entity-form commits come in seq order.
//! At the end, message handlers: copies of one incoming message through a consumer, in
//! the transactional mode and in entity mode, checked against C1 to C5; and the in-order
//! consumer, the placed messages delivered in any order with a duplicate, each applied
//! once in chain order.
//!
//! Rerun one random schedule: `SIM_SEED=<seed> cargo test -p outbox-sim --test simulation -- --nocapture`.
//! Run more: `SIM_SCHEDULES=100000 cargo test ...`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox::request::{InlineDispatch, Settlement, TxnError};
use outbox_sim::{
    fence_split_faults, run_fence_split_schedule, run_schedule, run_split_schedule, sim_timing, ApiResult, ChainCounts,
    DepthFirst, Fault, FaultsDepthFirst, FenceSplitConfig, FenceSplitCounts, LateOps, LoopEnds, Op, Outcome, Seeded,
    SimConfig, SplitConfig, SplitCounts, UnknownCommits,
};

/// A coarse name for how a schedule's requests ended, to show the exploration reached
/// every kind of ending.
fn ending(outcome: &Outcome) -> &'static str {
    outcome.observed.api_results.first().map_or("no request", result_name)
}

fn result_name(result: &ApiResult) -> &'static str {
    match result {
        ApiResult::Answered(Ok(committed)) => match committed.inline {
            InlineDispatch::Dispatched => "committed, dispatched inline",
            InlineDispatch::LeftToWorker => "committed, left to the worker",
            InlineDispatch::AfterAnswer => "committed, publishing after the answer",
            _ => "committed",
        },
        ApiResult::Answered(Err(TxnError::DeadlineExceeded { .. })) => "deadline exceeded",
        ApiResult::Answered(Err(TxnError::NotCommitted { .. })) => "not committed",
        ApiResult::Answered(Err(TxnError::CommitWindowExpired { .. })) => "commit window expired",
        ApiResult::Answered(Err(TxnError::ControlSend { .. })) => "control send failed",
        ApiResult::Answered(Err(TxnError::Ambiguous { .. })) => "ambiguous",
        ApiResult::Answered(Err(TxnError::Fenced { .. })) => "fenced (unknown, settled by its tombstone)",
        ApiResult::Answered(Err(TxnError::Abandoned { .. })) => "a task's commit refused: abandoned before it began",
        ApiResult::Answered(Err(_)) => "other failure",
        ApiResult::Abandoned { settlement, .. } => match settlement {
            Settlement::NothingSent => "abandoned, nothing sent",
            Settlement::Tombstoned => "abandoned, tombstoned",
            Settlement::AlreadyTombstoned => "abandoned, already tombstoned",
            Settlement::LeftToWorker => "abandoned, left to the worker",
            Settlement::Committed(_) => "abandoned, found committed (a task's commit landed first)",
            _ => "abandoned, other",
        },
        ApiResult::Crashed => "api crashed",
        ApiResult::Http {
            status,
            unknown,
            timed_out,
            ..
        } => match (status, unknown, timed_out) {
            (200..=299, _, _) => "http: committed",
            (404, _, _) => "http: abandoned (404)",
            (_, true, true) => "http: the middleware answered outcome unknown",
            (_, false, true) => "http: the middleware answered nothing written",
            (_, true, false) => "http: the handler answered outcome unknown",
            (_, false, false) => "http: the handler answered a definite failure",
        },
    }
}

/// One transaction, one worker, one fault at most. A 3 s window: the first check at 1 s
/// defers once (2 s), the second tombstones.
fn one_transaction(inline: bool) -> SimConfig {
    SimConfig {
        transactions: 1,
        items: 1,
        workers: 1,
        fault_budget: 1,
        random_extras: false,
        max_steps: 1_000,
        timing: sim_timing(3),
        deadline: None,
        retry_loop: None,
        inline,
        abandon_every: 0,
        faults_only: None,
        middleware: None,
        entity: false,
        hold_commits: false,
        api_skews: &[],
        worker_skews: &[],
        aws_signatures: None,
        spawned_commits: false,
        after_answer: false,
        deletes: false,
        retention_jump: false,
        keyed: &[],
        preemption_bound: None,
        step_checks: false,
        vacant: false,
        sends_early: false,
        adds: false,
    }
}

/// One transaction, every interleaving and every crash point or fault (one per
/// schedule): the invariants and liveness hold in each. Returns how schedules ended.
fn explore_one_transaction(name: &str, inline: bool, sends_early: bool) -> BTreeMap<&'static str, usize> {
    let config = SimConfig {
        sends_early,
        ..one_transaction(inline)
    };
    let started = Instant::now();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut schedules, mut with_fault, mut tombstoned, mut redrives, mut longest) = (0, 0, 0, 0, 0);
    // SIM_CHOICES=0,0,4 starts at that schedule (and goes on in depth-first order).
    let mut prefix = Some(start_choices());
    while let Some(choices) = prefix {
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome =
            run_schedule(&mut chooser, &config).unwrap_or_else(|error| panic!("{name}: schedule {choices:?}: {error}"));
        if let Err(violation) = outcome.observed.check() {
            panic!(
                "{name}: schedule {choices:?}: {violation}\n{:#?}\nrerun it with SIM_CHOICES={}",
                outcome.observed,
                replay_arg(&choices)
            );
        }
        // Liveness: one fault costs at most a few redeliveries, so no control message
        // reaches the dead-letter queue and every schedule settles in a few steps.
        if outcome.redrives > 0 || outcome.steps >= 100 {
            panic!(
                "{name}: schedule {choices:?} took {} steps and {} dead-letter redrives to settle; rerun it with SIM_CHOICES={}",
                outcome.steps,
                outcome.redrives,
                replay_arg(&choices)
            );
        }
        schedules += 1;
        with_fault += usize::from(outcome.faults > 0);
        tombstoned += usize::from(!outcome.observed.tombstones.is_empty());
        redrives += outcome.redrives;
        longest = longest.max(outcome.steps);
        *endings.entry(ending(&outcome)).or_default() += 1;
        prefix = chooser.next_prefix();
    }
    println!(
        "{name}: {schedules} schedules of one transaction ({with_fault} with a fault, {tombstoned} ending in a tombstone, {redrives} redrives, longest {longest} steps) in {:.2?}; endings: {endings:?}",
        started.elapsed()
    );
    assert!(
        tombstoned > 0 && with_fault > schedules / 2,
        "{name}: the tree is too shallow: {schedules} schedules"
    );
    endings
}

fn assert_reached(endings: &BTreeMap<&str, usize>, expected: &[&str]) {
    for expected in expected {
        assert!(
            endings.get(expected).copied().unwrap_or(0) > 0,
            "no schedule ended with {expected:?}: {endings:?}"
        );
    }
}

/// One transaction, every interleaving with the worker and every crash point or fault:
/// its control message sent with the commit (the default), and sent before its read
/// ([`SimConfig::sends_early`], as a handler that will write for sure does).
#[test]
fn every_interleaving_and_crash_point_of_one_transaction_keeps_the_invariants() {
    for (name, sends_early) in [("exhaustive", false), ("exhaustive, sent early", true)] {
        let endings = explore_one_transaction(name, false, sends_early);
        // The exploration must really branch: every kind of ending is reached.
        assert_reached(
            &endings,
            &[
                "committed",
                "commit window expired",
                "control send failed",
                "api crashed",
            ],
        );
    }
}

/// One transaction that its request abandons after its read (a no-op, a 404): every
/// interleaving with the worker and every crash point or fault. Its control message goes
/// out with the commit, so nothing of it is ever sent: no control message in any schedule,
/// fault or not, and the abandon settles nothing. Sent before the read
/// ([`SimConfig::sends_early`]), the request path's tombstone write settles it (a fault on
/// it included): without a fault it costs one control message (no deferral). The
/// invariants hold in every schedule, the abandoned transaction never commits, and a
/// request told "tombstoned" left a tombstone.
#[test]
fn an_abandoned_transaction_is_settled_by_its_tombstone_at_every_crash_point() {
    for sends_early in [false, true] {
        let name = if sends_early { "abandon, sent early" } else { "abandon" };
        let config = SimConfig {
            abandon_every: 1,
            sends_early,
            ..one_transaction(false)
        };
        let started = Instant::now();
        let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
        let mut schedules = 0;
        // Control messages sent for the transaction: how many schedules sent each number,
        // without a fault and with one.
        let (mut clean, mut faulty): (BTreeMap<usize, usize>, BTreeMap<usize, usize>) = Default::default();
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = DepthFirst::new(choices.clone());
            let outcome = run_schedule(&mut chooser, &config)
                .unwrap_or_else(|error| panic!("{name}: schedule {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!("{name}: schedule {choices:?}: {violation}\n{:#?}", outcome.observed);
            }
            assert_eq!(outcome.redrives, 0, "{name}: schedule {choices:?} needed a redrive");
            let sent: usize = outcome.observed.control_sent.values().sum();
            let histogram = if outcome.faults == 0 { &mut clean } else { &mut faulty };
            *histogram.entry(sent).or_default() += 1;
            schedules += 1;
            *endings.entry(ending(&outcome)).or_default() += 1;
            prefix = chooser.next_prefix();
        }
        println!(
            "{name}: {schedules} schedules of one abandoned transaction in {:.2?}; control messages sent (number: schedules) without a fault {clean:?}, with one {faulty:?}; endings: {endings:?}",
            started.elapsed()
        );
        if !sends_early {
            // Nothing sent, whatever happens: the abandon has nothing to settle.
            assert!(
                clean.keys().chain(faulty.keys()).all(|sent| *sent == 0),
                "{clean:?} {faulty:?}"
            );
            assert_reached(&endings, &["abandoned, nothing sent", "api crashed"]);
            continue;
        }
        // The request-first order settles it at once: one control message. Only a handler
        // slower than the first check delay (the clock moved on before its tombstone)
        // costs one deferral more.
        assert_eq!(clean.first_key_value().map(|(sent, _)| *sent), Some(1), "{clean:?}");
        assert!(clean.keys().all(|sent| *sent <= 2), "{clean:?}");
        assert_reached(
            &endings,
            &[
                "abandoned, tombstoned",
                "abandoned, already tombstoned",
                "abandoned, left to the worker",
                "api crashed",
            ],
        );
    }
}

/// A commit that times out with its request still on the way, racing the tombstone its
/// request path writes to settle it (and the worker's): one transaction, faults only on
/// its commit, the late request's ghost interleaved with the request path and the worker.
/// By default every sequence of up to two commit faults (a late one, then another: the
/// commit's outcome stays unknown and the request path settles it) under the
/// request-first order and 60 seeded random orders; `SIM_LATE_EXHAUSTIVE=1` runs every
/// interleaving of one fault instead (about 330,000 schedules, 100 s).
#[test]
fn a_late_commit_racing_its_settlement_keeps_the_invariants() {
    let exhaustive = std::env::var("SIM_LATE_EXHAUSTIVE").is_ok_and(|value| value == "1");
    let config = SimConfig {
        fault_budget: if exhaustive { 1 } else { 2 },
        retry_loop: Some(Op::Commit),
        ..one_transaction(false)
    };
    let started = Instant::now();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unknown = UnknownCommits::default();
    let mut schedules = 0;
    let orders: Vec<Option<u64>> = if exhaustive {
        vec![None]
    } else {
        std::iter::once(None).chain((1..=60).map(Some)).collect()
    };
    for seed in orders {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let (outcome, next) = if exhaustive {
                let mut chooser = DepthFirst::new(choices.clone());
                (run_schedule(&mut chooser, &config), chooser.next_prefix())
            } else {
                let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
                (run_schedule(&mut chooser, &config), chooser.next_prefix())
            };
            let outcome =
                outcome.unwrap_or_else(|error| panic!("late commit, seed {seed:?}, choices {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!(
                    "late commit, seed {seed:?}, choices {choices:?}: {violation}\n{:#?}",
                    outcome.observed
                );
            }
            schedules += 1;
            unknown.add(&outcome.unknown_commits);
            *endings.entry(ending(&outcome)).or_default() += 1;
            prefix = next;
        }
    }
    let (definite, answered) = unknown.definite_share();
    println!(
        "late commit: {schedules} schedules in {:.2?}; requests with a commit of unknown outcome: {unknown:?}; {definite} of {answered} answered definitely; endings: {endings:?}",
        started.elapsed()
    );
    assert_reached(&endings, &["committed", "fenced (unknown, settled by its tombstone)"]);
    // Faults fall on the commit only, so the settling write always succeeds: every
    // request whose commit's outcome was unknown is answered definitely.
    assert_eq!(unknown.ambiguous, 0, "{unknown:?}");
    assert!(unknown.committed > 0 && unknown.definite_failure > 0, "{unknown:?}");
}

/// The same with inline publishing: the request path's publish and mark are steps of its
/// own, with a crash point and a fault before and after each (crash after the commit
/// before publishing, after publishing before marking), racing the worker's publish of
/// the same transaction. Every interleaving of the longer request path is too many
/// schedules for the test command (minutes), so every placement of one fault is run under
/// the request-first order and 40 seeded random interleavings.
#[test]
fn inline_publishing_keeps_the_invariants_at_every_crash_point() {
    let config = one_transaction(true);
    let started = Instant::now();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut schedules = 0;
    for seed in std::iter::once(None).chain((1..=40).map(Some)) {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
            let outcome = run_schedule(&mut chooser, &config)
                .unwrap_or_else(|error| panic!("inline, seed {seed:?}, faults {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!(
                    "inline, seed {seed:?}, faults {choices:?}: {violation}\n{:#?}",
                    outcome.observed
                );
            }
            assert_eq!(
                outcome.redrives, 0,
                "inline, seed {seed:?}, faults {choices:?} needed a redrive"
            );
            schedules += 1;
            *endings.entry(ending(&outcome)).or_default() += 1;
            prefix = chooser.next_prefix();
        }
    }
    println!(
        "inline publishing: {schedules} schedules (every fault placement, 41 orders) in {:.2?}; endings: {endings:?}",
        started.elapsed()
    );
    assert_reached(
        &endings,
        &[
            "committed, dispatched inline",
            "committed, left to the worker",
            "api crashed",
        ],
    );
}

/// Publishing after the answer: the commit returns at once and its dispatch runs as an
/// actor of its own, with every crash point and fault of its publish, mark (and, in
/// entity mode, record and removal), racing the worker: the process answered, then
/// crashed before or while dispatching, or the worker published first. Every placement
/// of one fault, under the request-first order and 40 random orders, in both forms.
#[test]
fn publishing_after_the_answer_keeps_the_invariants_at_every_crash_point() {
    for entity in [false, true] {
        let started = Instant::now();
        let mut config = SimConfig {
            after_answer: true,
            ..one_transaction(true)
        };
        if entity {
            config = in_entity_mode(config);
        }
        let name = if entity {
            "after the answer, entity mode"
        } else {
            "after the answer"
        };
        let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
        let mut runs = outbox_sim::AfterAnswerRuns::default();
        let outcomes = run_fault_sequences(name, &config, 40);
        for outcome in &outcomes {
            *endings.entry(ending(outcome)).or_default() += 1;
            runs.add(&outcome.after_answer);
        }
        println!(
            "{name}: {} schedules in {:.2?}; endings: {endings:?}; dispatches after the answer: {runs:?}",
            outcomes.len(),
            started.elapsed()
        );
        assert_reached(&endings, &["committed, publishing after the answer", "api crashed"]);
        // Answered, then the process died before anything went out: the worker's.
        assert!(runs.crashed_before_publishing > 0, "{runs:?}");
        assert!(runs.crashed > runs.crashed_before_publishing, "{runs:?}");
        assert!(
            runs.finished > 0 && runs.handed == runs.finished + runs.crashed,
            "{runs:?}"
        );
    }
}

/// Runs every fault sequence of `config` under the request-first order and `seeds`
/// seeded random orders, checking the invariants and that nothing needed a redrive.
fn run_fault_sequences(name: &str, config: &SimConfig, seeds: u64) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for seed in std::iter::once(None).chain((1..=seeds).map(Some)) {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
            let outcome = run_schedule(&mut chooser, config)
                .unwrap_or_else(|error| panic!("{name}, seed {seed:?}, faults {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!(
                    "{name}, seed {seed:?}, faults {choices:?}: {violation}\n{:#?}",
                    outcome.observed
                );
            }
            assert_eq!(
                outcome.redrives, 0,
                "{name}, seed {seed:?}, faults {choices:?} needed a dead-letter redrive"
            );
            outcomes.push(outcome);
            prefix = chooser.next_prefix();
        }
    }
    outcomes
}

/// Late operations other than commits: a tombstone put, a mark or a control message send
/// whose caller gave up on it (a timeout) while it was still on its way, and which
/// applies at a later step the scheduler picks, or is lost. Its caller saw a failure and
/// acted on it (tried again, left the transaction to the worker, failed the control
/// message). Four set-ups reach each kind: an abandoned transaction (the request path's
/// tombstone and the worker's), inline publishing (the request path's mark and the
/// worker's), a short window (the worker's deferrals and tombstone), and a late commit
/// whose settling tombstone is late too (the two ghosts race). Every sequence of up to
/// two late operations, under the request-first order and 20 random orders.
/// Faults of the late-operation runs: tombstones (and fences), marks (and records and
/// removals) and control sends go late, and their ghosts are lost on the way or applied.
fn late_only(op: Op) -> Vec<Fault> {
    match op {
        Op::Tombstone | Op::Mark | Op::ControlSend => vec![Fault::Late],
        // Lost on its way, or applied.
        Op::LateTombstone | Op::LateMark | Op::LateSend | Op::LateCommit => vec![Fault::Fail],
        _ => vec![],
    }
}

/// [`late_only`], and the commit itself late: its settling write races it.
fn commit_late_too(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::Late],
        _ => late_only(op),
    }
}

#[test]
fn late_tombstones_marks_and_control_sends_keep_the_invariants() {
    let started = Instant::now();
    let setups = [
        (
            "abandoned",
            late_only as fn(Op) -> Vec<Fault>,
            SimConfig {
                abandon_every: 1,
                ..one_transaction(false)
            },
        ),
        ("inline", late_only, one_transaction(true)),
        ("committed", late_only, one_transaction(false)),
        ("commit late", commit_late_too, one_transaction(false)),
    ];
    let mut late = LateOps::default();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut schedules = 0;
    for (name, faults, config) in setups {
        let config = SimConfig {
            fault_budget: 2,
            faults_only: Some(faults),
            ..config
        };
        for outcome in run_fault_sequences(name, &config, 20) {
            schedules += 1;
            late.add(&outcome.late);
            *endings.entry(ending(&outcome)).or_default() += 1;
        }
    }
    println!(
        "late operations: {schedules} schedules in {:.2?}; late (sent, applied): tombstones {:?}, marks {:?}, control sends {:?}; {} applied after their sender had ended; endings: {endings:?}",
        started.elapsed(),
        late.tombstones,
        late.marks,
        late.control_sends,
        late.applied_after_sender_ended,
    );
    for (kind, (sent, applied)) in [
        ("tombstone", late.tombstones),
        ("mark", late.marks),
        ("control send", late.control_sends),
    ] {
        assert!(
            applied > 0 && sent > applied,
            "late {kind}s: {sent} sent, {applied} applied"
        );
    }
    assert!(late.applied_after_sender_ended > 0, "{late:?}");
}

/// Section 1's interleaving, at the port: a commit attempt times out with its request
/// still on its way, the attempts after it are refused (contention, unavailable: errors
/// that alone would mean "nothing written"), the settling tombstone write fails too, and
/// the first request applies after the answer. The answer must be "outcome unknown".
/// Every sequence of those faults (up to every commit attempt and every settling write),
/// under the request-first order and 4 random orders.
#[test]
fn a_commit_in_flight_behind_refusals_and_a_failed_settlement_is_answered_unknown() {
    fn in_flight_then_refused(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::Late, Fault::Busy],
            Op::Tombstone => vec![Fault::Fail],
            _ => vec![],
        }
    }
    let started = Instant::now();
    let config = SimConfig {
        fault_budget: (outbox::request::COMMIT_ATTEMPTS + outbox::request::SETTLE_ATTEMPTS) as usize,
        faults_only: Some(in_flight_then_refused),
        // A long window: the commit's attempts run out before it ends.
        timing: sim_timing(60),
        ..one_transaction(false)
    };
    let mut late = LateOps::default();
    let mut unknown = UnknownCommits::default();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let outcomes = run_fault_sequences("in flight behind refusals", &config, 4);
    for outcome in &outcomes {
        late.add(&outcome.late);
        unknown.add(&outcome.unknown_commits);
        *endings.entry(ending(outcome)).or_default() += 1;
    }
    println!(
        "in flight behind refusals: {} schedules in {:.2?}; requests refused while an attempt was in flight: {}, whose settling write then failed: {}; late commits applied after the answer: {}; requests with a commit of unknown outcome: {unknown:?}; endings: {endings:?}",
        outcomes.len(),
        started.elapsed(),
        late.refused_behind_in_flight,
        late.settle_failed_in_flight,
        late.commit_applied_after_answer,
    );
    assert!(late.refused_behind_in_flight > 0, "{late:?}");
    assert!(late.settle_failed_in_flight > 0, "{late:?}");
    assert!(late.commit_applied_after_answer > 0, "{late:?}");
    assert!(unknown.ambiguous > 0, "{unknown:?}");
}

/// The deadline middleware under the simulated clock: requests go through an axum router
/// with `enforce_deadline` (a 2 s timeout), and timers fire when the clock passes them,
/// so the middleware's backstop and the request path's deadlines cut operations short.
/// The set-ups: every placement of one fault (a request that commits, one that abandons
/// with a 404 having sent nothing, and one that abandons after sending its control message
/// early, which the middleware settles), and every sequence of up to two faults on
/// the commit and the settling write (a commit applied or still on its way, a settling
/// write that fails). Each under the request-first order and 30 random orders, in which
/// the clock moves past the deadlines at random points. Every answer is checked: a
/// success only for a committed transaction, "nothing written" only for one that never
/// commits, and once a transaction's control message was sent, the answer names it.
#[test]
fn the_deadline_middleware_answers_truthfully_when_time_runs_out() {
    fn commit_and_settle(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::ReplyLost, Fault::Late, Fault::Busy],
            Op::Tombstone => vec![Fault::Fail],
            _ => vec![],
        }
    }
    let started = Instant::now();
    let over_http = |config: SimConfig| SimConfig {
        middleware: Some(Duration::from_secs(2)),
        ..config
    };
    let setups = [
        ("middleware, one fault", over_http(one_transaction(false))),
        (
            "middleware, abandoned",
            over_http(SimConfig {
                abandon_every: 1,
                ..one_transaction(false)
            }),
        ),
        (
            "middleware, abandoned after an early send",
            over_http(SimConfig {
                abandon_every: 1,
                sends_early: true,
                ..one_transaction(false)
            }),
        ),
        (
            "middleware, commit and settle faults",
            over_http(SimConfig {
                fault_budget: 2,
                faults_only: Some(commit_and_settle),
                timing: sim_timing(60),
                ..one_transaction(false)
            }),
        ),
    ];
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unknown = UnknownCommits::default();
    let mut schedules = 0;
    for (name, config) in setups {
        for outcome in run_fault_sequences(name, &config, 30) {
            schedules += 1;
            unknown.add(&outcome.unknown_commits);
            *endings.entry(ending(&outcome)).or_default() += 1;
        }
    }
    println!(
        "deadline middleware: {schedules} schedules in {:.2?}; answers: {endings:?}; requests with a commit of unknown outcome: {unknown:?}",
        started.elapsed()
    );
    assert_reached(
        &endings,
        &[
            "http: committed",
            "http: abandoned (404)",
            "http: the middleware answered nothing written",
            "http: the middleware answered outcome unknown",
        ],
    );
}

/// Split records (a main item and parts; over 350 KB, here over 1 KB) read and marked at
/// once, through the real `DynamoStore` and SDK client over an in-process DynamoDB double: two markers
/// (the worker's and the inline path's) and a reader, on two split records with a small
/// one between them. Every `BatchGetItem` and `BatchWriteItem` is a step the scheduler
/// orders; a `BatchWriteItem` may leave its first request unprocessed (a partial batch),
/// be refused, or crash its marker before or after it. Two sweeps, each under the
/// marker-first order and random ones: every sequence of up to two faults of any kind,
/// and every sequence of up to six partial batches (enough to exhaust the store's
/// retries of unprocessed items). Checked after every step: no main item names a missing
/// part; at the end: the reader read every record whole (a torn read is read again), a
/// record reported marked is dispatched, and a record reported failed had its own write
/// refused or left unprocessed, not a neighbour's.
#[test]
fn split_records_stay_whole_under_concurrent_marks_and_partial_batches() {
    let started = Instant::now();
    let sweeps = [
        (
            "any fault",
            SplitConfig {
                markers: 2,
                readers: 1,
                fault_budget: 2,
                faults: vec![
                    Fault::FirstEntryFails,
                    Fault::Fail,
                    Fault::CrashBefore,
                    Fault::CrashAfter,
                ],
            },
            3,
        ),
        (
            "partial batches",
            SplitConfig {
                markers: 2,
                readers: 1,
                fault_budget: 6,
                faults: vec![Fault::FirstEntryFails],
            },
            1,
        ),
    ];
    let mut counts = SplitCounts::default();
    let (mut schedules, mut with_fault) = (0, 0);
    for (name, config, random_orders) in &sweeps {
        for seed in std::iter::once(None).chain((1..=*random_orders).map(Some)) {
            let mut prefix = Some(Vec::new());
            while let Some(choices) = prefix {
                let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
                let outcome = run_split_schedule(&mut chooser, config).unwrap_or_else(|error| {
                    panic!("split records, {name}, seed {seed:?}, faults {choices:?}: {error}")
                });
                schedules += 1;
                with_fault += usize::from(outcome.faults > 0);
                counts.add(&outcome.counts);
                prefix = chooser.next_prefix();
            }
        }
    }
    println!(
        "split records: {schedules} schedules ({with_fault} with a fault) in {:.2?}: {counts:?}",
        started.elapsed()
    );
    assert!(counts.torn_reads > 0, "no read was torn: {counts:?}");
    assert!(counts.partial_batches > 0 && counts.exhausted > 0, "{counts:?}");
    assert!(counts.refused_batches > 0 && counts.crashed_markers > 0, "{counts:?}");
    assert!(counts.orphaned_parts > 0, "{counts:?}");
}

/// The entity mode's fence meeting a commit of a split record, on the real DynamoDB
/// adapter ([`run_fence_split_schedule`]): a request begun in entity mode whose messages
/// do not fit its item falls back to the transactional form (the counter's update, the
/// main record and its parts in one `TransactWriteItems`), racing the control path's check
/// past the window, which fences T (its tombstone and the counter's fence mark in one
/// `TransactWriteItems`) unless it finds T's record first. The real request path, control
/// path and `DynamoStore`, through the real SDK client, over a double of DynamoDB's wire
/// protocol that evaluates every condition and returns `ALL_OLD` items in cancellation
/// reasons.
///
/// Explored exhaustively, depth-first: every interleaving of every wire call and publish
/// of the request and one worker, with at most one fault: any write of the request timed
/// out with the request on its way (applied later, at any step, by a ghost) or applied
/// with its reply lost, the fence applied with its reply lost, the worker crashing before
/// a mark (recovery delivers its control message again). Checked in each: if T committed,
/// every message of every part went out as committed before its record was marked
/// dispatched; if the fence won, nothing of T went out or committed later; the request's
/// answer is true. A fence that took the main item its cancellation reason returns for
/// the whole record (publishing part 0's messages, then marking the record) fails this at
/// once, with no fault: the commit lands between the worker's read and its fence.
/// `SIM_FENCE_SPLIT_WORKERS=2` (a duplicate control message handled at once),
/// `SIM_FENCE_SPLIT_FAULTS=2` and `SIM_PREEMPTIONS` (no bound unless set) deepen it by
/// hand; `SIM_CHOICES` starts at a schedule, as a violation's replay line says.
#[test]
fn a_fence_meeting_a_commit_of_a_split_record_on_dynamodb_publishes_all_of_it_or_nothing_at_every_interleaving() {
    let env = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |n| n.parse().unwrap_or_else(|_| panic!("{name} is a number")))
    };
    let config = FenceSplitConfig {
        workers: env("SIM_FENCE_SPLIT_WORKERS", 1),
        messages: 3,
        fault_budget: env("SIM_FENCE_SPLIT_FAULTS", 1),
        faults: fence_split_faults,
        preemption_bound: std::env::var("SIM_PREEMPTIONS").ok().map(|_| preemptions()),
    };
    let knobs = format!(
        "SIM_FENCE_SPLIT_WORKERS={} SIM_FENCE_SPLIT_FAULTS={}{}",
        config.workers,
        config.fault_budget,
        config
            .preemption_bound
            .map_or_else(String::new, |bound| format!(" SIM_PREEMPTIONS={bound}"))
    );
    let started = Instant::now();
    let mut counts = FenceSplitCounts::default();
    let (mut schedules, mut with_fault, mut longest) = (0, 0, 0);
    let mut answers: BTreeMap<&str, usize> = BTreeMap::new();
    let mut workers: BTreeMap<&str, usize> = BTreeMap::new();
    let mut prefix = Some(start_choices());
    let mut reported = Instant::now();
    while let Some(choices) = prefix {
        if reported.elapsed() >= Duration::from_secs(60) {
            reported = Instant::now();
            eprintln!(
                "fence meeting a split record ({knobs}): {schedules} schedules in {:.0?} so far; at SIM_CHOICES={}",
                started.elapsed(),
                replay_arg(&choices)
            );
        }
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_fence_split_schedule(&mut chooser, &config).unwrap_or_else(|error| {
            panic!(
                "fence meeting a split record: schedule {choices:?}: {error}\nrerun it with {knobs} SIM_CHOICES={} cargo nextest run -p outbox-sim --test simulation -E 'test(a_fence_meeting_a_commit_of_a_split_record)'",
                replay_arg(&choices)
            )
        });
        schedules += 1;
        with_fault += usize::from(outcome.faults > 0);
        longest = longest.max(outcome.steps);
        counts.add(&outcome.counts);
        *answers.entry(outcome.answer).or_default() += 1;
        for worker in &outcome.workers {
            *workers.entry(worker).or_default() += 1;
        }
        prefix = chooser.next_prefix();
    }
    println!(
        "fence meeting a split record on DynamoDB ({knobs}): {schedules} schedules ({with_fault} with a fault, longest {longest} steps) in {:.2?}; T committed in {}, fenced in {}; fences cancelled by T's split record {}, commits refused by the fence {}, late writes that reached the table {} (commits applied {}), repeats answered under the token {}, entity forms refused for size {}, redeliveries {}; answers: {answers:?}; workers: {workers:?}",
        started.elapsed(),
        counts.committed,
        counts.fenced,
        counts.fence_met_split_record,
        counts.commits_refused_by_fence,
        counts.late_commits.0,
        counts.late_commits.1,
        counts.token_repeats,
        counts.entity_form_too_large,
        counts.redeliveries,
    );
    if replaying() {
        return;
    }
    // The race really runs both ways, and the fence meets the split record.
    assert!(counts.committed > 0 && counts.fenced > 0, "{counts:?}");
    assert!(counts.fence_met_split_record > 0, "{counts:?}");
    assert!(counts.commits_refused_by_fence > 0, "{counts:?}");
    if config.fault_budget > 0 {
        assert!(counts.late_commits.1 > 0 && counts.token_repeats > 0, "{counts:?}");
        assert!(counts.redeliveries > 0, "{counts:?}");
    }
}

/// The chain counts as one line: transactions placed, who published them first, and the
/// attempts the continued version refused.
fn chains_line(name: &str, schedules: usize, chains: &ChainCounts) -> String {
    format!(
        "chains, {name}: {schedules} schedules; {} committed transactions placed in their entity's history ({} in entity form, {} in the transactional form; their FIFO first deliveries checked in seq order); predecessors sent first by a later transaction's publisher {}; first published by a control worker {}; attempts of committed transactions refused by the continued version {}",
        chains.placed,
        chains.entity_form,
        chains.placed - chains.entity_form,
        chains.predecessor_first,
        chains.first_by_worker,
        chains.refused_by_version,
    )
}

/// Where a depth-first exploration starts: `SIM_CHOICES=0,0,4` starts at that schedule
/// (and goes on in depth-first order); the first schedule otherwise.
fn start_choices() -> Vec<usize> {
    std::env::var("SIM_CHOICES").map_or_else(|_| Vec::new(), |text| parse_choices(&text))
}

/// Whether an exploration was started midway (`SIM_CHOICES`), to replay a schedule.
fn replaying() -> bool {
    std::env::var("SIM_CHOICES").is_ok()
}

/// The preemption bound of the bounded explorations: `SIM_PREEMPTIONS`, 2 unless set.
fn preemptions() -> usize {
    std::env::var("SIM_PREEMPTIONS").map_or(2, |n| n.parse().expect("SIM_PREEMPTIONS is a number"))
}

fn replay_arg(choices: &[usize]) -> String {
    choices.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

fn parse_choices(text: &str) -> Vec<usize> {
    let parse = |part: &str| {
        part.trim()
            .parse()
            .expect("SIM_CHOICES is a comma-separated list of numbers")
    };
    text.split(',')
        .filter(|part| !part.trim().is_empty())
        .map(parse)
        .collect()
}

/// The configuration of random schedule `seed`: 2 to 4 transactions on 1 or 2 items,
/// 2 workers, up to 4 faults.
fn random_config(seed: u64) -> SimConfig {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    SimConfig {
        transactions: rng.usize(2..=4),
        items: rng.usize(1..=2),
        workers: 2,
        fault_budget: rng.usize(0..=4),
        random_extras: true,
        max_steps: 5_000,
        timing: sim_timing(10),
        // Half the requests have a deadline that clock jumps can overtake.
        deadline: rng.bool().then(|| Duration::from_secs(2)),
        retry_loop: None,
        // Half the schedules publish inline, racing the workers.
        inline: rng.bool(),
        // A third abandon none, a third every second request, a third every third.
        abandon_every: [0, 2, 3][rng.usize(0..3)],
        faults_only: None,
        middleware: None,
        // A third in entity mode (its requests without an idempotency key commit as one
        // conditional write of their counter).
        entity: rng.usize(0..3) == 0,
        hold_commits: false,
        api_skews: &[],
        worker_skews: &[],
        aws_signatures: None,
        // A third hand their abandoned transactions to tasks that commit them.
        spawned_commits: rng.usize(0..3) == 0,
        // Half of those publishing inline do it after the answer.
        after_answer: rng.bool(),
        deletes: false,
        retention_jump: false,
        keyed: &[],
        preemption_bound: None,
        step_checks: false,
        vacant: false,
        // Half send their control message before their read (drawn last, so that the
        // draws above stay as they were for every seed).
        sends_early: rng.bool(),
        adds: false,
    }
}

/// [`run_schedule`], a panic inside it (the library's, or the simulation's) an error, so
/// that the seed that reached it is named.
fn run_caught(chooser: &mut Seeded, config: &SimConfig) -> Result<Outcome, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_schedule(chooser, config))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_default();
        Err(format!("the schedule panicked: {message}"))
    })
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let config = random_config(seed);
    let mut chooser = Seeded::new(seed, 8);
    let outcome = run_caught(&mut chooser, &config)?;
    outcome
        .observed
        .check()
        .map_err(|violation| format!("{violation}\n{:#?}", outcome.observed))?;
    Ok(outcome)
}

#[test]
fn thousands_of_random_schedules_keep_the_invariants() {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        let seed: u64 = seed.parse().expect("SIM_SEED is a number");
        let outcome = run_seed(seed).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        println!(
            "seed {seed}: {:?}, {} steps, {} faults",
            random_config(seed),
            outcome.steps,
            outcome.faults
        );
        return;
    }
    let count: u64 = std::env::var("SIM_SCHEDULES")
        .map(|n| n.parse().expect("SIM_SCHEDULES is a number"))
        .unwrap_or(10_000);
    let started = Instant::now();
    let (mut faults, mut commits, mut tombstones, mut steps) = (0, 0, 0, 0);
    let mut deadline_endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut inline_endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unknown = UnknownCommits::default();
    let mut late = LateOps::default();
    let mut entity = EntityTally::default();
    let mut chains = ChainCounts::default();
    for seed in 0..count {
        let outcome = run_seed(seed).unwrap_or_else(|error| {
            panic!("seed {seed}: {error}\nrerun it with SIM_SEED={seed} cargo test -p outbox-sim --test simulation -- --nocapture")
        });
        faults += outcome.faults;
        unknown.add(&outcome.unknown_commits);
        if random_config(seed).inline {
            for result in &outcome.observed.api_results {
                *inline_endings.entry(result_name(result)).or_default() += 1;
            }
        }
        if random_config(seed).deadline.is_some() {
            for result in &outcome.observed.api_results {
                *deadline_endings.entry(result_name(result)).or_default() += 1;
            }
        }
        late.add(&outcome.late);
        chains.add(&outcome.chains);
        if random_config(seed).entity {
            entity.add(&outcome);
        }
        commits += outcome.observed.commits.len();
        tombstones += outcome.observed.tombstones.len();
        steps += outcome.steps;
    }
    let (definite, answered) = unknown.definite_share();
    println!(
        "random: {count} schedules ({commits} commits, {tombstones} tombstones, {faults} faults, {steps} steps) in {:.2?}; requests with a deadline ended: {deadline_endings:?}; requests publishing inline ended: {inline_endings:?}; requests with a commit of unknown outcome: {unknown:?}, {definite} of {answered} answered before their deadline answered definitely (the rest: the settling write itself met a fault); late (sent, applied): tombstones {:?}, marks {:?}, control sends {:?}",
        started.elapsed(),
        late.tombstones,
        late.marks,
        late.control_sends,
    );
    entity.print("random schedules", started);
    println!("{}", chains_line("random schedules", count as usize, &chains));
    assert!(
        count < 100 || (commits > 0 && tombstones > 0 && faults > 0),
        "the random schedules never reached some path"
    );
    assert!(
        count < 100 || (chains.predecessor_first > 0 && chains.first_by_worker > 0),
        "the random schedules never reached some path of the chains: {chains:?}"
    );
    assert!(
        count < 100
            || (entity.entity_commits > 0
                && entity.transactional_commits > 0
                && entity.entries_removed > 0
                && entity.fences > 0),
        "the random schedules in entity mode never reached some path: {entity:?}"
    );
}

#[test]
fn every_retry_loop_is_run_to_its_end_and_its_answer_stays_truthful() {
    // Faults on one loop's operation only (the commit, the publish, or the request path's
    // settling tombstone write), enough of them to fail every attempt of a commit (3), of
    // a publish entry (3) or of the settling write (3). Every fault
    // sequence is run in the order that lets the request go first, then under seeded
    // random interleavings, half of them with a request deadline, rather than under
    // every interleaving (millions of schedules).
    let seeds: u64 = std::env::var("SIM_LOOP_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let started = Instant::now();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ends = LoopEnds::default();
    let mut unknown = UnknownCommits::default();
    let (mut schedules, mut reached) = (0, 0);
    for (seed, op) in (0..seeds).flat_map(|seed| [(seed, Op::Commit), (seed, Op::Publish), (seed, Op::Tombstone)]) {
        let config = SimConfig {
            transactions: 1,
            items: 1,
            workers: 1,
            fault_budget: outbox::request::COMMIT_ATTEMPTS as usize,
            random_extras: false,
            max_steps: 1_000,
            // Mostly a long window, so that the clock moving on to control messages
            // ends fewer loops early; every fourth seed a short one that ends more.
            timing: sim_timing(if seed % 4 == 1 { 3 } else { 60 }),
            deadline: (seed % 2 == 1).then(|| Duration::from_secs(2)),
            retry_loop: Some(op),
            inline: false,
            // The settling write's loop is reached by a request that abandons after its
            // control message was sent (one never sent has nothing to settle).
            abandon_every: usize::from(op == Op::Tombstone),
            faults_only: None,
            middleware: None,
            entity: false,
            hold_commits: false,
            api_skews: &[],
            worker_skews: &[],
            aws_signatures: None,
            spawned_commits: false,
            after_answer: false,
            deletes: false,
            retention_jump: false,
            keyed: &[],
            preemption_bound: None,
            step_checks: false,
            vacant: false,
            sends_early: op == Op::Tombstone,
            adds: false,
        };
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), (seed > 0).then_some(seed));
            let outcome = run_schedule(&mut chooser, &config)
                .unwrap_or_else(|error| panic!("{op:?} loop, seed {seed}, faults {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!(
                    "{op:?} loop, seed {seed}, faults {choices:?}: {violation}\n{:#?}",
                    outcome.observed
                );
            }
            assert_eq!(
                outcome.redrives, 0,
                "{op:?} loop, seed {seed}, faults {choices:?} needed a dead-letter redrive"
            );
            schedules += 1;
            reached += usize::from(outcome.loop_ends != LoopEnds::default());
            ends.add(&outcome.loop_ends);
            unknown.add(&outcome.unknown_commits);
            for result in &outcome.observed.api_results {
                *endings.entry(result_name(result)).or_default() += 1;
            }
            prefix = chooser.next_prefix();
        }
    }
    let (definite, answered) = unknown.definite_share();
    println!(
        "retry loops: {schedules} schedules ({seeds} seeds) in {:.2?}, {reached} ran a loop to its end: {ends:?}; endings: {endings:?}; requests with a commit of unknown outcome: {unknown:?}, {definite} of {answered} answered before their deadline answered definitely",
        started.elapsed()
    );
    // Commits meet an unknown outcome only in the commit's loop, where the settling write
    // meets no fault: only a deadline already passed (the clock moved on past it) leaves
    // an outcome unknown.
    assert_eq!(unknown.ambiguous, 0, "{unknown:?}");
    assert!(ends.commit_all_unknown > 0, "{ends:?}");
    assert!(ends.commit_all_refused > 0, "{ends:?}");
    assert!(ends.commit_unknown_then_refused > 0, "{ends:?}");
    assert!(ends.publish_exhausted > 0, "{ends:?}");
    assert!(ends.settle_exhausted > 0, "{ends:?}");
}

/// What the request-path schedules in entity mode reached, summed.
#[derive(Debug, Default)]
struct EntityTally {
    schedules: usize,
    with_fault: usize,
    /// Commits that were one conditional write of the counter, and those in the
    /// transactional form (a request that kept its idempotency key).
    entity_commits: usize,
    transactional_commits: usize,
    /// Committed entries removed from their counter after dispatch.
    entries_removed: usize,
    /// Fences written (the item's mark raised or checked, with the tombstone record).
    fences: usize,
    /// Entries settled into a sent mark (one write), among `entries_removed`.
    settled: usize,
    /// Entries settled into their records instead, their counter full of marks (two
    /// writes), among `entries_removed`.
    settled_into_records: usize,
    /// Sent marks dropped past their time.
    marks_forgotten: usize,
    /// Status reads at the end, by what they said.
    statuses: BTreeMap<&'static str, usize>,
    /// Transactions tombstoned (a fence's record, or a tombstone without a fence).
    tombstones: usize,
    late: LateOps,
    unknown: UnknownCommits,
    loop_ends: LoopEnds,
    endings: BTreeMap<&'static str, usize>,
    chains: ChainCounts,
}

impl EntityTally {
    fn add(&mut self, outcome: &Outcome) {
        let observed = &outcome.observed;
        self.schedules += 1;
        self.with_fault += usize::from(outcome.faults > 0);
        self.entity_commits += observed.entity_commits;
        // The seed's commit of each counter is in the transactional form.
        let seeds = observed.items.len();
        self.transactional_commits += observed.commits.len() - observed.entity_commits - seeds;
        self.entries_removed += observed.entries_removed;
        self.fences += observed.fences;
        self.settled += observed.settled;
        self.settled_into_records += observed.entries_removed - observed.settled;
        self.marks_forgotten += observed.marks_forgotten;
        for status in observed.statuses.values() {
            *self.statuses.entry(status.as_str()).or_default() += 1;
        }
        self.tombstones += observed.tombstones.len();
        self.late.add(&outcome.late);
        self.chains.add(&outcome.chains);
        self.unknown.add(&outcome.unknown_commits);
        self.loop_ends.add(&outcome.loop_ends);
        for result in &observed.api_results {
            *self.endings.entry(result_name(result)).or_default() += 1;
        }
    }

    fn print(&self, name: &str, started: Instant) {
        println!(
            "entity mode, {name}: {} schedules ({} with a fault) in {:.2?}; commits: {} one conditional write, {} transactional; entries removed after dispatch {} ({} settled into a sent mark, {} into their record, the counter full); sent marks dropped past their time {}; status reads at the end {:?}; fences written {}; tombstoned {}; late (sent, applied): commits {:?}, fences and tombstones {:?}, records and removals {:?}, control sends {:?}, {} applied after their sender had ended; commits refused by the fence mark {}; commits of unknown outcome: {:?}; retry loops run to their end: {:?}; endings: {:?}",
            self.schedules,
            self.with_fault,
            started.elapsed(),
            self.entity_commits,
            self.transactional_commits,
            self.entries_removed,
            self.settled,
            self.settled_into_records,
            self.marks_forgotten,
            self.statuses,
            self.fences,
            self.tombstones,
            self.late.commits,
            self.late.tombstones,
            self.late.marks,
            self.late.control_sends,
            self.late.applied_after_sender_ended,
            self.late.fence_refused,
            self.unknown,
            self.loop_ends,
            self.endings,
        );
        println!(
            "{}",
            chains_line(&format!("entity mode, {name}"), self.schedules, &self.chains)
        );
    }
}

/// `config` in entity mode: its counters exist, and each request begins naming its
/// counter, so that its increment commits as one conditional write of the counter.
fn in_entity_mode(config: SimConfig) -> SimConfig {
    SimConfig { entity: true, ..config }
}

/// The request path in entity mode (docs/PROTOCOL.md section 11), one transaction: every crash
/// point or fault, one per schedule, of its begin, its read, its one conditional write,
/// and of the worker's record read, entity read, publish, dispatched record, entry
/// removal and fence (past a 3 s window: the API crashed or failed before committing);
/// each under the request-first order and 100 random orders, and once more with the
/// commit held at its gate until the workers and the clock are done: signed within its
/// window, it reaches the table after the fence, whenever the scheduler lets it (AWS's
/// refusal of old signatures is not modelled: the fence mark alone refuses it). I1-I7 and
/// the entity checks (no entry left behind, none removed before its record) hold in each,
/// with no dead-letter redrive.
#[test]
fn entity_mode_every_crash_point_of_one_transaction_keeps_the_invariants() {
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let setups = [
        ("one transaction", in_entity_mode(one_transaction(false)), 100),
        (
            "one transaction, commits held",
            SimConfig {
                hold_commits: true,
                ..in_entity_mode(one_transaction(false))
            },
            10,
        ),
    ];
    for (name, config, seeds) in setups {
        let mut held = EntityTally::default();
        for outcome in run_fault_sequences(name, &config, seeds) {
            tally.add(&outcome);
            held.add(&outcome);
        }
        if config.hold_commits {
            // Every commit held past the fence is refused by the mark, and its request told so.
            held.print(name, started);
            assert!(held.late.fence_refused > 0, "{held:?}");
            assert_eq!(held.entity_commits, 0, "{held:?}");
            assert_reached(&held.endings, &["commit window expired"]);
        }
    }
    tally.print("one transaction, every fault placement", started);
    assert_reached(
        &tally.endings,
        &[
            "committed",
            "commit window expired",
            "control send failed",
            "api crashed",
        ],
    );
    assert!(tally.with_fault > tally.schedules / 2, "{tally:?}");
    assert!(
        tally.entity_commits > 0 && tally.transactional_commits == 0,
        "{tally:?}"
    );
    assert!(tally.entries_removed > 0 && tally.fences > 0, "{tally:?}");
    assert!(tally.late.fence_refused > 0, "{tally:?}");
}

/// Entity mode with inline publishing: the request path publishes, puts the record
/// dispatched and removes the entry itself, each step with its crash points and faults,
/// racing the worker that finds the entry (or the record beside an entry left behind).
/// Every placement of one fault, under the request-first order and 40 random orders.
#[test]
fn entity_mode_inline_publishing_keeps_the_invariants_at_every_crash_point() {
    let started = Instant::now();
    let mut tally = EntityTally::default();
    for outcome in run_fault_sequences("entity mode, inline", &in_entity_mode(one_transaction(true)), 40) {
        tally.add(&outcome);
    }
    tally.print("inline publishing", started);
    assert_reached(
        &tally.endings,
        &[
            "committed, dispatched inline",
            "committed, left to the worker",
            "api crashed",
        ],
    );
    assert!(tally.entries_removed > 0, "{tally:?}");
}

/// Entity mode, settling: an abandoned transaction (nothing to settle when nothing of it
/// was sent; sent early, its tombstone record, no fence), and a commit whose attempts
/// time out with their requests on the way (late ghosts of the one conditional write)
/// racing the fence the request path writes into the counter to settle it, and the
/// worker's. Every sequence of up to two faults on the commit, and every placement of one
/// fault for the abandons, under the request-first order and 40 random orders. A request
/// told "fenced" never committed; one told "committed" did.
#[test]
fn entity_mode_a_late_commit_racing_its_fence_keeps_the_invariants() {
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let setups = [
        (
            "late commit",
            SimConfig {
                fault_budget: 2,
                retry_loop: Some(Op::Commit),
                ..in_entity_mode(one_transaction(false))
            },
        ),
        (
            "abandoned",
            SimConfig {
                abandon_every: 1,
                ..in_entity_mode(one_transaction(false))
            },
        ),
        (
            "abandoned after an early send",
            SimConfig {
                abandon_every: 1,
                sends_early: true,
                ..in_entity_mode(one_transaction(false))
            },
        ),
    ];
    for (name, config) in setups {
        for outcome in run_fault_sequences(name, &config, 40) {
            tally.add(&outcome);
        }
    }
    tally.print("late commits and abandons", started);
    assert_reached(
        &tally.endings,
        &[
            "committed",
            "fenced (unknown, settled by its tombstone)",
            "abandoned, nothing sent",
            "abandoned, tombstoned",
            "abandoned, already tombstoned",
        ],
    );
    assert!(tally.late.commits.1 > 0, "{tally:?}");
    assert!(tally.late.commit_applied_after_answer > 0, "{tally:?}");
    assert!(tally.fences > 0, "{tally:?}");
    assert_eq!(tally.unknown.ambiguous, 0, "{tally:?}");
    assert!(
        tally.unknown.committed > 0 && tally.unknown.definite_failure > 0,
        "{tally:?}"
    );
}

/// Entity mode, late writes other than commits: a fence (the worker's past the window, or
/// the request path's settling one), a dispatched record, an entry's removal or a control
/// send whose caller gave up on it while it was on its way, applied at a later step or
/// lost. Every sequence of up to two late operations in four set-ups (committed, inline,
/// a commit late too, an API that never commits so that the worker fences), under the
/// request-first order and 20 random orders.
#[test]
fn entity_mode_late_fences_records_and_removals_keep_the_invariants() {
    fn commit_fails(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::CrashBefore],
            _ => late_only(op),
        }
    }
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let setups = [
        ("committed", late_only as fn(Op) -> Vec<Fault>, one_transaction(false)),
        ("inline", late_only, one_transaction(true)),
        ("commit late", commit_late_too, one_transaction(false)),
        ("inline, commit late", commit_late_too, one_transaction(true)),
        ("never committed", commit_fails, one_transaction(false)),
    ];
    for (name, faults, config) in setups {
        let config = SimConfig {
            fault_budget: 2,
            faults_only: Some(faults),
            ..in_entity_mode(config)
        };
        for outcome in run_fault_sequences(name, &config, 20) {
            tally.add(&outcome);
        }
    }
    tally.print("late fences, records and removals", started);
    for (kind, (sent, applied)) in [
        ("fence or tombstone", tally.late.tombstones),
        ("record or removal", tally.late.marks),
        ("control send", tally.late.control_sends),
    ] {
        assert!(
            applied > 0 && sent > applied,
            "late {kind}s: {sent} sent, {applied} applied"
        );
    }
    assert!(tally.late.applied_after_sender_ended > 0, "{tally:?}");
    assert!(tally.fences > 0, "{tally:?}");
}

/// Entity mode, every retry loop run to its end: the one conditional write's (every
/// attempt unknown, refused, or a mix: the request path then fences the counter), the
/// publish's, and the settling write's; a third of the seeds with a deadline. Seeded
/// orders of every fault sequence, as for the transactional form.
#[test]
fn entity_mode_every_retry_loop_is_run_to_its_end_and_its_answer_stays_truthful() {
    let seeds: u64 = std::env::var("SIM_LOOP_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let started = Instant::now();
    let mut tally = EntityTally::default();
    for (seed, op) in (0..seeds).flat_map(|seed| [(seed, Op::Commit), (seed, Op::Publish), (seed, Op::Tombstone)]) {
        let config = SimConfig {
            fault_budget: outbox::request::COMMIT_ATTEMPTS as usize,
            timing: sim_timing(if seed % 4 == 1 { 3 } else { 60 }),
            deadline: (seed % 3 == 1).then(|| Duration::from_secs(2)),
            retry_loop: Some(op),
            inline: op == Op::Publish,
            abandon_every: usize::from(op == Op::Tombstone),
            sends_early: op == Op::Tombstone,
            ..in_entity_mode(one_transaction(false))
        };
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), (seed > 0).then_some(seed));
            let outcome = run_schedule(&mut chooser, &config)
                .unwrap_or_else(|error| panic!("entity {op:?} loop, seed {seed}, faults {choices:?}: {error}"));
            if let Err(violation) = outcome.observed.check() {
                panic!(
                    "entity {op:?} loop, seed {seed}, faults {choices:?}: {violation}\n{:#?}",
                    outcome.observed
                );
            }
            assert_eq!(
                outcome.redrives, 0,
                "entity {op:?} loop, seed {seed}, faults {choices:?}"
            );
            tally.add(&outcome);
            prefix = chooser.next_prefix();
        }
    }
    tally.print("retry loops", started);
    let ends = &tally.loop_ends;
    assert!(ends.commit_all_unknown > 0, "{ends:?}");
    assert!(ends.commit_all_refused > 0, "{ends:?}");
    assert!(ends.commit_unknown_then_refused > 0, "{ends:?}");
    assert!(ends.publish_exhausted > 0, "{ends:?}");
    assert!(ends.settle_exhausted > 0, "{ends:?}");
    assert_eq!(tally.unknown.ambiguous, 0, "{tally:?}");
}

/// Entity mode through the deadline middleware (a 2 s timeout, timers firing): a request
/// that commits, one that abandons with a 404, and faults on the one conditional write and
/// on the settling fence; every answer names its transaction and tells the truth.
#[test]
fn entity_mode_the_deadline_middleware_answers_truthfully() {
    fn commit_and_settle(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::ReplyLost, Fault::Late, Fault::Busy],
            Op::Tombstone => vec![Fault::Fail],
            _ => vec![],
        }
    }
    let started = Instant::now();
    let over_http = |config: SimConfig| SimConfig {
        middleware: Some(Duration::from_secs(2)),
        ..in_entity_mode(config)
    };
    let setups = [
        ("one fault", over_http(one_transaction(false))),
        (
            "abandoned",
            over_http(SimConfig {
                abandon_every: 1,
                ..one_transaction(false)
            }),
        ),
        (
            "abandoned after an early send",
            over_http(SimConfig {
                abandon_every: 1,
                sends_early: true,
                ..one_transaction(false)
            }),
        ),
        (
            "commit and settle faults",
            over_http(SimConfig {
                fault_budget: 2,
                faults_only: Some(commit_and_settle),
                timing: sim_timing(60),
                ..one_transaction(false)
            }),
        ),
    ];
    let mut tally = EntityTally::default();
    for (name, config) in setups {
        for outcome in run_fault_sequences(name, &config, 20) {
            tally.add(&outcome);
        }
    }
    tally.print("deadline middleware", started);
    assert_reached(
        &tally.endings,
        &[
            "http: committed",
            "http: abandoned (404)",
            "http: the middleware answered nothing written",
            "http: the middleware answered outcome unknown",
        ],
    );
    assert!(tally.fences > 0, "{tally:?}");
}

use outbox_sim::{consumer_faults, run_consumer_schedule, ConsumerCounts, ConsumerOutcome, ConsumerSimConfig};

/// Every schedule of `config` (its seeds: every interleaving with `None`, else every
/// sequence of faults under each seed's orders), each checked by the run itself; `name`
/// tells a failure apart.
fn consumer_sweep(name: &str, config: &ConsumerSimConfig, seeds: Option<u64>) -> Vec<ConsumerOutcome> {
    let orders: Vec<Option<u64>> = match seeds {
        None => vec![None],
        Some(seeds) => (0..seeds).map(Some).collect(),
    };
    let mut outcomes = Vec::new();
    for seed in orders {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let (outcome, next) = match seed {
                None => {
                    let mut chooser = DepthFirst::new(choices.clone());
                    (run_consumer_schedule(&mut chooser, config), chooser.next_prefix())
                }
                Some(seed) => {
                    let mut chooser = FaultsDepthFirst::new(choices.clone(), Some(seed));
                    (run_consumer_schedule(&mut chooser, config), chooser.next_prefix())
                }
            };
            outcomes
                .push(outcome.unwrap_or_else(|error| panic!("{name}, seed {seed:?}: schedule {choices:?}: {error}")));
            prefix = next;
        }
    }
    outcomes
}

/// Asserts that the consumer schedules reached each rare path at least once.
fn assert_consumer_reached(name: &str, counts: &ConsumerCounts, outcomes: &[&str]) {
    for outcome in outcomes {
        assert!(
            counts.outcome(outcome) > 0,
            "{name}: no copy ended {outcome:?}: {counts:?}"
        );
    }
    assert!(
        counts.crashed_after_commit_before_publish() > 0,
        "{name}: no crash between the commit and the publish: {counts:?}"
    );
    assert!(
        counts.crashed_after_publish_before_mark() > 0,
        "{name}: no crash between the publish and the mark: {counts:?}"
    );
    assert!(
        counts.redeliveries > 0,
        "{name}: nothing was delivered again: {counts:?}"
    );
    assert!(counts.superseded > 0, "{name}: no commit lost a race: {counts:?}");
    assert!(
        counts.business_reruns > 0,
        "{name}: no business condition failed: {counts:?}"
    );
    assert!(counts.late_applied > 0, "{name}: no late commit applied: {counts:?}");
    assert!(
        counts.late_superseded > 0,
        "{name}: no late commit arrived after another attempt had won: {counts:?}"
    );
}

/// Message handlers (docs/PROTOCOL.md section 10): one copy of an incoming message, every fault
/// at every gated step (its record read, its handler's read, its commit, including one
/// timed out on its way and applied later, its publishes, its mark) and every order of a
/// late commit against the copy's next rounds, then redelivered until acknowledged; once
/// more beside a writer that changes the handler's counter behind its back. After each
/// schedule C1 to C5 hold.
#[test]
fn consumer_every_crash_point_of_one_copy_then_a_redelivery() {
    let started = Instant::now();
    let sweeps = [
        ("one copy", ConsumerSimConfig::new(1, false, false, 3)),
        ("one copy beside a writer", ConsumerSimConfig::new(1, false, true, 1)),
    ];
    let mut counts = ConsumerCounts::default();
    let (mut schedules, mut with_fault, mut longest) = (0, 0, 0);
    for (name, config) in &sweeps {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = DepthFirst::new(choices.clone());
            let outcome = run_consumer_schedule(&mut chooser, config)
                .unwrap_or_else(|error| panic!("consumer, {name}: schedule {choices:?}: {error}"));
            schedules += 1;
            with_fault += usize::from(outcome.faults > 0);
            longest = longest.max(outcome.steps);
            counts.add(&outcome.counts);
            prefix = chooser.next_prefix();
        }
    }
    println!(
        "consumer, one copy: {schedules} schedules ({with_fault} with a fault, longest {longest} steps) in {:.2?}: {counts:?}",
        started.elapsed()
    );
    assert_consumer_reached(
        "one copy",
        &counts,
        &[
            "processed",
            "resumed",
            "adopted",
            "duplicate",
            "crashed",
            "failed: publish",
            "failed: mark",
        ],
    );
}

/// The faults of the two-copies exploration: a commit applied with its reply lost, and a
/// crash right after a publish.
fn two_copies_faults(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Commit => vec![ReplyLost],
        Op::Publish => vec![CrashAfter],
        _ => vec![],
    }
}

/// The entity-mode run's: a commit applied with its reply lost (its tree with crashes
/// after a publish too has 325,582 schedules, 158 s here: `SIM_TWO_COPIES_ALL=1`).
fn two_copies_entity_faults(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::ReplyLost],
        _ => vec![],
    }
}

/// Two copies of an incoming message delivered at once (a producer's re-send beside the
/// queue's duplicate), every interleaving of the two and of their redeliveries, with at
/// most one fault anywhere ([`two_copies_faults`]; [`two_copies_entity_faults`] in entity
/// mode), in the transactional mode and in entity mode, depth-first to exhaustion: C1 to
/// C5 hold after each schedule (the message applied once, its messages published before
/// it is acknowledged, nothing left behind). Not explored: more faults, commits on their
/// way (late), three copies, the conflicting writer (the random sweeps have those).
#[test]
fn consumer_two_copies_at_once_at_every_interleaving_with_one_fault() {
    let all = std::env::var("SIM_TWO_COPIES_ALL").is_ok();
    let sweeps = [
        ("transactional", {
            let mut config = ConsumerSimConfig::new(2, true, false, 1);
            config.faults = two_copies_faults;
            config
        }),
        ("entity mode", {
            let mut config = ConsumerSimConfig::entity(2, true, false, 1);
            config.faults = if all {
                two_copies_faults
            } else {
                two_copies_entity_faults
            };
            config
        }),
    ];
    for (name, config) in &sweeps {
        let started = Instant::now();
        let mut counts = ConsumerCounts::default();
        let (mut schedules, mut with_fault) = (0, 0);
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = DepthFirst::new(choices.clone());
            let outcome = run_consumer_schedule(&mut chooser, config)
                .unwrap_or_else(|error| panic!("two copies at once, {name}: schedule {choices:?}: {error}"));
            schedules += 1;
            with_fault += usize::from(outcome.faults > 0);
            counts.add(&outcome.counts);
            prefix = chooser.next_prefix();
        }
        println!(
            "consumer, two copies at once, {name}: {schedules} schedules ({with_fault} with a fault) in {:.2?}: {:?}",
            started.elapsed(),
            counts.outcomes
        );
        assert!(
            with_fault > 0 && with_fault < schedules,
            "{name}: {schedules} {with_fault}"
        );
        let reached: Vec<&str> = counts.outcomes.keys().copied().collect();
        let expected: &[&str] = if config.entity {
            &["processed", "duplicate", "resumed"]
        } else {
            &["processed", "duplicate", "resumed", "adopted", "crashed"]
        };
        for outcome in expected {
            assert!(reached.contains(outcome), "{name}: {outcome} never reached: {counts:?}");
        }
    }
}

/// The configuration of consumer schedule `seed`: every other one with the conflicting
/// writer, up to 4 faults.
fn consumer_random_config(copies: usize, concurrent: bool, seed: u64) -> ConsumerSimConfig {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xc0de);
    ConsumerSimConfig::new(copies, concurrent, seed % 2 == 1, rng.usize(0..=4))
}

/// Two and three copies of an incoming message, delivered one after another or all at
/// once, under seeded random interleavings and faults, half of them beside a conflicting
/// writer: C1 to C5 hold after each, and the races (a copy adopting a rival's record, a
/// late commit refused after another copy won) are reached.
#[test]
fn consumer_two_and_three_copies_one_after_another_and_concurrently() {
    let count: u64 = std::env::var("SIM_CONSUMER_SCHEDULES")
        .map(|n| n.parse().expect("SIM_CONSUMER_SCHEDULES is a number"))
        .unwrap_or(2_000);
    let started = Instant::now();
    let mut counts = ConsumerCounts::default();
    let (mut schedules, mut faults, mut steps) = (0, 0, 0);
    for copies in [2, 3] {
        for concurrent in [false, true] {
            for seed in 0..count {
                let config = consumer_random_config(copies, concurrent, seed);
                let mut chooser = Seeded::new(seed, 15);
                let outcome = run_consumer_schedule(&mut chooser, &config).unwrap_or_else(|error| {
                    panic!("consumer, {copies} copies, concurrent {concurrent}, seed {seed}: {error}")
                });
                schedules += 1;
                faults += outcome.faults;
                steps += outcome.steps;
                counts.add(&outcome.counts);
            }
        }
    }
    println!(
        "consumer, 2 and 3 copies: {schedules} schedules ({faults} faults, {steps} steps) in {:.2?}: {counts:?}",
        started.elapsed()
    );
    if count >= 500 {
        assert_consumer_reached(
            "copies",
            &counts,
            &["processed", "resumed", "adopted", "duplicate", "crashed"],
        );
        assert!(
            counts.late_superseded_by_other_copy > 0,
            "no late commit arrived after another copy had won: {counts:?}"
        );
    }
}

/// The steps of entity mode (docs/PROTOCOL.md section 11) that pass gates of their own kind.
const ENTITY_STEPS: [&str; 4] = ["entity read", "entity commit", "dedup put", "entry removal"];

/// Faults and crashes per entity-mode step, and the late writes, as one line.
fn entity_steps_line(counts: &ConsumerCounts) -> String {
    let steps: Vec<String> = ENTITY_STEPS
        .iter()
        .map(|step| {
            format!(
                "{step}: {} crashes, {} other faults",
                counts.crashes_at(step),
                counts.faults_at(step)
            )
        })
        .collect();
    format!(
        "{}; late commits applied {}, superseded {}; late writes {:?}; leftover entries found beside the dedup record and removed {}",
        steps.join(", "),
        counts.late_applied,
        counts.late_superseded,
        counts.late_writes,
        counts.leftover_entries_removed
    )
}

/// Asserts that the entity-mode schedules reached each rare path at least once: those of
/// [`assert_consumer_reached`], a crash and another fault at each step of its own, and a
/// crash between the dedup record's put and the entry's removal, mended by a duplicate.
fn assert_entity_reached(name: &str, counts: &ConsumerCounts, outcomes: &[&str]) {
    assert_consumer_reached(name, counts, outcomes);
    for step in ENTITY_STEPS {
        assert!(
            counts.crashes_at(step) > 0,
            "{name}: no crash at the {step}: {counts:?}"
        );
        // A read only crashes or fails: its failure is among the other faults.
        assert!(counts.faults_at(step) > 0, "{name}: no fault at the {step}: {counts:?}");
    }
    assert!(
        counts.crashed_after_dedup_put_before_removal() > 0,
        "{name}: no crash between the dedup record's put and the entry's removal: {counts:?}"
    );
    assert!(
        counts.leftover_entries_removed > 0,
        "{name}: no copy found an entry left beside the dedup record: {counts:?}"
    );
}

/// Message handlers in entity mode (docs/PROTOCOL.md section 11): one copy of an incoming
/// message, every fault at every gated step (its entity read, its dedup record read, its
/// one conditional write, including one timed out on its way and applied later, its
/// publishes, its dedup record's put, its entry's removal, both of which can also land
/// late) and every order of a ghost against the copy's next rounds, then redelivered
/// until acknowledged; once more beside a writer that commits into the same entity
/// behind its back. After each schedule C1 to C5 hold, and the entity holds no entry.
#[test]
fn consumer_entity_mode_every_crash_point_of_one_copy_then_a_redelivery() {
    let started = Instant::now();
    // Each sweep: every interleaving (no seeds), or every sequence of faults under the
    // orders each of `seeds` seeds picks.
    let sweeps = [
        // Up to three faults, none of them a late dedup put or removal (whose ghosts
        // double the interleavings of every schedule they are in) ...
        (
            "one copy",
            ConsumerSimConfig {
                faults: consumer_faults,
                ..ConsumerSimConfig::entity(1, false, false, 3)
            },
            0,
        ),
        // ... and up to two with them.
        (
            "one copy, late writes",
            ConsumerSimConfig::entity(1, false, false, 2),
            0,
        ),
        (
            "one copy beside a writer",
            ConsumerSimConfig::entity(1, false, true, 0),
            0,
        ),
        (
            "one copy beside a writer, faults",
            ConsumerSimConfig::entity(1, false, true, 2),
            4,
        ),
    ];
    let mut counts = ConsumerCounts::default();
    let (mut schedules, mut with_fault, mut longest) = (0, 0, 0);
    let mut per_sweep = Vec::new();
    for (name, config, seeds) in &sweeps {
        let before = schedules;
        let seeds = (*seeds > 0).then_some(*seeds);
        for outcome in consumer_sweep(&format!("consumer in entity mode, {name}"), config, seeds) {
            schedules += 1;
            with_fault += usize::from(outcome.faults > 0);
            longest = longest.max(outcome.steps);
            counts.add(&outcome.counts);
        }
        per_sweep.push(format!("{name} {}", schedules - before));
    }
    println!(
        "consumer in entity mode, one copy: {schedules} schedules ({}; {with_fault} with a fault, longest {longest} steps) in {:.2?}: {counts:?}",
        per_sweep.join(", "),
        started.elapsed()
    );
    println!(
        "consumer in entity mode, one copy, per step: {}",
        entity_steps_line(&counts)
    );
    assert_entity_reached(
        "entity mode, one copy",
        &counts,
        &[
            "processed",
            "resumed",
            "adopted",
            "duplicate",
            "crashed",
            "failed: publish",
            "failed: dedup put",
            "failed: remove entry",
        ],
    );
}

/// Two and three copies of an incoming message in entity mode, delivered one after
/// another or all at once, under seeded random interleavings and faults, half of them
/// beside a writer committing into the same entity: C1 to C5 hold after each, no entry
/// is left behind or brought back, and the races (a copy adopting a rival's entry, a
/// late commit refused after another copy won) are reached.
#[test]
fn consumer_entity_mode_two_and_three_copies_one_after_another_and_concurrently() {
    let count: u64 = std::env::var("SIM_CONSUMER_SCHEDULES")
        .map(|n| n.parse().expect("SIM_CONSUMER_SCHEDULES is a number"))
        .unwrap_or(2_000);
    let started = Instant::now();
    let mut counts = ConsumerCounts::default();
    let (mut schedules, mut faults, mut steps) = (0, 0, 0);
    for copies in [2, 3] {
        for concurrent in [false, true] {
            for seed in 0..count {
                let ConsumerSimConfig {
                    conflicting_writer,
                    fault_budget,
                    ..
                } = consumer_random_config(copies, concurrent, seed);
                let config = ConsumerSimConfig::entity(copies, concurrent, conflicting_writer, fault_budget);
                let mut chooser = Seeded::new(seed, 15);
                let outcome = run_consumer_schedule(&mut chooser, &config).unwrap_or_else(|error| {
                    panic!("consumer in entity mode, {copies} copies, concurrent {concurrent}, seed {seed}: {error}")
                });
                schedules += 1;
                faults += outcome.faults;
                steps += outcome.steps;
                counts.add(&outcome.counts);
            }
        }
    }
    println!(
        "consumer in entity mode, 2 and 3 copies: {schedules} schedules ({faults} faults, {steps} steps) in {:.2?}: {counts:?}",
        started.elapsed()
    );
    println!(
        "consumer in entity mode, 2 and 3 copies, per step: {}",
        entity_steps_line(&counts)
    );
    if count >= 500 {
        assert_entity_reached(
            "entity mode, copies",
            &counts,
            &["processed", "resumed", "adopted", "duplicate", "crashed"],
        );
        assert!(
            counts.late_superseded_by_other_copy > 0,
            "no late commit arrived after another copy had won: {counts:?}"
        );
    }
}

/// Section 7 of issue 28: clocks off by up to an hour, either way. The request path's
/// clock (which stamps its control message, checks its window and dates its transaction
/// ids) and the workers' are each skewed from the simulation's clock, AWS's own time, by
/// up to an hour. In half the schedules AWS checks each entity commit's `X-Amz-Date`
/// against its own time (15 minutes), dated by the request path's clock or, where the SDK
/// corrects its signing clock by the skew it learnt, by AWS's; in the other half it takes
/// every request whenever it arrives, the worst case (the fence mark does not rely on the
/// check).
/// Windows are the default's 10 s and the settings' longest, an hour, where a worker far
/// behind defers until it has used its `MAX_ATTEMPTS` checks and fences inside the window;
/// a worker far ahead fences before the request path has even read its item. Commits are
/// held, late, or lost in flight; I1-I7 and the entity checks hold in each schedule.
///
/// Not entity mode's, and not fixed here (left as a finding): with a retention of hours,
/// this test found committed transactions tombstoned (I3; seeds 4 and 2201 with retentions
/// of 1 h and 2 h 15 min). A transaction's dispatched record expires at a time stamped by
/// the host that dispatched it (its clock plus the retention), while the worker calls a
/// control message stale when its own clock passes the request path's stamp plus the
/// retention. With the request path an hour ahead and a worker an hour behind, a control
/// message handled in the three hours between the two (a duplicate, or one sent late)
/// finds no record, still sees the transaction inside its window, and tombstones it (in
/// entity mode it raises the mark as well, which costs others the transactional form
/// only). Both forms share it; it needs a control message still circulating a retention
/// after its transaction, so the default retention, 7 days, is used here.
#[test]
fn entity_mode_clocks_skewed_by_up_to_an_hour_keep_the_invariants() {
    const HOUR: i64 = 3_600_000;
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let mut max_attempts_fences = 0;
    let count: u64 = std::env::var("SIM_SKEW_SCHEDULES")
        .map(|n| n.parse().expect("SIM_SKEW_SCHEDULES is a number"))
        .unwrap_or(3000);
    for seed in 0..count {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5c3e);
        let long_window = rng.bool();
        let config = SimConfig {
            transactions: rng.usize(1..=3),
            items: 1,
            workers: 2,
            fault_budget: rng.usize(0..=3),
            random_extras: true,
            max_steps: 20_000,
            // The default retention, 7 days: the worker's staleness check compares its
            // clock with the request path's stamp (see the note above).
            timing: outbox::settings::Timing {
                max_commit_duration: Duration::from_secs(if long_window { 3600 } else { 10 }),
                retention: Duration::from_secs(7 * 24 * 3600),
                ..sim_timing(10)
            },
            deadline: None,
            retry_loop: None,
            inline: rng.bool(),
            abandon_every: [0, 2][rng.usize(0..2)],
            // Half the schedules send commits (and settling writes, records, control
            // messages) late, their ghosts applied whenever the scheduler lets them.
            faults_only: rng.bool().then_some(commit_late_too as fn(Op) -> Vec<Fault>),
            middleware: None,
            entity: true,
            hold_commits: rng.usize(0..4) == 0,
            api_skews: &[-HOUR, -HOUR / 4, 0, HOUR / 4, HOUR],
            worker_skews: &[-HOUR, 0, HOUR],
            // Half model AWS's signature check (the SDK correcting its signing clock or
            // not); the other half let every request arrive whenever, the worst case.
            aws_signatures: rng.bool().then(|| rng.bool()),
            spawned_commits: rng.bool(),
            after_answer: rng.bool(),
            deletes: false,
            retention_jump: false,
            keyed: &[],
            preemption_bound: None,
            step_checks: false,
            vacant: false,
            sends_early: false,
            adds: false,
        };
        let mut chooser = Seeded::new(seed, 8);
        let outcome = run_caught(&mut chooser, &config).unwrap_or_else(|error| panic!("skew seed {seed}: {error}"));
        outcome
            .observed
            .check()
            .unwrap_or_else(|violation| panic!("skew seed {seed}: {violation}\n{:#?}", outcome.observed));
        max_attempts_fences += outcome
            .observed
            .control_sent
            .iter()
            .filter(|(txn_id, sent)| {
                **sent >= outbox::control::MAX_ATTEMPTS as usize && outcome.observed.tombstones.contains(txn_id)
            })
            .count();
        tally.add(&outcome);
    }
    tally.print("clocks skewed by up to an hour", started);
    println!(
        "entity mode, clocks skewed by up to an hour: transactions fenced after MAX_ATTEMPTS checks {max_attempts_fences}; entity commits refused by AWS for their X-Amz-Date {}",
        tally.late.signature_refused
    );
    if count >= 100 {
        assert!(max_attempts_fences > 0, "no worker used up its checks");
        assert!(tally.late.fence_refused > 0, "no commit met a fence mark: {tally:?}");
        assert!(tally.late.commits.1 > 0, "no late commit applied: {tally:?}");
        assert!(tally.late.signature_refused > 0, "AWS refused no request: {tally:?}");
        assert!(
            tally.entity_commits > 0 && tally.transactional_commits > 0 && tally.fences > 0,
            "{tally:?}"
        );
        assert_reached(&tally.endings, &["committed", "commit window expired"]);
    }
}

/// Section 7 of issue 28: transactions that outlive their request. A request stages its
/// increment, hands the transaction to a task of its own (which commits it whenever the
/// scheduler lets it: before, during or after the settling), answers, and is settled by
/// `Outbox::abandon`, as the HTTP glue settles a request answered without a commit. Every
/// placement of one fault, in entity mode and the transactional form, with inline
/// publishing on and off, under the request-first order and 60 random orders; the task's
/// answer is checked with the others (I7), and I1-I7 and the entity checks hold.
#[test]
fn transactions_that_outlive_their_request_keep_the_invariants() {
    let started = Instant::now();
    let mut tally = EntityTally::default();
    for entity in [true, false] {
        for inline in [false, true] {
            let config = SimConfig {
                abandon_every: 1,
                spawned_commits: true,
                entity,
                // Late commits and settling writes too: their ghosts race the abandon.
                faults_only: Some(commit_late_too),
                ..one_transaction(inline)
            };
            let name = format!("outliving, entity {entity}, inline {inline}");
            for outcome in run_fault_sequences(&name, &config, 60) {
                tally.add(&outcome);
            }
        }
    }
    tally.print("transactions that outlive their request", started);
    assert_reached(
        &tally.endings,
        &[
            "a task's commit refused: abandoned before it began",
            "abandoned, nothing sent",
            "abandoned, tombstoned",
            "abandoned, found committed (a task's commit landed first)",
            "abandoned, left to the worker",
            "commit window expired",
        ],
    );
    // Commits under way when their transaction was abandoned, fenced and refused.
    assert!(tally.late.commits.1 > 0 && tally.late.fence_refused > 0, "{tally:?}");
}

/// Section 7 of issue 28: items deleted and created again under late attempts. An actor
/// deletes each counter and creates it again, each in a transaction of the request path
/// that reads the counter through its staging and emits an event and an audit entry
/// (placed in the counter's history like the requests'), racing requests in entity mode
/// whose commits are late, held or lost, workers that fence them, and clocks skewed by up
/// to an hour. A fenced transaction's late commit meets the counter's mark on the new
/// counter too (the delete kept it in a vacant item, the create kept it); any late
/// attempt meets the version the counter continued at, so it never applies to a later
/// life. I1-I7, the entity checks, the counters' versions across their lives and the
/// chains (seq, version and `after` across the delete and the re-create) hold; then one
/// request beside the deleter, every placement of up to two late or lost commits, reaches
/// an attempt of a committed transaction refused by the continued version.
#[test]
fn entity_mode_items_deleted_and_created_again_keep_the_invariants() {
    const HOUR: i64 = 3_600_000;
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let mut deletes = 0;
    let count: u64 = std::env::var("SIM_DELETE_SCHEDULES")
        .map(|n| n.parse().expect("SIM_DELETE_SCHEDULES is a number"))
        .unwrap_or(3000);
    for seed in 0..count {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xde1e);
        let config = SimConfig {
            transactions: rng.usize(1..=3),
            items: 1,
            workers: 2,
            fault_budget: rng.usize(0..=3),
            random_extras: true,
            max_steps: 20_000,
            timing: outbox::settings::Timing {
                retention: Duration::from_secs(7 * 24 * 3600),
                ..sim_timing(10)
            },
            deadline: None,
            retry_loop: None,
            inline: rng.bool(),
            abandon_every: [0, 2][rng.usize(0..2)],
            faults_only: rng.bool().then_some(commit_late_too as fn(Op) -> Vec<Fault>),
            middleware: None,
            entity: true,
            hold_commits: rng.usize(0..4) == 0,
            api_skews: if rng.bool() { &[-HOUR, 0, HOUR] } else { &[] },
            worker_skews: if rng.bool() { &[-HOUR, 0, HOUR] } else { &[] },
            aws_signatures: None,
            spawned_commits: rng.usize(0..4) == 0,
            after_answer: rng.bool(),
            deletes: true,
            retention_jump: false,
            keyed: &[],
            preemption_bound: None,
            step_checks: false,
            vacant: false,
            sends_early: false,
            adds: false,
        };
        let mut chooser = Seeded::new(seed, 8);
        let outcome = run_caught(&mut chooser, &config).unwrap_or_else(|error| panic!("delete seed {seed}: {error}"));
        outcome
            .observed
            .check()
            .unwrap_or_else(|violation| panic!("delete seed {seed}: {violation}\n{:#?}", outcome.observed));
        deletes += outcome.observed.deletes;
        tally.add(&outcome);
    }
    tally.print("items deleted and created again", started);
    println!("entity mode, items deleted and created again: deletes applied {deletes}");
    if count >= 100 {
        assert!(deletes > 0, "no counter was deleted");
        assert!(tally.late.fence_refused > 0 && tally.late.commits.1 > 0, "{tally:?}");
        assert!(tally.chains.predecessor_first > 0, "{tally:?}");
    }

    // One request beside the deleter, every placement of up to two faults on its commit
    // (on its way, applied later by a ghost; or applied with the reply lost), under the
    // request-first order and 30 random orders: an attempt of a transaction that
    // committed meanwhile (another attempt applied) arrives after the entry was settled,
    // or after the delete and the re-create, and the version the counter continued at
    // refuses it.
    fn late_or_lost(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::Late, Fault::ReplyLost],
            Op::LateCommit => vec![Fault::Fail],
            _ => vec![],
        }
    }
    let started = Instant::now();
    let mut late = EntityTally::default();
    let config = SimConfig {
        deletes: true,
        fault_budget: 2,
        faults_only: Some(late_or_lost),
        ..in_entity_mode(one_transaction(false))
    };
    for outcome in run_fault_sequences("late attempts across a delete", &config, 30) {
        late.add(&outcome);
    }
    late.print("late attempts across a delete and a re-create", started);
    assert!(late.chains.refused_by_version > 0, "{late:?}");
}

/// Section 7 of issue 28: a message handler in entity mode whose decision changes between
/// runs (its first run counts M and emits; every later run, of any copy, stages nothing).
/// One copy under every interleaving and up to two commits of unknown outcome (applied
/// with its reply lost, or timed out and applied or lost later), then redelivered until
/// acknowledged; two copies one after the other under seeded orders. (Two copies at
/// once are beyond the guarantee: a copy whose handler decides nothing knows nothing of
/// the other copy's attempt on its way, and the simulation finds the attempt landing
/// after both were acknowledged; `docs/ENTITY_MODE.md` names the limit.) M's effect is the count with its message, or nothing
/// at all, never the count without the message or the message without the count (C1 to
/// C5), and no entry is left behind.
#[test]
fn consumer_entity_mode_a_handler_that_changes_its_mind_keeps_c1_to_c5() {
    let started = Instant::now();
    let mut counts = ConsumerCounts::default();
    let (mut schedules, mut with_fault) = (0, 0);
    // Commits of unknown outcome: applied with the reply lost, or on their way and applied
    // (or lost) later. A crash or a failed message with an attempt on its way would leave
    // it to the next delivery, which does not know it: a limit (`docs/ENTITY_MODE.md`).
    fn unknown_commits(op: Op) -> Vec<Fault> {
        match op {
            Op::Commit => vec![Fault::ReplyLost, Fault::Late],
            Op::LateCommit => vec![Fault::Fail],
            _ => vec![],
        }
    }
    let sweeps = [
        (
            ConsumerSimConfig {
                changes_mind: true,
                faults: unknown_commits,
                ..ConsumerSimConfig::entity(1, false, false, 2)
            },
            None,
        ),
        (
            ConsumerSimConfig {
                changes_mind: true,
                faults: unknown_commits,
                ..ConsumerSimConfig::entity(2, false, false, 2)
            },
            Some(6),
        ),
    ];
    for (config, seeds) in &sweeps {
        let name = format!("a handler that changes its mind, {} copies", config.copies);
        for outcome in consumer_sweep(&name, config, *seeds) {
            schedules += 1;
            with_fault += usize::from(outcome.faults > 0);
            counts.add(&outcome.counts);
        }
    }
    println!(
        "consumer in entity mode, a handler that changes its mind: {schedules} schedules ({with_fault} with a fault) in {:.2?}: {counts:?}",
        started.elapsed()
    );
    for outcome in ["processed", "resumed", "duplicate"] {
        assert!(
            counts.outcomes.get(outcome).is_some_and(|n| *n > 0),
            "{outcome}: {counts:?}"
        );
    }
    // Attempts of the counting run refused after a run that decided nothing wrote the
    // entity as read (their version was gone).
    assert!(
        counts
            .late_writes
            .get("late entity commit: version conflict")
            .is_some_and(|n| *n > 0),
        "{counts:?}"
    );
}

/// Sent marks past their time: once in each schedule the clock jumps past the retention
/// (and the marks' margin), with AWS's signature check modelled, so that records expire,
/// control messages turn stale, and a worker reading a counter full of marks (the
/// simulation's counters hold one) drops them. The invariants hold; a status read past the
/// retention may say `unknown` (forgotten, as the API documents), never the other outcome.
#[test]
fn entity_mode_marks_past_their_time_make_room_after_the_retention() {
    let started = Instant::now();
    let mut tally = EntityTally::default();
    let count: u64 = std::env::var("SIM_FORGET_SCHEDULES")
        .map(|n| n.parse().expect("SIM_FORGET_SCHEDULES is a number"))
        .unwrap_or(1500);
    for seed in 0..count {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xf0e7);
        let inline = rng.bool();
        let config = SimConfig {
            transactions: rng.usize(2..=4),
            items: 1,
            workers: 2,
            fault_budget: rng.usize(0..=2),
            random_extras: false,
            max_steps: 20_000,
            timing: sim_timing(10),
            deadline: None,
            retry_loop: None,
            inline,
            abandon_every: [0, 3][rng.usize(0..2)],
            faults_only: None,
            middleware: None,
            entity: true,
            hold_commits: false,
            api_skews: &[],
            worker_skews: &[],
            aws_signatures: Some(true),
            spawned_commits: false,
            after_answer: inline && rng.bool(),
            deletes: false,
            retention_jump: true,
            keyed: &[],
            preemption_bound: None,
            step_checks: false,
            vacant: false,
            sends_early: false,
            adds: false,
        };
        let mut chooser = Seeded::new(seed, 8);
        let mut outcome =
            run_caught(&mut chooser, &config).unwrap_or_else(|error| panic!("forget seed {seed}: {error}"));
        outcome
            .observed
            .statuses
            .retain(|_, status| *status != outbox::request::TxnStatus::Unknown);
        outcome
            .observed
            .check()
            .unwrap_or_else(|violation| panic!("forget seed {seed}: {violation}\n{:#?}", outcome.observed));
        tally.add(&outcome);
    }
    tally.print("a jump past the retention", started);
    if count >= 100 {
        assert!(
            tally.marks_forgotten > 0,
            "no mark was dropped past its time: {tally:?}"
        );
        assert!(tally.settled > 0 && tally.settled_into_records > 0, "{tally:?}");
    }
}

use outbox_sim::{produced, run_in_order_schedule, InOrderConfig, InOrderCounts};

/// The producer's chain as the request path stamped it, one line per placed message.
fn in_order_chain() -> Vec<String> {
    produced()
        .iter()
        .filter_map(|request| {
            outbox::protocol::Position::from_attributes(&request.attributes)
                .ok()
                .flatten()
        })
        .map(|position| {
            format!(
                "{} seq {} version {} after {}",
                position.entity, position.seq, position.version, position.after
            )
        })
        .collect()
}

/// The in-order sweeps, in the transactional mode or in entity mode (`entity`): every
/// order of delivery, one consumer at a time; every placement of one fault, two at once,
/// under seeded orders; seeded random schedules of three at once with up to three faults
/// and waiting copies coming back at any moment. Panics on the first schedule that
/// breaks the check; returns the counts summed, and one line per sweep.
fn in_order_sweeps(entity: bool) -> (InOrderCounts, Vec<String>) {
    let mode = if entity { " (entity mode)" } else { "" };
    let config_for = |max_in_flight: usize, fault_budget: usize| match entity {
        true => InOrderConfig::entity(max_in_flight, fault_budget),
        false => InOrderConfig::new(max_in_flight, fault_budget),
    };
    let mut total = InOrderCounts::default();
    let mut lines = Vec::new();
    let mut sweep = |name: &str, counts: InOrderCounts, lines: &mut Vec<String>| {
        lines.push(format!(
            "{name}: {} schedules, {} deliveries waited, {} duplicates, {} redeliveries",
            counts.schedules,
            counts.waits,
            counts.outcome("duplicate"),
            counts.redeliveries
        ));
        total.add(&counts);
    };

    // Every order of delivery, each consumed to its end before the next starts.
    let config = config_for(1, 0);
    let mut counts = InOrderCounts::default();
    let mut prefix = Some(Vec::new());
    while let Some(choices) = prefix {
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_in_order_schedule(&mut chooser, &config)
            .unwrap_or_else(|error| panic!("in order{mode}, every order: schedule {choices:?}: {error}"));
        counts.add(&outcome.counts);
        prefix = chooser.next_prefix();
    }
    sweep("every order of delivery", counts, &mut lines);

    // Every placement of one fault, two consumers at once, under seeded orders.
    let config = config_for(2, 1);
    let mut counts = InOrderCounts::default();
    for seed in 0..4 {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), Some(seed));
            let outcome = run_in_order_schedule(&mut chooser, &config)
                .unwrap_or_else(|error| panic!("in order{mode}, one fault, seed {seed}: faults {choices:?}: {error}"));
            counts.add(&outcome.counts);
            prefix = chooser.next_prefix();
        }
    }
    sweep("every placement of one fault, two at once", counts, &mut lines);

    // Seeded random schedules: three at once, up to three faults.
    let schedules: u64 = std::env::var("SIM_IN_ORDER_SCHEDULES")
        .map(|n| n.parse().expect("SIM_IN_ORDER_SCHEDULES is a number"))
        .unwrap_or(1000);
    let mut counts = InOrderCounts::default();
    for seed in 0..schedules {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x0bde);
        let config = InOrderConfig {
            advance_early: true,
            ..config_for(3, rng.usize(0..=3))
        };
        let mut chooser = Seeded::new(seed, 12);
        let outcome = run_in_order_schedule(&mut chooser, &config)
            .unwrap_or_else(|error| panic!("in order{mode}, random, seed {seed}: {error}"));
        counts.add(&outcome.counts);
    }
    sweep("seeded random, three at once, up to three faults", counts, &mut lines);
    (total, lines)
}

/// The in-order consumer (`Handler::in_order`): the placed messages the real request path
/// published for two entities (`ORDER#a` seq 1 to 4, two of them from one transaction
/// and a change that sent nothing between; `ORDER#b` seq 1), and a second copy of
/// `ORDER#a`'s seq 2, delivered by a queue in any order: every order of delivery, one
/// consumer at a time; every placement of one fault (crashes, a lost reply, a refusal, a
/// commit applied late by a ghost, a requeue that crashes or fails) with two at once
/// under seeded orders; and seeded random schedules of three at once with up to three
/// faults and waiting copies coming back at any moment. After each, every placed message
/// was applied once, in chain order, none skipped, and the queue is empty.
#[test]
fn in_order_consumer_applies_each_placed_message_once_in_chain_order() {
    let started = Instant::now();
    let chain = in_order_chain();
    // The producer's chain as the request path stamped it: two transactions' worth on
    // ORDER#a, a change that sent nothing, then one more (its `after` skips it).
    assert_eq!(
        chain,
        [
            "ORDER#a seq 1 version 1 after 0",
            "ORDER#a seq 2 version 2 after 1",
            "ORDER#a seq 3 version 2 after 1",
            "ORDER#b seq 1 version 1 after 0",
            "ORDER#a seq 4 version 4 after 2",
        ]
    );
    let (total, lines) = in_order_sweeps(false);
    println!(
        "in order: {} schedules in {:.2?} ({}); the chain delivered: {chain:?}; deliveries ended: {:?}; crashes: {:?}; late commits (sent, applied) {:?}; messages applied {}",
        total.schedules,
        started.elapsed(),
        lines.join("; "),
        total.outcomes,
        total.crashes,
        total.late_commits,
        total.applied,
    );
    for outcome in ["processed", "duplicate", "waiting", "crashed", "failed: waiting"] {
        assert!(total.outcome(outcome) > 0, "no delivery ended {outcome:?}: {total:?}");
    }
    assert!(total.late_commits.1 > 0, "no late commit reached the table: {total:?}");
    assert!(total.redeliveries > 0, "nothing was delivered again: {total:?}");
}

/// The same sweeps in entity mode (`Handler::entity` names the item the handler appends
/// to): the consumer keeps each chain's position in that item's key, moved by the item's
/// own conditional write, or alone (`Store::keep_applied`) where the handler writes
/// nothing: `ORDER#a`'s seq 2, on the live item, and `ORDER#b`'s seq 1, on a key never
/// written. After each, per chain the positions moved 1 to n in the history's order, each
/// once, each entity commit carrying the handler's effect and each message that writes
/// nothing moved alone; the handler's items list exactly the seqs it wrote; no
/// transaction and no position item; the queue is empty.
#[test]
fn in_order_consumer_in_entity_mode_applies_each_placed_message_once_in_chain_order() {
    let started = Instant::now();
    let (total, lines) = in_order_sweeps(true);
    println!(
        "in order, entity mode: {} schedules in {:.2?} ({}); deliveries ended: {:?}; crashes: {:?}; late commits (sent, applied) {:?}; messages applied {}; positions moved alone (on a live item, on a key without one) {:?}",
        total.schedules,
        started.elapsed(),
        lines.join("; "),
        total.outcomes,
        total.crashes,
        total.late_commits,
        total.applied,
        total.kept,
    );
    for outcome in ["processed", "duplicate", "waiting", "crashed", "failed: waiting"] {
        assert!(total.outcome(outcome) > 0, "no delivery ended {outcome:?}: {total:?}");
    }
    assert!(total.waits > 0, "no delivery waited: {total:?}");
    assert!(
        total.kept.0 > 0 && total.kept.1 > 0,
        "keep_applied did not move a position both on a live item and on a key without one: {total:?}"
    );
    assert!(total.late_commits.1 > 0, "no late commit reached the table: {total:?}");
    assert!(total.redeliveries > 0, "nothing was delivered again: {total:?}");
}

/// Explores the pair depth-first to exhaustion: `max_in_flight` deliveries at once, at
/// most `fault_budget` crashes, the first `limit` schedules of the depth-first order.
/// Panics on the first schedule that breaks a check.
fn explore_in_order_pair(max_in_flight: usize, fault_budget: usize, limit: usize) -> InOrderCounts {
    let config = InOrderConfig::pair(max_in_flight, fault_budget);
    let mut counts = InOrderCounts::default();
    let mut prefix = Some(Vec::new());
    while let Some(choices) = prefix.filter(|_| counts.schedules < limit) {
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_in_order_schedule(&mut chooser, &config).unwrap_or_else(|error| {
            panic!("in-order pair, {max_in_flight} at once, {fault_budget} crash: schedule {choices:?}: {error}")
        });
        counts.add(&outcome.counts);
        prefix = chooser.next_prefix();
    }
    counts
}

/// Two placed messages of one entity (`ORDER#a`'s seq 1 and 2, as the real request path
/// stamped them) delivered to an in-order consumer whose handler emits one message for
/// each it applies, explored depth-first to exhaustion: every interleaving of the two
/// deliveries consumed at once with no crash, and every order of delivery, one at a time,
/// with one crash anywhere (before or after any read, commit, mark, keep or removal of a
/// kept message, publish and reminder; a crashed delivery comes back). After each: O3 and C1 (each applied once,
/// in chain order, with its effect), C2 to C4 (every commit's messages out under their
/// ids, nothing of a run that did not commit, each record dispatched for the retention
/// from its messages' send), no kept message left behind, and C5 at every
/// acknowledgement (an applied one's messages out, a kept one in its item or applied).
#[test]
fn in_order_pair_with_the_consumers_outbox_keeps_c1_to_c5_and_o3_with_one_crash_anywhere() {
    let started = Instant::now();
    let calm = explore_in_order_pair(1, 0, usize::MAX);
    let calm_time = started.elapsed();
    let crashed = explore_in_order_pair(1, 1, usize::MAX);
    let crash_time = started.elapsed() - calm_time;
    // Two at once, depth-first: the first 2,000 interleavings (the whole tree is beyond
    // the test command's time), where a keep meets the drain of its predecessor.
    let interleaved = explore_in_order_pair(2, 0, 2_000);
    let interleaved_time = started.elapsed() - calm_time - crash_time;
    // Two at once: too many interleavings to enumerate here, so seeded schedules (the
    // race between a keep and a drain's commit lives here).
    let mut racing = InOrderCounts::default();
    for seed in 0..300u64 {
        let config = InOrderConfig::pair(2, (seed % 2) as usize);
        let mut chooser = Seeded::new(seed, 12);
        let outcome = run_in_order_schedule(&mut chooser, &config)
            .unwrap_or_else(|error| panic!("in-order pair, two at once, seed {seed}: {error}"));
        racing.add(&outcome.counts);
    }
    let mut all = calm.clone();
    all.add(&crashed);
    all.add(&racing);
    all.add(&interleaved);
    println!(
        "in-order pair: every order, {} schedules with no crash in {calm_time:.2?}, {} with one crash anywhere in {crash_time:.2?}; two at once, the first {} interleavings in {interleaved_time:.2?}; {} seeded schedules two at once (up to one crash); deliveries ended: {:?}; crashes: {:?}; acknowledgements checked (C5) {}; messages out {}",
        calm.schedules,
        crashed.schedules,
        interleaved.schedules,
        racing.schedules,
        all.outcomes,
        crashed.crashes,
        all.acks_checked,
        all.emitted,
    );
    for outcome in ["processed", "duplicate", "kept"] {
        assert!(
            calm.outcome(outcome) > 0,
            "no delivery ended {outcome:?} without a crash: {calm:?}"
        );
    }
    assert!(crashed.outcome("crashed") > 0, "{crashed:?}");
    for crash in [
        "read before",
        "commit before",
        "commit after",
        "mark before",
        "mark after",
        "publish before",
        "publish after",
        "requeue before",
        "requeue after",
    ] {
        assert!(
            crashed.crashes.get(crash).copied().unwrap_or(0) > 0,
            "no schedule crashed at {crash:?}: {:?}",
            crashed.crashes
        );
    }
    assert!(crashed.redeliveries > 0, "nothing was delivered again: {crashed:?}");
}

/// Faults of the chain exploration: a request path crashes right after its commit
/// applied, so that nothing of its own goes out and a later publisher, or the control
/// worker, must send it first; nothing else fails.
fn crash_after_commit(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::CrashAfter],
        _ => vec![],
    }
}

/// What the chain explorations reached, summed over their schedules.
#[derive(Debug, Default)]
struct ChainTally {
    schedules: usize,
    /// Schedules in which a request crashed right after its commit went through (applied,
    /// or refused by the fence), and those in which both did.
    crashed: usize,
    both_crashed: usize,
    /// Schedules in which the earlier transaction (in commit order) was first sent by the
    /// later one's publisher (its request path, or the worker holding its control
    /// message), by the form the earlier one committed in: its record beside the entity
    /// (the transactional form), or its entry in it.
    record_first: usize,
    entry_first: usize,
    /// Schedules in which a control worker published a transaction first.
    worker_first: usize,
    chains: ChainCounts,
    endings: BTreeMap<&'static str, usize>,
}

/// Two requests incrementing `COUNTER#0` in entity mode, those in `keyed` keeping an
/// idempotency key (so that they commit in the transactional form); each publishes inline
/// before its answer, racing one control worker; a 2 s window (the worker's first check
/// at 1 s defers once, its second fences). The only fault: at each commit, whether its
/// request crashes right after it applied. Every schedule with at most `SIM_PREEMPTIONS`
/// preemptions (2 unless set; [`SimConfig::preemption_bound`]), depth-first to
/// exhaustion; each checked against the invariants (the entity chain and the FIFO first
/// deliveries on `audit` in seq order among them), with no dead-letter redrive. Prints
/// one line; a schedule that breaks a check prints its choices as a replay line
/// (`SIM_CHOICES`, which starts the depth-first order at that schedule, as for one
/// transaction).
fn explore_two_transactions_on_one_entity(name: &str, keyed: &'static [usize]) -> ChainTally {
    let bound = preemptions();
    let config = SimConfig {
        transactions: 2,
        fault_budget: 2,
        faults_only: Some(crash_after_commit),
        timing: sim_timing(2),
        keyed,
        preemption_bound: Some(bound),
        step_checks: false,
        vacant: false,
        // As in the other bounded explorations (see `bounded_base`).
        sends_early: true,
        ..in_entity_mode(one_transaction(true))
    };
    let started = Instant::now();
    let mut tally = ChainTally::default();
    let replay = |choices: &[usize]| {
        format!(
            "rerun it with SIM_PREEMPTIONS={bound} SIM_CHOICES={}",
            replay_arg(choices)
        )
    };
    let mut prefix = Some(start_choices());
    // A deep bound runs for long: a line a minute says how far it got, and where.
    let mut reported = Instant::now();
    while let Some(choices) = prefix {
        if reported.elapsed() >= Duration::from_secs(60) {
            reported = Instant::now();
            eprintln!(
                "{name}: {} schedules in {:.0?} so far (at most {bound} preemptions); at SIM_CHOICES={}",
                tally.schedules,
                started.elapsed(),
                replay_arg(&choices)
            );
        }
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_schedule(&mut chooser, &config)
            .unwrap_or_else(|error| panic!("{name}: schedule {choices:?}: {error}\n{}", replay(&choices)));
        if let Err(violation) = outcome.observed.check() {
            panic!(
                "{name}: schedule {choices:?}: {violation}\n{:#?}\n{}",
                outcome.observed,
                replay(&choices)
            );
        }
        assert_eq!(
            outcome.redrives,
            0,
            "{name}: schedule {choices:?} needed a dead-letter redrive; {}",
            replay(&choices)
        );
        tally.schedules += 1;
        tally.crashed += usize::from(outcome.faults > 0);
        tally.both_crashed += usize::from(outcome.faults > 1);
        tally.worker_first += usize::from(outcome.chains.first_by_worker > 0);
        // Of two transactions only the earlier can be sent by another's publisher.
        if outcome.chains.predecessor_first > 0 {
            let earlier = outcome.observed.placed.iter().min_by_key(|placed| placed.commit);
            match earlier.map(|placed| placed.entity_form) {
                Some(true) => tally.entry_first += 1,
                Some(false) => tally.record_first += 1,
                None => {}
            }
        }
        tally.chains.add(&outcome.chains);
        for result in &outcome.observed.api_results {
            let ending = match result {
                ApiResult::Answered(Err(TxnError::VersionConflict { .. })) => {
                    "version conflict (read before the other's commit)"
                }
                result => result_name(result),
            };
            *tally.endings.entry(ending).or_default() += 1;
        }
        prefix = chooser.next_prefix();
    }
    println!(
        "{name}: {} schedules (at most {bound} preemptions; {} with a request crashed right after its commit went through, {} with both) in {:.2?}; a predecessor sent first by a later publisher in {} ({} a record of the transactional form, {} an entry), a transaction first published by the control worker in {}; requests ended: {:?}; {}",
        tally.schedules,
        tally.crashed,
        tally.both_crashed,
        started.elapsed(),
        tally.record_first + tally.entry_first,
        tally.record_first,
        tally.entry_first,
        tally.worker_first,
        tally.endings,
        chains_line(name, tally.schedules, &tally.chains),
    );
    if replaying() {
        // Started midway: what the whole tree reaches is not asked of a part of it.
        return tally;
    }
    assert!(
        tally.worker_first > 0,
        "{name}: the control worker never published first: {tally:?}"
    );
    assert!(
        tally.crashed > tally.both_crashed && tally.both_crashed > 0,
        "{name}: {tally:?}"
    );
    assert_reached(&tally.endings, &["committed, dispatched inline", "api crashed"]);
    tally
}

/// The chain and publish-order steps of two transactions on one entity, explored
/// depth-first to exhaustion within a bound ([`explore_two_transactions_on_one_entity`]):
/// request 0 keeps an idempotency key, so that it commits in the transactional form (its
/// record beside the counter, which the counter's chain heads name, so that its
/// successor's messages name it as their `Position::previous`), request 1 in entity form
/// (its entry in the counter); either may commit first. A request that crashes right
/// after its commit sends nothing: the other request's publisher must send it first
/// (the earlier unsent transactions it finds, shared/src/earlier.rs), or the worker must.
///
/// Explored exhaustively: every schedule in which at most two preemptions happen
/// (`SIM_PREEMPTIONS=3` by hand for three: docs/PROTOCOL.md, "Bounded exhaustive
/// checking", has its figures) (the
/// actor that moved last was switched away from while it could move on, to another actor
/// or to the clock), in both commit orders, with and without a crash right after each
/// commit (none, either, both). Where the actor that moved last cannot move on (it
/// finished, crashed, or waits for the queue), every choice is explored at no cost. Not
/// explored: schedules with more preemptions than the bound (without the bound the tree has
/// more than 360,000 schedules even with no fault, past ten minutes here), any other
/// fault (crashes elsewhere, lost replies, refusals, late operations, failed publishes),
/// publishing after the answer, and more workers: the random sweeps cover those.
#[test]
fn two_transactions_on_one_entity_in_both_forms_publish_in_chain_order_at_every_bounded_interleaving() {
    let tally = explore_two_transactions_on_one_entity("two transactions on one entity, request 0 transactional", &[0]);
    if replaying() {
        return;
    }
    // Both ways round: a record sent first by the publisher of the entity-form commit
    // after it (through `Position::previous`), and an entry sent first by the publisher
    // of the transactional commit after it.
    assert!(tally.record_first > 0 && tally.entry_first > 0, "{tally:?}");
    assert!(
        tally.chains.placed > tally.chains.entity_form && tally.chains.entity_form > 0,
        "both forms were not placed: {tally:?}"
    );
}

/// The same exploration with both transactions in entity form: the earlier one an entry
/// that the later one read in the counter. What is and is not explored: as for
/// [`two_transactions_on_one_entity_in_both_forms_publish_in_chain_order_at_every_bounded_interleaving`].
#[test]
fn two_transactions_on_one_entity_in_entity_form_publish_in_chain_order_at_every_bounded_interleaving() {
    let tally = explore_two_transactions_on_one_entity("two transactions on one entity, both in entity form", &[]);
    if replaying() {
        return;
    }
    assert!(tally.entry_first > 0 && tally.record_first == 0, "{tally:?}");
    assert_eq!(tally.chains.placed, tally.chains.entity_form, "{tally:?}");
}

/// The same exploration with both transactions in the transactional form: the earlier
/// one a record beside the counter that only the later one's `Position::previous` names.
/// What is and is not explored: as for
/// [`two_transactions_on_one_entity_in_both_forms_publish_in_chain_order_at_every_bounded_interleaving`].
#[test]
fn two_transactions_on_one_entity_in_the_transactional_form_publish_in_chain_order_at_every_bounded_interleaving() {
    let tally = explore_two_transactions_on_one_entity("two transactions on one entity, both transactional", &[0, 1]);
    if replaying() {
        return;
    }
    assert!(tally.record_first > 0 && tally.entry_first == 0, "{tally:?}");
    assert_eq!(tally.chains.entity_form, 0, "{tally:?}");
}

/// What a bounded exploration in entity mode reached, summed over its schedules.
#[derive(Debug, Default)]
struct BoundedTally {
    entity: EntityTally,
    /// Deletes applied, and schedules in which one applied.
    deletes: usize,
    with_delete: usize,
    /// Schedules in which a transaction's entity commit was a create over the vacant key
    /// (its request read the key after the delete).
    /// Schedules with a late attempt that applied, and with one refused by the fence mark.
    late_applied: usize,
    fence_refused: usize,
    /// Schedules in which an attempt of a committed transaction was refused by the version
    /// its item continued at.
    refused_by_version: usize,
    /// Schedules in which a control message was sent twice (the fault of the schedule a
    /// duplicate send, where the exploration offers no other fault on sends), and in
    /// which one was redriven from the dead-letter queue in recovery.
    duplicated: usize,
    redriven: usize,
    /// Steps checked by the per-step checks.
    steps_checked: usize,
}

/// Explores `config` depth-first to exhaustion (within its preemption bound and fault
/// budget), checking each schedule against the invariants at the end and, where
/// `config.step_checks`, after every step; `skews` names the workers' clock skews the
/// config chooses from, to count them. Prints one line, and a replay line for a schedule
/// that breaks a check (`SIM_CHOICES`, with the bound's own `SIM_PREEMPTIONS`); a deep
/// bound prints a progress line a minute.
fn explore_bounded(name: &str, config: &SimConfig) -> BoundedTally {
    let bound = config.preemption_bound.expect("a bounded exploration");
    let duplicates_only_on_sends = config
        .faults_only
        .is_some_and(|faults| faults(Op::ControlSend) == [Fault::Duplicate]);
    let started = Instant::now();
    let mut tally = BoundedTally::default();
    let replay = |choices: &[usize]| {
        format!(
            "rerun it with SIM_PREEMPTIONS={bound} SIM_CHOICES={} cargo test -p outbox-sim --test simulation -- <this test> --exact --nocapture",
            replay_arg(choices)
        )
    };
    let mut prefix = Some(start_choices());
    let mut reported = Instant::now();
    while let Some(choices) = prefix {
        if reported.elapsed() >= Duration::from_secs(60) {
            reported = Instant::now();
            eprintln!(
                "{name}: {} schedules in {:.0?} so far (at most {bound} preemptions); at SIM_CHOICES={}",
                tally.entity.schedules,
                started.elapsed(),
                replay_arg(&choices)
            );
        }
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_schedule(&mut chooser, config).unwrap_or_else(|error| {
            panic!(
                "{name}: schedule {}: {error}\n{}",
                replay_arg(&choices),
                replay(&choices)
            )
        });
        if let Err(violation) = outcome.observed.check() {
            panic!(
                "{name}: schedule {}: {violation}\n{:#?}\n{}",
                replay_arg(&choices),
                outcome.observed,
                replay(&choices)
            );
        }
        tally.entity.add(&outcome);
        tally.deletes += outcome.observed.deletes;
        tally.with_delete += usize::from(outcome.observed.deletes > 0);
        tally.late_applied += usize::from(outcome.late.commits.1 > 0);
        tally.fence_refused += usize::from(outcome.late.fence_refused > 0);
        tally.refused_by_version += usize::from(outcome.chains.refused_by_version > 0);
        tally.duplicated += usize::from(outcome.faults > outcome.late.commits.0 && duplicates_only_on_sends);
        tally.redriven += usize::from(outcome.redrives > 0);
        tally.steps_checked += outcome.steps_checked;
        prefix = chooser.next_prefix();
    }
    println!(
        "{name}: {} schedules (at most {bound} preemptions, at most {} fault) in {:.2?}; {} with a fault; deletes applied in {}; a late attempt applied in {}, refused by the fence mark in {}; an attempt of a committed transaction refused by the continued version in {}; a control message sent twice in {}, redriven in {}; {} steps checked one by one; requests ended: {:?}; {}",
        tally.entity.schedules,
        config.fault_budget,
        started.elapsed(),
        tally.entity.with_fault,
        tally.with_delete,
        tally.late_applied,
        tally.fence_refused,
        tally.refused_by_version,
        tally.duplicated,
        tally.redriven,
        tally.steps_checked,
        tally.entity.endings,
        chains_line(name, tally.entity.schedules, &tally.entity.chains),
    );
    tally
}

/// The bounded explorations' base: entity mode, one item, one request, one worker, a
/// 2 s window (the first check at 1 s defers once, the second fences), the per-step
/// checks on, at most `SIM_PREEMPTIONS` preemptions (2 unless set).
/// The requests of the entity-mode explorations send their control message before their
/// read ([`SimConfig::sends_early`]), as every request did before the message moved to the
/// commit: these explorations are about fences, late attempts and an item's lives, which
/// the moment of the send does not change, and so keep their figures (docs/PROTOCOL.md,
/// "Bounded exhaustive checking"). The send at the commit is explored by the one-
/// transaction explorations and the random sweeps.
fn bounded_base() -> SimConfig {
    SimConfig {
        timing: sim_timing(2),
        preemption_bound: Some(preemptions()),
        step_checks: true,
        vacant: false,
        sends_early: true,
        ..in_entity_mode(one_transaction(false))
    }
}

/// Faults of the late-attempt explorations: any commit (a request's one conditional
/// write, the deleter's delete and create) times out with its request on its way, a
/// ghost that applies at whatever later step the scheduler picks.
fn late_commit(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::Late],
        _ => vec![],
    }
}

/// [`late_commit`], or the commit applied with its reply lost.
fn late_or_lost_commit(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::Late, Fault::ReplyLost],
        _ => vec![],
    }
}

/// One fault of any kind at any step: every call's crashes before and after, lost
/// replies and refusals, and a commit's late attempt too.
fn any_fault(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![
            Fault::Late,
            Fault::CrashBefore,
            Fault::CrashAfter,
            Fault::ReplyLost,
            Fault::Fail,
        ],
        // A late attempt applies when the scheduler lets it.
        Op::LateCommit => vec![],
        op => op.faults(false),
    }
}

/// A duplicate send of a control message (delivered twice, to either worker), or a late
/// commit.
fn duplicate_or_late(op: Op) -> Vec<Fault> {
    match op {
        Op::ControlSend => vec![Fault::Duplicate],
        Op::Commit => vec![Fault::Late],
        _ => vec![],
    }
}

/// The workers' clock skews the explorations choose one from per schedule: 3 s behind the
/// API's (and AWS's) time, none, 3 s ahead: past the 2 s window either way, so that a
/// worker fences at its first check a transaction whose request, by its own clock, may
/// still commit, or defers past the window's end. (A worker ahead by the retention or
/// more takes a fresh control message for stale and drops it, losing a committed
/// transaction's messages: clocks that far apart are outside what the protocol takes,
/// docs/PROTOCOL.md section 6.)
const WORKER_SKEWS: &[i64] = &[-3_000, 0, 3_000];

/// A late attempt across a delete and a re-create, explored depth-first to exhaustion
/// within a bound: one request incrementing `COUNTER#0` in entity mode, the deleter
/// deleting the counter (once it holds no entries) and creating it again, each a
/// transaction of the request path that reads the counter and writes at the version
/// read, and one control worker; at most one fault per schedule: any commit attempt (the
/// request's, the delete's, the create's) timed out with its request on its way, applied
/// by a ghost at any later step; at most 1 preemption (`SIM_PREEMPTIONS`). The request
/// may read the counter before the delete (it increments the first life) or after it (it
/// creates the second life over the vacant key, racing the deleter's create); a late
/// attempt lands after its retry committed and the worker settled it, after the worker
/// fenced its transaction past the window, after the delete, or after the re-create:
/// the version the key continued at, or the fence mark, must refuse it. Checked after
/// every step and at the end.
///
/// Not explored: a second preemption (past three minutes here with the deleter; the
/// vacant-key exploration below takes two), faults other than a late commit (the
/// any-fault exploration below, without the deleter), more requests or workers,
/// publishing inline, a late attempt lost on its way.
#[test]
fn entity_mode_a_late_attempt_across_a_delete_and_a_re_create_is_refused_at_every_bounded_interleaving() {
    let name = "bounded: a late attempt across a delete and a re-create";
    let config = SimConfig {
        deletes: true,
        faults_only: Some(late_commit),
        preemption_bound: Some(std::env::var("SIM_PREEMPTIONS").map_or(1, |_| preemptions())),
        ..bounded_base()
    };
    let tally = explore_bounded(name, &config);
    if replaying() {
        return;
    }
    assert!(tally.with_delete > 0, "{name}: no delete applied: {tally:?}");
    assert!(tally.late_applied > 0, "{name}: no late attempt applied: {tally:?}");
    assert!(
        tally.refused_by_version > 0,
        "{name}: no attempt refused by the continued version: {tally:?}"
    );
    assert!(
        tally.fence_refused > 0,
        "{name}: no attempt refused by the fence mark: {tally:?}"
    );
    assert_reached(&tally.entity.endings, &["committed", "commit window expired"]);
}

/// Creates over a vacant key, explored depth-first to exhaustion within a bound: the
/// counter is deleted before the schedule starts (its key vacant at version 2), one
/// request in entity mode reads it vacant and creates it at the version read, one control
/// worker whose clock is 3 s behind, on time or 3 s ahead (chosen per schedule,
/// [`WORKER_SKEWS`]);
/// at most one fault: the create's attempt timed out with its request on its way
/// (applied by a ghost at any later step) or applied with its reply lost; at most 2
/// preemptions. The worker fences the transaction in the vacant key past the window, or
/// the request's settling write does: the mark the vacant key keeps must refuse the late
/// create, and a request told "fenced" never committed.
///
/// Not explored: a create racing another create (the late-attempt exploration above has
/// the deleter's), more preemptions, other faults.
#[test]
fn entity_mode_a_late_create_over_a_vacant_key_is_refused_at_every_bounded_interleaving() {
    let name = "bounded: a late create over a vacant key";
    let config = SimConfig {
        vacant: true,
        faults_only: Some(late_or_lost_commit),
        worker_skews: WORKER_SKEWS,
        ..bounded_base()
    };
    let tally = explore_bounded(name, &config);
    if replaying() {
        return;
    }
    assert!(tally.late_applied > 0, "{name}: no late attempt applied: {tally:?}");
    assert!(
        tally.fence_refused > 0,
        "{name}: no late create refused by the fence mark: {tally:?}"
    );
    assert_reached(
        &tally.entity.endings,
        &[
            "committed",
            "fenced (unknown, settled by its tombstone)",
            "commit window expired",
        ],
    );
}

/// One fault of any kind at any step, explored depth-first to exhaustion within a
/// bound: one request incrementing `COUNTER#0` in entity mode, one control worker whose
/// clock is 3 s behind, on time or 3 s ahead of the request path's (chosen per schedule,
/// [`WORKER_SKEWS`]); at most one fault per schedule, at any call: a crash before or after it, a
/// lost reply, a refusal, or for a commit its attempt timed out with its request on its
/// way (applied by a ghost at any later step); at most 2 preemptions.
///
/// Not explored: a second fault, more preemptions, the deleter (the late-attempt
/// exploration above), more requests or workers.
#[test]
fn entity_mode_one_fault_at_any_step_with_clocks_disagreeing_keeps_the_invariants_at_every_bounded_interleaving() {
    let name = "bounded: one fault at any step, clocks disagreeing";
    let config = SimConfig {
        faults_only: Some(any_fault),
        worker_skews: WORKER_SKEWS,
        ..bounded_base()
    };
    let tally = explore_bounded(name, &config);
    if replaying() {
        return;
    }
    assert!(
        tally.entity.with_fault > tally.entity.schedules / 2,
        "{name}: {tally:?}"
    );
    assert!(tally.late_applied > 0 && tally.fence_refused > 0, "{name}: {tally:?}");
    assert_reached(
        &tally.entity.endings,
        &[
            "committed",
            "api crashed",
            "commit window expired",
            "fenced (unknown, settled by its tombstone)",
        ],
    );
}

/// Three transactions on two items, explored depth-first to exhaustion within a bound:
/// three requests in entity mode, requests 0 and 2 incrementing `COUNTER#0` and request
/// 1 `COUNTER#1`, two control workers; at most one fault per schedule: a control message
/// sent twice (both copies delivered, to either worker, at once or one after the other)
/// or a commit's attempt timed out with its request on its way (applied by a ghost at
/// any later point); no preemption (`SIM_PREEMPTIONS=0` unless set): an actor runs until
/// it ends, crashes or waits (for the queue, or for the clock), and at each such point
/// every actor may go next, so the two requests on `COUNTER#0` race only through a late
/// attempt, whose ghost lands after the other's commit (refused by the version) or before
/// it (the other then reads it). Checked after every step and at the end, the chains of
/// both items included.
///
/// Not explored: preemptions (one is past three minutes here), other faults, the deleter.
#[test]
fn entity_mode_three_transactions_on_two_items_with_a_duplicated_control_message_keep_the_invariants_at_every_bounded_interleaving(
) {
    let name = "bounded: three transactions on two items, two workers, a duplicate";
    let config = SimConfig {
        transactions: 3,
        items: 2,
        workers: 2,
        faults_only: Some(duplicate_or_late),
        preemption_bound: Some(std::env::var("SIM_PREEMPTIONS").map_or(0, |_| preemptions())),
        ..bounded_base()
    };
    let tally = explore_bounded(name, &config);
    if replaying() {
        return;
    }
    assert!(tally.duplicated > 0, "{name}: no control message sent twice: {tally:?}");
    assert!(tally.late_applied > 0, "{name}: no late attempt applied: {tally:?}");
    assert!(
        tally.refused_by_version > 0,
        "{name}: no attempt refused by the continued version: {tally:?}"
    );
    assert!(tally.entity.chains.placed > 0, "{name}: {tally:?}");
    assert_reached(&tally.entity.endings, &["committed", "commit window expired"]);
}

/// A create over a vacant key, its item deleted again, explored depth-first to
/// exhaustion within a bound: the counter deleted before the start (its key vacant at
/// version 2), one request in entity mode that reads it vacant and creates it at the
/// version read, the deleter (it deletes the item the request created, once it holds no
/// entries, and creates it again), one control worker; at most one fault: any commit
/// timed out with its request on its way, applied by a late attempt at any later step; at
/// most 1 preemption. The request's late create may land after its retry committed and
/// the deleter emptied the key again: the version the key continued at must refuse it
/// there, as a key's version read vacant is one of that vacancy only.
///
/// Not explored: more preemptions, other faults, other requests.
#[test]
fn entity_mode_a_late_create_across_a_second_delete_is_refused_at_every_bounded_interleaving() {
    let name = "bounded: a late create across a second delete";
    let config = SimConfig {
        vacant: true,
        deletes: true,
        faults_only: Some(late_commit),
        preemption_bound: Some(std::env::var("SIM_PREEMPTIONS").map_or(1, |_| preemptions())),
        ..bounded_base()
    };
    let tally = explore_bounded(name, &config);
    if replaying() {
        return;
    }
    // The seed's delete is one in every schedule; the deleter's are the others.
    assert!(
        tally.deletes > tally.entity.schedules,
        "{name}: the deleter deleted nothing: {tally:?}"
    );
    assert!(tally.late_applied > 0, "{name}: no late attempt applied: {tally:?}");
    assert!(
        tally.refused_by_version > 0,
        "{name}: no attempt refused by the continued version: {tally:?}"
    );
    assert_reached(&tally.entity.endings, &["committed"]);
}
