//! Causal grouped-query attention over a key/value cache.

use rayon::prelude::*;

use super::kv::KvStore;
use super::matmul::dot;

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
    out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
        let (ti, h) = (i / hq, i % hq);
        let kvh = h / group;
        let qv = &q[i * d..(i + 1) * d];
        let len = pos0 + ti + 1;
        let mut row = vec![0.0f32; d];
        let mut scores = vec![0.0f32; len];
        k.for_each_row(kvh, hkv, len, &mut row, |j, key| {
            scores[j] = dot(qv, key) * scale;
        });
        super::softmax_in_place(&mut scores);
        o.fill(0.0);
        v.for_each_row(kvh, hkv, len, &mut row, |j, value| {
            let p = scores[j];
            for (a, &b) in o.iter_mut().zip(value) {
                *a += p * b;
            }
        });
    });
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
}
