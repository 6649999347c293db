//! Matrix products against stored-dtype weights: `out[T,N] = x[T,K] · Wᵀ` with `W` `[N,K]`.

use half::f16;
use rayon::prelude::*;

use crate::{DType, Weight};

/// Rows of `W` handled per task; also the row block converted to f32 once and reused for all
/// `T` activation rows in the batched path.
const ROW_BLOCK: usize = 16;

/// `out[T,N] = x[T,K] · Wᵀ` where `W` is `[N,K]` in its stored dtype. Accumulates in f32.
pub fn matmul(out: &mut [f32], x: &[f32], w: &Weight) {
    let (n, k) = (w.rows(), w.cols());
    assert!(
        k > 0 && x.len().is_multiple_of(k),
        "x has {} values, not a multiple of K={k}",
        x.len()
    );
    let t = x.len() / k;
    assert_eq!(out.len(), t * n, "out must be [T={t}, N={n}]");
    if t == 1 {
        out.par_chunks_mut(ROW_BLOCK)
            .enumerate()
            .for_each(|(b, chunk)| {
                let mut row = Vec::new();
                for (i, o) in chunk.iter_mut().enumerate() {
                    *o = row_dot(w, b * ROW_BLOCK + i, x, &mut row);
                }
            });
        return;
    }
    // Batched: each task converts a block of W rows to f32 once, then dots it with every
    // activation row. The result is produced transposed ([N,T]) so tasks write disjoint chunks.
    let mut out_t = vec![0.0f32; n * t];
    out_t
        .par_chunks_mut(ROW_BLOCK * t)
        .enumerate()
        .for_each(|(b, chunk)| {
            let rows = chunk.len() / t;
            let mut block = vec![0.0f32; rows * k];
            for r in 0..rows {
                w.row_to_f32(b * ROW_BLOCK + r, &mut block[r * k..(r + 1) * k]);
            }
            for (r, wr) in block.chunks_exact(k).enumerate() {
                for (ti, xr) in x.chunks_exact(k).enumerate() {
                    chunk[r * t + ti] = dot(wr, xr);
                }
            }
        });
    for (ni, col) in out_t.chunks_exact(t).enumerate() {
        for (ti, &v) in col.iter().enumerate() {
            out[ti * n + ni] = v;
        }
    }
}

/// Rows `ids` of an embedding table `[V,H]`, as f32 `[len(ids), H]`.
pub fn embedding(out: &mut [f32], table: &Weight, ids: &[u32]) {
    let h = table.cols();
    assert_eq!(out.len(), ids.len() * h);
    for (o, &id) in out.chunks_exact_mut(h).zip(ids) {
        table.row_to_f32(id as usize, o);
    }
}

/// Dot product of row `r` of `w` with `x`, converting the row on the fly.
fn row_dot(w: &Weight, r: usize, x: &[f32], scratch: &mut Vec<f32>) -> f32 {
    let k = w.cols();
    match w.dtype() {
        DType::F32 => dot(&w.f32_data()[r * k..(r + 1) * k], x),
        DType::BF16 => dot_bf16(&w.u16_data()[r * k..(r + 1) * k], x),
        DType::F16 => {
            scratch.resize(k, 0.0);
            for (s, &b) in scratch.iter_mut().zip(&w.u16_data()[r * k..(r + 1) * k]) {
                *s = f16::from_bits(b).to_f32();
            }
            dot(scratch, x)
        }
    }
}

/// f32 dot product with 16 independent accumulators (vectorises without reassociation flags).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

#[inline]
fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dot_bf16_avx2(w, x) };
    }
    dot_bf16_portable(w, x)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
    dot_bf16_portable(w, x)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..16 {
            acc[j] = x[j].mul_add(y[j], acc[j]);
        }
    }
    let mut tail = 0.0;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    reduce16(acc) + tail
}

#[inline(always)]
fn dot_bf16_portable(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; 16];
    let (wc, xc) = (w.chunks_exact(16), x.chunks_exact(16));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for j in 0..16 {
            acc[j] = f32::from_bits((a[j] as u32) << 16).mul_add(b[j], acc[j]);
        }
    }
    let mut tail = 0.0;
    for (a, b) in wr.iter().zip(xr) {
        tail += f32::from_bits((*a as u32) << 16) * b;
    }
    reduce16(acc) + tail
}

#[inline(always)]
fn reduce16(acc: [f32; 16]) -> f32 {
    let mut v = [0.0f32; 8];
    for j in 0..8 {
        v[j] = acc[j] + acc[j + 8];
    }
    (v[0] + v[4]) + (v[1] + v[5]) + (v[2] + v[6]) + (v[3] + v[7])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostBytes;
    use half::bf16;

    fn naive(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let t = x.len() / k;
        let mut out = vec![0.0; t * n];
        for ti in 0..t {
            for ni in 0..n {
                out[ti * n + ni] = (0..k)
                    .map(|i| x[ti * k + i] as f64 * w[ni * k + i] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matmul_matches_naive_for_all_dtypes_and_batch_sizes() {
        let (n, k) = (37, 45);
        let wf = pseudo_random(n * k, 1);
        for t in [1, 3, 17] {
            let x = pseudo_random(t * k, 2 + t as u32);
            // f32
            let w = Weight::from_f32(vec![n, k], &wf);
            let mut out = vec![f32::NAN; t * n];
            matmul(&mut out, &x, &w);
            let want = naive(&x, &wf, n, k);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "f32 t={t}: {a} vs {b}");
            }
            // bf16 and f16: compare against the rounded weights
            for dtype in [DType::BF16, DType::F16] {
                let bits: Vec<u16> = wf
                    .iter()
                    .map(|&v| match dtype {
                        DType::BF16 => bf16::from_f32(v).to_bits(),
                        _ => f16::from_f32(v).to_bits(),
                    })
                    .collect();
                let bytes = HostBytes::from_vec(bytemuck::cast_slice(&bits).to_vec());
                let w = Weight::new(dtype, vec![n, k], bytes).unwrap();
                let rounded = w.to_f32_vec();
                let mut out = vec![f32::NAN; t * n];
                matmul(&mut out, &x, &w);
                for (a, b) in out.iter().zip(naive(&x, &rounded, n, k)) {
                    assert!((a - b).abs() < 1e-5, "{dtype} t={t}: {a} vs {b}");
                }
            }
        }
    }
}
