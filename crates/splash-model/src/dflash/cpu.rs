//! The CPU device of the DFlash draft: the reference pass, contexts in host memory.

use std::any::Any;

use splash_backend::cpu::{add_in_place, matmul, rms_norm, silu_mul, BlockAttention};

use super::device::{ContextLayer, DeviceContext, DraftDevice, DraftedRows};
use super::{DraftLayer, DraftWeights};
use crate::device::downcast;
use crate::error::ModelError;
use crate::qwen35::Qwen35;

/// The host CPU.
pub(crate) struct CpuDraft;

impl DraftDevice for CpuDraft {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn new_context(&self, weights: &DraftWeights) -> Box<dyn DeviceContext> {
        Box::new(CpuContext {
            layers: vec![ContextLayer::default(); weights.layers.len()],
        })
    }

    fn context_from_image(
        &self,
        weights: &DraftWeights,
        len: usize,
        mut layers: Vec<ContextLayer>,
    ) -> Result<Box<dyn DeviceContext>, ModelError> {
        let c = &weights.config;
        let row = c.num_kv_heads * c.head_dim;
        // A sliding layer keeps its window only (an image from the GPU holds every row).
        for (layer, lc) in weights.layers.iter().zip(&mut layers) {
            if let Some(w) = layer.window {
                let drop = (len - lc.pos0).saturating_sub(w.saturating_sub(1));
                lc.k.drain(..drop * row);
                lc.v.drain(..drop * row);
                lc.pos0 += drop;
            }
        }
        Ok(Box::new(CpuContext { layers }))
    }

    fn append_context(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        features: &[f32],
        pos0: usize,
    ) -> Result<(), ModelError> {
        let ctx: &mut CpuContext = downcast(ctx.as_any_mut(), "cpu draft")?;
        let c = &weights.config;
        let (h, hkv, d, eps) = (c.hidden_size, c.num_kv_heads, c.head_dim, c.rms_norm_eps);
        let t = features.len() / weights.fc.cols();
        let mut x = vec![0.0f32; t * h];
        matmul(&mut x, features, &weights.fc);
        let mut xn = vec![0.0f32; x.len()];
        rms_norm(&mut xn, &x, &weights.hidden_norm, eps);
        for (layer, lc) in weights.layers.iter().zip(ctx.layers.iter_mut()) {
            let (k, v) = project_kv(weights, layer, &xn, pos0);
            if lc.k.is_empty() {
                lc.pos0 = pos0;
            }
            lc.k.extend_from_slice(&k);
            lc.v.extend_from_slice(&v);
            // A sliding layer's block query at position s sees keys from s-W+1 on.
            if let Some(w) = layer.window {
                let rows = lc.k.len() / (hkv * d);
                let keep = w.saturating_sub(1);
                if rows > keep {
                    let drop = rows - keep;
                    lc.k.drain(..drop * hkv * d);
                    lc.v.drain(..drop * hkv * d);
                    lc.pos0 += drop;
                }
            }
        }
        Ok(())
    }

    fn draft(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        target: &Qwen35,
        x: &[f32],
        pos0: usize,
        _top: Option<usize>,
    ) -> Result<DraftedRows, ModelError> {
        let ctx: &mut CpuContext = downcast(ctx.as_any_mut(), "cpu draft")?;
        let hidden = forward(weights, ctx, x.to_vec(), pos0);
        Ok(DraftedRows {
            logits: target.lm_head(&hidden),
            hidden,
            candidates: Vec::new(),
        })
    }
}

/// One sequence's draft context in host memory.
#[derive(Clone, Debug)]
struct CpuContext {
    layers: Vec<ContextLayer>,
}

impl DeviceContext for CpuContext {
    fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.len() + l.v.len()) * 4)
            .sum()
    }

    fn try_clone(&self, _len: usize) -> Result<Box<dyn DeviceContext>, ModelError> {
        Ok(Box::new(self.clone()))
    }

    fn layers(&self, len: usize) -> Result<Vec<ContextLayer>, ModelError> {
        // A layer without rows (none yet, or a window that keeps none) starts at the end.
        Ok(self
            .layers
            .iter()
            .map(|l| ContextLayer {
                pos0: if l.k.is_empty() { len } else { l.pos0 },
                ..l.clone()
            })
            .collect())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// K (k_proj, k_norm, RoPE from `pos0`) and V of rows `x` `[T, H]`.
fn project_kv(
    w: &DraftWeights,
    layer: &DraftLayer,
    x: &[f32],
    pos0: usize,
) -> (Vec<f32>, Vec<f32>) {
    let c = &w.config;
    let t = x.len() / c.hidden_size;
    let mut k = vec![0.0f32; t * c.num_kv_heads * c.head_dim];
    matmul(&mut k, x, &layer.k);
    let mut kn = vec![0.0f32; k.len()];
    rms_norm(&mut kn, &k, &layer.k_norm, c.rms_norm_eps);
    w.rope.apply(&mut kn, c.num_kv_heads, c.head_dim, pos0);
    let mut v = vec![0.0f32; t * c.num_kv_heads * c.head_dim];
    matmul(&mut v, x, &layer.v);
    (kn, v)
}

/// Drafts one block from its embedded rows `x` `[B, H]` at positions `s..`, returning the
/// final-normed hidden states of the `B - 1` mask rows `[B-1, H]`. The block's K/V are
/// appended to the context for the pass and removed after it (`ctx` ends unchanged).
fn forward(w: &DraftWeights, ctx: &mut CpuContext, mut x: Vec<f32>, s: usize) -> Vec<f32> {
    let c = &w.config;
    let (h, hq, hkv, d, eps) = (
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.rms_norm_eps,
    );
    let block = x.len() / h;
    let mut normed = vec![0.0f32; x.len()];
    for (layer, lc) in w.layers.iter().zip(ctx.layers.iter_mut()) {
        // 1. attention sublayer: (B, H) -> (B, hq, d) queries over [ctx ; block] keys.
        rms_norm(&mut normed, &x, &layer.input_norm, eps);
        let (a_in, a_dyn) = match &layer.convs {
            Some((conv, _)) => {
                let (y, dynamic) = conv.prepare(&normed);
                (y, Some(dynamic))
            }
            None => (normed.clone(), None),
        };
        let mut q = vec![0.0f32; block * hq * d];
        matmul(&mut q, &a_in, &layer.q);
        let mut qn = vec![0.0f32; q.len()];
        rms_norm(&mut qn, &q, &layer.q_norm, eps);
        w.rope.apply(&mut qn, hq, d, s);
        // The block's K/V go after the cached context for this pass only.
        let (kb, vb) = project_kv(w, layer, &a_in, s);
        let k_pos0 = if lc.k.is_empty() { s } else { lc.pos0 };
        let cached = lc.k.len();
        lc.k.extend_from_slice(&kb);
        lc.v.extend_from_slice(&vb);
        let att = BlockAttention {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
            scale: (d as f32).powf(-0.5),
            causal: c.causal,
            window: layer.window,
        };
        let mut a = vec![0.0f32; qn.len()];
        att.forward(&mut a, &qn, s, &lc.k, &lc.v, k_pos0);
        lc.k.truncate(cached);
        lc.v.truncate(cached);
        let mut o = vec![0.0f32; block * h];
        matmul(&mut o, &a, &layer.o);
        if let (Some((conv, _)), Some(dynamic)) = (&layer.convs, a_dyn) {
            o = conv.finish(&o, &dynamic);
        }
        add_in_place(&mut x, &o);
        // 2. MLP sublayer.
        rms_norm(&mut normed, &x, &layer.post_norm, eps);
        let (m_in, m_dyn) = match &layer.convs {
            Some((_, conv)) => {
                let (y, dynamic) = conv.prepare(&normed);
                (y, Some(dynamic))
            }
            None => (normed.clone(), None),
        };
        let inter = layer.gate.rows();
        let mut g = vec![0.0f32; block * inter];
        matmul(&mut g, &m_in, &layer.gate);
        let mut u = vec![0.0f32; block * inter];
        matmul(&mut u, &m_in, &layer.up);
        silu_mul(&mut g, &u);
        let mut m = vec![0.0f32; block * h];
        matmul(&mut m, &g, &layer.down);
        if let (Some((_, conv)), Some(dynamic)) = (&layer.convs, m_dyn) {
            m = conv.finish(&m, &dynamic);
        }
        add_in_place(&mut x, &m);
    }
    let mut out = vec![0.0f32; (block - 1) * h];
    rms_norm(&mut out, &x[h..], &w.norm, eps);
    out
}
