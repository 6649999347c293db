//! Picking the best entries of a logits row: the argmax of greedy decoding and the top-k of
//! sampling and of DFlash2's candidate selector. A row of the real vocabulary has 248,320
//! entries and a speculative step picks from about thirty rows, so both avoid sorting or
//! allocating the whole row: one pass, vectorisable where it can be.

/// Index of the largest value, the first one on ties (a NaN in front wins, as a scan that
/// only moves on strictly greater values leaves it; NaNs elsewhere never win).
pub fn argmax(x: &[f32]) -> u32 {
    let Some(&first) = x.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    // The maximum over 16 lanes (f32::max skips NaN), then its first position.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    x.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Beyond this many, [`top_k`] selects by a partial sort of every entry instead of keeping a
/// sorted buffer of the best so far (whose insertions cost up to `k` moves each).
const BUFFERED_TOP_K: usize = 64;

/// The `k` largest of `entries` (`(id, value)`, ids ascending), best first; ties keep the
/// lower id first. Values must not be NaN.
pub fn top_k(entries: impl Iterator<Item = (u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    let better = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k == 0 {
        return Vec::new();
    }
    if k > BUFFERED_TOP_K {
        let mut all: Vec<(u32, f32)> = entries.collect();
        if k < all.len() {
            all.select_nth_unstable_by(k - 1, better);
            all.truncate(k);
        }
        all.sort_unstable_by(better);
        return all;
    }
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for e in entries {
        // Ids come in ascending order: an entry equal to the worst kept one loses the tie.
        if best.len() == k && e.1 <= best[k - 1].1 {
            continue;
        }
        let at = best.partition_point(|b| better(b, &e).is_lt());
        best.insert(at, e);
        best.truncate(k);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_argmax(x: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &v) in x.iter().enumerate() {
            if v > x[best] {
                best = i;
            }
        }
        best as u32
    }

    fn reference_top_k(x: &[(u32, f32)], k: usize) -> Vec<(u32, f32)> {
        let mut all = x.to_vec();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
        all
    }

    /// Rows with many ties (values on a coarse grid), infinities and every length around the
    /// 16-lane chunks.
    fn rows() -> Vec<Vec<f32>> {
        let mut s = 7u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut rows = Vec::new();
        for len in [1usize, 2, 15, 16, 17, 33, 1000] {
            rows.push((0..len).map(|_| (next() % 9) as f32 - 4.0).collect());
            rows.push((0..len).map(|_| (next() % 1000) as f32 * 0.37).collect());
        }
        rows.push(vec![f32::NEG_INFINITY; 40]);
        let mut r = vec![1.0f32; 40];
        r[23] = f32::INFINITY;
        rows.push(r);
        rows
    }

    #[test]
    fn argmax_is_the_first_largest() {
        for row in rows() {
            assert_eq!(argmax(&row), reference_argmax(&row), "{row:?}");
        }
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0, 5.0]), 2);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn top_k_keeps_the_best_in_order_and_lower_ids_on_ties() {
        for row in rows() {
            let entries: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as u32, v))
                .collect();
            for k in [1usize, 3, 16, 20, 64, 65, 200] {
                assert_eq!(
                    top_k(entries.iter().copied(), k),
                    reference_top_k(&entries, k),
                    "k={k} {row:?}"
                );
            }
        }
    }
}
