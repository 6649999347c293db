//! Every CUDA op against its CPU definition on fresh random inputs, outputs poisoned with NaN
//! first (an unwritten element fails). Needs a GPU: skipped without one unless
//! `SPLASH_REQUIRE_GPU` is set (the GPU machine's run sets it).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use half::{bf16, f16};
use splash_backend::cpu::{self, GdnDims, KvFormat, KvStore, Rope, VHeadOrder};
use splash_backend::cuda::{self as dev, ptr, DeviceWeight, Gpu, KernelDims, Kernels};
use splash_backend::ggml::GgmlType;
use splash_backend::{DType, HostBytes, Weight};

fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            assert!(
                std::env::var_os("SPLASH_REQUIRE_GPU").is_none(),
                "SPLASH_REQUIRE_GPU is set but no GPU is usable: {e}"
            );
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Changes one of `gpu`'s options for what the test runs next.
fn tune(gpu: &Gpu, change: impl FnOnce(&mut dev::GpuOptions)) {
    let mut options = gpu.options();
    change(&mut options);
    gpu.set_options(options);
}

/// xorshift values in [-1, 1).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn bytes_of<T: bytemuck::Pod>(v: &[T]) -> HostBytes {
    HostBytes::from_vec(bytemuck::cast_slice(v).to_vec())
}

/// Largest |a - b| relative to the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-20);
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        if x.is_nan() {
            f32::INFINITY
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

/// The bit patterns of `v`, for exact comparisons.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn poisoned(gpu: &Gpu, n: usize) -> cudarc::driver::CudaSlice<f32> {
    gpu.upload(&vec![f32::NAN; n]).unwrap()
}

const FIXTURE_DIMS: KernelDims = KernelDims {
    head_dim: 32,
    gdn_dk: 16,
    gdn_dv: 16,
};
const REAL_DIMS: KernelDims = KernelDims {
    head_dim: 256,
    gdn_dk: 128,
    gdn_dv: 128,
};

/// Weights of every format the CUDA kernels read, `[n, k]`.
/// (Floats first; the block formats need `k` a multiple of 256.)
fn weights(n: usize, k: usize, seed: u64) -> Vec<(String, Weight)> {
    let vals = random(n * k, seed);
    let mut out = vec![("f32".to_string(), Weight::from_f32(vec![n, k], &vals))];
    let b: Vec<u16> = vals.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    out.push((
        "bf16".into(),
        Weight::new(DType::BF16, vec![n, k], bytes_of(&b)).unwrap(),
    ));
    let h: Vec<u16> = vals.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    out.push((
        "f16".into(),
        Weight::new(DType::F16, vec![n, k], bytes_of(&h)).unwrap(),
    ));
    if !k.is_multiple_of(256) {
        return out;
    }
    for (bits, group) in [(4u32, 64usize), (8, 32)] {
        let per_word = 32 / bits as usize;
        let codes: Vec<u32> = random(n * k / per_word, seed + bits as u64)
            .iter()
            .map(|v| v.to_bits().wrapping_mul(2_654_435_761))
            .collect();
        let g = n * k / group;
        let sc: Vec<u16> = random(g, seed + 7)
            .iter()
            .map(|v| bf16::from_f32(0.01 + 0.02 * v.abs()).to_bits())
            .collect();
        let bi: Vec<u16> = random(g, seed + 8)
            .iter()
            .map(|v| bf16::from_f32(0.1 * v).to_bits())
            .collect();
        let scales = Weight::new(DType::BF16, vec![n, k / group], bytes_of(&sc)).unwrap();
        let biases = Weight::new(DType::BF16, vec![n, k / group], bytes_of(&bi)).unwrap();
        let w = Weight::affine(vec![n, k], bits, group, bytes_of(&codes), scales, biases).unwrap();
        out.push((format!("affine{bits}"), w));
    }
    // GGML blocks: random bytes with sane fp16 scale fields, as make_dequant_fixture.py makes.
    for (t, fp16_fields) in [
        (GgmlType::Q4_0, &[0usize][..]),
        (GgmlType::Q4_1, &[0, 2]),
        (GgmlType::Q5_0, &[0]),
        (GgmlType::Q5_1, &[0, 2]),
        (GgmlType::Q8_0, &[0]),
        (GgmlType::IQ4_NL, &[0]),
        (GgmlType::Q2_K, &[80, 82]),
        (GgmlType::Q3_K, &[108]),
        (GgmlType::Q4_K, &[0, 2]),
        (GgmlType::Q5_K, &[0, 2]),
        (GgmlType::Q6_K, &[208]),
        (GgmlType::IQ4_XS, &[0]),
    ] {
        let row = t.row_bytes(k);
        let mut raw: Vec<u8> = random(n * row, seed + t.id() as u64)
            .iter()
            .map(|v| (v.to_bits() >> 9) as u8)
            .collect();
        let scales = random(n * row / t.block_bytes() * fp16_fields.len(), seed + 99);
        let mut si = 0;
        for block in raw.chunks_exact_mut(t.block_bytes()) {
            for &off in fp16_fields {
                let v = f16::from_f32(0.001 + 0.05 * scales[si].abs()).to_le_bytes();
                block[off..off + 2].copy_from_slice(&v);
                si += 1;
            }
        }
        out.push((
            t.to_string(),
            Weight::new(DType::Ggml(t), vec![n, k], HostBytes::from_vec(raw)).unwrap(),
        ));
    }
    out
}

/// Rows `row0..row0 + rows` of `W · x` for `t` tokens of `x` (on the device), as the GPU
/// computes them into a poisoned output.
#[allow(clippy::too_many_arguments)]
fn gpu_matmul(
    gpu: &Gpu,
    k: &Kernels,
    w: &DeviceWeight,
    x: u64,
    row0: usize,
    rows: usize,
    t: usize,
) -> Vec<f32> {
    let out = poisoned(gpu, t * rows);
    dev::matmul(gpu, k, ptr(gpu, &out, 0), x, w, row0, rows, t).unwrap();
    gpu.download(&out, t * rows).unwrap()
}

#[test]
fn matmul_every_format_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (n, kd) = (67, 512);
    for (name, w) in weights(n, kd, 3) {
        let dw = gpu.upload_weight(&w).unwrap();
        // 1-20 tokens: the GEMV kernels (f32, then f16 activations on tensor cores for Q4_K and
        // Q6_K, int8 ones by dp4a for the other integer formats; 20 in two launches); 64: the
        // cuBLAS GEMM in f32 (exact), then in bf16.
        for (t, exact) in [
            (1, true),
            (3, true),
            (8, true),
            (13, true),
            (1, false),
            (2, false),
            (13, false),
            (16, false),
            (20, false),
            (64, true),
            (64, false),
        ] {
            gpu.set_exact(exact);
            let tol = if exact { 1e-5 } else { 1e-2 };
            let x = random(t * kd, t as u64);
            let mut want = vec![0.0f32; t * n];
            cpu::matmul(&mut want, &x, &w);
            let xd = gpu.upload(&x).unwrap();
            let xp = ptr(&gpu, &xd, 0);
            let err = rel_err(&gpu_matmul(&gpu, &k, &dw, xp, 0, n, t), &want);
            assert!(
                err < tol,
                "{name} t={t} exact={exact}: relative error {err}"
            );
            // The draft's product (bf16 weights by cuBLAS from two tokens).
            let out = poisoned(&gpu, t * n);
            let xa = dev::Activations::new(xp, t, kd);
            dev::matmul_batched(&gpu, &k, ptr(&gpu, &out, 0), &xa, &dw, 0, n).unwrap();
            let err = rel_err(&gpu.download(&out, t * n).unwrap(), &want);
            assert!(err < tol, "{name} t={t} exact={exact}: batched {err}");
            // A row range (an expert of a stacked tensor; tiled formats start on a tile).
            let want_rows: Vec<f32> = (0..t)
                .flat_map(|ti| want[ti * n + 32..ti * n + 52].to_vec())
                .collect();
            let err = rel_err(&gpu_matmul(&gpu, &k, &dw, xp, 32, 20, t), &want_rows);
            assert!(err < tol, "{name} t={t}: rows 32..52, relative error {err}");
        }
    }
    gpu.set_exact(false);
    // Float rows that end in a partial 32-value sub-block (the MoE fixture's shared expert).
    for (name, w) in weights(9, 48, 4).into_iter().take(3) {
        let dw = gpu.upload_weight(&w).unwrap();
        let x = random(2 * 48, 9);
        let mut want = vec![0.0f32; 2 * 9];
        cpu::matmul(&mut want, &x, &w);
        let xd = gpu.upload(&x).unwrap();
        let got = gpu_matmul(&gpu, &k, &dw, ptr(&gpu, &xd, 0), 0, 9, 2);
        assert!(rel_err(&got, &want) < 1e-5, "{name} K=48");
    }
}

/// Every GEMV family of the 4-bit checkpoints' k-quants at a real row length (its warps split
/// the row's 10 blocks unevenly): close to the CPU, and each token's row bit-identical to that
/// token multiplied alone, so verify blocks and batched passes reproduce decoding.
#[test]
fn tensor_core_gemv_is_batch_invariant() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (n, kd) = (100, 2560);
    // A block per tile, stream-K (tiles cut between blocks), and the int8 families (lone
    // tokens of the int8 tensor-core family run its dp4a build).
    use dev::TiledGemv::{Int8, Int8Mma, Int8MmaQ4K, TensorCores};
    for (family, stream_k) in [
        (TensorCores, false),
        (TensorCores, true),
        (Int8, false),
        (Int8Mma, false),
        (Int8MmaQ4K, false),
    ] {
        tune(&gpu, |o| {
            o.stream_k = stream_k;
            o.tiled_gemv = family;
        });
        // Activations rounded to int8 (per 32 or 256 values) rather than f16.
        let tol = if family == TensorCores { 5e-3 } else { 1e-2 };
        for (name, w) in weights(n, kd, 5) {
            if name != "Q4_K" && name != "Q6_K" {
                continue;
            }
            let dw = gpu.upload_weight(&w).unwrap();
            let product = |x: &[f32], t: usize| {
                let xd = gpu.upload(x).unwrap();
                gpu_matmul(&gpu, &k, &dw, ptr(&gpu, &xd, 0), 0, n, t)
            };
            // 17 and 20: two launches reading one conversion at a 16-token group's start.
            for t in [1, 5, 8, 9, 16, 17, 20] {
                // Rows of very different magnitudes: each token has its own f16 scale.
                let mut x = random(t * kd, 40 + t as u64);
                for (ti, row) in x.chunks_mut(kd).enumerate() {
                    row.iter_mut()
                        .for_each(|v| *v *= 1e3f32.powi(ti as i32 % 3 - 1));
                }
                let mut want = vec![0.0f32; t * n];
                cpu::matmul(&mut want, &x, &w);
                let got = product(&x, t);
                for ti in 0..t {
                    let rows = ti * n..(ti + 1) * n;
                    let err = rel_err(&got[rows.clone()], &want[rows.clone()]);
                    assert!(
                        err < tol,
                        "{name} {family:?} t={t} token {ti} stream-K {stream_k}: relative error {err}"
                    );
                    let alone = product(&x[ti * kd..(ti + 1) * kd], 1);
                    let same = alone
                        .iter()
                        .zip(&got[rows])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{name} {family:?} t={t} token {ti} stream-K {stream_k}: differs from the token alone"
                    );
                }
            }
        }
    }
    tune(&gpu, |o| {
        o.stream_k = false;
        o.tiled_gemv = TensorCores;
    });
}

/// Two products of one input from one stacked weight (`matmul_pair`): each part gets the bits
/// of the product over its own row range, at decode and verify token counts and past the
/// cuBLAS threshold.
#[test]
fn a_stacked_pair_matches_its_row_ranges() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (split, rest, kd) = (48, 64, 512);
    for (name, w) in weights(split + rest, kd, 9) {
        // The tensor-core formats, and the int8 ones (one dp4a launch for both parts).
        if !["Q4_K", "Q6_K", "Q8_0", "Q5_K"].contains(&name.as_str()) {
            continue;
        }
        let dw = gpu.upload_weight(&w).unwrap();
        for t in [1, 5, 16, 40] {
            let xd = gpu.upload(&random(t * kd, 3 + t as u64)).unwrap();
            let xp = ptr(&gpu, &xd, 0);
            let (a, b) = (poisoned(&gpu, t * split), poisoned(&gpu, t * rest));
            let out = (ptr(&gpu, &a, 0), ptr(&gpu, &b, 0));
            let xa = dev::Activations::new(xp, t, kd);
            dev::matmul_pair(&gpu, &k, out, &xa, &dw, split).unwrap();
            let got = [
                gpu.download(&a, t * split).unwrap(),
                gpu.download(&b, t * rest).unwrap(),
            ];
            let want = [
                gpu_matmul(&gpu, &k, &dw, xp, 0, split, t),
                gpu_matmul(&gpu, &k, &dw, xp, split, rest, t),
            ];
            for (part, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name} t={t}: part {part} differs from its row range"
                );
            }
        }
    }
}

/// The MLP's down product of the gated values (`matmul_swiglu`): for every format the bits
/// of `silu_mul` then `matmul` (the tensor-core formats convert silu(g)·u in one kernel, the
/// others take the two launches), at decode and verify token counts and past cuBLAS's.
#[test]
fn the_gated_down_product_has_the_bits_of_silu_then_matmul() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (n, kd) = (48, 512);
    for (name, w) in weights(n, kd, 11) {
        let dw = gpu.upload_weight(&w).unwrap();
        // 64 tokens: cuBLAS, its input converted to bf16 with the gating (silu_mul_to_bf16).
        for t in [1, 5, 16, 40, 64] {
            let (g, u) = (random(t * kd, 5 + t as u64), random(t * kd, 6 + t as u64));
            let (gd, ud) = (gpu.upload(&g).unwrap(), gpu.upload(&u).unwrap());
            let out = poisoned(&gpu, t * n);
            let (gp, up) = (ptr(&gpu, &gd, 0), ptr(&gpu, &ud, 0));
            dev::matmul_swiglu(&gpu, &k, ptr(&gpu, &out, 0), gp, up, &dw, t).unwrap();
            let got = gpu.download(&out, t * n).unwrap();
            let gd2 = gpu.upload(&g).unwrap();
            dev::silu_mul(&gpu, &k, ptr(&gpu, &gd2, 0), up, t * kd).unwrap();
            let want = gpu_matmul(&gpu, &k, &dw, ptr(&gpu, &gd2, 0), 0, n, t);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} t={t}: the gated product differs from silu_mul then matmul"
            );
        }
    }
}

/// The norms that write cuBLAS's bf16 input as they write their rows (prefill passes:
/// `add_rms_norm_to_bf16`, `rms_norm_gated_to_bf16`) give the products the bits of the norm,
/// then the product converting its own input.
#[test]
fn the_norms_with_their_bf16_conversion_have_the_bits_of_the_separate_kernels() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (n, kd, t) = (48, 512, 64);
    for (name, w) in weights(n, kd, 13) {
        let dw = gpu.upload_weight(&w).unwrap();
        let (x, y, nw) = (random(t * kd, 1), random(t * kd, 2), random(kd, 3));
        let (yd, nwd) = (gpu.upload(&y).unwrap(), gpu.upload(&nw).unwrap());
        let (yp, nwp) = (ptr(&gpu, &yd, 0), ptr(&gpu, &nwd, 0));
        // The residual add and norm.
        let (x1, x2) = (gpu.upload(&x).unwrap(), gpu.upload(&x).unwrap());
        let (n1, n2) = (poisoned(&gpu, t * kd), poisoned(&gpu, t * kd));
        let (o1, o2) = (poisoned(&gpu, t * n), poisoned(&gpu, t * n));
        let a = dev::add_rms_norm_activations(
            &gpu,
            &k,
            ptr(&gpu, &n1, 0),
            ptr(&gpu, &x1, 0),
            dev::Addend::Rows(yp),
            nwp,
            t,
            kd,
            1e-6,
            dev::NextProducts::Weights(&dw, None),
        )
        .unwrap();
        dev::matmul_activations(&gpu, &k, ptr(&gpu, &o1, 0), &a, &dw, 0, n).unwrap();
        let (x2p, n2p) = (ptr(&gpu, &x2, 0), ptr(&gpu, &n2, 0));
        dev::add_rms_norm(&gpu, &k, n2p, x2p, yp, nwp, t, kd, 1e-6).unwrap();
        dev::matmul(&gpu, &k, ptr(&gpu, &o2, 0), n2p, &dw, 0, n, t).unwrap();
        for (one, two, what) in [(&x1, &x2, "sum"), (&n1, &n2, "norm")] {
            let len = t * kd;
            let (a, b) = (
                gpu.download(one, len).unwrap(),
                gpu.download(two, len).unwrap(),
            );
            assert_eq!(bits(&a), bits(&b), "{name}: add_rms_norm's {what}");
        }
        let (a, b) = (
            gpu.download(&o1, t * n).unwrap(),
            gpu.download(&o2, t * n).unwrap(),
        );
        assert_eq!(bits(&a), bits(&b), "{name}: the product after add_rms_norm");
        // The GDN output norm: rows of one head (d = 128) making the product's 512 columns.
        let (d, rows) = (128, t * kd / 128);
        let (z, gw) = (random(t * kd, 4), random(d, 5));
        let (zd, gwd, xd) = (
            gpu.upload(&z).unwrap(),
            gpu.upload(&gw).unwrap(),
            gpu.upload(&x).unwrap(),
        );
        let inputs = (ptr(&gpu, &xd, 0), ptr(&gpu, &zd, 0), ptr(&gpu, &gwd, 0));
        let (g1, g2) = (poisoned(&gpu, t * kd), poisoned(&gpu, t * kd));
        let a = dev::rms_norm_gated_activations(
            &gpu,
            &k,
            ptr(&gpu, &g1, 0),
            inputs,
            rows,
            d,
            1e-6,
            t,
            &dw,
        )
        .unwrap();
        dev::matmul_activations(&gpu, &k, ptr(&gpu, &o1, 0), &a, &dw, 0, n).unwrap();
        let g2p = ptr(&gpu, &g2, 0);
        dev::rms_norm_gated(&gpu, &k, g2p, inputs.0, inputs.1, inputs.2, rows, d, 1e-6).unwrap();
        dev::matmul(&gpu, &k, ptr(&gpu, &o2, 0), g2p, &dw, 0, n, t).unwrap();
        let (a, b) = (
            gpu.download(&g1, t * kd).unwrap(),
            gpu.download(&g2, t * kd).unwrap(),
        );
        assert_eq!(bits(&a), bits(&b), "{name}: rms_norm_gated");
        let (a, b) = (
            gpu.download(&o1, t * n).unwrap(),
            gpu.download(&o2, t * n).unwrap(),
        );
        assert_eq!(
            bits(&a),
            bits(&b),
            "{name}: the product after rms_norm_gated"
        );
    }
}

/// The device MoE path: routing as the CPU routes (softmax, the top k by probability with ties
/// to the lower index, renormalised), grouped expert products bit-identical to each pair's
/// token multiplied alone by its expert (by each of the prefill passes' kernels too), and the
/// weighted sum in slot order.
#[test]
fn experts_route_and_multiply_on_the_device() {
    let Some(gpu) = gpu() else { return };
    // The experts' products are on the f16 tensor cores under every family; the tokens alone
    // are multiplied by that family (the default takes Q4_K products to int8 activations).
    tune(&gpu, |o| o.tiled_gemv = dev::TiledGemv::TensorCores);
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (experts, top_k, n, kd) = (12, 3, 40, 512);
    let weights_of = |e: usize| {
        let all = weights(n, kd, 100 + e as u64);
        all.into_iter().find(|(name, _)| name == "Q4_K").unwrap().1
    };
    let dws: Vec<_> = (0..experts)
        .map(|e| gpu.upload_weight(&weights_of(e)).unwrap())
        .collect();
    assert!(dev::has_expert_kernel(&dws[0]));
    let table: Vec<u64> = dws.iter().map(|w| w.device_ptr(&gpu)).collect();
    let table = gpu.upload(&table).unwrap();
    // 400 tokens: 1,200 pairs, 100 an expert on average: a prefill pass's grouping (in chunks)
    // and kernels.
    for t in [1, 5, 16, 40, 400] {
        let mut logits = random(t * experts, 7 + t as u64);
        logits[1] = logits[0]; // a tie: expert 0 goes first
        let ld = gpu.upload(&logits).unwrap();
        let routing =
            dev::moe_route(&gpu, &k, ptr(&gpu, &ld, 0), t, (experts, top_k), None).unwrap();
        let ids = gpu.download(&routing.ids, t * top_k).unwrap();
        let wts = gpu.download(&routing.weights, t * top_k).unwrap();
        for (ti, row) in logits.chunks_exact(experts).enumerate() {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let p: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
            let sum: f32 = p.iter().sum();
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let top = &order[..top_k];
            let norm: f32 = top.iter().map(|&e| p[e] / sum).sum();
            for (j, &e) in top.iter().enumerate() {
                assert_eq!(ids[ti * top_k + j], e as i32, "t={t} token {ti} slot {j}");
                let w = p[e] / sum / norm;
                assert!((wts[ti * top_k + j] - w).abs() < 1e-5, "t={t} token {ti}");
            }
        }
        // Gate-like products: pair p reads token p / top_k.
        let x = random(t * kd, 50 + t as u64);
        let xd = gpu.upload(&x).unwrap();
        let pairs = t * top_k;
        let out = poisoned(&gpu, pairs * n);
        let (op, xp, tp) = (ptr(&gpu, &out, 0), ptr(&gpu, &xd, 0), ptr(&gpu, &table, 0));
        let xa = dev::Activations::new(xp, t, kd);
        dev::matmul_experts(&gpu, &k, op, &xa, tp, &dws[0], &routing, top_k).unwrap();
        let got = gpu.download(&out, pairs * n).unwrap();
        for p in 0..pairs {
            let alone = poisoned(&gpu, n);
            let xrow = ptr(&gpu, &xd, (p / top_k) * kd);
            let dw = &dws[ids[p] as usize];
            dev::matmul(&gpu, &k, ptr(&gpu, &alone, 0), xrow, dw, 0, n, 1).unwrap();
            let alone = gpu.download(&alone, n).unwrap();
            let same = alone
                .iter()
                .zip(&got[p * n..(p + 1) * n])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "t={t} pair {p}: differs from its token alone");
        }
        for kernel in dev::PrefillExperts::ALL {
            tune(&gpu, |o| o.prefill_experts = kernel);
            let again = poisoned(&gpu, pairs * n);
            let ap = ptr(&gpu, &again, 0);
            dev::matmul_experts(&gpu, &k, ap, &xa, tp, &dws[0], &routing, top_k).unwrap();
            assert_eq!(
                bits(&gpu.download(&again, pairs * n).unwrap()),
                bits(&got),
                "t={t}: the {} kernel",
                kernel.name()
            );
        }
        tune(&gpu, |o| {
            o.prefill_experts = dev::GpuOptions::default().prefill_experts
        });
        // The weighted sum alone (without a gate `out` is not read: poisoned here).
        let base = random(t * n, 60 + t as u64);
        let bd = poisoned(&gpu, t * n);
        dev::moe_combine(&gpu, &k, ptr(&gpu, &bd, 0), op, None, &routing, t, n).unwrap();
        let sum = gpu.download(&bd, t * n).unwrap();
        for ti in 0..t {
            for i in 0..n {
                let mut want = 0.0f32;
                for j in 0..top_k {
                    want += wts[ti * top_k + j] * got[(ti * top_k + j) * n + i];
                }
                assert!((sum[ti * n + i] - want).abs() <= 1e-5 * want.abs().max(1.0));
            }
        }
        // The same gate products beside up-like ones (the experts in reverse) in one launch.
        let reversed: Vec<u64> = dws.iter().rev().map(|w| w.device_ptr(&gpu)).collect();
        let reversed = gpu.upload(&reversed).unwrap();
        let (gate, up) = (poisoned(&gpu, pairs * n), poisoned(&gpu, pairs * n));
        let rp = ptr(&gpu, &reversed, 0);
        let (gp, upp) = (ptr(&gpu, &gate, 0), ptr(&gpu, &up, 0));
        let products = [(tp, gp), (rp, upp)];
        dev::matmul_expert_pair(&gpu, &k, products, &xa, &dws[0], &routing, top_k).unwrap();
        let up_alone = poisoned(&gpu, pairs * n);
        let ua = ptr(&gpu, &up_alone, 0);
        dev::matmul_experts(&gpu, &k, ua, &xa, rp, &dws[0], &routing, top_k).unwrap();
        assert_eq!(
            bits(&gpu.download(&gate, pairs * n).unwrap()),
            bits(&got),
            "t={t}: paired gate"
        );
        let up_alone = gpu.download(&up_alone, pairs * n).unwrap();
        assert_eq!(
            bits(&gpu.download(&up, pairs * n).unwrap()),
            bits(&up_alone),
            "t={t}: paired up"
        );
        // Down-like products of silu(g) * u (pair rows): converted in one launch, the bits of
        // silu_mul, then the products.
        let (g, u) = (
            random(pairs * kd, 80 + t as u64),
            random(pairs * kd, 90 + t as u64),
        );
        let (gd, ud) = (gpu.upload(&g).unwrap(), gpu.upload(&u).unwrap());
        let (gdp, udp) = (ptr(&gpu, &gd, 0), ptr(&gpu, &ud, 0));
        let (fused, apart) = (poisoned(&gpu, pairs * n), poisoned(&gpu, pairs * n));
        let (fp, ap) = (ptr(&gpu, &fused, 0), ptr(&gpu, &apart, 0));
        dev::matmul_experts_swiglu(&gpu, &k, fp, (gdp, udp), tp, &dws[0], &routing, pairs).unwrap();
        dev::silu_mul(&gpu, &k, gdp, udp, pairs * kd).unwrap();
        let silu = dev::Activations::new(gdp, pairs, kd);
        dev::matmul_experts(&gpu, &k, ap, &silu, tp, &dws[0], &routing, 1).unwrap();
        assert_eq!(
            bits(&gpu.download(&fused, pairs * n).unwrap()),
            bits(&gpu.download(&apart, pairs * n).unwrap()),
            "t={t}: the fused down products differ from silu_mul then the products"
        );
        // The shared expert's output gated in the weighted sum: scale_rows_sigmoid's row first.
        let g = random(t, 70 + t as u64);
        let gd = gpu.upload(&g).unwrap();
        let (fused, scaled) = (gpu.upload(&base).unwrap(), gpu.upload(&base).unwrap());
        let (fp, sp, gdp) = (
            ptr(&gpu, &fused, 0),
            ptr(&gpu, &scaled, 0),
            ptr(&gpu, &gd, 0),
        );
        dev::moe_combine(&gpu, &k, fp, op, Some(gdp), &routing, t, n).unwrap();
        dev::scale_rows_sigmoid(&gpu, &k, sp, gdp, t, n).unwrap();
        let (fused, scaled) = (
            gpu.download(&fused, t * n).unwrap(),
            gpu.download(&scaled, t * n).unwrap(),
        );
        for (at, (&f, &s)) in fused.iter().zip(&scaled).enumerate() {
            let want = s + sum[at];
            assert!(
                (f - want).abs() <= 1e-5 * want.abs().max(1.0),
                "t={t} value {at}: the gated sum {f} against {want}"
            );
        }
    }
}

#[test]
fn norms_and_elementwise_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    for d in [16, 64, 300, 5120] {
        let rows = 7;
        let x = random(rows * d, d as u64);
        let w = random(d, 5);
        let z = random(rows * d, 6);
        let mut want = vec![0.0; rows * d];
        cpu::rms_norm(&mut want, &x, &w, 1e-6);
        let (xd, wd, zd) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&z).unwrap(),
        );
        let out = poisoned(&gpu, rows * d);
        dev::rms_norm(
            &gpu,
            &k,
            ptr(&gpu, &out, 0),
            ptr(&gpu, &xd, 0),
            ptr(&gpu, &wd, 0),
            rows,
            d,
            1e-6,
        )
        .unwrap();
        assert!(
            rel_err(&gpu.download(&out, rows * d).unwrap(), &want) < 1e-5,
            "rms_norm d={d}"
        );
        // The residual add fused with the norm: the bits of add_in_place then rms_norm.
        let (sum_two, sum_one) = (gpu.upload(&x).unwrap(), gpu.upload(&x).unwrap());
        let (norm_two, norm_one) = (poisoned(&gpu, rows * d), poisoned(&gpu, rows * d));
        let (zp, wp) = (ptr(&gpu, &zd, 0), ptr(&gpu, &wd, 0));
        let (s2, n2) = (ptr(&gpu, &sum_two, 0), ptr(&gpu, &norm_two, 0));
        dev::add_in_place(&gpu, &k, s2, zp, rows * d).unwrap();
        dev::rms_norm(&gpu, &k, n2, s2, wp, rows, d, 1e-6).unwrap();
        let (s1, n1) = (ptr(&gpu, &sum_one, 0), ptr(&gpu, &norm_one, 0));
        dev::add_rms_norm(&gpu, &k, n1, s1, zp, wp, rows, d, 1e-6).unwrap();
        for (one, two) in [(&sum_one, &sum_two), (&norm_one, &norm_two)] {
            let (a, b) = (
                gpu.download(one, rows * d).unwrap(),
                gpu.download(two, rows * d).unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "add_rms_norm d={d}"
            );
        }
        cpu::rms_norm_gated(&mut want, &x, &z, &w, 1e-6);
        let out = poisoned(&gpu, rows * d);
        dev::rms_norm_gated(
            &gpu,
            &k,
            ptr(&gpu, &out, 0),
            ptr(&gpu, &xd, 0),
            ptr(&gpu, &zd, 0),
            ptr(&gpu, &wd, 0),
            rows,
            d,
            1e-6,
        )
        .unwrap();
        assert!(
            rel_err(&gpu.download(&out, rows * d).unwrap(), &want) < 1e-5,
            "rms_norm_gated d={d}"
        );
    }
    let n = 1000;
    let (a, b) = (random(n, 1), random(n, 2));
    let mut want = a.clone();
    cpu::silu_mul(&mut want, &b);
    let (ad, bd) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
    dev::silu_mul(&gpu, &k, ptr(&gpu, &ad, 0), ptr(&gpu, &bd, 0), n).unwrap();
    assert!(
        rel_err(&gpu.download(&ad, n).unwrap(), &want) < 1e-6,
        "silu_mul"
    );
}

/// Keys and values `[S, hkv, d]` in device caches of `format` (codes and int8 row scales), as
/// the model fills them.
struct DeviceCache {
    k: cudarc::driver::CudaSlice<u8>,
    ks: cudarc::driver::CudaSlice<f32>,
    v: cudarc::driver::CudaSlice<u8>,
    vs: cudarc::driver::CudaSlice<f32>,
}

impl DeviceCache {
    /// Appends `keys` and `values` by `dev::kv_append` in pieces of `pieces` positions.
    #[allow(clippy::too_many_arguments)]
    fn new(
        gpu: &Gpu,
        k: &splash_backend::cuda::Kernels,
        format: KvFormat,
        keys: &[f32],
        values: &[f32],
        hkv: usize,
        d: usize,
        pieces: &[usize],
    ) -> Self {
        let s: usize = pieces.iter().sum();
        let eb = format.value_bytes();
        let cache = Self {
            k: gpu.zeros::<u8>(s * hkv * d * eb).unwrap(),
            ks: gpu.zeros::<f32>(s * hkv).unwrap(),
            v: gpu.zeros::<u8>(s * hkv * d * eb).unwrap(),
            vs: gpu.zeros::<f32>(s * hkv).unwrap(),
        };
        let (kd, vd) = (gpu.upload(keys).unwrap(), gpu.upload(values).unwrap());
        let mut at = 0;
        for &n in pieces {
            for (codes, scales, src) in [(&cache.k, &cache.ks, &kd), (&cache.v, &cache.vs, &vd)] {
                dev::kv_append(
                    gpu,
                    k,
                    ptr(gpu, codes, 0),
                    ptr(gpu, scales, 0),
                    ptr(gpu, src, at * hkv * d),
                    format,
                    n,
                    hkv,
                    d,
                    at,
                )
                .unwrap();
            }
            at += n;
        }
        cache
    }

    /// The key cache and its scales, as `dev::attention` takes them.
    fn keys(&self, gpu: &Gpu) -> (u64, u64) {
        (ptr(gpu, &self.k, 0), ptr(gpu, &self.ks, 0))
    }

    fn values(&self, gpu: &Gpu) -> (u64, u64) {
        (ptr(gpu, &self.v, 0), ptr(gpu, &self.vs, 0))
    }
}

/// 5 tokens: the split attention of decode and verify passes; 100: a prefill pass, on the
/// tensor cores (`attention_prefill`) for the bf16 and int8 caches, with the bits of
/// `attention_prefill_async` for int8 (every other case takes the same kernel either way); 40
/// after 3,000: a short pass over a long context, whose keys the prefill kernel splits into
/// chunks.
#[test]
fn rope_and_attention_match_the_cpu_for_every_kv_format() {
    let Some(gpu) = gpu() else { return };
    for (dims, t, pos0) in [
        (FIXTURE_DIMS, 5, 37),
        (REAL_DIMS, 5, 37),
        (FIXTURE_DIMS, 100, 37),
        (REAL_DIMS, 100, 37),
        (REAL_DIMS, 40, 3000),
    ] {
        let k = gpu.kernels(dims).unwrap();
        let d = dims.head_dim;
        let (hq, hkv) = (8, 2);
        let rope = Rope::new(d / 4, 1e7);
        let inv: Vec<f32> = (0..d / 8)
            .map(|i| 1.0 / 1e7f32.powf((2 * i) as f32 / (d / 4) as f32))
            .collect();
        let invd = gpu.upload(&inv).unwrap();
        let mut q = random(t * hq * d, 11);
        let qd = gpu.upload(&q).unwrap();
        rope.apply(&mut q, hq, d, pos0);
        dev::rope(
            &gpu,
            &k,
            ptr(&gpu, &qd, 0),
            ptr(&gpu, &invd, 0),
            t,
            hq,
            d,
            d / 4,
            pos0,
        )
        .unwrap();
        assert!(
            rel_err(&gpu.download(&qd, t * hq * d).unwrap(), &q) < 1e-5,
            "rope d={d}"
        );
        for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let s = pos0 + t;
            let keys = random(s * hkv * d, 12);
            let values = random(s * hkv * d, 13);
            let (mut kc, mut vc) = (KvStore::new(format), KvStore::new(format));
            kc.append(&keys, d);
            vc.append(&values, d);
            let mut want = vec![0.0; t * hq * d];
            cpu::attention(
                &mut want,
                &q,
                &kc,
                &vc,
                hq,
                hkv,
                d,
                pos0,
                (d as f32).powf(-0.5),
            );
            // Two appends (a prefill, then the new rows), as the model does.
            let cache = DeviceCache::new(&gpu, &k, format, &keys, &values, hkv, d, &[pos0, t]);
            let qd = gpu.upload(&q).unwrap();
            let attend = || {
                let out = poisoned(&gpu, t * hq * d);
                dev::attention(
                    &gpu,
                    &k,
                    ptr(&gpu, &out, 0),
                    ptr(&gpu, &qd, 0),
                    cache.keys(&gpu),
                    cache.values(&gpu),
                    format,
                    t,
                    hq,
                    hkv,
                    pos0,
                    (d as f32).powf(-0.5),
                    dev::KeyMask::default(),
                )
                .unwrap();
                gpu.download(&out, t * hq * d).unwrap()
            };
            tune(&gpu, |o| o.flash_async = false);
            let out = attend();
            let err = rel_err(&out, &want);
            // The tensor-core prefill multiplies in f16.
            let tol = if t > 32 && format != KvFormat::F32 {
                4e-3
            } else {
                1e-4
            };
            assert!(err < tol, "attention d={d} t={t} {format:?}: {err}");
            // Int8 rows copied ahead by cp.async: the same bits.
            tune(&gpu, |o| o.flash_async = true);
            assert_eq!(
                bits(&attend()),
                bits(&out),
                "attention d={d} t={t} {format:?}: attention_prefill_async"
            );
        }
    }
}

/// The DFlash draft's block attention: a block of queries at `pos0..` that sees the whole
/// block (no causal mask) and, in sliding layers, only keys within the window.
#[test]
fn block_attention_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // Draft heads are often not a multiple of 32 (the fixture drafts have 16).
    let odd = |head_dim| KernelDims {
        head_dim,
        ..FIXTURE_DIMS
    };
    for kd in [FIXTURE_DIMS, REAL_DIMS, odd(16), odd(80)] {
        let k = gpu.kernels(kd).unwrap();
        let d = kd.head_dim;
        let (hq, hkv, t, pos0) = (4, 2, 8, 13);
        let s = pos0 + t;
        let q = random(t * hq * d, 41);
        let keys = random(s * hkv * d, 42);
        let values = random(s * hkv * d, 43);
        for window in [None, Some(5), Some(64)] {
            let att = cpu::BlockAttention {
                heads: hq,
                kv_heads: hkv,
                head_dim: d,
                scale: (d as f32).powf(-0.5),
                causal: false,
                window,
            };
            let mut want = vec![0.0f32; q.len()];
            att.forward(&mut want, &q, pos0, &keys, &values, 0);
            let (kd_, vd, qd) = (
                gpu.upload(&keys).unwrap(),
                gpu.upload(&values).unwrap(),
                gpu.upload(&q).unwrap(),
            );
            let unused = gpu.zeros::<f32>(1).unwrap();
            let out = poisoned(&gpu, t * hq * d);
            dev::attention(
                &gpu,
                &k,
                ptr(&gpu, &out, 0),
                ptr(&gpu, &qd, 0),
                (ptr(&gpu, &kd_, 0), ptr(&gpu, &unused, 0)),
                (ptr(&gpu, &vd, 0), ptr(&gpu, &unused, 0)),
                KvFormat::F32,
                t,
                hq,
                hkv,
                pos0,
                att.scale,
                dev::KeyMask { block: t, window },
            )
            .unwrap();
            let err = rel_err(&gpu.download(&out, t * hq * d).unwrap(), &want);
            assert!(err < 1e-5, "block attention d={d} window {window:?}: {err}");
        }
    }
}

#[test]
fn gated_delta_net_matches_the_cpu_in_both_head_orders() {
    let Some(gpu) = gpu() else { return };
    for kd in [FIXTURE_DIMS, REAL_DIMS] {
        let k = gpu.kernels(kd).unwrap();
        for v_order in [VHeadOrder::Grouped, VHeadOrder::Tiled] {
            let dims = GdnDims {
                hk: 2,
                hv: 4,
                dk: kd.gdn_dk,
                dv: kd.gdn_dv,
                v_order,
            };
            // 150 tokens: whole stages of the per-token scan (GDN_STAGE) and a partial one, two
            // whole chunks of the chunked scan (GDN_CHUNK) and a partial one.
            let (t, kernel) = (150, 4);
            let c = 2 * dims.hk * dims.dk + dims.hv * dims.dv;
            let x = random(t * c, 21);
            let w = random(c * kernel, 22);
            let conv0 = random((kernel - 1) * c, 23);
            let b = random(t * dims.hv, 24);
            let a: Vec<f32> = random(t * dims.hv, 25);
            let dt_bias = random(dims.hv, 26);
            let neg_a: Vec<f32> = random(dims.hv, 27)
                .iter()
                .map(|v| -(1.0 + 4.0 * v.abs()))
                .collect();
            let state0 = random(dims.state_len(), 28);
            // CPU: the model's sequence of ops.
            let mut conv = conv0.clone();
            let mut mixed = vec![0.0; t * c];
            cpu::causal_conv1d_silu(&mut mixed, &x, &mut conv, &w);
            let kdim = dims.hk * dims.dk;
            let (mut q, mut kk, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for row in mixed.chunks_exact(c) {
                q.extend_from_slice(&row[..kdim]);
                kk.extend_from_slice(&row[kdim..2 * kdim]);
                v.extend_from_slice(&row[2 * kdim..]);
            }
            cpu::l2_norm_rows(&mut q, dims.dk, 1e-6);
            cpu::l2_norm_rows(&mut kk, dims.dk, 1e-6);
            let scale = (dims.dk as f32).powf(-0.5);
            q.iter_mut().for_each(|v| *v *= scale);
            let (mut beta, mut g) = (b.clone(), a.clone());
            for i in 0..t * dims.hv {
                let h = i % dims.hv;
                beta[i] = cpu::sigmoid(b[i]);
                g[i] = neg_a[h] * cpu::softplus(a[i] + dt_bias[h]);
            }
            let mut state = state0.clone();
            let mut want = vec![0.0; t * dims.hv * dims.dv];
            cpu::gdn_recurrent(&mut want, &q, &kk, &v, &g, &beta, &mut state, dims);
            // GPU.
            let (xd, wd, convd) = (
                gpu.upload(&x).unwrap(),
                gpu.upload(&w).unwrap(),
                gpu.upload(&conv0).unwrap(),
            );
            let mixedd = poisoned(&gpu, t * c);
            dev::conv1d_silu(
                &gpu,
                &k,
                ptr(&gpu, &mixedd, 0),
                ptr(&gpu, &xd, 0),
                ptr(&gpu, &convd, 0),
                ptr(&gpu, &wd, 0),
                t,
                c,
                kernel,
            )
            .unwrap();
            assert!(
                rel_err(&gpu.download(&mixedd, t * c).unwrap(), &mixed) < 1e-5,
                "conv"
            );
            assert!(
                rel_err(&gpu.download(&convd, conv.len()).unwrap(), &conv) == 0.0,
                "conv state"
            );
            let (bd, ad) = (gpu.upload(&b).unwrap(), gpu.upload(&a).unwrap());
            let (dtd, nad) = (gpu.upload(&dt_bias).unwrap(), gpu.upload(&neg_a).unwrap());
            dev::gdn_gates(
                &gpu,
                &k,
                ptr(&gpu, &bd, 0),
                ptr(&gpu, &ad, 0),
                ptr(&gpu, &dtd, 0),
                ptr(&gpu, &nad, 0),
                dims.hv,
                t * dims.hv,
            )
            .unwrap();
            let stated = gpu.upload(&state0).unwrap();
            let out = poisoned(&gpu, want.len());
            dev::gdn_recurrent(
                &gpu,
                &k,
                ptr(&gpu, &out, 0),
                ptr(&gpu, &mixedd, 0),
                ptr(&gpu, &ad, 0),
                ptr(&gpu, &bd, 0),
                ptr(&gpu, &stated, 0),
                t,
                dims.hk,
                dims.hv,
                v_order == VHeadOrder::Tiled,
            )
            .unwrap();
            let err = rel_err(&gpu.download(&out, want.len()).unwrap(), &want);
            assert!(err < 1e-4, "gdn {kd:?} {v_order:?}: output {err}");
            let err = rel_err(&gpu.download(&stated, state.len()).unwrap(), &state);
            assert!(err < 1e-4, "gdn {kd:?} {v_order:?}: state {err}");
            // The chunked form (a prefill's) from the same state: the same outputs and state to
            // rounding.
            let stated = gpu.upload(&state0).unwrap();
            let out = poisoned(&gpu, want.len());
            let scratch = poisoned(
                &gpu,
                dev::gdn_chunk_scratch_len(t, dims.hv, dims.dk, dims.dv),
            );
            dev::gdn_chunked(
                &gpu,
                &k,
                ptr(&gpu, &out, 0),
                ptr(&gpu, &mixedd, 0),
                ptr(&gpu, &ad, 0),
                ptr(&gpu, &bd, 0),
                ptr(&gpu, &stated, 0),
                ptr(&gpu, &scratch, 0),
                t,
                dims.hk,
                dims.hv,
                v_order == VHeadOrder::Tiled,
            )
            .unwrap();
            let err = rel_err(&gpu.download(&out, want.len()).unwrap(), &want);
            assert!(err < 1e-4, "chunked gdn {kd:?} {v_order:?}: output {err}");
            let err = rel_err(&gpu.download(&stated, state.len()).unwrap(), &state);
            assert!(err < 1e-4, "chunked gdn {kd:?} {v_order:?}: state {err}");
        }
    }
}

/// A timeline build (`SPLASH_TIMELINE`) pairs every launch, direct or replayed from a graph,
/// with its blocks' records, in queue order, each wait returning no earlier than the one before.
#[test]
fn a_timeline_build_records_every_launch_in_order() {
    let Some(gpu) = gpu() else { return };
    tune(&gpu, |o| o.kernels.timeline = true);
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let n = 1 << 16;
    let (g, u) = (
        gpu.upload(&random(n, 1)).unwrap(),
        gpu.upload(&random(n, 2)).unwrap(),
    );
    let (gp, up) = (ptr(&gpu, &g, 0), ptr(&gpu, &u, 0));
    let queue = || -> Result<(), dev::GpuError> {
        dev::silu_mul(&gpu, &k, gp, up, n)?;
        dev::silu_mul(&gpu, &k, gp, up, n / 2)
    };
    assert!(gpu.timeline_reset(&k).unwrap(), "the module records");
    queue().unwrap();
    let graph = gpu.capture(queue).unwrap();
    gpu.replay(&graph).unwrap();
    let spans = gpu.timeline(&k).unwrap().expect("a timeline build");
    let spans = spans.expect("every launch paired with its records");
    let blocks: Vec<u32> = spans.iter().map(|s| s.blocks).collect();
    let whole = n.div_ceil(256) as u32;
    assert_eq!(blocks, [whole, whole / 2, whole, whole / 2]);
    assert!(spans.iter().all(|s| s.name == "silu_mul"));
    assert!(spans.windows(2).all(|w| w[0].released <= w[1].released));
    assert!(spans.iter().all(|s| s.arrived <= s.released && s.sms > 0));
    // A module without the records has no timeline.
    tune(&gpu, |o| o.kernels.timeline = false);
    let plain = gpu.kernels(FIXTURE_DIMS).unwrap();
    assert!(!gpu.timeline_reset(&plain).unwrap());
    assert!(gpu.timeline(&plain).unwrap().is_none());
}

#[test]
fn kernels_of_one_module_are_reused() {
    let Some(gpu) = gpu() else { return };
    let a: Arc<Kernels> = gpu.kernels(FIXTURE_DIMS).unwrap();
    let b = gpu.kernels(FIXTURE_DIMS).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
}

/// Attention over a long cache: a few rows split the keys into chunks (flash-decoding), a
/// prefill-sized pass does not; both match the CPU, and a block of rows gives each row the
/// bits a one-row pass gives (a verify block equals token-by-token decoding); with the default
/// chunks and with `SPLASH_ATTENTION_CHUNK=64`.
#[test]
fn long_context_attention_matches_the_cpu_and_is_row_invariant() {
    let Some(gpu) = gpu() else { return };
    for (chunk, dims) in [None, Some(64)]
        .into_iter()
        .flat_map(|c| [(c, FIXTURE_DIMS), (c, REAL_DIMS)])
    {
        tune(&gpu, |o| o.kernels.attention_chunk = chunk);
        let k = gpu.kernels(dims).unwrap();
        let d = dims.head_dim;
        let (hq, hkv, pos0) = (8, 2, 2_900);
        for t in [16usize, 40] {
            let s = pos0 + t;
            let format = KvFormat::Int8;
            let keys = random(s * hkv * d, 21);
            let values = random(s * hkv * d, 22);
            let q = random(t * hq * d, 23);
            let (mut kc, mut vc) = (KvStore::new(format), KvStore::new(format));
            kc.append(&keys, d);
            vc.append(&values, d);
            let mut want = vec![0.0; t * hq * d];
            let scale = (d as f32).powf(-0.5);
            cpu::attention(&mut want, &q, &kc, &vc, hq, hkv, d, pos0, scale);
            let cache = DeviceCache::new(&gpu, &k, format, &keys, &values, hkv, d, &[s]);
            let qd = gpu.upload(&q).unwrap();
            let run = |rows: usize, first: usize| {
                let out = poisoned(&gpu, rows * hq * d);
                dev::attention(
                    &gpu,
                    &k,
                    ptr(&gpu, &out, 0),
                    ptr(&gpu, &qd, first * hq * d),
                    cache.keys(&gpu),
                    cache.values(&gpu),
                    format,
                    rows,
                    hq,
                    hkv,
                    pos0 + first,
                    scale,
                    dev::KeyMask::default(),
                )
                .unwrap();
                gpu.download(&out, rows * hq * d).unwrap()
            };
            let all = run(t, 0);
            let err = rel_err(&all, &want);
            // Past the split kernel's rows (32), head dims of 16s run on the tensor cores:
            // f16 keys, values and probabilities, as the host test of that kernel bounds them.
            let bound = if t > 32 && d % 16 == 0 { 4e-3 } else { 1e-4 };
            assert!(err < bound, "d={d} t={t} chunk {chunk:?}: {err}");
            if t <= 32 {
                for i in 0..t {
                    let one = run(1, i);
                    assert!(
                        one[..] == all[i * hq * d..(i + 1) * hq * d],
                        "d={d} chunk {chunk:?}: row {i} of a {t}-row pass differs from a one-row pass"
                    );
                }
            }
        }
    }
    tune(&gpu, |o| o.kernels.attention_chunk = None);
}

/// DFlash2's grouped dynamic conv, its taps read from a projection holding both sides.
#[test]
fn grouped_dynamic_conv_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let k = gpu.kernels(FIXTURE_DIMS).unwrap();
    let (t, h, kernel, group) = (16, 64, 4, 16);
    let side = kernel * (h / group);
    let x = random(t * h, 51);
    let projected = random(t * 2 * side, 52);
    let base = random(kernel * h, 53);
    let (xd, pd, bd) = (
        gpu.upload(&x).unwrap(),
        gpu.upload(&projected).unwrap(),
        gpu.upload(&base).unwrap(),
    );
    for second in [0, 1] {
        let dynamic: Vec<f32> = projected
            .chunks_exact(2 * side)
            .flat_map(|row| row[second * side..][..side].to_vec())
            .collect();
        let mut want = vec![0.0f32; t * h];
        cpu::grouped_dynamic_conv(&mut want, &x, &dynamic, &base, kernel, group);
        let out = poisoned(&gpu, t * h);
        dev::grouped_dynamic_conv(
            &gpu,
            &k,
            ptr(&gpu, &out, 0),
            ptr(&gpu, &xd, 0),
            ptr(&gpu, &pd, second * side),
            2 * side,
            ptr(&gpu, &bd, 0),
            t,
            h,
            kernel,
            group,
        )
        .unwrap();
        let err = rel_err(&gpu.download(&out, t * h).unwrap(), &want);
        assert!(err < 1e-6, "side {second}: relative error {err}");
    }
}
