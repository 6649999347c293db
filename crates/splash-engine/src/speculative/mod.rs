//! Speculative decoding: a draft proposes a block, one target pass verifies it, and the
//! longest acceptable prefix plus one target token is emitted (model-spec §4.2). The output
//! distribution is exactly the target's: greedy acceptance keeps the target's argmax, and
//! sampled acceptance is exact rejection sampling with the draft's proposal probabilities.
//!
//! One block is four steps, each a function here:
//! - [`draft`]: the drafter proposes `B-1` tokens after the anchor (the last emitted token,
//!   not yet run through the target);
//! - [`verify_rows`]: one target pass over `[anchor, d1..d_{B-1}]` from a state checkpoint,
//!   with the logits of every row (only their argmax when that is all acceptance reads) and
//!   the draft's tap features (the engine batches the blocks of all sequences into one pass);
//! - [`accept`]: [`accept_greedy`] or [`accept_sampled`] picks the emitted tokens;
//! - [`commit`]: the target state is rolled back to the kept rows (KV truncated, GDN state
//!   replayed) and their taps go to the draft's context.

mod cost_model;

use std::sync::Arc;

use splash_model::{
    DFlashDraft, DraftBlock, DraftContext, Model, ModelError, PassOutput, SequenceState,
};

use crate::sampling::{argmax, Distribution, Sampler};

pub(crate) use cost_model::{StepCosts, VerifyRows};

/// Proposes blocks for speculative decoding. Implemented by the DFlash drafts
/// ([`DFlashDrafter`]); tests add oracle drafters.
pub trait Drafter: Send + Sync {
    /// Verify rows per block (the anchor plus `block_size - 1` proposals).
    fn block_size(&self) -> usize;
    /// Target layers whose outputs the drafter reads (may be empty).
    fn tap_layers(&self) -> &[usize];
    /// Per-sequence drafting state.
    fn session(&self) -> Box<dyn DraftSession>;
    /// What the draft holds in memory, for the memory plan.
    fn memory(&self) -> DraftMemory {
        DraftMemory::default()
    }
    /// Device memory its captured passes may hold for `lanes` sequences over `context` keys.
    fn graph_memory(&self, _lanes: usize, _context: usize) -> u64 {
        0
    }
    /// A session saved by [`DraftSession::save_image`].
    fn load_session(&self, _image: &[u8]) -> Result<Box<dyn DraftSession>, ModelError> {
        Err(ModelError::StateImage(
            "this draft cannot load saved sessions".into(),
        ))
    }
}

/// Memory a draft needs: its weights, and its context per committed token of a sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftMemory {
    pub weights: u64,
    pub per_token: u64,
}

impl std::fmt::Debug for dyn Drafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Drafter(block {}, taps {:?})",
            self.block_size(),
            self.tap_layers()
        )
    }
}

/// One sequence's drafting state.
pub trait DraftSession: Send {
    /// The taps `[T, n·H]` of the next `T` committed positions (prompt, then accepted rows).
    fn commit(&mut self, features: &[f32]) -> Result<(), ModelError>;
    /// A copy of this session, for the prefix cache (`None`: this draft cannot be copied,
    /// and its sequences are not cached; an error: the copy failed, e.g. out of GPU memory).
    fn fork(&self) -> Option<Result<Box<dyn DraftSession>, ModelError>> {
        None
    }
    /// The session as bytes, for the prefix cache's disk tier (`None`: it cannot be saved);
    /// [`Drafter::load_session`] reads it back.
    fn save_image(&self) -> Option<Result<Vec<u8>, ModelError>> {
        None
    }
    /// Bytes held by this session.
    fn memory_bytes(&self) -> usize {
        0
    }
    /// Proposes `len` tokens after `history` (prompt and output; its last token is the
    /// anchor, at position `history.len() - 1`). With a sampling `sampler`, the tokens are
    /// drawn and each slot's proposal distribution is returned for rejection sampling.
    fn propose(
        &mut self,
        target: &Model,
        history: &[u32],
        len: usize,
        sampler: &mut Sampler,
    ) -> Result<Proposal, ModelError>;
}

/// Draft tokens for one block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Per token, the distribution it was drawn from (empty when greedy).
    pub q: Vec<Distribution>,
}

/// The verify lengths a greedy sequence chooses among for blocks of `block` rows, ascending:
/// the anchor alone, then the first quarter, half and whole of the block.
pub fn verify_lengths(block: usize) -> Vec<usize> {
    let mut lengths = vec![1, block / 4, block / 2, block];
    lengths.retain(|&l| l >= 1);
    lengths.dedup();
    lengths
}

/// Speculation counters of a sequence or of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify passes of the target over a drafted block (steps that skipped the draft are
    /// not counted: these counters describe the draft).
    pub target_passes: u64,
    /// Tokens proposed by the draft.
    pub drafted: u64,
    /// Proposed tokens the target accepted.
    pub accepted: u64,
}

impl SpecStats {
    /// Mean tokens a verify pass produced (accepted drafts + the target's own token), τ.
    pub fn acceptance_length(&self) -> f64 {
        if self.target_passes == 0 {
            return 0.0;
        }
        (self.accepted + self.target_passes) as f64 / self.target_passes as f64
    }

    /// Adds another's counters.
    pub fn add(&mut self, other: &SpecStats) {
        self.target_passes += other.target_passes;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// What acceptance decided for one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Proposals accepted (a prefix of the block).
    pub drafts: usize,
    /// Emitted tokens: the accepted proposals, then the target's token.
    pub tokens: Vec<u32>,
}

/// Greedy acceptance: the longest prefix of `proposals` where each equals the target's
/// choice, then the target's choice at the first mismatch (or after the last proposal).
/// `target(i, accepted)` is the target's token for row `i` given the proposals accepted
/// before it.
pub fn accept_greedy(proposals: &[u32], mut target: impl FnMut(usize, &[u32]) -> u32) -> Accepted {
    let mut tokens = Vec::with_capacity(proposals.len() + 1);
    for (i, &d) in proposals.iter().enumerate() {
        let t = target(i, &tokens);
        if t != d {
            tokens.push(t);
            return Accepted { drafts: i, tokens };
        }
        tokens.push(d);
    }
    let t = target(proposals.len(), &tokens);
    tokens.push(t);
    Accepted {
        drafts: proposals.len(),
        tokens,
    }
}

/// Exact rejection sampling (Leviathan et al.; Z2 `_rejection_sample`): proposal `d_i ~ q_i`
/// is accepted with probability `min(1, p_i(d)/q_i(d))`; at the first rejection the token is
/// drawn from `norm(max(p_i - q_i, 0))` (from `p_i` if that is empty); after a fully
/// accepted block the bonus token is drawn from the last row's `p`. `target(i, accepted)` is
/// row `i`'s target distribution given the proposals accepted before it.
pub fn accept_sampled(
    proposals: &[u32],
    q: &[Distribution],
    mut target: impl FnMut(usize, &[u32]) -> Distribution,
    sampler: &mut Sampler,
) -> Accepted {
    assert_eq!(
        proposals.len(),
        q.len(),
        "one proposal distribution per token"
    );
    let mut tokens = Vec::with_capacity(proposals.len() + 1);
    for (i, (&d, qi)) in proposals.iter().zip(q).enumerate() {
        let p = target(i, &tokens);
        let (pd, qd) = (p.prob(d), qi.prob(d));
        if sampler.uniform() * qd < pd {
            tokens.push(d);
            continue;
        }
        let residual = residual(&p, qi);
        tokens.push(sampler.draw(residual.as_ref().unwrap_or(&p)));
        return Accepted { drafts: i, tokens };
    }
    let p = target(proposals.len(), &tokens);
    tokens.push(sampler.draw(&p));
    Accepted {
        drafts: proposals.len(),
        tokens,
    }
}

/// `max(p - q, 0)` over `p`'s support (outside it the difference is ≤ 0); `None` if empty.
fn residual(p: &Distribution, q: &Distribution) -> Option<Distribution> {
    let entries: Vec<(u32, f64)> = p
        .entries
        .iter()
        .map(|&(t, _)| (t, (p.prob(t) - q.prob(t)).max(0.0)))
        .filter(|e| e.1 > 0.0)
        .collect();
    (!entries.is_empty()).then_some(Distribution { entries })
}

/// Step 1, draft: proposes `block - 1` tokens after the anchor (`history`'s last token).
pub(crate) fn draft(
    session: &mut dyn DraftSession,
    model: &Model,
    history: &[u32],
    block: usize,
    sampler: &mut Sampler,
) -> Result<Proposal, ModelError> {
    if block < 2 {
        return Ok(Proposal::default());
    }
    session.propose(model, history, block - 1, sampler)
}

/// Step 2, verify: the rows of the target pass over the block, `[anchor, proposals]`, to run
/// from a checkpoint of the sequence's state (alone, or batched with other sequences' rows).
pub(crate) fn verify_rows(state: &mut SequenceState, anchor: u32, proposal: &Proposal) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(proposal.tokens.len() + 1);
    tokens.push(anchor);
    tokens.extend_from_slice(&proposal.tokens);
    state.checkpoint();
    tokens
}

/// Masks a verify row's logits, given the proposals accepted before the row.
pub(crate) type RowMask<'a> = dyn FnMut(&[u32], &mut [f32]) + 'a;

/// Step 3, accept: acceptance under the sequence's sampling parameters; penalties see the output with
/// the already accepted proposals, exactly as one-token-at-a-time decoding would. `verified` is
/// the target's view of the block: logits `[B, V]`, or only each row's argmax when the sampler
/// needs no more ([`Sampler::argmax_suffices`]). `mask`, for a constrained sequence, masks a
/// row's logits given the proposals accepted before it (with logits only).
pub(crate) fn accept(
    sampler: &mut Sampler,
    verified: &PassOutput,
    proposal: &Proposal,
    prompt: &[u32],
    output: &[u32],
    mut mask: Option<&mut RowMask>,
) -> Accepted {
    if !verified.argmax.is_empty() {
        debug_assert!(
            sampler.argmax_suffices() && mask.is_none(),
            "argmax-only verify for a sampler or constraint that reads logits"
        );
        return accept_greedy(&proposal.tokens, |i, _| verified.argmax[i]);
    }
    let rows = proposal.tokens.len() + 1;
    let vocab = verified.logits.len() / rows;
    let shaper = sampler.clone();
    let mut target = |i: usize, accepted: &[u32]| {
        let mut row = verified.logits[i * vocab..(i + 1) * vocab].to_vec();
        if let Some(mask) = mask.as_mut() {
            mask(accepted, &mut row);
        }
        let mut out = output.to_vec();
        out.extend_from_slice(accepted);
        shaper.distribution(&mut row, prompt, &out)
    };
    if sampler.params().is_greedy() {
        accept_greedy(&proposal.tokens, |i, acc| target(i, acc).entries[0].0)
    } else {
        accept_sampled(&proposal.tokens, &proposal.q, target, sampler)
    }
}

/// Step 4, commit: keeps the first `keep` rows of the verify pass (the anchor and the accepted
/// proposals): rolls the target state back and gives their taps to the draft.
pub(crate) fn commit(
    session: &mut dyn DraftSession,
    state: &mut SequenceState,
    verified: &PassOutput,
    rows: usize,
    keep: usize,
) -> Result<(), ModelError> {
    state.rollback(keep)?;
    let width = verified.features.len() / rows;
    session.commit(&verified.features[..keep * width])
}

/// A DFlash or DFlash2 draft as a [`Drafter`].
pub struct DFlashDrafter {
    draft: Arc<DFlashDraft>,
}

impl DFlashDrafter {
    pub fn new(draft: Arc<DFlashDraft>) -> Self {
        Self { draft }
    }

    /// The draft model.
    pub fn draft(&self) -> &DFlashDraft {
        &self.draft
    }
}

impl Drafter for DFlashDrafter {
    fn block_size(&self) -> usize {
        self.draft.config().block_size
    }

    fn tap_layers(&self) -> &[usize] {
        &self.draft.config().target_layer_ids
    }

    fn memory(&self) -> DraftMemory {
        let (weights, per_token) = self.draft.memory();
        DraftMemory { weights, per_token }
    }

    fn graph_memory(&self, lanes: usize, context: usize) -> u64 {
        self.draft.graph_memory(lanes, context)
    }

    fn session(&self) -> Box<dyn DraftSession> {
        Box::new(DFlashSession {
            ctx: self.draft.new_context(),
            draft: self.draft.clone(),
        })
    }

    fn load_session(&self, image: &[u8]) -> Result<Box<dyn DraftSession>, ModelError> {
        Ok(Box::new(DFlashSession {
            ctx: self.draft.load_context(image)?,
            draft: self.draft.clone(),
        }))
    }
}

struct DFlashSession {
    draft: Arc<DFlashDraft>,
    ctx: DraftContext,
}

impl DraftSession for DFlashSession {
    fn commit(&mut self, features: &[f32]) -> Result<(), ModelError> {
        self.draft.append_context(&mut self.ctx, features)
    }

    fn fork(&self) -> Option<Result<Box<dyn DraftSession>, ModelError>> {
        Some(self.draft.try_clone_context(&self.ctx).map(|ctx| {
            Box::new(DFlashSession {
                draft: self.draft.clone(),
                ctx,
            }) as Box<dyn DraftSession>
        }))
    }

    fn save_image(&self) -> Option<Result<Vec<u8>, ModelError>> {
        Some(self.draft.save_context(&self.ctx))
    }

    fn memory_bytes(&self) -> usize {
        self.ctx.memory_bytes()
    }

    fn propose(
        &mut self,
        target: &Model,
        history: &[u32],
        len: usize,
        sampler: &mut Sampler,
    ) -> Result<Proposal, ModelError> {
        let anchor = *history.last().expect("a history ends with the anchor");
        debug_assert_eq!(
            self.ctx.len() + 1,
            history.len(),
            "draft context out of step"
        );
        let DraftBlock {
            hidden,
            logits,
            candidates,
        } = self
            .draft
            .draft_block(&mut self.ctx, &target.graph, anchor, len + 1)?;
        let greedy = sampler.params().is_greedy();
        let mut proposal = Proposal::default();
        match self.draft.selector() {
            None => {
                for row in logits.chunks_exact(logits.len() / len) {
                    if greedy {
                        proposal.tokens.push(argmax(row));
                    } else {
                        let q = sampler.truncated(row).normalized();
                        proposal.tokens.push(sampler.draw(&q));
                        proposal.q.push(q);
                    }
                }
            }
            Some(selector) => {
                let temperature = sampler.params().temperature as f64;
                let mut qs = Vec::new();
                let walk = selector.walk_candidates(&hidden, &candidates, anchor, |scores| {
                    if greedy {
                        return argmax(scores) as usize;
                    }
                    // q = softmax(scores / T) over the candidates (Z2 CandidateSelector).
                    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s)) as f64;
                    let w: Vec<f64> = scores
                        .iter()
                        .map(|&s| ((s as f64 - max) / temperature).exp())
                        .collect();
                    let sum: f64 = w.iter().sum();
                    let mut u = sampler.uniform() * sum;
                    let mut pick = w.len() - 1;
                    for (i, &x) in w.iter().enumerate() {
                        if u < x {
                            pick = i;
                            break;
                        }
                        u -= x;
                    }
                    qs.push(w.into_iter().map(|x| x / sum).collect::<Vec<f64>>());
                    pick
                });
                for (slot, probs) in walk
                    .iter()
                    .zip(qs.iter().map(Some).chain(std::iter::repeat(None)))
                {
                    proposal.tokens.push(slot.token());
                    if let Some(probs) = probs {
                        proposal.q.push(Distribution {
                            entries: slot
                                .candidates
                                .iter()
                                .copied()
                                .zip(probs.iter().copied())
                                .collect(),
                        });
                    }
                }
            }
        }
        Ok(proposal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    #[test]
    fn greedy_keeps_the_matching_prefix_and_the_targets_token() {
        let want = [5u32, 6, 7, 8];
        let target = |i: usize, _: &[u32]| want[i];
        assert_eq!(
            accept_greedy(&[5, 6, 9], target),
            Accepted {
                drafts: 2,
                tokens: vec![5, 6, 7]
            }
        );
        assert_eq!(
            accept_greedy(&[5, 6, 7], target),
            Accepted {
                drafts: 3,
                tokens: vec![5, 6, 7, 8]
            }
        );
        assert_eq!(accept_greedy(&[1, 6, 7], target).tokens, vec![5]);
        assert_eq!(accept_greedy(&[], target).tokens, vec![5]);
    }

    /// A Markov chain over a small vocabulary as the "target" and a different one as the
    /// draft; blocks of 3 proposals. The first three emitted tokens of a block must follow
    /// the target chain exactly: chi-square over the 4^3 sequences.
    #[test]
    fn sampled_acceptance_follows_the_target_distribution() {
        const V: usize = 4;
        let p_chain = |prev: u32| -> Vec<f64> {
            let w = [
                [0.5, 0.2, 0.2, 0.1],
                [0.1, 0.6, 0.2, 0.1],
                [0.25, 0.25, 0.25, 0.25],
                [0.05, 0.15, 0.3, 0.5],
            ];
            w[prev as usize].to_vec()
        };
        let q_chain = |prev: u32| -> Vec<f64> {
            let w = [
                [0.1, 0.1, 0.4, 0.4],
                [0.7, 0.1, 0.1, 0.1],
                [0.4, 0.3, 0.2, 0.1],
                [0.25, 0.25, 0.25, 0.25],
            ];
            w[prev as usize].to_vec()
        };
        let dist = |w: Vec<f64>| Distribution {
            entries: w
                .into_iter()
                .enumerate()
                .map(|(t, x)| (t as u32, x))
                .collect(),
        };
        let mut sampler = Sampler::new(SamplingParams {
            seed: Some(42),
            ..Default::default()
        });
        let anchor = 0u32;
        let n = 40_000;
        let mut counts = vec![0usize; V * V * V];
        let mut accepted_total = 0;
        for _ in 0..n {
            // Draft 3 tokens from the q chain.
            let (mut prev, mut toks, mut qs) = (anchor, Vec::new(), Vec::new());
            for _ in 0..3 {
                let q = dist(q_chain(prev));
                let t = sampler.draw(&q);
                toks.push(t);
                qs.push(q);
                prev = t;
            }
            let acc = accept_sampled(
                &toks,
                &qs,
                |i, accepted| {
                    let prev = if i == 0 { anchor } else { accepted[i - 1] };
                    dist(p_chain(prev))
                },
                &mut sampler,
            );
            accepted_total += acc.drafts;
            // Complete to three tokens from the target chain when the block stopped early.
            let mut seq = acc.tokens.clone();
            while seq.len() < 3 {
                let t = sampler.draw(&dist(p_chain(*seq.last().unwrap())));
                seq.push(t);
            }
            counts[(seq[0] as usize * V + seq[1] as usize) * V + seq[2] as usize] += 1;
        }
        let mut chi2 = 0.0;
        for (i, &c) in counts.iter().enumerate() {
            let (a, b, c3) = (i / (V * V), i / V % V, i % V);
            let e = n as f64 * p_chain(anchor)[a] * p_chain(a as u32)[b] * p_chain(b as u32)[c3];
            chi2 += (c as f64 - e).powi(2) / e;
        }
        // 63 degrees of freedom: the 99.9th percentile is about 103.4.
        println!(
            "chi2 = {chi2:.1} over 63 dof; mean accepted drafts {:.3}",
            accepted_total as f64 / n as f64
        );
        assert!(
            chi2 < 103.4,
            "chi-square {chi2} says the output is not the target's distribution"
        );
        assert!(
            accepted_total > 0 && accepted_total < 3 * n,
            "both branches must be exercised"
        );
    }
}
