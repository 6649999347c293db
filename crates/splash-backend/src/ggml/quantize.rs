//! Quantisation of float rows into GGML blocks, for weights that splash stores smaller at
//! load (a draft's BF16 matrices as Q4_K, whose tensor-core GEMV is the GPU's fastest).
//!
//! Q4_K (`half d, dmin; u8 scales[12]; u8 qs[128]`, 256 values): each 32-value sub-block `j`
//! decodes as `d·sc_j·q − dmin·m_j` with `q` in 0..16 and 6-bit `sc_j`, `m_j`. Each sub-block's
//! scale and offset are fitted by least squares over its codes, then rounded to the block's
//! 6-bit grid.

use half::f16;

use super::QK_K;

/// Bytes of one Q4_K block.
const Q4_K_BYTES: usize = 144;

/// Values per Q4_K sub-block (one 6-bit scale and min).
const SUB: usize = 32;

/// Quantises `x` (a multiple of 256 values) into Q4_K blocks in `out` (144 bytes per 256).
pub fn quantize_row_q4_k(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK_K) && out.len() == x.len() / QK_K * Q4_K_BYTES,
        "{} values into {} bytes",
        x.len(),
        out.len()
    );
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        q4_k_block(xb, ob);
    }
}

fn q4_k_block(x: &[f32], out: &mut [u8]) {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, sub) in x.chunks_exact(SUB).enumerate() {
        (scale[j], min[j]) = fit_sub_block(sub);
    }
    // The super-block factors put the largest scale and min at the top of the 6-bit range.
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &b| a.max(b)) / 63.0);
    let dmin = f16::from_f32(min.iter().fold(0f32, |a, &b| a.max(b)) / 63.0);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let code6 = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: [u8; 8] = std::array::from_fn(|j| code6(scale[j], df));
    let mn: [u8; 8] = std::array::from_fn(|j| code6(min[j], dminf));
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    pack_scales(&sc, &mn, &mut out[4..16]);
    // Codes against the rounded factors, so each value takes its nearest decodable level.
    let inv: [f32; 8] = std::array::from_fn(|j| {
        let step = df * sc[j] as f32;
        if step > 0.0 {
            1.0 / step
        } else {
            0.0
        }
    });
    let code4 = |v: f32, j: usize| code(v + dminf * mn[j] as f32, inv[j]) as u8;
    // Byte 32·p + l holds value 64·p + l (low nibble, sub-block 2p) and 64·p + 32 + l (high).
    for (p, qs) in out[16..].chunks_exact_mut(SUB).enumerate() {
        for (l, q) in qs.iter_mut().enumerate() {
            let lo = code4(x[64 * p + l], 2 * p);
            let hi = code4(x[64 * p + SUB + l], 2 * p + 1);
            *q = lo | (hi << 4);
        }
    }
}

/// The 12 scale bytes of Q4_K (the inverse of `scale_min_k4` in dequant.rs): sub-blocks 0..4
/// in the low 6 bits of bytes `j` (scale) and `j + 4` (min); sub-blocks 4..8 in the nibbles of
/// bytes `j + 4` with their top two bits in the high bits of bytes `j − 4` and `j`.
fn pack_scales(sc: &[u8; 8], mn: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
}

/// The 4-bit code nearest `v · inv` (`v` offset by the min, `inv` the inverse scale),
/// clamped to 0..=15, as an f32. The truncating cast rounds (`+ 0.5`, negatives clamp to 0)
/// without the library call `f32::round` is on baseline x86-64.
#[inline(always)]
fn code(v: f32, inv: f32) -> f32 {
    ((v * inv + 0.5) as i32).clamp(0, 15) as f32
}

/// Scale `a` and min `m` (≥ 0) of a sub-block, `x ≈ a·q − m` with `q` in 0..16: from the
/// range, then least-squares refits over the codes while the error falls.
fn fit_sub_block(x: &[f32]) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &b| a.min(b));
    let hi = x.iter().fold(lo, |a, &b| a.max(b));
    if hi <= lo {
        return (0.0, -lo);
    }
    // One walk over the codes of (a, m): their squared error and the sums of a least-squares
    // fit of x ≈ a'·q + b over them.
    let walk = |a: f32, m: f32| {
        let inv = 1.0 / a;
        let (mut err, mut sq, mut sqq, mut sx, mut sqx) = (0f32, 0f32, 0f32, 0f32, 0f32);
        for &v in x {
            let q = code(v + m, inv);
            err += (a * q - m - v) * (a * q - m - v);
            sq += q;
            sqq += q * q;
            sx += v;
            sqx += q * v;
        }
        (err, [sq, sqq, sx, sqx])
    };
    let (mut a, mut m) = ((hi - lo) / 15.0, -lo);
    let (mut best, mut sums) = walk(a, m);
    let n = x.len() as f32;
    for _ in 0..3 {
        let [sq, sqq, sx, sqx] = sums;
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            break;
        }
        // b = −m must stay ≤ 0 (Q4_K's min is subtracted).
        let (mut na, mut b) = ((n * sqx - sq * sx) / det, (sqq * sx - sq * sqx) / det);
        if b > 0.0 {
            (na, b) = (sqx / sqq, 0.0);
        }
        if na.is_nan() || na <= 0.0 {
            break;
        }
        let (e, s) = walk(na, -b);
        if e >= best {
            break;
        }
        (a, m, best, sums) = (na, -b, e, s);
    }
    (a, m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{dequantize, GgmlType};

    /// A reproducible row: a smooth part plus pseudo-random noise, some sub-blocks all
    /// positive (min 0), one all zero, one constant.
    fn row(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as f32 / u32::MAX as f32 - 0.5
        };
        (0..n)
            .map(|i| match (i / SUB) % 8 {
                3 => 0.0,
                5 => 0.0125,
                6 => 0.02 + 0.01 * rnd().abs(),
                _ => 0.03 * rnd() + 0.005 * ((i as f32) * 0.1).sin(),
            })
            .collect()
    }

    /// Decoded by the GGML dequantiser, every value lies within a step of its sub-block's
    /// grid (half a step from rounding the code, the rest from the 6-bit factors), and the
    /// rows' error is what 4 bits give.
    #[test]
    fn q4_k_decodes_close_to_the_input() {
        let x = row(4 * QK_K, 7);
        let mut bytes = vec![0u8; 4 * Q4_K_BYTES];
        quantize_row_q4_k(&x, &mut bytes);
        let mut y = vec![0f32; x.len()];
        dequantize(GgmlType::Q4_K, &bytes, &mut y);
        for (sub, (xs, ys)) in x.chunks(SUB).zip(y.chunks(SUB)).enumerate() {
            let range =
                xs.iter().fold(0f32, |a, &b| a.max(b)) - xs.iter().fold(0f32, |a, &b| a.min(b));
            for (i, (&a, &b)) in xs.iter().zip(ys).enumerate() {
                assert!(
                    (a - b).abs() <= range / 15.0 * 1.05 + 1e-6,
                    "sub-block {sub} value {i}: {a} decoded as {b} (range {range})"
                );
            }
        }
        let rms = |v: &mut dyn Iterator<Item = f32>| {
            let (s, n) = v.fold((0f32, 0usize), |(s, n), e| (s + e * e, n + 1));
            (s / n as f32).sqrt()
        };
        let err = rms(&mut x.iter().zip(&y).map(|(a, b)| a - b));
        let sig = rms(&mut x.iter().copied());
        assert!(err < 0.12 * sig, "relative rms error {}", err / sig);
        // The all-zero sub-blocks decode exactly, the constant ones within their scale's
        // 6-bit rounding.
        for b in 0..4 {
            assert!(y[b * QK_K + 3 * SUB..][..SUB].iter().all(|&v| v == 0.0));
            for &v in &y[b * QK_K + 5 * SUB..][..SUB] {
                assert!(
                    (v - 0.0125).abs() < 0.03 * 0.0125,
                    "constant decoded as {v}"
                );
            }
        }
    }

    /// The least-squares refit never does worse than the range's grid.
    #[test]
    fn the_refit_lowers_the_error() {
        let x = row(QK_K, 3);
        for sub in x.chunks(SUB) {
            let lo = sub.iter().fold(0f32, |a, &b| a.min(b));
            let hi = sub.iter().fold(lo, |a, &b| a.max(b));
            if hi <= lo {
                continue;
            }
            let err = |a: f32, m: f32| {
                sub.iter()
                    .map(|&v| (a * ((v + m) / a).round().clamp(0.0, 15.0) - m - v).powi(2))
                    .sum::<f32>()
            };
            let (a, m) = fit_sub_block(sub);
            assert!(m >= 0.0 && a > 0.0);
            assert!(err(a, m) <= err((hi - lo) / 15.0, -lo));
        }
    }

    /// The scale bytes round-trip through the dequantiser's unpacking for every 6-bit value.
    #[test]
    fn scales_pack_as_ggml_unpacks() {
        for v in 0..64u8 {
            let sc: [u8; 8] = std::array::from_fn(|j| (v + 7 * j as u8) & 63);
            let mn: [u8; 8] = std::array::from_fn(|j| (v + 13 * j as u8 + 5) & 63);
            let mut block = [0u8; Q4_K_BYTES];
            block[0..2].copy_from_slice(&f16::ONE.to_le_bytes());
            block[2..4].copy_from_slice(&f16::ONE.to_le_bytes());
            pack_scales(&sc, &mn, &mut block[4..16]);
            // Codes all 0: each value decodes to −min; all 1 would add the scale.
            let mut y = [0f32; QK_K];
            dequantize(GgmlType::Q4_K, &block, &mut y);
            for j in 0..8 {
                assert_eq!(y[j * SUB], -(mn[j] as f32), "min of sub-block {j}");
            }
            block[16..].fill(0x11);
            dequantize(GgmlType::Q4_K, &block, &mut y);
            for j in 0..8 {
                assert_eq!(
                    y[j * SUB],
                    sc[j] as f32 - mn[j] as f32,
                    "scale of sub-block {j}"
                );
            }
        }
    }
}
