//! DFlash2's candidate selector (model-spec §4.3): instead of taking each slot's argmax on
//! its own, walk the block slot by slot, re-scoring each slot's top-k candidates by a
//! rank-R transition from the token chosen for the previous slot.
//!
//! `score_j = u_j + Σ_r pred[prev][r] · hp[r] · succ[cand_j][r]`, `hp = hidden_projection(h)`.

use splash_backend::cpu::matmul;
use splash_backend::Weight;

use super::config::DFlash2Config;
use crate::checkpoint::Checkpoint;
use crate::error::ModelError;

/// The selector's weights.
pub struct Selector {
    /// `[V, R]` each.
    predecessor: Weight,
    successor: Weight,
    /// `[R, H]`.
    projection: Weight,
    top_k: usize,
}

/// One slot of a walk: its candidates (best logit first), their scores, and the one chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectorSlot {
    pub candidates: Vec<u32>,
    pub scores: Vec<f32>,
    pub chosen: usize,
}

impl SelectorSlot {
    /// The chosen token.
    pub fn token(&self) -> u32 {
        self.candidates[self.chosen]
    }
}

impl Selector {
    pub(super) fn load(
        ck: &Checkpoint,
        prefix: &str,
        vocab: usize,
        hidden: usize,
        cfg: DFlash2Config,
    ) -> Result<Self, ModelError> {
        let r = cfg.selector_rank;
        // Published checkpoints store the codebooks without `.weight`; nn.Embedding adds it.
        let codebook = |name: &str| {
            let bare = format!("{prefix}candidate_selector.{name}");
            if ck.contains(&bare) {
                ck.get_shaped(&bare, &[vocab, r])
            } else {
                ck.get_shaped(&format!("{bare}.weight"), &[vocab, r])
            }
        };
        Ok(Self {
            predecessor: codebook("predecessor_codebook")?,
            successor: codebook("successor_codebook")?,
            projection: ck.get_shaped(
                &format!("{prefix}candidate_selector.hidden_projection.weight"),
                &[r, hidden],
            )?,
            top_k: cfg.selector_top_k,
        })
    }

    /// Bytes of its weights.
    pub fn bytes(&self) -> usize {
        [&self.predecessor, &self.successor, &self.projection]
            .iter()
            .map(|w| w.raw_bytes().len())
            .sum()
    }

    /// Candidates per slot.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Each slot's candidates: the `top_k` best entries of its row of `logits` `[S, V]`,
    /// best first (ties to the lower id), flattened `[S, min(top_k, V)]`.
    pub fn candidates(&self, logits: &[f32], slots: usize) -> Vec<(u32, f32)> {
        let vocab = logits.len() / slots.max(1);
        logits
            .chunks_exact(vocab.max(1))
            .flat_map(|row| {
                let entries = row.iter().enumerate().map(|(i, &v)| (i as u32, v));
                splash_backend::cpu::top_k(entries, self.top_k)
            })
            .collect()
    }

    /// Walks the block: `hidden` `[S, H]` (final-normed draft rows), `logits` `[S, V]` (the
    /// unary scores), starting from `anchor`. `choose` picks an index into each slot's
    /// scores (argmax for greedy, a draw from `softmax(scores / T)` when sampling).
    pub fn walk(
        &self,
        hidden: &[f32],
        logits: &[f32],
        anchor: u32,
        choose: impl FnMut(&[f32]) -> usize,
    ) -> Vec<SelectorSlot> {
        let slots = hidden.len() / self.projection.cols();
        self.walk_candidates(hidden, &self.candidates(logits, slots), anchor, choose)
    }

    /// [`walk`](Self::walk) over candidates already picked (see
    /// [`candidates`](Self::candidates); on the GPU they are picked there).
    pub fn walk_candidates(
        &self,
        hidden: &[f32],
        candidates: &[(u32, f32)],
        anchor: u32,
        mut choose: impl FnMut(&[f32]) -> usize,
    ) -> Vec<SelectorSlot> {
        let r = self.projection.rows();
        let slots = hidden.len() / self.projection.cols();
        let k = candidates.len() / slots.max(1);
        let mut hp = vec![0.0f32; slots * r];
        matmul(&mut hp, hidden, &self.projection);
        let (mut pred_row, mut succ_row) = (vec![0.0f32; r], vec![0.0f32; r]);
        let mut prev = anchor;
        let mut walk = Vec::with_capacity(slots);
        for (cands, hp_row) in candidates.chunks_exact(k.max(1)).zip(hp.chunks_exact(r)) {
            self.predecessor.row_to_f32(prev as usize, &mut pred_row);
            let ctx: Vec<f32> = pred_row.iter().zip(hp_row).map(|(a, b)| a * b).collect();
            let scores: Vec<f32> = cands
                .iter()
                .map(|&(c, unary)| {
                    self.successor.row_to_f32(c as usize, &mut succ_row);
                    unary + ctx.iter().zip(&succ_row).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect();
            let chosen = choose(&scores);
            prev = cands[chosen].0;
            walk.push(SelectorSlot {
                candidates: cands.iter().map(|c| c.0).collect(),
                scores,
                chosen,
            });
        }
        walk
    }
}
