//! Gated DeltaNet token mixer (model-spec §2.4), HF head order.

use splash_backend::cpu::{
    causal_conv1d_silu, gdn_chunked, gdn_recurrent, l2_norm_rows, matmul_sums, rms_norm_gated,
    sigmoid, softplus, GdnDims, Sums, ROW_BY_ROW_TOKENS,
};
use splash_backend::Weight;

use super::Names;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::ModelError;

pub(super) struct GatedDeltaNet {
    pub(super) dims: GdnDims,
    pub(super) in_qkv: Weight,
    pub(super) in_z: Weight,
    pub(super) in_b: Weight,
    pub(super) in_a: Weight,
    /// Conv kernel `[conv_dim, K]`.
    pub(super) conv: Vec<f32>,
    pub(super) dt_bias: Vec<f32>,
    /// `-exp(A_log)`, the per-head decay rate.
    pub(super) neg_a: Vec<f32>,
    /// Gated output norm weight `[dv]`, used as stored (not zero-centred).
    pub(super) norm: Vec<f32>,
    pub(super) out: Weight,
}

impl GatedDeltaNet {
    pub(super) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        names: &Names,
        i: usize,
    ) -> Result<Self, ModelError> {
        let GdnDims { hv, dv, .. } = cfg.gdn;
        let (h, c, k) = (cfg.hidden_size, cfg.conv_dim(), cfg.conv_kernel);
        let n = |rest: &str| names.layer(i, &format!("linear_attn.{rest}"));
        let conv_w = ck.get(&n("conv1d.weight"))?;
        // HF stores [C, 1, K], MLX [C, K, 1], GGUF [C, K]: the same values in the same order.
        if ![&[c, 1, k][..], &[c, k, 1], &[c, k]].contains(&conv_w.shape()) {
            ck.get_shaped(&n("conv1d.weight"), &[c, 1, k])?;
        }
        Ok(Self {
            dims: cfg.gdn,
            in_qkv: names.linear(ck, &n("in_proj_qkv"), &[c, h])?,
            in_z: names.linear(ck, &n("in_proj_z"), &[hv * dv, h])?,
            in_b: names.linear(ck, &n("in_proj_b"), &[hv, h])?,
            in_a: names.linear(ck, &n("in_proj_a"), &[hv, h])?,
            conv: conv_w.to_f32_vec(),
            dt_bias: ck.get_shaped(&n("dt_bias"), &[hv])?.to_f32_vec(),
            // GGUF stores `ssm_a` = -exp(A_log) itself.
            neg_a: if ck.contains(&n("ssm_a")) {
                ck.get_shaped(&n("ssm_a"), &[hv])?.to_f32_vec()
            } else {
                ck.get_shaped(&n("A_log"), &[hv])?
                    .to_f32_vec()
                    .into_iter()
                    .map(|a| -a.exp())
                    .collect()
            },
            norm: ck.get_shaped(&n("norm.weight"), &[dv])?.to_f32_vec(),
            out: names.linear(ck, &n("out_proj"), &[h, hv * dv])?,
        })
    }

    pub(super) fn num_parameters(&self) -> usize {
        [&self.in_qkv, &self.in_z, &self.in_b, &self.in_a, &self.out]
            .iter()
            .map(|w| w.len())
            .sum::<usize>()
            + self.conv.len()
            + self.dt_bias.len() * 2
            + self.norm.len()
    }

    /// `x` `[R, H]` (normed) → `[R, H]` for the rows of several sequences, one after the
    /// other: the projections run once over all rows, the conv and the scan per sequence on
    /// its own state. With a `record` slot, a sequence also stores its state before the pass
    /// and its scan inputs (speculative rollback, model-spec §2.6).
    pub(super) fn forward(
        &self,
        x: &[f32],
        seqs: &mut [GdnPart<'_>],
        eps: f32,
        sums: Sums,
    ) -> Vec<f32> {
        let GdnDims { hk, hv, dk, dv, .. } = self.dims;
        let r = x.len() / self.in_qkv.cols();
        let c = self.in_qkv.rows();
        let kd = hk * dk;
        let mut qkv = vec![0.0f32; r * c];
        matmul_sums(&mut qkv, x, &self.in_qkv, sums);
        let mut z = vec![0.0f32; r * hv * dv];
        matmul_sums(&mut z, x, &self.in_z, sums);
        let mut b = vec![0.0f32; r * hv];
        matmul_sums(&mut b, x, &self.in_b, sums);
        let mut a = vec![0.0f32; r * hv];
        matmul_sums(&mut a, x, &self.in_a, sums);
        for (i, bv) in b.iter_mut().enumerate() {
            *bv = sigmoid(*bv);
            let h = i % hv;
            a[i] = self.neg_a[h] * softplus(a[i] + self.dt_bias[h]);
        }
        let (beta, g) = (b, a);

        let mut o = vec![0.0f32; r * hv * dv];
        let mut r0 = 0;
        for part in seqs.iter_mut() {
            let t = part.rows;
            let qkv = &qkv[r0 * c..(r0 + t) * c];
            let (g, beta) = (&g[r0 * hv..(r0 + t) * hv], &beta[r0 * hv..(r0 + t) * hv]);
            let conv_before = part.record.is_some().then(|| part.conv.to_vec());
            let mut mixed = vec![0.0f32; t * c];
            causal_conv1d_silu(&mut mixed, qkv, part.conv, &self.conv);
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(t * kd),
                Vec::with_capacity(t * kd),
                Vec::with_capacity(t * hv * dv),
            );
            for row in mixed.chunks_exact(c) {
                q.extend_from_slice(&row[..kd]);
                k.extend_from_slice(&row[kd..2 * kd]);
                v.extend_from_slice(&row[2 * kd..]);
            }
            l2_norm_rows(&mut q, dk, 1e-6);
            l2_norm_rows(&mut k, dk, 1e-6);
            let scale = (dk as f32).powf(-0.5);
            q.iter_mut().for_each(|x| *x *= scale);
            if let Some(slot) = part.record.as_deref_mut() {
                *slot = Some(GdnReplay {
                    conv: conv_before.unwrap_or_default(),
                    recurrent: part.recurrent.to_vec(),
                    qkv: qkv.to_vec(),
                    q: q.clone(),
                    k: k.clone(),
                    v: v.clone(),
                    g: g.to_vec(),
                    beta: beta.to_vec(),
                    dims: self.dims,
                });
            }
            let o = &mut o[r0 * hv * dv..(r0 + t) * hv * dv];
            // Decode rows and verify blocks step the recurrence token by token, so that a
            // verified token gets the bits decoding it alone gives (greedy speculation is then
            // exactly lossless); prefill chunks take the chunked form.
            if t <= ROW_BY_ROW_TOKENS {
                gdn_recurrent(o, &q, &k, &v, g, beta, part.recurrent, self.dims);
            } else {
                gdn_chunked(o, &q, &k, &v, g, beta, part.recurrent, self.dims);
            }
            r0 += t;
        }
        let mut normed = vec![0.0f32; o.len()];
        rms_norm_gated(&mut normed, &o, &z, &self.norm, eps);
        let mut out = vec![0.0f32; r * self.out.rows()];
        matmul_sums(&mut out, &normed, &self.out, sums);
        out
    }
}

/// One sequence's share of a batched GDN pass: its state and how many rows it has.
pub(super) struct GdnPart<'a> {
    pub(super) conv: &'a mut [f32],
    pub(super) recurrent: &'a mut [f32],
    pub(super) record: Option<&'a mut Option<GdnReplay>>,
    pub(super) rows: usize,
}

/// A GDN layer's state before a verify pass and the pass's scan inputs: enough to rebuild
/// the state after any prefix of the pass by replaying the recurrence.
#[derive(Clone, Debug)]
pub(super) struct GdnReplay {
    /// Conv state `[K-1, C]` and recurrent state `[Hv, dk, dv]` before the pass.
    pub(super) conv: Vec<f32>,
    pub(super) recurrent: Vec<f32>,
    /// Conv inputs of the pass `[T, C]` (the `in_proj_qkv` rows).
    pub(super) qkv: Vec<f32>,
    /// Scan inputs of the pass, as `gdn_recurrent` takes them.
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) g: Vec<f32>,
    pub(super) beta: Vec<f32>,
    pub(super) dims: GdnDims,
}

impl GdnReplay {
    /// The conv and recurrent state after the first `keep` tokens of the pass.
    pub(super) fn state_after(&self, keep: usize, conv: &mut [f32], recurrent: &mut [f32]) {
        let GdnDims { hk, hv, dk, dv, .. } = self.dims;
        let c = self.qkv.len() / (self.g.len() / hv);
        // conv state = the last K-1 rows of [old state | qkv[..keep]].
        let mut ext = self.conv.clone();
        ext.extend_from_slice(&self.qkv[..keep * c]);
        conv.copy_from_slice(&ext[keep * c..]);
        recurrent.copy_from_slice(&self.recurrent);
        let mut out = vec![0.0f32; keep * hv * dv];
        gdn_recurrent(
            &mut out,
            &self.q[..keep * hk * dk],
            &self.k[..keep * hk * dk],
            &self.v[..keep * hv * dv],
            &self.g[..keep * hv],
            &self.beta[..keep * hv],
            recurrent,
            self.dims,
        );
    }
}
