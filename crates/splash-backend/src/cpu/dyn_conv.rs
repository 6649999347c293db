//! The grouped dynamic causal convolution of DFlash2 (model-spec §4.3): a depthwise conv
//! over time inside one block whose taps are a static per-channel kernel plus a per-token,
//! per-group dynamic kernel.

/// `out[t,c] = Σ_{o<K} (base[o,c] + dynamic[t,o,c/group]) · x[t-o,c]`, with `x[<0] = 0`.
///
/// `x`, `out` `[T, H]`; `base` `[K, H]` (`K = kernel`); `dynamic` `[T, K, H/group]`.
pub fn grouped_dynamic_conv(
    out: &mut [f32],
    x: &[f32],
    dynamic: &[f32],
    base: &[f32],
    kernel: usize,
    group: usize,
) {
    let k = kernel;
    let h = base.len() / k;
    assert_eq!(base.len(), k * h, "base kernel must be [K, H]");
    assert!(
        h > 0 && h.is_multiple_of(group),
        "hidden {h} not a multiple of group {group}"
    );
    let groups = h / group;
    let t = x.len() / h;
    assert_eq!(out.len(), x.len());
    assert_eq!(
        dynamic.len(),
        t * k * groups,
        "dynamic kernel must be [T, K, H/group]"
    );
    for ti in 0..t {
        let o = &mut out[ti * h..(ti + 1) * h];
        o.fill(0.0);
        for off in 0..k.min(ti + 1) {
            let xs = &x[(ti - off) * h..(ti - off + 1) * h];
            let dynrow = &dynamic[(ti * k + off) * groups..][..groups];
            let b = &base[off * h..(off + 1) * h];
            for c in 0..h {
                o[c] += (b[c] + dynrow[c / group]) * xs[c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_reach_back_within_the_block_only() {
        // H = 2 channels, group 1, K = 2, T = 2.
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let base = [1.0f32, 1.0, 0.5, 0.5];
        let dynamic = [0.0f32, 0.0, 100.0, 100.0, 1.0, 0.0, 0.0, 1.0];
        let mut out = [0.0f32; 4];
        grouped_dynamic_conv(&mut out, &x, &dynamic, &base, 2, 1);
        // t=0: only offset 0 (offset 1 would read x[-1] = 0, the 100s never count).
        assert_eq!(&out[..2], &[1.0, 2.0]);
        // t=1: (1+1)·3 + (0.5+0)·1 = 6.5; (1+0)·4 + (0.5+1)·2 = 7.
        assert_eq!(&out[2..], &[6.5, 7.0]);
    }
}
