//! Launch wrappers, one per kernel of `kernels/`, named after the CPU op they mirror.
//! Pointers are device addresses from [`super::ptr`]; shapes follow the CPU ops' docs.

use std::cell::OnceCell;

use cudarc::driver::CudaSlice;

use super::{Arg, DeviceWeight, Gpu, GpuError, Kernels};
use crate::cpu::KvFormat;

/// Keys per chunk of the split attention (`ATTN_CHUNK` in kernels/attention.cu): small enough that a
/// decode step at 1K of context has a block per SM or so (1,024 made 48 blocks for the 27B's
/// 24 heads, each walking 1,024 keys).
pub const ATTN_CHUNK: usize = 256;
/// The fewest keys per chunk when `attention_prefill` splits a short pass's keys.
const FLASH_MIN_CHUNK: usize = 1024;
/// Query rows (of one sequence) up to which attention splits the keys into chunks: decode
/// rows, verify blocks and draft blocks, whose few queries would leave most of the GPU idle
/// over a long context. Longer passes (prefill) have enough queries to fill it.
const SPLIT_ATTENTION_ROWS: usize = 32;
/// Tokens per thread of the GDN conv with a `kernel`-tap filter (`conv_steps` in kernels/gdn.cu):
/// at least the history it reads, so that only the first chunk reads the conv state.
pub const fn conv_steps(kernel: usize) -> usize {
    if kernel - 1 > 4 {
        kernel - 1
    } else {
        4
    }
}

/// Tokens per GEMV launch (`GEMV_MAX_T` in kernels/common.cuh).
const GEMV_MAX_T: usize = 16;

/// From this many tokens on, a product runs as a cuBLAS bf16 GEMM over the weight decoded to
/// bf16 (one decode pass) instead of GEMV launches (one weight pass per 16 tokens). Above
/// every speculative block size, so verify passes stay batch-invariant.
const GEMM_MIN_T: usize = 48;

/// Weight rows decoded to bf16 at a time for the GEMM (bounds the scratch buffer).
const GEMM_ROW_CHUNK: usize = 8192;

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// Threads for a row-wise kernel over rows of `d` values: a multiple of 32, at most 256.
fn row_threads(d: usize) -> u32 {
    (d.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Activations as the tensor-core GEMV reads them: f16 in its k order, one power-of-two scale
/// per 256 values.
type F16Rows = (CudaSlice<u16>, CudaSlice<f32>);
/// Activations as the dp4a GEMV reads them: int8 codes, their scale and their sum per 32 values.
type Int8Rows = (CudaSlice<i8>, CudaSlice<f32>, CudaSlice<f32>);

/// `tokens` rows of `kdim` f32 activations at `x`, the input of one or more products. Each
/// GEMV family reads them converted (f16 for the tensor-core GEMV, int8 for the dp4a one,
/// bf16 for cuBLAS), a launch each; a conversion is made at the first product that needs it
/// and reused by the others, e.g. an attention layer's q, k and v projections, or a MoE
/// layer's shared and routed experts. Conversions are exact functions of `x`, so reuse
/// changes no bits; the rows at `x` must not change while this lives.
pub struct Activations {
    x: u64,
    tokens: usize,
    kdim: usize,
    f16: OnceCell<F16Rows>,
    int8: OnceCell<Int8Rows>,
    bf16: OnceCell<CudaSlice<u16>>,
}

impl Activations {
    /// The activations `[tokens, kdim]` at `x`, not converted yet.
    pub fn new(x: u64, tokens: usize, kdim: usize) -> Self {
        Self {
            x,
            tokens,
            kdim,
            f16: OnceCell::new(),
            int8: OnceCell::new(),
            bf16: OnceCell::new(),
        }
    }

    /// The activations at `x` whose f16 conversion a kernel has already written.
    fn with_f16(x: u64, tokens: usize, kdim: usize, f16: F16Rows) -> Self {
        let a = Self::new(x, tokens, kdim);
        let _ = a.f16.set(f16);
        a
    }

    /// The activations at `x` whose bf16 conversion a kernel has already written.
    fn with_bf16(x: u64, tokens: usize, kdim: usize, bf16: CudaSlice<u16>) -> Self {
        let a = Self::new(x, tokens, kdim);
        let _ = a.bf16.set(bf16);
        a
    }

    /// The device address of the f32 rows.
    pub fn rows(&self) -> u64 {
        self.x
    }

    /// Rows (tokens).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// `x` as the tensor-core GEMV reads it: f16 in its k order, one power-of-two scale per
    /// 256 values (`to_f16_tc`).
    fn f16(&self, gpu: &Gpu, k: &Kernels) -> Result<&F16Rows, GpuError> {
        converted(&self.f16, || {
            convert_f16_tc(gpu, k, "to_f16_tc", &[self.x], self.tokens, self.kdim)
        })
    }

    /// `x` as the dp4a GEMV reads it: int8 codes, scales and sums per 32 values.
    fn int8(&self, gpu: &Gpu, k: &Kernels) -> Result<&Int8Rows, GpuError> {
        converted(&self.int8, || {
            let blocks32 = self.tokens * self.kdim / 32;
            let xq = gpu.uninit::<i8>(self.tokens * self.kdim)?;
            let xd = gpu.uninit::<f32>(blocks32)?;
            let xs = gpu.uninit::<f32>(blocks32)?;
            gpu.launch(
                k,
                "quantize_q8",
                blocks(blocks32 * 32, 256),
                256,
                &[
                    Arg::Ptr(self.x),
                    Arg::Ptr(super::ptr(gpu, &xq, 0)),
                    Arg::Ptr(super::ptr(gpu, &xd, 0)),
                    Arg::Ptr(super::ptr(gpu, &xs, 0)),
                    Arg::I64(blocks32 as i64),
                ],
            )?;
            Ok((xq, xd, xs))
        })
    }

    /// `x` in bf16, for cuBLAS.
    fn bf16(&self, gpu: &Gpu, k: &Kernels) -> Result<&CudaSlice<u16>, GpuError> {
        converted(&self.bf16, || {
            let n = self.tokens * self.kdim;
            let xb = gpu.uninit::<u16>(n)?;
            gpu.launch(
                k,
                "to_bf16",
                blocks(n.div_ceil(4), 256),
                256,
                &[
                    Arg::Ptr(self.x),
                    Arg::Ptr(super::ptr(gpu, &xb, 0)),
                    Arg::I64(n as i64),
                ],
            )?;
            Ok(xb)
        })
    }

    /// Checks that `w` multiplies these activations.
    fn check(&self, w: &DeviceWeight) {
        assert_eq!(
            w.cols, self.kdim,
            "a weight of {} columns times activations of {}",
            w.cols, self.kdim
        );
    }
}

/// The conversion in `cell`, made by `make` the first time.
fn converted<T>(
    cell: &OnceCell<T>,
    make: impl FnOnce() -> Result<T, GpuError>,
) -> Result<&T, GpuError> {
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let c = make()?;
    Ok(cell.get_or_init(|| c))
}

/// `out[t, :] = W[row0..row0+n, :] · x[t, :]` for `t < tokens`, `out` `[tokens, n]`.
///
/// Up to [`GEMV_MAX_T`] tokens, each token's row is computed exactly as it would be alone
/// (the same kernel and order of sums for 1 and 16 tokens): a speculative verify pass then
/// gives bit for bit the logits of one-token decoding, and greedy speculation stays lossless.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    w: &DeviceWeight,
    row0: usize,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let x = Activations::new(x, tokens, w.cols);
    product(gpu, k, out, &x, w, row0, n, GEMM_MIN_T)
}

/// [`matmul`] of activations that other products may share (their conversions are reused).
pub fn matmul_activations(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: &Activations,
    w: &DeviceWeight,
    row0: usize,
    n: usize,
) -> Result<(), GpuError> {
    product(gpu, k, out, x, w, row0, n, GEMM_MIN_T)
}

/// [`matmul_activations`] whose rows may depend on the token count: bf16 weights go to cuBLAS
/// from two tokens on. For passes whose numbers only propose, like a draft block.
pub fn matmul_batched(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: &Activations,
    w: &DeviceWeight,
    row0: usize,
    n: usize,
) -> Result<(), GpuError> {
    let min_t = if stored_bf16(gpu, w) { 2 } else { GEMM_MIN_T };
    product(gpu, k, out, x, w, row0, n, min_t)
}

/// The cuBLAS handle a product of `tokens` rows by `w` runs on: from `gemm_min_t` tokens on,
/// outside batch-invariant passes, when the library loads.
fn gemm_blas(
    gpu: &Gpu,
    w: &DeviceWeight,
    tokens: usize,
    gemm_min_t: usize,
) -> Option<std::sync::Arc<cudarc::cublas::CudaBlas>> {
    let wanted = tokens >= gemm_min_t && w.cols.is_multiple_of(32) && !gpu.batch_invariant();
    wanted.then(|| gpu.blas()).flatten()
}

/// Whether GEMVs by `w` run on the tensor-core kernel: the tiled formats (it reads the tiles),
/// outside the exact mode.
fn tensor_core(gpu: &Gpu, w: &DeviceWeight) -> bool {
    !gpu.exact() && super::weights::is_tiled(w.format)
}

/// The product, by cuBLAS from `gemm_min_t` tokens on.
#[allow(clippy::too_many_arguments)]
fn product(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: &Activations,
    w: &DeviceWeight,
    row0: usize,
    n: usize,
    gemm_min_t: usize,
) -> Result<(), GpuError> {
    x.check(w);
    let tokens = x.tokens;
    assert!(row0 + n <= w.rows, "rows {row0}+{n} of {}", w.rows);
    assert!(
        row0.is_multiple_of(16) || !super::weights::is_tiled(w.format),
        "rows of a tiled weight start at a multiple of 16 (row {row0})"
    );
    if let Some(blas) = gemm_blas(gpu, w, tokens, gemm_min_t) {
        return gemm(gpu, k, &blas, out, x, w, row0, n);
    }
    let base = super::ptr(gpu, &w.data, row0 * w.row_bytes);
    if tensor_core(gpu, w) {
        return gemv_tc(gpu, k, (out, 0, n), x.f16(gpu, k)?, w, base, n, tokens);
    }
    if !gpu.exact() && int8_format(w.format) {
        return gemv_q8(gpu, k, (out, 0, n), x.int8(gpu, k)?, w, base, n, tokens);
    }
    gemv_float(gpu, k, (out, 0, n), x.x, w, base, row0, n, tokens)
}

/// `matmul` for many tokens: the activations and each chunk of weight rows converted to bf16,
/// multiplied by cuBLAS with f32 accumulation and output.
#[allow(clippy::too_many_arguments)]
fn gemm(
    gpu: &Gpu,
    k: &Kernels,
    blas: &cudarc::cublas::CudaBlas,
    out: u64,
    x: &Activations,
    w: &DeviceWeight,
    row0: usize,
    n: usize,
) -> Result<(), GpuError> {
    use cudarc::cublas::sys;
    let (kdim, tokens) = (w.cols, x.tokens);
    let exact = gpu.exact();
    // Operands in bf16 (tensor cores), or the f32 activations as they are (exact).
    let (xp, xtype) = if exact {
        (x.x, sys::cudaDataType_t::CUDA_R_32F)
    } else {
        (
            super::ptr(gpu, x.bf16(gpu, k)?, 0),
            sys::cudaDataType_t::CUDA_R_16BF,
        )
    };
    if stored_bf16(gpu, w) {
        let wp = super::ptr(gpu, &w.data, row0 * w.row_bytes);
        return gemm_rows(
            gpu,
            blas,
            out,
            wp,
            w.row_bytes / 2,
            xp,
            xtype,
            n,
            n,
            tokens,
            kdim,
        );
    }
    let chunk = GEMM_ROW_CHUNK.min(n);
    let wb = gpu.uninit::<f32>(chunk * kdim / if exact { 1 } else { 2 })?;
    let dequant = format!(
        "dequant_{}_{}",
        if exact { "f32" } else { "bf16" },
        w.format.kernel_suffix()
    );
    for r0 in (0..n).step_by(chunk) {
        let rows = chunk.min(n - r0);
        let wp = super::ptr(gpu, &wb, 0);
        let src = super::ptr(gpu, &w.data, (row0 + r0) * w.row_bytes);
        if !exact && w.format == super::GpuFormat::F32 && w.row_bytes == 4 * kdim {
            // Contiguous f32 rows: the activations' coalesced conversion, the same bits.
            let values = rows * kdim;
            gpu.launch(
                k,
                "to_bf16",
                blocks(values.div_ceil(4), 256),
                256,
                &[Arg::Ptr(src), Arg::Ptr(wp), Arg::I64(values as i64)],
            )?;
        } else {
            let (scales, biases, group) = group_args(gpu, w, row0 + r0);
            gpu.launch(
                k,
                &dequant,
                blocks(rows * kdim / 32, 128),
                128,
                &[
                    Arg::Ptr(src),
                    Arg::I64(w.row_bytes as i64),
                    Arg::Ptr(scales),
                    Arg::Ptr(biases),
                    Arg::I32(group),
                    Arg::Ptr(wp),
                    Arg::I32(rows as i32),
                    Arg::I32(kdim as i32),
                ],
            )?;
        }
        gemm_rows(
            gpu,
            blas,
            out + (r0 * 4) as u64,
            wp,
            kdim,
            xp,
            xtype,
            rows,
            n,
            tokens,
            kdim,
        )?;
    }
    Ok(())
}

/// `out[t, r] = W[r, :] · x[t, :]` for `rows` bf16 (or f32 with f32 `xtype`) weight rows of
/// stride `ldw` elements, `out` rows `ldo` apart, by cuBLAS with f32 accumulation.
#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    gpu: &Gpu,
    blas: &cudarc::cublas::CudaBlas,
    out: u64,
    w: u64,
    ldw: usize,
    x: u64,
    xtype: cudarc::cublas::sys::cudaDataType_t,
    rows: usize,
    ldo: usize,
    tokens: usize,
    kdim: usize,
) -> Result<(), GpuError> {
    use cudarc::cublas::{result::gemm_ex, sys};
    let (alpha, beta) = (1.0f32, 0.0f32);
    // Column-major view: out^T [rows, tokens] (ld ldo) = W [rows, K]^T-as-stored · X^T.
    let name = || format!("cublas {rows}x{kdim}, {tokens} rows");
    // SAFETY: all pointers are live device buffers of the sizes the dimensions imply.
    gpu.profiled(name, || unsafe {
        gemm_ex(
            *blas.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            rows as i32,
            tokens as i32,
            kdim as i32,
            &alpha as *const f32 as *const _,
            w as *const _,
            xtype,
            ldw as i32,
            x as *const _,
            xtype,
            kdim as i32,
            &beta as *const f32 as *const _,
            out as *mut _,
            sys::cudaDataType_t::CUDA_R_32F,
            ldo as i32,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
        .map_err(|e| GpuError::Blas(e.to_string()))
    })
}

/// A bf16 weight that the fast (not exact) path multiplies as stored.
fn stored_bf16(gpu: &Gpu, w: &DeviceWeight) -> bool {
    w.format == super::GpuFormat::Bf16 && w.groups.is_none() && !gpu.exact()
}

/// Warps per tile forced by [`force_tensor_core_warps`] (0: the shape decides).
static TENSOR_CORE_WARPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Forces the warps per 16-row tile of every tensor-core GEMV (1..=8; 0 restores the choice by
/// shape). For the kernel bench's sweep: results then depend on this process-wide setting.
pub fn force_tensor_core_warps(warps: usize) {
    TENSOR_CORE_WARPS.store(warps.min(8), std::sync::atomic::Ordering::Relaxed);
}

/// Warps a tensor-core GEMV block gives one 16-row tile (`TC_WARPS_MAX` in kernels/gemv_tc.cu), no
/// more than the row has 256-value blocks. Four, measured best from 256 tiles up on the
/// H200 (more warps per tile make fewer, shorter-lived blocks of which a second partial wave
/// runs alone); eight for smaller matrices. It depends only on the shape, never on the token
/// count, so that a token's sums are the same in any batch.
fn tensor_core_warps(n: usize, kdim: usize) -> usize {
    let forced = TENSOR_CORE_WARPS.load(std::sync::atomic::Ordering::Relaxed);
    let warps = match forced {
        0 if n.div_ceil(16) >= 256 => 4,
        0 => 8,
        w => w,
    };
    warps.min(kdim / 256).max(1)
}

/// Two products of one input, `x · W[..split]ᵀ` into `out.0` `[tokens, split]` and
/// `x · W[split..]ᵀ` into `out.1`, from one weight that stacks both (e.g. an MLP's gate and
/// up rows, a GDN layer's b and a rows). The tensor-core and the int8 GEMVs do both in one
/// launch (one conversion of `x`, twice the rows in flight); other paths run the two row ranges
/// apart. For a tiled format (see [`pairs_in_one_launch`]) `split` is a multiple of 16.
#[allow(clippy::too_many_arguments)]
pub fn matmul_pair(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64),
    x: &Activations,
    w: &DeviceWeight,
    split: usize,
) -> Result<(), GpuError> {
    assert!(
        pairs_in_one_launch(w.format, split) && split < w.rows,
        "split {split} of {} rows",
        w.rows
    );
    x.check(w);
    let (base, tokens) = (super::ptr(gpu, &w.data, 0), x.tokens);
    if gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_some() {
        matmul_activations(gpu, k, out.0, x, w, 0, split)?;
        return matmul_activations(gpu, k, out.1, x, w, split, w.rows - split);
    }
    let out = (out.0, out.1, split);
    if tensor_core(gpu, w) {
        return gemv_tc(gpu, k, out, x.f16(gpu, k)?, w, base, w.rows, tokens);
    }
    if !gpu.exact() && int8_format(w.format) {
        return gemv_q8(gpu, k, out, x.int8(gpu, k)?, w, base, w.rows, tokens);
    }
    gemv_float(gpu, k, out, x.x, w, base, 0, w.rows, tokens)
}

/// `out = W · (silu(g) ⊙ u)` `[tokens, W rows]` for `g`, `u` `[tokens, W cols]`: SwiGLU and the
/// MLP's down product. The tensor-core GEMV takes the gated values straight into its f16
/// conversion (one launch fewer, the same bits); other paths write them into `g` first.
pub fn matmul_swiglu(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    g: u64,
    u: u64,
    w: &DeviceWeight,
    tokens: usize,
) -> Result<(), GpuError> {
    if reads_f16(gpu, w, tokens) {
        let converted = convert_f16_tc(gpu, k, "silu_mul_to_f16_tc", &[g, u], tokens, w.cols)?;
        let base = super::ptr(gpu, &w.data, 0);
        return gemv_tc(
            gpu,
            k,
            (out, 0, w.rows),
            &converted,
            w,
            base,
            w.rows,
            tokens,
        );
    }
    if reads_bf16(gpu, w, tokens) {
        let n = tokens * w.cols;
        let xb = gpu.uninit::<u16>(n)?;
        let args = [
            Arg::Ptr(g),
            Arg::Ptr(u),
            Arg::Ptr(super::ptr(gpu, &xb, 0)),
            Arg::I64(n as i64),
        ];
        gpu.launch(
            k,
            "silu_mul_to_bf16",
            blocks(n.div_ceil(4), 256),
            256,
            &args,
        )?;
        let x = Activations::with_bf16(g, tokens, w.cols, xb);
        return matmul_activations(gpu, k, out, &x, w, 0, w.rows);
    }
    silu_mul(gpu, k, g, u, tokens * w.cols)?;
    matmul(gpu, k, out, g, w, 0, w.rows, tokens)
}

/// The tensor-core GEMV of activations converted by [`Activations`] (or by a fused
/// conversion, see [`matmul_swiglu`]), 16 tokens per launch. Rows below `out.2` go to `out.0`
/// `[tokens, out.2]`, the others to `out.1`.
#[allow(clippy::too_many_arguments)]
fn gemv_tc(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    (xh, xscale): &F16Rows,
    w: &DeviceWeight,
    base: u64,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let kdim = w.cols;
    let suffix = w.format.kernel_suffix();
    let warps = tensor_core_warps(n, kdim) as u32;
    let (y, y2, split) = out;
    let plan = stream_k(gpu, n, kdim);
    for (t0, tc) in token_chunks(tokens) {
        let (y_at, y2_at) = (row_at(y, t0, split), row_at(y2, t0, n - split));
        if let Some(plan) = plan {
            let name = format!("gemv_tcs{}_{suffix}", if tc <= 8 { 8 } else { 16 });
            let partials = gpu.uninit::<f32>(plan.partials(n))?;
            let pp = super::ptr(gpu, &partials, 0);
            let common = [
                Arg::Ptr(y_at),
                Arg::Ptr(y2_at),
                Arg::I32(split as i32),
                Arg::I32(n as i32),
                Arg::I32(kdim as i32),
                Arg::I32(tc as i32),
            ];
            let mut a = vec![
                Arg::Ptr(base),
                Arg::I64(w.row_bytes as i64),
                Arg::Ptr(super::ptr(gpu, xh, t0 * kdim)),
                Arg::Ptr(super::ptr(gpu, xscale, t0 * kdim / 256)),
            ];
            a.extend(common.clone());
            a.extend([Arg::Ptr(pp), Arg::I32(plan.max_pieces as i32)]);
            gpu.launch(k, &name, plan.blocks as u32, 32 * STREAM_K_WARPS, &a)?;
            let mut f = vec![Arg::Ptr(pp)];
            f.extend(common);
            f.extend([
                Arg::I32(plan.blocks as i32),
                Arg::I32(plan.max_pieces as i32),
            ]);
            gpu.launch(
                k,
                "gemv_tc_fixup",
                blocks(n.div_ceil(16) * tc * 16, 256),
                256,
                &f,
            )?;
            continue;
        }
        // A block per 16-row tile.
        let name = format!("gemv_tc{}_{suffix}", if tc <= 8 { 8 } else { 16 });
        gpu.launch(
            k,
            &name,
            blocks(n, 16),
            32 * warps,
            &[
                Arg::Ptr(base),
                Arg::I64(w.row_bytes as i64),
                Arg::Ptr(super::ptr(gpu, xh, t0 * kdim)),
                Arg::Ptr(super::ptr(gpu, xscale, t0 * kdim / 256)),
                Arg::Ptr(y_at),
                Arg::Ptr(y2_at),
                Arg::I32(split as i32),
                Arg::I32(n as i32),
                Arg::I32(kdim as i32),
                Arg::I32(tc as i32),
            ],
        )?;
    }
    Ok(())
}

/// A measurement switch: what its environment variable says, read once, unless a test or bench
/// forces another value ([`Switch::force`]).
struct Switch {
    var: &'static str,
    /// The forced value + 1; 0: none.
    forced: std::sync::atomic::AtomicUsize,
    from_env: std::sync::OnceLock<usize>,
}

impl Switch {
    const fn new(var: &'static str) -> Self {
        Self {
            var,
            forced: std::sync::atomic::AtomicUsize::new(0),
            from_env: std::sync::OnceLock::new(),
        }
    }

    /// The forced value, else `parse` of the variable's value ("" when unset).
    fn get(&self, parse: impl FnOnce(&str) -> usize) -> usize {
        match self.forced.load(std::sync::atomic::Ordering::Relaxed) {
            0 => *self
                .from_env
                .get_or_init(|| parse(&std::env::var(self.var).unwrap_or_default())),
            v => v - 1,
        }
    }

    /// Forces `value` (`None`: the variable's again).
    fn force(&self, value: Option<usize>) {
        let v = value.map_or(0, |v| v + 1);
        self.forced.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// An on / off switch: as forced, else "1" on and "0" off, else `default`.
    fn on(&self, default: bool) -> bool {
        self.get(|v| usize::from(v == "1" || (default && v != "0"))) == 1
    }
}

/// Whether tensor-core GEMVs run stream-K (`SPLASH_STREAM_K=1`, or [`force_stream_k`]).
static STREAM_K: Switch = Switch::new("SPLASH_STREAM_K");
/// Blocks per SM of a stream-K launch (128 registers a thread: four fit), and warps per block.
const STREAM_K_BLOCKS_PER_SM: usize = 4;
const STREAM_K_WARPS: u32 = 4;

/// [`STREAM_K_BLOCKS_PER_SM`], or `SPLASH_STREAM_K_BLOCKS` (1..=8, a measurement switch).
fn stream_k_blocks_per_sm() -> usize {
    std::env::var("SPLASH_STREAM_K_BLOCKS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(STREAM_K_BLOCKS_PER_SM, |b| b.clamp(1, 8))
}

/// Turns stream-K tensor-core GEMVs on or off for every shape (`None`: as `SPLASH_STREAM_K=1`
/// says; off by default: on the H200 it was faster only for the one-token 27B Q4_K down product
/// and the 16-token Q6_K one, BENCHMARKS.md 2026-12-02). For the bench's comparison; results
/// then depend on this process-wide setting.
pub fn force_stream_k(on: Option<bool>) {
    STREAM_K.force(on.map(usize::from));
}

/// How a stream-K launch cuts a matrix (`gemv_tcs` in kernels/gemv_tc.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StreamK {
    /// Blocks of the launch: three per SM, at most one per unit.
    blocks: usize,
    /// The most blocks that share one tile.
    max_pieces: usize,
}

impl StreamK {
    /// The schedule for `n` rows of `kdim` values over `sms` SMs: units are (16-row tile,
    /// 256-value block) pairs, each block gets an equal range of them.
    fn new(n: usize, kdim: usize, sms: usize) -> Self {
        let units = n.div_ceil(16) * (kdim / 256);
        let blocks = (sms * stream_k_blocks_per_sm()).clamp(1, units.max(1));
        // Every block holds at least units / blocks units, so a tile of kdim / 256 units
        // meets at most this many blocks.
        let max_pieces = (kdim / 256).div_ceil((units / blocks).max(1)) + 1;
        Self { blocks, max_pieces }
    }

    /// Values of the partial sums buffer: [tile, piece, 16 tokens, 16 rows].
    fn partials(&self, n: usize) -> usize {
        n.div_ceil(16) * self.max_pieces * 256
    }
}

/// The stream-K schedule for a tensor-core GEMV of `n` rows of `kdim` values, when stream-K
/// is on: by [`force_stream_k`], else by `SPLASH_STREAM_K=1`. It depends on the shape and the
/// GPU only, never on the token count, so tokens keep their bits in any batch.
fn stream_k(gpu: &Gpu, n: usize, kdim: usize) -> Option<StreamK> {
    STREAM_K.on(false).then(|| StreamK::new(n, kdim, gpu.sms()))
}

/// `rows` rows of `kdim` activations as the tensor-core GEMV reads them (f16 in its k order,
/// one power-of-two scale per 256 values), by `kernel`: `to_f16_tc` of one input, or a fused
/// one that derives the values from several `inputs` (`[rows, kdim]` f32 each).
fn convert_f16_tc(
    gpu: &Gpu,
    k: &Kernels,
    kernel: &str,
    inputs: &[u64],
    rows: usize,
    kdim: usize,
) -> Result<F16Rows, GpuError> {
    let blocks256 = rows * kdim / 256;
    let xh = gpu.uninit::<u16>(rows * kdim)?;
    let xscale = gpu.uninit::<f32>(blocks256)?;
    let mut args: Vec<Arg> = inputs.iter().map(|&p| Arg::Ptr(p)).collect();
    args.extend([
        Arg::Ptr(super::ptr(gpu, &xh, 0)),
        Arg::Ptr(super::ptr(gpu, &xscale, 0)),
        Arg::I64(blocks256 as i64),
    ]);
    gpu.launch(k, kernel, blocks(blocks256 * 32, 256), 256, &args)?;
    Ok((xh, xscale))
}

/// Whether the experts of a MoE layer stored like `w` have the grouped device kernel
/// ([`matmul_experts`], outside the exact mode): the tensor-core formats.
pub fn has_expert_kernel(w: &DeviceWeight) -> bool {
    super::weights::is_tiled(w.format)
}

/// A MoE layer's routing on the device: each token's experts and weights, and its pairs
/// (token, expert) grouped by expert for [`matmul_experts`].
pub struct ExpertRouting {
    /// Expert of pair `t · top_k + j` (`[tokens, top_k]`), most probable first.
    pub ids: CudaSlice<i32>,
    /// Its weight, renormalised over the token's `top_k`.
    pub weights: CudaSlice<f32>,
    active: CudaSlice<i32>,
    offsets: CudaSlice<i32>,
    order: CudaSlice<i32>,
    slots: usize,
    /// A prefill pass's per-chunk counts (`moe_group_counts`), kept until the products ran.
    chunk_counts: Option<CudaSlice<i32>>,
}

/// Pairs above which the grouping takes its three-launch form over many blocks (`moe_group`,
/// one block, scans every pair once per active expert).
const MOE_GROUP_ONE_BLOCK: usize = 1024;

/// Pairs a block of `moe_group_counts` and `moe_group_scatter` takes (`MOE_GROUP_CHUNK`).
const MOE_GROUP_CHUNK: usize = 256;

/// The most experts a token may keep for device routing (`MOE_TOP_K_MAX` in kernels/moe.cu).
const MOE_TOP_K_MAX: usize = 32;

/// Routes `tokens` rows of router logits `[tokens, experts]` on the device: softmax, the
/// `top_k` most probable experts, their probabilities renormalised (as the CPU's `route`).
pub fn moe_route(
    gpu: &Gpu,
    k: &Kernels,
    logits: u64,
    tokens: usize,
    experts: usize,
    top_k: usize,
) -> Result<ExpertRouting, GpuError> {
    if experts > 1024 || top_k > experts || top_k > MOE_TOP_K_MAX {
        return Err(GpuError::Unsupported(format!(
            "device routing takes up to 1024 experts and top-k ≤ min(experts, {MOE_TOP_K_MAX}) (got {experts}, {top_k})"
        )));
    }
    let pairs = tokens * top_k;
    let slots = experts.min(pairs);
    let chunks = pairs.div_ceil(MOE_GROUP_CHUNK);
    let r = ExpertRouting {
        ids: gpu.uninit::<i32>(pairs)?,
        weights: gpu.uninit::<f32>(pairs)?,
        active: gpu.uninit::<i32>(slots)?,
        offsets: gpu.uninit::<i32>(slots + 1)?,
        order: gpu.uninit::<i32>(pairs)?,
        slots,
        chunk_counts: if pairs > MOE_GROUP_ONE_BLOCK {
            Some(gpu.uninit::<i32>(chunks * experts)?)
        } else {
            None
        },
    };
    let p = |b: &CudaSlice<i32>| super::ptr(gpu, b, 0);
    gpu.launch(
        k,
        "moe_route",
        tokens as u32,
        256,
        &[
            Arg::Ptr(logits),
            Arg::Ptr(p(&r.ids)),
            Arg::Ptr(super::ptr(gpu, &r.weights, 0)),
            Arg::I32(experts as i32),
            Arg::I32(top_k as i32),
        ],
    )?;
    let (ids, e, slots) = (
        Arg::Ptr(p(&r.ids)),
        Arg::I32(experts as i32),
        Arg::I32(slots as i32),
    );
    let (active, offsets, order) = (
        Arg::Ptr(p(&r.active)),
        Arg::Ptr(p(&r.offsets)),
        Arg::Ptr(p(&r.order)),
    );
    let Some(counts) = &r.chunk_counts else {
        let args = [
            ids,
            Arg::I32(pairs as i32),
            e,
            slots,
            active,
            offsets,
            order,
        ];
        gpu.launch(k, "moe_group", 1, 1024, &args)?;
        return Ok(r);
    };
    let (counts, pairs) = (Arg::Ptr(p(counts)), Arg::I32(pairs as i32));
    let chunk = MOE_GROUP_CHUNK as u32;
    let args = [ids.clone(), pairs.clone(), e.clone(), counts.clone()];
    gpu.launch(k, "moe_group_counts", chunks as u32, chunk, &args)?;
    let args = [
        counts.clone(),
        Arg::I32(chunks as i32),
        e.clone(),
        slots,
        active,
        offsets,
    ];
    gpu.launch(k, "moe_group_slots", 1, 1024, &args)?;
    let args = [ids, pairs, e, counts, order];
    gpu.launch(k, "moe_group_scatter", chunks as u32, chunk, &args)?;
    Ok(r)
}

/// `out[p, :] = W_e · x[p / col_div, :]` for every pair `p` of `routing`, `e` its expert:
/// `table` holds the device pointers ([`DeviceWeight::device_ptr`]) of the experts' weights,
/// all of `proto`'s format and shape; `x`'s rows are the tokens for gate and up (`col_div` =
/// top-k), the pairs for down (`col_div` = 1). Each expert's weights are read once
/// per call, and each pair gets the bits its token would get alone ([`matmul`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: &Activations,
    table: u64,
    proto: &DeviceWeight,
    routing: &ExpertRouting,
    col_div: usize,
) -> Result<(), GpuError> {
    launch_experts(gpu, k, [(table, out), (0, 0)], x, proto, routing, col_div)
}

/// [`matmul_experts`] of two tables of the same shape over the same input in one launch (the
/// gate and up products): `(table, out)` each.
#[allow(clippy::too_many_arguments)]
pub fn matmul_expert_pair(
    gpu: &Gpu,
    k: &Kernels,
    products: [(u64, u64); 2],
    x: &Activations,
    proto: &DeviceWeight,
    routing: &ExpertRouting,
    col_div: usize,
) -> Result<(), GpuError> {
    launch_experts(gpu, k, products, x, proto, routing, col_div)
}

/// The down products of a MoE layer's experts: [`matmul_experts`] of `silu(g) * u` (pairs'
/// rows of `proto.cols`), converted for the tensor cores in the same launch as the product of
/// the two (the bits of `silu_mul` then the conversion).
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts_swiglu(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    (g, u): (u64, u64),
    table: u64,
    proto: &DeviceWeight,
    routing: &ExpertRouting,
    pairs: usize,
) -> Result<(), GpuError> {
    let converted = convert_f16_tc(gpu, k, "silu_mul_to_f16_tc", &[g, u], pairs, proto.cols)?;
    let x = Activations::with_f16(g, pairs, proto.cols, converted);
    matmul_experts(gpu, k, out, &x, table, proto, routing, 1)
}

/// One launch of the grouped expert kernel for one or two `(table, out)` products (a second
/// table of 0: none).
fn launch_experts(
    gpu: &Gpu,
    k: &Kernels,
    products: [(u64, u64); 2],
    x: &Activations,
    proto: &DeviceWeight,
    routing: &ExpertRouting,
    col_div: usize,
) -> Result<(), GpuError> {
    if gpu.exact() || !has_expert_kernel(proto) {
        return Err(GpuError::Unsupported(format!(
            "experts of {:?} have no device kernel",
            proto.format
        )));
    }
    x.check(proto);
    let (n, kdim) = (proto.rows, proto.cols);
    let (xh, xscale) = x.f16(gpu, k)?;
    let p = |b: &CudaSlice<i32>| super::ptr(gpu, b, 0);
    let tables = if products[1].0 == 0 { 1 } else { 2 };
    let blocks = tables * routing.slots * n.div_ceil(16);
    let chains = tensor_core_warps(n, kdim);
    // More than 16 pairs a slot on average (prefill passes): the kernels that decode a tile's
    // weights for more pairs at a time may pay.
    let many = x.tokens * col_div > 16 * routing.slots;
    let (kernel, warps) = match prefill_experts() {
        PrefillExperts::Gemm if many => ("gemm_tc_experts_", 4),
        _ => ("gemv_tc_experts_", 0),
    };
    let warps = match (
        EXPERT_WARPS.load(std::sync::atomic::Ordering::Relaxed),
        warps,
    ) {
        (0, 0) => expert_warps(blocks, chains, expert_warps_in_flight(proto.format)),
        (0, w) => w.min(chains),
        (forced, _) => forced.min(chains),
    };
    gpu.launch(
        k,
        &format!("{kernel}{}", proto.format.kernel_suffix()),
        blocks as u32,
        32 * warps as u32,
        &[
            Arg::Ptr(products[0].0),
            Arg::Ptr(products[0].1),
            Arg::Ptr(products[1].0),
            Arg::Ptr(products[1].1),
            Arg::Ptr(p(&routing.active)),
            Arg::Ptr(p(&routing.offsets)),
            Arg::Ptr(p(&routing.order)),
            Arg::I64(proto.row_bytes as i64),
            Arg::Ptr(super::ptr(gpu, xh, 0)),
            Arg::Ptr(super::ptr(gpu, xscale, 0)),
            Arg::I32(n as i32),
            Arg::I32(kdim as i32),
            Arg::I32(col_div as i32),
            Arg::I32(chains as i32),
        ],
    )
}

/// The kernel of the grouped expert products with more than 16 pairs an expert on average (a
/// prefill pass's); both give each pair the same bits. `gemm` by default: on the H200 the
/// 35B-A3B's 8K prefill ran at 13,241 tok/s with it against 11,440 (BENCHMARKS.md, eighth
/// session). `SPLASH_PREFILL_EXPERTS=gemv|gemm` or [`force_prefill_experts`] to compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillExperts {
    /// `gemm_tc_experts_*`: a 256-value block decoded into registers once for up to 64 pairs,
    /// sums in shared memory (the default).
    Gemm,
    /// `gemv_tc_experts_*`: a tile's weights decoded again for every 16 pairs (decode's kernel).
    Gemv,
}

impl PrefillExperts {
    /// All kernels, in declaration order (a kernel's index is `kernel as usize`).
    pub const ALL: [PrefillExperts; 2] = [Self::Gemm, Self::Gemv];

    /// The switch's value for this kernel.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gemm => "gemm",
            Self::Gemv => "gemv",
        }
    }
}

/// The prefill expert kernel, as its index in [`PrefillExperts::ALL`].
static PREFILL_EXPERTS: Switch = Switch::new("SPLASH_PREFILL_EXPERTS");

/// Forces the prefill passes' grouped expert kernel (`None`: the environment's choice again);
/// for the kernel bench's comparison.
pub fn force_prefill_experts(kernel: Option<PrefillExperts>) {
    PREFILL_EXPERTS.force(kernel.map(|k| k as usize));
}

fn prefill_experts() -> PrefillExperts {
    let kernel = |v: &str| PrefillExperts::ALL.iter().position(|k| k.name() == v);
    PrefillExperts::ALL[PREFILL_EXPERTS.get(|v| kernel(v).unwrap_or(0))]
}

/// Warps in flight that a grouped expert product of `format` aims for: about as many as the
/// H200's SMs hold of its kernel (`EXPERT_REGS_*` in kernels/gemv_tc.cu: Q4_K's at 128 registers, 16 an
/// SM; Q6_K's at ~230, 8 an SM). Measured there (`gemv_cuda`, 35B-A3B experts), each fastest at
/// 1, 4 and 16 tokens (1 to 8 warps a tile); twice as many ran 15-40% slower, half as many
/// (Q4_K at 1,024) up to 55% slower.
fn expert_warps_in_flight(format: super::GpuFormat) -> usize {
    match format {
        super::GpuFormat::Ggml(crate::ggml::GgmlType::Q4_K) => 2048,
        _ => 1024,
    }
}

/// Warps per block of a grouped expert product of `blocks` tiles whose K blocks are summed in
/// `chains` chains: as many as keep `in_flight` warps busy, a power of two, at most one a
/// chain. The chains, not the warps, set the bits, so this may follow the number of tokens.
fn expert_warps(blocks: usize, chains: usize, in_flight: usize) -> usize {
    let fill = (in_flight / blocks.max(1)).max(1);
    (1usize << fill.ilog2()).min(chains)
}

/// Warps per block forced by [`force_expert_warps`] (0: the launch's size decides).
static EXPERT_WARPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Forces the warps per block of every grouped expert product (at most its chains; 0 restores
/// the choice by size). Same bits either way; for the kernel bench's sweep.
pub fn force_expert_warps(warps: usize) {
    EXPERT_WARPS.store(warps.min(8), std::sync::atomic::Ordering::Relaxed);
}

/// `out[t, :] = out[t, :] · sigmoid(gate[t]) + Σ_j weights[t, j] · y[t · top_k + j, :]` (`d`
/// values per row; without a `gate`, `out` as it is), the experts added in order `j`: the
/// bits of [`scale_rows_sigmoid`] then the sum.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    y: u64,
    gate: Option<u64>,
    routing: &ExpertRouting,
    tokens: usize,
    top_k: usize,
    d: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "moe_combine",
        (tokens * d.div_ceil(256)) as u32,
        256,
        &[
            Arg::Ptr(y),
            Arg::Ptr(super::ptr(gpu, &routing.weights, 0)),
            Arg::Ptr(out),
            Arg::Ptr(gate.unwrap_or(0)),
            Arg::I32(top_k as i32),
            Arg::I32(d as i32),
        ],
    )
}

/// Formats with an integer (dp4a) GEMV.
fn int8_format(format: super::GpuFormat) -> bool {
    use crate::ggml::GgmlType;
    matches!(
        format,
        super::GpuFormat::Ggml(GgmlType::Q5_K | GgmlType::Q8_0)
    )
}

/// Whether two weights of `format` stacked at row `split` run in one launch of
/// [`matmul_pair`]: the tensor-core GEMV (its tiles must not straddle the split), the int8
/// GEMV and the f32-decoding GEMV of float weights (the MoE router and shared-expert gate) can.
pub fn pairs_in_one_launch(format: super::GpuFormat, split: usize) -> bool {
    use super::GpuFormat::{Bf16, F16, F32};
    (super::weights::is_tiled(format) && split.is_multiple_of(16))
        || int8_format(format)
        || matches!(format, F32 | F16 | Bf16)
}

/// Row `t` of an f32 output `[tokens, width]` at `y`; 0 (no second output) stays 0.
fn row_at(y: u64, t: usize, width: usize) -> u64 {
    if y == 0 {
        0
    } else {
        y + (t * width * 4) as u64
    }
}

/// The launches of a GEMV over `tokens`: `(first token, tokens)` of at most [`GEMV_MAX_T`].
fn token_chunks(tokens: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..tokens)
        .step_by(GEMV_MAX_T)
        .map(move |t0| (t0, GEMV_MAX_T.min(tokens - t0)))
}

/// The integer GEMV of activations quantised by [`Activations`], every chunk of tokens.
#[allow(clippy::too_many_arguments)]
fn gemv_q8(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    (xq, xd, xs): &Int8Rows,
    w: &DeviceWeight,
    base: u64,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let kdim = w.cols;
    let suffix = format!("q8_{}", w.format.kernel_suffix());
    RowGemv::new(n, tokens).launch(gpu, k, &suffix, out, kdim, |t0| {
        vec![
            Arg::Ptr(base),
            Arg::I64(w.row_bytes as i64),
            Arg::Ptr(super::ptr(gpu, xq, t0 * kdim)),
            Arg::Ptr(super::ptr(gpu, xd, t0 * kdim / 32)),
            Arg::Ptr(super::ptr(gpu, xs, t0 * kdim / 32)),
        ]
    })
}

/// How a warp-per-row GEMV (`gemv_*` and `gemv_q8_*` in kernels/gemv.cu, blocks of 4 warps) is
/// launched over `n` rows and `tokens` tokens.
struct RowGemv {
    /// Warps per row: 4 for matrices of few rows (by shape only, never by token count).
    split: usize,
    /// The one-token build, a group of blocks per token: few registers for decode, and a
    /// matrix of few rows (read from L2 by every token) as parallel as its tokens. Otherwise
    /// up to 16 tokens share each weight read (the same sums per token, see [`matmul`]).
    per_token: bool,
    /// Blocks per token (per launch without `per_token`).
    group: u32,
    rows: usize,
    tokens: usize,
}

impl RowGemv {
    fn new(n: usize, tokens: usize) -> Self {
        let split = if n < 1024 { 4 } else { 1 };
        Self {
            split,
            per_token: tokens == 1 || split == 4,
            group: blocks(n, 4 / split),
            rows: n,
            tokens,
        }
    }

    /// Launches the GEMV of the weights of kernel suffix `suffix` over rows of `kdim`: the
    /// arguments `inputs(first token)` gives (weights, activations), then the outputs (rows
    /// below `out.2` into `out.0`, the others into `out.1`) and the shape.
    fn launch(
        &self,
        gpu: &Gpu,
        k: &Kernels,
        suffix: &str,
        (y, y2, rows1): (u64, u64, usize),
        kdim: usize,
        inputs: impl Fn(usize) -> Vec<Arg>,
    ) -> Result<(), GpuError> {
        let name = format!("gemv{}_{suffix}", if self.per_token { "1" } else { "" });
        let chunks: Vec<(usize, usize)> = if self.per_token {
            vec![(0, self.tokens)]
        } else {
            token_chunks(self.tokens).collect()
        };
        for (t0, tc) in chunks {
            let mut args = inputs(t0);
            args.extend([
                Arg::Ptr(row_at(y, t0, rows1)),
                Arg::Ptr(row_at(y2, t0, self.rows - rows1)),
                Arg::I32(self.rows as i32),
                Arg::I32(kdim as i32),
                Arg::I32(tc as i32),
                Arg::I32(self.split as i32),
                Arg::I32(rows1 as i32),
            ]);
            let grid = if self.per_token {
                self.group * tc as u32
            } else {
                self.group
            };
            gpu.launch(k, &name, grid, 128, &args)?;
        }
        Ok(())
    }
}

/// The f32-decoding GEMV (every format; the exact reference) of rows `row0..row0 + n` of `w`
/// (from `base`) over f32 activations `x`. Rows below `out.2` go to `out.0` `[tokens, out.2]`,
/// the others to `out.1`.
#[allow(clippy::too_many_arguments)]
fn gemv_float(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    x: u64,
    w: &DeviceWeight,
    base: u64,
    row0: usize,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let kdim = w.cols;
    let (scales, biases, group) = group_args(gpu, w, row0);
    let suffix = w.format.kernel_suffix();
    RowGemv::new(n, tokens).launch(gpu, k, suffix, out, kdim, |t0| {
        vec![
            Arg::Ptr(base),
            Arg::I64(w.row_bytes as i64),
            Arg::Ptr(scales),
            Arg::Ptr(biases),
            Arg::I32(group),
            Arg::Ptr(x + (t0 * kdim * 4) as u64),
        ]
    })
}

/// Scale and bias pointers of an affine weight from row `row0` (null for other formats).
fn group_args(gpu: &Gpu, w: &DeviceWeight, row0: usize) -> (u64, u64, i32) {
    match &w.groups {
        Some((s, b, g)) => {
            let per_row = w.cols / g;
            (
                super::ptr(gpu, s, row0 * per_row),
                super::ptr(gpu, b, row0 * per_row),
                *g as i32,
            )
        }
        None => (0, 0, 32),
    }
}

/// `out[r] = rms_norm(x[r]) * w` over `rows` rows of `d` (`out` may equal `x`).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    w: u64,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    let args = [
        Arg::Ptr(x),
        Arg::Ptr(w),
        Arg::Ptr(out),
        Arg::I32(d as i32),
        Arg::F32(eps),
    ];
    gpu.launch(k, "rms_norm", rows as u32, norm_threads(d), &args)
}

/// The residual add and the next norm: `x += y`, then `out = rms_norm(x) · w`, per row of
/// `d`, with the bits of [`add_in_place`] then [`rms_norm`] (one launch instead of two).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    y: u64,
    w: u64,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    launch_add_rms_norm(gpu, k, "add_rms_norm", [out, x, y, w], &[], rows, d, eps)
}

/// Launches `kernel`, `add_rms_norm` or a variant that also writes the outputs `extra` (their
/// arguments come after `out`'s).
#[allow(clippy::too_many_arguments)]
fn launch_add_rms_norm(
    gpu: &Gpu,
    k: &Kernels,
    kernel: &str,
    [out, x, y, w]: [u64; 4],
    extra: &[Arg],
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    assert!(
        out != x && out != y,
        "add_rms_norm writes out while it reads x and y"
    );
    let mut args = vec![Arg::Ptr(x), Arg::Ptr(y), Arg::Ptr(w), Arg::Ptr(out)];
    args.extend_from_slice(extra);
    args.extend([Arg::I32(d as i32), Arg::F32(eps)]);
    gpu.launch(k, kernel, rows as u32, norm_threads(d), &args)
}

/// [`add_rms_norm`], its output returned as the activations of the products that read it. When
/// those products run on the tensor-core GEMV (`f16_for`, see [`reads_f16`]) the same launch
/// writes their f16 conversion too (`add_rms_norm_to_f16_tc`: the bits of the two kernels), one
/// launch fewer than converting at the first product.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_activations(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    y: u64,
    w: u64,
    rows: usize,
    d: usize,
    eps: f32,
    f16_for: &DeviceWeight,
) -> Result<Activations, GpuError> {
    if reads_bf16(gpu, f16_for, rows) {
        let xb = gpu.uninit::<u16>(rows * d)?;
        let converted = [Arg::Ptr(super::ptr(gpu, &xb, 0))];
        let kernel = "add_rms_norm_to_bf16";
        launch_add_rms_norm(gpu, k, kernel, [out, x, y, w], &converted, rows, d, eps)?;
        return Ok(Activations::with_bf16(out, rows, d, xb));
    }
    // The kernel converts whole 256-value blocks (a tiled weight's rows are made of them).
    if !reads_f16(gpu, f16_for, rows) || !d.is_multiple_of(256) {
        add_rms_norm(gpu, k, out, x, y, w, rows, d, eps)?;
        return Ok(Activations::new(out, rows, d));
    }
    let xh = gpu.uninit::<u16>(rows * d)?;
    let xscale = gpu.uninit::<f32>(rows * d / 256)?;
    let converted = [
        Arg::Ptr(super::ptr(gpu, &xh, 0)),
        Arg::Ptr(super::ptr(gpu, &xscale, 0)),
    ];
    let kernel = "add_rms_norm_to_f16_tc";
    launch_add_rms_norm(gpu, k, kernel, [out, x, y, w], &converted, rows, d, eps)?;
    Ok(Activations::with_f16(out, rows, d, (xh, xscale)))
}

/// Whether a product of `tokens` rows by `w` reads its input in bf16 (cuBLAS, outside the
/// exact mode).
fn reads_bf16(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    !gpu.exact() && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_some()
}

/// Whether a product of `tokens` rows by `w` reads its input in the tensor-core GEMV's f16
/// (rather than cuBLAS's bf16 or the other GEMVs' int8 or f32).
pub fn reads_f16(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    tensor_core(gpu, w) && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_none()
}

/// Threads of a row norm: a float4 each, up to 1024, so that a hidden-size row takes one or
/// two loads per thread.
fn norm_threads(d: usize) -> u32 {
    (d.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// `out = w * rms_norm(x) * silu(z)` per row of `d`.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    z: u64,
    w: u64,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    launch_rms_norm_gated(gpu, k, "rms_norm_gated", [x, z, w, out], None, rows, d, eps)
}

/// [`rms_norm_gated`] whose `[tokens, rows / tokens · d]` output is the input of products by
/// `next`: when those run on cuBLAS the same launch writes its bf16 conversion too.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated_activations(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    (x, z, w): (u64, u64, u64),
    rows: usize,
    d: usize,
    eps: f32,
    tokens: usize,
    next: &DeviceWeight,
) -> Result<Activations, GpuError> {
    let kdim = rows * d / tokens;
    if !reads_bf16(gpu, next, tokens) {
        rms_norm_gated(gpu, k, out, x, z, w, rows, d, eps)?;
        return Ok(Activations::new(out, tokens, kdim));
    }
    let ob = gpu.uninit::<u16>(rows * d)?;
    let kernel = "rms_norm_gated_to_bf16";
    let ob_ptr = Some(super::ptr(gpu, &ob, 0));
    launch_rms_norm_gated(gpu, k, kernel, [x, z, w, out], ob_ptr, rows, d, eps)?;
    Ok(Activations::with_bf16(out, tokens, kdim, ob))
}

/// Launches `kernel`, `rms_norm_gated` or its variant that also writes the bf16 rows `ob`.
#[allow(clippy::too_many_arguments)]
fn launch_rms_norm_gated(
    gpu: &Gpu,
    k: &Kernels,
    kernel: &str,
    [x, z, w, out]: [u64; 4],
    ob: Option<u64>,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    let mut args = vec![Arg::Ptr(x), Arg::Ptr(z), Arg::Ptr(w), Arg::Ptr(out)];
    args.extend(ob.map(Arg::Ptr));
    args.extend([Arg::I32(rows as i32), Arg::I32(d as i32), Arg::F32(eps)]);
    let blocks = rows.div_ceil(GATED_NORM_ROWS) as u32;
    gpu.launch(k, kernel, blocks, 32 * GATED_NORM_ROWS as u32, &args)
}

/// Rows (a warp each) a block of `rms_norm_gated*`.
const GATED_NORM_ROWS: usize = 8;

fn elementwise(
    gpu: &Gpu,
    k: &Kernels,
    name: &'static str,
    a: u64,
    b: u64,
    n: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        name,
        blocks(n, 256),
        256,
        &[Arg::Ptr(a), Arg::Ptr(b), Arg::I64(n as i64)],
    )
}

/// `x += y` over `n` values.
pub fn add_in_place(gpu: &Gpu, k: &Kernels, x: u64, y: u64, n: usize) -> Result<(), GpuError> {
    elementwise(gpu, k, "add_in_place", x, y, n)
}

/// `g = silu(g) * u` over `n` values.
pub fn silu_mul(gpu: &Gpu, k: &Kernels, g: u64, u: u64, n: usize) -> Result<(), GpuError> {
    elementwise(gpu, k, "silu_mul", g, u, n)
}

/// `x *= sigmoid(gate)` over `n` values.
pub fn sigmoid_gate(gpu: &Gpu, k: &Kernels, x: u64, gate: u64, n: usize) -> Result<(), GpuError> {
    elementwise(gpu, k, "sigmoid_gate", x, gate, n)
}

/// `x[r, :] *= sigmoid(g[r])` for `rows` rows of `d`.
pub fn scale_rows_sigmoid(
    gpu: &Gpu,
    k: &Kernels,
    x: u64,
    g: u64,
    rows: usize,
    d: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "scale_rows_sigmoid",
        rows as u32,
        row_threads(d),
        &[Arg::Ptr(x), Arg::Ptr(g), Arg::I32(d as i32)],
    )
}

/// `out[i, :] = x[idx[i], :]` for `rows` indices (`idx` i32 on the device).
pub fn gather_rows(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    idx: u64,
    rows: usize,
    d: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "gather_rows",
        rows as u32,
        row_threads(d),
        &[
            Arg::Ptr(x),
            Arg::Ptr(idx),
            Arg::Ptr(out),
            Arg::I32(d as i32),
        ],
    )
}

/// `out[idx[i], :] += w[i] * y[i, :]` (distinct indices).
#[allow(clippy::too_many_arguments)]
pub fn scatter_add_rows(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    y: u64,
    idx: u64,
    w: u64,
    rows: usize,
    d: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "scatter_add_rows",
        rows as u32,
        row_threads(d),
        &[
            Arg::Ptr(y),
            Arg::Ptr(idx),
            Arg::Ptr(w),
            Arg::Ptr(out),
            Arg::I32(d as i32),
        ],
    )
}

/// Splits per-head `[q | gate]` rows (`rows` heads of `2d`) into `q` and `gate` (`[rows, d]`).
pub fn split_q_gate(
    gpu: &Gpu,
    k: &Kernels,
    q: u64,
    gate: u64,
    qg: u64,
    rows: usize,
    d: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "split_q_gate",
        rows as u32,
        row_threads(d),
        &[
            Arg::Ptr(qg),
            Arg::Ptr(q),
            Arg::Ptr(gate),
            Arg::I32(d as i32),
        ],
    )
}

/// The position of a pass's first token, as the position-dependent kernels (RoPE, KV append,
/// attention) take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Known when the work is queued.
    Host(usize),
    /// The `i32` at device address `at`, read when the kernels run: a captured graph is
    /// replayed at a new position by rewriting it. Attention splits its keys as for `limit`
    /// positions, a bound on every position it will be replayed at.
    Device { at: u64, limit: usize },
}

impl From<usize> for Position {
    fn from(p: usize) -> Self {
        Position::Host(p)
    }
}

impl Position {
    /// The kernels' `pos0, pos_at` arguments.
    fn args(self) -> [Arg; 2] {
        match self {
            Position::Host(p) => [Arg::I32(p as i32), Arg::Ptr(0)],
            Position::Device { at, .. } => [Arg::I32(0), Arg::Ptr(at)],
        }
    }
}

/// Partial NeoX RoPE on `x` `[tokens, heads, d]` at positions `pos..` (`inv_freq` `[rot/2]`).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    gpu: &Gpu,
    k: &Kernels,
    x: u64,
    inv_freq: u64,
    tokens: usize,
    heads: usize,
    d: usize,
    rot: usize,
    pos: impl Into<Position>,
) -> Result<(), GpuError> {
    let [p0, p_at] = pos.into().args();
    gpu.launch(
        k,
        "rope",
        (tokens * heads) as u32,
        row_threads(rot / 2),
        &[
            Arg::Ptr(x),
            Arg::Ptr(inv_freq),
            Arg::I32(heads as i32),
            Arg::I32(d as i32),
            Arg::I32(rot as i32),
            p0,
            p_at,
        ],
    )
}

fn kv_code(f: KvFormat) -> i32 {
    match f {
        KvFormat::F32 => 0,
        KvFormat::Bf16 => 1,
        KvFormat::Int8 => 2,
    }
}

/// Appends `tokens` positions of `heads` rows of `d` values (`x`) to a KV cache
/// `[positions, heads, d]` at position `pos` (`scales`: int8 only).
#[allow(clippy::too_many_arguments)]
pub fn kv_append(
    gpu: &Gpu,
    k: &Kernels,
    cache: u64,
    scales: u64,
    x: u64,
    format: KvFormat,
    tokens: usize,
    heads: usize,
    d: usize,
    pos: impl Into<Position>,
) -> Result<(), GpuError> {
    let [p0, p_at] = pos.into().args();
    gpu.launch(
        k,
        "kv_append",
        (tokens * heads) as u32,
        128,
        &[
            Arg::Ptr(x),
            Arg::Ptr(cache),
            Arg::Ptr(scales),
            Arg::I32(kv_code(format)),
            Arg::I32(d as i32),
            Arg::I32(heads as i32),
            p0,
            p_at,
        ],
    )
}

/// DFlash2's grouped dynamic causal conv (`cpu::grouped_dynamic_conv`) of `x` `[t, h]` into
/// `out` (not `x`): taps `base` `[kernel, h]` plus the dynamic kernel, row `i` of which starts
/// at `dynamic + i·stride` values and holds `[kernel, h/group]`.
#[allow(clippy::too_many_arguments)]
pub fn grouped_dynamic_conv(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    dynamic: u64,
    stride: usize,
    base: u64,
    t: usize,
    h: usize,
    kernel: usize,
    group: usize,
) -> Result<(), GpuError> {
    assert!(out != x, "grouped_dynamic_conv reads x while it writes out");
    gpu.launch(
        k,
        "grouped_dynamic_conv",
        blocks(t * h, 256),
        256,
        &[
            Arg::Ptr(x),
            Arg::Ptr(dynamic),
            Arg::I64(stride as i64),
            Arg::Ptr(base),
            Arg::Ptr(out),
            Arg::I32(t as i32),
            Arg::I32(h as i32),
            Arg::I32(kernel as i32),
            Arg::I32(group as i32),
        ],
    )
}

/// The most candidates [`top_k_rows`] keeps per row (`TOPK_MAX` in kernels/sampling.cu).
pub const TOP_K_MAX: usize = 32;

/// Values of a row one block of [`top_k_rows`]'s first stage takes (`TOPK_CHUNK`).
const TOP_K_CHUNK: usize = 256 * 8;

/// The `k` best entries of each of `rows` rows of `logits` `[rows, v]` (`k` ≤ [`TOP_K_MAX`],
/// ≤ `v`), after `v·mult` and, with a `cap`, `cap·tanh(v/cap)`: ids and values `[rows, k]`,
/// best first, ties to the lower id (as `cpu::top_k`).
#[allow(clippy::too_many_arguments)]
pub fn top_k_rows(
    gpu: &Gpu,
    k: &Kernels,
    logits: u64,
    rows: usize,
    v: usize,
    top: usize,
    mult: f32,
    cap: Option<f32>,
) -> Result<(CudaSlice<i32>, CudaSlice<f32>), GpuError> {
    assert!(
        (1..=TOP_K_MAX.min(v)).contains(&top),
        "top_k_rows keeps 1..={} of {v}, not {top}",
        TOP_K_MAX
    );
    let ids = gpu.uninit::<i32>(rows * top)?;
    let vals = gpu.uninit::<f32>(rows * top)?;
    // The first stage's blocks, each over TOP_K_CHUNK values of a row; with one a row it
    // writes the result, otherwise its candidates, which the second stage merges.
    let parts = v.div_ceil(TOP_K_CHUNK);
    let staged = if parts > 1 {
        Some((
            gpu.uninit::<i32>(rows * parts * top)?,
            gpu.uninit::<f32>(rows * parts * top)?,
        ))
    } else {
        None
    };
    let (first_ids, first_vals) = staged.as_ref().map_or((&ids, &vals), |(i, v)| (i, v));
    gpu.launch(
        k,
        "top_k_part",
        (rows * parts) as u32,
        256,
        &[
            Arg::Ptr(logits),
            Arg::I32(v as i32),
            Arg::I32(top as i32),
            Arg::F32(mult),
            Arg::F32(cap.unwrap_or(0.0)),
            Arg::I32(parts as i32),
            Arg::Ptr(super::ptr(gpu, first_ids, 0)),
            Arg::Ptr(super::ptr(gpu, first_vals, 0)),
        ],
    )?;
    if let Some((part_ids, part_vals)) = &staged {
        gpu.launch(
            k,
            "top_k_merge",
            rows as u32,
            256,
            &[
                Arg::Ptr(super::ptr(gpu, part_ids, 0)),
                Arg::Ptr(super::ptr(gpu, part_vals, 0)),
                Arg::I32((parts * top) as i32),
                Arg::I32(top as i32),
                Arg::Ptr(super::ptr(gpu, &ids, 0)),
                Arg::Ptr(super::ptr(gpu, &vals, 0)),
            ],
        )?;
    }
    Ok((ids, vals))
}

/// Chunks of [`ATTN_CHUNK`] keys the split attention (`attention_part`) gives each query row of
/// a pass of `tokens` at `pos`: up to the furthest key of any query (a draft block sees the
/// whole block), and with a window at most the chunks the window and the pass's keys span
/// (the kernel starts at the chunk of the first query's first key).
pub fn split_chunks(pos: Position, tokens: usize, mask: KeyMask) -> usize {
    let reach = if mask.block > 0 { mask.block } else { tokens };
    let span = match pos {
        Position::Host(p) => p + reach,
        Position::Device { limit, .. } => limit,
    };
    let chunks = span.div_ceil(ATTN_CHUNK).max(1);
    match mask.window {
        Some(w) => chunks.min((w + reach).div_ceil(ATTN_CHUNK) + 1),
        None => chunks,
    }
}

/// Which cached keys the queries of an [`attention`] call see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyMask {
    /// `0`: causal (query `t` sees positions `..=pos0 + t`). A DFlash draft block of `T`
    /// rows passes `T`: every query sees positions `..pos0 + T`.
    pub block: usize,
    /// Sliding window `W`: only keys with `|q_pos - k_pos| < W` (`None`: all).
    pub window: Option<usize>,
}

/// Attention of `q` `[tokens, hq, HEAD_DIM]` at positions `pos0..` over the caches (row `j`
/// holds position `j`), with the keys `mask` lets each query see.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    q: u64,
    keys: (u64, u64),
    values: (u64, u64),
    format: KvFormat,
    tokens: usize,
    hq: usize,
    hkv: usize,
    pos: impl Into<Position>,
    scale: f32,
    mask: KeyMask,
) -> Result<(), GpuError> {
    let pos = pos.into();
    let [p0, p_at] = pos.args();
    let args = |out_or_part: u64| {
        [
            Arg::Ptr(q),
            Arg::Ptr(keys.0),
            Arg::Ptr(keys.1),
            Arg::Ptr(values.0),
            Arg::Ptr(values.1),
            Arg::Ptr(out_or_part),
            Arg::I32(kv_code(format)),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            p0,
            p_at,
            Arg::F32(scale),
            Arg::I32(mask.block as i32),
            Arg::I32(mask.window.unwrap_or(0) as i32),
        ]
    };
    if tokens <= SPLIT_ATTENTION_ROWS {
        let chunks = split_chunks(pos, tokens, mask);
        let rows = tokens * hq;
        let part = gpu.uninit::<f32>(rows * chunks * (k.dims().head_dim + 2))?;
        let pp = super::ptr(gpu, &part, 0);
        let mut a = args(pp).to_vec();
        a.push(Arg::I32(chunks as i32));
        gpu.launch(k, "attention_part", (rows * chunks) as u32, 128, &a)?;
        return gpu.launch(
            k,
            "attention_combine",
            rows as u32,
            128,
            &[Arg::Ptr(pp), Arg::Ptr(out), Arg::I32(chunks as i32)],
        );
    }
    if flash_prefill(gpu, k, format) {
        let tiles = tokens.div_ceil(FLASH_QUERY_ROWS);
        // The furthest key any query sees.
        let span = match pos {
            Position::Host(p) => p + if mask.block > 0 { mask.block } else { tokens },
            Position::Device { limit, .. } => limit,
        };
        let (chunk, nchunks) = flash_split(tiles * hq, span);
        let rows = tokens * hq;
        let part = if nchunks > 1 {
            Some(gpu.uninit::<f32>(rows * nchunks * (k.dims().head_dim + 2))?)
        } else {
            None
        };
        let pp = part.as_ref().map_or(0, |p| super::ptr(gpu, p, 0));
        let mut a = args(out).to_vec();
        a.extend([
            Arg::I32(tokens as i32),
            Arg::I32(chunk as i32),
            Arg::I32(nchunks as i32),
            Arg::Ptr(pp),
        ]);
        // The int8 rows copied a tile ahead (16-byte copies: the caches' rows must be aligned).
        let aligned = (keys.0 | values.0).is_multiple_of(16);
        let kernel = if format == KvFormat::Int8 && aligned && FLASH_ASYNC.on(true) {
            "attention_prefill_async"
        } else {
            "attention_prefill"
        };
        gpu.launch(k, kernel, (tiles * hq * nchunks) as u32, 128, &a)?;
        if nchunks > 1 {
            gpu.launch(
                k,
                "attention_combine",
                rows as u32,
                128,
                &[Arg::Ptr(pp), Arg::Ptr(out), Arg::I32(nchunks as i32)],
            )?;
        }
        return Ok(());
    }
    gpu.launch(k, "attention", (tokens * hq) as u32, 128, &args(out))
}

/// Whether a long pass over an int8 cache takes `attention_prefill_async` (each tile's rows copied
/// into shared memory while the block computes on the one before; the same bits as
/// `attention_prefill`, which waits on its loads). On by default: the 27B's prefill on the H200
/// 6,496 → 6,890 tok/s at 8K and 4,110 → 5,166 at 32K (BENCHMARKS.md, eighth session);
/// `SPLASH_FLASH_ASYNC=0` or [`force_flash_async`] to compare.
static FLASH_ASYNC: Switch = Switch::new("SPLASH_FLASH_ASYNC");

/// Forces the prefill attention over int8 caches to `attention_prefill_async` or not (`None`:
/// the environment's choice again); for tests and benches that compare the two.
pub fn force_flash_async(on: Option<bool>) {
    FLASH_ASYNC.force(on.map(usize::from));
}

/// Query tokens per block of `attention_prefill` (16 per warp, `FA_WARPS` = 4 warps).
const FLASH_QUERY_ROWS: usize = 64;
/// Keys per shared-memory tile of `attention_prefill` (`FA_KEYS`).
const FLASH_KEYS: usize = 32;
/// Blocks a prefill attention launch should have: two per SM of an H200 (132).
const FLASH_MIN_BLOCKS: usize = 264;

/// How `attention_prefill` splits the keys `0..span` for `blocks` (query tile, head) pairs:
/// (keys per chunk, chunks). One chunk when the pairs fill the GPU; otherwise enough chunks
/// of at least [`FLASH_MIN_CHUNK`] keys to make [`FLASH_MIN_BLOCKS`] blocks. It depends only on the
/// pass's shape, so a pass gives the same result every time.
fn flash_split(blocks: usize, span: usize) -> (usize, usize) {
    let chunks = FLASH_MIN_BLOCKS
        .div_ceil(blocks.max(1))
        .min(span.div_ceil(FLASH_MIN_CHUNK))
        .max(1);
    let chunk = span.div_ceil(chunks).div_ceil(FLASH_KEYS) * FLASH_KEYS;
    (
        chunk.max(FLASH_KEYS),
        span.div_ceil(chunk.max(FLASH_KEYS)).max(1),
    )
}

/// Whether a long pass's attention runs on the tensor cores (`attention_prefill`, f16 products
/// with f32 sums): for the lossy cache formats, whose rows are already rounded, and head dims
/// the mma tiles divide. An f32 cache and the exact mode keep the f32 kernel.
fn flash_prefill(gpu: &Gpu, k: &Kernels, format: KvFormat) -> bool {
    !gpu.exact() && format != KvFormat::F32 && k.dims().head_dim.is_multiple_of(16)
}

/// One sequence of an attention layer's pass for the `*_seqs` attention kernels: its rows
/// `off .. off + n` of the pass, the position of its first one, and its key and value caches
/// (`(rows, int8 scales)`, as [`attention`] takes them).
#[derive(Clone, Copy, Debug)]
pub struct AttnPart {
    pub keys: (u64, u64),
    pub values: (u64, u64),
    pub pos: Position,
    pub off: usize,
    pub n: usize,
}

/// `parts` in launches of at most [`super::ATTN_SLOTS`]: each group, its table and its longest
/// sequence.
fn attn_groups(
    parts: &[AttnPart],
) -> impl Iterator<Item = (&[AttnPart], super::AttnSlots, usize)> + '_ {
    parts.chunks(super::ATTN_SLOTS).map(|group| {
        let mut s = super::AttnSlots::default();
        for (i, p) in group.iter().enumerate() {
            (s.kc[i], s.ks[i]) = p.keys;
            (s.vc[i], s.vs[i]) = p.values;
            (s.pos0[i], s.pos_at[i]) = match p.pos {
                Position::Host(at) => (at as i32, 0),
                Position::Device { at, .. } => (0, at),
            };
            s.off[i] = p.off as i32;
            s.n[i] = p.n as i32;
        }
        let longest = group.iter().map(|p| p.n).max().unwrap_or(0);
        (group, s, longest)
    })
}

/// [`rope`] of every sequence's query rows `q` `[rows, hq, d]` and key rows `keys`
/// `[rows, hkv, d]` at its own positions, in one launch per [`super::ATTN_SLOTS`] sequences.
#[allow(clippy::too_many_arguments)]
pub fn rope_seqs(
    gpu: &Gpu,
    k: &Kernels,
    q: u64,
    keys: u64,
    inv_freq: u64,
    parts: &[AttnPart],
    (hq, hkv, d): (usize, usize, usize),
    rot: usize,
) -> Result<(), GpuError> {
    for (group, slots, longest) in attn_groups(parts) {
        let per = longest * (hq + hkv);
        gpu.launch(
            k,
            "rope_seqs",
            (per * group.len()) as u32,
            row_threads(rot / 2),
            &[
                Arg::Ptr(q),
                Arg::Ptr(keys),
                Arg::Ptr(inv_freq),
                Arg::I32(hq as i32),
                Arg::I32(hkv as i32),
                Arg::I32(d as i32),
                Arg::I32(rot as i32),
                Arg::Attn(Box::new(slots)),
                Arg::I32(per as i32),
            ],
        )?;
    }
    Ok(())
}

/// [`kv_append`] of every sequence's key and value rows (`keys`, `values` `[rows, hkv, d]`) to
/// its own caches at its positions, in one launch per [`super::ATTN_SLOTS`] sequences.
#[allow(clippy::too_many_arguments)]
pub fn kv_append_seqs(
    gpu: &Gpu,
    k: &Kernels,
    keys: u64,
    values: u64,
    format: KvFormat,
    parts: &[AttnPart],
    hkv: usize,
    d: usize,
) -> Result<(), GpuError> {
    for (group, slots, longest) in attn_groups(parts) {
        let per = 2 * longest * hkv;
        gpu.launch(
            k,
            "kv_append_seqs",
            (per * group.len()) as u32,
            128,
            &[
                Arg::Ptr(keys),
                Arg::Ptr(values),
                Arg::I32(kv_code(format)),
                Arg::I32(d as i32),
                Arg::I32(hkv as i32),
                Arg::Attn(Box::new(slots)),
                Arg::I32(per as i32),
            ],
        )?;
    }
    Ok(())
}

/// Causal [`attention`] of every sequence's query rows (`q`, `out` `[rows, hq, HEAD_DIM]`) over
/// its own caches: for passes of up to 32 tokens a sequence, one split-attention launch and one
/// merge per [`super::ATTN_SLOTS`] sequences, each row with the bits of its sequence's own
/// launch (the chunks past a sequence's keys are empty, which the merge skips); longer passes
/// (prefill) a launch each.
#[allow(clippy::too_many_arguments)]
pub fn attention_seqs(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    q: u64,
    format: KvFormat,
    parts: &[AttnPart],
    (hq, hkv): (usize, usize),
    scale: f32,
) -> Result<(), GpuError> {
    let d = k.dims().head_dim;
    if parts.iter().any(|p| p.n > SPLIT_ATTENTION_ROWS) {
        for p in parts {
            let row = (p.off * hq * d * 4) as u64;
            attention(
                gpu,
                k,
                out + row,
                q + row,
                p.keys,
                p.values,
                format,
                p.n,
                hq,
                hkv,
                p.pos,
                scale,
                KeyMask::default(),
            )?;
        }
        return Ok(());
    }
    for (group, slots, longest) in attn_groups(parts) {
        // As many chunks as the furthest key of any sequence needs (see `attention`).
        let chunks = group
            .iter()
            .map(|p| match p.pos {
                Position::Host(at) => at + p.n,
                Position::Device { limit, .. } => limit,
            })
            .max()
            .unwrap_or(0)
            .div_ceil(ATTN_CHUNK)
            .max(1);
        let rows = longest * hq;
        let part = gpu.uninit::<f32>(group.len() * rows * chunks * (d + 2))?;
        let pp = super::ptr(gpu, &part, 0);
        let slots = Box::new(slots);
        gpu.launch(
            k,
            "attention_part_seqs",
            (group.len() * rows * chunks) as u32,
            128,
            &[
                Arg::Ptr(q),
                Arg::Ptr(pp),
                Arg::I32(kv_code(format)),
                Arg::I32(hq as i32),
                Arg::I32(hkv as i32),
                Arg::F32(scale),
                Arg::Attn(slots.clone()),
                Arg::I32(rows as i32),
                Arg::I32(chunks as i32),
            ],
        )?;
        gpu.launch(
            k,
            "attention_combine_seqs",
            (group.len() * rows) as u32,
            128,
            &[
                Arg::Ptr(pp),
                Arg::Ptr(out),
                Arg::I32(hq as i32),
                Arg::Attn(slots),
                Arg::I32(rows as i32),
                Arg::I32(chunks as i32),
            ],
        )?;
    }
    Ok(())
}

/// Depthwise causal conv + SiLU: `y`, `x` `[tokens, c]`, `state` `[kernel-1, c]`, `w` `[c, kernel]`.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_silu(
    gpu: &Gpu,
    k: &Kernels,
    y: u64,
    x: u64,
    state: u64,
    w: u64,
    tokens: usize,
    c: usize,
    kernel: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "conv1d_silu",
        conv_blocks(c, tokens, kernel)?,
        128,
        &[
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::Ptr(state),
            Arg::Ptr(w),
            Arg::I32(tokens as i32),
            Arg::I32(c as i32),
            Arg::I32(kernel as i32),
        ],
    )
}

/// Blocks of 128 threads the GDN conv takes for one sequence of `tokens` rows of `c` channels
/// (a thread per channel and [`conv_steps`] tokens); its history is at most 8 rows.
fn conv_blocks(c: usize, tokens: usize, kernel: usize) -> Result<u32, GpuError> {
    if kernel > 9 {
        return Err(GpuError::Unsupported(format!("conv kernel {kernel} > 9")));
    }
    Ok(blocks(c, 128) * blocks(tokens.max(1), conv_steps(kernel)))
}

/// Columns of a value head's state that one block of the GDN scan takes (`GDN_COLS` in
/// kernels/gdn.cu: 128 threads over [`super::compile::gdn_slices`] lanes a column).
pub(crate) fn scan_columns(dk: usize) -> usize {
    128 / super::compile::gdn_slices(dk)
}

/// Blocks the GDN scan takes for one sequence.
fn scan_blocks(k: &Kernels, hv: usize) -> u32 {
    let dims = k.dims();
    (hv * dims.gdn_dv.div_ceil(scan_columns(dims.gdn_dk))) as u32
}

/// One sequence of a pass for the `*_seqs` kernels: its rows `off .. off + n` of the pass, its
/// state at `state`, and for a recorded pass where the kernel saves what it reads (`save`, see
/// [`conv1d_silu_seqs`] and [`gdn_recurrent_seqs`]; zeros: not recorded).
#[derive(Clone, Copy, Debug)]
pub struct SeqPart {
    pub state: u64,
    pub save: [u64; 3],
    pub off: usize,
    pub n: usize,
}

/// `parts` in launches of at most [`super::SEQ_SLOTS`]: each group's table and its longest
/// sequence.
fn seq_groups(parts: &[SeqPart]) -> impl Iterator<Item = (usize, super::SeqSlots, usize)> + '_ {
    parts.chunks(super::SEQ_SLOTS).map(|group| {
        let mut slots = super::SeqSlots::default();
        for (i, p) in group.iter().enumerate() {
            slots.state[i] = p.state;
            for (k, &at) in p.save.iter().enumerate() {
                slots.save[k][i] = at;
            }
            slots.off[i] = p.off as i32;
            slots.n[i] = p.n as i32;
        }
        let longest = group.iter().map(|p| p.n).max().unwrap_or(0);
        (group.len(), slots, longest)
    })
}

/// [`conv1d_silu`] of every sequence of a pass (`x`, `y` `[rows, c]`), each on its own conv
/// state, in one launch per [`super::SEQ_SLOTS`] sequences: the same bits as a launch each. A
/// recorded sequence saves its conv state before the pass to `save[0]` and its input rows to
/// `save[1]`.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_silu_seqs(
    gpu: &Gpu,
    k: &Kernels,
    y: u64,
    x: u64,
    parts: &[SeqPart],
    w: u64,
    c: usize,
    kernel: usize,
) -> Result<(), GpuError> {
    for (count, slots, longest) in seq_groups(parts) {
        let per = conv_blocks(c, longest, kernel)?;
        gpu.launch(
            k,
            "conv1d_silu_seqs",
            per * count as u32,
            128,
            &[
                Arg::Ptr(x),
                Arg::Ptr(y),
                Arg::Seqs(Box::new(slots)),
                Arg::Ptr(w),
                Arg::I32(per as i32),
                Arg::I32(c as i32),
                Arg::I32(kernel as i32),
            ],
        )?;
    }
    Ok(())
}

/// [`gdn_recurrent`] of every sequence of a pass, each on its own recurrent state, in one launch
/// per [`super::SEQ_SLOTS`] sequences: the same bits as a launch each. A recorded sequence saves
/// its recurrent state before the pass to `save[0]` and its gates `g`, `beta` to `save[1]`,
/// `save[2]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent_seqs(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    mixed: u64,
    g: u64,
    beta: u64,
    parts: &[SeqPart],
    hk: usize,
    hv: usize,
    tiled: bool,
) -> Result<(), GpuError> {
    let per = scan_blocks(k, hv);
    for (count, slots, _) in seq_groups(parts) {
        gpu.launch(
            k,
            "gdn_recurrent_seqs",
            per * count as u32,
            128,
            &[
                Arg::Ptr(mixed),
                Arg::Ptr(g),
                Arg::Ptr(beta),
                Arg::Seqs(Box::new(slots)),
                Arg::Ptr(out),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(tiled as i32),
            ],
        )?;
    }
    Ok(())
}

/// Whether prefill chunks of more than 16 tokens scan in the chunked form (`SPLASH_GDN_CHUNKED=1`,
/// a measurement switch).
static GDN_CHUNKED: Switch = Switch::new("SPLASH_GDN_CHUNKED");

/// Whether a prefill's GDN scan runs chunked ([`gdn_chunked`]): off unless
/// `SPLASH_GDN_CHUNKED=1`. On the H200 the chunked kernels took 1.4 ms a 2,048-token 27B layer
/// (scan 984 µs, prep 412 µs) where the per-token scan takes about 0.9 ms: 8K prefill 6,661
/// against 6,865 tok/s (27B), 13,059 against 14,040 (35B-A3B; BENCHMARKS.md, 2026-12-03).
pub fn gdn_chunked_prefill() -> bool {
    GDN_CHUNKED.on(false)
}

/// Tokens of a chunk of the chunked GDN prefill (`GDN_CHUNK` in kernels/gdn_chunked.cu).
pub const GDN_CHUNK: usize = 64;

/// Floats of the chunked GDN prefill's scratch for a pass of `tokens` tokens over `hv` value
/// heads of `dk` × `dv` states (`GDN_CHUNK_SCRATCH` in kernels/gdn_chunked.cu, per chunk and head).
pub fn gdn_chunk_scratch_len(tokens: usize, hv: usize, dk: usize, dv: usize) -> usize {
    tokens.div_ceil(GDN_CHUNK) * hv * (GDN_CHUNK * (dv + dk + GDN_CHUNK + 2) + 4)
}

/// Blocks of `gdn_chunk_scan` over `hv` heads of `dv` state columns: a block per
/// `GDN_CHUNK_COLS` (≤ 32) columns of a head.
pub(crate) fn chunk_scan_blocks(hv: usize, dv: usize) -> u32 {
    (hv * dv / dv.min(32)) as u32
}

/// The gated delta rule over a prefill of `tokens` tokens in chunks of [`GDN_CHUNK`] (the
/// chunked form, on tensor cores): what [`gdn_recurrent`] computes, to rounding. `scratch`
/// holds [`gdn_chunk_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunked(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    mixed: u64,
    g: u64,
    beta: u64,
    state: u64,
    scratch: u64,
    tokens: usize,
    hk: usize,
    hv: usize,
    tiled: bool,
) -> Result<(), GpuError> {
    let dims = k.dims();
    let (dk, dv) = (dims.gdn_dk, dims.gdn_dv);
    // GDN_CHUNKED_FITS in kernels/gdn_chunked.cu.
    let fits = dk.is_multiple_of(16)
        && dv.is_multiple_of(8)
        && dv.is_multiple_of(dv.min(32))
        && dk + dv <= 256;
    if !fits {
        return Err(GpuError::Unsupported(format!(
            "the chunked GDN scan of {dk}×{dv} states (it needs dk a multiple of 16, dv of 8 \
             up to 32 and of 32 above, dk + dv ≤ 256); unset SPLASH_GDN_CHUNKED"
        )));
    }
    gpu.launch(
        k,
        "gdn_chunk_prep",
        (tokens.div_ceil(GDN_CHUNK) * hv) as u32,
        256,
        &[
            Arg::Ptr(mixed),
            Arg::Ptr(g),
            Arg::Ptr(beta),
            Arg::Ptr(scratch),
            Arg::I32(tokens as i32),
            Arg::I32(hk as i32),
            Arg::I32(hv as i32),
            Arg::I32(tiled as i32),
        ],
    )?;
    gpu.launch(
        k,
        "gdn_chunk_scan",
        chunk_scan_blocks(hv, dv),
        256,
        &[
            Arg::Ptr(mixed),
            Arg::Ptr(scratch),
            Arg::Ptr(state),
            Arg::Ptr(out),
            Arg::I32(tokens as i32),
            Arg::I32(hk as i32),
            Arg::I32(hv as i32),
            Arg::I32(tiled as i32),
        ],
    )
}

/// One GDN layer of a rollback ([`gdn_replay`]): its conv and recurrent states as saved before
/// the recorded pass and live, its recorded input rows and gates, its conv weights.
#[derive(Clone, Copy, Debug)]
pub struct ReplayLayer {
    pub conv_saved: u64,
    pub conv: u64,
    pub rec_saved: u64,
    pub rec: u64,
    /// The pass's `in_proj_qkv` rows `[T, c]`.
    pub qkv: u64,
    /// The pass's gates `[T, hv]`.
    pub g: u64,
    pub beta: u64,
    /// The layer's conv weights `[c, kernel]`.
    pub conv_w: u64,
}

/// Rolls the GDN layers of one sequence back to the first `keep` rows of a recorded pass: each
/// layer's live conv and recurrent states become the saved ones advanced over the recorded
/// rows `..keep` (the bits of a pass over those rows alone; `keep` = 0 restores the saved
/// states). Two launches per [`super::LAYER_SLOTS`] layers, whatever the model's depth; `mixed`
/// is scratch for `layers.len() · keep · c` floats.
#[allow(clippy::too_many_arguments)]
pub fn gdn_replay(
    gpu: &Gpu,
    k: &Kernels,
    layers: &[ReplayLayer],
    mixed: u64,
    keep: usize,
    c: usize,
    kernel: usize,
    (hk, hv, tiled): (usize, usize, bool),
) -> Result<(), GpuError> {
    let per_conv = conv_blocks(c, keep, kernel)?;
    let per_scan = scan_blocks(k, hv);
    for (group, at) in layers
        .chunks(super::LAYER_SLOTS)
        .zip((0..).step_by(super::LAYER_SLOTS))
    {
        let (mut conv, mut scan) = (super::LayerSlots::default(), super::LayerSlots::default());
        for (i, l) in group.iter().enumerate() {
            let out = mixed + ((at + i) * keep * c * 4) as u64;
            (conv.saved[i], conv.live[i]) = (l.conv_saved, l.conv);
            (conv.buf[0][i], conv.buf[1][i], conv.buf[2][i]) = (l.qkv, l.conv_w, out);
            (scan.saved[i], scan.live[i]) = (l.rec_saved, l.rec);
            (scan.buf[0][i], scan.buf[1][i], scan.buf[2][i]) = (out, l.g, l.beta);
        }
        let n = group.len() as u32;
        gpu.launch(
            k,
            "conv1d_silu_replay",
            per_conv * n,
            128,
            &[
                Arg::Layers(Box::new(conv)),
                Arg::I32(per_conv as i32),
                Arg::I32(keep as i32),
                Arg::I32(c as i32),
                Arg::I32(kernel as i32),
            ],
        )?;
        gpu.launch(
            k,
            "gdn_recurrent_replay",
            per_scan * n,
            128,
            &[
                Arg::Layers(Box::new(scan)),
                Arg::I32(keep as i32),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(tiled as i32),
            ],
        )?;
    }
    Ok(())
}

/// In place: `b = sigmoid(b)`, `a = neg_a[h] * softplus(a + dt_bias[h])` over `[n/hv, hv]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_gates(
    gpu: &Gpu,
    k: &Kernels,
    b: u64,
    a: u64,
    dt_bias: u64,
    neg_a: u64,
    hv: usize,
    n: usize,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "gdn_gates",
        blocks(n, 256),
        256,
        &[
            Arg::Ptr(b),
            Arg::Ptr(a),
            Arg::Ptr(dt_bias),
            Arg::Ptr(neg_a),
            Arg::I32(hv as i32),
            Arg::I64(n as i64),
        ],
    )
}

/// The gated delta rule over `tokens` tokens of `mixed` `[tokens, 2·hk·dk + hv·dv]` (q, k, v
/// after the conv; normalised inside), advancing `state` `[hv, dk, dv]`; `out` `[tokens, hv, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    mixed: u64,
    g: u64,
    beta: u64,
    state: u64,
    tokens: usize,
    hk: usize,
    hv: usize,
    tiled: bool,
) -> Result<(), GpuError> {
    gpu.launch(
        k,
        "gdn_recurrent",
        scan_blocks(k, hv),
        128,
        &[
            Arg::Ptr(mixed),
            Arg::Ptr(g),
            Arg::Ptr(beta),
            Arg::Ptr(state),
            Arg::Ptr(out),
            Arg::I32(tokens as i32),
            Arg::I32(hk as i32),
            Arg::I32(hv as i32),
            Arg::I32(tiled as i32),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks cover every key, in whole tiles; a pass with enough query tiles is not
    /// split, and a short one over a long context gets about two blocks per SM.
    #[test]
    fn flash_split_covers_the_keys_and_fills_the_gpu() {
        for (blocks, span) in [
            (24, 32_768),
            (16, 100_000),
            (768, 32_768),
            (24, 700),
            (1, 1),
            (4, 5_000),
        ] {
            let (chunk, n) = flash_split(blocks, span);
            assert!(
                chunk % FLASH_KEYS == 0 && chunk * n >= span,
                "{blocks} {span}"
            );
            assert!(chunk * (n - 1) < span, "{blocks} {span}: an empty chunk");
            if blocks >= FLASH_MIN_BLOCKS {
                assert_eq!(n, 1);
            }
        }
        let (_, n) = flash_split(24, 32_768);
        assert!(24 * n >= FLASH_MIN_BLOCKS, "{n} chunks");
    }

    /// A stream-K schedule never has more blocks than units (an empty block would leave a
    /// piece unwritten), and no tile meets more blocks than the partials hold: checked unit
    /// by unit with the kernel's own rule for which block holds a unit.
    #[test]
    fn stream_k_pieces_fit_their_buffer() {
        for (n, kdim, sms) in [
            (5120, 17408, 132),
            (17408, 5120, 132),
            (48, 5120, 132),
            (16, 256, 132),
            (248_320, 5120, 132),
            (6144, 5120, 7),
        ] {
            let plan = StreamK::new(n, kdim, sms);
            let (tiles, nb) = (n.div_ceil(16), kdim / 256);
            let units = tiles * nb;
            assert!(plan.blocks <= units);
            let block_of = |u: usize| ((u + 1) * plan.blocks - 1) / units;
            for tile in 0..tiles {
                let pieces = block_of(tile * nb + nb - 1) - block_of(tile * nb) + 1;
                assert!(
                    pieces <= plan.max_pieces,
                    "{n}×{kdim}: tile {tile} in {pieces} pieces"
                );
            }
            assert_eq!(block_of(0), 0);
            assert_eq!(block_of(units - 1), plan.blocks - 1);
        }
    }
}
