//! Matrix products against stored-dtype weights: `out[T,N] = x[T,K] · Wᵀ` with `W` `[N,K]`.

use half::f16;
use rayon::prelude::*;

use crate::ggml::{self, GgmlType};
use crate::{DType, Weight};

/// Weight elements per task in the GEMV path: enough work to amortise the task overhead when
/// rows are short (an LM head with a small hidden size).
const GEMV_TASK_ELEMS: usize = 32 * 1024;

/// Up to this many tokens (a speculative block), products run row by row with each token's
/// dot product as for one token (batch-invariant); more (prefill chunks) take the tiled GEMM,
/// unless the caller asks for [`Sums::PerRow`].
pub const ROW_BY_ROW_TOKENS: usize = 16;

/// How a product of many rows sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sums {
    /// Above [`ROW_BY_ROW_TOKENS`] rows, the tiled GEMM (prefill chunks).
    Tiled,
    /// Every row as a one-row product, whatever the count: for passes whose rows must equal
    /// one-token passes bit for bit (a step's batched decode rows and verify blocks of several
    /// sequences), where the tiled GEMM's other order of sums would make a sequence's output
    /// depend on what runs beside it.
    PerRow,
}

/// `out[T,N] = x[T,K] · Wᵀ` where `W` is `[N,K]` in its stored dtype. Accumulates in f32.
pub fn matmul(out: &mut [f32], x: &[f32], w: &Weight) {
    matmul_sums(out, x, w, Sums::Tiled)
}

/// [`matmul`] summing as `sums` says.
pub fn matmul_sums(out: &mut [f32], x: &[f32], w: &Weight, sums: Sums) {
    let (n, k) = (w.rows(), w.cols());
    assert!(
        k > 0 && x.len().is_multiple_of(k),
        "x has {} values, not a multiple of K={k}",
        x.len()
    );
    let t = x.len() / k;
    assert_eq!(out.len(), t * n, "out must be [T={t}, N={n}]");
    if t <= ROW_BY_ROW_TOKENS || sums == Sums::PerRow {
        // Row by row, each token's dot product computed as for one token alone: batched
        // decode and speculative verify blocks give bit for bit the one-token results.
        if t == 1 {
            // [N, 1] is already the output layout: no copy on the decode path.
            gemv_by_row(out, x, w, 1);
            return;
        }
        let mut by_row = vec![0.0f32; n * t];
        gemv_by_row(&mut by_row, x, w, t);
        for (r, outs) in by_row.chunks_exact(t).enumerate() {
            for (ti, &v) in outs.iter().enumerate() {
                out[ti * n + r] = v;
            }
        }
        return;
    }
    // Batched: each task owns NR rows of W and produces their [T, NR] output tile.
    let tiles: Vec<Vec<f32>> = (0..n.div_ceil(NR))
        .into_par_iter()
        .map(|b| gemm_tile(x, w, b * NR, t))
        .collect();
    for (b, tile) in tiles.iter().enumerate() {
        let n0 = b * NR;
        let cols = NR.min(n - n0);
        for (ti, row) in tile.chunks_exact(NR).enumerate() {
            out[ti * n + n0..ti * n + n0 + cols].copy_from_slice(&row[..cols]);
        }
    }
}

/// Output columns (rows of W) per GEMM tile: two 8-lane vectors.
const NR: usize = 16;
/// Activation rows per micro-kernel call: 6×2 accumulator vectors fit the 16 AVX registers.
const MR: usize = 6;
/// Depth of one packed panel of W (16 KiB of f32, stays in L1 with the 6 activation rows).
const KC: usize = 256;

/// `tile[T, NR] = x[T, K] · W[n0..n0+NR, K]ᵀ` (rows of W past the end count as zero).
fn gemm_tile(x: &[f32], w: &Weight, n0: usize, t: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { gemm_tile_avx2(x, w, n0, t) };
    }
    gemm_tile_portable(x, w, n0, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_tile_avx2(x: &[f32], w: &Weight, n0: usize, t: usize) -> Vec<f32> {
    gemm_tile_portable(x, w, n0, t)
}

#[inline(always)]
fn gemm_tile_portable(x: &[f32], w: &Weight, n0: usize, t: usize) -> Vec<f32> {
    let k = w.cols();
    let rows = NR.min(w.rows() - n0);
    let mut tile = vec![0.0f32; t * NR];
    let mut panel = vec![0.0f32; KC * NR];
    let mut row = vec![0.0f32; KC];
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        // Pack W[n0.., k0..k0+kc] transposed: panel[kk][j], converting from the stored dtype.
        for j in 0..NR {
            if j < rows {
                w.row_slice_to_f32(n0 + j, k0, &mut row[..kc]);
                for kk in 0..kc {
                    panel[kk * NR + j] = row[kk];
                }
            } else {
                for kk in 0..kc {
                    panel[kk * NR + j] = 0.0;
                }
            }
        }
        let panel = &panel[..kc * NR];
        let mut t0 = 0;
        while t0 + MR <= t {
            micro_kernel::<MR>(&mut tile, x, panel, t0, k, k0, kc);
            t0 += MR;
        }
        match t - t0 {
            0 => {}
            1 => micro_kernel::<1>(&mut tile, x, panel, t0, k, k0, kc),
            2 => micro_kernel::<2>(&mut tile, x, panel, t0, k, k0, kc),
            3 => micro_kernel::<3>(&mut tile, x, panel, t0, k, k0, kc),
            4 => micro_kernel::<4>(&mut tile, x, panel, t0, k, k0, kc),
            _ => micro_kernel::<5>(&mut tile, x, panel, t0, k, k0, kc),
        }
    }
    tile
}

/// `tile[t0..t0+R, :] += x[t0..t0+R, k0..k0+kc] · panel[kc, NR]`, accumulators in registers.
#[inline(always)]
fn micro_kernel<const R: usize>(
    tile: &mut [f32],
    x: &[f32],
    panel: &[f32],
    t0: usize,
    k: usize,
    k0: usize,
    kc: usize,
) {
    let mut acc = [[0.0f32; NR]; R];
    for (r, a) in acc.iter_mut().enumerate() {
        a.copy_from_slice(&tile[(t0 + r) * NR..(t0 + r + 1) * NR]);
    }
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(t0 + r) * k + k0..(t0 + r) * k + k0 + kc]);
    for (kk, wv) in panel.chunks_exact(NR).enumerate() {
        let wv: &[f32; NR] = wv.try_into().expect("panel rows are NR wide");
        for r in 0..R {
            let xv = xs[r][kk];
            for j in 0..NR {
                acc[r][j] = xv.mul_add(wv[j], acc[r][j]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        tile[(t0 + r) * NR..(t0 + r + 1) * NR].copy_from_slice(a);
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

/// `out[r, t] = W[r] · x[t]` (laid out by weight row, `t` tokens), each row's products as
/// [`rows_dot`] computes them.
fn gemv_by_row(out: &mut [f32], x: &[f32], w: &Weight, t: usize) {
    if w.affine_parts().is_some() {
        affine_gemv(out, x, w, t);
        return;
    }
    let rows_per_task = (GEMV_TASK_ELEMS / w.cols()).max(1);
    out.par_chunks_mut(rows_per_task * t)
        .enumerate()
        .for_each(|(b, chunk)| {
            let mut row = Vec::new();
            for (i, o) in chunk.chunks_exact_mut(t).enumerate() {
                rows_dot(w, b * rows_per_task + i, x, o, &mut row);
            }
        });
}

/// Dot product of row `r` of `w` with `x`, converting the row on the fly.
fn row_dot(w: &Weight, r: usize, x: &[f32], scratch: &mut Vec<f32>) -> f32 {
    let k = w.cols();
    match w.dtype() {
        DType::F32 => dot(&w.f32_data()[r * k..(r + 1) * k], x),
        DType::BF16 => dot_bf16(&w.u16_data()[r * k..(r + 1) * k], x),
        DType::F16 => dot(float_row(w, r, scratch), x),
        DType::Affine { .. } => unreachable!("affine weights take affine_gemv"),
        DType::Ggml(t) => {
            let (_, row) = w.ggml_row(r).expect("GGML weight");
            ggml_dot(t, row, x, scratch)
        }
    }
}

/// `out[t] = W[r] · x[t]` for every token of `x`, each exactly as [`row_dot`] computes it:
/// float rows are decoded once and multiplied with four tokens at a time.
fn rows_dot(w: &Weight, r: usize, x: &[f32], out: &mut [f32], scratch: &mut Vec<f32>) {
    let k = w.cols();
    if out.len() == 1 {
        out[0] = row_dot(w, r, x, scratch);
        return;
    }
    // bf16 and f16 → f32 is exact, and `dot` sums like `dot_bf16`: the same bits.
    if let DType::F32 | DType::BF16 | DType::F16 = w.dtype() {
        return dots(float_row(w, r, scratch), x, out);
    }
    for (ti, o) in out.iter_mut().enumerate() {
        *o = row_dot(w, r, &x[ti * k..(ti + 1) * k], scratch);
    }
}

/// Row `r` of a float weight (f32, bf16, f16) in f32: the stored row, or decoded into
/// `scratch`.
fn float_row<'a>(w: &'a Weight, r: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
    let k = w.cols();
    let decode = |scratch: &'a mut Vec<f32>, f: fn(u16) -> f32| -> &'a [f32] {
        scratch.clear();
        scratch.extend(w.u16_data()[r * k..(r + 1) * k].iter().map(|&b| f(b)));
        scratch
    };
    match w.dtype() {
        DType::F32 => &w.f32_data()[r * k..(r + 1) * k],
        DType::BF16 => decode(scratch, |b| f32::from_bits((b as u32) << 16)),
        DType::F16 => decode(scratch, |b| f16::from_bits(b).to_f32()),
        other => unreachable!("{other} is not a float weight"),
    }
}

/// `out[t] = row · x[t]`, four tokens per pass over the row, each token's sum in the order of
/// [`dot`].
fn dots(row: &[f32], x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dots_avx2(row, x, out) };
    }
    dots_portable(row, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(row: &[f32], x: &[f32], out: &mut [f32]) {
    dots_portable(row, x, out)
}

#[inline(always)]
fn dots_portable(row: &[f32], x: &[f32], out: &mut [f32]) {
    let k = row.len();
    let mut t0 = 0;
    while t0 < out.len() {
        let n = (out.len() - t0).min(4);
        let mut acc = [[0.0f32; 16]; 4];
        let full = k / 16 * 16;
        for c in (0..full).step_by(16) {
            let w = &row[c..c + 16];
            for (ti, a) in acc.iter_mut().enumerate().take(n) {
                let xs = &x[(t0 + ti) * k + c..][..16];
                for j in 0..16 {
                    a[j] = w[j].mul_add(xs[j], a[j]);
                }
            }
        }
        for (ti, a) in acc.iter().enumerate().take(n) {
            let xs = &x[(t0 + ti) * k..(t0 + ti + 1) * k];
            let mut tail = 0.0;
            for (w, v) in row[full..].iter().zip(&xs[full..]) {
                tail += w * v;
            }
            out[t0 + ti] = reduce16(*a) + tail;
        }
        t0 += n;
    }
}

/// Dot product of one row of GGML blocks with `x`, a block at a time.
fn ggml_dot(t: GgmlType, row: &[u8], x: &[f32], scratch: &mut Vec<f32>) -> f32 {
    scratch.resize(256, 0.0);
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { ggml_dot_avx2(t, row, x, scratch) };
    }
    ggml::row_dot(t, row, x, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn ggml_dot_avx2(t: GgmlType, row: &[u8], x: &[f32], scratch: &mut [f32]) -> f32 {
    ggml::row_dot(t, row, x, scratch)
}

/// `out[r, t] = W[r] · x[t]` (row-major by weight row, `t` tokens) for an affine weight
/// without expanding it: per row and group, `scale · Σ q·x + bias · Σ x`, the codes unpacked
/// a group at a time.
fn affine_gemv(out: &mut [f32], x: &[f32], w: &Weight, t: usize) {
    let (bits, group, words, scales, biases) = w.affine_parts().expect("affine weight");
    let k = w.cols();
    let groups = k / group;
    // Σx per group and token, shared by every row.
    let xsum: Vec<f32> = x.chunks_exact(group).map(|xs| xs.iter().sum()).collect();
    let per_word = 32 / bits as usize;
    let rows_per_task = (GEMV_TASK_ELEMS / k).max(1);
    out.par_chunks_mut(rows_per_task * t)
        .enumerate()
        .for_each(|(b, chunk)| {
            let mut scratch = vec![0.0f32; 2 * groups + group];
            let (sc, rest) = scratch.split_at_mut(groups);
            let (bi, buf) = rest.split_at_mut(groups);
            for (i, o) in chunk.iter_mut().enumerate() {
                let (r, ti) = (b * rows_per_task + i / t, i % t);
                if ti == 0 {
                    scales.row_to_f32(r, sc);
                    biases.row_to_f32(r, bi);
                }
                let row = &words[r * k / per_word..(r + 1) * k / per_word];
                let args = AffineRow {
                    row,
                    group,
                    sc,
                    bi,
                    xsum: &xsum[ti * groups..(ti + 1) * groups],
                    x: &x[ti * k..(ti + 1) * k],
                };
                #[cfg(target_arch = "x86_64")]
                if has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked above).
                    *o = unsafe {
                        match bits {
                            2 => affine_dot_avx2::<2>(&args, buf),
                            4 => affine_dot_avx2::<4>(&args, buf),
                            _ => affine_dot_avx2::<8>(&args, buf),
                        }
                    };
                    continue;
                }
                *o = match bits {
                    2 => affine_dot::<2>(&args, buf),
                    4 => affine_dot::<4>(&args, buf),
                    _ => affine_dot::<8>(&args, buf),
                };
            }
        });
}

/// One row of an affine weight and what its dot product needs.
struct AffineRow<'a> {
    row: &'a [u32],
    group: usize,
    sc: &'a [f32],
    bi: &'a [f32],
    xsum: &'a [f32],
    x: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn affine_dot_avx2<const BITS: usize>(a: &AffineRow, buf: &mut [f32]) -> f32 {
    affine_dot::<BITS>(a, buf)
}

#[inline(always)]
fn affine_dot<const BITS: usize>(a: &AffineRow, buf: &mut [f32]) -> f32 {
    let per_word = 32 / BITS;
    let mask = (1u32 << BITS) - 1;
    let words_per_group = a.group / per_word;
    let buf = &mut buf[..a.group];
    let mut acc = 0.0f32;
    for (gi, words) in a.row.chunks_exact(words_per_group).enumerate() {
        for (out, &word) in buf.chunks_exact_mut(per_word).zip(words) {
            for (j, o) in out.iter_mut().enumerate() {
                *o = ((word >> (BITS * j)) & mask) as f32;
            }
        }
        let qx = dot_portable(buf, &a.x[gi * a.group..(gi + 1) * a.group]);
        acc += a.sc[gi].mul_add(qx, a.bi[gi] * a.xsum[gi]);
    }
    acc
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
pub(crate) fn has_avx2_fma() -> bool {
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

/// [`dot`] without the dispatch, for callers that run inside their own AVX2 + FMA code.
#[inline(always)]
pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
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
        let (n, k) = (37, 300); // a partial NR tile and a partial KC panel
        let wf = pseudo_random(n * k, 1);
        for t in [1, 2, 3, 6, 17] {
            let x = pseudo_random(t * k, 2 + t as u32);
            // f32
            let w = Weight::from_f32(vec![n, k], &wf);
            let mut out = vec![f32::NAN; t * n];
            matmul(&mut out, &x, &w);
            let want = naive(&x, &wf, n, k);
            for (a, b) in out.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-5 * (1.0 + b.abs()),
                    "f32 t={t}: {a} vs {b}"
                );
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
                    assert!(
                        (a - b).abs() < 1e-5 * (1.0 + b.abs()),
                        "{dtype} t={t}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn affine_weights_multiply_like_their_dequantised_values() {
        use half::bf16;
        for (bits, group) in [(4u32, 32usize), (8, 64), (2, 32)] {
            let (e, n, k) = (2usize, 19usize, 128usize);
            let per_word = 32 / bits as usize;
            let codes: Vec<u32> = (0..e * n * k / per_word)
                .map(|i| (i as u32).wrapping_mul(2654435761))
                .collect();
            let groups = e * n * k / group;
            let sc: Vec<u16> = (0..groups)
                .map(|i| bf16::from_f32(0.01 + (i % 7) as f32 * 0.003).to_bits())
                .collect();
            let bi: Vec<u16> = (0..groups)
                .map(|i| bf16::from_f32(-0.05 + (i % 5) as f32 * 0.02).to_bits())
                .collect();
            let gshape = vec![e, n, k / group];
            let scales = Weight::new(
                DType::BF16,
                gshape.clone(),
                HostBytes::from_vec(bytemuck::cast_slice(&sc).to_vec()),
            )
            .unwrap();
            let biases = Weight::new(
                DType::BF16,
                gshape,
                HostBytes::from_vec(bytemuck::cast_slice(&bi).to_vec()),
            )
            .unwrap();
            let codes = HostBytes::from_vec(bytemuck::cast_slice(&codes).to_vec());
            let w = Weight::affine(vec![e, n, k], bits, group, codes, scales, biases).unwrap();
            // Expert 1, as a MoE layer slices it; dequantised reference by the definition.
            let w1 = w.index(1);
            let mask = (1u32 << bits) - 1;
            let words: Vec<u32> = bytemuck::cast_slice(w1.affine_parts().unwrap().2).to_vec();
            let want_w: Vec<f32> = (0..n * k)
                .map(|i| {
                    let q = (words[i / per_word] >> (bits as usize * (i % per_word))) & mask;
                    let gi = (n * k + i) / group; // expert 1 starts after n*k elements
                    bf16::from_bits(sc[gi]).to_f32() * q as f32 + bf16::from_bits(bi[gi]).to_f32()
                })
                .collect();
            assert_eq!(w1.to_f32_vec(), want_w, "{bits}-bit dequantisation");
            for t in [1, 5] {
                let x = pseudo_random(t * k, 9 + t as u32);
                let mut out = vec![f32::NAN; t * n];
                matmul(&mut out, &x, &w1);
                for (a, b) in out.iter().zip(naive(&x, &want_w, n, k)) {
                    assert!(
                        (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                        "{bits}-bit t={t}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
