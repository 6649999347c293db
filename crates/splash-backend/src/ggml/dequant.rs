//! Block dequantisation, one function per GGML type (llama.cpp `dequantize_row_*`).

use half::{bf16, f16};

use super::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS,
    KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use super::GgmlType;

/// Offset added to every IQ1_S / IQ1_M grid value (llama.cpp `IQ1S_DELTA`, `IQ1M_DELTA`).
const IQ1_DELTA: f32 = 0.125;

/// Runs `$body` with `$f` bound to the block function of type `$t` (a distinct fn item per
/// type, so that generic callers are monomorphised and the block code inlines).
macro_rules! with_block_fn {
    ($t:expr, |$f:ident| $body:expr) => {
        match $t {
            GgmlType::F32 => {
                let $f =
                    |b: &[u8], y: &mut [f32]| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                $body
            }
            GgmlType::F16 => {
                let $f = |b: &[u8], y: &mut [f32]| y[0] = f16::from_le_bytes([b[0], b[1]]).to_f32();
                $body
            }
            GgmlType::BF16 => {
                let $f =
                    |b: &[u8], y: &mut [f32]| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                $body
            }
            GgmlType::Q4_0 => {
                let $f = q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                let $f = q4_1;
                $body
            }
            GgmlType::Q5_0 => {
                let $f = q5_0;
                $body
            }
            GgmlType::Q5_1 => {
                let $f = q5_1;
                $body
            }
            GgmlType::Q8_0 => {
                let $f = q8_0;
                $body
            }
            GgmlType::Q2_K => {
                let $f = q2_k;
                $body
            }
            GgmlType::Q3_K => {
                let $f = q3_k;
                $body
            }
            GgmlType::Q4_K => {
                let $f = q4_k;
                $body
            }
            GgmlType::Q5_K => {
                let $f = q5_k;
                $body
            }
            GgmlType::Q6_K => {
                let $f = q6_k;
                $body
            }
            GgmlType::IQ2_XXS => {
                let $f = iq2_xxs;
                $body
            }
            GgmlType::IQ2_XS => {
                let $f = iq2_xs;
                $body
            }
            GgmlType::IQ2_S => {
                let $f = iq2_s;
                $body
            }
            GgmlType::IQ3_XXS => {
                let $f = iq3_xxs;
                $body
            }
            GgmlType::IQ3_S => {
                let $f = iq3_s;
                $body
            }
            GgmlType::IQ1_S => {
                let $f = iq1_s;
                $body
            }
            GgmlType::IQ1_M => {
                let $f = iq1_m;
                $body
            }
            GgmlType::IQ4_NL => {
                let $f = iq4_nl;
                $body
            }
            GgmlType::IQ4_XS => {
                let $f = iq4_xs;
                $body
            }
        }
    };
}

/// `Σ row·x` for one row of blocks: each block is dequantised into `buf` and multiplied into
/// eight running sums. Inlined into the caller, so that compiled inside a SIMD-enabled function
/// the block code and the sums vectorise (with FMA) together.
#[inline(always)]
pub(crate) fn row_dot(ty: GgmlType, row: &[u8], x: &[f32], buf: &mut [f32]) -> f32 {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    // Float "blocks" are single elements: convert a run of them at once instead.
    let step = if be == 1 { buf.len() } else { be };
    let buf = &mut buf[..step];
    with_block_fn!(ty, |block| {
        let mut acc = [0.0f32; 8];
        for (bytes, xs) in row.chunks(step / be * bb).zip(x.chunks(step)) {
            let y = &mut buf[..xs.len()];
            for (b, o) in bytes.chunks_exact(bb).zip(y.chunks_exact_mut(be)) {
                block(b, o);
            }
            for (yc, xc) in y.chunks_exact(8).zip(xs.chunks_exact(8)) {
                for j in 0..8 {
                    acc[j] = yc[j].mul_add(xc[j], acc[j]);
                }
            }
            let tail = y.len() / 8 * 8;
            for (a, b) in y[tail..].iter().zip(&xs[tail..]) {
                acc[0] = a.mul_add(*b, acc[0]);
            }
        }
        acc.iter().sum()
    })
}

/// Dequantises whole blocks: `src` holds `dst.len() / ty.block_elems()` blocks of `ty`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    assert!(
        dst.len().is_multiple_of(be) && src.len() == dst.len() / be * bb,
        "{ty}: {} bytes for {} values",
        src.len(),
        dst.len()
    );
    with_block_fn!(ty, |block| {
        for (b, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(be)) {
            block(b, y);
        }
    })
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `half d; u8 qs[16]`: `(q - 8)·d`, low nibbles first.
#[inline(always)]
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 15) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// `half d, m; u8 qs[16]`: `q·d + m`.
#[inline(always)]
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = (q & 15) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// `half d; u32 qh; u8 qs[16]`: five-bit codes, the fifth bits in `qh`, `(q - 16)·d`.
#[inline(always)]
fn q5_0(b: &[u8], y: &mut [f32]) {
    let (d, qh) = (half(b, 0), u32_at(b, 2));
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 15) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

/// `half d, m; u32 qh; u8 qs[16]`: five-bit codes, `q·d + m`.
#[inline(always)]
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m, qh) = (half(b, 0), half(b, 2), u32_at(b, 4));
    for (j, &q) in b[8..24].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 15) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// `half d; i8 qs[32]`: `q·d`.
#[inline(always)]
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

/// `u8 scales[16]; u8 qs[64]; half d, dmin`: two-bit codes, a 4-bit scale and min per 16.
#[inline(always)]
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, min) = (half(b, 80), half(b, 82));
    let mut is = 0;
    let mut out = y.chunks_exact_mut(16);
    for q in qs.chunks_exact(32) {
        for shift in (0..8).step_by(2) {
            for half_q in [&q[..16], &q[16..]] {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 15) as f32, min * (sc >> 4) as f32);
                let o = out.next().expect("16 groups of 16");
                for (o, &v) in o.iter_mut().zip(half_q) {
                    *o = dl * ((v >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// `u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d`: three-bit codes (high bit in `hmask`),
/// sixteen 6-bit signed scales.
#[inline(always)]
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hm, qs) = (&b[0..32], &b[32..96]);
    let d = half(b, 108);
    let aux = [u32_at(b, 96), u32_at(b, 100), u32_at(b, 104)];
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let tmp = aux[2];
    let words = [
        (aux[0] & k2) | ((tmp & k1) << 4),
        (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
        ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let scales: [i8; 16] = std::array::from_fn(|i| words[i / 4].to_le_bytes()[i % 4] as i8);
    let mut is = 0;
    let mut m = 1u8;
    let mut out = y.chunks_exact_mut(16);
    for q in qs.chunks_exact(32) {
        for shift in (0..8).step_by(2) {
            for (q16, h16) in [(&q[..16], &hm[..16]), (&q[16..], &hm[16..])] {
                let dl = d * (scales[is] as i32 - 32) as f32;
                is += 1;
                let o = out.next().expect("16 groups of 16");
                for ((o, &v), &h) in o.iter_mut().zip(q16).zip(h16) {
                    let hi = if h & m != 0 { 0 } else { 4 };
                    *o = dl * (((v >> shift) & 3) as i32 - hi) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// Scale and min `j` of the 12 packed 6-bit scale bytes of Q4_K / Q5_K.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
    } else {
        (
            ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)) as f32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as f32,
        )
    }
}

/// `half d, dmin; u8 scales[12]; u8 qs[128]`: four-bit codes, a scale and min per 32.
#[inline(always)]
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min, scales, qs) = (half(b, 0), half(b, 2), &b[4..16], &b[16..144]);
    for (j, (q, o)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1, d2, m2) = (d * sc1, min * m1, d * sc2, min * m2);
        for (l, &v) in q.iter().enumerate() {
            o[l] = d1 * (v & 15) as f32 - m1;
            o[l + 32] = d2 * (v >> 4) as f32 - m2;
        }
    }
}

/// `half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]`: Q4_K with a fifth bit from `qh`.
#[inline(always)]
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min, scales) = (half(b, 0), half(b, 2), &b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (j, (q, o)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1, d2, m2) = (d * sc1, min * m1, d * sc2, min * m2);
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        for (l, &v) in q.iter().enumerate() {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * ((v & 15) + h1) as f32 - m1;
            o[l + 32] = d2 * ((v >> 4) + h2) as f32 - m2;
        }
    }
}

/// `u8 ql[128]; u8 qh[64]; i8 scales[16]; half d`: six-bit codes centred on 32.
#[inline(always)]
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let o = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * (sc[is] as i8 as f32) * q1 as f32;
            o[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
            o[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
            o[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
        }
    }
}

/// Byte `j` of a packed grid entry.
#[inline(always)]
fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// `±1` for bit `j` of a sign byte.
#[inline(always)]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// `half d; u16 qs[32]`: per 32 values, four 8-bit grid indices and 4×7 sign bits plus a
/// 4-bit scale in the second word.
#[inline(always)]
fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let at = 2 + 8 * ib;
        let idx = &b[at..at + 4];
        let aux1 = u32_at(b, at + 4);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[idx[l] as usize];
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            for (j, o) in o.iter_mut().enumerate() {
                *o = db * grid_byte(grid, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// `half d; u16 qs[32]; u8 scales[8]`: 9-bit grid indices with 7 sign bits, two 4-bit scales
/// per 32 values.
#[inline(always)]
fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let scales = &b[66..74];
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let db = [
            d * (0.5 + (scales[ib] & 15) as f32) * 0.25,
            d * (0.5 + (scales[ib] >> 4) as f32) * 0.25,
        ];
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let grid = IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            for (j, o) in o.iter_mut().enumerate() {
                *o = db[l / 2] * grid_byte(grid, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// `half d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]`: 10-bit grid indices, explicit
/// sign bytes.
#[inline(always)]
fn iq2_s(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let db = [
            d * (0.5 + (scales[ib] & 15) as f32) * 0.25,
            d * (0.5 + (scales[ib] >> 4) as f32) * 0.25,
        ];
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let hi = ((qh[ib] as usize) << (8 - 2 * l)) & 0x300;
            let grid = IQ2S_GRID[qs[4 * ib + l] as usize | hi];
            let s = signs[4 * ib + l];
            for (j, o) in o.iter_mut().enumerate() {
                *o = db[l / 2] * grid_byte(grid, j) as f32 * sign(s, j);
            }
        }
    }
}

/// `half d; u8 qs[64]; u32 scales_and_signs[8]`: 8-bit indices into a grid of 4-value
/// entries, 4×7 sign bits and a 4-bit scale per 32 values.
#[inline(always)]
fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qs = &b[2..66];
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize];
            let g2 = IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize];
            for j in 0..4 {
                o[j] = db * ((g1 >> (8 * j)) as u8) as f32 * sign(signs, j);
                o[j + 4] = db * ((g2 >> (8 * j)) as u8) as f32 * sign(signs, j + 4);
            }
        }
    }
}

/// `half d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]`: 9-bit indices into a grid of
/// 4-value entries, explicit signs, one 4-bit scale per 32 values.
#[inline(always)]
fn iq3_s(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let sc = scales[ib / 2] >> (4 * (ib % 2));
        let db = d * (1 + 2 * (sc & 15) as i32) as f32;
        let h = qh[ib] as usize;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let g1 = IQ3S_GRID[qs[8 * ib + 2 * l] as usize | ((h << (8 - 2 * l)) & 256)];
            let g2 = IQ3S_GRID[qs[8 * ib + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256)];
            let s = signs[4 * ib + l];
            for j in 0..4 {
                o[j] = db * ((g1 >> (8 * j)) as u8) as f32 * sign(s, j);
                o[j + 4] = db * ((g2 >> (8 * j)) as u8) as f32 * sign(s, j + 4);
            }
        }
    }
}

/// `half d; u8 qs[32]; u16 qh[8]`: 11-bit indices into a ternary grid, a 3-bit scale and the
/// sign of a shared offset per 32 values.
#[inline(always)]
fn iq1_s(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qs = &b[2..34];
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib) as usize;
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 {
            -IQ1_DELTA
        } else {
            IQ1_DELTA
        };
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let grid = IQ1S_GRID[qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8)];
            for (j, o) in o.iter_mut().enumerate() {
                *o = dl * (grid_byte(grid, j) as i8 as f32 + delta);
            }
        }
    }
}

/// `u8 qs[32]; u8 qh[16]; u8 scales[8]`: IQ1_S with per-16 scales and offsets; the fp16
/// super-scale is spread over the top nibbles of the four scale words.
#[inline(always)]
fn iq1_m(b: &[u8], y: &mut [f32]) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc: [u16; 4] = std::array::from_fn(|i| u16_at(b, 48 + 2 * i));
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = f16::from_bits(d_bits).to_f32();
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * (2 * (s & 7) + 1) as f32,
            d * (2 * ((s >> 3) & 7) + 1) as f32,
        ];
        let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
        let q = &qs[4 * ib..4 * ib + 4];
        let idx = [
            q[0] as usize | ((h0 << 8) & 0x700),
            q[1] as usize | ((h0 << 4) & 0x700),
            q[2] as usize | ((h1 << 8) & 0x700),
            q[3] as usize | ((h1 << 4) & 0x700),
        ];
        let offset = |bits: usize, mask: usize| {
            if bits & mask != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            }
        };
        let delta = [
            offset(h0, 0x08),
            offset(h0, 0x80),
            offset(h1, 0x08),
            offset(h1, 0x80),
        ];
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let grid = IQ1S_GRID[idx[l]];
            for (j, o) in o.iter_mut().enumerate() {
                *o = dl[l / 2] * (grid_byte(grid, j) as i8 as f32 + delta[l]);
            }
        }
    }
}

/// `half d; u8 qs[16]`: 4-bit indices into a fixed non-uniform table.
#[inline(always)]
fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 15) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// `half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]`: IQ4_NL with a 6-bit scale per 32.
#[inline(always)]
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let (d, scales_h, scales_l) = (half(b, 0), u16_at(b, 2), &b[4..8]);
    for (ib, o) in y.chunks_exact_mut(32).enumerate() {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 15) as i32
            | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        for (j, &q) in qs.iter().enumerate() {
            o[j] = dl * KVALUES_IQ4NL[(q & 15) as usize] as f32;
            o[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

#[cfg(test)]
mod tests;
