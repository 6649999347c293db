//! Prompt-prefix states kept for later requests. An agent resends its whole conversation
//! every turn; the state after the part it already sent (system prompt and tools, earlier
//! turns) is restored instead of prefilled again. A Gated DeltaNet state cannot be cut back to
//! an earlier position, so states are stored at chosen positions (see
//! [`checkpoint_positions`]) and a request resumes from the longest stored prefix of its
//! prompt, found in a radix tree of the entries' tokens ([`trie`]). Entries are copies of a
//! state; on the CPU they share their KV pages with each other and with the sequences (each
//! page counted once). They are evicted least recently used first within a byte budget, to
//! the disk tier ([`disk`]) when there is one.

mod disk;
mod trie;

use std::collections::HashMap;
use std::sync::Arc;

use splash_model::{Model, ModelError, SequenceState};

pub use disk::{free_disk_bytes, DiskCacheConfig, DiskCacheStats};
use disk::{DiskTier, Spill};
use trie::TokenTrie;

use crate::request::SeqId;
use crate::speculative::{DraftSession, Drafter};

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
    /// Bytes outside shared KV pages (GDN state, draft context, tokens; all of a GPU state).
    bytes: usize,
    /// The state's shared KV pages, (identity, bytes): counted once however many entries
    /// hold them ([`PrefixCache::pages`]).
    pages: Vec<(usize, usize)>,
    last_used: u64,
    /// The preempted sequence whose state this is ([`PrefixCache::park`]): it takes the entry
    /// back without a copy. Other requests use it like any entry.
    owner: Option<SeqId>,
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
    /// Hits served by the disk tier (counted in `hits` too), and their tokens.
    pub disk_hits: u64,
    pub disk_hit_tokens: u64,
    /// The disk tier, when there is one.
    pub disk: Option<DiskCacheStats>,
}

/// The cache: a memory tier within a byte budget (0: none) and an optional disk tier that
/// takes what the memory tier evicts.
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    /// The entries' tokens in a radix tree (value: the entry's index): a lookup walks the
    /// prompt once, however many entries there are. Tokens are unique among entries.
    index: TokenTrie<usize>,
    /// The KV pages the entries hold: identity → (bytes, entries holding it). The checkpoints
    /// of one conversation share their common pages, so they cost about one copy of the
    /// longest, not one copy each.
    pages: HashMap<usize, (usize, usize)>,
    clock: u64,
    stats: PrefixCacheStats,
    disk: Option<DiskTier>,
}

impl PrefixCache {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            index: TokenTrie::new(),
            pages: HashMap::new(),
            clock: 0,
            stats: PrefixCacheStats {
                budget_bytes,
                ..PrefixCacheStats::default()
            },
            disk: None,
        }
    }

    /// Adds a disk tier (see [`DiskCacheConfig`]).
    pub fn with_disk(mut self, config: DiskCacheConfig) -> std::io::Result<Self> {
        self.disk = Some(DiskTier::open(config)?);
        Ok(self)
    }

    pub fn enabled(&self) -> bool {
        self.stats.budget_bytes > 0 || self.disk.is_some()
    }

    /// The disk tier's directory, when there is one.
    pub fn disk_dir(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(|d| d.dir())
    }

    /// The state after the longest stored proper prefix of `prompt` (at least one token must
    /// remain to prefill: its logits start the generation), from memory or from disk, placed
    /// on `model`'s device. `drafter`: the sequence speculates, so only entries that carry the
    /// draft's context will do. A copy that fails (device memory) or a file that cannot be
    /// used is a miss: the prompt is prefilled.
    pub fn lookup(
        &mut self,
        prompt: &[u32],
        model: &Model,
        drafter: Option<&Arc<dyn Drafter>>,
    ) -> Option<Restored> {
        if !self.enabled() {
            return None;
        }
        let with_draft = drafter.is_some();
        self.stats.lookups += 1;
        self.clock += 1;
        let memory = self
            .index
            .prefixes(prompt)
            .into_iter()
            .filter(|&(len, i)| {
                len < prompt.len() && (!with_draft || self.entries[i].draft.is_some())
            })
            .map(|(len, i)| (i, len))
            .next_back();
        let on_disk = self.disk.as_ref().and_then(|d| d.best(prompt, with_draft));
        if let Some(len) = on_disk.filter(|&d| memory.is_none_or(|(_, m)| d > m)) {
            if let Some(r) = self.load_from_disk(prompt, len, model, drafter) {
                self.stats.hits += 1;
                self.stats.hit_tokens += len as u64;
                self.stats.disk_hits += 1;
                self.stats.disk_hit_tokens += len as u64;
                return Some(r);
            }
        }
        let (i, len) = memory?;
        match self.copy_entry(i, with_draft) {
            Ok(r) => {
                self.entries[i].last_used = self.clock;
                self.stats.hits += 1;
                self.stats.hit_tokens += len as u64;
                Some(r)
            }
            Err(err) => {
                tracing::warn!(
                    "prefix cache: cannot copy a cached state ({err}); prefilling instead"
                );
                None
            }
        }
    }

    /// Keeps the state of preempted sequence `owner` (after `tokens`) until it takes it back
    /// with [`take`](Self::take). When an entry for the same tokens is already there (the
    /// sequence stopped at a checkpoint), that one serves: the state is dropped.
    pub fn park(
        &mut self,
        owner: SeqId,
        tokens: Vec<u32>,
        state: SequenceState,
        draft: Option<Box<dyn DraftSession>>,
    ) {
        let with_draft = draft.is_some();
        let known = self
            .entry_for(&tokens)
            .is_some_and(|i| self.entries[i].draft.is_some() || !with_draft);
        if !known {
            self.insert_entry(tokens, state, draft, Some(owner));
        }
    }

    /// The state after exactly `tokens` for preempted sequence `owner`: its own parked entry
    /// (moved out, no copy), or a copy of another entry for the same tokens, or the entry read
    /// back from disk (waiting for its write when it is still queued).
    pub fn take(
        &mut self,
        owner: SeqId,
        tokens: &[u32],
        model: &Model,
        drafter: Option<&Arc<dyn Drafter>>,
    ) -> Option<Restored> {
        let with_draft = drafter.is_some();
        let fitting = self
            .entry_for(tokens)
            .filter(|&i| !with_draft || self.entries[i].draft.is_some());
        if let Some(i) = fitting.filter(|&i| self.entries[i].owner == Some(owner)) {
            let e = self.remove_entry(i);
            return Some(Restored {
                len: tokens.len(),
                state: e.state,
                draft: e.draft.filter(|_| with_draft),
            });
        }
        if let Some(i) = fitting {
            self.clock += 1;
            self.entries[i].last_used = self.clock;
            return match self.copy_entry(i, with_draft) {
                Ok(r) => Some(r),
                Err(err) => {
                    tracing::warn!(
                        "prefix cache: cannot copy a cached state ({err}); prefilling instead"
                    );
                    None
                }
            };
        }
        let disk = self.disk.as_ref()?;
        if disk.is_pending(tokens, with_draft) {
            disk.flush();
        }
        if disk.contains(tokens, with_draft) {
            return self.load_from_disk(tokens, tokens.len(), model, drafter);
        }
        None
    }

    /// A copy of entry `i` (its draft context too when `with_draft`).
    fn copy_entry(&self, i: usize, with_draft: bool) -> Result<Restored, ModelError> {
        let e = &self.entries[i];
        let state = e.state.try_clone()?;
        let draft =
            match &e.draft {
                Some(d) if with_draft => Some(d.fork().ok_or_else(|| {
                    ModelError::Gpu("the draft context cannot be copied".into())
                })??),
                _ => None,
            };
        Ok(Restored {
            len: e.tokens.len(),
            state,
            draft,
        })
    }

    fn load_from_disk(
        &self,
        prompt: &[u32],
        len: usize,
        model: &Model,
        drafter: Option<&Arc<dyn Drafter>>,
    ) -> Option<Restored> {
        let disk = self.disk.as_ref()?;
        let loaded = match disk.read(prompt, len, drafter.is_some()) {
            Ok(l) => l,
            Err(why) => {
                tracing::warn!("prefix cache: discarded {why}; prefilling instead");
                return None;
            }
        };
        let restored = model.graph.load_state(&loaded.state).and_then(|state| {
            if state.len() != len {
                return Err(ModelError::StateImage(format!(
                    "the state holds {} tokens, the file's prefix {len}",
                    state.len()
                )));
            }
            let draft = match (drafter, &loaded.draft) {
                (Some(d), Some(image)) => Some(d.load_session(image)?),
                _ => None,
            };
            Ok(Restored { len, state, draft })
        });
        match restored {
            Ok(r) => Some(r),
            // Only an image the model refuses is bad; a device out of memory is not the file's.
            Err(e @ ModelError::StateImage(_)) => {
                tracing::warn!("prefix cache: discarded a file that does not fit the model ({e}); prefilling instead");
                disk.discard_tokens(&prompt[..len], loaded.draft.is_some());
                None
            }
            Err(e) => {
                tracing::warn!(
                    "prefix cache: cannot restore a state from disk ({e}); prefilling instead"
                );
                None
            }
        }
    }

    /// Stores the state after `tokens` (replacing an entry for the same tokens), evicting the
    /// least recently used entries to stay within the budget: to the disk tier when there is
    /// one.
    pub fn insert(
        &mut self,
        tokens: Vec<u32>,
        state: SequenceState,
        draft: Option<Box<dyn DraftSession>>,
    ) {
        self.insert_entry(tokens, state, draft, None);
    }

    fn insert_entry(
        &mut self,
        tokens: Vec<u32>,
        state: SequenceState,
        draft: Option<Box<dyn DraftSession>>,
        owner: Option<SeqId>,
    ) {
        let pages = state.kv_pages();
        let paged: usize = pages.iter().map(|&(_, b)| b).sum();
        let bytes = state.memory_bytes() - paged
            + draft.as_ref().map_or(0, |d| d.memory_bytes())
            + tokens.len() * 4;
        self.clock += 1;
        if let Some(i) = self.entry_for(&tokens) {
            self.remove_entry(i);
        }
        let entry = Entry {
            tokens,
            state,
            draft,
            bytes,
            pages,
            last_used: self.clock,
            owner,
        };
        if bytes + paged > self.stats.budget_bytes {
            self.spill(entry);
            return;
        }
        // What the entry adds: its own bytes and the pages no entry holds yet (evicting an
        // entry can raise it, by releasing a page the two shared).
        while self.stats.bytes + self.added_bytes(&entry) > self.stats.budget_bytes {
            let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
            else {
                break;
            };
            let old = self.remove_entry(i);
            self.stats.evictions += 1;
            self.spill(old);
        }
        self.stats.bytes += entry.bytes;
        for &(id, b) in &entry.pages {
            let held = self.pages.entry(id).or_insert((b, 0));
            if held.1 == 0 {
                self.stats.bytes += b;
            }
            held.1 += 1;
        }
        self.index.insert(&entry.tokens, self.entries.len());
        self.entries.push(entry);
    }

    /// The entry for exactly `tokens`.
    fn entry_for(&self, tokens: &[u32]) -> Option<usize> {
        self.index.get(tokens)
    }

    /// Takes entry `i` out of memory (the index and the byte count follow).
    fn remove_entry(&mut self, i: usize) -> Entry {
        let e = self.entries.swap_remove(i);
        self.index.remove(&e.tokens);
        if let Some(moved) = self.entries.get(i) {
            self.index.insert(&moved.tokens, i);
        }
        self.forget(&e);
        e
    }

    /// Bytes `e` would add: its own and those of its pages that no entry holds.
    fn added_bytes(&self, e: &Entry) -> usize {
        e.bytes
            + e.pages
                .iter()
                .filter(|(id, _)| !self.pages.contains_key(id))
                .map(|&(_, b)| b)
                .sum::<usize>()
    }

    /// Takes a removed entry out of the byte count: its own bytes, and the pages no other
    /// entry holds.
    fn forget(&mut self, e: &Entry) {
        self.stats.bytes -= e.bytes;
        for (id, _) in &e.pages {
            if let Some(held) = self.pages.get_mut(id) {
                held.1 -= 1;
                if held.1 == 0 {
                    self.stats.bytes -= held.0;
                    self.pages.remove(id);
                }
            }
        }
    }

    /// Hands an entry leaving memory to the disk tier (unless the file is there already).
    fn spill(&self, e: Entry) {
        let Some(disk) = &self.disk else {
            return;
        };
        if disk.contains(&e.tokens, e.draft.is_some()) {
            return;
        }
        let state = match e.state.save_image() {
            Ok(s) => s,
            Err(err) => {
                tracing::warn!("prefix cache: cannot save a state to disk: {err}");
                return;
            }
        };
        // A draft that cannot be saved leaves an entry for sequences without a draft.
        let draft = e.draft.as_ref().and_then(|d| d.save_image()?.ok());
        disk.spill(Spill {
            tokens: e.tokens,
            state,
            draft,
        });
    }

    /// Moves every memory entry to the disk tier (dropped without one).
    pub fn spill_all(&mut self) {
        self.index = TokenTrie::new();
        for e in std::mem::take(&mut self.entries) {
            self.forget(&e);
            self.spill(e);
        }
    }

    /// Waits for the disk tier's queued writes.
    pub fn flush(&self) {
        if let Some(d) = &self.disk {
            d.flush();
        }
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            disk: self.disk.as_ref().map(|d| d.stats()),
            ..self.stats
        }
    }
}

impl Drop for PrefixCache {
    /// A persistent disk tier keeps what memory holds too: the next start finds it.
    fn drop(&mut self) {
        if self.disk.as_ref().is_some_and(|d| d.persistent()) {
            self.spill_all();
        }
    }
}

/// Tokens between rolling checkpoints in a long prompt.
const ROLLING_CHECKPOINT: usize = 4096;

/// Where a prompt's state is worth keeping: before the second `<|im_start|>` (the end of
/// the system prompt and tools, shared by every turn of a conversation), before the last one
/// (the start of the generation prompt: the next turn repeats everything before it), every
/// 4,096 tokens before that (a conversation that changes further back still resumes near the
/// change), and before the prompt's last token (the same request again, a retry or another
/// sample, prefills that one token). Ascending.
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
        .chain(prompt.len().checked_sub(1).filter(|&p| p > 0))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use splash_model::{load, KvFormat, Logits};

    /// The checkpoints of one long prompt share their common KV pages: the cache counts them
    /// once (about one copy of the longest state, not one per checkpoint), and gives every
    /// byte back as entries leave.
    #[test]
    fn checkpoints_of_one_prompt_share_their_pages() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/qwen35-dense");
        let model = load(&dir).unwrap();
        let prompt: Vec<u32> = (0..600).map(|i| (i * 37 % 400) as u32).collect();
        let mut state = model.graph.new_state_with(KvFormat::Int8);
        let mut cache = PrefixCache::new(1 << 30);
        let (mut separate, mut last) = (0, Vec::new());
        for end in [200, 400, 600] {
            let start = state.len();
            last = model
                .graph
                .forward(&mut state, &prompt[start..end], Logits::Last)
                .unwrap();
            let copy = state.try_clone().unwrap();
            separate += copy.memory_bytes();
            cache.insert(prompt[..end].to_vec(), copy, None);
        }
        let shared = cache.stats().bytes;
        let longest = state.memory_bytes();
        println!("3 checkpoints: {shared} bytes cached, {separate} as copies, longest {longest}");
        assert!(
            shared < separate * 2 / 3 && shared >= longest,
            "{shared} bytes for checkpoints of {separate} bytes apart (the longest: {longest})"
        );
        // The original state kept writing after its copies were taken (copy on write): the
        // checkpoint after 400 tokens, restored, continues exactly as the original did.
        let r = cache.lookup(&prompt, &model, None).unwrap();
        assert_eq!(r.len, 400, "the longest proper prefix");
        let mut resumed = r.state;
        let l = model
            .graph
            .forward(&mut resumed, &prompt[400..], Logits::Last)
            .unwrap();
        assert_eq!(l, last, "resumed from shared pages");
        assert_eq!(
            cache.stats().bytes,
            shared,
            "a restored copy does not count"
        );
        cache.spill_all();
        assert_eq!(cache.stats().bytes, 0);
        assert!(cache.pages.is_empty());
    }

    #[test]
    fn checkpoints_at_turn_starts_every_4096_tokens_and_before_the_last_token() {
        let s = 1;
        assert_eq!(
            checkpoint_positions(&[s, 5, 6, s, 7, s, 8, s, 9], Some(s)),
            vec![3, 7, 8]
        );
        assert_eq!(checkpoint_positions(&[s, 5, 6, s, 7], Some(s)), vec![3, 4]);
        assert_eq!(checkpoint_positions(&[s, 5, 6], Some(s)), vec![2]);
        assert_eq!(checkpoint_positions(&[5, 6], None), vec![1]);
        assert_eq!(checkpoint_positions(&[5], None), Vec::<usize>::new());
        let mut long = vec![7u32; 10_000];
        long[0] = s;
        long[100] = s;
        long[9_000] = s;
        assert_eq!(
            checkpoint_positions(&long, Some(s)),
            vec![100, 4096, 8192, 9000, 9999]
        );
        assert_eq!(
            checkpoint_positions(&vec![7u32; 8193], None),
            vec![4096, 8192]
        );
        assert_eq!(
            checkpoint_positions(&vec![7u32; 8192], None),
            vec![4096, 8191]
        );
    }
}
