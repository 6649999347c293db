//! The vision tower's layers on the CPU in f32: the reference the GPU's are checked against.

use splash_backend::cpu::matmul;
use splash_backend::Weight;

use crate::error::ModelError;
use crate::vision::device::{TowerPass, VisionDevice};
use crate::vision::tower::{LayerNorm, Linear};
use crate::vision::{VisionConfig, VisionTower};

/// Queries a block of the tower's attention takes at once (its scores: block × patches).
const ATTENTION_BLOCK: usize = 256;

/// The CPU device of the tower: the weights are the host's.
pub(crate) struct CpuTower;

impl VisionDevice for CpuTower {
    fn encode(&self, t: &VisionTower, pass: &TowerPass) -> Result<Vec<f32>, ModelError> {
        let d = t.config.hidden_size;
        let mut x = t.patch.apply(pass.rows);
        for (row, taps) in x.chunks_exact_mut(d).zip(pass.taps) {
            for (k, v) in row.iter_mut().enumerate() {
                *v += taps
                    .iter()
                    .map(|&(p, w)| t.positions[p * d + k] * w)
                    .sum::<f32>();
            }
        }
        for b in &t.blocks {
            let h = b.norm1.apply(&x);
            let qkv = b.qkv.apply(&h);
            let attn = b
                .proj
                .apply(&attention(&t.config, &qkv, pass.cos, pass.sin, pass.n));
            x.iter_mut().zip(attn).for_each(|(x, a)| *x += a);
            let mut mid = b.fc1.apply(&b.norm2.apply(&x));
            mid.iter_mut().for_each(|v| *v = gelu_tanh(*v));
            x.iter_mut()
                .zip(b.fc2.apply(&mid))
                .for_each(|(x, a)| *x += a);
        }
        // The merger normalises each patch, then reads m·m consecutive rows as one.
        let mut mid = t.merger_fc1.apply(&t.merger_norm.apply(&x));
        mid.iter_mut().for_each(|v| *v = gelu_erf(*v));
        Ok(t.merger_fc2.apply(&mid))
    }

    fn name(&self) -> String {
        "cpu".into()
    }
}

impl Linear {
    /// `x` `[T, inputs]` → `[T, outputs]` (the CPU backend's tiled, threaded product).
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let outputs = self.b.len();
        let mut y = vec![0.0f32; x.len() / self.w.cols() * outputs];
        matmul(&mut y, x, &self.w);
        for row in y.chunks_exact_mut(outputs) {
            row.iter_mut().zip(&self.b).for_each(|(v, b)| *v += b);
        }
        y
    }
}

impl LayerNorm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = self.w.len();
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks_exact(n) {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + 1e-6).sqrt();
            y.extend(
                row.iter()
                    .zip(&self.w)
                    .zip(&self.b)
                    .map(|((v, w), b)| (v - mean) * inv * w + b),
            );
        }
        y
    }
}

/// Bidirectional attention over the image's own patches, every head, rotary on the
/// queries and keys; `qkv` rows are `[3, heads, head_dim]`. Per head, blocks of queries
/// against all keys through the backend's products (a block's scores, not all n², are
/// held at once).
fn attention(config: &VisionConfig, qkv: &[f32], cos: &[f32], sin: &[f32], n: usize) -> Vec<f32> {
    let (heads, hd, d) = (config.num_heads, config.head_dim(), config.hidden_size);
    let half = hd / 2;
    let rotate = |v: &[f32], i: usize, out: &mut [f32]| {
        let (c, s) = (&cos[i * hd..(i + 1) * hd], &sin[i * hd..(i + 1) * hd]);
        for j in 0..hd {
            let other = if j < half { -v[j + half] } else { v[j - half] };
            out[j] = v[j] * c[j] + other * s[j];
        }
    };
    let scale = 1.0 / (hd as f32).sqrt();
    let block = ATTENTION_BLOCK.min(n);
    let mut out = vec![0.0f32; n * d];
    let (mut q, mut k, mut vt) = (
        vec![0.0f32; n * hd],
        vec![0.0f32; n * hd],
        vec![0.0f32; hd * n],
    );
    let mut scores = vec![0.0f32; block * n];
    let mut o = vec![0.0f32; block * hd];
    for h in 0..heads {
        let part = |i: usize, which: usize| &qkv[i * 3 * d + which * d + h * hd..][..hd];
        for i in 0..n {
            rotate(part(i, 0), i, &mut q[i * hd..(i + 1) * hd]);
            rotate(part(i, 1), i, &mut k[i * hd..(i + 1) * hd]);
            for (j, &v) in part(i, 2).iter().enumerate() {
                vt[j * n + i] = v;
            }
        }
        let keys = Weight::from_f32(vec![n, hd], &k);
        let values = Weight::from_f32(vec![hd, n], &vt);
        for start in (0..n).step_by(block) {
            let rows = block.min(n - start);
            let s = &mut scores[..rows * n];
            matmul(s, &q[start * hd..(start + rows) * hd], &keys);
            for row in s.chunks_exact_mut(n) {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) * scale;
                let mut total = 0.0f32;
                for x in row.iter_mut() {
                    *x = (*x * scale - max).exp();
                    total += *x;
                }
                row.iter_mut().for_each(|x| *x /= total);
            }
            let o = &mut o[..rows * hd];
            matmul(o, s, &values);
            for (r, vals) in o.chunks_exact(hd).enumerate() {
                out[(start + r) * d + h * hd..][..hd].copy_from_slice(vals);
            }
        }
    }
    out
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`, the blocks').
fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// GELU, exact (`nn.GELU()`, the merger's).
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// The error function to f32 precision: Numerical Recipes' Chebyshev fit of erfc (fractional
/// error below 1.2e-7), in f64.
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = t
        * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { 1.0 - y } else { y - 1.0 }) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_accurate() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.5, 0.999_999_3),
        ] {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
    }
}
