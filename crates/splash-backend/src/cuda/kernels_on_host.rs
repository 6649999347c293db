//! The CUDA kernels (`kernels/`) run on the CPU (`kernels_on_host.h`) and compared with the CPU
//! ops, so that a kernel's indexing, masks and fragment layouts are checked on machines without
//! a GPU (CI, and sessions without device time). g++ builds the source NVRTC compiles, for each
//! set of dimensions, into a shared library once per test run. The tensor-core GEMV, which has
//! run on the GPU, checks the emulated mma.sync against the hardware's fragment layout. Speed,
//! memory limits and the PTX itself are only checked on a GPU (`tests/cuda_ops.rs`; NVRTC:
//! `tests/cuda_compile.rs`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use half::f16;

use super::ops::int8_mma_build;
use super::signatures::host;
use super::KernelDims;
use crate::cpu::{self, GdnDims, KvFormat, KvStore, VHeadOrder};
use crate::ggml::GgmlType;
use crate::{DType, HostBytes, Weight};

/// The kernels built for one set of dimensions, loaded.
struct HostKernels {
    lib: libloading::Library,
    /// Keys per chunk of the split attention it was built with (`ATTN_CHUNK`).
    chunk: usize,
}

/// `host_launch` in kernels_on_host.h.
type LaunchFn = unsafe extern "C" fn(u32, u32, extern "C" fn(*mut c_void), *mut c_void);

/// The emulator's launch state is global: one launch at a time across the test threads.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Most query heads a decode-attention block takes in the host build (`ATTN_HEADS_MAX`): the
/// widest, so that every block size the GPU may run is checked.
const ATTENTION_HEADS: usize = 4;

/// The kernels for `dims`, built on first use; `None` (test skipped) without g++, unless
/// `SPLASH_REQUIRE_HOST_KERNELS` is set.
fn kernels(dims: KernelDims) -> Option<Arc<HostKernels>> {
    kernels_chunked(dims, super::ops::ATTN_CHUNK)
}

/// [`kernels`] with `chunk` keys per chunk of the split attention (`SPLASH_ATTENTION_CHUNK`).
fn kernels_chunked(dims: KernelDims, chunk: usize) -> Option<Arc<HostKernels>> {
    type Built = HashMap<(KernelDims, usize), Arc<HostKernels>>;
    static BUILT: Mutex<Option<Built>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap();
    let map = built.get_or_insert_with(HashMap::new);
    if let Some(k) = map.get(&(dims, chunk)) {
        return Some(k.clone());
    }
    match HostKernels::build(dims, chunk) {
        Ok(k) => {
            let k = Arc::new(k);
            map.insert((dims, chunk), k.clone());
            Some(k)
        }
        Err(e) if std::env::var_os("SPLASH_REQUIRE_HOST_KERNELS").is_none() => {
            eprintln!("skipped: the kernels cannot be built for the CPU ({e})");
            None
        }
        Err(e) => panic!("SPLASH_REQUIRE_HOST_KERNELS is set: {e}"),
    }
}

impl HostKernels {
    fn build(dims: KernelDims, chunk: usize) -> Result<Self, String> {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/cuda");
        let stem = std::env::temp_dir().join(format!(
            "splash-kernels-on-host-{}-{}-{}-{}-{chunk}",
            std::process::id(),
            dims.head_dim,
            dims.gdn_dk,
            dims.gdn_dv
        ));
        let (cu, lib) = (stem.with_extension("cu"), stem.with_extension("so"));
        // The very source NVRTC compiles (the kernel files in order, with #line directives),
        // then the check that every kernel has the parameters cuda/signatures.rs declares.
        let source = format!(
            "{}\n#line 1 \"signatures.rs checks\"\n{}",
            super::compile::kernel_source(),
            super::signatures::cpp_checks()
        );
        std::fs::write(&cu, source).map_err(|e| format!("cannot write {}: {e}", cu.display()))?;
        let out = std::process::Command::new("g++")
            .args(["-std=c++20", "-O2", "-shared", "-fPIC", "-pthread", "-w"])
            .arg("-DKERNEL_EMULATION")
            .arg(format!("-DHEAD_DIM={}", dims.head_dim))
            .arg(format!("-DGDN_DK={}", dims.gdn_dk))
            .arg(format!("-DGDN_DV={}", dims.gdn_dv))
            .arg(format!(
                "-DGDN_SLICES={}",
                super::KernelOptions::default().gdn_slices(dims.gdn_dk)
            ))
            .arg(format!("-DATTN_HEADS_MAX={ATTENTION_HEADS}"))
            .arg(format!("-DATTN_CHUNK={chunk}"))
            .arg("-include")
            .arg(src.join("kernels_on_host.h"))
            .args(["-x", "c++"])
            .arg(&cu)
            .arg("-o")
            .arg(&lib)
            .output();
        let _ = std::fs::remove_file(&cu);
        let out = out.map_err(|e| format!("g++ not runnable: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "g++ failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // SAFETY: our own library, which runs no code at load.
        let loaded = unsafe { libloading::Library::new(&lib) }.map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&lib);
        Ok(Self {
            lib: loaded?,
            chunk,
        })
    }

    /// The kernel `name` as a function of type `F` (an `extern "C" fn` of its parameters).
    ///
    /// # Safety
    /// `F` must match the kernel's parameters in kernels/.
    unsafe fn kernel<F: Copy>(&self, name: &str) -> F {
        *self
            .lib
            .get::<F>(name.as_bytes())
            .unwrap_or_else(|e| panic!("kernel {name}: {e}"))
    }

    /// Runs `body` (which calls one kernel) as a launch of `grid` blocks of `block` threads.
    fn launch(&self, grid: u32, block: u32, body: &(dyn Fn() + Sync)) {
        extern "C" fn trampoline(ctx: *mut c_void) {
            // SAFETY: `ctx` is the `&dyn Fn` below, alive for the whole launch.
            let body = unsafe { &*(ctx as *const &(dyn Fn() + Sync)) };
            body();
        }
        let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `host_launch` has this signature; it returns after every thread ran `body`.
        unsafe {
            let launch: LaunchFn = self.kernel("host_launch");
            let mut ctx: &(dyn Fn() + Sync) = body;
            launch(
                grid,
                block,
                trampoline,
                &mut ctx as *mut &(dyn Fn() + Sync) as *mut c_void,
            );
        }
    }
}

/// An address the kernel threads may read and write: the test owns the buffer and reads it
/// only after the launch.
#[derive(Clone, Copy)]
struct Addr(usize);

impl Addr {
    fn of<T>(v: &[T]) -> Self {
        Addr(v.as_ptr() as usize)
    }
    fn ptr<T>(self) -> *mut T {
        self.0 as *mut T
    }
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let num: f32 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f32 = want.iter().map(|b| b * b).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The bit patterns of `v`, for comparisons that must be exact.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const DIMS_256: KernelDims = KernelDims {
    head_dim: 256,
    gdn_dk: 128,
    gdn_dv: 128,
};
/// The DFlash drafts' head dim: the staged attention's one-dim-a-thread build.
const DIMS_128: KernelDims = KernelDims {
    head_dim: 128,
    gdn_dk: 16,
    gdn_dv: 16,
};
const DIMS_32: KernelDims = KernelDims {
    head_dim: 32,
    gdn_dk: 16,
    gdn_dv: 16,
};

/// A random k-quant weight with sane f16 scale fields at `fp16_fields` of each block.
fn kquant(t: GgmlType, n: usize, k: usize, fp16_fields: &[usize], seed: u64) -> Weight {
    let mut raw: Vec<u8> = random(n * t.row_bytes(k), seed)
        .iter()
        .map(|v| (v.to_bits() >> 9) as u8)
        .collect();
    let scales = random(raw.len() / t.block_bytes() * fp16_fields.len(), seed + 1);
    let mut si = 0;
    for block in raw.chunks_exact_mut(t.block_bytes()) {
        for &off in fp16_fields {
            let v = f16::from_f32(0.001 + 0.05 * scales[si].abs()).to_le_bytes();
            block[off..off + 2].copy_from_slice(&v);
            si += 1;
        }
    }
    Weight::new(DType::Ggml(t), vec![n, k], HostBytes::from_vec(raw)).unwrap()
}

/// The tensor-core GEMV (validated on the H200) gives the CPU's product here too: the
/// emulated mma.sync has the hardware's fragment layout, which the kernels below rely on. And
/// each token of a 16-token launch gets the bits it gets alone. Stream-K (`gemv_tcs*` and
/// `gemv_tc_fixup`, with tiles cut between blocks) does the same. Rows of 3 blocks over 3
/// warps (one block a warp) and of 24 over 8 and 4 warps (3 and 6).
#[test]
fn the_tensor_core_gemv_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    // 40 rows: three tiles, the last one partly padding. Stream-K over 2, 4 and 9 blocks of the
    // 3-block rows: 9 units of (tile, 256-value block), so pieces of one, two and three blocks.
    let n = 40;
    for (kd, warps) in [(768, 3), (6144, 8), (6144, 4)] {
        for (t, fields) in [(GgmlType::Q4_K, &[0usize, 2][..]), (GgmlType::Q6_K, &[208])] {
            let w = kquant(t, n, kd, fields, 5);
            let gemv = TcGemv {
                kern: &kern,
                format: t,
                tiles: super::weights::tiled(t, w.raw_bytes(), n, kd / 256),
                n,
                kd,
                warps,
            };
            let mut launches = vec![TcLaunch::Tiled];
            if kd == 768 {
                launches.extend([2, 4, 9].map(TcLaunch::StreamK));
            }
            for launch in launches {
                for tokens in [1usize, 5, 16] {
                    let x = random(tokens * kd, 7 + tokens as u64);
                    let mut want = vec![0.0f32; tokens * n];
                    cpu::matmul(&mut want, &x, &w);
                    let y = gemv.run(&x, launch);
                    let err = rel_err(&y, &want);
                    assert!(
                        err < 1e-2,
                        "{t} k={kd} warps={warps} tokens={tokens} {launch:?}: relative error {err}"
                    );
                    if tokens == 16 {
                        for (ti, row) in y.chunks_exact(n).enumerate() {
                            let alone = gemv.run(&x[ti * kd..(ti + 1) * kd], launch);
                            assert!(
                                row.iter()
                                    .zip(&alone)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{t} k={kd} {launch:?}: token {ti} of 16 differs from the token alone"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A tiled weight (`n` rows of `kd`) multiplied on the host by an int8 GEMV of the tiles with
/// `warps` warps a tile, as ops.rs launches it.
struct TileWeight<'a> {
    tiles: &'a [u8],
    row_bytes: i64,
    n: usize,
    kd: usize,
    warps: u32,
}

impl TileWeight<'_> {
    /// Quantised activations `[tokens, kd]` (codes, scales, sums of `S`) multiplied by the
    /// kernel `gemv`: rows below `split` into one output, the others into a second, returned
    /// one after the other.
    ///
    /// # Safety
    /// `gemv` must have the signature of `gemv_q8t_*` with its sums of type `S`.
    unsafe fn run<S>(
        &self,
        kern: &HostKernels,
        gemv: &str,
        (xq, xd, xs): (&[i8], &[f32], &[S]),
        split: usize,
    ) -> Vec<f32> {
        type Gemv<S> = unsafe extern "C" fn(
            *const u8,
            i64,
            *const i8,
            *const f32,
            *const S,
            *mut f32,
            *mut f32,
            i32,
            i32,
            i32,
            i32,
        );
        let (n, kd) = (self.n, self.kd);
        let tokens = xq.len() / kd;
        let (y, y2) = (
            vec![f32::NAN; tokens * split],
            vec![f32::NAN; tokens * (n - split)],
        );
        let (qa, da, sa, ya, y2a, wa) = (
            Addr::of(xq),
            Addr::of(xd),
            Addr::of(xs),
            Addr::of(&y),
            Addr::of(&y2),
            Addr::of(self.tiles),
        );
        // SAFETY: the caller's signature, over buffers of the sizes ops.rs gives them.
        unsafe {
            let g: Gemv<S> = kern.kernel(gemv);
            kern.launch(n.div_ceil(16) as u32, 32 * self.warps, &|| {
                g(
                    wa.ptr(),
                    self.row_bytes,
                    qa.ptr(),
                    da.ptr(),
                    sa.ptr(),
                    ya.ptr(),
                    y2a.ptr(),
                    split as i32,
                    n as i32,
                    kd as i32,
                    tokens as i32,
                )
            });
        }
        [y, y2].concat()
    }
}

/// Checks an int8 GEMV of the tiles of `w` (`n` rows of `kd`), run by `run(x, split)` (rows
/// below `split` into one output, the others into a second, returned one after the other):
/// for each of `token_counts` tokens within 1e-2 of the CPU, rows stacked into two outputs
/// bit-equal to one output, and every token of several bit-equal to itself alone.
fn check_tile_gemv(
    w: &Weight,
    (n, kd): (usize, usize),
    token_counts: &[usize],
    label: &str,
    run: impl Fn(&[f32], usize) -> Vec<f32>,
) {
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    for &tokens in token_counts {
        let x = random(tokens * kd, 7 + tokens as u64);
        let mut want = vec![0.0f32; tokens * n];
        cpu::matmul(&mut want, &x, w);
        let y = run(&x, n);
        let err = rel_err(&y, &want);
        assert!(err < 1e-2, "{label} tokens={tokens}: relative error {err}");
        let stacked = run(&x, 16);
        let (lo, hi) = stacked.split_at(tokens * 16);
        for ti in 0..tokens {
            let parts = [
                &lo[ti * 16..(ti + 1) * 16],
                &hi[ti * (n - 16)..(ti + 1) * (n - 16)],
            ];
            assert!(
                same(&y[ti * n..(ti + 1) * n], &parts.concat()),
                "{label}: token {ti}'s rows differ when stacked"
            );
        }
        if tokens > 1 {
            for (ti, row) in y.chunks_exact(n).enumerate() {
                let alone = run(&x[ti * kd..(ti + 1) * kd], n);
                assert!(
                    same(row, &alone),
                    "{label}: token {ti} of {tokens} differs from the token alone"
                );
            }
        }
    }
}

/// The int8 GEMV of the tiles (`gemv1_q8t_*`, `gemv8_q8t_*`, `gemv_q8t_*` by token count) gives the CPU's
/// product within the int8 rounding of the activations, for Q4_K and Q6_K over chains of one
/// and several blocks; rows from 16 on go to a second output when asked, with the same bits;
/// and each token of a 16-token launch gets the bits of the one-token build.
#[test]
fn the_int8_tile_gemv_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for_each_tile_case(|w, tile, suffix, label| {
        let run = |x: &[f32], split: usize| {
            let build = match x.len() / tile.kd {
                1 => "1",
                5 => "8",
                _ => "",
            };
            let gemv = format!("gemv{build}_q8t_{suffix}");
            let (q, d, s) = q8_input(&kern, x);
            // SAFETY: gemv*_q8t_* (kernels/gemv_tc.cu) have this signature.
            unsafe { tile.run(&kern, &gemv, (&q, &d, &s), split) }
        };
        // Activations rounded to int8 per 32 values: about 4e-3.
        check_tile_gemv(w, (tile.n, tile.kd), &[1, 5, 16], label, run);
    });
}

/// Runs `check(weight, tiles, kernel suffix, label)` on the cases of the int8 GEMVs of the tiles:
/// Q4_K and Q6_K weights of 40 rows (three tiles, the last partly padding) over chains of one
/// and several blocks (768 and 6,144 values a row, 3, 8 and 4 warps).
fn for_each_tile_case(check: impl Fn(&Weight, &TileWeight, &str, &str)) {
    let n = 40;
    for (kd, warps) in [(768, 3), (6144, 8), (6144, 4)] {
        for (t, fields) in [(GgmlType::Q4_K, &[0usize, 2][..]), (GgmlType::Q6_K, &[208])] {
            let w = kquant(t, n, kd, fields, 5);
            let tiles = super::weights::tiled(t, w.raw_bytes(), n, kd / 256);
            let suffix = if t == GgmlType::Q4_K { "q4_k" } else { "q6_k" };
            let tile = TileWeight {
                tiles: &tiles,
                row_bytes: t.row_bytes(kd) as i64,
                n,
                kd,
                warps,
            };
            check(&w, &tile, suffix, &format!("{t} k={kd} warps={warps}"));
        }
    }
}

/// The int8 tensor-core GEMV of Q4_K and Q6_K tiles (`gemv8_i8tc_*` up to 8 tokens,
/// `gemv_i8tc_*` up to 16) gives the CPU's product within the int8 rounding of the activations
/// per 256 values, over chains of one and several blocks and warps; rows from 16 on go to a
/// second output with the same bits; and every token of 5, 16 and 20 (one conversion read by
/// launches of 16 and 4, as ops.rs launches them) gets the bits it gets alone, from the dp4a
/// build of one token (`gemv1_i8tc_*`).
#[test]
fn the_int8_tensor_core_gemv_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for_each_tile_case(|w, tile, suffix, label| {
        let kd = tile.kd;
        let run = |x: &[f32], split: usize| {
            let tokens = x.len() / kd;
            let (q, d, s) = q8_blocks_input(&kern, x, kd);
            // Tokens t0.. t0 + tc by the build ops.rs launches for tc.
            let run_build = |t0: usize, tc: usize| {
                let (v0, v1) = (t0 * kd, (t0 + tc) * kd);
                let group = (&q[v0..v1], &d[v0 / 256..v1 / 256], &s[v0 / 32..v1 / 32]);
                let gemv = format!("{}_i8tc_{suffix}", int8_mma_build(tc));
                // SAFETY: gemv*_i8tc_* (kernels/gemv_tc.cu) have this signature.
                unsafe { tile.run(&kern, &gemv, group, split) }
            };
            if tokens == 1 {
                return run_build(0, 1);
            }
            let (mut y, mut y2) = (Vec::new(), Vec::new());
            for t0 in (0..tokens).step_by(16) {
                let tc = 16.min(tokens - t0);
                assert!(tc > 1, "the mma builds take 2 tokens or more");
                let out = run_build(t0, tc);
                let (lo, hi) = out.split_at(tc * split);
                y.extend_from_slice(lo);
                y2.extend_from_slice(hi);
            }
            [y, y2].concat()
        };
        // Activations rounded to int8 per 256 values.
        check_tile_gemv(w, (tile.n, kd), &[1, 5, 16, 20], label, run);
    });
}

/// The products of one input in one launch (`gemv8_group`, `gemv_group`) as
/// `ops::matmul_group` launches them: a stacked Q4_K pair (3 tiles split at 16, 3 chains), a
/// Q6_K weight whose 8 chains outnumber the launch's 4 warps, and a stacked Q8_0 pair of few
/// rows on the row GEMV. Each product gets the bits of its own launch, for 1, 5 and 16 tokens.
#[test]
fn a_product_group_gives_each_product_the_bits_of_its_own_launch() {
    use super::ops::{FMT_Q4_K, FMT_Q6_K, FMT_Q8_0};
    let Some(kern) = kernels(DIMS_32) else { return };
    // 8 blocks a row: chains of one block each for the Q6_K weight (the host keeps chains ≤ blocks).
    let kd = 2048;
    let q4 = kquant(GgmlType::Q4_K, 48, kd, &[0, 2], 41);
    let q6 = kquant(GgmlType::Q6_K, 40, kd, &[208], 42);
    let q8 = kquant(GgmlType::Q8_0, 24, kd, &[0], 43);
    let tiled =
        |w: &Weight, t: GgmlType| super::weights::tiled(t, w.raw_bytes(), w.rows(), kd / 256);
    let (t4, t6) = (tiled(&q4, GgmlType::Q4_K), tiled(&q6, GgmlType::Q6_K));
    // (weights as the device holds them, format code, rows, split, chains, row bytes)
    type Product<'a> = (&'a [u8], i32, usize, usize, usize, i64);
    let products: [Product<'_>; 3] = [
        (
            &t4,
            FMT_Q4_K,
            48,
            16,
            3,
            GgmlType::Q4_K.row_bytes(kd) as i64,
        ),
        (
            &t6,
            FMT_Q6_K,
            40,
            40,
            8,
            GgmlType::Q6_K.row_bytes(kd) as i64,
        ),
        (
            q8.raw_bytes(),
            FMT_Q8_0,
            24,
            8,
            0,
            GgmlType::Q8_0.row_bytes(kd) as i64,
        ),
    ];
    for tokens in [1usize, 5, 16] {
        let x = random(tokens * kd, 44 + tokens as u64);
        let (bq, bd, bs) = q8_blocks_input(&kern, &x, kd);
        let (xq, xd, xs) = q8_input(&kern, &x);
        let (qa, da, sa) = (Addr::of(&xq), Addr::of(&xd), Addr::of(&xs));
        let (bqa, bda, bsa) = (Addr::of(&bq), Addr::of(&bd), Addr::of(&bs));
        let outputs = || -> Vec<(Vec<f32>, Vec<f32>)> {
            products
                .iter()
                .map(|&(_, _, n, split, _, _)| {
                    (
                        vec![f32::NAN; tokens * split],
                        vec![f32::NAN; tokens * (n - split)],
                    )
                })
                .collect()
        };
        let apart = outputs();
        let build = int8_mma_build(tokens);
        let (t, k) = (tokens as i32, kd as i32);
        // Each product in its own launch, as ops::matmul launches it.
        for (&(w, fmt, n, split, chains, row_bytes), (y, y2)) in products.iter().zip(&apart) {
            let (wa, ya, y2a) = (Addr::of(w), Addr::of(y), Addr::of(y2));
            let (n_i, split_i) = (n as i32, split as i32);
            // SAFETY: the signatures of gemv*_i8tc_* (kernels/gemv_tc.cu) and gemv1_q8_q8_0
            // (kernels/gemv.cu), over buffers of the sizes ops.rs gives them.
            unsafe {
                if fmt == FMT_Q8_0 {
                    let gemv: host::gemv_q8 = kern.kernel("gemv1_q8_q8_0");
                    kern.launch((n * tokens) as u32, 128, &|| {
                        let (q, d, s) = (qa.ptr(), da.ptr(), sa.ptr());
                        gemv(
                            wa.ptr(),
                            row_bytes,
                            q,
                            d,
                            s,
                            ya.ptr(),
                            y2a.ptr(),
                            n_i,
                            k,
                            t,
                            4,
                            split_i,
                        )
                    });
                } else {
                    let suffix = if fmt == FMT_Q4_K { "q4_k" } else { "q6_k" };
                    let gemv: host::gemv_i8tc = kern.kernel(&format!("{build}_i8tc_{suffix}"));
                    kern.launch(n.div_ceil(16) as u32, 32 * chains as u32, &|| {
                        let (q, d, s) = (bqa.ptr(), bda.ptr(), bsa.ptr());
                        gemv(
                            wa.ptr(),
                            row_bytes,
                            q,
                            d,
                            s,
                            ya.ptr(),
                            y2a.ptr(),
                            split_i,
                            n_i,
                            k,
                            t,
                        )
                    });
                }
            }
        }
        // All three in one launch.
        let group = format!("{build}_group");
        let together = outputs();
        let mut g = super::ProductGroup::default();
        let mut end = 0;
        for (i, (&(w, fmt, n, split, chains, row_bytes), (y, y2))) in
            products.iter().zip(&together).enumerate()
        {
            (g.w[i], g.y[i], g.y2[i]) = (
                Addr::of(w).0 as u64,
                Addr::of(y).0 as u64,
                Addr::of(y2).0 as u64,
            );
            (g.row_bytes[i], g.fmt[i], g.n[i], g.split[i]) =
                (row_bytes, fmt, n as i32, split as i32);
            g.chains[i] = chains as i32;
            end += if fmt == FMT_Q8_0 {
                n * tokens
            } else {
                n.div_ceil(16)
            };
            g.end[i] = end as i32;
        }
        g.end[3] = end as i32;
        // SAFETY: gemv*_group's signature (kernels/gemv_tc.cu), over the buffers above.
        unsafe {
            let gemv: host::gemv_group = kern.kernel(&group);
            kern.launch(end as u32, 128, &|| {
                let (q, d, s) = (qa.ptr(), da.ptr(), sa.ptr());
                gemv(g, bqa.ptr(), bda.ptr(), bsa.ptr(), q, d, s, k, t)
            });
        }
        for (i, ((a, a2), (b, b2))) in apart.iter().zip(&together).enumerate() {
            assert!(
                a.iter().all(|v| v.is_finite()),
                "product {i}: written apart"
            );
            assert_eq!(
                bits(a),
                bits(b),
                "{group}, tokens={tokens} product {i}: the first rows"
            );
            assert_eq!(
                bits(a2),
                bits(b2),
                "{group}, tokens={tokens} product {i}: the second rows"
            );
        }
    }
}

/// A grouped expert product on the host (`gemv_tc_experts*`) as ops.rs launches it: the pairs'
/// routing (`active` experts, `offsets` into `order`, one slot an entry of `active`), the
/// activations converted for the tensor cores, and the experts' shape.
struct ExpertLaunch<'a> {
    kern: &'a HostKernels,
    routing: (&'a [i32], &'a [i32], &'a [i32]),
    x: (&'a [u16], &'a [f32]),
    pairs: usize,
    n: usize,
    kd: usize,
    row_bytes: i64,
    col_div: usize,
    chains: u32,
}

impl ExpertLaunch<'_> {
    /// Kernel `name`, `warps` a block, over the experts of `first`, and with `second` those of
    /// another table in the same launch: the outputs of each `[pairs, n]`.
    fn run(
        &self,
        name: &str,
        warps: u32,
        first: &[u64],
        second: Option<&[u64]>,
    ) -> (Vec<f32>, Vec<f32>) {
        type Experts = host::experts;
        let (active, offsets, order) = self.routing;
        let (y, y_b) = (
            vec![f32::NAN; self.pairs * self.n],
            vec![f32::NAN; self.pairs * self.n],
        );
        let (a, b) = (Addr::of(first), second.map(Addr::of));
        let (ac, of, or) = (Addr::of(active), Addr::of(offsets), Addr::of(order));
        let (xha, xsa, ya, yb) = (
            Addr::of(self.x.0),
            Addr::of(self.x.1),
            Addr::of(&y),
            Addr::of(&y_b),
        );
        let tables = if second.is_some() { 2 } else { 1 };
        let grid = tables * active.len() * self.n.div_ceil(16);
        // SAFETY: the grouped expert kernels' signature in kernels/gemv_tc.cu, over buffers of
        // the sizes ops.rs gives them.
        unsafe {
            let f: Experts = self.kern.kernel(name);
            self.kern.launch(grid as u32, 32 * warps, &|| {
                let (tb, ybp) = match b {
                    Some(b) => (b.ptr(), yb.ptr()),
                    None => (std::ptr::null_mut(), std::ptr::null_mut()),
                };
                f(
                    a.ptr(),
                    ya.ptr(),
                    tb,
                    ybp,
                    ac.ptr(),
                    of.ptr(),
                    or.ptr(),
                    self.row_bytes,
                    xha.ptr(),
                    xsa.ptr(),
                    self.n as i32,
                    self.kd as i32,
                    self.col_div as i32,
                    self.chains as i32,
                )
            });
        }
        (y, y_b)
    }

    /// The product of one token's activations `x` by an expert alone (`tiles`, of `format`):
    /// its tiled GEMV with one warp a chain, the bits every pair of that token must have.
    fn alone(&self, format: GgmlType, tiles: &[u8], x: &[f32]) -> Vec<f32> {
        let gemv = TcGemv {
            kern: self.kern,
            format,
            tiles: tiles.to_vec(),
            n: self.n,
            kd: self.kd,
            warps: self.chains,
        };
        gemv.run(x, TcLaunch::Tiled)
    }
}

/// The grouped expert GEMV (`gemv_tc_experts_*`, and its 8-pair build `gemv_tc_experts8_*`)
/// gives each (token, expert) pair the bits of the tiled GEMV of its expert on its token alone,
/// with 1, 2, 4 or 8 warps a block taking the 8 chains of K blocks (ops::expert_warps picks the
/// warps by the launch's size).
#[test]
fn the_grouped_expert_gemv_has_the_tiled_bits_at_every_warp_count() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (n, kd, chains, experts, top_k, tokens) =
        (40usize, 6144usize, 8u32, 3usize, 2usize, 5usize);
    let t = GgmlType::Q4_K;
    let weights: Vec<Weight> = (0..experts)
        .map(|e| kquant(t, n, kd, &[0, 2], 11 + e as u64))
        .collect();
    let tiled: Vec<Vec<u8>> = weights
        .iter()
        .map(|w| super::weights::tiled(t, w.raw_bytes(), n, kd / 256))
        .collect();
    // Pair p = token · top_k + j chose expert ids[p]; expert 1 takes three pairs, expert 0 none.
    let ids = [1usize, 2, 2, 1, 1, 2, 2, 1, 2, 1];
    let slots = experts.min(tokens * top_k);
    let (mut active, mut offsets, mut order) = (vec![-1i32; slots], vec![0i32], Vec::new());
    for e in 0..experts {
        let pairs: Vec<i32> = (0..ids.len())
            .filter(|&p| ids[p] == e)
            .map(|p| p as i32)
            .collect();
        if !pairs.is_empty() {
            active[offsets.len() - 1] = e as i32;
            order.extend(pairs);
            offsets.push(order.len() as i32);
        }
    }
    offsets.resize(slots + 1, order.len() as i32);
    let x = random(tokens * kd, 21);
    let (xh, xscale) = tc_input(&kern, &x);
    let table: Vec<u64> = tiled.iter().map(|w| w.as_ptr() as u64).collect();
    let row_bytes = t.row_bytes(kd) as i64;
    let launch = ExpertLaunch {
        kern: &kern,
        routing: (&active, &offsets, &order),
        x: (&xh, &xscale),
        pairs: ids.len(),
        n,
        kd,
        row_bytes,
        col_div: top_k,
        chains,
    };
    // The products of the experts `first`, and with `second` those of another table in the same
    // launch (the gate and up products of a layer).
    let run = |warps: u32, first: &[u64], second: Option<&[u64]>| {
        launch.run("gemv_tc_experts_q4_k", warps, first, second)
    };
    let (eight, _) = run(8, &table, None);
    for (p, &e) in ids.iter().enumerate() {
        let token = p / top_k;
        let alone = launch.alone(t, &tiled[e], &x[token * kd..(token + 1) * kd]);
        assert_eq!(
            bits(&eight[p * n..(p + 1) * n]),
            bits(&alone),
            "pair {p} (token {token}, expert {e}) differs from its expert's GEMV alone"
        );
    }
    for warps in [1, 2, 4] {
        assert_eq!(
            bits(&run(warps, &table, None).0),
            bits(&eight),
            "{warps} warps a block"
        );
    }
    for warps in [1, 2, 4, 8] {
        assert_eq!(
            bits(&launch.run("gemv_tc_experts8_q4_k", warps, &table, None).0),
            bits(&eight),
            "the 8-pair build at {warps} warps a block"
        );
    }
    // Beside a second table (the experts in reverse), each product has the bits of its own
    // launch.
    let reversed: Vec<u64> = table.iter().rev().copied().collect();
    let (first, second) = run(2, &table, Some(&reversed));
    let (apart, _) = run(2, &reversed, None);
    assert_eq!(bits(&first), bits(&eight), "the first of two tables");
    assert_eq!(bits(&second), bits(&apart), "the second of two tables");
}

/// The prefill passes' grouped expert kernel (`gemm_tc_experts_*`, up to 64 pairs per decoding
/// of a block, at 1 to 3 warps a block) and the 8-pair build give every pair the bits of the
/// 16-pair kernel and of its expert's GEMV on its token alone: an expert with 70 pairs (a
/// 64-pair span and 6) and one with 30, with one K block a chain and with chain 0 taking two.
#[test]
fn the_prefill_expert_kernels_have_the_bits_of_the_narrow_one() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (n, kd, tokens) = (40usize, 768usize, 100usize);
    for (t, fields) in [(GgmlType::Q4_K, &[0usize, 2][..]), (GgmlType::Q6_K, &[208])] {
        let tiled: Vec<Vec<u8>> = (0..2)
            .map(|e| {
                let w = kquant(t, n, kd, fields, 31 + e as u64);
                super::weights::tiled(t, w.raw_bytes(), n, kd / 256)
            })
            .collect();
        // Token i (top 1) chose expert 0 below 70, expert 1 after.
        let (active, offsets) = (vec![0i32, 1], vec![0i32, 70, 100]);
        let order: Vec<i32> = (0..tokens as i32).collect();
        let x = random(tokens * kd, 41);
        let (xh, xscale) = tc_input(&kern, &x);
        let table: Vec<u64> = tiled.iter().map(|w| w.as_ptr() as u64).collect();
        let row_bytes = t.row_bytes(kd) as i64;
        let suffix = if t == GgmlType::Q4_K { "q4_k" } else { "q6_k" };
        for chains in [3u32, 2] {
            let launch = ExpertLaunch {
                kern: &kern,
                routing: (&active, &offsets, &order),
                x: (&xh, &xscale),
                pairs: tokens,
                n,
                kd,
                row_bytes,
                col_div: 1,
                chains,
            };
            let run = |name: &str, warps: u32| launch.run(name, warps, &table, None).0;
            let narrow = run(&format!("gemv_tc_experts_{suffix}"), 2);
            // The 8-pair build, 8 of an expert's pairs at a time (70: 8 chunks and 6).
            assert_eq!(
                bits(&run(&format!("gemv_tc_experts8_{suffix}"), 2)),
                bits(&narrow),
                "{t}, {chains} chains: the 8-pair build against the 16-pair one"
            );
            for warps in 1..=chains {
                assert_eq!(
                    bits(&run(&format!("gemm_tc_experts_{suffix}"), warps)),
                    bits(&narrow),
                    "{t}, {chains} chains: gemm_tc_experts at {warps} warps against the narrow kernel"
                );
            }
            for p in [0usize, 17, 31, 32, 63, 64, 69, 70, 99] {
                let e = usize::from(p >= 70);
                let alone = launch.alone(t, &tiled[e], &x[p * kd..(p + 1) * kd]);
                assert_eq!(
                    bits(&narrow[p * n..(p + 1) * n]),
                    bits(&alone),
                    "{t}, {chains} chains: pair {p} against its expert's GEMV alone"
                );
            }
        }
    }
}

/// Device routing on the host: `moe_route` picks each token's top-k experts by probability
/// (ties to the lower index, here from equal logits) with renormalised weights; given its
/// counter, its last block lists the active experts in order with their pairs in increasing
/// order and leaves the counter at 0 (as do `moe_group_counts`, `moe_group_slots` and
/// `moe_group_scatter`, a prefill pass's grouping),
/// and `moe_combine` adds the weighted products to the gated residual with the bits of the
/// formula, value by value. Expert counts under one, two, four, eight, sixteen and up to 32 a
/// lane (12, 60, 100, 256, 500, 1,000: each of the router's builds),
/// the tokens in one routing block (up to 32) and in several, one warp's routing and grouping
/// (up to 32 pairs: a decode step's) against the blocks', and more pairs than threads. With
/// the shared expert routed as each token's first pair (expert E, weight sigmoid(gate)), the
/// grouping counts it as one more expert and the sum starts from zero.
#[test]
fn the_moe_routing_kernels_on_the_host_match_the_reference() {
    let Some(kern) = kernels(DIMS_32) else { return };
    type Route = host::moe_route;
    type Counts = host::moe_group_counts;
    type Slots = host::moe_group_slots;
    type Scatter = host::moe_group_scatter;
    type Combine = host::moe_combine;
    // (256, 8, 200): 1,600 pairs, grouped over two stagings of 1,024 (and 7 chunks of 256);
    // (1000, 10, 110): 1,100 pairs of up to 1,000 experts.
    for (experts, top_k, tokens, shared) in [
        (12usize, 3usize, 5usize, false),
        (12, 3, 5, true),
        (256, 8, 1, false),
        (256, 8, 1, true),
        (256, 8, 3, true),
        (256, 8, 40, true),
        (1000, 10, 3, false),
        (60, 4, 2, false),
        (100, 6, 7, true),
        (500, 8, 3, false),
        (256, 8, 200, false),
        (256, 8, 200, true),
        (1000, 10, 110, false),
    ] {
        let mut logits = random(tokens * experts, (experts + tokens) as u64);
        // Ties among the chosen, to go to the lower index: across lanes (0, 1; 2, 40 of the last
        // token) and within a lane's experts (3, 259: lane 3 holds both).
        (logits[0], logits[1]) = (9.0, 9.0);
        if experts > 259 {
            (logits[3], logits[259]) = (10.0, 10.0);
        }
        let last = (tokens - 1) * experts;
        (logits[last + 2], logits[last + 40.min(experts - 1)]) = (8.0, 8.0);
        // The grouping's experts and each token's pairs, the shared expert's included.
        let (grouped, per) = (experts + usize::from(shared), top_k + usize::from(shared));
        let pairs = tokens * per;
        let (ids, weights) = (vec![-1i32; pairs], vec![f32::NAN; pairs]);
        let slots = grouped.min(pairs);
        let shared_gate = random(tokens, 9);
        let (la, ia, wa) = (Addr::of(&logits), Addr::of(&ids), Addr::of(&weights));
        let sga = Addr::of(&shared_gate);
        // The routing, and with `grouping` (active, offsets, order and the counter) the grouping
        // by its last block; by blocks of 1,024 threads, or (up to 32 pairs) by one warp.
        let route = |grouping: Option<[Addr; 4]>, warp: bool| {
            let (blocks, threads) = if warp {
                (1, 32)
            } else {
                (tokens.div_ceil(32) as u32, 1024)
            };
            // SAFETY: moe_route's signature in kernels/moe.cu, over buffers of the sizes
            // ops::moe_route gives them.
            unsafe {
                let route: Route = kern.kernel("moe_route");
                kern.launch(blocks, threads, &|| {
                    let sg = if shared {
                        sga.ptr()
                    } else {
                        std::ptr::null_mut()
                    };
                    let null = std::ptr::null_mut();
                    let [aa, oa, ra, da] = grouping.map_or([null; 4], |g| g.map(|a| a.ptr()));
                    route(
                        la.ptr(),
                        tokens as i32,
                        ia.ptr(),
                        wa.ptr(),
                        experts as i32,
                        top_k as i32,
                        sg,
                        da,
                        slots as i32,
                        aa,
                        oa,
                        ra,
                    )
                });
            }
        };
        route(None, false);
        // The grouping by the routing's last block (or its one warp), by moe_group, then by
        // chunks: (active, offsets, order) of each.
        let grouped = |how: &str| {
            let (active, offsets, order) = (
                vec![-7i32; slots],
                vec![-7i32; slots + 1],
                vec![-7i32; pairs],
            );
            let chunks = pairs.div_ceil(256);
            let counts = vec![-7i32; chunks * grouped];
            let (aa, oa, ra) = (Addr::of(&active), Addr::of(&offsets), Addr::of(&order));
            let ca = Addr::of(&counts);
            let (p, e, s) = (pairs as i32, grouped as i32, slots as i32);
            if how == "last block" || how == "one warp" {
                let done = [0i32];
                route(Some([aa, oa, ra, Addr::of(&done)]), how == "one warp");
                assert_eq!(done[0], 0, "E={experts} T={tokens}: the counter left at 0");
                return (active, offsets, order);
            }
            // SAFETY: the signatures of the grouping kernels in kernels/moe.cu, over buffers of the
            // sizes ops::moe_route gives them.
            unsafe {
                if how == "moe_group" {
                    let f: host::moe_group = kern.kernel("moe_group");
                    kern.launch(1, 1024, &|| {
                        f(ia.ptr(), p, e, s, aa.ptr(), oa.ptr(), ra.ptr())
                    });
                    return (active, offsets, order);
                }
                let f: Counts = kern.kernel("moe_group_counts");
                kern.launch(chunks as u32, 256, &|| f(ia.ptr(), p, e, ca.ptr()));
                let f: Slots = kern.kernel("moe_group_slots");
                kern.launch(1, 1024, &|| {
                    f(ca.ptr(), chunks as i32, e, s, aa.ptr(), oa.ptr())
                });
                let f: Scatter = kern.kernel("moe_group_scatter");
                kern.launch(chunks as u32, 256, &|| {
                    f(ia.ptr(), p, e, ca.ptr(), ra.ptr())
                });
            }
            (active, offsets, order)
        };
        for (ti, row) in logits.chunks_exact(experts).enumerate() {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let p: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
            let sum: f32 = p.iter().sum();
            let mut by_p: Vec<usize> = (0..experts).collect();
            by_p.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let norm: f32 = by_p[..top_k].iter().map(|&e| p[e] / sum).sum();
            if shared {
                assert_eq!(ids[ti * per], experts as i32, "token {ti}: the shared pair");
                let want = 1.0 / (1.0 + (-shared_gate[ti]).exp());
                assert!(
                    (weights[ti * per] - want).abs() < 1e-6,
                    "token {ti}: its gate"
                );
            }
            for (j, &e) in by_p[..top_k].iter().enumerate() {
                let at = ti * per + usize::from(shared) + j;
                assert_eq!(ids[at], e as i32, "E={experts} token {ti} slot {j}");
                assert!(
                    (weights[at] - p[e] / sum / norm).abs() < 1e-5,
                    "E={experts} token {ti} slot {j}"
                );
            }
        }
        let mut want_active: Vec<i32> = ids.clone();
        want_active.sort_unstable();
        want_active.dedup();
        let mut want_order = Vec::new();
        let mut want_offsets = vec![0i32];
        for &e in &want_active {
            want_order.extend((0..pairs as i32).filter(|&p| ids[p as usize] == e));
            want_offsets.push(want_order.len() as i32);
        }
        want_offsets.resize(slots + 1, pairs as i32);
        want_active.resize(slots, -1);
        let warp_ids = (ids.clone(), weights.clone());
        let warp = pairs <= 32;
        for how in ["last block", "one warp", "moe_group", "chunks"] {
            if how == "one warp" && !warp {
                continue;
            }
            let (active, offsets, order) = grouped(how);
            // The warp routes as the blocks do.
            let same = ids == warp_ids.0
                && weights
                    .iter()
                    .zip(&warp_ids.1)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "E={experts} T={tokens}, {how}: the routing changed");
            assert_eq!(
                active, want_active,
                "E={experts} T={tokens}, {how}: active experts"
            );
            assert_eq!(
                offsets, want_offsets,
                "E={experts} T={tokens}, {how}: offsets"
            );
            assert_eq!(order, want_order, "E={experts} T={tokens}, {how}: order");
        }
        // The weighted sum into a gated residual of 300 values a row (two blocks and a part).
        let d = 300;
        let y = random(pairs * d, 5);
        let (out, gate) = (random(tokens * d, 6), random(tokens, 7));
        let want: Vec<f32> = (0..tokens * d)
            .map(|at| {
                let (t, i) = (at / d, at % d);
                let mut acc = if shared {
                    0.0
                } else {
                    out[at] * (1.0 / (1.0 + (-gate[t]).exp()))
                };
                for j in 0..per {
                    acc = weights[t * per + j].mul_add(y[(t * per + j) * d + i], acc);
                }
                acc
            })
            .collect();
        let (ya, wa, outa, ga) = (
            Addr::of(&y),
            Addr::of(&weights),
            Addr::of(&out),
            Addr::of(&gate),
        );
        // SAFETY: moe_combine's signature; `out` holds tokens rows of d.
        unsafe {
            let combine: Combine = kern.kernel("moe_combine");
            kern.launch((tokens * d.div_ceil(256)) as u32, 256, &|| {
                let gate = if shared {
                    std::ptr::null_mut()
                } else {
                    ga.ptr()
                };
                combine(ya.ptr(), wa.ptr(), outa.ptr(), gate, per as i32, d as i32)
            });
        }
        assert_eq!(bits(&out), bits(&want), "E={experts}: the weighted sum");
        if shared {
            pairs_through_the_norm(&kern, &y, &weights, per, &out, tokens, d);
        }
    }
}

/// The residual add before a norm, given a MoE layer's pairs (`add_rms_norm` with `per`, and
/// `add_rms_norm_to_f16_tc`, whose rows stay on chip), has the bits of `moe_combine` (`sum`: its
/// output, no gate) then the add of rows.
fn pairs_through_the_norm(
    kern: &HostKernels,
    y: &[f32],
    weights: &[f32],
    per: usize,
    sum: &[f32],
    tokens: usize,
    d: usize,
) {
    let (x0, w) = (random(tokens * d, 31), random(d, 32));
    let threads = (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
    let run = |addend: &[f32], pairs: bool, fused: bool| {
        let (x, out) = (x0.clone(), vec![f32::NAN; tokens * d]);
        let (xa, ya, wa, oa) = (Addr::of(&x), Addr::of(addend), Addr::of(&w), Addr::of(&out));
        let pw = Addr::of(weights);
        let per = if pairs { per as i32 } else { 0 };
        let pw_or_null = || {
            if pairs {
                pw.ptr()
            } else {
                std::ptr::null_mut()
            }
        };
        // SAFETY: the signatures of add_rms_norm and add_rms_norm_to_f16_tc, over rows of d
        // (pairs: tokens · per of them), no conversion asked of the second.
        unsafe {
            if fused {
                let norm: host::add_rms_norm_to_f16_tc = kern.kernel("add_rms_norm_to_f16_tc");
                kern.launch(tokens as u32, threads, &|| {
                    norm(
                        xa.ptr(),
                        ya.ptr(),
                        wa.ptr(),
                        oa.ptr(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        d as i32,
                        1e-6,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        pw_or_null(),
                        per,
                    )
                });
            } else {
                let norm: host::add_rms_norm = kern.kernel("add_rms_norm");
                kern.launch(tokens as u32, threads, &|| {
                    norm(
                        xa.ptr(),
                        ya.ptr(),
                        wa.ptr(),
                        oa.ptr(),
                        d as i32,
                        1e-6,
                        pw_or_null(),
                        per,
                    )
                });
            }
        }
        (bits(&x), bits(&out))
    };
    let plain = run(sum, false, false);
    assert_eq!(run(y, true, false), plain, "d={d}: the pairs' sum added");
    assert_eq!(
        run(y, true, true),
        plain,
        "d={d}: the pairs' sum added, the row on chip"
    );
}

/// The MLP's fused conversion (`silu_mul_to_f16_tc`) writes the bits of `silu_mul` then
/// `to_f16_tc`.
#[test]
fn the_fused_swiglu_conversion_has_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let blocks = 6usize;
    let (g, u) = (random(256 * blocks, 21), random(256 * blocks, 22));
    let convert = |fused: bool| {
        let gated = g.clone();
        let (xh, xs) = (vec![0u16; 256 * blocks], vec![0.0f32; blocks]);
        let (ga, ua, xha, xsa) = (Addr::of(&gated), Addr::of(&u), Addr::of(&xh), Addr::of(&xs));
        let threads = (blocks * 32) as u32;
        // SAFETY: the signatures of silu_mul, to_f16_tc and silu_mul_to_f16_tc in kernels/,
        // over buffers of `blocks` 256-value blocks.
        unsafe {
            if fused {
                let f: host::silu_mul_to_f16_tc = kern.kernel("silu_mul_to_f16_tc");
                kern.launch(1, threads, &|| {
                    f(ga.ptr(), ua.ptr(), xha.ptr(), xsa.ptr(), blocks as i64)
                });
            } else {
                let silu: host::silu_mul = kern.kernel("silu_mul");
                kern.launch(blocks as u32, 256, &|| {
                    silu(ga.ptr(), ua.ptr(), 256 * blocks as i64)
                });
                let f: host::to_f16_tc = kern.kernel("to_f16_tc");
                kern.launch(1, threads, &|| {
                    f(ga.ptr(), xha.ptr(), xsa.ptr(), blocks as i64)
                });
            }
        }
        (xh, xs.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
    };
    assert_eq!(convert(true), convert(false));
}

/// The gates' fused conversions write the bits of their kernel then `to_f16_tc`, or with no
/// f16 output `quantize_q8_blocks`: the GDN output norm (`rms_norm_gated_to_f16_tc`, rows of
/// 128 and 256: two rows and one a 256-value block) and the attention output gate
/// (`sigmoid_gate_to_f16_tc`), both the converted rows and the f32 ones.
#[test]
fn the_fused_gate_conversions_have_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    // Three tokens of two 256-value blocks.
    let (blocks, kd) = (6usize, 512usize);
    let n = 256 * blocks;
    let (x, z, gate) = (random(n, 31), random(n, 32), random(n, 33));
    type Converted = (Vec<u16>, Vec<u32>, Vec<i8>, Vec<u32>, Vec<i16>);
    let converted = |rows: &[f32]| -> Converted {
        let (xh, xs) = tc_input(&kern, rows);
        let (q, qd, qs) = q8_blocks_input(&kern, rows, kd);
        (xh, bits(&xs), q, bits(&qd), qs)
    };
    // The kernel run twice: into the f16 rows, then into the int8 blocks (f16 pointers null).
    let fused = |launch: &dyn Fn(Addr, [Addr; 5])| -> (Vec<u32>, Converted) {
        let (out, xh, xs) = (vec![0f32; n], vec![0u16; n], vec![0f32; blocks]);
        let (out2, q, qd, qs) = (
            vec![0f32; n],
            vec![0i8; n],
            vec![0f32; blocks],
            vec![0i16; n / 32],
        );
        launch(
            Addr::of(&out),
            [Addr::of(&xh), Addr::of(&xs), Addr(0), Addr(0), Addr(0)],
        );
        launch(
            Addr::of(&out2),
            [Addr(0), Addr(0), Addr::of(&q), Addr::of(&qd), Addr::of(&qs)],
        );
        assert_eq!(bits(&out), bits(&out2));
        (bits(&out), (xh, bits(&xs), q, bits(&qd), qs))
    };
    // Two warps a block of threads: the last block's second warp has no 256 values.
    let grid = (blocks.div_ceil(2) as u32, 64);
    for d in [128usize, 256] {
        let w = random(d, 34);
        let rows = n / d;
        let plain = vec![0f32; n];
        let pa = Addr::of(&plain);
        // SAFETY: rms_norm_gated's and rms_norm_gated_to_f16_tc's signatures, over buffers of
        // `rows` rows of `d` (ops/norm.rs's grids).
        kern.launch(rows.div_ceil(8) as u32, 256, &|| unsafe {
            let f: host::rms_norm_gated = kern.kernel("rms_norm_gated");
            f(
                x.as_ptr(),
                z.as_ptr(),
                w.as_ptr(),
                pa.ptr(),
                rows as i32,
                d as i32,
                1e-6,
            )
        });
        let got = fused(&|out, [xh, xs, q, qd, qs]| {
            kern.launch(grid.0, grid.1, &|| unsafe {
                let f: host::rms_norm_gated_to_f16_tc = kern.kernel("rms_norm_gated_to_f16_tc");
                f(
                    x.as_ptr(),
                    z.as_ptr(),
                    w.as_ptr(),
                    out.ptr(),
                    xh.ptr(),
                    xs.ptr(),
                    d as i32,
                    1e-6,
                    blocks as i64,
                    q.ptr(),
                    qd.ptr(),
                    qs.ptr(),
                    (kd / 256) as i32,
                )
            })
        });
        assert_eq!(
            got,
            (bits(&plain), converted(&plain)),
            "rms_norm_gated_to_f16_tc d={d}"
        );
    }
    let plain = x.clone();
    let pa = Addr::of(&plain);
    // SAFETY: sigmoid_gate's and sigmoid_gate_to_f16_tc's signatures over n values.
    kern.launch(blocks as u32, 256, &|| unsafe {
        let f: host::sigmoid_gate = kern.kernel("sigmoid_gate");
        f(pa.ptr(), gate.as_ptr(), n as i64)
    });
    let got = fused(&|out, [xh, xs, q, qd, qs]| {
        // The kernel gates in place: `out` starts as x.
        // SAFETY: out holds n values.
        unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), out.ptr(), n) };
        kern.launch(grid.0, grid.1, &|| unsafe {
            let f: host::sigmoid_gate_to_f16_tc = kern.kernel("sigmoid_gate_to_f16_tc");
            f(
                out.ptr(),
                gate.as_ptr(),
                xh.ptr(),
                xs.ptr(),
                blocks as i64,
                q.ptr(),
                qd.ptr(),
                qs.ptr(),
                (kd / 256) as i32,
            )
        })
    });
    assert_eq!(
        got,
        (bits(&plain), converted(&plain)),
        "sigmoid_gate_to_f16_tc"
    );
}

/// The attention's query / gate split and its q and k norms in one launch
/// (`split_q_gate_qk_norm`) write the bits of `split_q_gate` then two `rms_norm`s in place.
#[test]
fn the_split_and_qk_norms_in_one_launch_have_the_bits_of_the_three() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (q_rows, k_rows, d) = (6usize, 2usize, 256usize);
    let threads = (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
    let (qg, k0) = (random(q_rows * 2 * d, 101), random(k_rows * d, 102));
    let (wq, wk) = (random(d, 103), random(d, 104));
    let run = |fused: bool| {
        let (q, gate, keys) = (
            vec![f32::NAN; q_rows * d],
            vec![f32::NAN; q_rows * d],
            k0.clone(),
        );
        let (qa, ga, ka) = (Addr::of(&q), Addr::of(&gate), Addr::of(&keys));
        // SAFETY: the signatures of split_q_gate, rms_norm and split_q_gate_qk_norm, and the
        // grids of ops/rope.rs and ops/norm.rs.
        unsafe {
            if fused {
                let f: host::split_q_gate_qk_norm = kern.kernel("split_q_gate_qk_norm");
                kern.launch((q_rows + k_rows) as u32, threads, &|| {
                    f(
                        qg.as_ptr(),
                        qa.ptr(),
                        ga.ptr(),
                        ka.ptr(),
                        wq.as_ptr(),
                        wk.as_ptr(),
                        d as i32,
                        1e-6,
                        q_rows as i32,
                    )
                });
            } else {
                let split: host::split_q_gate = kern.kernel("split_q_gate");
                kern.launch(q_rows as u32, 128, &|| {
                    split(qg.as_ptr(), qa.ptr(), ga.ptr(), d as i32)
                });
                let norm: host::rms_norm = kern.kernel("rms_norm");
                kern.launch(q_rows as u32, threads, &|| {
                    norm(qa.ptr(), wq.as_ptr(), qa.ptr(), d as i32, 1e-6)
                });
                kern.launch(k_rows as u32, threads, &|| {
                    norm(ka.ptr(), wk.as_ptr(), ka.ptr(), d as i32, 1e-6)
                });
            }
        }
        [bits(&q), bits(&gate), bits(&keys)]
    };
    assert_eq!(run(true), run(false));
}

/// `x` `[tokens, kd]` through to_f16_tc: the f16 rows and the scales per 256 values that the
/// tensor-core GEMVs read.
fn tc_input(kern: &HostKernels, x: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let blocks256 = x.len() / 256;
    let (xh, xscale) = (vec![0u16; x.len()], vec![0.0f32; blocks256]);
    let (xa, xha, xsa) = (Addr::of(x), Addr::of(&xh), Addr::of(&xscale));
    // SAFETY: to_f16_tc's signature, over buffers of the sizes ops.rs gives it.
    unsafe {
        let to_f16: host::to_f16_tc = kern.kernel("to_f16_tc");
        kern.launch(blocks256.div_ceil(8) as u32, 256, &|| {
            to_f16(xa.ptr(), xha.ptr(), xsa.ptr(), blocks256 as i64)
        });
    }
    (xh, xscale)
}

/// `x` (rows of `kd`) as the int8 tensor-core GEMV reads it (`quantize_q8_blocks`): codes,
/// scales, sums.
fn q8_blocks_input(kern: &HostKernels, x: &[f32], kd: usize) -> (Vec<i8>, Vec<f32>, Vec<i16>) {
    let blocks256 = x.len() / 256;
    let (q, qd, qs) = (
        vec![0i8; x.len()],
        vec![0.0f32; blocks256],
        vec![0i16; x.len() / 32],
    );
    let (xa, qa, da, sa) = (Addr::of(x), Addr::of(&q), Addr::of(&qd), Addr::of(&qs));
    // SAFETY: quantize_q8_blocks's signature, over buffers of the sizes ops.rs gives it.
    unsafe {
        let f: host::quantize_q8_blocks = kern.kernel("quantize_q8_blocks");
        kern.launch(blocks256.div_ceil(8) as u32, 256, &|| {
            f(
                xa.ptr(),
                qa.ptr(),
                da.ptr(),
                sa.ptr(),
                blocks256 as i64,
                (kd / 256) as i32,
            )
        });
    }
    (q, qd, qs)
}

/// `x` as the dp4a GEMVs read it (`quantize_q8`): codes, and a scale and a sum per 32 values.
fn q8_input(kern: &HostKernels, x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let blocks32 = x.len() / 32;
    let (q, qd, qs) = (
        vec![0i8; x.len()],
        vec![0f32; blocks32],
        vec![0f32; blocks32],
    );
    let (xa, qa, da, sa) = (Addr::of(x), Addr::of(&q), Addr::of(&qd), Addr::of(&qs));
    // SAFETY: quantize_q8's signature (a thread a value), over buffers of these sizes.
    unsafe {
        let f: host::quantize_q8 = kern.kernel("quantize_q8");
        kern.launch(x.len().div_ceil(256) as u32, 256, &|| {
            f(xa.ptr(), qa.ptr(), da.ptr(), sa.ptr(), blocks32 as i64)
        });
    }
    (q, qd, qs)
}

/// How [`TcGemv::run`] launches the tensor-core GEMV.
#[derive(Clone, Copy, Debug)]
enum TcLaunch {
    /// A block per 16-row tile: gemv_tc8, or gemv_tc16 for more than 8 tokens.
    Tiled,
    /// Stream-K over this many blocks (gemv_tcs8/16 and gemv_tc_fixup).
    StreamK(usize),
}

/// A k-quant weight, tiled as on the device, multiplied by the tensor-core GEMV kernels as
/// ops::gemv_tc launches them.
struct TcGemv<'a> {
    kern: &'a HostKernels,
    format: GgmlType,
    tiles: Vec<u8>,
    n: usize,
    kd: usize,
    /// Warps per block of the tiled kernels.
    warps: u32,
}

impl TcGemv<'_> {
    /// `x` `[tokens, kd]` through to_f16_tc, then the GEMV kernels `launch` names.
    fn run(&self, x: &[f32], launch: TcLaunch) -> Vec<f32> {
        let stream_k = match launch {
            TcLaunch::StreamK(blocks) => Some(blocks),
            _ => None,
        };
        let (kern, n, kd) = (self.kern, self.n, self.kd);
        let tokens = x.len() / kd;
        let (xh, xscale) = tc_input(kern, x);
        let y = vec![f32::NAN; tokens * n];
        let tiles = n.div_ceil(16);
        let max_pieces = stream_k.map_or(0, |b| (kd / 256).div_ceil(tiles * (kd / 256) / b) + 1);
        let partials = vec![f32::NAN; tiles * max_pieces * 256];
        let (xha, xsa, ya, wa, pa) = (
            Addr::of(&xh),
            Addr::of(&xscale),
            Addr::of(&y),
            Addr::of(&self.tiles),
            Addr::of(&partials),
        );
        let suffix = if self.format == GgmlType::Q4_K {
            "q4_k"
        } else {
            "q6_k"
        };
        let row_bytes = self.format.row_bytes(kd) as i64;
        // SAFETY (every launch): the signatures of gemv_tc8/16_*, gemv_tcs8/16_* and
        // gemv_tc_fixup in kernels/gemv_tc.cu, over buffers of the sizes ops.rs gives them.
        unsafe {
            type Gemv = host::gemv_tc;
            type StreamK = host::gemv_tcs;
            type Fixup = host::gemv_tc_fixup;
            let (n32, kd32, t32) = (n as i32, kd as i32, tokens as i32);
            match stream_k {
                None => {
                    let width = if tokens <= 8 { 8 } else { 16 };
                    let name = format!("gemv_tc{width}_{suffix}");
                    let f: Gemv = kern.kernel(&name);
                    kern.launch(n.div_ceil(16) as u32, 32 * self.warps, &|| {
                        f(
                            wa.ptr(),
                            row_bytes,
                            xha.ptr(),
                            xsa.ptr(),
                            ya.ptr(),
                            std::ptr::null_mut(),
                            n32,
                            n32,
                            kd32,
                            t32,
                        )
                    });
                }
                Some(blocks) => {
                    let width = if tokens <= 8 { 8 } else { 16 };
                    let f: StreamK = kern.kernel(&format!("gemv_tcs{width}_{suffix}"));
                    let mp = max_pieces as i32;
                    kern.launch(blocks as u32, 128, &|| {
                        f(
                            wa.ptr(),
                            row_bytes,
                            xha.ptr(),
                            xsa.ptr(),
                            ya.ptr(),
                            std::ptr::null_mut(),
                            n32,
                            n32,
                            kd32,
                            t32,
                            pa.ptr(),
                            mp,
                        )
                    });
                    let fix: Fixup = kern.kernel("gemv_tc_fixup");
                    kern.launch((tiles * tokens * 16).div_ceil(256) as u32, 256, &|| {
                        fix(
                            pa.ptr(),
                            ya.ptr(),
                            std::ptr::null_mut(),
                            n32,
                            n32,
                            kd32,
                            t32,
                            blocks as i32,
                            mp,
                        )
                    });
                }
            }
        }
        y
    }
}

/// The kernels' code for a cache format (`KV_F32`, `KV_BF16`, `KV_INT8`).
fn kv_code(format: KvFormat) -> i32 {
    match format {
        KvFormat::F32 => 0,
        KvFormat::Bf16 => 1,
        KvFormat::Int8 => 2,
    }
}

/// A cache `[S, hkv, d]` filled by the emulated `kv_append`, as the model fills it.
struct HostCache {
    k: Vec<u8>,
    ks: Vec<f32>,
    v: Vec<u8>,
    vs: Vec<f32>,
}

impl HostCache {
    /// Keys, key scales, values, value scales: the cache arguments of the attention kernels.
    fn addrs(&self) -> (Addr, Addr, Addr, Addr) {
        (
            Addr::of(&self.k),
            Addr::of(&self.ks),
            Addr::of(&self.v),
            Addr::of(&self.vs),
        )
    }

    fn new(
        kern: &HostKernels,
        format: KvFormat,
        keys: &[f32],
        values: &[f32],
        hkv: usize,
        d: usize,
    ) -> Self {
        let s = keys.len() / (hkv * d);
        let eb = format.value_bytes();
        let c = Self {
            k: vec![0; s * hkv * d * eb],
            ks: vec![0.0; s * hkv],
            v: vec![0; s * hkv * d * eb],
            vs: vec![0.0; s * hkv],
        };
        let fmt = kv_code(format);
        // SAFETY: kv_append's signature; the cache holds s positions.
        unsafe {
            let append: host::kv_append = kern.kernel("kv_append");
            for (src, codes, scales) in [(keys, &c.k, &c.ks), (values, &c.v, &c.vs)] {
                let (xa, ca, sa) = (Addr::of(src), Addr::of(codes), Addr::of(scales));
                kern.launch((s * hkv) as u32, 128, &|| {
                    append(
                        xa.ptr(),
                        ca.ptr(),
                        sa.ptr(),
                        fmt,
                        d as i32,
                        hkv as i32,
                        0,
                        std::ptr::null(),
                    )
                });
            }
        }
        c
    }
}

/// The flash-attention prefill kernel gives the CPU's attention for every KV format, at the
/// fixture's head dim and the real one, over passes that start mid-cache, end in a partial
/// tile, and with a sliding window; its int8 twin that copies rows a tile ahead
/// (`attention_prefill_async`) gives the same bits.
#[test]
fn the_flash_attention_prefill_on_the_host_matches_the_cpu() {
    for dims in [DIMS_32, DIMS_256] {
        let Some(kern) = kernels(dims) else { return };
        let d = dims.head_dim;
        let (hq, hkv) = (4, 2);
        for (pos0, t, window) in [
            (0usize, 70usize, None),
            (37, 45, None),
            (5, 100, Some(24usize)),
        ] {
            let s = pos0 + t;
            let keys = random(s * hkv * d, 21);
            let values = random(s * hkv * d, 22);
            let q = random(t * hq * d, 23);
            let scale = (d as f32).powf(-0.5);
            for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
                let want =
                    cpu_attention(&q, &keys, &values, format, hq, hkv, d, pos0, scale, window);
                let cache = HostCache::new(&kern, format, &keys, &values, hkv, d);
                let fmt = kv_code(format);
                // The keys in one piece, then in chunks of 32 (the split a short pass over a
                // long context gets), merged by attention_combine.
                for chunk in [s.div_ceil(32) * 32, 32] {
                    let nchunks = s.div_ceil(chunk);
                    let run = |kernel: &str| {
                        attention_prefill(
                            &kern,
                            kernel,
                            &q,
                            &cache,
                            fmt,
                            (hq, hkv, d),
                            (pos0, t),
                            scale,
                            window,
                            (chunk, nchunks),
                        )
                    };
                    let out = run("attention_prefill");
                    let err = rel_err(&out, &want);
                    // f16 queries, keys, values and probabilities, f32 sums.
                    assert!(
                        err < 4e-3,
                        "d={d} pos0={pos0} t={t} window={window:?} {format:?} chunks of {chunk}: relative error {err}"
                    );
                    // Int8 rows copied a tile ahead: the same tiles, the same bits.
                    if format == KvFormat::Int8 {
                        assert_eq!(
                            bits(&run("attention_prefill_async")),
                            bits(&out),
                            "d={d} pos0={pos0} t={t} window={window:?} chunks of {chunk}: the async kernel"
                        );
                    }
                }
            }
        }
    }
}

/// `attention_prefill` or its `kernel` twin (and `attention_combine` when the keys are split) as
/// ops::attention launches them: `dims` (hq, hkv, d), `at` (pos0, tokens), `split` (keys per
/// chunk, chunks).
#[allow(clippy::too_many_arguments)]
fn attention_prefill(
    kern: &HostKernels,
    kernel: &str,
    q: &[f32],
    cache: &HostCache,
    fmt: i32,
    (hq, hkv, d): (usize, usize, usize),
    (pos0, t): (usize, usize),
    scale: f32,
    window: Option<usize>,
    (chunk, nchunks): (usize, usize),
) -> Vec<f32> {
    let out = vec![f32::NAN; t * hq * d];
    let part = vec![f32::NAN; t * hq * nchunks * (d + 2)];
    let (qa, oa, pa) = (Addr::of(q), Addr::of(&out), Addr::of(&part));
    let (ka, ksa, va, vsa) = cache.addrs();
    // SAFETY: the signatures of attention_prefill and attention_combine in kernels/attention.cu.
    unsafe {
        type Prefill = host::attention_prefill;
        let prefill: Prefill = kern.kernel(kernel);
        let grid = t.div_ceil(64) * hq * nchunks;
        kern.launch(grid as u32, 128, &|| {
            prefill(
                qa.ptr(),
                ka.ptr(),
                ksa.ptr(),
                va.ptr(),
                vsa.ptr(),
                oa.ptr(),
                fmt,
                hq as i32,
                hkv as i32,
                pos0 as i32,
                std::ptr::null(),
                scale,
                0,
                window.unwrap_or(0) as i32,
                t as i32,
                chunk as i32,
                nchunks as i32,
                pa.ptr(),
            )
        });
        if nchunks > 1 {
            combine(kern, pa, oa, t * hq, nchunks);
        }
    }
    out
}

/// `attention_combine` of `rows` rows' `nchunks` partial results at `part` into `out`.
///
/// # Safety
/// `part` holds `[rows, nchunks, head_dim + 2]` values and `out` `[rows, head_dim]`.
unsafe fn combine(kern: &HostKernels, part: Addr, out: Addr, rows: usize, nchunks: usize) {
    let f: host::attention_combine = kern.kernel("attention_combine");
    kern.launch(rows as u32, 128, &|| {
        f(part.ptr(), out.ptr(), nchunks as i32)
    });
}

/// The slot table of sequences `seqs` ((context, new rows) each, rows in order) over `caches`,
/// as ops::attn_groups makes it; the most rows of a sequence, and the chunks the longest context
/// needs.
fn attn_slots(
    seqs: &[(usize, usize)],
    caches: &[HostCache],
    chunk: usize,
) -> (super::AttnSlots, usize, usize) {
    let mut slots = super::AttnSlots::default();
    let mut off = 0;
    for (i, (&(pos0, n), c)) in seqs.iter().zip(caches).enumerate() {
        let (kc, ksa, vc, vsa) = c.addrs();
        (slots.kc[i], slots.ks[i], slots.vc[i], slots.vs[i]) =
            (kc.0 as u64, ksa.0 as u64, vc.0 as u64, vsa.0 as u64);
        (slots.pos0[i], slots.off[i], slots.n[i]) = (pos0 as i32, off as i32, n as i32);
        off += n;
    }
    let longest = seqs.iter().map(|s| s.1).max().unwrap();
    let chunks = seqs
        .iter()
        .map(|s| s.0 + s.1)
        .max()
        .unwrap()
        .div_ceil(chunk);
    (slots, longest, chunks)
}

/// An attention layer's position-dependent work for several sequences in one launch each
/// (`rope_seqs`, `kv_append_seqs`, `attention_part_seqs` and `attention_combine_seqs`) gives
/// every sequence the bits of its own launches (`rope`, `kv_append`, `attention_part`,
/// `attention_combine`): its roped rows, its cache rows and its attention output, for every
/// cache format, over contexts of 1,030, 5 and 300 keys (the short ones take the long one's
/// chunk count, their extra chunks empty).
#[test]
fn the_attention_of_several_sequences_has_each_ones_bits() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (d, hq, hkv, rot) = (32usize, 2usize, 1usize, 16usize);
    let seqs = [(1030usize, 3usize), (5, 1), (300, 2)];
    let scale = (d as f32).powf(-0.5);
    let inv_freq: Vec<f32> = (0..rot / 2)
        .map(|j| 10000f32.powf(-2.0 * j as f32 / rot as f32))
        .collect();
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let q = random(rows * hq * d, 81);
    let (kn, vn) = (random(rows * hkv * d, 82), random(rows * hkv * d, 83));
    type Rope = host::rope;
    type RopeSeqs = host::rope_seqs;
    type Append = host::kv_append;
    type AppendSeqs = host::kv_append_seqs;
    type PartSeqs = host::attention_part_seqs;
    type CombineSeqs = host::attention_combine_seqs;
    for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
        let fmt = kv_code(format);
        // Each sequence's cache holds its context and room for its new rows (garbage there).
        let caches = |seed: u64| -> Vec<HostCache> {
            seqs.iter()
                .enumerate()
                .map(|(i, &(pos0, n))| {
                    let s = pos0 + n;
                    let (k, v) = (
                        random(s * hkv * d, seed + 2 * i as u64),
                        random(s * hkv * d, seed + 1 + 2 * i as u64),
                    );
                    HostCache::new(&kern, format, &k, &v, hkv, d)
                })
                .collect()
        };
        // Each sequence alone.
        let (solo, solo_caches) = {
            let (q, kn, vn) = (q.clone(), kn.clone(), vn.clone());
            let caches = caches(90);
            let mut out = vec![f32::NAN; rows * hq * d];
            let mut off = 0;
            for (&(pos0, n), cache) in seqs.iter().zip(&caches) {
                let (qa, ka, va, ia) = (
                    Addr(Addr::of(&q).0 + off * hq * d * 4),
                    Addr(Addr::of(&kn).0 + off * hkv * d * 4),
                    Addr(Addr::of(&vn).0 + off * hkv * d * 4),
                    Addr::of(&inv_freq),
                );
                let (kc, ksa, vc, vsa) = cache.addrs();
                // SAFETY: the signatures of rope and kv_append in kernels/, over buffers of the
                // sizes ops.rs gives them.
                unsafe {
                    let rope: Rope = kern.kernel("rope");
                    for (x, heads) in [(qa, hq), (ka, hkv)] {
                        kern.launch((n * heads) as u32, 32, &|| {
                            rope(
                                x.ptr(),
                                ia.ptr(),
                                heads as i32,
                                d as i32,
                                rot as i32,
                                pos0 as i32,
                                std::ptr::null(),
                            )
                        });
                    }
                    let append: Append = kern.kernel("kv_append");
                    for (x, c, sc) in [(ka, kc, ksa), (va, vc, vsa)] {
                        kern.launch((n * hkv) as u32, 128, &|| {
                            append(
                                x.ptr(),
                                c.ptr(),
                                sc.ptr(),
                                fmt,
                                d as i32,
                                hkv as i32,
                                pos0 as i32,
                                std::ptr::null(),
                            )
                        });
                    }
                }
                let rows = off * hq * d..(off + n) * hq * d;
                let alone = split_attention(
                    &kern,
                    &q[rows.clone()],
                    cache,
                    format,
                    (hq, hkv, d),
                    pos0,
                    scale,
                    None,
                    SplitKernel::Warps,
                );
                out[rows].copy_from_slice(&alone);
                off += n;
            }
            (out, caches)
        };
        // All of them at once.
        let (q, kn, vn) = (q.clone(), kn.clone(), vn.clone());
        let caches = caches(90);
        let (slots, longest, chunks) = attn_slots(&seqs, &caches, kern.chunk);
        let (n_seqs, qrows) = (seqs.len(), longest * hq);
        let part = vec![f32::NAN; n_seqs * qrows * chunks * (d + 2)];
        let out = vec![f32::NAN; rows * hq * d];
        let (qa, ka, va, ia, pa, oa) = (
            Addr::of(&q),
            Addr::of(&kn),
            Addr::of(&vn),
            Addr::of(&inv_freq),
            Addr::of(&part),
            Addr::of(&out),
        );
        // SAFETY: the signatures of the *_seqs kernels in kernels/, over buffers of the sizes
        // ops.rs gives them.
        unsafe {
            let rope: RopeSeqs = kern.kernel("rope_seqs");
            let per = longest * (hq + hkv);
            kern.launch((n_seqs * per) as u32, 32, &|| {
                rope(
                    qa.ptr(),
                    ka.ptr(),
                    ia.ptr(),
                    hq as i32,
                    hkv as i32,
                    d as i32,
                    rot as i32,
                    slots,
                    per as i32,
                )
            });
            let append: AppendSeqs = kern.kernel("kv_append_seqs");
            let per = 2 * longest * hkv;
            kern.launch((n_seqs * per) as u32, 128, &|| {
                append(
                    ka.ptr(),
                    va.ptr(),
                    fmt,
                    d as i32,
                    hkv as i32,
                    slots,
                    per as i32,
                )
            });
            let heads = super::ops::attention_heads(longest, hq, hkv, ATTENTION_HEADS);
            let part_fn: PartSeqs =
                kern.kernel(super::ops::split_kernel("attention_part_seqs", heads));
            kern.launch((n_seqs * qrows / heads * chunks) as u32, 128, &|| {
                part_fn(
                    qa.ptr(),
                    pa.ptr(),
                    fmt,
                    hq as i32,
                    hkv as i32,
                    scale,
                    slots,
                    qrows as i32,
                    chunks as i32,
                    heads as i32,
                )
            });
            let comb: CombineSeqs = kern.kernel("attention_combine_seqs");
            kern.launch((n_seqs * qrows) as u32, 128, &|| {
                comb(
                    pa.ptr(),
                    oa.ptr(),
                    hq as i32,
                    slots,
                    qrows as i32,
                    chunks as i32,
                )
            });
        }
        for (i, (a, b)) in caches.iter().zip(&solo_caches).enumerate() {
            assert!(
                a.k == b.k
                    && a.v == b.v
                    && bits(&a.ks) == bits(&b.ks)
                    && bits(&a.vs) == bits(&b.vs),
                "{format:?}: sequence {i}'s cache differs from its own launches'"
            );
        }
        assert_eq!(
            bits(&out),
            bits(&solo),
            "{format:?}: attention outputs differ"
        );
        assert!(
            out.iter().all(|v| v.is_finite()),
            "{format:?}: an output row was not written"
        );
    }
}

/// The CPU reference: causal attention of `q` at `pos0..` over `keys`/`values` stored in
/// `format`, with an optional sliding window (by the mask's definition, query by query).
#[allow(clippy::too_many_arguments)]
fn cpu_attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    format: KvFormat,
    hq: usize,
    hkv: usize,
    d: usize,
    pos0: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let (mut kc, mut vc) = (KvStore::new(format), KvStore::new(format));
    kc.append(keys, d);
    vc.append(values, d);
    let t = q.len() / (hq * d);
    let mut out = vec![0.0f32; t * hq * d];
    match window {
        None => cpu::attention(&mut out, q, &kc, &vc, hq, hkv, d, pos0, scale),
        Some(w) => {
            // Keys within the window of each query, from the stored (rounded) rows.
            let rows = |c: &KvStore| {
                let mut all = vec![0.0f32; c.len()];
                for (r, row) in all.chunks_exact_mut(d).enumerate() {
                    c.row(r, row);
                }
                all
            };
            let (kr, vr) = (rows(&kc), rows(&vc));
            for ti in 0..t {
                let qp = pos0 + ti;
                let lo = (qp + 1).saturating_sub(w);
                for h in 0..hq {
                    let kvh = h / (hq / hkv);
                    let qv = &q[(ti * hq + h) * d..][..d];
                    let scores: Vec<f32> = (lo..=qp)
                        .map(|j| cpu::dot(qv, &kr[(j * hkv + kvh) * d..][..d]) * scale)
                        .collect();
                    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let sum: f32 = e.iter().sum();
                    let o = &mut out[(ti * hq + h) * d..][..d];
                    for (j, ej) in (lo..=qp).zip(&e) {
                        for (ov, vv) in o.iter_mut().zip(&vr[(j * hkv + kvh) * d..][..d]) {
                            *ov += ej / sum * vv;
                        }
                    }
                }
            }
        }
    }
    out
}

/// The GDN scan gives the CPU's outputs and state in both head orders, for passes of one
/// token, part of a stage and several stages; and a token's output has the same bits in a
/// long pass as when the tokens come one at a time (decode and verify agree).
#[test]
fn the_gdn_scan_on_the_host_matches_the_cpu_and_is_pass_invariant() {
    for kd in [DIMS_32, DIMS_256] {
        let Some(kern) = kernels(kd) else { return };
        for v_order in [VHeadOrder::Grouped, VHeadOrder::Tiled] {
            let dims = GdnDims {
                hk: 2,
                hv: 4,
                dk: kd.gdn_dk,
                dv: kd.gdn_dv,
                v_order,
            };
            let c = 2 * dims.hk * dims.dk + dims.hv * dims.dv;
            let t = 37;
            let GdnCase {
                mixed,
                g,
                beta,
                state0,
                want,
                want_state,
            } = GdnCase::new(dims, t);

            // SAFETY: gdn_recurrent's signature; ops::gdn_recurrent's grid and block.
            let scan = |tokens: std::ops::Range<usize>, state: &[f32], out: &[f32]| unsafe {
                type Scan = host::gdn_recurrent;
                let f: Scan = kern.kernel("gdn_recurrent");
                let n = tokens.len();
                let (ma, ga, ba, sa, oa) = (
                    Addr::of(&mixed[tokens.start * c..]),
                    Addr::of(&g[tokens.start * dims.hv..]),
                    Addr::of(&beta[tokens.start * dims.hv..]),
                    Addr::of(state),
                    Addr::of(&out[tokens.start * dims.hv * dims.dv..]),
                );
                let grid = dims.hv
                    * dims.dv.div_ceil(super::ops::scan_columns(
                        super::KernelOptions::default().gdn_slices(dims.dk),
                    ));
                kern.launch(grid as u32, 128, &|| {
                    f(
                        ma.ptr(),
                        ga.ptr(),
                        ba.ptr(),
                        sa.ptr(),
                        oa.ptr(),
                        n as i32,
                        dims.hk as i32,
                        dims.hv as i32,
                        (v_order == VHeadOrder::Tiled) as i32,
                    )
                });
            };
            let (state, out) = (state0.clone(), vec![f32::NAN; want.len()]);
            scan(0..t, &state, &out);
            let err = rel_err(&out, &want);
            assert!(err < 1e-4, "{kd:?} {v_order:?}: output {err}");
            let err = rel_err(&state, &want_state);
            assert!(err < 1e-4, "{kd:?} {v_order:?}: state {err}");
            // One token at a time, then a few, then the rest: the same bits.
            let (state2, out2) = (state0.clone(), vec![f32::NAN; want.len()]);
            for range in [0..1, 1..2, 2..11, 11..t] {
                scan(range, &state2, &out2);
            }
            assert!(
                out.iter()
                    .zip(&out2)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kd:?} {v_order:?}: a token's output depends on the pass it is in"
            );
            assert!(
                state
                    .iter()
                    .zip(&state2)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kd:?} {v_order:?}: the state depends on how the tokens were split"
            );
        }
    }
}

/// A GDN scan's inputs (random, gates in range) and the CPU's per-token outputs and state.
struct GdnCase {
    mixed: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state0: Vec<f32>,
    want: Vec<f32>,
    want_state: Vec<f32>,
}

impl GdnCase {
    fn new(dims: GdnDims, t: usize) -> Self {
        let c = 2 * dims.hk * dims.dk + dims.hv * dims.dv;
        let mixed = random(t * c, 31);
        let g: Vec<f32> = random(t * dims.hv, 32)
            .iter()
            .map(|v| -0.5 * v.abs())
            .collect();
        let beta: Vec<f32> = random(t * dims.hv, 33).iter().map(|v| v.abs()).collect();
        let state0 = random(dims.state_len(), 34);
        // CPU: q and k normalised as the model does before its scan.
        let kdim = dims.hk * dims.dk;
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for row in mixed.chunks_exact(c) {
            q.extend_from_slice(&row[..kdim]);
            k.extend_from_slice(&row[kdim..2 * kdim]);
            v.extend_from_slice(&row[2 * kdim..]);
        }
        cpu::l2_norm_rows(&mut q, dims.dk, 1e-6);
        cpu::l2_norm_rows(&mut k, dims.dk, 1e-6);
        let scale = (dims.dk as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= scale);
        let mut want_state = state0.clone();
        let mut want = vec![0.0; t * dims.hv * dims.dv];
        cpu::gdn_recurrent(&mut want, &q, &k, &v, &g, &beta, &mut want_state, dims);
        Self {
            mixed,
            g,
            beta,
            state0,
            want,
            want_state,
        }
    }
}

/// The chunked GDN prefill (`gdn_chunk_prep`, then `gdn_chunk_scan` on split-tf32 mma) gives
/// the CPU's per-token outputs and state in both head orders (3e-7 measured: the split tf32
/// keeps f32's precision), for a pass of part of a chunk and one of several with a partial
/// last. Outputs and scratch start as NaN, so an unwritten element fails.
#[test]
fn the_chunked_gdn_prefill_on_the_host_matches_the_cpu() {
    for kd in [DIMS_32, DIMS_256] {
        let Some(kern) = kernels(kd) else { return };
        for v_order in [VHeadOrder::Grouped, VHeadOrder::Tiled] {
            let dims = GdnDims {
                hk: 2,
                hv: 4,
                dk: kd.gdn_dk,
                dv: kd.gdn_dv,
                v_order,
            };
            // Part of a chunk; two whole chunks and a partial one.
            for t in [37, 150] {
                let case = GdnCase::new(dims, t);
                let state = case.state0.clone();
                let out = vec![f32::NAN; case.want.len()];
                let scratch =
                    vec![f32::NAN; super::ops::gdn_chunk_scratch_len(t, dims.hv, dims.dk, dims.dv)];
                let (ma, ga, ba, sa, oa, xa) = (
                    Addr::of(&case.mixed),
                    Addr::of(&case.g),
                    Addr::of(&case.beta),
                    Addr::of(&state),
                    Addr::of(&out),
                    Addr::of(&scratch),
                );
                let (hk, hv, tiled) = (
                    dims.hk as i32,
                    dims.hv as i32,
                    (v_order == VHeadOrder::Tiled) as i32,
                );
                // SAFETY: the signatures of gdn_chunk_prep and gdn_chunk_scan, ops::gdn_chunked's grids.
                unsafe {
                    type Prep = host::gdn_chunk_prep;
                    type ChunkScan = host::gdn_chunk_scan;
                    let prep: Prep = kern.kernel("gdn_chunk_prep");
                    let scan: ChunkScan = kern.kernel("gdn_chunk_scan");
                    let chunks = t.div_ceil(super::ops::GDN_CHUNK);
                    kern.launch((chunks * dims.hv) as u32, 256, &|| {
                        prep(
                            ma.ptr(),
                            ga.ptr(),
                            ba.ptr(),
                            xa.ptr(),
                            t as i32,
                            hk,
                            hv,
                            tiled,
                        )
                    });
                    let blocks = super::ops::chunk_scan_blocks(dims.hv, dims.dv);
                    kern.launch(blocks, 256, &|| {
                        scan(
                            ma.ptr(),
                            xa.ptr(),
                            sa.ptr(),
                            oa.ptr(),
                            t as i32,
                            hk,
                            hv,
                            tiled,
                        )
                    });
                }
                let err = rel_err(&out, &case.want);
                assert!(err < 1e-5, "{kd:?} {v_order:?} {t} tokens: output {err}");
                let err = rel_err(&state, &case.want_state);
                assert!(err < 1e-5, "{kd:?} {v_order:?} {t} tokens: state {err}");
            }
        }
    }
}

/// DFlash2's grouped dynamic conv matches the CPU, reading its dynamic kernel out of
/// projection rows that hold both sides of a sublayer (stride twice a side).
#[test]
fn the_grouped_dynamic_conv_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (t, h, kernel, group) = (7, 48, 4, 16);
    let side = kernel * (h / group);
    let x = random(t * h, 41);
    let projected = random(t * 2 * side, 42);
    let base = random(kernel * h, 43);
    for second in [false, true] {
        let dynamic: Vec<f32> = projected
            .chunks_exact(2 * side)
            .flat_map(|row| row[usize::from(second) * side..][..side].to_vec())
            .collect();
        let mut want = vec![0.0f32; t * h];
        cpu::grouped_dynamic_conv(&mut want, &x, &dynamic, &base, kernel, group);
        let out = vec![f32::NAN; t * h];
        let (xa, da, ba, oa) = (
            Addr::of(&x),
            Addr::of(&projected[usize::from(second) * side..]),
            Addr::of(&base),
            Addr::of(&out),
        );
        // SAFETY: grouped_dynamic_conv's signature; ops::grouped_dynamic_conv's grid.
        unsafe {
            type Conv = host::grouped_dynamic_conv;
            let conv: Conv = kern.kernel("grouped_dynamic_conv");
            kern.launch((t * h).div_ceil(256) as u32, 256, &|| {
                conv(
                    xa.ptr(),
                    da.ptr(),
                    2 * side as i64,
                    ba.ptr(),
                    oa.ptr(),
                    t as i32,
                    h as i32,
                    kernel as i32,
                    group as i32,
                )
            });
        }
        // The GPU fuses the products into FMAs; the CPU rounds each.
        let err = rel_err(&out, &want);
        assert!(
            err < 1e-6,
            "side {}: relative error {err}",
            usize::from(second)
        );
    }
}

/// The GDN conv matches the CPU and advances the state past the pass, for passes shorter
/// than its history, within one thread's chunk, and over several chunks; cut into pieces,
/// the same tokens give the same bits. Qwen3.5's 4 taps (the build with them constant) and 6
/// (any count).
#[test]
fn the_gdn_conv_on_the_host_matches_the_cpu_and_is_pass_invariant() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for kernel in [4, 6] {
        gdn_conv_matches(&kern, kernel);
    }
}

fn gdn_conv_matches(kern: &HostKernels, kernel: usize) {
    let c = 200;
    let w = random(c * kernel, 61);
    let state0 = random((kernel - 1) * c, 62);
    // SAFETY: conv1d_silu's signature; ops::conv1d_silu's grid.
    let conv = |x: &[f32], y: &[f32], state: &[f32]| unsafe {
        type Conv = host::conv1d_silu;
        let f: Conv = kern.kernel("conv1d_silu");
        let t = x.len() / c;
        let (xa, ya, sa, wa) = (Addr::of(x), Addr::of(y), Addr::of(state), Addr::of(&w));
        let grid = c.div_ceil(128) * t.max(1).div_ceil(super::conv_steps(kernel));
        kern.launch(grid as u32, 128, &|| {
            f(
                xa.ptr(),
                ya.ptr(),
                sa.ptr(),
                wa.ptr(),
                t as i32,
                c as i32,
                kernel as i32,
            )
        });
    };
    for t in [1usize, 2, 16, 37] {
        let x = random(t * c, 63 + t as u64);
        let (mut want, mut want_state) = (vec![0.0f32; t * c], state0.clone());
        cpu::causal_conv1d_silu(&mut want, &x, &mut want_state, &w);
        let (y, state) = (vec![f32::NAN; t * c], state0.clone());
        conv(&x, &y, &state);
        assert!(rel_err(&y, &want) < 1e-6, "K={kernel} t={t}: output");
        assert_eq!(state, want_state, "K={kernel} t={t}: state");
        // Token by token, then the rest.
        let (y2, state2) = (vec![f32::NAN; t * c], state0.clone());
        conv(&x[..c], &y2[..c], &state2);
        conv(&x[c..], &y2[c..], &state2);
        assert!(
            y.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "K={kernel} t={t}: an output depends on how the pass was cut"
        );
        assert_eq!(state2, state, "K={kernel} t={t}: state after two passes");
    }
}

/// One sequence's GDN conv, then its scan, through the single-sequence kernels (`conv1d_silu`,
/// `gdn_recurrent`, with ops.rs's grids): the reference the batched and replay kernels are held
/// to. `x` `[n, c]` goes through the conv weights `w` into `mixed`, which the scan takes with
/// the gates `g`, `beta` `[n, hv]` into `out` `[n, hv, dv]`; `conv` and `rec` are advanced.
fn conv_then_scan(
    kern: &HostKernels,
    n: usize,
    (c, kernel, hk, hv, dv): (usize, usize, usize, usize, usize),
    (x, w, conv, mixed): (&[f32], &[f32], &[f32], &[f32]),
    (g, beta, rec, out): (&[f32], &[f32], &[f32], &[f32]),
) {
    type Conv = host::conv1d_silu;
    type Scan = host::gdn_recurrent;
    let (xa, ya, sa, wa) = (Addr::of(x), Addr::of(mixed), Addr::of(conv), Addr::of(w));
    let (ga, ba, ra, oa) = (Addr::of(g), Addr::of(beta), Addr::of(rec), Addr::of(out));
    let conv_blocks = c.div_ceil(128) * n.div_ceil(super::conv_steps(kernel));
    // SAFETY: the signatures of conv1d_silu and gdn_recurrent, ops.rs's grids.
    unsafe {
        let f: Conv = kern.kernel("conv1d_silu");
        kern.launch(conv_blocks as u32, 128, &|| {
            f(
                xa.ptr(),
                ya.ptr(),
                sa.ptr(),
                wa.ptr(),
                n as i32,
                c as i32,
                kernel as i32,
            )
        });
        let f: Scan = kern.kernel("gdn_recurrent");
        let dk = (c - hv * dv) / (2 * hk);
        kern.launch(
            (hv * dv.div_ceil(super::ops::scan_columns(
                super::KernelOptions::default().gdn_slices(dk),
            ))) as u32,
            128,
            &|| {
                f(
                    ya.ptr(),
                    ga.ptr(),
                    ba.ptr(),
                    ra.ptr(),
                    oa.ptr(),
                    n as i32,
                    hk as i32,
                    hv as i32,
                    0,
                )
            },
        );
    }
}

/// The conv and the scan of several sequences in one launch (`conv1d_silu_seqs`,
/// `gdn_recurrent_seqs`, a batched pass of concurrent requests) give each sequence, on its own
/// state, the bits of a launch of its own: rows of 1, 17 (two conv chunks) and 4 tokens. The
/// 17-row sequence is recorded (a verify pass): the kernels save its states before the pass,
/// its conv inputs and its gates.
#[test]
fn the_batched_gdn_conv_and_scan_give_each_sequence_its_bits() {
    // Four lanes a column of the scan's state (key dim 16) and eight (128).
    for kd in [DIMS_32, DIMS_256] {
        batched_gdn_gives_each_sequence_its_bits(kd);
    }
}

/// [`the_batched_gdn_conv_and_scan_give_each_sequence_its_bits`] for the kernels of `kd`.
fn batched_gdn_gives_each_sequence_its_bits(kd: KernelDims) {
    let Some(kern) = kernels(kd) else { return };
    let (hk, hv, dk, dv) = (2usize, 4usize, kd.gdn_dk, kd.gdn_dv);
    let c = 2 * hk * dk + hv * dv;
    let kernel = 4;
    let lens = [1usize, 17, 4];
    let rows: usize = lens.iter().sum();
    let offs: Vec<usize> = lens
        .iter()
        .scan(0, |o, &n| {
            *o += n;
            Some(*o - n)
        })
        .collect();
    let w = random(c * kernel, 71);
    let x = random(rows * c, 72);
    let g: Vec<f32> = random(rows * hv, 73)
        .iter()
        .map(|v| -0.5 * v.abs())
        .collect();
    let beta: Vec<f32> = random(rows * hv, 74).iter().map(|v| v.abs()).collect();
    let conv0: Vec<Vec<f32>> = (0..3).map(|i| random((kernel - 1) * c, 75 + i)).collect();
    let rec0: Vec<Vec<f32>> = (0..3).map(|i| random(hv * dk * dv, 78 + i)).collect();
    let slots = |states: &[Vec<f32>], saves: [u64; 3]| {
        let mut s = super::SeqSlots::default();
        for (i, st) in states.iter().enumerate() {
            s.state[i] = st.as_ptr() as u64;
            s.off[i] = offs[i] as i32;
            s.n[i] = lens[i] as i32;
        }
        for (k, at) in saves.into_iter().enumerate() {
            s.save[k][1] = at;
        }
        s
    };
    // Sequence 1's record.
    let saved_conv = vec![f32::NAN; (kernel - 1) * c];
    let saved_x = vec![f32::NAN; lens[1] * c];
    let saved_rec = vec![f32::NAN; hv * dk * dv];
    let (saved_g, saved_beta) = (vec![f32::NAN; lens[1] * hv], vec![f32::NAN; lens[1] * hv]);
    let at = |v: &[f32]| v.as_ptr() as u64;
    type ConvSeqs = host::conv1d_silu_seqs;
    type ScanSeqs = host::gdn_recurrent_seqs;
    let scan_blocks = hv
        * dv.div_ceil(super::ops::scan_columns(
            super::KernelOptions::default().gdn_slices(dk),
        ));
    // One launch per sequence.
    let (conv1, rec1) = (conv0.clone(), rec0.clone());
    let (mixed1, out1) = (vec![f32::NAN; rows * c], vec![f32::NAN; rows * hv * dv]);
    for i in 0..3 {
        let (o, n) = (offs[i], lens[i]);
        conv_then_scan(
            &kern,
            n,
            (c, kernel, hk, hv, dv),
            (&x[o * c..], &w, &conv1[i], &mixed1[o * c..]),
            (
                &g[o * hv..],
                &beta[o * hv..],
                &rec1[i],
                &out1[o * hv * dv..],
            ),
        );
    }
    // One launch for all three.
    let (conv3, rec3) = (conv0.clone(), rec0.clone());
    let (mixed3, out3) = (vec![f32::NAN; rows * c], vec![f32::NAN; rows * hv * dv]);
    let cs = slots(&conv3, [at(&saved_conv), at(&saved_x), 0]);
    let rs = slots(&rec3, [at(&saved_rec), at(&saved_g), at(&saved_beta)]);
    let (xa, ma, wa, ga, ba, oa) = (
        Addr::of(&x),
        Addr::of(&mixed3),
        Addr::of(&w),
        Addr::of(&g),
        Addr::of(&beta),
        Addr::of(&out3),
    );
    // SAFETY: the signatures of conv1d_silu_seqs and gdn_recurrent_seqs, ops.rs's grids.
    unsafe {
        let per = c.div_ceil(128) * 17usize.div_ceil(super::conv_steps(kernel));
        let f: ConvSeqs = kern.kernel("conv1d_silu_seqs");
        kern.launch((per * 3) as u32, 128, &|| {
            f(
                xa.ptr(),
                ma.ptr(),
                cs,
                wa.ptr(),
                per as i32,
                c as i32,
                kernel as i32,
            )
        });
        let f: ScanSeqs = kern.kernel("gdn_recurrent_seqs");
        kern.launch((scan_blocks * 3) as u32, 128, &|| {
            f(
                ma.ptr(),
                ga.ptr(),
                ba.ptr(),
                rs,
                oa.ptr(),
                hk as i32,
                hv as i32,
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        });
    }
    assert_eq!(bits(&mixed3), bits(&mixed1), "conv outputs");
    assert_eq!(bits(&out3), bits(&out1), "scan outputs");
    for i in 0..3 {
        assert_eq!(bits(&conv3[i]), bits(&conv1[i]), "conv state {i}");
        assert_eq!(bits(&rec3[i]), bits(&rec1[i]), "recurrent state {i}");
    }
    let (o, n) = (offs[1], lens[1]);
    assert_eq!(bits(&saved_conv), bits(&conv0[1]), "saved conv state");
    assert_eq!(
        bits(&saved_x),
        bits(&x[o * c..(o + n) * c]),
        "saved conv inputs"
    );
    assert_eq!(bits(&saved_rec), bits(&rec0[1]), "saved recurrent state");
    assert_eq!(bits(&saved_g), bits(&g[o * hv..(o + n) * hv]), "saved g");
    assert_eq!(
        bits(&saved_beta),
        bits(&beta[o * hv..(o + n) * hv]),
        "saved beta"
    );
}

/// The scan given the raw `a` and `b` with `dt_bias` and `neg_a` (`GpuOptions::fold_launches`)
/// makes its gates as `gdn_gates` does: the outputs, the states and a recorded pass's saved gates
/// have the bits of `gdn_gates` then the scan, for a decode row and a 16-row verify block.
#[test]
fn the_scan_makes_its_gates_as_gdn_gates_does() {
    let Some(kern) = kernels(DIMS_256) else {
        return;
    };
    let kd = DIMS_256;
    let (hk, hv, dk, dv) = (2usize, 4usize, kd.gdn_dk, kd.gdn_dv);
    let c = 2 * hk * dk + hv * dv;
    let blocks = hv
        * dv.div_ceil(super::ops::scan_columns(
            super::KernelOptions::default().gdn_slices(dk),
        ));
    let (dt_bias, neg_a) = (
        random(hv, 91),
        random(hv, 92).iter().map(|v| -v.abs()).collect::<Vec<_>>(),
    );
    for rows in [1usize, 16] {
        let mixed = random(rows * c, 93);
        let (a, b) = (random(rows * hv, 94), random(rows * hv, 95));
        let state0 = random(hv * dk * dv, 96);
        let scan = |fused: bool| {
            let (g, beta) = (a.clone(), b.clone());
            let (ga, ba) = (Addr::of(&g), Addr::of(&beta));
            if !fused {
                kern.launch((rows * hv).div_ceil(256) as u32, 256, &|| unsafe {
                    let f: host::gdn_gates = kern.kernel("gdn_gates");
                    f(
                        ba.ptr(),
                        ga.ptr(),
                        dt_bias.as_ptr(),
                        neg_a.as_ptr(),
                        hv as i32,
                        (rows * hv) as i64,
                    )
                });
            }
            let state = state0.clone();
            let out = vec![f32::NAN; rows * hv * dv];
            let (saved_rec, saved_g, saved_beta) = (
                vec![f32::NAN; hv * dk * dv],
                vec![f32::NAN; rows * hv],
                vec![f32::NAN; rows * hv],
            );
            let mut slots = super::SeqSlots::default();
            slots.state[0] = state.as_ptr() as u64;
            slots.n[0] = rows as i32;
            slots.save[0][0] = saved_rec.as_ptr() as u64;
            slots.save[1][0] = saved_g.as_ptr() as u64;
            slots.save[2][0] = saved_beta.as_ptr() as u64;
            let (ma, oa) = (Addr::of(&mixed), Addr::of(&out));
            let (dt, na) = if fused {
                (dt_bias.as_ptr(), neg_a.as_ptr())
            } else {
                (std::ptr::null(), std::ptr::null())
            };
            let (dta, naa) = (Addr(dt as usize), Addr(na as usize));
            // SAFETY: gdn_gates' and gdn_recurrent_seqs' signatures, ops.rs's grids, over one
            // sequence of `rows` rows.
            kern.launch(blocks as u32, 128, &|| unsafe {
                let f: host::gdn_recurrent_seqs = kern.kernel("gdn_recurrent_seqs");
                f(
                    ma.ptr(),
                    ga.ptr(),
                    ba.ptr(),
                    slots,
                    oa.ptr(),
                    hk as i32,
                    hv as i32,
                    0,
                    dta.ptr(),
                    naa.ptr(),
                )
            });
            [out, state, saved_rec, saved_g, saved_beta].map(|v| bits(&v))
        };
        assert_eq!(scan(true), scan(false), "{rows} rows");
    }
}

/// A rollback's replay (`conv1d_silu_replay`, `gdn_recurrent_replay`: every GDN layer of a
/// sequence in one launch each) leaves each layer's live states with the bits of a pass over the
/// kept rows from the saved states, whatever the live states held; keeping no row restores the
/// saved states.
#[test]
fn the_rollback_replay_leaves_the_states_of_the_kept_rows() {
    // Four lanes a column of the scan's state (key dim 16) and eight (128).
    for kd in [DIMS_32, DIMS_256] {
        rollback_replay_leaves_the_kept_rows(kd);
    }
}

/// [`the_rollback_replay_leaves_the_states_of_the_kept_rows`] for the kernels of `kd`.
fn rollback_replay_leaves_the_kept_rows(kd: KernelDims) {
    let Some(kern) = kernels(kd) else { return };
    let (hk, hv, dk, dv) = (2usize, 4usize, kd.gdn_dk, kd.gdn_dv);
    let c = 2 * hk * dk + hv * dv;
    let (kernel, rows, layers) = (4usize, 16usize, 3usize);
    let w: Vec<Vec<f32>> = (0..layers)
        .map(|l| random(c * kernel, 90 + l as u64))
        .collect();
    let x: Vec<Vec<f32>> = (0..layers)
        .map(|l| random(rows * c, 93 + l as u64))
        .collect();
    let g: Vec<Vec<f32>> = (0..layers)
        .map(|l| random(rows * hv, 96 + l as u64))
        .map(|v| v.iter().map(|v| -0.5 * v.abs()).collect())
        .collect();
    let beta: Vec<Vec<f32>> = (0..layers)
        .map(|l| random(rows * hv, 99 + l as u64))
        .map(|v| v.iter().map(|v| v.abs()).collect())
        .collect();
    let conv0: Vec<Vec<f32>> = (0..layers)
        .map(|l| random((kernel - 1) * c, 102 + l as u64))
        .collect();
    let rec0: Vec<Vec<f32>> = (0..layers)
        .map(|l| random(hv * dk * dv, 105 + l as u64))
        .collect();
    type Replay = host::conv1d_silu_replay;
    let scan_blocks = hv
        * dv.div_ceil(super::ops::scan_columns(
            super::KernelOptions::default().gdn_slices(dk),
        ));
    for keep in [0usize, 1, 5, 16] {
        // A pass of its own over the kept rows, from the saved states.
        let (conv1, rec1) = (conv0.clone(), rec0.clone());
        for l in (0..layers).filter(|_| keep > 0) {
            let (mixed, out) = (vec![f32::NAN; rows * c], vec![f32::NAN; rows * hv * dv]);
            conv_then_scan(
                &kern,
                keep,
                (c, kernel, hk, hv, dv),
                (&x[l], &w[l], &conv1[l], &mixed),
                (&g[l], &beta[l], &rec1[l], &out),
            );
        }
        // The replay: live states hold what the rolled-back pass left (garbage here).
        let conv3: Vec<Vec<f32>> = (0..layers)
            .map(|_| vec![f32::NAN; (kernel - 1) * c])
            .collect();
        let rec3: Vec<Vec<f32>> = (0..layers).map(|_| vec![f32::NAN; hv * dk * dv]).collect();
        let mixed3 = vec![f32::NAN; layers * keep.max(1) * c];
        let (mut cs, mut rs) = (super::LayerSlots::default(), super::LayerSlots::default());
        let at = |v: &[f32]| v.as_ptr() as u64;
        for l in 0..layers {
            let out = at(&mixed3[l * keep * c..]);
            (cs.saved[l], cs.live[l]) = (at(&conv0[l]), at(&conv3[l]));
            (cs.buf[0][l], cs.buf[1][l], cs.buf[2][l]) = (at(&x[l]), at(&w[l]), out);
            (rs.saved[l], rs.live[l]) = (at(&rec0[l]), at(&rec3[l]));
            (rs.buf[0][l], rs.buf[1][l], rs.buf[2][l]) = (out, at(&g[l]), at(&beta[l]));
        }
        // SAFETY: the signatures of conv1d_silu_replay and gdn_recurrent_replay, ops.rs's grids.
        unsafe {
            let per = c.div_ceil(128) * keep.max(1).div_ceil(super::conv_steps(kernel));
            let f: Replay = kern.kernel("conv1d_silu_replay");
            kern.launch((per * layers) as u32, 128, &|| {
                f(cs, per as i32, keep as i32, c as i32, kernel as i32)
            });
            let f: Replay = kern.kernel("gdn_recurrent_replay");
            kern.launch((scan_blocks * layers) as u32, 128, &|| {
                f(rs, keep as i32, hk as i32, hv as i32, 0)
            });
        }
        for l in 0..layers {
            assert_eq!(
                bits(&conv3[l]),
                bits(&conv1[l]),
                "keep {keep}: conv state {l}"
            );
            assert_eq!(
                bits(&rec3[l]),
                bits(&rec1[l]),
                "keep {keep}: recurrent state {l}"
            );
        }
    }
}

/// attention_combine merges a row's chunks as a serial walk in chunk order would, term for term
/// (bit for bit on the host), over more chunks than one shared-memory tile (a 282K-token
/// context), skipping empty chunks (max −inf, their values garbage), a row's last ones too.
#[test]
fn the_combine_merges_the_chunks_in_order_over_several_tiles() {
    let Some(kern) = kernels(DIMS_256) else {
        return;
    };
    let (rows, nchunks, d) = (3, 1100, DIMS_256.head_dim);
    let s = d + 2;
    let mut part = random(rows * nchunks * s, 91);
    for r in 0..rows {
        for c in 0..nchunks {
            let at = (r * nchunks + c) * s;
            if (c + r) % 97 == 5 || (r == 1 && c >= 700) {
                part[at] = f32::NEG_INFINITY;
                part[at + 1] = 0.0;
                part[at + 2..at + s].fill(f32::NAN);
            } else {
                part[at] *= 8.0;
                part[at + 1] = part[at + 1].abs() + 0.5;
            }
        }
    }
    let out = vec![f32::NAN; rows * d];
    // SAFETY: part holds [rows, nchunks, d + 2] values, out [rows, d].
    unsafe { combine(&kern, Addr::of(&part), Addr::of(&out), rows, nchunks) };
    for r in 0..rows {
        let p = &part[r * nchunks * s..(r + 1) * nchunks * s];
        let mt = (0..nchunks)
            .map(|c| p[c * s])
            .fold(f32::NEG_INFINITY, f32::max);
        let (mut lt, mut v) = (0.0f32, vec![0.0f32; d]);
        for c in (0..nchunks).filter(|c| p[c * s] != f32::NEG_INFINITY) {
            let e = (p[c * s] - mt).exp();
            lt += p[c * s + 1] * e;
            for (i, v) in v.iter_mut().enumerate() {
                *v += p[c * s + 2 + i] * e;
            }
        }
        let want: Vec<f32> = v.iter().map(|v| v / lt).collect();
        assert_eq!(bits(&out[r * d..(r + 1) * d]), bits(&want), "row {r}");
    }
}

/// The split attention of decode and verify passes (chunks of `ops::ATTN_CHUNK` keys, merged
/// in order) matches the CPU over a context of several chunks, for head dims 32 and 256 (the
/// vector loads) and every cache format, and each row of a 3-token block has the bits the same
/// query gets alone.
#[test]
fn the_split_attention_on_the_host_matches_the_cpu_and_is_row_invariant() {
    // (hq, hkv): blocks of 2, 4, 3 (a group of 6, as the 27B's) and 1 query heads.
    for (dims, format, heads) in [
        (DIMS_32, KvFormat::Int8, (2, 1)),
        (DIMS_32, KvFormat::Int8, (8, 2)),
        (DIMS_32, KvFormat::Bf16, (6, 1)),
        (DIMS_32, KvFormat::F32, (3, 3)),
        (DIMS_256, KvFormat::Int8, (8, 1)),
        (DIMS_256, KvFormat::Bf16, (2, 1)),
        (DIMS_256, KvFormat::F32, (2, 1)),
    ] {
        split_attention_case(dims, format, heads);
    }
}

/// The divisors of a GQA group a staged block may take (up to `ops::STAGED_HEADS`).
fn staged_groupings(hq: usize, hkv: usize) -> Vec<usize> {
    let group = hq / hkv;
    (1..=group.min(super::ops::STAGED_HEADS))
        .filter(|h| group.is_multiple_of(*h))
        .collect()
}

/// The staged split attention (int8 cache, head dims 256 and 128) matches the CPU over five
/// chunks (seventeen of 64 keys), the last one partly filled, with and without a sliding window
/// whose first key is inside a tile; every grouping of a block's heads gives the same bits, and
/// so does each row of a 3-token block against its query alone.
#[test]
fn the_staged_split_attention_matches_the_cpu_in_any_grouping() {
    // Groups of 8 (the 35B-A3B's) and 6 (the 27B's), over one and two KV heads; a draft's 4;
    // the 35B-A3B's in chunks of 64 keys too (SPLASH_ATTENTION_CHUNK; 17 chunks, two tiles each).
    let default = super::ops::ATTN_CHUNK;
    for (dims, (hq, hkv), chunk) in [
        (DIMS_256, (8, 1), default),
        (DIMS_256, (12, 2), default),
        (DIMS_128, (8, 2), default),
        (DIMS_256, (8, 1), 64),
    ] {
        let Some(kern) = kernels_chunked(dims, chunk) else {
            return;
        };
        let (d, pos0, t) = (dims.head_dim, 1030, 3);
        let s = pos0 + t;
        let keys = random(s * hkv * d, 171);
        let values = random(s * hkv * d, 172);
        let q = random(t * hq * d, 173);
        let scale = (d as f32).powf(-0.5);
        let cache = HostCache::new(&kern, KvFormat::Int8, &keys, &values, hkv, d);
        let groupings = staged_groupings(hq, hkv);
        for window in [None, Some(300)] {
            let want = cpu_attention(
                &q,
                &keys,
                &values,
                KvFormat::Int8,
                hq,
                hkv,
                d,
                pos0,
                scale,
                window,
            );
            let staged = |q: &[f32], pos0: usize, heads: usize| {
                let kernel = SplitKernel::Staged { heads };
                let (format, dims) = (KvFormat::Int8, (hq, hkv, d));
                split_attention(&kern, q, &cache, format, dims, pos0, scale, window, kernel)
            };
            let block = staged(&q, pos0, 1);
            let err = rel_err(&block, &want);
            assert!(
                err < 1e-4,
                "d={d} hq={hq} hkv={hkv} {window:?}: relative error {err}"
            );
            for &heads in &groupings[1..] {
                assert_eq!(
                    bits(&staged(&q, pos0, heads)),
                    bits(&block),
                    "d={d} hq={hq} hkv={hkv} {window:?}: {heads} heads a block differ from one"
                );
            }
            let most = *groupings.last().unwrap();
            for ti in 0..t {
                let alone = staged(&q[ti * hq * d..(ti + 1) * hq * d], pos0 + ti, most);
                assert_eq!(
                    bits(&alone),
                    bits(&block[ti * hq * d..(ti + 1) * hq * d]),
                    "d={d} hq={hq} hkv={hkv} {window:?}: row {ti} of the block differs from its query alone"
                );
            }
        }
    }
}

/// The staged split attention of several sequences in one launch
/// (`attention_part_seqs_staged`, `attention_combine_seqs`) gives every sequence the bits of its
/// own `attention_part_staged` launch, in other groupings of the heads, over contexts of 1,030,
/// 5 and 300 keys (the short ones take the long one's chunk count, their extra chunks empty);
/// in chunks of the default 256 keys and of 64 (`SPLASH_ATTENTION_CHUNK`).
#[test]
fn the_staged_attention_of_several_sequences_has_each_ones_bits() {
    for chunk in [super::ops::ATTN_CHUNK, 64] {
        staged_attention_of_several_sequences(chunk);
    }
}

fn staged_attention_of_several_sequences(chunk: usize) {
    let Some(kern) = kernels_chunked(DIMS_256, chunk) else {
        return;
    };
    let (d, hq, hkv) = (256usize, 12usize, 2usize);
    let seqs = [(1030usize, 3usize), (5, 1), (300, 2)];
    let scale = (d as f32).powf(-0.5);
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let q = random(rows * hq * d, 181);
    let caches: Vec<HostCache> = seqs
        .iter()
        .enumerate()
        .map(|(i, &(pos0, n))| {
            let s = pos0 + n;
            let (k, v) = (
                random(s * hkv * d, 182 + 2 * i as u64),
                random(s * hkv * d, 183 + 2 * i as u64),
            );
            HostCache::new(&kern, KvFormat::Int8, &k, &v, hkv, d)
        })
        .collect();
    let mut solo = Vec::new();
    let mut off = 0;
    for (&(pos0, n), cache) in seqs.iter().zip(&caches) {
        let q = &q[off * hq * d..(off + n) * hq * d];
        solo.extend(split_attention(
            &kern,
            q,
            cache,
            KvFormat::Int8,
            (hq, hkv, d),
            pos0,
            scale,
            None,
            SplitKernel::Staged { heads: 1 },
        ));
        off += n;
    }
    let (slots, longest, chunks) = attn_slots(&seqs, &caches, kern.chunk);
    let (n_seqs, qrows) = (seqs.len(), longest * hq);
    for heads in staged_groupings(hq, hkv) {
        let part = vec![f32::NAN; n_seqs * qrows * chunks * (d + 2)];
        let out = vec![f32::NAN; rows * hq * d];
        let (qa, pa, oa) = (Addr::of(&q), Addr::of(&part), Addr::of(&out));
        // SAFETY: the signatures of attention_part_seqs_staged and attention_combine_seqs in
        // kernels/attention.cu, over buffers of the sizes ops::attention_seqs gives them.
        unsafe {
            let f: host::attention_part_seqs_staged = kern.kernel("attention_part_seqs_staged");
            kern.launch((n_seqs * qrows / heads * chunks) as u32, 128, &|| {
                f(
                    qa.ptr(),
                    pa.ptr(),
                    hq as i32,
                    hkv as i32,
                    scale,
                    slots,
                    qrows as i32,
                    chunks as i32,
                    heads as i32,
                )
            });
            let comb: host::attention_combine_seqs = kern.kernel("attention_combine_seqs");
            kern.launch((n_seqs * qrows) as u32, 128, &|| {
                comb(
                    pa.ptr(),
                    oa.ptr(),
                    hq as i32,
                    slots,
                    qrows as i32,
                    chunks as i32,
                )
            });
        }
        assert_eq!(
            bits(&out),
            bits(&solo),
            "{heads} heads a block: outputs differ"
        );
    }
}

/// ops::attention's one-launch kernel (`attention`, for long passes without the flash kernel)
/// of `q` `[t, hq, d]` at positions `pos0..`.
#[allow(clippy::too_many_arguments)]
fn whole_attention(
    kern: &HostKernels,
    q: &[f32],
    cache: &HostCache,
    format: KvFormat,
    (hq, hkv, d): (usize, usize, usize),
    pos0: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let t = q.len() / (hq * d);
    let out = vec![f32::NAN; t * hq * d];
    let (qa, oa) = (Addr::of(q), Addr::of(&out));
    let (ka, ksa, va, vsa) = cache.addrs();
    let heads = super::ops::attention_heads(t, hq, hkv, ATTENTION_HEADS);
    // SAFETY: the signature of attention in kernels/attention.cu.
    unsafe {
        let f: host::attention = kern.kernel("attention");
        kern.launch((t * hq / heads) as u32, 128, &|| {
            f(
                qa.ptr(),
                ka.ptr(),
                ksa.ptr(),
                va.ptr(),
                vsa.ptr(),
                oa.ptr(),
                kv_code(format),
                hq as i32,
                hkv as i32,
                pos0 as i32,
                std::ptr::null(),
                scale,
                0,
                window.unwrap_or(0) as i32,
                heads as i32,
            )
        });
    }
    out
}

/// Which split-attention kernel [`split_attention`] launches.
#[derive(Clone, Copy)]
enum SplitKernel {
    /// `attention_part` (or its grouped twin), heads a block as ops::attention_heads picks them.
    Warps,
    /// `attention_part_staged` (int8 caches) with `heads` query heads a block.
    Staged { heads: usize },
}

/// ops::attention for ≤ 32 rows on the host: `kernel` over `q` `[t, hq, d]` at positions
/// `pos0..` and ceil(span / ATTN_CHUNK) chunks of `cache`, then `attention_combine`.
#[allow(clippy::too_many_arguments)]
fn split_attention(
    kern: &HostKernels,
    q: &[f32],
    cache: &HostCache,
    format: KvFormat,
    (hq, hkv, d): (usize, usize, usize),
    pos0: usize,
    scale: f32,
    window: Option<usize>,
    kernel: SplitKernel,
) -> Vec<f32> {
    let t = q.len() / (hq * d);
    let mask = super::ops::KeyMask { block: 0, window };
    let chunks = super::ops::split_chunks(pos0.into(), t, mask, kern.chunk);
    let rows = t * hq;
    let part = vec![f32::NAN; rows * chunks * (d + 2)];
    let out = vec![f32::NAN; rows * d];
    let (qa, pa, oa) = (Addr::of(q), Addr::of(&part), Addr::of(&out));
    let (ka, ksa, va, vsa) = cache.addrs();
    let (hq_i, hkv_i, pos0_i) = (hq as i32, hkv as i32, pos0 as i32);
    let (window_i, chunks_i) = (window.unwrap_or(0) as i32, chunks as i32);
    // SAFETY: the signatures of attention_part, attention_part_staged and attention_combine in
    // kernels/attention.cu, over buffers of the sizes ops::attention gives them.
    unsafe {
        match kernel {
            SplitKernel::Warps => {
                let heads = super::ops::attention_heads(t, hq, hkv, ATTENTION_HEADS);
                let f: host::attention_part =
                    kern.kernel(super::ops::split_kernel("attention_part", heads));
                kern.launch((rows / heads * chunks) as u32, 128, &|| {
                    f(
                        qa.ptr(),
                        ka.ptr(),
                        ksa.ptr(),
                        va.ptr(),
                        vsa.ptr(),
                        pa.ptr(),
                        kv_code(format),
                        hq_i,
                        hkv_i,
                        pos0_i,
                        std::ptr::null(),
                        scale,
                        0,
                        window_i,
                        chunks_i,
                        heads as i32,
                    )
                });
            }
            SplitKernel::Staged { heads } => {
                assert_eq!(
                    format,
                    KvFormat::Int8,
                    "the staged kernel reads int8 caches"
                );
                let f: host::attention_part_staged = kern.kernel("attention_part_staged");
                kern.launch((rows / heads * chunks) as u32, 128, &|| {
                    f(
                        qa.ptr(),
                        ka.ptr(),
                        ksa.ptr(),
                        va.ptr(),
                        vsa.ptr(),
                        pa.ptr(),
                        hq_i,
                        hkv_i,
                        pos0_i,
                        std::ptr::null(),
                        scale,
                        0,
                        window_i,
                        chunks_i,
                        heads as i32,
                    )
                });
            }
        }
        combine(kern, pa, oa, rows, chunks);
    }
    out
}

fn split_attention_case(dims: KernelDims, format: KvFormat, (hq, hkv): (usize, usize)) {
    let Some(kern) = kernels(dims) else { return };
    let (d, pos0, t) = (dims.head_dim, 1030, 3);
    let s = pos0 + t;
    let keys = random(s * hkv * d, 71);
    let values = random(s * hkv * d, 72);
    let q = random(t * hq * d, 73);
    let scale = (d as f32).powf(-0.5);
    let cache = HostCache::new(&kern, format, &keys, &values, hkv, d);
    // No window, and a sliding window whose first key (1030 - 299 = 731) is not on a chunk
    // boundary: its launch covers chunks 2..=4 of 0..=4.
    for window in [None, Some(300)] {
        let want = cpu_attention(&q, &keys, &values, format, hq, hkv, d, pos0, scale, window);
        let split = |q: &[f32], pos0: usize| {
            let kernel = SplitKernel::Warps;
            split_attention(
                &kern,
                q,
                &cache,
                format,
                (hq, hkv, d),
                pos0,
                scale,
                window,
                kernel,
            )
        };
        let block = split(&q, pos0);
        let err = rel_err(&block, &want);
        assert!(
            err < 1e-4,
            "d={d} {format:?} hq={hq} hkv={hkv} {window:?}: relative error {err}"
        );
        let whole = whole_attention(&kern, &q, &cache, format, (hq, hkv, d), pos0, scale, window);
        let err = rel_err(&whole, &want);
        assert!(
            err < 1e-4,
            "d={d} {format:?} hq={hq} hkv={hkv} {window:?}: one launch, relative error {err}"
        );
        for ti in 0..t {
            let alone = split(&q[ti * hq * d..(ti + 1) * hq * d], pos0 + ti);
            assert!(
                alone
                    .iter()
                    .zip(&block[ti * hq * d..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "d={d} {format:?} {window:?}: row {ti} of the block differs from its query alone"
            );
        }
    }
}

/// The fused residual add and norm gives the bits of add_in_place then rms_norm, on rows of
/// a multiple of 4 (float4) and others.
#[test]
fn the_fused_add_and_norm_on_the_host_has_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for d in [5120usize, 50] {
        let rows = 3;
        let threads = (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
        let (x0, y, w) = (random(rows * d, 81), random(rows * d, 82), random(d, 83));
        let eps = 1e-6f32;
        // SAFETY (every launch): the signatures of add_in_place, rms_norm and add_rms_norm.
        let (two_x, two_out) = (x0.clone(), vec![f32::NAN; rows * d]);
        unsafe {
            let add: host::add_in_place = kern.kernel("add_in_place");
            let norm: host::rms_norm = kern.kernel("rms_norm");
            let (xa, ya, wa, oa) = (
                Addr::of(&two_x),
                Addr::of(&y),
                Addr::of(&w),
                Addr::of(&two_out),
            );
            let n = rows * d;
            kern.launch(n.div_ceil(256) as u32, 256, &|| {
                add(xa.ptr(), ya.ptr(), n as i64)
            });
            kern.launch(rows as u32, threads, &|| {
                norm(xa.ptr(), wa.ptr(), oa.ptr(), d as i32, eps)
            });
        }
        let (one_x, one_out) = (x0.clone(), vec![f32::NAN; rows * d]);
        unsafe {
            let fused: host::add_rms_norm = kern.kernel("add_rms_norm");
            let (xa, ya, wa, oa) = (
                Addr::of(&one_x),
                Addr::of(&y),
                Addr::of(&w),
                Addr::of(&one_out),
            );
            kern.launch(rows as u32, threads, &|| {
                fused(
                    xa.ptr(),
                    ya.ptr(),
                    wa.ptr(),
                    oa.ptr(),
                    d as i32,
                    eps,
                    std::ptr::null(),
                    0,
                )
            });
        }
        assert_eq!(bits(&one_x), bits(&two_x), "d={d}: the residual");
        assert_eq!(bits(&one_out), bits(&two_out), "d={d}: the norm");
        assert!(one_out.iter().all(|v| v.is_finite()));
    }
}

/// RoPE from a position table (`rope_table`: image rows under interleaved M-RoPE, text after
/// an image) turns query and key rows as the CPU's `Rope::apply_3d` does.
#[test]
fn the_position_table_rope_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (hq, hkv, d, rot, n) = (4usize, 2usize, 32usize, 16usize, 7usize);
    let rope = cpu::Rope::new(rot, 10_000.0).with_section([3, 3, 2]);
    // An image of 2×3 rows at 5, then a text row.
    let positions: Vec<[u32; 3]> = (0..6u32)
        .map(|k| [5, 5 + k / 3, 5 + k % 3])
        .chain([[8, 8, 8]])
        .collect();
    let table = rope.position_table(&positions);
    let inv: Vec<f32> = (0..rot / 2)
        .map(|i| 1.0 / 10_000f32.powf((2 * i) as f32 / rot as f32))
        .collect();
    let (q0, k0) = (random(n * hq * d, 91), random(n * hkv * d, 92));
    let (q, k) = (q0.clone(), k0.clone());
    // SAFETY: the signature of rope_table, over buffers of the sizes it indexes.
    unsafe {
        let f: host::rope_table = kern.kernel("rope_table");
        let (qa, ka, ia, ta) = (Addr::of(&q), Addr::of(&k), Addr::of(&inv), Addr::of(&table));
        kern.launch((n * (hq + hkv)) as u32, 32, &|| {
            f(
                qa.ptr(),
                ka.ptr(),
                ia.ptr(),
                ta.ptr(),
                hq as i32,
                hkv as i32,
                d as i32,
                rot as i32,
            )
        });
    }
    let (mut want_q, mut want_k) = (q0, k0);
    rope.apply_3d(&mut want_q, hq, d, &positions);
    rope.apply_3d(&mut want_k, hkv, d, &positions);
    assert!(rel_err(&q, &want_q) < 1e-6, "{}", rel_err(&q, &want_q));
    assert!(rel_err(&k, &want_k) < 1e-6, "{}", rel_err(&k, &want_k));
    // Text rows at (p, p, p) turn as plain RoPE at p.
    let mut plain = random(hq * d, 93);
    let mut tabled = plain.clone();
    rope.apply(&mut plain, hq, d, 8);
    rope.apply_3d(&mut tabled, hq, d, &[[8, 8, 8]]);
    assert_eq!(bits(&plain), bits(&tabled));
}

/// The residual add, the norm and the tensor-core GEMV's f16 conversion in one launch
/// (`add_rms_norm_to_f16_tc`) write the bits of `add_rms_norm` then `to_f16_tc`: the residual,
/// the normed rows, their f16 halves and their block scales; and, asked for, those of
/// `quantize_q8` (the dp4a GEMV's int8 codes, scales and sums), also without the f16 (for the
/// int8 GEMV of the tiles), and those of `quantize_q8_blocks` (the int8 tensor-core GEMV's).
#[test]
fn the_norm_with_its_f16_conversion_has_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for d in [5120usize, 2048, 256] {
        let rows = 3;
        let threads = (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
        let (x0, y, w) = (random(rows * d, 91), random(rows * d, 92), random(d, 93));
        let eps = 1e-6f32;
        let (blocks256, blocks32) = (rows * d / 256, rows * d / 32);
        // `fused`: one launch; `f16`, `blocks8`: with the f16 conversion, with the int8 blocks
        // (always in the separate kernels).
        let run = |fused: bool, f16: bool, blocks8: bool| {
            let (x, out) = (x0.clone(), vec![f32::NAN; rows * d]);
            let (xh, xs) = (vec![0u16; rows * d], vec![f32::NAN; blocks256]);
            let (q, qd, qs) = (
                vec![0i8; rows * d],
                vec![f32::NAN; blocks32],
                vec![f32::NAN; blocks32],
            );
            let (qa, qda, qsa) = (Addr::of(&q), Addr::of(&qd), Addr::of(&qs));
            let (b, bd, bs) = (
                vec![0i8; rows * d],
                vec![f32::NAN; blocks256],
                vec![0i16; blocks32],
            );
            let [ba, bda, bsa] = if fused && !blocks8 {
                [Addr(0); 3]
            } else {
                [Addr::of(&b), Addr::of(&bd), Addr::of(&bs)]
            };
            let (xa, ya, wa, oa, ha, sa) = (
                Addr::of(&x),
                Addr::of(&y),
                Addr::of(&w),
                Addr::of(&out),
                Addr::of(&xh),
                Addr::of(&xs),
            );
            // SAFETY: the signatures of add_rms_norm, to_f16_tc, quantize_q8 and
            // add_rms_norm_to_f16_tc, and ops.rs's grids.
            unsafe {
                if fused {
                    type Fused = host::add_rms_norm_to_f16_tc;
                    let f: Fused = kern.kernel("add_rms_norm_to_f16_tc");
                    kern.launch(rows as u32, threads, &|| {
                        f(
                            xa.ptr(),
                            ya.ptr(),
                            wa.ptr(),
                            oa.ptr(),
                            if f16 { ha.ptr() } else { std::ptr::null_mut() },
                            if f16 { sa.ptr() } else { std::ptr::null_mut() },
                            d as i32,
                            eps,
                            qa.ptr(),
                            qda.ptr(),
                            qsa.ptr(),
                            ba.ptr(),
                            bda.ptr(),
                            bsa.ptr(),
                            std::ptr::null(),
                            0,
                        )
                    });
                } else {
                    type Norm = host::add_rms_norm;
                    let norm: Norm = kern.kernel("add_rms_norm");
                    kern.launch(rows as u32, threads, &|| {
                        norm(
                            xa.ptr(),
                            ya.ptr(),
                            wa.ptr(),
                            oa.ptr(),
                            d as i32,
                            eps,
                            std::ptr::null(),
                            0,
                        )
                    });
                    let f: host::to_f16_tc = kern.kernel("to_f16_tc");
                    kern.launch(blocks256.div_ceil(8) as u32, 256, &|| {
                        f(oa.ptr(), ha.ptr(), sa.ptr(), blocks256 as i64)
                    });
                    let f: host::quantize_q8 = kern.kernel("quantize_q8");
                    kern.launch(blocks32.div_ceil(8) as u32, 256, &|| {
                        f(oa.ptr(), qa.ptr(), qda.ptr(), qsa.ptr(), blocks32 as i64)
                    });
                    let f: host::quantize_q8_blocks = kern.kernel("quantize_q8_blocks");
                    kern.launch(blocks256.div_ceil(8) as u32, 256, &|| {
                        f(
                            oa.ptr(),
                            ba.ptr(),
                            bda.ptr(),
                            bsa.ptr(),
                            blocks256 as i64,
                            (d / 256) as i32,
                        )
                    });
                }
            }
            (
                bits(&x),
                bits(&out),
                xh,
                bits(&xs),
                (q, bits(&qd), bits(&qs)),
                (b, bits(&bd), bs),
            )
        };
        let (fused, two, int8) = (
            run(true, true, false),
            run(false, true, true),
            run(true, false, false),
        );
        let blocks8 = run(true, false, true);
        assert_eq!(blocks8.5, two.5, "d={d}: the int8 blocks");
        assert_eq!(blocks8.4, two.4, "d={d}: the int8 codes beside the blocks");
        assert_eq!(
            (&blocks8.0, &blocks8.1),
            (&two.0, &two.1),
            "d={d}: blocks alone"
        );
        assert_eq!(
            int8.4, two.4,
            "d={d}: the int8 codes, scales and sums alone"
        );
        assert_eq!((&int8.0, &int8.1), (&two.0, &two.1), "d={d}: int8 alone");
        assert_eq!(fused.4, two.4, "d={d}: the int8 codes, scales and sums");
        assert_eq!(fused.0, two.0, "d={d}: the residual");
        assert_eq!(fused.1, two.1, "d={d}: the norm");
        assert_eq!(fused.2, two.2, "d={d}: the f16 halves");
        assert_eq!(fused.3, two.3, "d={d}: the block scales");
    }
}

/// `silu_mul_to_q8` writes the bits of `silu_mul` then `quantize_q8` (the MLP down product's
/// int8 input).
#[test]
fn the_gated_int8_conversion_has_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let n = 3 * 5120;
    let (g0, u) = (random(n, 94), random(n, 95));
    let blocks32 = n / 32;
    let run = |fused: bool| {
        let g = g0.clone();
        let (q, qd, qs) = (
            vec![0i8; n],
            vec![f32::NAN; blocks32],
            vec![f32::NAN; blocks32],
        );
        let (ga, ua, qa, da, sa) = (
            Addr::of(&g),
            Addr::of(&u),
            Addr::of(&q),
            Addr::of(&qd),
            Addr::of(&qs),
        );
        // SAFETY: the signatures of silu_mul, quantize_q8 and silu_mul_to_q8, and ops.rs's grids.
        unsafe {
            if fused {
                let f: host::silu_mul_to_q8 = kern.kernel("silu_mul_to_q8");
                kern.launch(n.div_ceil(256) as u32, 256, &|| {
                    f(
                        ga.ptr(),
                        ua.ptr(),
                        qa.ptr(),
                        da.ptr(),
                        sa.ptr(),
                        blocks32 as i64,
                    )
                });
            } else {
                let f: host::silu_mul = kern.kernel("silu_mul");
                kern.launch(n.div_ceil(256) as u32, 256, &|| {
                    f(ga.ptr(), ua.ptr(), n as i64)
                });
                let f: host::quantize_q8 = kern.kernel("quantize_q8");
                kern.launch(n.div_ceil(256) as u32, 256, &|| {
                    f(ga.ptr(), qa.ptr(), da.ptr(), sa.ptr(), blocks32 as i64)
                });
            }
        }
        (q, bits(&qd), bits(&qs))
    };
    assert_eq!(run(true), run(false));
}

/// `silu_mul_to_q8_blocks` writes the bits of `silu_mul` then `quantize_q8_blocks` (the MLP
/// down product's input on the int8 tensor-core GEMV).
#[test]
fn the_gated_int8_block_conversion_has_the_bits_of_the_two_kernels() {
    let Some(kern) = kernels(DIMS_32) else { return };
    // Three tokens of 20 blocks.
    let (n, nb) = (3 * 5120, 20);
    let (g0, u) = (random(n, 96), random(n, 97));
    let run = |fused: bool| {
        let g = g0.clone();
        let (q, qd, qs) = (vec![0i8; n], vec![f32::NAN; n / 256], vec![-1i16; n / 32]);
        let (ga, ua, qa, da, sa) = (
            Addr::of(&g),
            Addr::of(&u),
            Addr::of(&q),
            Addr::of(&qd),
            Addr::of(&qs),
        );
        let (grid, blocks) = ((n / 8).div_ceil(256) as u32, (n / 256) as i64);
        // SAFETY: the signatures of silu_mul, quantize_q8_blocks and silu_mul_to_q8_blocks, and
        // ops.rs's grids.
        unsafe {
            if fused {
                let f: host::silu_mul_to_q8_blocks = kern.kernel("silu_mul_to_q8_blocks");
                kern.launch(grid, 256, &|| {
                    f(ga.ptr(), ua.ptr(), qa.ptr(), da.ptr(), sa.ptr(), blocks, nb)
                });
            } else {
                let f: host::silu_mul = kern.kernel("silu_mul");
                kern.launch(n.div_ceil(256) as u32, 256, &|| {
                    f(ga.ptr(), ua.ptr(), n as i64)
                });
                let f: host::quantize_q8_blocks = kern.kernel("quantize_q8_blocks");
                kern.launch(grid, 256, &|| {
                    f(ga.ptr(), qa.ptr(), da.ptr(), sa.ptr(), blocks, nb)
                });
            }
        }
        (q, bits(&qd), qs)
    };
    assert_eq!(run(true), run(false));
}

/// The candidates of DFlash2's selector picked on the device: the best k of each row as
/// `cpu::top_k` picks them (ties to the lower id), after the draft's multiplier and softcap.
#[test]
fn the_row_top_k_on_the_host_matches_the_cpu() {
    let Some(kern) = kernels(DIMS_32) else { return };
    // 3,001 values: one first-stage block a row, which writes the result; 9,001: five, merged
    // by the second stage (ops::top_k_rows's launches).
    for (rows, v) in [(3usize, 3001usize), (2, 9001)] {
        // Values on a coarse grid: many ties, within and across the first stage's blocks.
        let logits: Vec<f32> = random(rows * v, 91)
            .iter()
            .map(|x| (x * 40.0).round() / 4.0)
            .collect();
        for (k, mult, cap) in [(16usize, 1.0f32, 0.0f32), (1, 0.5, 0.0), (32, 1.5, 3.0)] {
            let parts = v.div_ceil(2048);
            let ids = vec![-1i32; rows * k];
            let vals = vec![f32::NAN; rows * k];
            let part_ids = vec![-1i32; rows * parts * k];
            let part_vals = vec![f32::NAN; rows * parts * k];
            let (first_ids, first_vals) = if parts > 1 {
                (Addr::of(&part_ids), Addr::of(&part_vals))
            } else {
                (Addr::of(&ids), Addr::of(&vals))
            };
            let (la, ia, va) = (Addr::of(&logits), Addr::of(&ids), Addr::of(&vals));
            // SAFETY: the signatures of top_k_part and top_k_merge; ops::top_k_rows's grids,
            // blocks and buffers.
            unsafe {
                type Part = host::top_k_part;
                let f: Part = kern.kernel("top_k_part");
                kern.launch((rows * parts) as u32, 256, &|| {
                    f(
                        la.ptr(),
                        v as i32,
                        k as i32,
                        mult,
                        cap,
                        parts as i32,
                        first_ids.ptr(),
                        first_vals.ptr(),
                    )
                });
                if parts > 1 {
                    type Merge = host::top_k_merge;
                    let m: Merge = kern.kernel("top_k_merge");
                    kern.launch(rows as u32, 256, &|| {
                        m(
                            first_ids.ptr(),
                            first_vals.ptr(),
                            (parts * k) as i32,
                            k as i32,
                            ia.ptr(),
                            va.ptr(),
                        )
                    });
                }
            }
            for (r, row) in logits.chunks_exact(v).enumerate() {
                let shaped = row.iter().enumerate().map(|(i, &x)| {
                    let y = x * mult;
                    (i as u32, if cap > 0.0 { (y / cap).tanh() * cap } else { y })
                });
                let want = cpu::top_k(shaped, k);
                let got: Vec<(u32, f32)> = ids[r * k..(r + 1) * k]
                    .iter()
                    .zip(&vals[r * k..(r + 1) * k])
                    .map(|(&i, &x)| (i as u32, x))
                    .collect();
                assert_eq!(got, want, "v={v} k={k} mult={mult} cap={cap} row {r}");
            }
        }
    }
}

/// The dp4a GEMV of a matrix of few rows (the GDN gate projections) as `ops::gemv_q8` launches
/// it for several tokens: a group of blocks per token. It matches the CPU, and each token gets
/// the bits it gets alone.
#[test]
fn the_small_q8_gemv_on_the_host_gives_each_token_its_bits_alone() {
    let Some(kern) = kernels(DIMS_32) else { return };
    // 48 rows of 1,024 values, split 4 (ops::gemv_q8's rule below 1,024 rows): 48 blocks a token.
    // Rows from 20 on also go to a second output, as for two weights stacked into one.
    let (n, kd, split, rows1) = (48usize, 1024usize, 4usize, 20usize);
    for (t, fields, suffix) in [
        (GgmlType::Q8_0, &[0usize][..], "q8_0"),
        (GgmlType::Q5_K, &[0, 2], "q5_k"),
    ] {
        let w = kquant(t, n, kd, fields, 31);
        // `x` `[tokens, kd]` times the rows, all into one output (`stacked` false), or rows
        // below `rows1` into one and the others into a second, returned one after the other.
        let run = |x: &[f32], stacked: bool| -> Vec<f32> {
            let tokens = x.len() / kd;
            let blocks32 = tokens * kd / 32;
            let (xq, xd, xs) = (
                vec![0i8; tokens * kd],
                vec![0.0f32; blocks32],
                vec![0.0f32; blocks32],
            );
            let first = if stacked { rows1 } else { n };
            let y = vec![f32::NAN; tokens * first];
            let y2 = vec![f32::NAN; tokens * (n - first)];
            let (xa, qa, da, sa, ya, y2a, wa) = (
                Addr::of(x),
                Addr::of(&xq),
                Addr::of(&xd),
                Addr::of(&xs),
                Addr::of(&y),
                Addr::of(&y2),
                Addr::of(w.raw_bytes()),
            );
            let row_bytes = t.row_bytes(kd) as i64;
            // SAFETY: the signatures of quantize_q8 and gemv1_q8_* in kernels/gemv.cu, over buffers
            // of the sizes ops::gemv_q8 gives them.
            unsafe {
                let quantize: host::quantize_q8 = kern.kernel("quantize_q8");
                kern.launch((blocks32 * 32).div_ceil(256) as u32, 256, &|| {
                    quantize(xa.ptr(), qa.ptr(), da.ptr(), sa.ptr(), blocks32 as i64)
                });
                type Gemv = host::gemv_q8;
                let gemv: Gemv = kern.kernel(&format!("gemv1_q8_{suffix}"));
                let group = n.div_ceil(4 / split);
                kern.launch((group * tokens) as u32, 128, &|| {
                    gemv(
                        wa.ptr(),
                        row_bytes,
                        qa.ptr(),
                        da.ptr(),
                        sa.ptr(),
                        ya.ptr(),
                        y2a.ptr(),
                        n as i32,
                        kd as i32,
                        tokens as i32,
                        split as i32,
                        first as i32,
                    )
                });
            }
            [y, y2].concat()
        };
        // Activations rounded to int8 per 32 values: about 4e-3.
        check_row_gemv(&format!("{t}"), &w, rows1, 1e-2, run);
    }
}

/// Checks a warp-per-row GEMV `run(x, stacked)` of `w` (see `ops::RowGemv`) over 5 tokens:
/// within `tol` of the CPU, the stacked launch (rows from `rows1` on into a second output)
/// giving the bits of the single one, and each token the bits it gets alone.
fn check_row_gemv(
    what: &str,
    w: &Weight,
    rows1: usize,
    tol: f32,
    run: impl Fn(&[f32], bool) -> Vec<f32>,
) {
    let (n, kd, tokens) = (w.rows(), w.cols(), 5);
    let x = random(tokens * kd, 33);
    let mut want = vec![0.0f32; tokens * n];
    cpu::matmul(&mut want, &x, w);
    let y = run(&x, false);
    // Stacked: the same numbers, token-major within each output.
    let stacked = run(&x, true);
    let (lo, hi) = stacked.split_at(tokens * rows1);
    let rest = n - rows1;
    for ti in 0..tokens {
        let row = &y[ti * n..(ti + 1) * n];
        let parts = [
            &lo[ti * rows1..(ti + 1) * rows1],
            &hi[ti * rest..(ti + 1) * rest],
        ]
        .concat();
        assert_eq!(
            bits(row),
            bits(&parts),
            "{what}: token {ti}'s two outputs differ from the one output"
        );
    }
    let err = rel_err(&y, &want);
    assert!(err < tol, "{what}: relative error {err}");
    for (ti, row) in y.chunks_exact(n).enumerate() {
        let alone = run(&x[ti * kd..(ti + 1) * kd], false);
        assert_eq!(
            bits(row),
            bits(&alone),
            "{what}: token {ti} of {tokens} differs from the token alone"
        );
    }
}

/// The f32-decoding GEMV (`gemv_*`, `gemv1_*`) as `ops::gemv_float` launches it: a matrix of
/// few rows (the MoE router and shared-expert gate stacked, 4 warps a row, a group of blocks a
/// token) and one of many (a warp a row, 16 tokens a launch), f32 rows with a partial last
/// sub-block and bf16 rows.
#[test]
fn the_float_gemv_on_the_host_gives_each_token_its_bits_alone() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let f32_weight = |n: usize, kd: usize| {
        let v = random(n * kd, 41);
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Weight::new(DType::F32, vec![n, kd], HostBytes::from_vec(raw)).unwrap()
    };
    let bf16_weight = |n: usize, kd: usize| {
        let v = random(n * kd, 43);
        let raw: Vec<u8> = v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect();
        Weight::new(DType::BF16, vec![n, kd], HostBytes::from_vec(raw)).unwrap()
    };
    for (w, suffix, rows1) in [
        (f32_weight(257, 1000), "f32", 256),
        (bf16_weight(72, 1024), "bf16", 40),
        (f32_weight(1040, 96), "f32", 1024),
    ] {
        let (n, kd) = (w.rows(), w.cols());
        let row_bytes = w.raw_bytes().len() / n;
        // ops::RowGemv's rule.
        let split = if n < 1024 { 4 } else { 1 };
        let run = |x: &[f32], stacked: bool| -> Vec<f32> {
            let tokens = x.len() / kd;
            let first = if stacked { rows1 } else { n };
            let y = vec![f32::NAN; tokens * first];
            let y2 = vec![f32::NAN; tokens * (n - first)];
            let (xa, ya, y2a, wa) = (
                Addr::of(x),
                Addr::of(&y),
                Addr::of(&y2),
                Addr::of(w.raw_bytes()),
            );
            let group = n.div_ceil(4 / split);
            let per_token = tokens == 1 || split == 4;
            type Gemv = host::gemv;
            // SAFETY: the signature of gemv_* / gemv1_* in kernels/gemv.cu (WEIGHT_KERNELS), over
            // buffers of the sizes ops::gemv_float gives them; no affine scales.
            unsafe {
                let name = format!("gemv{}_{suffix}", if per_token { "1" } else { "" });
                let gemv: Gemv = kern.kernel(&name);
                let grid = if per_token { group * tokens } else { group };
                kern.launch(grid as u32, 128, &|| {
                    gemv(
                        wa.ptr(),
                        row_bytes as i64,
                        std::ptr::null(),
                        std::ptr::null(),
                        32,
                        xa.ptr(),
                        ya.ptr(),
                        y2a.ptr(),
                        n as i32,
                        kd as i32,
                        tokens as i32,
                        split as i32,
                        first as i32,
                    )
                });
            }
            [y, y2].concat()
        };
        check_row_gemv(&format!("{suffix} {n}x{kd}"), &w, rows1, 1e-5, run);
    }
}

/// cuBLAS's bf16 input, four values a thread: `to_bf16` rounds as `half::bf16::from_f32` for
/// every length (a scalar tail, an unaligned start), and the producers that write it with their
/// rows (`silu_mul_to_bf16`, `add_rms_norm_to_bf16`, `rms_norm_gated_to_bf16`) give the bits of
/// their f32 kernel then `to_bf16`.
#[test]
fn the_bf16_conversions_have_the_bits_of_rounding_the_f32_rows() {
    let Some(kern) = kernels(DIMS_32) else { return };
    type Convert = host::to_bf16;
    type Gated = host::silu_mul_to_bf16;
    // SAFETY (the kernels and every launch below): the kernels' signatures, a thread per four
    // values (ops.rs's grids) and one block a row for the norms.
    let (to_bf16, silu_to_bf16): (Convert, Gated) =
        unsafe { (kern.kernel("to_bf16"), kern.kernel("silu_mul_to_bf16")) };
    let rounded = |v: &[f32]| -> Vec<u16> {
        v.iter()
            .map(|x| half::bf16::from_f32(*x).to_bits())
            .collect()
    };
    let convert = |x: &[f32]| -> Vec<u16> {
        let out = vec![0u16; x.len()];
        let (xa, oa) = (Addr::of(x), Addr::of(&out));
        let n = x.len();
        kern.launch(n.div_ceil(4).div_ceil(256) as u32, 256, &|| unsafe {
            to_bf16(xa.ptr(), oa.ptr(), n as i64)
        });
        out
    };
    let x = random(1031, 1);
    for (start, n) in [(0usize, 1031usize), (1, 1030), (0, 3), (2, 7)] {
        let part = &x[start..start + n];
        assert_eq!(convert(part), rounded(part), "to_bf16 of {n} from {start}");
    }
    let (g, u) = (random(1030, 2), random(1030, 3));
    let mut gated = g.clone();
    cpu::silu_mul(&mut gated, &u);
    let out = vec![0u16; g.len()];
    let (ga, ua, oa) = (Addr::of(&g), Addr::of(&u), Addr::of(&out));
    kern.launch(g.len().div_ceil(4).div_ceil(256) as u32, 256, &|| unsafe {
        silu_to_bf16(ga.ptr(), ua.ptr(), oa.ptr(), g.len() as i64)
    });
    assert_eq!(out, rounded(&gated), "silu_mul_to_bf16");

    type Norm = host::add_rms_norm;
    type NormBf16 = host::add_rms_norm_to_bf16;
    type GatedNorm = host::rms_norm_gated;
    type GatedNormBf16 = host::rms_norm_gated_to_bf16;
    let (norm, norm_bf16, gated_norm, gated_norm_bf16): (Norm, NormBf16, GatedNorm, GatedNormBf16) = unsafe {
        (
            kern.kernel("add_rms_norm"),
            kern.kernel("add_rms_norm_to_bf16"),
            kern.kernel("rms_norm_gated"),
            kern.kernel("rms_norm_gated_to_bf16"),
        )
    };
    // Rows of 5,120 (float4 loads) and of 130 (scalar ones).
    for d in [5120usize, 130] {
        let rows = 3;
        let threads = (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
        let (x0, y, w) = (random(rows * d, 4), random(rows * d, 5), random(d, 6));
        let (x1, x2) = (x0.clone(), x0.clone());
        let (o1, o2, ob) = (
            vec![0f32; rows * d],
            vec![0f32; rows * d],
            vec![0u16; rows * d],
        );
        let (x1a, x2a, ya, wa) = (Addr::of(&x1), Addr::of(&x2), Addr::of(&y), Addr::of(&w));
        let (o1a, o2a, oba) = (Addr::of(&o1), Addr::of(&o2), Addr::of(&ob));
        kern.launch(rows as u32, threads, &|| unsafe {
            norm(
                x1a.ptr(),
                ya.ptr(),
                wa.ptr(),
                o1a.ptr(),
                d as i32,
                1e-6,
                std::ptr::null(),
                0,
            )
        });
        kern.launch(rows as u32, threads, &|| unsafe {
            norm_bf16(
                x2a.ptr(),
                ya.ptr(),
                wa.ptr(),
                o2a.ptr(),
                oba.ptr(),
                d as i32,
                1e-6,
                std::ptr::null(),
                0,
            )
        });
        assert_eq!(
            bits(&x1),
            bits(&x2),
            "add_rms_norm_to_bf16 d={d}: the residual"
        );
        assert_eq!(bits(&o1), bits(&o2), "add_rms_norm_to_bf16 d={d}: the norm");
        assert_eq!(
            ob,
            rounded(&o1),
            "add_rms_norm_to_bf16 d={d}: the bf16 rows"
        );
        let (g1, g2, gb) = (
            vec![0f32; rows * d],
            vec![0f32; rows * d],
            vec![0u16; rows * d],
        );
        let (g1a, g2a, gba) = (Addr::of(&g1), Addr::of(&g2), Addr::of(&gb));
        // Two rows a block: the second block's second warp has no row.
        kern.launch(2, 64, &|| unsafe {
            gated_norm(
                x0.as_ptr(),
                y.as_ptr(),
                w.as_ptr(),
                g1a.ptr(),
                rows as i32,
                d as i32,
                1e-6,
            )
        });
        kern.launch(2, 64, &|| unsafe {
            gated_norm_bf16(
                x0.as_ptr(),
                y.as_ptr(),
                w.as_ptr(),
                g2a.ptr(),
                gba.ptr(),
                rows as i32,
                d as i32,
                1e-6,
            )
        });
        assert_eq!(
            bits(&g1),
            bits(&g2),
            "rms_norm_gated_to_bf16 d={d}: the rows"
        );
        assert_eq!(
            gb,
            rounded(&g1),
            "rms_norm_gated_to_bf16 d={d}: the bf16 rows"
        );
        let mut want = vec![0f32; rows * d];
        for r in 0..rows {
            let row = r * d..(r + 1) * d;
            cpu::rms_norm_gated(&mut want[row.clone()], &x0[row.clone()], &y[row], &w, 1e-6);
        }
        let err = rel_err(&g1, &want);
        assert!(
            err < 1e-6,
            "rms_norm_gated d={d}: {err} from the CPU's rows"
        );
    }
}

mod vision;
