//! Gated full attention (model-spec §2.3): interleaved q/gate, q/k norm, partial RoPE, GQA.

use splash_backend::cpu::{attention, matmul, rms_norm, sigmoid, KvStore, Rope};
use splash_backend::Weight;

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

    /// `x` `[T, H]` (normed) at positions `pos0..` → `[T, H]`; appends K/V to the cache.
    pub(super) fn forward(
        &self,
        x: &[f32],
        k_cache: &mut KvStore,
        v_cache: &mut KvStore,
        pos0: usize,
        rope: &Rope,
        eps: f32,
    ) -> Vec<f32> {
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        let t = x.len() / self.q.cols();
        let mut qg = vec![0.0f32; t * hq * 2 * d];
        matmul(&mut qg, x, &self.q);
        let mut q = Vec::with_capacity(t * hq * d);
        let mut gate = Vec::with_capacity(t * hq * d);
        for head in qg.chunks_exact(2 * d) {
            q.extend_from_slice(&head[..d]);
            gate.extend_from_slice(&head[d..]);
        }
        let mut k = vec![0.0f32; t * hkv * d];
        matmul(&mut k, x, &self.k);
        let mut v = vec![0.0f32; t * hkv * d];
        matmul(&mut v, x, &self.v);
        let mut qn = vec![0.0f32; q.len()];
        rms_norm(&mut qn, &q, &self.q_norm, eps);
        let mut kn = vec![0.0f32; k.len()];
        rms_norm(&mut kn, &k, &self.k_norm, eps);
        rope.apply(&mut qn, hq, d, pos0);
        rope.apply(&mut kn, hkv, d, pos0);
        debug_assert_eq!(
            k_cache.len(),
            pos0 * hkv * d,
            "KV cache out of step with position"
        );
        k_cache.append(&kn, d);
        v_cache.append(&v, d);
        let mut attn = vec![0.0f32; t * hq * d];
        attention(
            &mut attn,
            &qn,
            k_cache,
            v_cache,
            hq,
            hkv,
            d,
            pos0,
            (d as f32).powf(-0.5),
        );
        for (a, &g) in attn.iter_mut().zip(&gate) {
            *a *= sigmoid(g);
        }
        let mut out = vec![0.0f32; t * self.o.rows()];
        matmul(&mut out, &attn, &self.o);
        out
    }
}
