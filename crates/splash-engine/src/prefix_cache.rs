//! Prompt-prefix states kept for later requests. An agent resends its whole conversation
//! every turn; the state after the part it already sent (system prompt and tools, earlier
//! turns) is restored instead of prefilled again. A Gated DeltaNet state cannot be cut back to
//! an earlier position, so states are stored at chosen positions (see
//! [`checkpoint_positions`]) and a request resumes from the longest stored prefix of its
//! prompt. Entries are whole copies, evicted least recently used first within a byte budget.

use splash_model::SequenceState;

use crate::speculative::DraftSession;

/// A restored prefix: its length, the target state and the draft's context after it.
pub(crate) struct Restored {
    pub len: usize,
    pub state: SequenceState,
    pub draft: Option<Box<dyn DraftSession>>,
}

struct Entry {
    tokens: Vec<u32>,
    state: SequenceState,
    draft: Option<Box<dyn DraftSession>>,
    bytes: usize,
    last_used: u64,
}

/// Counters for `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub budget_bytes: usize,
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens restored instead of prefilled.
    pub hit_tokens: u64,
    pub evictions: u64,
}

/// The cache; a budget of 0 turns it off.
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    clock: u64,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            clock: 0,
            stats: PrefixCacheStats {
                budget_bytes,
                ..PrefixCacheStats::default()
            },
        }
    }

    pub fn enabled(&self) -> bool {
        self.stats.budget_bytes > 0
    }

    /// The longest stored proper prefix of `prompt` (at least one token must remain to
    /// prefill: its logits start the generation). `with_draft`: the sequence speculates, so
    /// only entries that carry the draft's context will do.
    pub fn lookup(&mut self, prompt: &[u32], with_draft: bool) -> Option<Restored> {
        if !self.enabled() {
            return None;
        }
        self.stats.lookups += 1;
        self.clock += 1;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .filter(|e| !with_draft || e.draft.is_some())
            .max_by_key(|e| e.tokens.len())?;
        best.last_used = self.clock;
        self.stats.hits += 1;
        self.stats.hit_tokens += best.tokens.len() as u64;
        Some(Restored {
            len: best.tokens.len(),
            state: best.state.clone(),
            draft: if with_draft {
                best.draft.as_ref().and_then(|d| d.fork())
            } else {
                None
            },
        })
    }

    /// Stores the state after `tokens` (replacing an entry for the same tokens), evicting the
    /// least recently used entries to stay within the budget.
    pub fn insert(
        &mut self,
        tokens: Vec<u32>,
        state: SequenceState,
        draft: Option<Box<dyn DraftSession>>,
    ) {
        let bytes = state.memory_bytes()
            + draft.as_ref().map_or(0, |d| d.memory_bytes())
            + tokens.len() * 4;
        if bytes > self.stats.budget_bytes {
            return;
        }
        self.clock += 1;
        if let Some(i) = self.entries.iter().position(|e| e.tokens == tokens) {
            let old = self.entries.swap_remove(i);
            self.stats.bytes -= old.bytes;
        }
        while self.stats.bytes + bytes > self.stats.budget_bytes {
            let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
            else {
                break;
            };
            let old = self.entries.swap_remove(i);
            self.stats.bytes -= old.bytes;
            self.stats.evictions += 1;
        }
        self.entries.push(Entry {
            tokens,
            state,
            draft,
            bytes,
            last_used: self.clock,
        });
        self.stats.bytes += bytes;
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            ..self.stats
        }
    }
}

/// Tokens between rolling checkpoints in a long prompt.
const ROLLING_CHECKPOINT: usize = 4096;

/// Where a prompt's state is worth keeping: before the second `<|im_start|>` (the end of
/// the system prompt and tools, shared by every turn of a conversation), before the last one
/// (the start of the generation prompt: the next turn repeats everything before it), and
/// every 4,096 tokens before that (a conversation that changes further back still resumes
/// near the change). Ascending.
pub(crate) fn checkpoint_positions(prompt: &[u32], im_start: Option<u32>) -> Vec<usize> {
    let starts: Vec<usize> = match im_start {
        Some(im_start) => prompt
            .iter()
            .enumerate()
            .filter(|&(i, &t)| i > 0 && t == im_start)
            .map(|(i, _)| i)
            .collect(),
        None => Vec::new(),
    };
    // Without turn markers the prompt's last token must still be prefilled: stop before it.
    let last = starts
        .last()
        .copied()
        .unwrap_or(prompt.len().saturating_sub(1));
    let rolling = (1..)
        .map(|k| k * ROLLING_CHECKPOINT)
        .take_while(|&p| p <= last);
    let mut out: Vec<usize> = starts
        .first()
        .into_iter()
        .chain(starts.last())
        .copied()
        .chain(rolling)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_at_the_second_and_last_turn_starts_and_every_4096_tokens() {
        let s = 1;
        assert_eq!(
            checkpoint_positions(&[s, 5, 6, s, 7, s, 8, s, 9], Some(s)),
            vec![3, 7]
        );
        assert_eq!(checkpoint_positions(&[s, 5, 6, s, 7], Some(s)), vec![3]);
        assert_eq!(
            checkpoint_positions(&[s, 5, 6], Some(s)),
            Vec::<usize>::new()
        );
        assert_eq!(checkpoint_positions(&[5, 6], None), Vec::<usize>::new());
        let mut long = vec![7u32; 10_000];
        long[0] = s;
        long[100] = s;
        long[9_000] = s;
        assert_eq!(
            checkpoint_positions(&long, Some(s)),
            vec![100, 4096, 8192, 9000]
        );
        assert_eq!(
            checkpoint_positions(&vec![7u32; 8193], None),
            vec![4096, 8192]
        );
        assert_eq!(checkpoint_positions(&vec![7u32; 8192], None), vec![4096]);
    }
}
