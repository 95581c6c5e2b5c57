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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox_tests::sim::{run_schedule, sim_timing, ApiResult, Fault, FaultsDepthFirst, Op, SimConfig};

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
    let (mut schedules, mut retried) = (0, 0);
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
                let observed = &outcome.observed;
                if let Err(violation) = observed.check() {
                    panic!("{name}, seed {seed:?}, faults {choices:?}: {violation}\n{observed:#?}");
                }
                // A retry never applies a change twice: every request transaction that
                // committed (the ones that sent a control message; the counter's setup
                // sends none) is the one its request's answer names, never an earlier
                // attempt it ran again after.
                let named: Vec<_> = observed
                    .api_results
                    .iter()
                    .filter_map(|result| match result {
                        ApiResult::Http { named, .. } => *named,
                        _ => None,
                    })
                    .collect();
                for txn_id in observed
                    .commits
                    .keys()
                    .filter(|txn| observed.control_sent.contains_key(txn))
                {
                    assert!(
                        named.contains(txn_id),
                        "{name}, seed {seed:?}, faults {choices:?}: {txn_id} committed, and no answer names it\n{observed:#?}"
                    );
                }
                for result in &observed.api_results {
                    let ApiResult::Http {
                        status,
                        timed_out,
                        unknown,
                        ..
                    } = result
                    else {
                        panic!("{name}: a request not through the middleware: {result:?}");
                    };
                    assert_ne!(
                        *status, 409,
                        "{name}, seed {seed:?}, faults {choices:?}: a version conflict answered\n{observed:#?}"
                    );
                    let kind = match (status, timed_out, unknown) {
                        (200..=299, _, _) => "committed",
                        (_, true, true) | (_, false, true) => "outcome unknown",
                        (_, _, false) => "nothing written (503)",
                    };
                    *answers.entry(format!("{name}: {kind}")).or_default() += 1;
                }
                // More transactions sent than requests: a step met a conflict and ran
                // again.
                retried += usize::from(observed.control_sent.len() > config.transactions);
                schedules += 1;
                prefix = chooser.next_prefix();
            }
        }
    }
    println!(
        "retry_conflicts: {schedules} schedules of two contending requests in {:.2?}; {retried} where a request sent more than one control message (a step ran again); answers: {answers:?}",
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
