//! Gated DeltaNet: the causal conv in front of it and the gated delta rule, in its
//! recurrent (one token at a time) and chunked (prefill) forms.
//!
//! Shapes: `q`, `k` `[T, hk, dk]` (already L2-normalised, `q` scaled by `dk^-0.5`), `v`
//! `[T, hv, dv]`, `g` (log decay, ≤ 0) and `beta` `[T, hv]`, recurrent state `[hv, dk, dv]` f32,
//! output `[T, hv, dv]`. Value head `h` reads key head `h / (hv/hk)`.

use rayon::prelude::*;

use super::activation::silu;

/// Chunk length of the chunked form (transformers and FLA use 64).
pub const GDN_CHUNK: usize = 64;

/// Head counts and head dims of one GDN layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub v_order: VHeadOrder,
}

/// Which key head each value head reads (model-spec §0.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VHeadOrder {
    /// HF and MLX: value head `h` reads key head `h / (hv/hk)` (`repeat_interleave`).
    #[default]
    Grouped,
    /// GGUF: the converter reorders value heads so that head `h` reads key head `h % hk`.
    Tiled,
}

impl GdnDims {
    /// Key head read by value head `h`.
    #[inline]
    pub fn key_head(&self, h: usize) -> usize {
        match self.v_order {
            VHeadOrder::Grouped => h / (self.hv / self.hk),
            VHeadOrder::Tiled => h % self.hk,
        }
    }

    /// Size of one sequence's recurrent state.
    pub fn state_len(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}

/// Depthwise causal conv over time followed by SiLU.
///
/// `x`, `out` `[T, C]`; `w` `[C, K]` (weight `j` multiplies input `t-K+1+j`); `state`
/// `[K-1, C]` holds the previous `K-1` inputs, oldest first, and is advanced past `x`.
pub fn causal_conv1d_silu(out: &mut [f32], x: &[f32], state: &mut [f32], w: &[f32]) {
    // w is [C, K] and state [K-1, C], so C = |w| - |state|.
    let channels = w.len() - state.len();
    let k = w.len() / channels;
    assert_eq!(
        state.len(),
        (k - 1) * channels,
        "conv state must be [K-1, C]"
    );
    let t = x.len() / channels;
    let mut ext = Vec::with_capacity(state.len() + x.len());
    ext.extend_from_slice(state);
    ext.extend_from_slice(x);
    for ti in 0..t {
        let o = &mut out[ti * channels..(ti + 1) * channels];
        for (ch, ov) in o.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += w[ch * k + j] * ext[(ti + j) * channels + ch];
            }
            *ov = silu(acc);
        }
    }
    state.copy_from_slice(&ext[t * channels..]);
}

/// The gated delta rule one token at a time (decode, and the reference for the chunked form).
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent(
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    dims: GdnDims,
) {
    let head = pick(recurrent_head, |sc, h, s, o| unsafe {
        recurrent_head_avx2(sc, h, s, o)
    });
    scan(out, Scan::new(q, k, v, g, beta, dims), state, head);
}

/// The gated delta rule over chunks of [`GDN_CHUNK`] tokens (prefill). Equal to
/// [`gdn_recurrent`] in exact arithmetic; see model-spec §2.4 for the derivation.
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunked(
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    dims: GdnDims,
) {
    let head = pick(chunked_head, |sc, h, s, o| unsafe {
        chunked_head_avx2(sc, h, s, o)
    });
    scan(out, Scan::new(q, k, v, g, beta, dims), state, head);
}

/// Checks the shapes, then runs `head` over every value head.
fn scan(out: &mut [f32], sc: Scan, state: &mut [f32], head: HeadFn) {
    check_shapes(out, sc.q, sc.k, sc.v, sc.beta, state, sc.dims, sc.t);
    for_each_head(out, state, &sc, head);
}

/// Inputs of one scan, shared by all heads.
#[derive(Clone, Copy)]
struct Scan<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    dims: GdnDims,
    t: usize,
}

impl<'a> Scan<'a> {
    fn new(
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        g: &'a [f32],
        beta: &'a [f32],
        dims: GdnDims,
    ) -> Self {
        Self {
            q,
            k,
            v,
            g,
            beta,
            dims,
            t: g.len() / dims.hv,
        }
    }
}

/// One value head's scan: reads `Scan`, updates its state `s` `[dk, dv]`, writes `o` `[T, dv]`.
type HeadFn = fn(&Scan, usize, &mut [f32], &mut [f32]);

/// The AVX2 + FMA build of a head function when the CPU has them.
fn pick(portable: HeadFn, avx2: HeadFn) -> HeadFn {
    #[cfg(target_arch = "x86_64")]
    if super::matmul::has_avx2_fma() {
        return avx2;
    }
    let _ = avx2;
    portable
}

/// Recurrent form for one head.
#[inline(always)]
fn recurrent_head(sc: &Scan, h: usize, s: &mut [f32], o: &mut [f32]) {
    let Scan {
        q,
        k,
        v,
        g,
        beta,
        dims,
        t,
    } = *sc;
    let GdnDims { hk, hv, dk, dv, .. } = dims;
    let kh = dims.key_head(h);
    let mut delta = vec![0.0f32; dv];
    for ti in 0..t {
        let qv = &q[(ti * hk + kh) * dk..][..dk];
        let kv = &k[(ti * hk + kh) * dk..][..dk];
        let vv = &v[(ti * hv + h) * dv..][..dv];
        let decay = g[ti * hv + h].exp();
        let b = beta[ti * hv + h];
        for x in s.iter_mut() {
            *x *= decay;
        }
        delta.copy_from_slice(vv);
        for (i, &ki) in kv.iter().enumerate() {
            for (d, &sv) in delta.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *d -= sv * ki;
            }
        }
        for d in delta.iter_mut() {
            *d *= b;
        }
        let ov = &mut o[ti * dv..(ti + 1) * dv];
        for (i, (&ki, &qi)) in kv.iter().zip(qv).enumerate() {
            let row = &mut s[i * dv..(i + 1) * dv];
            for ((sv, &d), ov) in row.iter_mut().zip(&delta).zip(ov.iter_mut()) {
                *sv += ki * d;
                *ov += *sv * qi;
            }
        }
    }
}

/// Chunked form for one head.
#[inline(always)]
fn chunked_head(sc: &Scan, h: usize, s: &mut [f32], o: &mut [f32]) {
    let Scan {
        q,
        k,
        v,
        g,
        beta,
        dims,
        t,
    } = *sc;
    let GdnDims { hk, hv, dk, dv, .. } = dims;
    let kh = dims.key_head(h);
    let c = GDN_CHUNK;
    // Per-chunk scratch, reused.
    let mut gam = vec![0.0f32; c];
    let mut kb = vec![0.0f32; c * dk];
    let mut a = vec![0.0f32; c * c];
    let mut u = vec![0.0f32; c * dv];
    let mut w = vec![0.0f32; c * dk];
    let mut vn = vec![0.0f32; c * dv];
    // Range of token `ti`'s key head in `q` / `k`.
    let qk = |ti: usize| (ti * hk + kh) * dk..(ti * hk + kh + 1) * dk;
    for c0 in (0..t).step_by(c) {
        let l = c.min(t - c0);
        // Γ: cumulative log decay inside the chunk.
        let mut acc = 0.0f32;
        for i in 0..l {
            acc += g[(c0 + i) * hv + h];
            gam[i] = acc;
        }
        for i in 0..l {
            let b = beta[(c0 + i) * hv + h];
            let ki = &k[qk(c0 + i)];
            for (dst, &x) in kb[i * dk..(i + 1) * dk].iter_mut().zip(ki) {
                *dst = b * x;
            }
        }
        // A[i][j] = (β_i k_i · k_j) e^{Γ_i-Γ_j}, strictly lower.
        for i in 0..l {
            for j in 0..i {
                let kj = &k[qk(c0 + j)];
                a[i * c + j] = super::dot(&kb[i * dk..(i + 1) * dk], kj) * (gam[i] - gam[j]).exp();
            }
        }
        // Forward substitution: (I + A) U = βV, (I + A) W = βK e^Γ.
        for i in 0..l {
            let b = beta[(c0 + i) * hv + h];
            let vi = &v[((c0 + i) * hv + h) * dv..][..dv];
            let eg = gam[i].exp();
            for d in 0..dv {
                u[i * dv + d] = b * vi[d];
            }
            for d in 0..dk {
                w[i * dk + d] = kb[i * dk + d] * eg;
            }
            for j in 0..i {
                let aij = a[i * c + j];
                for d in 0..dv {
                    u[i * dv + d] -= aij * u[j * dv + d];
                }
                for d in 0..dk {
                    w[i * dk + d] -= aij * w[j * dk + d];
                }
            }
        }
        // Vn = U - W S.
        for i in 0..l {
            let vni = &mut vn[i * dv..(i + 1) * dv];
            vni.copy_from_slice(&u[i * dv..(i + 1) * dv]);
            for r in 0..dk {
                let wr = w[i * dk + r];
                for (x, &sv) in vni.iter_mut().zip(&s[r * dv..(r + 1) * dv]) {
                    *x -= wr * sv;
                }
            }
        }
        // O_i = e^{Γ_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{Γ_i-Γ_j} Vn_j.
        for i in 0..l {
            let qi = &q[qk(c0 + i)];
            let oi = &mut o[(c0 + i) * dv..(c0 + i + 1) * dv];
            let eg = gam[i].exp();
            for (r, &qr) in qi.iter().enumerate() {
                let f = qr * eg;
                for (x, &sv) in oi.iter_mut().zip(&s[r * dv..(r + 1) * dv]) {
                    *x += f * sv;
                }
            }
            for j in 0..=i {
                let kj = &k[qk(c0 + j)];
                let f = super::dot(qi, kj) * (gam[i] - gam[j]).exp();
                for (x, &y) in oi.iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *x += f * y;
                }
            }
        }
        // S = e^{Γ_L} S + Σ_j e^{Γ_L-Γ_j} k_j ⊗ Vn_j.
        let last = gam[l - 1];
        let el = last.exp();
        for x in s.iter_mut() {
            *x *= el;
        }
        for j in 0..l {
            let kj = &k[qk(c0 + j)];
            let f = (last - gam[j]).exp();
            for (r, &kr) in kj.iter().enumerate() {
                let fk = f * kr;
                for (x, &y) in s[r * dv..(r + 1) * dv]
                    .iter_mut()
                    .zip(&vn[j * dv..(j + 1) * dv])
                {
                    *x += fk * y;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_head_avx2(sc: &Scan, h: usize, s: &mut [f32], o: &mut [f32]) {
    recurrent_head(sc, h, s, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunked_head_avx2(sc: &Scan, h: usize, s: &mut [f32], o: &mut [f32]) {
    chunked_head(sc, h, s, o)
}

#[allow(clippy::too_many_arguments)]
fn check_shapes(
    out: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    state: &[f32],
    dims: GdnDims,
    t: usize,
) {
    let GdnDims { hk, hv, dk, dv, .. } = dims;
    assert!(
        hv % hk == 0,
        "value heads {hv} not a multiple of key heads {hk}"
    );
    assert_eq!(q.len(), t * hk * dk);
    assert_eq!(k.len(), t * hk * dk);
    assert_eq!(v.len(), t * hv * dv);
    assert_eq!(beta.len(), t * hv);
    assert_eq!(out.len(), t * hv * dv);
    assert_eq!(state.len(), dims.state_len());
}

/// Runs `head` for every value head in parallel, each with a zeroed `[T, dv]` output, then
/// writes the heads' outputs into `out` `[T, hv, dv]`.
fn for_each_head(out: &mut [f32], state: &mut [f32], scan: &Scan, head: HeadFn) {
    let GdnDims { hv, dk, dv, .. } = scan.dims;
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, s)| {
            let mut o = vec![0.0f32; scan.t * dv];
            head(scan, h, s, &mut o);
            o
        })
        .collect();
    for (h, o) in per_head.iter().enumerate() {
        for (ti, row) in o.chunks_exact(dv).enumerate() {
            out[(ti * hv + h) * dv..][..dv].copy_from_slice(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::l2_norm_rows;

    struct Inputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        state: Vec<f32>,
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    fn inputs(t: usize, dims: GdnDims, seed: u64) -> Inputs {
        let GdnDims { hk, hv, dk, dv, .. } = dims;
        let mut s = seed;
        let mut r = |n: usize| (0..n).map(|_| lcg(&mut s)).collect::<Vec<f32>>();
        let mut q = r(t * hk * dk);
        let mut k = r(t * hk * dk);
        l2_norm_rows(&mut q, dk, 1e-6);
        l2_norm_rows(&mut k, dk, 1e-6);
        let scale = (dk as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= scale);
        let v = r(t * hv * dv);
        let g = r(t * hv).iter().map(|x| -(x.abs() * 2.0)).collect();
        let beta = r(t * hv).iter().map(|x| 0.5 + 0.5 * x).collect();
        let state = r(dims.state_len());
        Inputs {
            q,
            k,
            v,
            g,
            beta,
            state,
        }
    }

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    #[test]
    fn chunked_equals_recurrent() {
        let cases = [VHeadOrder::Grouped, VHeadOrder::Tiled].map(|v_order| GdnDims {
            hk: 2,
            hv: 4,
            dk: 16,
            dv: 8,
            v_order,
        });
        for (dims, t) in cases
            .into_iter()
            .flat_map(|d| [1, 5, 64, 65, 150].map(|t| (d, t)))
        {
            let inp = inputs(t, dims, t as u64);
            let mut s1 = inp.state.clone();
            let mut s2 = inp.state.clone();
            let mut o1 = vec![f32::NAN; t * dims.hv * dims.dv];
            let mut o2 = vec![f32::NAN; t * dims.hv * dims.dv];
            gdn_recurrent(
                &mut o1, &inp.q, &inp.k, &inp.v, &inp.g, &inp.beta, &mut s1, dims,
            );
            gdn_chunked(
                &mut o2, &inp.q, &inp.k, &inp.v, &inp.g, &inp.beta, &mut s2, dims,
            );
            assert!(
                max_rel(&o2, &o1) < 1e-5,
                "t={t} output rel err {}",
                max_rel(&o2, &o1)
            );
            assert!(
                max_rel(&s2, &s1) < 1e-5,
                "t={t} state rel err {}",
                max_rel(&s2, &s1)
            );
        }
    }

    #[test]
    fn recurrent_in_pieces_equals_one_pass() {
        let dims = GdnDims {
            hk: 1,
            hv: 2,
            dk: 8,
            dv: 4,
            v_order: VHeadOrder::Grouped,
        };
        let t = 9;
        let inp = inputs(t, dims, 7);
        let mut s1 = inp.state.clone();
        let mut o1 = vec![0.0; t * 8];
        gdn_recurrent(
            &mut o1, &inp.q, &inp.k, &inp.v, &inp.g, &inp.beta, &mut s1, dims,
        );
        let mut s2 = inp.state.clone();
        let mut o2 = vec![0.0; t * 8];
        let split = 4;
        gdn_chunked(
            &mut o2[..split * 8],
            &inp.q[..split * 8],
            &inp.k[..split * 8],
            &inp.v[..split * 8],
            &inp.g[..split * 2],
            &inp.beta[..split * 2],
            &mut s2,
            dims,
        );
        gdn_chunked(
            &mut o2[split * 8..],
            &inp.q[split * 8..],
            &inp.k[split * 8..],
            &inp.v[split * 8..],
            &inp.g[split * 2..],
            &inp.beta[split * 2..],
            &mut s2,
            dims,
        );
        assert!(max_rel(&o2, &o1) < 1e-5);
        assert!(max_rel(&s2, &s1) < 1e-5);
    }

    #[test]
    fn conv_in_pieces_equals_one_pass() {
        let (c, k, t) = (3, 4, 6);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..t * c).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut s1 = vec![0.0; (k - 1) * c];
        let mut o1 = vec![0.0; t * c];
        causal_conv1d_silu(&mut o1, &x, &mut s1, &w);
        let mut s2 = vec![0.0; (k - 1) * c];
        let mut o2 = vec![0.0; t * c];
        causal_conv1d_silu(&mut o2[..2 * c], &x[..2 * c], &mut s2, &w);
        causal_conv1d_silu(&mut o2[2 * c..], &x[2 * c..], &mut s2, &w);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        // first output sees only the current input: silu(w[c][K-1] * x[0][c])
        assert!((o1[0] - silu(w[k - 1] * x[0])).abs() < 1e-7);
    }
}
