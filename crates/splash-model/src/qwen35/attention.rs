//! Gated full attention (model-spec §2.3): interleaved q/gate, q/k norm, partial RoPE, GQA.

use splash_backend::cpu::{attention, matmul_sums, rms_norm, sigmoid, KvStore, Rope, Sums};
use splash_backend::Weight;

use super::positions::Rotary;
use super::Names;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::ModelError;

pub(super) struct Attention {
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    /// `[Hq·2·D, H]`: per head, D query rows then D gate rows.
    pub(super) q: Weight,
    pub(super) k: Weight,
    pub(super) v: Weight,
    pub(super) o: Weight,
    pub(super) q_norm: Vec<f32>,
    pub(super) k_norm: Vec<f32>,
}

impl Attention {
    pub(super) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        names: &Names,
        i: usize,
    ) -> Result<Self, ModelError> {
        let (h, hq, hkv, d) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        );
        let n = |rest: &str| names.layer(i, &format!("self_attn.{rest}"));
        Ok(Self {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            q: names.linear(ck, &n("q_proj"), &[hq * d * 2, h])?,
            k: names.linear(ck, &n("k_proj"), &[hkv * d, h])?,
            v: names.linear(ck, &n("v_proj"), &[hkv * d, h])?,
            o: names.linear(ck, &n("o_proj"), &[h, hq * d])?,
            q_norm: names.norm(ck, &n("q_norm.weight"), d)?,
            k_norm: names.norm(ck, &n("k_norm.weight"), d)?,
        })
    }

    pub(super) fn num_parameters(&self) -> usize {
        self.q.len() + self.k.len() + self.v.len() + self.o.len() + 2 * self.head_dim
    }

    /// `x` `[R, H]` (normed) → `[R, H]` for the rows of several sequences, one after the
    /// other: the projections run once over all rows; RoPE, the cache append and the
    /// attention per sequence, at its positions and over its own cache.
    pub(super) fn forward(
        &self,
        x: &[f32],
        seqs: &mut [AttnPart<'_>],
        rope: &Rope,
        eps: f32,
        sums: Sums,
    ) -> Vec<f32> {
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        let r = x.len() / self.q.cols();
        let mut qg = vec![0.0f32; r * hq * 2 * d];
        matmul_sums(&mut qg, x, &self.q, sums);
        let mut q = Vec::with_capacity(r * hq * d);
        let mut gate = Vec::with_capacity(r * hq * d);
        for head in qg.chunks_exact(2 * d) {
            q.extend_from_slice(&head[..d]);
            gate.extend_from_slice(&head[d..]);
        }
        let mut k = vec![0.0f32; r * hkv * d];
        matmul_sums(&mut k, x, &self.k, sums);
        let mut v = vec![0.0f32; r * hkv * d];
        matmul_sums(&mut v, x, &self.v, sums);
        let mut qn = vec![0.0f32; q.len()];
        rms_norm(&mut qn, &q, &self.q_norm, eps);
        let mut kn = vec![0.0f32; k.len()];
        rms_norm(&mut kn, &k, &self.k_norm, eps);
        let mut attn = vec![0.0f32; r * hq * d];
        let mut r0 = 0;
        for part in seqs.iter_mut() {
            let (t, pos0) = (part.rows, part.pos0);
            let qn = &mut qn[r0 * hq * d..(r0 + t) * hq * d];
            let kn = &mut kn[r0 * hkv * d..(r0 + t) * hkv * d];
            match part.rotary {
                Rotary::From(p) => {
                    rope.apply(qn, hq, d, *p);
                    rope.apply(kn, hkv, d, *p);
                }
                Rotary::Each(positions) => {
                    rope.apply_3d(qn, hq, d, positions);
                    rope.apply_3d(kn, hkv, d, positions);
                }
            }
            debug_assert_eq!(
                part.k.len(),
                pos0 * hkv * d,
                "KV cache out of step with position"
            );
            part.k.append(kn, d);
            part.v.append(&v[r0 * hkv * d..(r0 + t) * hkv * d], d);
            attention(
                &mut attn[r0 * hq * d..(r0 + t) * hq * d],
                qn,
                part.k,
                part.v,
                hq,
                hkv,
                d,
                pos0,
                (d as f32).powf(-0.5),
            );
            r0 += t;
        }
        for (a, &g) in attn.iter_mut().zip(&gate) {
            *a *= sigmoid(g);
        }
        let mut out = vec![0.0f32; r * self.o.rows()];
        matmul_sums(&mut out, &attn, &self.o, sums);
        out
    }
}

/// One sequence's share of a batched attention pass: its caches, the cache row of its first
/// row, its rows' rotary positions and how many rows it has.
pub(super) struct AttnPart<'a> {
    pub(super) k: &'a mut KvStore,
    pub(super) v: &'a mut KvStore,
    pub(super) pos0: usize,
    pub(super) rotary: &'a Rotary,
    pub(super) rows: usize,
}
