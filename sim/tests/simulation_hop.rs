//! Order past the first hop: two transactions on one entity through a consumer that
//! publishes to an in-order consumer, each hop's source FIFO or standard with a
//! dead-letter queue behind it, explored depth-first with one fault anywhere.

use std::time::Instant;

use outbox_sim::{run_hop_schedule, DepthFirst, HopConfig, HopCounts, HopInput, Seeded, BILLING, SHIPPING};

/// Explores `config` depth-first to exhaustion, or its first `limit` schedules; panics on
/// the first schedule that breaks a check, naming its choices.
fn explore(config: &HopConfig, limit: usize) -> HopCounts {
    let mut counts = HopCounts::default();
    let mut prefix = Some(Vec::new());
    while let Some(choices) = prefix.filter(|_| counts.schedules < limit) {
        let mut chooser = DepthFirst::new(choices.clone());
        let outcome = run_hop_schedule(&mut chooser, config)
            .unwrap_or_else(|error| panic!("{}: schedule {choices:?}: {error}", config.name()));
        counts.add(&outcome.counts);
        prefix = chooser.next_prefix();
    }
    counts
}

/// Every configuration of the sweep: each input, each kind of source per hop, each mode
/// per consumer; batches of one, and of ten where both sources are FIFO.
fn configurations(fault_budget: usize) -> Vec<HopConfig> {
    let mut all = Vec::new();
    for input in [HopInput::InOrder, HopInput::SentAgain, HopInput::Reversed] {
        for (events_fifo, shipments_fifo) in [(true, true), (true, false), (false, true), (false, false)] {
            for (shipping_entity, billing_entity) in [(false, false), (true, true), (true, false), (false, true)] {
                for batch in [1, 10] {
                    if batch > 1 && !(events_fifo && shipments_fifo) {
                        continue;
                    }
                    // A standard queue delivers a message twice anyway (a fault of the
                    // exploration): a copy sent again is the same thing. And its chooser
                    // picks the order of delivery: the input's order adds nothing.
                    if input != HopInput::InOrder && !events_fifo {
                        continue;
                    }
                    all.push(HopConfig {
                        events_fifo,
                        shipments_fifo,
                        shipping_entity,
                        billing_entity,
                        batch,
                        ..HopConfig::new(input, fault_budget)
                    });
                }
            }
        }
    }
    all
}

/// The request path's two transactions on `ORDER#a`, through `shipping` (which applies
/// each in order and publishes one message per event) to `billing` (in order), explored
/// depth-first to exhaustion, one batch at a time: every order of delivery with no fault,
/// then with one fault anywhere (a crash before or after any read, commit, mark, keep,
/// removal, publish or requeue of either consumer; a read, commit, mark, publish or
/// requeue refused; a commit's or mark's reply lost; a commit meeting contention or
/// timing out on its way, applied later or lost; a publish's first entry refused), in
/// every configuration: the events in order, one sent again, or reversed; each source
/// FIFO or standard; each consumer transactional or in entity mode; batches of one and,
/// on FIFO sources, of ten. After each: no dead-letter queue holds anything, every queue
/// is empty, shipping applied 1, 2, shipments received one placed message per event in
/// the event's order (first sends in seq order on FIFO), billing applied (1, 1), (2, 2)
/// and holds its position at 2, and nothing is kept.
#[test]
fn two_transactions_through_a_publishing_consumer_reach_the_last_consumer_once_each_in_order() {
    let started = Instant::now();
    let mut calm = HopCounts::default();
    for config in configurations(0) {
        calm.add(&explore(&config, usize::MAX));
    }
    let calm_time = started.elapsed();
    let mut faulted = HopCounts::default();
    let mut per_config = Vec::new();
    for config in configurations(1) {
        let counts = explore(&config, usize::MAX);
        per_config.push((config.name(), counts.schedules));
        faulted.add(&counts);
    }
    let fault_time = started.elapsed() - calm_time;
    println!(
        "hop: {} configurations; every order with no fault: {} schedules in {calm_time:.2?}; with one fault anywhere: {} schedules in {fault_time:.2?}, {} steps; deliveries ended: {:?}; faults: {:?}; redeliveries {}, most receives of one message {}, late commits {:?}, batches of many {}",
        per_config.len(),
        calm.schedules,
        faulted.schedules,
        faulted.steps,
        faulted.outcomes,
        faulted.faults,
        faulted.redeliveries,
        faulted.most_receives,
        faulted.late_commits,
        faulted.batches_of_many,
    );
    for (name, schedules) in &per_config {
        println!("  {name}: {schedules}");
    }
    for (consumer, outcome) in [
        (SHIPPING, "processed"),
        (SHIPPING, "kept"),
        (SHIPPING, "duplicate"),
        (BILLING, "processed"),
        (BILLING, "duplicate"),
        (SHIPPING, "crashed"),
        (BILLING, "crashed"),
    ] {
        assert!(
            faulted.outcome(consumer, outcome) > 0,
            "no {consumer} delivery ended {outcome:?}: {faulted:?}"
        );
    }
    assert!(
        faulted.late_commits.1 > 0,
        "no late commit reached the table: {faulted:?}"
    );
    assert!(
        faulted.batches_of_many > 0,
        "no batch held more than one message: {faulted:?}"
    );
}

/// Two batches at once: the hops overlap, and on a standard source two copies of one
/// entity's events are consumed concurrently. Depth-first, every interleaving with at
/// most `SIM_PREEMPTIONS` preemptions (default 2) and `SIM_HOP_FAULTS` faults (default 0)
/// of each configuration, then seeded schedules with any number of preemptions and up to
/// one fault.
#[test]
fn two_at_once_keep_order_through_the_hop() {
    let setting = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let (preemptions, faults) = (setting("SIM_PREEMPTIONS", 2), setting("SIM_HOP_FAULTS", 0));
    let started = Instant::now();
    let mut interleaved = HopCounts::default();
    for config in configurations(faults) {
        let config = HopConfig {
            max_in_flight: 2,
            max_preemptions: Some(preemptions),
            ..config
        };
        let counts = explore(&config, usize::MAX);
        println!("  {}: {}", config.name(), counts.schedules);
        interleaved.add(&counts);
    }
    let interleaved_time = started.elapsed();
    let mut seeded = HopCounts::default();
    let configs = configurations(1);
    for seed in 0..600u64 {
        let config = HopConfig {
            max_in_flight: 2,
            fault_budget: (seed % 3).min(1) as usize,
            ..configs[seed as usize % configs.len()].clone()
        };
        let mut chooser = Seeded::new(seed, 10);
        let outcome = run_hop_schedule(&mut chooser, &config)
            .unwrap_or_else(|error| panic!("{}: seed {seed}: {error}", config.name()));
        seeded.add(&outcome.counts);
    }
    println!(
        "hop, two at once: {} schedules depth-first with at most {preemptions} preemptions and {faults} fault(s) over {} configurations, in {interleaved_time:.2?}; {} seeded schedules with up to one fault; deliveries ended: {:?}; faults: {:?}",
        interleaved.schedules,
        configs.len(),
        seeded.schedules,
        interleaved.outcomes,
        seeded.faults
    );
}
