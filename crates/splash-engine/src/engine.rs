//! The engine: admits requests as sequences and steps them.

use std::sync::Arc;
use std::time::Instant;

use splash_model::{BatchItem, ImageSpan, KvFormat, Logits, Model};

use crate::grammar::{GrammarRequest, GrammarState, GrammarTables};
use crate::prefix_cache::{checkpoint_positions, DiskCacheConfig, PrefixCache, PrefixCacheStats};
use crate::request::{
    cache_key, Completion, EngineError, Event, PromptImage, Request, ScoreRequest, SeqId,
};
use crate::sampling::SamplingParams;
use crate::sequence::{PendingBlock, Sequence};
use crate::speculative::{Drafter, SpecStats, StepCosts};

/// Prompt tokens prefilled per engine step (all sequences together) on the CPU: long prompts
/// are prefilled in pieces so other sequences keep decoding in between.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// The same on a GPU, where every prefill pass streams each weight once more (decoded to bf16
/// for cuBLAS): at 512 tokens that decoding was about a third of a 27B pass; at 2,048 it is
/// under a seventh, and a pass still takes well under a second.
pub const GPU_PREFILL_CHUNK: usize = 2048;

/// The prefill chunk for the device `model` runs on.
pub fn prefill_chunk_for(model: &Model) -> usize {
    if model.graph.device() == "cpu" {
        DEFAULT_PREFILL_CHUNK
    } else {
        GPU_PREFILL_CHUNK
    }
}

/// What a decoding sequence waits for in a step's batched pass.
enum Pending {
    /// The plain next token.
    Token(u32),
    /// A drafted block from a state checkpoint.
    Block(PendingBlock),
}

impl Pending {
    fn rows(&self) -> &[u32] {
        match self {
            Pending::Token(t) => std::slice::from_ref(t),
            Pending::Block(b) => &b.rows,
        }
    }

    fn is_block(&self) -> bool {
        matches!(self, Pending::Block(_))
    }
}

/// Counters of the batched decode passes (for `/status` and `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Forward passes run for decoding sequences (one per engine step that had any).
    pub passes: u64,
    /// Sequences those passes served, summed (÷ passes: the mean batch).
    pub sequences: u64,
    /// Token rows they ran, summed (verify blocks count all their rows).
    pub rows: u64,
    /// Prompt tokens still to prefill, after the last step.
    pub prefill_pending: usize,
    /// Sequences preempted to stay within the KV budget, in all.
    pub preemptions: u64,
    /// Preempted sequences that came back with their state from the prefix cache, and those
    /// whose tokens were prefilled again.
    pub resumed_cached: u64,
    pub resumed_recomputed: u64,
    /// Sequences preempted now.
    pub parked: usize,
}

/// Runs sequences of one model.
pub struct Engine {
    model: Arc<Model>,
    running: Vec<Sequence>,
    finished: Vec<Sequence>,
    next_id: SeqId,
    prefill_chunk: usize,
    max_context: usize,
    /// Built on the first constrained request, or ahead of it in the background
    /// ([`Engine::with_grammar_warmup`]): token tables of the whole vocabulary.
    grammar: GrammarTables,
    kv_format: KvFormat,
    /// The draft every unconstrained sequence speculates with.
    drafter: Option<Arc<dyn Drafter>>,
    /// Draft a full block every step instead of choosing per step by speed.
    draft_every_step: bool,
    /// Speculative steps' time by verify length, which every sequence's choice reads.
    step_costs: StepCosts,
    /// Speculation counters of the sequences that ended.
    spec_totals: SpecStats,
    /// States of prompt prefixes kept for later requests (off until given a budget).
    prefix_cache: PrefixCache,
    batches: BatchStats,
    /// KV-cache tokens the running sequences may hold together (the memory plan's).
    kv_budget: usize,
}

impl Engine {
    /// An engine with the model's native context limit.
    pub fn new(model: Arc<Model>) -> Self {
        let max_context = model.config.max_position_embeddings;
        Self {
            prefill_chunk: prefill_chunk_for(&model),
            model,
            running: Vec::new(),
            finished: Vec::new(),
            next_id: 0,
            max_context,
            grammar: GrammarTables::default(),
            kv_format: KvFormat::default(),
            drafter: None,
            draft_every_step: false,
            step_costs: StepCosts::default(),
            spec_totals: SpecStats::default(),
            prefix_cache: PrefixCache::new(0),
            batches: BatchStats::default(),
            kv_budget: usize::MAX,
        }
    }

    /// Builds the constrained-decoding tables now, on a background thread, so that the first
    /// constrained request (JSON schema, forced tool call) does not wait for them: about a
    /// second and a half for a 248K-token vocabulary on 2 cores. A request that comes earlier
    /// waits for the build in progress instead of starting a second one.
    pub fn with_grammar_warmup(self) -> Self {
        let (slot, model) = (self.grammar.clone(), self.model.clone());
        let spawned = std::thread::Builder::new()
            .name("splash-grammar".into())
            .spawn(move || {
                let _ = slot.get(&model);
            });
        // Without the thread, the first constrained request builds the tables itself.
        drop(spawned);
        self
    }

    /// The constrained-decoding tables' slot, shared with this engine: a server checks request
    /// grammars with the same tables instead of building a second copy (hundreds of MB).
    pub fn grammar_tables(&self) -> GrammarTables {
        self.grammar.clone()
    }

    /// Decodes with `drafter`: every sequence advances by a drafted block verified in one
    /// target pass, except while an output constraint applies (a token a step).
    pub fn with_drafter(mut self, drafter: Arc<dyn Drafter>) -> Self {
        self.drafter = Some(drafter);
        self
    }

    /// Drafts a full block at every step (`true`: measurement, and comparisons with a
    /// reference loop) instead of letting each sequence skip the draft where it does not pay.
    pub fn with_draft_every_step(mut self, on: bool) -> Self {
        self.draft_every_step = on;
        self
    }

    /// Keeps prompt-prefix states for later requests, within `bytes` of memory (0: none).
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        self.prefix_cache = PrefixCache::new(bytes);
        self
    }

    /// Adds a disk tier under the prefix cache: states evicted from memory go to files and
    /// are read back on a hit (see [`DiskCacheConfig`]).
    pub fn with_disk_cache(mut self, config: DiskCacheConfig) -> std::io::Result<Self> {
        let memory = std::mem::replace(&mut self.prefix_cache, PrefixCache::new(0));
        self.prefix_cache = memory.with_disk(config)?;
        Ok(self)
    }

    /// The disk tier's directory, when there is one.
    pub fn disk_cache_dir(&self) -> Option<&std::path::Path> {
        self.prefix_cache.disk_dir()
    }

    /// Moves the prefix cache's memory entries to its disk tier and waits for the writes
    /// (benchmarks of disk hits).
    pub fn spill_prefix_cache(&mut self) {
        self.prefix_cache.spill_all();
        self.prefix_cache.flush();
    }

    /// Waits for the disk tier's queued writes (tests and benchmarks).
    pub fn flush_disk_cache(&self) {
        self.prefix_cache.flush();
    }

    /// Lets the running sequences hold `tokens` of KV cache together: when a step would go
    /// past it, the most recently admitted sequences are preempted (their state parked in the
    /// prefix cache, or dropped and recomputed) and resumed, oldest first, once there is room.
    pub fn with_kv_budget(mut self, tokens: usize) -> Self {
        self.kv_budget = tokens.max(1);
        self
    }

    /// The KV budget in tokens (`usize::MAX`: none).
    pub fn kv_budget(&self) -> usize {
        self.kv_budget
    }

    /// KV-cache tokens the running sequences hold now.
    pub fn kv_tokens_in_use(&self) -> usize {
        self.running.iter().map(Sequence::kv_tokens).sum()
    }

    /// KV-cache tokens the running sequences hold or are about to hold: their state, or their
    /// whole prompt while it is prefilled (what admission must count).
    pub fn kv_tokens_committed(&self) -> usize {
        self.running.iter().map(Sequence::kv_tokens_committed).sum()
    }

    /// Sequences preempted now (they wait for room before newer requests are admitted).
    pub fn num_parked(&self) -> usize {
        self.running.iter().filter(|s| s.parked().is_some()).count()
    }

    /// Prefix-cache counters.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefix_cache.stats()
    }

    /// The draft, when speculation is on.
    pub fn drafter(&self) -> Option<&Arc<dyn Drafter>> {
        self.drafter.as_ref()
    }

    /// Speculation counters summed over the sequences that ended so far.
    pub fn spec_stats(&self) -> SpecStats {
        self.spec_totals
    }

    /// Caps the context (prompt + output) of every sequence.
    pub fn with_max_context(mut self, tokens: usize) -> Self {
        self.max_context = tokens.min(self.model.config.max_position_embeddings);
        self
    }

    /// Sets how new sequences store keys and values (default int8).
    pub fn with_kv_format(mut self, kv: KvFormat) -> Self {
        self.kv_format = kv;
        self
    }

    /// How new sequences store keys and values.
    pub fn kv_format(&self) -> KvFormat {
        self.kv_format
    }

    /// Sets the prefill chunk size (≥ 1).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The context limit in tokens.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Validates and admits a request.
    pub fn add(&mut self, req: Request) -> Result<SeqId, EngineError> {
        self.check_prompt(&req.prompt)?;
        self.check_images(&req.prompt, &req.images)?;
        if req.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        req.sampling
            .validate()
            .map_err(EngineError::InvalidRequest)?;
        let grammar = match &req.grammar {
            Some(g) => Some((self.start_grammar(g)?, g.after.clone())),
            None => None,
        };
        // A constraint from the first token leaves nothing for the draft; a later one (after
        // the reasoning, or a call grammar) lets it speculate until then.
        let drafter = self
            .drafter
            .clone()
            .filter(|_| req.grammar.as_ref().is_none_or(|g| !g.after.is_empty()));
        Ok(self.admit(req, grammar, drafter, None, None))
    }

    /// Validates and admits a score-only request: its sequence ends after its prefill, with
    /// the logits of its answer tokens ([`Sequence::scores`]).
    pub fn add_score(&mut self, req: ScoreRequest) -> Result<SeqId, EngineError> {
        self.check_prompt(&req.prompt)?;
        if req.answers.is_empty() {
            return Err(EngineError::InvalidRequest(
                "a score request needs at least one answer token".into(),
            ));
        }
        self.check_vocab(&req.answers)?;
        let request = Request {
            prompt: req.prompt,
            sampling: SamplingParams::greedy(),
            max_tokens: 0,
            stop: Vec::new(),
            ignore_eos: true,
            grammar: None,
            images: Vec::new(),
        };
        let keep = req.keep_state_at;
        Ok(self.admit(request, None, None, Some(req.answers), keep))
    }

    fn check_prompt(&self, prompt: &[u32]) -> Result<(), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        if prompt.len() >= self.max_context {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {} tokens but the context limit is {}: shorten the prompt",
                prompt.len(),
                self.max_context
            )));
        }
        self.check_vocab(prompt)
    }

    /// Each image covers a run of placeholder tokens of the prompt with one row of its
    /// embeddings per token, in order ([`splash_model::Qwen35::check_prompt_images`]).
    fn check_images(&self, prompt: &[u32], images: &[PromptImage]) -> Result<(), EngineError> {
        if images.is_empty() {
            return Ok(());
        }
        let spans: Vec<ImageSpan> = images.iter().map(|i| i.span.clone()).collect();
        self.model
            .graph
            .check_prompt_images(prompt, &spans)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }

    fn check_vocab(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let vocab = self.model.config.vocab_size;
        match tokens.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(EngineError::InvalidRequest(format!(
                "token id {id} is outside the vocabulary (size {vocab})"
            ))),
            None => Ok(()),
        }
    }

    /// Starts a validated request's sequence from the longest cached prefix of its prompt.
    fn admit(
        &mut self,
        req: Request,
        grammar: Option<(GrammarState, Vec<u32>)>,
        drafter: Option<Arc<dyn Drafter>>,
        score: Option<Vec<u32>>,
        keep_state_at: Option<usize>,
    ) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        let (restored, checkpoints) = if self.prefix_cache.enabled() {
            let key = cache_key(&req.prompt, &req.images);
            let restored = self.prefix_cache.lookup(
                key.as_deref().unwrap_or(&req.prompt),
                &self.model,
                drafter.as_ref(),
            );
            let from = restored.as_ref().map_or(0, |r| r.len);
            let im_start = self.model.tokenizer.token_to_id("<|im_start|>");
            let mut positions = checkpoint_positions(&req.prompt, im_start);
            if let Some(p) = keep_state_at.filter(|&p| p < req.prompt.len()) {
                if let Err(at) = positions.binary_search(&p) {
                    positions.insert(at, p);
                }
            }
            positions.retain(|&p| p > from);
            (restored, positions)
        } else {
            (None, Vec::new())
        };
        let mut seq = Sequence::new(
            id,
            req,
            grammar,
            &self.model,
            self.max_context,
            self.kv_format,
            drafter.as_ref().map(|d| (d, self.draft_every_step)),
        );
        if let Some(answers) = score {
            seq.score_only(answers);
        }
        if let Some(r) = restored {
            seq.resume_from(r);
        }
        seq.keep_states_at(checkpoints);
        self.running.push(seq);
        id
    }

    fn start_grammar(&mut self, g: &GrammarRequest) -> Result<GrammarState, EngineError> {
        let factory = self.grammar.get(&self.model).map_err(|e| {
            EngineError::Unavailable(format!(
                "constrained decoding is unavailable for this model: {e}"
            ))
        })?;
        factory.start(&g.constraint).map_err(|e| {
            EngineError::InvalidRequest(format!("the output constraint is invalid: {e}"))
        })
    }

    /// True while any sequence is running.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
    }

    /// Advances every decoding sequence by one token or one speculative block, and prefills
    /// at most one chunk's worth of prompt tokens (the fewest left first, the oldest always
    /// with a share): however many long prompts arrive, running streams get a token per chunk
    /// and a short prompt is not queued behind a long one. The decoding sequences share one
    /// batched forward pass: their plain next tokens and their drafted blocks (each from its
    /// own state checkpoint) together.
    pub fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        self.fit_kv_budget();
        let mut events = Vec::new();
        let mut batch: Vec<(usize, Pending)> = Vec::new();
        let mut prefilling = Vec::new();
        for (i, seq) in self.running.iter_mut().enumerate() {
            if seq.parked().is_some() {
                continue;
            }
            if seq.decodes_plainly() {
                let t0 = Instant::now();
                if let Some(token) = seq.sample_next(&self.model, &mut events)? {
                    batch.push((i, Pending::Token(token)));
                }
                seq.add_decode_time(t0.elapsed());
            } else if seq.speculates() {
                if let Some(block) = seq.draft_block(&self.model, &self.step_costs, &mut events)? {
                    batch.push((i, Pending::Block(block)));
                }
            } else {
                prefilling.push(i);
            }
        }
        self.prefill(&prefilling, &mut events)?;
        self.decode_batch(batch, &mut events)?;
        let (done, running): (Vec<_>, Vec<_>) = self
            .running
            .drain(..)
            .partition(|s| s.finish_reason().is_some());
        self.running = running;
        for seq in &done {
            if let Some(st) = seq.spec_stats() {
                self.spec_totals.add(&st);
            }
        }
        self.finished.extend(done);
        Ok(events)
    }

    /// Shares one chunk of prompt tokens between the sequences being prefilled (`prefilling`:
    /// indices in admission order). The fewest tokens left go first, so a short prompt that
    /// arrives behind a long one is in after a step instead of after the whole long prefill;
    /// the oldest is always left a quarter of the chunk, so short prompts arriving at every
    /// step cannot starve it (and every prompt becomes the oldest in turn). A prompt that
    /// stops at a prefix-cache checkpoint goes on within its share.
    fn prefill(
        &mut self,
        prefilling: &[usize],
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        let Some(&oldest) = prefilling.first() else {
            return Ok(());
        };
        let mut order = prefilling.to_vec();
        order.sort_by_key(|&i| (self.running[i].prefill_left(), i));
        let mut budget = self.prefill_chunk;
        let mut reserved = if order.len() > 1 {
            (budget / 4).max(1)
        } else {
            0
        };
        for i in order {
            let mut share = if i == oldest {
                budget
            } else {
                budget.saturating_sub(reserved)
            };
            while share > 0 {
                let seq = &mut self.running[i];
                let ran = seq.prefill_step(&self.model, share, events)?;
                for (tokens, r) in seq.take_snapshots() {
                    self.prefix_cache.insert(tokens, r.state, r.draft);
                }
                if ran == 0 {
                    break;
                }
                share -= ran;
                budget -= ran;
            }
            if i == oldest {
                reserved = 0;
            }
        }
        Ok(())
    }

    /// One forward pass for the pending rows of the decoding sequences (`(index, rows)`,
    /// ascending): each weight is read once for all of them.
    fn decode_batch(
        &mut self,
        batch: Vec<(usize, Pending)>,
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        // Every speculating sequence drafts with the engine's one drafter: the same taps.
        let taps = match (&self.drafter, batch.iter().any(|(_, p)| p.is_block())) {
            (Some(d), true) => d.tap_layers().to_vec(),
            _ => Vec::new(),
        };
        // Greedy sequences need only each row's argmax: rows of 248K logits stay on the GPU.
        let want = if batch
            .iter()
            .all(|&(i, _)| self.running[i].argmax_suffices())
        {
            Logits::Argmax
        } else {
            Logits::All
        };
        let mut next = batch.iter().map(|(i, p)| (*i, p.rows())).peekable();
        let mut items = Vec::with_capacity(batch.len());
        for (i, seq) in self.running.iter_mut().enumerate() {
            if let Some(&(_, tokens)) = next.peek().filter(|(j, _)| *j == i) {
                next.next();
                items.push(BatchItem::text(seq.state_mut(), tokens));
            }
        }
        self.batches.passes += 1;
        self.batches.sequences += items.len() as u64;
        self.batches.rows += items.iter().map(|i| i.tokens.len() as u64).sum::<u64>();
        let out = self.model.graph.forward_batch(&mut items, want, &taps)?;
        drop(items);
        let elapsed = t0.elapsed();
        for ((i, pending), out) in batch.into_iter().zip(out) {
            let seq = &mut self.running[i];
            match pending {
                Pending::Token(_) => {
                    seq.decoded(out);
                    seq.add_decode_time(elapsed);
                }
                Pending::Block(block) => {
                    seq.verified(&self.model, block, out, &mut self.step_costs, events)?
                }
            }
        }
        Ok(())
    }

    /// Keeps the next step within the KV budget: resumes preempted sequences, oldest first,
    /// while they fit with an eighth of the budget to spare (so that they are not preempted
    /// again at once), then preempts the newest while the step would not fit. The oldest
    /// running sequence is never preempted: the context limit keeps it within the budget.
    fn fit_kv_budget(&mut self) {
        if self.kv_budget == usize::MAX {
            return;
        }
        let chunk = self.prefill_chunk;
        let mut used: usize = self.running.iter().map(|s| s.kv_after_step(chunk)).sum();
        for i in 0..self.running.len() {
            let Some((key, _)) = self.running[i].parked() else {
                continue;
            };
            let need = key.len() + chunk.min(16);
            if used > 0 && used + need + self.kv_budget / 8 > self.kv_budget {
                break; // younger parked sequences wait behind this one
            }
            self.resume(i);
            used = self.running.iter().map(|s| s.kv_after_step(chunk)).sum();
        }
        while used > self.kv_budget {
            let active = self.running.iter().filter(|s| s.kv_after_step(chunk) > 0);
            if active.count() <= 1 {
                break;
            }
            let Some(i) = self
                .running
                .iter()
                .rposition(|s| s.kv_after_step(chunk) > 0)
            else {
                break;
            };
            used -= self.running[i].kv_after_step(chunk);
            let (key, parked) = self.running[i].park(&self.model);
            self.batches.preemptions += 1;
            if parked.len > 0 && self.prefix_cache.enabled() {
                let id = self.running[i].id();
                self.prefix_cache.park(id, key, parked.state, parked.draft);
            }
        }
    }

    /// Brings back the parked sequence `i`: its own state from the prefix cache (memory or
    /// disk), else the longest cached prefix of its tokens, else nothing (all prefilled again).
    fn resume(&mut self, i: usize) {
        let seq = &self.running[i];
        let Some((key, tokens)) = seq.parked() else {
            return;
        };
        let drafter = self.drafter.as_ref().filter(|_| seq.has_draft());
        let tokens = seq.cache_key(tokens);
        let restored = self
            .prefix_cache
            .take(seq.id(), key, &self.model, drafter)
            .or_else(|| self.prefix_cache.lookup(&tokens, &self.model, drafter));
        // A sequence parked before its first prefill chunk had nothing to lose.
        if key.is_empty() || restored.as_ref().is_some_and(|r| r.len == key.len()) {
            self.batches.resumed_cached += 1;
        } else {
            self.batches.resumed_recomputed += 1;
        }
        self.running[i].unpark(restored);
    }

    /// Prompt tokens of running sequences still to prefill.
    pub fn prefill_pending(&self) -> usize {
        self.running.iter().map(Sequence::prefill_left).sum()
    }

    /// Batched decode counters.
    pub fn batch_stats(&self) -> BatchStats {
        BatchStats {
            prefill_pending: self.prefill_pending(),
            parked: self.num_parked(),
            ..self.batches
        }
    }

    /// Number of running sequences.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Stops a running sequence and frees its state (the client went away). Returns whether
    /// it was running.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let before = self.running.len();
        self.running.retain(|s| s.id() != id);
        self.finished.retain(|s| s.id() != id);
        self.running.len() != before
    }

    /// Removes and returns a finished sequence.
    pub fn take_finished(&mut self, id: SeqId) -> Option<Sequence> {
        let i = self.finished.iter().position(|s| s.id() == id)?;
        Some(self.finished.swap_remove(i))
    }

    /// Runs one request to the end, calling `on_text` with each piece of text as it comes.
    pub fn generate(
        &mut self,
        req: Request,
        mut on_text: impl FnMut(&str),
    ) -> Result<Completion, EngineError> {
        let id = self.add(req)?;
        let mut text = String::new();
        loop {
            for ev in self.step()? {
                match ev {
                    Event::Text { id: i, text: t } if i == id => {
                        on_text(&t);
                        text.push_str(&t);
                    }
                    Event::Finished { id: i } if i == id => {
                        let seq = self.take_finished(id).expect("finished sequence is kept");
                        let (prefill_time, decode_time) = seq.timings();
                        return Ok(Completion {
                            text,
                            tokens: seq.output().to_vec(),
                            finish_reason: seq.finish_reason().cloned().expect("finished"),
                            prompt_tokens: seq.prompt().len(),
                            cached_tokens: seq.cached_tokens(),
                            prefill_time,
                            decode_time,
                            speculation: seq.spec_stats(),
                        });
                    }
                    _ => {}
                }
            }
        }
    }
}
