//! How many rows a speculative step verifies: the cost of a step by its rows (the engine's,
//! measured) against the tokens each length emits (the sequence's).

/// A moving average `avg` after the new value `v` (recent steps weigh most).
fn blend(avg: f64, v: f64) -> f64 {
    avg + 0.3 * (v - avg)
}

/// Seconds of a speculative step by the rows it verified (moving averages), shared by the
/// engine's sequences: they depend on the model, the draft and the machine, not on the text,
/// so a new sequence chooses its verify length from its first steps on.
#[derive(Debug, Default)]
pub(crate) struct StepCosts {
    secs: Vec<(usize, f64)>,
}

impl StepCosts {
    /// Seconds of a step that verifies `rows` rows, once one has run.
    fn get(&self, rows: usize) -> Option<f64> {
        self.secs.iter().find(|e| e.0 == rows).map(|e| e.1)
    }

    /// Adds a step of `rows` rows that took `secs` seconds.
    fn record(&mut self, rows: usize, secs: f64) {
        match self.secs.iter_mut().find(|e| e.0 == rows) {
            Some(e) => e.1 = blend(e.1, secs),
            None => self.secs.push((rows, secs)),
        }
    }
}

/// How many rows the next speculative step verifies: the anchor alone (a plain decode step
/// that still feeds the draft its features), or the anchor and the first `L - 1` proposals of a
/// drafted block, for a few lengths `L` up to the block. Each length's speed is the tokens its
/// steps emit (this sequence's moving average) over a step's time ([`StepCosts`], the
/// engine's). A step that verified `L` rows also tells what any shorter length would have
/// emitted from the same proposals (`min(accepted, L' - 1) + 1`), so every length's tokens are
/// known once the full block has run. The fastest length is taken; where the draft is rarely
/// accepted (text it cannot guess) that is a short block or none, where it guesses well, the
/// whole block. A length without a time yet is run once. Every `explore_every` steps (doubling
/// up to 64 while the best stays the same; back to 8 when a shorter block accepts all its
/// proposals) the full block runs again, or, when it is the best, a shorter length in turn, so
/// the choice follows the text.
#[derive(Debug)]
pub(crate) struct VerifyRows {
    /// Always the full block (no choice).
    fixed: bool,
    /// The lengths, ascending: 1, then up to the block.
    lengths: Vec<usize>,
    /// Per length, tokens a step (moving averages).
    tokens: Vec<Option<f64>>,
    steps_since_explore: u32,
    explore_every: u32,
    /// The best length's index at the last choice, and how many steps explored shorter lengths.
    last_best: usize,
    explored: usize,
}

impl VerifyRows {
    const FIRST_RETRY: u32 = 8;

    /// A chooser for blocks of `block` rows; `fixed`: always the full block; `partial`: also
    /// the first quarter and half of a block.
    pub(crate) fn new(block: usize, fixed: bool, partial: bool) -> Self {
        let mut lengths = if partial {
            super::verify_lengths(block)
        } else {
            vec![1, block]
        };
        lengths.dedup();
        let n = lengths.len();
        Self {
            fixed,
            lengths,
            tokens: vec![None; n],
            steps_since_explore: 0,
            explore_every: Self::FIRST_RETRY,
            last_best: n - 1,
            explored: 0,
        }
    }

    /// Rows the next step verifies (1: no draft).
    pub(crate) fn next(&mut self, costs: &StepCosts) -> usize {
        let full = self.lengths.len() - 1;
        if self.fixed {
            return self.lengths[full];
        }
        // First the full block (it measures every length's tokens), then any length without a
        // time, longest first.
        if self.tokens[full].is_none() {
            return self.lengths[full];
        }
        if let Some(i) = (0..=full)
            .rev()
            .find(|&i| costs.get(self.lengths[i]).is_none())
        {
            return self.lengths[i];
        }
        let rate = |i: usize| {
            let secs = costs.get(self.lengths[i]).unwrap_or(f64::MAX);
            self.tokens[i].unwrap_or(1.0) / secs
        };
        let best = (0..=full)
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .expect("one length at least");
        if best != self.last_best {
            self.last_best = best;
            self.explore_every = Self::FIRST_RETRY;
        }
        self.steps_since_explore += 1;
        if self.steps_since_explore >= self.explore_every && full > 0 {
            self.steps_since_explore = 0;
            self.explore_every = (self.explore_every * 2).min(64);
            // The full block refreshes what every length would emit; when it is the best, the
            // shorter lengths' times are refreshed in turn.
            if best != full {
                return self.lengths[full];
            }
            self.explored += 1;
            return self.lengths[(self.explored - 1) % full];
        }
        self.lengths[best]
    }

    /// Records a step that verified `rows` rows, accepted `drafts` of its proposals and took
    /// `secs` seconds.
    pub(crate) fn record(&mut self, rows: usize, drafts: usize, secs: f64, costs: &mut StepCosts) {
        costs.record(rows, secs);
        for (i, &l) in self.lengths.iter().enumerate() {
            if l <= rows {
                let v = (drafts.min(l - 1) + 1) as f64;
                let slot = &mut self.tokens[i];
                *slot = Some(slot.map_or(v, |r| blend(r, v)));
            }
        }
        // Every proposal of a short block accepted: a longer one may emit more, so it is tried
        // again soon.
        let full = self.lengths[self.lengths.len() - 1];
        if rows > 1 && drafts + 1 == rows && rows < full {
            self.explore_every = Self::FIRST_RETRY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{StepCosts, VerifyRows};

    /// Runs `steps` steps of a block-16 chooser against a draft whose proposals match the
    /// target's for `accepts(step)` tokens, where a step verifying `L` rows takes
    /// `10 + 0.5·L` ms plus 4 ms of drafting (none for `L = 1`). Returns the lengths chosen.
    fn simulate(
        rows: &mut VerifyRows,
        steps: usize,
        accepts: impl Fn(usize) -> usize,
    ) -> Vec<usize> {
        let mut costs = StepCosts::default();
        (0..steps)
            .map(|step| {
                let l = rows.next(&costs);
                let secs = (10.0 + 0.5 * l as f64 + if l > 1 { 4.0 } else { 0.0 }) / 1e3;
                rows.record(l, accepts(step).min(l - 1), secs, &mut costs);
                l
            })
            .collect()
    }

    fn share(chosen: &[usize], l: usize) -> f64 {
        chosen.iter().filter(|&&c| c == l).count() as f64 / chosen.len() as f64
    }

    #[test]
    fn the_length_follows_what_the_draft_gets_accepted() {
        // Everything accepted: the whole block (16 tokens in 22 ms).
        let chosen = simulate(&mut VerifyRows::new(16, false, true), 300, |_| 15);
        assert!(share(&chosen[100..], 16) > 0.9, "{chosen:?}");
        // Nothing accepted: no draft (one token in 10.5 ms).
        let chosen = simulate(&mut VerifyRows::new(16, false, true), 300, |_| 0);
        assert!(share(&chosen[100..], 1) > 0.9, "{chosen:?}");
        // Three accepted: the shortest block that holds them (4 tokens in 16 ms, not 18 or 22);
        // a 4-row block then accepts all it proposes, so the full block is tried every 8 steps.
        let chosen = simulate(&mut VerifyRows::new(16, false, true), 300, |_| 3);
        assert!(share(&chosen[100..], 4) > 0.85, "{chosen:?}");
        // The lengths tried: 1, 4, 8 and 16, the full block first.
        assert_eq!(chosen[..4], [16, 8, 4, 1]);
    }

    #[test]
    fn the_length_returns_to_the_block_when_the_text_becomes_predictable() {
        let mut rows = VerifyRows::new(16, false, true);
        let chosen = simulate(&mut rows, 400, |step| if step < 150 { 0 } else { 15 });
        assert!(share(&chosen[100..150], 1) > 0.9, "{chosen:?}");
        assert!(share(&chosen[300..], 16) > 0.9, "{chosen:?}");
    }

    #[test]
    fn a_new_sequence_uses_the_step_times_others_measured() {
        let mut costs = StepCosts::default();
        for (rows, ms) in [(1, 10.5), (4, 16.0), (8, 18.0), (16, 22.0)] {
            costs.record(rows, ms / 1e3);
        }
        let mut rows = VerifyRows::new(16, false, true);
        // The full block tells what each length would emit; then the best at once.
        assert_eq!(rows.next(&costs), 16);
        rows.record(16, 3, 0.022, &mut costs);
        assert_eq!(rows.next(&costs), 4);
    }

    #[test]
    fn a_fixed_choice_always_verifies_the_block() {
        let chosen = simulate(&mut VerifyRows::new(16, true, true), 50, |_| 0);
        assert!(chosen.iter().all(|&l| l == 16));
        // Small blocks keep distinct lengths.
        assert_eq!(VerifyRows::new(4, false, true).lengths, [1, 2, 4]);
        assert_eq!(VerifyRows::new(1, false, true).lengths, [1]);
        assert_eq!(VerifyRows::new(16, false, false).lengths, [1, 16]);
    }
}
