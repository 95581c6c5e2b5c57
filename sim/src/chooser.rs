//! Where the simulation's decisions come from.

/// Makes every decision of a schedule.
pub trait Chooser {
    /// Which of `n` options (n >= 2) to take.
    fn pick(&mut self, n: usize) -> usize;

    /// Which fault an operation meets: 0 for none, else 1 to `n` for the n-th fault.
    fn fault(&mut self, n: usize) -> usize;

    /// Whether to do something that happens with probability `percent` in random runs.
    fn chance(&mut self, percent: u32) -> bool;
}

/// Replays a prefix of choices, then takes the first option of every further decision,
/// recording each decision so that the explorer can enumerate the tree depth-first.
#[derive(Debug, Default)]
pub struct DepthFirst {
    prefix: Vec<usize>,
    trace: Vec<(usize, usize)>,
}

impl DepthFirst {
    /// A chooser that replays `prefix`.
    pub fn new(prefix: Vec<usize>) -> Self {
        Self {
            prefix,
            trace: Vec::new(),
        }
    }

    fn take(&mut self, n: usize) -> usize {
        let position = self.trace.len();
        let choice = self.prefix.get(position).copied().unwrap_or(0);
        assert!(
            choice < n,
            "replayed choice {choice} of {n} at decision {position}: the schedule is not deterministic"
        );
        self.trace.push((choice, n));
        choice
    }

    /// The prefix of the next schedule in depth-first order, or `None` when the tree is
    /// exhausted.
    pub fn next_prefix(mut self) -> Option<Vec<usize>> {
        while let Some((choice, n)) = self.trace.pop() {
            if choice + 1 < n {
                self.trace.push((choice + 1, n));
                return Some(self.trace.into_iter().map(|(choice, _)| choice).collect());
            }
        }
        None
    }
}

impl Chooser for DepthFirst {
    fn pick(&mut self, n: usize) -> usize {
        self.take(n)
    }

    fn fault(&mut self, n: usize) -> usize {
        self.take(n + 1)
    }

    fn chance(&mut self, _percent: u32) -> bool {
        // Exhaustive runs enumerate faults and orders, not random events.
        false
    }
}

/// Enumerates every fault decision depth-first, like [`DepthFirst`], but takes the
/// order of actors from a seeded random source, or always the first option (the first
/// actor that can move, before the clock): it explores every sequence of faults (retry
/// loops run to their end) without multiplying each by every interleaving. Replaying a
/// prefix with the same seed replays the same schedule, because the random source is
/// consumed in the same order up to where the prefix ends.
#[derive(Debug)]
pub struct FaultsDepthFirst {
    faults: DepthFirst,
    order: Option<fastrand::Rng>,
}

impl FaultsDepthFirst {
    /// A chooser that replays the fault decisions `prefix`, with orders from `seed`, or
    /// always the first option when `seed` is `None`.
    pub fn new(prefix: Vec<usize>, seed: Option<u64>) -> Self {
        Self {
            faults: DepthFirst::new(prefix),
            order: seed.map(fastrand::Rng::with_seed),
        }
    }

    /// The prefix of the next fault sequence, or `None` when every one was run.
    pub fn next_prefix(self) -> Option<Vec<usize>> {
        self.faults.next_prefix()
    }
}

impl Chooser for FaultsDepthFirst {
    fn pick(&mut self, n: usize) -> usize {
        self.order.as_mut().map_or(0, |order| order.usize(..n))
    }

    fn fault(&mut self, n: usize) -> usize {
        self.faults.fault(n)
    }

    fn chance(&mut self, _percent: u32) -> bool {
        false
    }
}

/// Random decisions from a seed: a schedule is reproducible from its seed alone.
#[derive(Debug)]
pub struct Seeded {
    rng: fastrand::Rng,
    fault_percent: u32,
}

impl Seeded {
    /// Decisions from `seed`; each operation meets a fault with `fault_percent` percent
    /// probability.
    pub fn new(seed: u64, fault_percent: u32) -> Self {
        Self {
            rng: fastrand::Rng::with_seed(seed),
            fault_percent,
        }
    }

    /// A number in `range`.
    pub fn range(&mut self, range: std::ops::Range<u64>) -> u64 {
        self.rng.u64(range)
    }
}

impl Chooser for Seeded {
    fn pick(&mut self, n: usize) -> usize {
        self.rng.usize(..n)
    }

    fn fault(&mut self, n: usize) -> usize {
        if self.rng.u32(..100) < self.fault_percent {
            1 + self.rng.usize(..n)
        } else {
            0
        }
    }

    fn chance(&mut self, percent: u32) -> bool {
        self.rng.u32(..100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_first_enumerates_every_leaf_once() {
        // A tree: first decision of 2, then (for choice 0) one of 3, (for choice 1) none.
        let mut leaves = Vec::new();
        let mut prefix = Some(Vec::new());
        while let Some(p) = prefix {
            let mut chooser = DepthFirst::new(p);
            let first = chooser.pick(2);
            let second = if first == 0 { Some(chooser.pick(3)) } else { None };
            leaves.push((first, second));
            prefix = chooser.next_prefix();
        }
        assert_eq!(leaves, [(0, Some(0)), (0, Some(1)), (0, Some(2)), (1, None)]);
    }
}
