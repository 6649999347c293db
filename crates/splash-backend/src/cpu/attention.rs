//! Causal grouped-query attention over a key/value cache.

use rayon::prelude::*;

use super::kv::KvStore;
use super::matmul::dot_portable;

/// Causal attention for `T` queries at positions `pos0..pos0+T`.
///
/// `q` is `[T, hq, d]`; `k` and `v` are the cache `[S, hkv, d]` (any [`KvStore`] format,
/// rows read back as f32) with `S >= pos0 + T`, and
/// query `t` sees keys `0..=pos0+t`. Query head `h` uses kv head `h / (hq/hkv)`. Softmax is
/// computed in f32 after scaling by `scale`. `out` is `[T, hq, d]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    out: &mut [f32],
    q: &[f32],
    k: &KvStore,
    v: &KvStore,
    hq: usize,
    hkv: usize,
    d: usize,
    pos0: usize,
    scale: f32,
) {
    assert!(
        hq.is_multiple_of(hkv),
        "query heads {hq} not a multiple of kv heads {hkv}"
    );
    let t = q.len() / (hq * d);
    let s = k.len() / (hkv * d);
    assert_eq!(
        k.len(),
        v.len(),
        "keys and values must have the same length"
    );
    assert!(
        s >= pos0 + t,
        "cache holds {s} positions, need {}",
        pos0 + t
    );
    assert_eq!(out.len(), q.len());
    let group = hq / hkv;
    let rows = Rows {
        q,
        hq,
        hkv,
        d,
        pos0,
        scale,
    };
    if t == 1 {
        // One query per head: the heads in parallel.
        out.par_chunks_mut(d).enumerate().for_each(|(h, o)| {
            rows.attend(o, k, v, h / group, (0, 1), (h % group, 1));
        });
        return;
    }
    // Tiles of queries: each key and value row is read back once per tile (and kv head) for
    // all its queries, instead of once per query. Every query's arithmetic is the same as
    // alone (dot products, softmax, the sum over keys in order), so a verify block still
    // gives each row the bits of one-token decoding.
    let tile = t
        .div_ceil(2 * rayon::current_num_threads())
        .clamp(1, QUERY_TILE);
    out.par_chunks_mut(tile * hq * d)
        .enumerate()
        .for_each(|(i, o)| {
            let n = o.len() / (hq * d);
            for kvh in 0..hkv {
                rows.attend(o, k, v, kvh, (i * tile, n), (0, group));
            }
        });
}

/// Query rows at most per tile of [`attention`]: their scores against the whole context stay
/// small (32 · group · context floats).
const QUERY_TILE: usize = 32;

/// Key (or value) rows read back per block of [`Rows::attend`]'s inner loops.
const KEY_BLOCK: usize = 64;

/// `scores[r, j] = dot(q_r, key_j) · scale` for the keys `j0..` of `keys` (rows of the width
/// of the queries `qs`) that query `r` sees (`j < lens[r]`).
fn score_block(
    qs: &[f32],
    lens: &[usize],
    j0: usize,
    keys: &[f32],
    scores: &mut [f32],
    span: usize,
    scale: f32,
) {
    #[cfg(target_arch = "x86_64")]
    if super::matmul::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { score_block_avx2(qs, lens, j0, keys, scores, span, scale) };
    }
    score_block_portable(qs, lens, j0, keys, scores, span, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn score_block_avx2(
    qs: &[f32],
    lens: &[usize],
    j0: usize,
    keys: &[f32],
    scores: &mut [f32],
    span: usize,
    scale: f32,
) {
    score_block_portable(qs, lens, j0, keys, scores, span, scale)
}

#[inline(always)]
fn score_block_portable(
    qs: &[f32],
    lens: &[usize],
    j0: usize,
    keys: &[f32],
    scores: &mut [f32],
    span: usize,
    scale: f32,
) {
    let d = qs.len() / lens.len();
    for (b, key) in keys.chunks_exact(d).enumerate() {
        let j = j0 + b;
        for (r, qv) in qs.chunks_exact(d).enumerate() {
            if j < lens[r] {
                scores[r * span + j] = dot_portable(qv, key) * scale;
            }
        }
    }
}

/// `out_r += scores[r, j] · value_j` for the values `j0..` of `values` that query `r` sees,
/// in order of `j`.
fn value_block(
    out: &mut [f32],
    lens: &[usize],
    j0: usize,
    values: &[f32],
    scores: &[f32],
    span: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if super::matmul::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { value_block_avx2(out, lens, j0, values, scores, span) };
    }
    value_block_portable(out, lens, j0, values, scores, span)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn value_block_avx2(
    out: &mut [f32],
    lens: &[usize],
    j0: usize,
    values: &[f32],
    scores: &[f32],
    span: usize,
) {
    value_block_portable(out, lens, j0, values, scores, span)
}

#[inline(always)]
fn value_block_portable(
    out: &mut [f32],
    lens: &[usize],
    j0: usize,
    values: &[f32],
    scores: &[f32],
    span: usize,
) {
    let d = out.len() / lens.len();
    for (b, value) in values.chunks_exact(d).enumerate() {
        let j = j0 + b;
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            if j < lens[r] {
                let p = scores[r * span + j];
                // A product then a sum (not fused), as every query's row has always been.
                for (a, &x) in o.iter_mut().zip(value) {
                    *a += p * x;
                }
            }
        }
    }
}

/// The queries of an [`attention`] call.
struct Rows<'a> {
    q: &'a [f32],
    hq: usize,
    hkv: usize,
    d: usize,
    pos0: usize,
    scale: f32,
}

impl Rows<'_> {
    /// Attention of the queries of tokens `tokens.0..tokens.0 + tokens.1` and group heads
    /// `heads.0..heads.0 + heads.1` of kv head `kvh` into `out`: `[tokens.1, hq, d]`, or the
    /// one row of a single query.
    fn attend(
        &self,
        out: &mut [f32],
        k: &KvStore,
        v: &KvStore,
        kvh: usize,
        tokens: (usize, usize),
        heads: (usize, usize),
    ) {
        let Rows {
            q,
            hq,
            hkv,
            d,
            pos0,
            scale,
        } = *self;
        let group = hq / hkv;
        let (t0, n) = tokens;
        let single = out.len() == d;
        // Query (token qi, head h) sees keys 0..len(qi); writes row at(qi, h) of `out`.
        let len = |qi: usize| pos0 + t0 + qi + 1;
        let at = |qi: usize, h: usize| if single { 0 } else { (qi * hq + h) * d };
        let span = len(n - 1);
        let queries: Vec<(usize, usize)> = (0..n)
            .flat_map(|qi| (heads.0..heads.0 + heads.1).map(move |g| (qi, kvh * group + g)))
            .collect();
        // The queries side by side, each with the keys it sees and an output row.
        let qs: Vec<f32> = queries
            .iter()
            .flat_map(|&(qi, h)| &q[((t0 + qi) * hq + h) * d..][..d])
            .copied()
            .collect();
        let lens: Vec<usize> = queries.iter().map(|&(qi, _)| len(qi)).collect();
        let mut os = vec![0.0f32; queries.len() * d];
        let mut scores = vec![0.0f32; queries.len() * span];
        let mut block = vec![0.0f32; KEY_BLOCK * d];
        let cache_rows = (kvh, hkv, span);
        k.for_each_block(cache_rows, d, &mut block, |j0, keys| {
            score_block(&qs, &lens, j0, keys, &mut scores, span, scale);
        });
        for (r, &l) in lens.iter().enumerate() {
            super::softmax_in_place(&mut scores[r * span..][..l]);
        }
        v.for_each_block(cache_rows, d, &mut block, |j0, values| {
            value_block(&mut os, &lens, j0, values, &scores, span);
        });
        for (&(qi, h), o) in queries.iter().zip(os.chunks_exact(d)) {
            out[at(qi, h)..][..d].copy_from_slice(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::KvFormat;

    #[test]
    fn single_key_returns_its_value_and_causality_holds() {
        // hq=2, hkv=1, d=2; two cached positions, query at position 0 sees only key 0.
        let q = [1.0, 0.0, 0.0, 1.0];
        let (mut k, mut v) = (KvStore::new(KvFormat::F32), KvStore::new(KvFormat::F32));
        k.append(&[1.0, 0.0, 0.0, 1.0], 2);
        v.append(&[1.0, 2.0, 10.0, 20.0], 2);
        let mut out = [0.0; 4];
        attention(&mut out, &q, &k, &v, 2, 1, 2, 0, 1.0);
        assert_eq!(out, [1.0, 2.0, 1.0, 2.0]);
        // query at position 1 mixes both values
        attention(&mut out, &q, &k, &v, 2, 1, 2, 1, 1.0);
        let e = std::f32::consts::E;
        let p0 = e / (e + 1.0); // head 0 prefers key 0
        assert!((out[0] - (p0 * 1.0 + (1.0 - p0) * 10.0)).abs() < 1e-5);
    }

    /// The tiled path (many queries) gives every query the bits it gets alone (one query per
    /// head, as a decode step), which speculative verification relies on.
    #[test]
    fn a_block_of_queries_gets_the_bits_of_each_query_alone() {
        let (hq, hkv, d, pos0, t) = (6, 2, 16, 5, 37);
        let mut seed = 7u32;
        let mut random = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let q = random(t * hq * d);
        let (mut k, mut v) = (KvStore::new(KvFormat::Int8), KvStore::new(KvFormat::Int8));
        k.append(&random((pos0 + t) * hkv * d), d);
        v.append(&random((pos0 + t) * hkv * d), d);
        let mut block = vec![0.0; t * hq * d];
        attention(&mut block, &q, &k, &v, hq, hkv, d, pos0, 0.25);
        for ti in 0..t {
            let mut alone = vec![0.0; hq * d];
            let qi = &q[ti * hq * d..][..hq * d];
            attention(&mut alone, qi, &k, &v, hq, hkv, d, pos0 + ti, 0.25);
            let same = alone
                .iter()
                .zip(&block[ti * hq * d..])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "token {ti} differs from its query alone");
        }
    }
}
