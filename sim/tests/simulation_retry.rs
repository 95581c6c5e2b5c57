//! The deterministic simulation of requests that contend for one item through the
//! deadline middleware and `RequestScope::retry_conflicts`: two requests increment one
//! counter, each its own process (request path), so that one's commit may meet the
//! other's and run its step again, in a new transaction, until its deadline. Every
//! interleaving of the two under a sequence of faults on the commit and the settling
//! write, under the request-first order and random ones, with the clock moving past the
//! deadlines at random points. Checked at the end of each schedule: the invariants I1 to
//! I7 and the business state (the counter counts each committed transaction once); each
//! request commits at most one transaction (a retry never applies a change twice); no
//! answer is a version conflict (the business rule allows every increment); a success
//! names a committed transaction and "nothing written" one that never commits.
//!
//! Random orders seldom let a retry finish (the clock moves to the deadline at any
//! step), so a second exploration makes it happen: one request runs a number of steps,
//! the other runs to its end, then the first goes on (its commit meets the other's
//! change, it reads again and commits in a later round), at every switching point and
//! with every fault, one per schedule, at every step of either request and the worker:
//! at the conflicting commit, at the retry's control message, read, commit and settling
//! write.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox_sim::{
    invariants::Observed, run_schedule, sim_timing, ApiResult, Chooser, DepthFirst, Fault, FaultsDepthFirst, Op,
    SimConfig,
};

fn two_contenders(entity: bool) -> SimConfig {
    SimConfig {
        transactions: 2,
        items: 1,
        workers: 1,
        fault_budget: 1,
        random_extras: false,
        max_steps: 2_000,
        timing: sim_timing(60),
        deadline: None,
        retry_loop: None,
        inline: false,
        abandon_every: 0,
        faults_only: Some(commit_and_settle),
        middleware: Some(Duration::from_secs(10)),
        entity,
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

fn commit_and_settle(op: Op) -> Vec<Fault> {
    match op {
        Op::Commit => vec![Fault::ReplyLost, Fault::Late, Fault::Busy],
        Op::Tombstone => vec![Fault::Fail],
        _ => vec![],
    }
}

#[test]
fn contending_requests_retry_to_their_deadline_and_never_apply_twice_nor_answer_a_conflict() {
    let started = Instant::now();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let (mut schedules, mut met_conflict, mut completed) = (0, 0, 0);
    for (name, entity) in [("transactional", false), ("entity mode", true)] {
        let config = two_contenders(entity);
        for seed in std::iter::once(None).chain((1..=40).map(Some)) {
            let mut prefix = Some(Vec::new());
            while let Some(choices) = prefix {
                let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
                // The retry's jitter draws from this thread's generator, which the
                // schedule's actors run on: seeded, the same choices replay the same
                // schedule.
                fastrand::seed(seed.unwrap_or(0));
                let outcome = run_schedule(&mut chooser, &config)
                    .unwrap_or_else(|error| panic!("{name}, seed {seed:?}, faults {choices:?}: {error}"));
                let context = format!("{name}, seed {seed:?}, faults {choices:?}");
                let tally = check(&context, &outcome.observed);
                for kind in tally.answers {
                    *answers.entry(format!("{name}: {kind}")).or_default() += 1;
                }
                met_conflict += usize::from(tally.met_conflict);
                completed += usize::from(tally.completed_retry);
                schedules += 1;
                prefix = chooser.next_prefix();
            }
        }
    }
    println!(
        "retry_conflicts, random orders: {schedules} schedules of two contending requests in {:.2?}; {met_conflict} where a step met a conflict and ran again, {completed} where it then committed; answers: {answers:?}",
        started.elapsed()
    );
    for reached in [
        "transactional: committed",
        "entity mode: committed",
        "transactional: nothing written (503)",
        "entity mode: nothing written (503)",
    ] {
        assert!(answers.contains_key(reached), "{reached} never reached: {answers:?}");
    }
}

/// What one schedule's answers were, once checked.
struct Tally {
    /// Each answer's kind.
    answers: Vec<&'static str>,
    /// Whether a request's step ran more than once (a commit met a version conflict).
    met_conflict: bool,
    /// Whether a request's step ran more than once and its request then succeeded: a
    /// retry that completed.
    completed_retry: bool,
}

/// The checks of every schedule (`context` names it): the invariants; every request
/// transaction that committed is the one its request's answer names, never an earlier
/// attempt it ran again after (a retry never applies a change twice); no answer is a
/// version conflict. Crashed requests have no answer to check.
fn check(context: &str, observed: &Observed) -> Tally {
    if let Err(violation) = observed.check() {
        panic!("{context}: {violation}\n{observed:#?}");
    }
    // The ones that sent a control message; the counter's setup sends none.
    let named: Vec<_> = observed
        .api_results
        .iter()
        .filter_map(|result| match result {
            ApiResult::Http { named, .. } => *named,
            _ => None,
        })
        .collect();
    let crashed = observed
        .api_results
        .iter()
        .any(|result| matches!(result, ApiResult::Crashed));
    for txn_id in observed
        .commits
        .keys()
        .filter(|txn| observed.control_sent.contains_key(txn))
    {
        // A request that crashed answered nothing, and may have committed.
        assert!(
            named.contains(txn_id) || crashed,
            "{context}: {txn_id} committed, and no answer names it\n{observed:#?}"
        );
    }
    let mut tally = Tally {
        answers: Vec::new(),
        met_conflict: false,
        completed_retry: false,
    };
    for result in &observed.api_results {
        let (status, timed_out, unknown, attempts) = match result {
            ApiResult::Http {
                status,
                timed_out,
                unknown,
                attempts,
                ..
            } => (*status, *timed_out, *unknown, *attempts),
            ApiResult::Crashed => {
                tally.answers.push("crashed");
                continue;
            }
            other => panic!("{context}: a request not through the middleware: {other:?}"),
        };
        assert_ne!(status, 409, "{context}: a version conflict answered\n{observed:#?}");
        tally.answers.push(match (status, timed_out, unknown) {
            (200..=299, _, _) => "committed",
            (_, _, true) => "outcome unknown",
            (_, _, false) => "nothing written (503)",
        });
        tally.met_conflict |= attempts > 1;
        tally.completed_retry |= attempts > 1 && (200..300).contains(&status);
    }
    tally
}

/// The order of one request switching to the other once: the actor that moved last goes
/// on while it can (the first option under a preemption bound), except at decision
/// `switch_at`, where the next one moves instead; where the last one cannot move on, the
/// first that can (the requests, then the worker, then the clock). Faults come
/// depth-first, as [`FaultsDepthFirst`]'s.
struct SwitchOnce {
    switch_at: usize,
    decisions: usize,
    faults: DepthFirst,
}

impl Chooser for SwitchOnce {
    fn pick(&mut self, _n: usize) -> usize {
        self.decisions += 1;
        usize::from(self.decisions - 1 == self.switch_at)
    }

    fn fault(&mut self, n: usize) -> usize {
        self.faults.fault(n)
    }

    fn chance(&mut self, _percent: u32) -> bool {
        false
    }
}

/// Every fault of the request path's steps and the worker's, beyond the commit's
/// unknown outcomes and contention: a crash before or after, a lost reply, a refusal.
fn every_step(op: Op) -> Vec<Fault> {
    use Fault::*;
    match op {
        Op::Commit => vec![CrashBefore, CrashAfter, ReplyLost, Fail, Busy, Late],
        Op::EntityWrite | Op::ControlSend | Op::Tombstone => vec![CrashBefore, CrashAfter, ReplyLost, Fail],
        Op::Read | Op::Receive => vec![CrashBefore, Fail],
        Op::LateCommit | Op::LateTombstone | Op::LateSend => vec![Fail],
        _ => vec![],
    }
}

/// Retries that complete: the first request runs `switch_at` decisions, the second runs
/// to its end, then the first goes on, for every switching point up to 12 and every
/// fault (one per schedule, depth-first) at every step of both requests and the worker:
/// the same checks as above, and in each mode some schedule where a request's commit met
/// a version conflict, its step read again and its request succeeded (the test fails if
/// retries are never exercised).
#[test]
fn a_request_whose_commit_met_a_conflict_reads_again_and_commits_whatever_fails_on_the_way() {
    let started = Instant::now();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let (mut schedules, mut met_conflict, mut with_a_fault) = (0, 0, 0);
    let mut completed: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, entity) in [("transactional", false), ("entity mode", true)] {
        let config = SimConfig {
            faults_only: Some(every_step),
            preemption_bound: Some(1),
            ..two_contenders(entity)
        };
        for switch_at in 0..12 {
            let mut prefix = Some(Vec::new());
            while let Some(choices) = prefix {
                let mut chooser = SwitchOnce {
                    switch_at,
                    decisions: 0,
                    faults: DepthFirst::new(choices.clone()),
                };
                fastrand::seed(0);
                let context = format!("{name}, switching at decision {switch_at}, faults {choices:?}");
                let outcome = run_schedule(&mut chooser, &config).unwrap_or_else(|error| panic!("{context}: {error}"));
                let tally = check(&context, &outcome.observed);
                for kind in tally.answers {
                    *answers.entry(format!("{name}: {kind}")).or_default() += 1;
                }
                met_conflict += usize::from(tally.met_conflict);
                if tally.completed_retry {
                    *completed.entry(name).or_default() += 1;
                    with_a_fault += usize::from(outcome.faults > 0);
                }
                schedules += 1;
                prefix = chooser.faults.next_prefix();
            }
        }
    }
    println!(
        "retry_conflicts, one switch: {schedules} schedules of two contending requests in {:.2?}; {met_conflict} where a step met a conflict and ran again; completed retries: {completed:?} ({with_a_fault} of them with a fault somewhere); answers: {answers:?}",
        started.elapsed()
    );
    for name in ["transactional", "entity mode"] {
        assert!(
            completed.get(name).is_some_and(|count| *count > 0),
            "{name}: no schedule where a step met a conflict, read again and committed: {completed:?}"
        );
    }
}

/// Two requests of two processes add one to the same counter (counter commits,
/// [`SimConfig::adds`]): the second's step reads the counter as the first one does, and
/// with a read-modify-write their commits would conflict. Every switching point up to 12
/// and every fault, one per schedule, at every step of both requests and the worker, and
/// 40 random orders under every fault sequence on the commit and the settling write
/// (late commits among them: a counter write still on its way after its request gave
/// it up). Checked in each: the invariants (each committed transaction counted once in
/// the counter, the chain of its messages whole and in commit order: no gap, no fork);
/// no step ever ran twice (a counter commit never meets a version conflict); no request
/// transaction committed that no answer names; no answer is a conflict.
#[test]
fn contending_counter_additions_never_conflict_and_keep_their_place_whatever_fails() {
    let started = Instant::now();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let mut schedules = 0;
    let base = SimConfig {
        adds: true,
        ..two_contenders(true)
    };
    let mut run = |name: &str, config: &SimConfig, chooser: &mut dyn Chooser, seed: u64| {
        fastrand::seed(seed);
        let outcome = run_schedule(chooser, config).unwrap_or_else(|error| panic!("{name}: {error}"));
        let tally = check(name, &outcome.observed);
        assert!(
            !tally.met_conflict,
            "{name}: a counter commit met a conflict\n{:#?}",
            outcome.observed
        );
        for kind in tally.answers {
            *answers.entry(kind.to_owned()).or_default() += 1;
        }
        schedules += 1;
    };
    let switching = SimConfig {
        faults_only: Some(every_step),
        preemption_bound: Some(1),
        ..base.clone()
    };
    for switch_at in 0..12 {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = SwitchOnce {
                switch_at,
                decisions: 0,
                faults: DepthFirst::new(choices.clone()),
            };
            run(
                &format!("adds, switching at decision {switch_at}, faults {choices:?}"),
                &switching,
                &mut chooser,
                0,
            );
            prefix = chooser.faults.next_prefix();
        }
    }
    for seed in std::iter::once(None).chain((1..=40).map(Some)) {
        let mut prefix = Some(Vec::new());
        while let Some(choices) = prefix {
            let mut chooser = FaultsDepthFirst::new(choices.clone(), seed);
            run(
                &format!("adds, seed {seed:?}, faults {choices:?}"),
                &base,
                &mut chooser,
                seed.unwrap_or(0),
            );
            prefix = chooser.next_prefix();
        }
    }
    println!(
        "counter additions: {schedules} schedules of two contending requests in {:.2?}; answers: {answers:?}",
        started.elapsed()
    );
    for reached in ["committed", "nothing written (503)", "outcome unknown", "crashed"] {
        assert!(answers.contains_key(reached), "{reached} never reached: {answers:?}");
    }
}
