//! Attention of a block of queries over keys with explicit positions, a window and an
//! optional causal mask: the DFlash draft's attention (model-spec §4.1), where the block
//! sees itself without a causal mask and sliding layers see `|q_pos - k_pos| < W`.

use rayon::prelude::*;

use super::matmul::dot;

/// Shape and mask of one block attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale (usually `head_dim^-0.5`).
    pub scale: f32,
    /// Key `j` is visible to query `i` only if `k_pos <= q_pos`.
    pub causal: bool,
    /// Sliding window `W`: visible only if `q_pos - k_pos < W` (and, when not causal,
    /// `k_pos - q_pos < W`).
    pub window: Option<usize>,
}

impl BlockAttention {
    fn visible(&self, qp: usize, kp: usize) -> bool {
        if self.causal && kp > qp {
            return false;
        }
        match self.window {
            Some(w) => qp.abs_diff(kp) < w,
            None => true,
        }
    }

    /// `out`, `q` `[T, heads, d]` at positions `q_pos0..`; `k`, `v` `[S, kv_heads, d]` at
    /// positions `k_pos0..`. Query head `h` uses kv head `h / (heads/kv_heads)`. A query that
    /// sees no key gets zeros.
    pub fn forward(
        &self,
        out: &mut [f32],
        q: &[f32],
        q_pos0: usize,
        k: &[f32],
        v: &[f32],
        k_pos0: usize,
    ) {
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        assert!(
            hq.is_multiple_of(hkv),
            "heads {hq} not a multiple of kv heads {hkv}"
        );
        assert_eq!(out.len(), q.len());
        assert_eq!(k.len(), v.len());
        assert!(q.len().is_multiple_of(hq * d) && k.len().is_multiple_of(hkv * d));
        let s = k.len() / (hkv * d);
        let group = hq / hkv;
        out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
            let (ti, h) = (i / hq, i % hq);
            let kvh = h / group;
            let qp = q_pos0 + ti;
            let qv = &q[i * d..(i + 1) * d];
            let keys: Vec<usize> = (0..s).filter(|&j| self.visible(qp, k_pos0 + j)).collect();
            o.fill(0.0);
            if keys.is_empty() {
                return;
            }
            let mut scores: Vec<f32> = keys
                .iter()
                .map(|&j| dot(qv, &k[(j * hkv + kvh) * d..][..d]) * self.scale)
                .collect();
            super::softmax_in_place(&mut scores);
            for (&j, &p) in keys.iter().zip(&scores) {
                for (a, &b) in o.iter_mut().zip(&v[(j * hkv + kvh) * d..][..d]) {
                    *a += p * b;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_causal_block_sees_the_future_and_window_cuts_the_past() {
        // one head, d = 1; keys at positions 0..4 with values 0..4, all scores equal.
        let k = [0.0f32; 4];
        let v = [0.0f32, 1.0, 2.0, 3.0];
        let mut att = BlockAttention {
            heads: 1,
            kv_heads: 1,
            head_dim: 1,
            scale: 1.0,
            causal: false,
            window: None,
        };
        let mut out = [0.0f32; 1];
        att.forward(&mut out, &[1.0], 1, &k, &v, 0);
        assert!((out[0] - 1.5).abs() < 1e-6, "mean of all four values");
        att.causal = true;
        att.forward(&mut out, &[1.0], 1, &k, &v, 0);
        assert!((out[0] - 0.5).abs() < 1e-6, "keys 0 and 1");
        att.causal = false;
        att.window = Some(2);
        att.forward(&mut out, &[1.0], 1, &k, &v, 0);
        assert!((out[0] - 1.0).abs() < 1e-6, "keys 0, 1, 2 (|1-j| < 2)");
    }
}
