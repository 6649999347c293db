//! One request in flight: its tokens, model state, sampler, stop rules and timings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use splash_model::{
    BatchItem, ImageSpan, KvFormat, Logits, Model, ModelError, PassOutput, SequenceState,
    StreamDecoder,
};

use crate::grammar::GrammarState;
use crate::prefix_cache::Restored;
use crate::request::{cache_key, Event, FinishReason, Request, SeqId};
use crate::sampling::Sampler;
use crate::speculative::{self, Accepted, DraftSession, Drafter, SpecStats, StepCosts, VerifyRows};
use crate::stop::StopMatcher;

/// What the last forward pass left for choosing the next token.
enum NextScores {
    /// The next token's logits.
    Logits(Vec<f32>),
    /// Their argmax: all a sequence whose [`Sequence::argmax_suffices`] needs.
    Argmax(u32),
}

/// Where a sequence is in its life.
enum Phase {
    /// Running the prompt through the model: `done` of its tokens are in.
    Prefill { done: usize },
    /// Prompt in: each step emits tokens. `next` is what the next token is chosen from when
    /// the last pass left it (a speculative step's tokens come out of its verify pass).
    Decode { next: Option<NextScores> },
    /// Preempted: the state went to the prefix cache under `key` (the tokens it covered) and
    /// the sequence holds an empty one until it is brought back.
    Parked { key: Vec<u32>, resume: Resume },
    /// Bringing the state back after a preemption in decode: `tokens` (prompt, then output)
    /// are prefilled again where the parked state did not survive in the cache; `done` of
    /// them are in. Decode goes on with `next`, kept from before.
    Replay {
        tokens: Vec<u32>,
        done: usize,
        next: Option<NextScores>,
    },
    /// Ended, for this reason.
    Finished(FinishReason),
}

/// What a parked sequence goes back to.
enum Resume {
    /// Its prompt's prefill.
    Prefill,
    /// Decoding, once `tokens` are in again.
    Replay {
        tokens: Vec<u32>,
        next: Option<NextScores>,
    },
}

/// A request being prefilled or decoded.
pub struct Sequence {
    id: SeqId,
    prompt: Vec<u32>,
    /// The prompt's images (their rows replace placeholder tokens in every pass over them).
    images: Vec<ImageSpan>,
    /// The prompt as the prefix cache keys it, where it holds images ([`cache_key`]).
    prompt_key: Option<Vec<u32>>,
    output: Vec<u32>,
    state: SequenceState,
    phase: Phase,
    sampler: Sampler,
    stop: StopMatcher,
    decoder: StreamDecoder,
    max_tokens: usize,
    max_context: usize,
    eos: Vec<u32>,
    grammar: Option<GrammarState>,
    /// The grammar applies once these tokens were generated, in this order (empty: it
    /// applies now).
    grammar_after: Vec<u32>,
    prefill_time: Duration,
    decode_time: Duration,
    /// Set when the sequence decodes speculatively (a draft is attached).
    spec: Option<Speculation>,
    /// Prompt tokens restored from the prefix cache instead of prefilled.
    cached: usize,
    /// Prompt positions whose state the prefix cache should keep, ascending.
    checkpoints: Vec<usize>,
    /// States reached at those positions, for the engine to store.
    snapshots: Vec<Restored>,
    /// A score-only sequence: the tokens whose final-position logits it reads.
    score: Option<Vec<u32>>,
    /// Those logits, once read.
    scores: Option<Vec<f32>>,
}

/// A drafted block (or the anchor alone) waiting for its verify pass.
pub(crate) struct PendingBlock {
    /// The pass's tokens: the anchor, then the proposals.
    pub(crate) rows: Vec<u32>,
    proposal: speculative::Proposal,
    /// When the step began (drafting included), for the step's speed.
    started: Instant,
}

/// A sequence's draft: it advances by a verified block per step.
struct Speculation {
    drafter: Arc<dyn Drafter>,
    session: Box<dyn DraftSession>,
    stats: SpecStats,
    rows: VerifyRows,
}

impl Sequence {
    pub(crate) fn new(
        id: SeqId,
        req: Request,
        grammar: Option<(GrammarState, Vec<u32>)>,
        model: &Model,
        max_context: usize,
        kv: KvFormat,
        // The draft, and whether it drafts a full block every step.
        drafter: Option<(&Arc<dyn Drafter>, bool)>,
    ) -> Self {
        let (grammar, grammar_after) = match grammar {
            Some((g, after)) => (Some(g), after),
            None => (None, Vec::new()),
        };
        let greedy = req.sampling.is_greedy();
        // A seeded sampled sequence draws from its generator once per verified row, so its
        // output depends on the verify lengths; lengths chosen by measured speed would make
        // the same seed give different text under different load. It verifies the full block
        // every step, which depends on nothing but its own text.
        let seeded = !greedy && req.sampling.seed.is_some();
        let eos = if req.ignore_eos {
            Vec::new()
        } else {
            model.generation.eos_token_ids.clone()
        };
        let prompt_key = cache_key(&req.prompt, &req.images);
        Self {
            id,
            prompt: req.prompt,
            images: req.images.into_iter().map(|i| i.span).collect(),
            prompt_key,
            output: Vec::new(),
            state: model.graph.new_state_with(kv),
            phase: Phase::Prefill { done: 0 },
            sampler: Sampler::new(req.sampling),
            stop: StopMatcher::new(req.stop),
            decoder: StreamDecoder::new(),
            max_tokens: req.max_tokens,
            max_context,
            eos,
            grammar,
            grammar_after,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            spec: drafter.map(|(d, draft_every_step)| Speculation {
                drafter: d.clone(),
                session: d.session(),
                stats: SpecStats::default(),
                // An unseeded sampled sequence keeps to the anchor alone or the full block, as
                // before shorter lengths were chosen.
                rows: VerifyRows::new(d.block_size(), draft_every_step || seeded, greedy),
            }),
            cached: 0,
            checkpoints: Vec::new(),
            snapshots: Vec::new(),
            score: None,
            scores: None,
        }
    }

    /// Makes this a score-only sequence: after its prefill it ends ([`FinishReason::Scored`])
    /// with the final position's logits at `answers` instead of generating.
    pub(crate) fn score_only(&mut self, answers: Vec<u32>) {
        self.score = Some(answers);
    }

    /// The logits a score-only sequence read, in the order of its answer tokens.
    pub fn scores(&self) -> Option<&[f32]> {
        self.scores.as_deref()
    }

    /// Starts from a cached prefix of the prompt instead of prefilling it.
    pub(crate) fn resume_from(&mut self, r: Restored) {
        self.state = r.state;
        self.phase = Phase::Prefill { done: r.len };
        self.cached = r.len;
        if let (Some(spec), Some(draft)) = (&mut self.spec, r.draft) {
            spec.session = draft;
        }
    }

    /// Keeps the states reached at these prompt positions for the prefix cache.
    pub(crate) fn keep_states_at(&mut self, positions: Vec<usize>) {
        self.checkpoints = positions;
    }

    /// True when the sequence decodes with a draft.
    pub(crate) fn has_draft(&self) -> bool {
        self.spec.is_some()
    }

    /// Speculation counters, when the sequence decodes with a draft.
    pub fn spec_stats(&self) -> Option<SpecStats> {
        self.spec.as_ref().map(|s| s.stats)
    }

    /// The id the engine gave this sequence.
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// Prompt tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Generated tokens (the EOS token included when it ended the sequence).
    pub fn output(&self) -> &[u32] {
        &self.output
    }

    /// Why it ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        match &self.phase {
            Phase::Finished(reason) => Some(reason),
            _ => None,
        }
    }

    /// Time spent in prefill and in decode.
    pub fn timings(&self) -> (Duration, Duration) {
        (self.prefill_time, self.decode_time)
    }

    /// Prompt tokens restored from the prefix cache instead of prefilled.
    pub fn cached_tokens(&self) -> usize {
        self.cached
    }

    /// States reached at checkpoint positions since the last call, with their prompt prefix's
    /// cache key.
    pub(crate) fn take_snapshots(&mut self) -> Vec<(Vec<u32>, Restored)> {
        let key = self.prompt_key.as_ref().unwrap_or(&self.prompt);
        std::mem::take(&mut self.snapshots)
            .into_iter()
            .map(|r| (key[..r.len].to_vec(), r))
            .collect()
    }

    /// `tokens` (the prompt, then output) as the prefix cache keys them: the prompt's image
    /// rows by their images' digests.
    pub(crate) fn cache_key(&self, tokens: &[u32]) -> Vec<u32> {
        match &self.prompt_key {
            None => tokens.to_vec(),
            Some(key) => {
                let n = key.len().min(tokens.len());
                key[..n].iter().chain(&tokens[n..]).copied().collect()
            }
        }
    }

    /// The next prefill chunk of at most `chunk` tokens (decoding steps are the engine's:
    /// it batches them across sequences). Returns the tokens it ran.
    pub(crate) fn prefill_step(
        &mut self,
        model: &Model,
        chunk: usize,
        events: &mut Vec<Event>,
    ) -> Result<usize, ModelError> {
        let (tokens, start) = match &self.phase {
            Phase::Prefill { done } => (&self.prompt, *done),
            Phase::Replay { tokens, done, .. } => (tokens, *done),
            _ => return Ok(0),
        };
        if start == tokens.len() || chunk == 0 {
            return Ok(0);
        }
        let t0 = Instant::now();
        let mut end = (start + chunk).min(tokens.len());
        // Stop at a checkpoint so the state there can be kept.
        if let Some(&cp) = self.checkpoints.iter().find(|&&c| c > start && c < end) {
            end = cp;
        }
        let last = end == tokens.len();
        let replay = matches!(self.phase, Phase::Replay { .. });
        // A replay keeps the logits it had when it was parked.
        let want = if last && !replay {
            Logits::Last
        } else {
            Logits::None
        };
        let taps = self
            .spec
            .as_ref()
            .map_or(&[][..], |s| s.drafter.tap_layers());
        let mut item = [BatchItem {
            state: &mut self.state,
            tokens: &tokens[start..end],
            images: &self.images,
        }];
        let out = model.graph.forward_batch(&mut item, want, taps)?.remove(0);
        if let Some(spec) = &mut self.spec {
            spec.session.commit(&out.features)?;
        }
        self.phase = match std::mem::replace(&mut self.phase, Phase::Prefill { done: 0 }) {
            Phase::Replay { next, .. } if last => Phase::Decode { next },
            Phase::Replay { tokens, next, .. } => Phase::Replay {
                tokens,
                done: end,
                next,
            },
            _ if last => Phase::Decode {
                next: Some(NextScores::Logits(out.logits)),
            },
            _ => Phase::Prefill { done: end },
        };
        if self.checkpoints.contains(&end) {
            self.snapshot(end);
        }
        if last {
            // Kept already: a replay after a preemption need not copy them again.
            self.checkpoints.clear();
            if let Some(answers) = self.score.take() {
                self.read_scores(answers, events);
            }
        }
        self.prefill_time += t0.elapsed();
        Ok(end - start)
    }

    /// Ends a score-only sequence with its answers' logits (taken from the prefill's).
    fn read_scores(&mut self, answers: Vec<u32>, events: &mut Vec<Event>) {
        let logits = match &self.phase {
            Phase::Decode {
                next: Some(NextScores::Logits(logits)),
            } => logits,
            _ => {
                let why = "the prefill left no logits to score (an engine bug)";
                return self.close(FinishReason::Failed(why.into()), events);
            }
        };
        let scores = answers
            .iter()
            .map(|&t| logits.get(t as usize).copied().unwrap_or(f32::NAN))
            .collect();
        self.scores = Some(scores);
        self.close(FinishReason::Scored, events);
    }

    /// Preempts the sequence: hands over its state (and draft context) with the tokens they
    /// cover, for the prefix cache, and keeps an empty state until [`unpark`](Self::unpark).
    /// Its output, sampler, stop and grammar state stay: nothing already sent is lost.
    pub(crate) fn park(&mut self, model: &Model) -> (Vec<u32>, Restored) {
        let len = self.state.len();
        let tokens: Vec<u32> = self
            .prompt
            .iter()
            .chain(&self.output)
            .take(len)
            .copied()
            .collect();
        let key = self.cache_key(&tokens);
        let fresh = model.graph.new_state_with(self.state.kv_format());
        let state = std::mem::replace(&mut self.state, fresh);
        let draft = self
            .spec
            .as_mut()
            .map(|s| std::mem::replace(&mut s.session, s.drafter.session()));
        let resume = match std::mem::replace(&mut self.phase, Phase::Prefill { done: 0 }) {
            Phase::Decode { next } => Resume::Replay { tokens, next },
            Phase::Replay { tokens, next, .. } => Resume::Replay { tokens, next },
            Phase::Prefill { .. } => Resume::Prefill,
            // The engine parks only sequences that hold or will hold KV rows.
            other @ (Phase::Parked { .. } | Phase::Finished(_)) => {
                self.phase = other;
                return (key, Restored { len, state, draft });
            }
        };
        self.phase = Phase::Parked {
            key: key.clone(),
            resume,
        };
        (key, Restored { len, state, draft })
    }

    /// The cache key a parked sequence's state went under, and the tokens to bring it back to.
    pub(crate) fn parked(&self) -> Option<(&[u32], &[u32])> {
        match &self.phase {
            Phase::Parked {
                key,
                resume: Resume::Prefill,
            } => Some((key, &self.prompt)),
            Phase::Parked {
                key,
                resume: Resume::Replay { tokens, .. },
            } => Some((key, tokens)),
            _ => None,
        }
    }

    /// Ends a preemption: from `restored` (its parked state, or a cached prefix of it), or
    /// from nothing (prefilled again).
    pub(crate) fn unpark(&mut self, restored: Option<Restored>) {
        let Phase::Parked { resume, .. } =
            std::mem::replace(&mut self.phase, Phase::Prefill { done: 0 })
        else {
            return;
        };
        let mut done = 0;
        if let Some(r) = restored {
            self.state = r.state;
            done = r.len;
            if let (Some(spec), Some(draft)) = (&mut self.spec, r.draft) {
                spec.session = draft;
            }
        }
        self.phase = match resume {
            Resume::Prefill => Phase::Prefill { done },
            Resume::Replay { tokens, next } if done == tokens.len() => Phase::Decode { next },
            Resume::Replay { tokens, next } => Phase::Replay { tokens, done, next },
        };
    }

    /// KV-cache tokens this sequence holds (0 while parked).
    pub(crate) fn kv_tokens(&self) -> usize {
        self.state.len()
    }

    /// KV-cache tokens this sequence holds, or will once its prompt (or replay) is in; 0 while
    /// parked or finished.
    pub(crate) fn kv_tokens_committed(&self) -> usize {
        let target = match &self.phase {
            Phase::Prefill { .. } => self.prompt.len(),
            Phase::Replay { tokens, .. } => tokens.len(),
            Phase::Decode { .. } => 0,
            Phase::Parked { .. } | Phase::Finished(_) => return 0,
        };
        self.state.len().max(target)
    }

    /// KV-cache tokens this sequence holds after its next step (0 while parked): its state
    /// plus a token, a verify block, or a prefill chunk of at most `chunk`.
    pub(crate) fn kv_after_step(&self, chunk: usize) -> usize {
        let growth = match self.phase {
            Phase::Decode { .. } => self.spec.as_ref().map_or(1, |s| s.drafter.block_size()),
            Phase::Prefill { .. } | Phase::Replay { .. } => self.prefill_left().min(chunk),
            Phase::Parked { .. } | Phase::Finished(_) => return 0,
        };
        self.state.len() + growth
    }

    /// Keeps a copy of the state after `len` prompt tokens for the prefix cache. A copy that
    /// fails (out of GPU memory) is skipped: caching is an optimisation.
    fn snapshot(&mut self, len: usize) {
        let draft = match self.spec.as_ref().map(|s| s.session.fork()) {
            None => None,
            Some(Some(Ok(d))) => Some(d),
            // This draft's sessions cannot be copied (or the copy failed): nothing to keep.
            Some(_) => return,
        };
        match self.state.try_clone() {
            Ok(state) => self.snapshots.push(Restored { len, state, draft }),
            Err(e) => tracing::warn!("prefix cache: cannot copy a state ({e}); not cached"),
        }
    }

    /// Prompt tokens not prefilled yet (a replay after a preemption counts too).
    pub(crate) fn prefill_left(&self) -> usize {
        match &self.phase {
            Phase::Prefill { done } => self.prompt.len() - done,
            Phase::Replay { tokens, done, .. } => tokens.len() - done,
            Phase::Parked {
                resume: Resume::Prefill,
                ..
            } => self.prompt.len(),
            Phase::Parked {
                resume: Resume::Replay { tokens, .. },
                ..
            } => tokens.len(),
            Phase::Decode { .. } | Phase::Finished(_) => 0,
        }
    }

    /// True when the next step is a plain one-token decode step (prompt in, no draft): the
    /// engine runs the forward passes of all such sequences as one batch
    /// ([`sample_next`](Self::sample_next), the pass, [`decoded`](Self::decoded)).
    pub(crate) fn decodes_plainly(&self) -> bool {
        self.decoding() && self.spec.is_none()
    }

    /// Prompt in, not finished, not parked.
    fn decoding(&self) -> bool {
        matches!(self.phase, Phase::Decode { .. })
    }

    fn finished(&self) -> bool {
        matches!(self.phase, Phase::Finished(_))
    }

    /// The scores the next token is chosen from, taken (a decoding sequence whose last pass
    /// left them).
    fn take_next(&mut self) -> Option<NextScores> {
        match &mut self.phase {
            Phase::Decode { next } => next.take(),
            _ => None,
        }
    }

    /// Samples and emits the next token from the last logits (masked by the output
    /// constraint). Returns it when the sequence goes on: its forward pass comes next.
    pub(crate) fn sample_next(
        &mut self,
        model: &Model,
        events: &mut Vec<Event>,
    ) -> Result<Option<u32>, ModelError> {
        let Some(next) = self.take_next() else {
            let why = "a decode step came before the pass that scores it (an engine bug)";
            self.fail(why.into(), events)?;
            return Ok(None);
        };
        let token = match next {
            NextScores::Argmax(token) => token,
            NextScores::Logits(mut logits) => {
                let Some(token) = self.sample_constrained(&mut logits, events)? else {
                    return Ok(None);
                };
                token
            }
        };
        self.push(token, model, events)?;
        Ok((!self.finished()).then_some(token))
    }

    /// Samples from `logits` masked by the output constraint, when it applies; `None` when
    /// the constraint failed (the sequence has ended).
    fn sample_constrained(
        &mut self,
        logits: &mut [f32],
        events: &mut Vec<Event>,
    ) -> Result<Option<u32>, ModelError> {
        if let Some(g) = self
            .grammar
            .as_mut()
            .filter(|_| self.grammar_after.is_empty())
        {
            if let Err(e) = g.mask(logits) {
                self.fail(format!("the output constraint failed: {e}"), events)?;
                return Ok(None);
            }
        }
        Ok(Some(self.sampler.sample(
            logits,
            &self.prompt,
            &self.output,
        )))
    }

    /// True while the output constraint masks the next token.
    fn constrained(&self) -> bool {
        self.grammar.is_some() && self.grammar_after.is_empty()
    }

    /// True when the next token is the argmax of the logits as they come (greedy, no
    /// penalties, no constraint now): its forward pass may return only the argmax
    /// ([`Logits::Argmax`]).
    pub(crate) fn argmax_suffices(&self) -> bool {
        !self.constrained() && self.sampler.argmax_suffices()
    }

    /// Takes the output of the forward pass of the token [`sample_next`](Self::sample_next)
    /// returned (its logits, or with [`Logits::Argmax`] its argmax).
    pub(crate) fn decoded(&mut self, out: PassOutput) {
        if let Phase::Decode { next } = &mut self.phase {
            *next = Some(match out.argmax.first() {
                Some(&token) => NextScores::Argmax(token),
                None => NextScores::Logits(out.logits),
            });
        }
    }

    /// The model state, for a batched forward pass.
    pub(crate) fn state_mut(&mut self) -> &mut SequenceState {
        &mut self.state
    }

    /// Adds time spent decoding on this sequence's behalf (its share of a batched step).
    pub(crate) fn add_decode_time(&mut self, d: Duration) {
        self.decode_time += d;
    }

    /// True when the next step is a speculative one (prompt in, a draft attached): the
    /// engine verifies the blocks of all such sequences in one batched pass
    /// ([`draft_block`](Self::draft_block), the pass, [`verified`](Self::verified)).
    pub(crate) fn speculates(&self) -> bool {
        self.decoding() && self.spec.is_some()
    }

    /// The first half of a speculative step: drafts the next block (or a single row, when
    /// drafting does not pay now) and checkpoints the state for its verify pass. `None` when
    /// the sequence ended on the token sampled from the prefill logits.
    pub(crate) fn draft_block(
        &mut self,
        model: &Model,
        costs: &StepCosts,
        events: &mut Vec<Event>,
    ) -> Result<Option<PendingBlock>, ModelError> {
        let t0 = Instant::now();
        // The token the prefill's logits give, first (later ones come out of verify passes).
        let has_next = matches!(self.phase, Phase::Decode { next: Some(_) });
        if has_next && self.sample_next(model, events)?.is_none() {
            return Ok(None);
        }
        let spec = self.spec.as_mut().expect("a speculating sequence");
        // Never verify past what may still be emitted: the budget and the context limit.
        let room = (self.max_tokens - self.output.len())
            .min(self.max_context - self.prompt.len() - self.output.len());
        // A shorter verify takes a prefix of the full block's proposals, so that what the
        // full block accepts tells what each prefix would have (see VerifyRows).
        let verify = spec.rows.next(costs).min(room);
        let block = if verify > 1 {
            spec.drafter.block_size().min(room)
        } else {
            1
        };
        let mut history = self.prompt.clone();
        history.extend_from_slice(&self.output);
        let anchor = *history
            .last()
            .expect("the anchor is the last emitted token");
        let mut proposal = speculative::draft(
            spec.session.as_mut(),
            model,
            &history,
            block,
            &mut self.sampler,
        )?;
        proposal.tokens.truncate(verify - 1);
        proposal.q.truncate(verify - 1);
        let rows = speculative::verify_rows(&mut self.state, anchor, &proposal);
        Ok(Some(PendingBlock {
            rows,
            proposal,
            started: t0,
        }))
    }

    /// The second half of a speculative step: the verify pass's output for `block` (logits
    /// `[B, V]` or their argmax, taps `[B, n·H]`); accepts, rolls the state back and emits the
    /// tokens.
    pub(crate) fn verified(
        &mut self,
        model: &Model,
        block: PendingBlock,
        verified: PassOutput,
        costs: &mut StepCosts,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        let PendingBlock {
            rows,
            proposal,
            started,
        } = block;
        let accepted = if self.constrained() {
            match self.accept_constrained(&verified, &proposal) {
                Ok(accepted) => accepted,
                Err(e) => return self.fail(format!("the output constraint failed: {e}"), events),
            }
        } else {
            let mut accepted = speculative::accept(
                &mut self.sampler,
                &verified,
                &proposal,
                &self.prompt,
                &self.output,
                None,
            );
            self.end_at_constraint_start(&mut accepted);
            accepted
        };
        let spec = self.spec.as_mut().expect("a speculating sequence");
        speculative::commit(
            spec.session.as_mut(),
            &mut self.state,
            &verified,
            rows.len(),
            accepted.drafts + 1,
        )?;
        if !proposal.tokens.is_empty() {
            spec.stats.target_passes += 1;
            spec.stats.drafted += proposal.tokens.len() as u64;
            spec.stats.accepted += accepted.drafts as u64;
        }
        let elapsed = started.elapsed();
        spec.rows
            .record(rows.len(), accepted.drafts, elapsed.as_secs_f64(), costs);
        self.decode_time += elapsed;
        // A stop token or string inside the span ends the sequence at that token.
        for &token in &accepted.tokens {
            self.push(token, model, events)?;
            if self.finished() {
                break;
            }
        }
        Ok(())
    }

    /// Acceptance under the output constraint: each row's logits are masked in the grammar's
    /// state after the proposals accepted before it (the grammar goes through them, then is
    /// rolled back: [`push`](Self::push) consumes what is emitted).
    fn accept_constrained(
        &mut self,
        verified: &PassOutput,
        proposal: &speculative::Proposal,
    ) -> Result<Accepted, String> {
        let Some(grammar) = self.grammar.as_mut() else {
            return Err("no constraint to accept under (an engine bug)".into());
        };
        let (mut consumed, mut failure) = (0, None);
        let mut mask = |accepted: &[u32], row: &mut [f32]| {
            for &token in &accepted[consumed..] {
                // A complete grammar takes nothing more (its mask is the end of the text);
                // push() ends the sequence at that token.
                if grammar.is_done() {
                    break;
                }
                match grammar.consume(token) {
                    Ok(()) => consumed += 1,
                    Err(e) => failure = failure.take().or(Some(e)),
                }
            }
            if let Err(e) = grammar.mask(row) {
                failure = failure.take().or(Some(e));
            }
        };
        let accepted = speculative::accept(
            &mut self.sampler,
            verified,
            proposal,
            &self.prompt,
            &self.output,
            Some(&mut mask),
        );
        grammar.rollback(consumed)?;
        match failure {
            Some(e) => Err(e),
            None => Ok(accepted),
        }
    }

    /// Cuts an accepted span after the token where the output constraint starts: the tokens
    /// after it were chosen without its mask. The cut token stands as the target's own (an
    /// accepted proposal is distributed as the target's token would be), so the next step
    /// samples from the masked logits of its row.
    fn end_at_constraint_start(&self, accepted: &mut Accepted) {
        if self.grammar.is_none() || self.grammar_after.is_empty() {
            return;
        }
        let mut waiting = self.grammar_after.iter().peekable();
        for (i, token) in accepted.tokens.iter().enumerate() {
            if waiting.next_if_eq(&token).is_some() && waiting.peek().is_none() {
                if i < accepted.drafts {
                    accepted.tokens.truncate(i + 1);
                    accepted.drafts = i;
                }
                return;
            }
        }
    }

    /// Appends a generated token: grammar, end-of-sequence, stop strings, budget and
    /// context limit.
    fn push(
        &mut self,
        token: u32,
        model: &Model,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        self.output.push(token);
        let mut grammar_done = false;
        match self.grammar.as_mut() {
            Some(g) if self.grammar_after.is_empty() => {
                if let Err(e) = g.consume(token) {
                    return self.fail(format!("the output constraint failed: {e}"), events);
                }
                grammar_done = g.is_done();
            }
            Some(_) if self.grammar_after.first() == Some(&token) => {
                self.grammar_after.remove(0);
            }
            _ => {}
        }
        if self.eos.contains(&token) {
            self.finish(FinishReason::Eos(token), model, events)?;
        } else if let Some(piece) = self.decoder.push(&model.tokenizer, token)? {
            let check = self.stop.push(&piece);
            self.emit(check.emit, events);
            if let Some(s) = check.stopped {
                self.close(FinishReason::StopString(s), events);
            }
        }
        if !self.finished() && grammar_done {
            self.finish(FinishReason::GrammarEnd, model, events)?;
        }
        if !self.finished() && self.output.len() >= self.max_tokens {
            self.finish(FinishReason::Length, model, events)?;
        }
        // Like vLLM's max_model_len: prompt + output never exceed the context limit.
        if !self.finished() && self.prompt.len() + self.output.len() >= self.max_context {
            self.finish(FinishReason::ContextFull, model, events)?;
        }
        Ok(())
    }

    fn fail(&mut self, message: String, events: &mut Vec<Event>) -> Result<(), ModelError> {
        self.close(FinishReason::Failed(message), events);
        Ok(())
    }

    /// Records why the sequence ended and tells the engine.
    fn close(&mut self, reason: FinishReason, events: &mut Vec<Event>) {
        self.phase = Phase::Finished(reason);
        events.push(Event::Finished { id: self.id });
    }

    /// Time spent computing grammar masks and how many were computed (constrained requests).
    pub fn grammar_stats(&self) -> Option<(Duration, usize)> {
        self.grammar.as_ref().map(GrammarState::mask_stats)
    }

    fn emit(&self, text: String, events: &mut Vec<Event>) {
        if !text.is_empty() {
            events.push(Event::Text { id: self.id, text });
        }
    }

    /// Ends the sequence, releasing text held back by the decoder and stop matcher.
    fn finish(
        &mut self,
        reason: FinishReason,
        model: &Model,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        let mut reason = reason;
        let mut tail = String::new();
        if let Some(rest) = self.decoder.flush(&model.tokenizer)? {
            let check = self.stop.push(&rest);
            tail = check.emit;
            if let Some(s) = check.stopped {
                reason = FinishReason::StopString(s);
            }
        }
        // Held-back text is released; after a stop string the matcher holds nothing.
        tail.push_str(&self.stop.finish());
        self.emit(tail, events);
        self.close(reason, events);
        Ok(())
    }
}
