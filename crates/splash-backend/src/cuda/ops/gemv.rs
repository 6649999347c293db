//! Matrix products: the routing of a product to its kernel (cuBLAS GEMM over bf16 rows, the f16
//! and int8 tensor-core GEMVs, the dp4a GEMV, the warp-per-row GEMV), the warp-per-row and dp4a
//! launches (kernels/gemv.cu) and those of the int8 GEMVs of the tiles (kernels/gemv_tc.cu).

use super::*;

/// Tokens per GEMV launch (`GEMV_MAX_T` in kernels/common.cuh).
pub(super) const GEMV_MAX_T: usize = 16;

/// From this many tokens on, a product runs as a cuBLAS bf16 GEMM over the weight decoded to
/// bf16 (one decode pass) instead of GEMV launches (one weight pass per 16 tokens). Above
/// every speculative block size, so verify passes stay batch-invariant.
pub(super) const GEMM_MIN_T: usize = 48;

/// Weight rows decoded to bf16 at a time for the GEMM (bounds the scratch buffer).
pub(super) const GEMM_ROW_CHUNK: usize = 8192;

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
pub(super) fn gemm_blas(
    gpu: &Gpu,
    w: &DeviceWeight,
    tokens: usize,
    gemm_min_t: usize,
) -> Option<std::sync::Arc<cudarc::cublas::CudaBlas>> {
    let wanted = tokens >= gemm_min_t && w.cols.is_multiple_of(32) && !gpu.batch_invariant();
    wanted.then(|| gpu.blas()).flatten()
}

/// Whether GEMVs by `w` run on the f16 tensor-core kernel: the tiled formats (it reads the
/// tiles), outside the exact mode, unless [`GpuOptions::tiled_gemv`] gives them to another.
pub(super) fn tensor_core(gpu: &Gpu, w: &DeviceWeight) -> bool {
    !gpu.exact()
        && match gpu.options().tiled_gemv {
            TiledGemv::TensorCores => weights::is_tiled(w.format),
            TiledGemv::Int8 | TiledGemv::Int8Mma => false,
            TiledGemv::Int8MmaQ4K => w.format == Q6_K,
        }
}

/// Whether GEMVs by `w` run on an int8 (dp4a) kernel: Q5_K and Q8_0, and the tiled formats
/// under [`TiledGemv::Int8`], outside the exact mode.
pub(super) fn int8_gemv(gpu: &Gpu, w: &DeviceWeight) -> bool {
    !gpu.exact()
        && (int8_format(w.format)
            || (weights::is_tiled(w.format) && gpu.options().tiled_gemv == TiledGemv::Int8))
}

/// Whether GEMVs by `w` run on the int8 tensor-core kernel: Q4_K and Q6_K under
/// [`TiledGemv::Int8Mma`], Q4_K under [`TiledGemv::Int8MmaQ4K`], outside the exact mode.
pub(super) fn int8_mma(gpu: &Gpu, w: &DeviceWeight) -> bool {
    !gpu.exact()
        && match gpu.options().tiled_gemv {
            TiledGemv::Int8Mma => weights::is_tiled(w.format),
            TiledGemv::Int8MmaQ4K => w.format == Q4_K,
            TiledGemv::TensorCores | TiledGemv::Int8 => false,
        }
}

const Q4_K: GpuFormat = GpuFormat::Ggml(crate::ggml::GgmlType::Q4_K);
const Q6_K: GpuFormat = GpuFormat::Ggml(crate::ggml::GgmlType::Q6_K);

/// The product, by cuBLAS from `gemm_min_t` tokens on.
#[allow(clippy::too_many_arguments)]
pub(super) fn product(
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
        row0.is_multiple_of(16) || !weights::is_tiled(w.format),
        "rows of a tiled weight start at a multiple of 16 (row {row0})"
    );
    if let Some(blas) = gemm_blas(gpu, w, tokens, gemm_min_t) {
        return gemm(gpu, k, &blas, out, x, w, row0, n);
    }
    let base = ptr(gpu, &w.data, row0 * w.row_bytes);
    if tensor_core(gpu, w) {
        return gemv_tc(gpu, k, (out, 0, n), x.f16(gpu, k)?, w, base, n, tokens);
    }
    if int8_gemv(gpu, w) {
        return gemv_q8(gpu, k, (out, 0, n), x.int8(gpu, k)?, w, base, n, tokens);
    }
    if int8_mma(gpu, w) {
        return gemv_i8tc(
            gpu,
            k,
            (out, 0, n),
            x.int8_blocks(gpu, k)?,
            w,
            base,
            n,
            tokens,
        );
    }
    gemv_float(gpu, k, (out, 0, n), x.x, w, base, row0, n, tokens)
}

/// `matmul` for many tokens: the activations and each chunk of weight rows converted to bf16,
/// multiplied by cuBLAS with f32 accumulation and output.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
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
            ptr(gpu, x.bf16(gpu, k)?, 0),
            sys::cudaDataType_t::CUDA_R_16BF,
        )
    };
    if stored_bf16(gpu, w) {
        let wp = ptr(gpu, &w.data, row0 * w.row_bytes);
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
        let wp = ptr(gpu, &wb, 0);
        let src = ptr(gpu, &w.data, (row0 + r0) * w.row_bytes);
        if !exact && w.format == GpuFormat::F32 && w.row_bytes == 4 * kdim {
            // Contiguous f32 rows: the activations' coalesced conversion, the same bits.
            let values = rows * kdim;
            launch::to_bf16(
                gpu,
                k,
                (blocks(values.div_ceil(4), 256), 256),
                src,
                wp,
                values as i64,
            )?;
        } else {
            let (scales, biases, group) = group_args(gpu, w, row0 + r0);
            let grid = (blocks(rows * kdim / 32, 128), 128);
            let (row_bytes, rows, kdim) = (w.row_bytes as i64, rows as i32, kdim as i32);
            launch::dequant(
                gpu, k, &dequant, grid, src, row_bytes, scales, biases, group, wp, rows, kdim,
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
pub(super) fn gemm_rows(
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
pub(super) fn stored_bf16(gpu: &Gpu, w: &DeviceWeight) -> bool {
    w.format == GpuFormat::Bf16 && w.groups.is_none() && !gpu.exact()
}

/// Warps a tensor-core GEMV block gives one 16-row tile (`TC_WARPS_MAX` in kernels/gemv_tc.cu), no
/// more than the row has 256-value blocks. Four, measured best from 256 tiles up on the
/// H200 (more warps per tile make fewer, shorter-lived blocks of which a second partial wave
/// runs alone); eight for smaller matrices. It depends only on the shape, never on the token
/// count, so that a token's sums are the same in any batch. The kernel bench's sweep may force
/// it ([`GpuOptions::tensor_core_warps`]).
pub(super) fn tensor_core_warps(options: &GpuOptions, n: usize, kdim: usize) -> usize {
    let warps = match options.tensor_core_warps {
        None if n.div_ceil(16) >= 256 => 4,
        None => 8,
        Some(w) => w,
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
    let (base, tokens) = (ptr(gpu, &w.data, 0), x.tokens);
    if gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_some() {
        matmul_activations(gpu, k, out.0, x, w, 0, split)?;
        return matmul_activations(gpu, k, out.1, x, w, split, w.rows - split);
    }
    let out = (out.0, out.1, split);
    if tensor_core(gpu, w) {
        return gemv_tc(gpu, k, out, x.f16(gpu, k)?, w, base, w.rows, tokens);
    }
    if int8_gemv(gpu, w) {
        return gemv_q8(gpu, k, out, x.int8(gpu, k)?, w, base, w.rows, tokens);
    }
    if int8_mma(gpu, w) {
        return gemv_i8tc(gpu, k, out, x.int8_blocks(gpu, k)?, w, base, w.rows, tokens);
    }
    gemv_float(gpu, k, out, x.x, w, base, 0, w.rows, tokens)
}

/// Whether [`matmul_swiglu`] by `w` over `tokens` rows converts `silu(g) ⊙ u` straight into the
/// product's input (the tensor-core GEMVs) rather than writing it into `g` first.
pub fn swiglu_fused(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    reads_f16(gpu, w, tokens) || reads_int8_blocks(gpu, w, tokens)
}

/// `out = W · (silu(g) ⊙ u)` `[tokens, W rows]` for `g`, `u` `[tokens, W cols]`: SwiGLU and the
/// MLP's down product. The tensor-core GEMVs take the gated values straight into their input
/// (f16 or int8 blocks), the dp4a ones (with `GpuOptions::fold_launches`) into their int8 (one
/// launch fewer, the same bits); other paths write them into `g` first.
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
        let converted = convert_f16_tc(gpu, k, TcInput::SiluMul(g, u), tokens, w.cols)?;
        let base = ptr(gpu, &w.data, 0);
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
    if gpu.options().fold_launches && reads_int8(gpu, w, tokens) {
        let n = tokens * w.cols;
        let rows = int8_rows(gpu, n)?;
        let (qp, dp, sp) = int8_at(gpu, &rows, 0);
        let grid = (blocks(n, 256), 256);
        launch::silu_mul_to_q8(gpu, k, grid, g, u, qp, dp, sp, (n / 32) as i64)?;
        let base = ptr(gpu, &w.data, 0);
        return gemv_q8(gpu, k, (out, 0, w.rows), &rows, w, base, w.rows, tokens);
    }
    if reads_int8_blocks(gpu, w, tokens) {
        let rows = convert_int8_blocks(gpu, k, TcInput::SiluMul(g, u), tokens, w.cols)?;
        let base = ptr(gpu, &w.data, 0);
        return gemv_i8tc(gpu, k, (out, 0, w.rows), &rows, w, base, w.rows, tokens);
    }
    if reads_bf16(gpu, w, tokens) {
        let n = tokens * w.cols;
        let xb = gpu.uninit::<u16>(n)?;
        let grid = (blocks(n.div_ceil(4), 256), 256);
        launch::silu_mul_to_bf16(gpu, k, grid, g, u, ptr(gpu, &xb, 0), n as i64)?;
        let x = Activations::with_bf16(g, tokens, w.cols, xb);
        return matmul_activations(gpu, k, out, &x, w, 0, w.rows);
    }
    silu_mul(gpu, k, g, u, tokens * w.cols)?;
    matmul(gpu, k, out, g, w, 0, w.rows, tokens)
}

/// Formats with an integer (dp4a) GEMV.
pub(super) fn int8_format(format: GpuFormat) -> bool {
    use crate::ggml::GgmlType;
    matches!(format, GpuFormat::Ggml(GgmlType::Q5_K | GgmlType::Q8_0))
}

/// Whether two weights of `format` stacked at row `split` run in one launch of
/// [`matmul_pair`]: the tensor-core GEMV (its tiles must not straddle the split), the int8
/// GEMV and the f32-decoding GEMV of float weights (the MoE router and shared-expert gate) can.
pub fn pairs_in_one_launch(format: GpuFormat, split: usize) -> bool {
    use GpuFormat::{Bf16, F16, F32};
    (weights::is_tiled(format) && split.is_multiple_of(16))
        || int8_format(format)
        || matches!(format, F32 | F16 | Bf16)
}

/// Row `t` of an f32 output `[tokens, width]` at `y`; 0 (no second output) stays 0.
pub(super) fn row_at(y: u64, t: usize, width: usize) -> u64 {
    if y == 0 {
        0
    } else {
        y + (t * width * 4) as u64
    }
}

/// The launches of a GEMV over `tokens`: `(first token, tokens)` of at most [`GEMV_MAX_T`].
pub(super) fn token_chunks(tokens: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..tokens)
        .step_by(GEMV_MAX_T)
        .map(move |t0| (t0, GEMV_MAX_T.min(tokens - t0)))
}

/// The integer GEMV of activations quantised by [`Activations`], every chunk of tokens.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_q8(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    x: &Int8Rows,
    w: &DeviceWeight,
    base: u64,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    if weights::is_tiled(w.format) {
        return gemv_q8_tiles(gpu, k, out, x, w, base, n, tokens);
    }
    let (kdim, row_bytes) = (w.cols, w.row_bytes as i64);
    let suffix = format!("q8_{}", w.format.kernel_suffix());
    RowGemv::new(n, tokens).launch(&suffix, out, kdim, |name, grid, t0, r| {
        let (xq, xd, xs) = int8_at(gpu, x, t0 * kdim);
        launch::gemv_q8(
            gpu, k, name, grid, base, row_bytes, xq, xd, xs, r.y, r.y2, r.n, r.k, r.t, r.split,
            r.rows1,
        )
    })
}

/// The device addresses of int8 rows from value `at` on (a token's start): codes, scales, sums.
pub(super) fn int8_at(gpu: &Gpu, (xq, xd, xs): &Int8Rows, at: usize) -> (u64, u64, u64) {
    (
        ptr(gpu, xq, at),
        ptr(gpu, xd, at / 32),
        ptr(gpu, xs, at / 32),
    )
}

/// The int8 GEMV of a tiled weight (`gemv_q8t_*` in kernels/gemv_tc.cu), by the build for 1,
/// 2, 4, 8 or 16 tokens that fits each chunk (see [`int8_tile_launches`]).
#[allow(clippy::too_many_arguments)]
fn gemv_q8_tiles(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    x: &Int8Rows,
    w: &DeviceWeight,
    base: u64,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let suffix = w.format.kernel_suffix();
    let name = |tc: usize| {
        let build = match tc {
            1 => "1",
            2 => "2",
            3 | 4 => "4",
            5..=8 => "8",
            _ => "",
        };
        format!("gemv{build}_q8t_{suffix}")
    };
    let at = |value: usize| int8_at(gpu, x, value);
    int8_tile_launches(
        gpu,
        k,
        out,
        w,
        (base, n, tokens),
        name,
        at,
        launch::gemv_q8t,
    )
}

/// The device addresses of int8 blocks from value `at` on (the first token of a group of
/// `GEMV_MAX_T`, where a launch's blocks start: see q8_spot in kernels/gemv_tc.cu): codes,
/// scales, sums.
pub(super) fn int8_blocks_at(gpu: &Gpu, (xq, xd, xs): &Int8Blocks, at: usize) -> (u64, u64, u64) {
    (
        ptr(gpu, xq, at),
        ptr(gpu, xd, at / 256),
        ptr(gpu, xs, at / 32),
    )
}

/// The build of the int8 tensor-core family (and of `gemv_group`) that runs a launch of `tokens`
/// (1 to 16): the dp4a build for one, the 8-token mma build up to 8, the 16-token one above.
pub(crate) fn int8_mma_build(tokens: usize) -> &'static str {
    match tokens {
        1 => "gemv1",
        ..=8 => "gemv8",
        _ => "gemv",
    }
}

/// The format codes of kernels/quant.cuh that `gemv_group` takes.
pub(crate) const FMT_Q8_0: i32 = 7;
pub(crate) const FMT_Q4_K: i32 = 10;
pub(crate) const FMT_Q6_K: i32 = 12;

/// One product of [`matmul_group`]: `x · W[..split]ᵀ` into `out.0` `[tokens, split]` and
/// `x · W[split..]ᵀ` into `out.1` (none when `split` is all of W's rows), as [`matmul_pair`].
#[derive(Clone, Copy)]
pub struct GroupProduct<'a> {
    pub w: &'a DeviceWeight,
    pub split: usize,
    pub out: (u64, u64),
}

/// The products of one input in one launch (`gemv_group`), when every one runs on the int8
/// tensor-core GEMV (Q4_K, Q6_K) or is a Q8_0 weight of few rows on the dp4a row GEMV, at most
/// [`PRODUCT_GROUP_MAX`] of them, over up to [`GEMV_MAX_T`] tokens, with
/// [`GpuOptions::product_groups`]. The small products (a GDN layer's b and a, an attention
/// layer's k and v) then run beside the large one instead of after it, each with the bits of
/// its own launch. Returns whether it launched; otherwise the caller runs them apart.
pub fn matmul_group(
    gpu: &Gpu,
    k: &Kernels,
    x: &Activations,
    products: &[GroupProduct<'_>],
) -> Result<bool, GpuError> {
    const Q8_0: GpuFormat = GpuFormat::Ggml(crate::ggml::GgmlType::Q8_0);
    let tokens = x.tokens;
    let rows_gemv = |w: &DeviceWeight| {
        w.format == Q8_0 && reads_int8(gpu, w, tokens) && RowGemv::new(w.rows, tokens).split == 4
    };
    let grouped = gpu.options().product_groups
        && (2..=PRODUCT_GROUP_MAX).contains(&products.len())
        && tokens <= GEMV_MAX_T
        && products
            .iter()
            .all(|p| reads_int8_blocks(gpu, p.w, tokens) || rows_gemv(p.w));
    if !grouped {
        return Ok(false);
    }
    let mut g = ProductGroup::default();
    let (mut end, kdim) = (0usize, products[0].w.cols);
    let options = gpu.options();
    for (i, p) in products.iter().enumerate() {
        x.check(p.w);
        let w = p.w;
        g.w[i] = ptr(gpu, &w.data, 0);
        (g.y[i], g.y2[i]) = p.out;
        g.row_bytes[i] = w.row_bytes as i64;
        g.n[i] = w.rows as i32;
        g.split[i] = p.split as i32;
        if rows_gemv(w) {
            g.fmt[i] = FMT_Q8_0;
            end += tokens * RowGemv::new(w.rows, tokens).group as usize;
        } else {
            g.fmt[i] = if w.format == Q4_K { FMT_Q4_K } else { FMT_Q6_K };
            g.chains[i] = tensor_core_warps(&options, w.rows, kdim) as i32;
            end += w.rows.div_ceil(16);
        }
        g.end[i] = end as i32;
    }
    // Unused entries end where the last does (no block reaches them).
    for i in products.len()..PRODUCT_GROUP_MAX {
        g.end[i] = end as i32;
    }
    let used = &g.fmt[..products.len()];
    let (bq, bd, bs) = if used.iter().any(|&f| f != FMT_Q8_0) {
        int8_blocks_at(gpu, x.int8_blocks(gpu, k)?, 0)
    } else {
        (0, 0, 0)
    };
    let (xq, xd, xs) = if used.contains(&FMT_Q8_0) {
        int8_at(gpu, x.int8(gpu, k)?, 0)
    } else {
        (0, 0, 0)
    };
    let name = format!("{}_group", int8_mma_build(tokens));
    let (kd, t) = (kdim as i32, tokens as i32);
    launch::gemv_group(
        gpu,
        k,
        &name,
        (end as u32, 128),
        g,
        bq,
        bd,
        bs,
        xq,
        xd,
        xs,
        kd,
        t,
    )?;
    Ok(true)
}

/// The int8 tensor-core GEMV of a Q4_K or Q6_K weight (`gemv_i8tc_*` in kernels/gemv_tc.cu), the
/// 8-token build for chunks of 2 to 8 and its dp4a build for one, with the same bits (the mma
/// builds would spend seven of a tile's eight token columns on nothing and swap code words
/// between lanes; see [`int8_tile_launches`]).
#[allow(clippy::too_many_arguments)]
fn gemv_i8tc(
    gpu: &Gpu,
    k: &Kernels,
    out: (u64, u64, usize),
    x: &Int8Blocks,
    w: &DeviceWeight,
    base: u64,
    n: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let suffix = w.format.kernel_suffix();
    let name = |tc: usize| format!("{}_i8tc_{suffix}", int8_mma_build(tc));
    let at = |value: usize| int8_blocks_at(gpu, x, value);
    int8_tile_launches(
        gpu,
        k,
        out,
        w,
        (base, n, tokens),
        name,
        at,
        launch::gemv_i8tc,
    )
}

/// A launcher of the int8 GEMVs of the tiles (`launch::gemv_q8t`, `launch::gemv_i8tc`).
type TileLauncher = fn(
    &Gpu,
    &Kernels,
    &str,
    (u32, u32),
    u64,
    i64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i32,
    i32,
    i32,
    i32,
) -> Result<(), GpuError>;

/// The launches of an int8 GEMV of `n` rows of a tiled weight from `base` over `tokens`: a block
/// per 16-row tile with the tensor-core GEMV's warps, one launch per 16 tokens by the build
/// `name(tokens)` (each token's bits are the same in every build); `at(value)` gives the int8
/// input's addresses from a token's first value.
#[allow(clippy::too_many_arguments)]
fn int8_tile_launches(
    gpu: &Gpu,
    k: &Kernels,
    (y, y2, split): (u64, u64, usize),
    w: &DeviceWeight,
    (base, n, tokens): (u64, usize, usize),
    name: impl Fn(usize) -> String,
    at: impl Fn(usize) -> (u64, u64, u64),
    launcher: TileLauncher,
) -> Result<(), GpuError> {
    let kdim = w.cols;
    let warps = tensor_core_warps(&gpu.options(), n, kdim) as u32;
    for (t0, tc) in token_chunks(tokens) {
        let (xq, xd, xs) = at(t0 * kdim);
        launcher(
            gpu,
            k,
            &name(tc),
            (blocks(n, 16), 32 * warps),
            base,
            w.row_bytes as i64,
            xq,
            xd,
            xs,
            row_at(y, t0, split),
            row_at(y2, t0, n - split),
            split as i32,
            n as i32,
            kdim as i32,
            tc as i32,
        )?;
    }
    Ok(())
}

/// The outputs and shape a row GEMV launch ends its arguments with (see [`RowGemv::launch`]).
pub(super) struct RowTail {
    y: u64,
    y2: u64,
    n: i32,
    k: i32,
    t: i32,
    split: i32,
    rows1: i32,
}

/// How a warp-per-row GEMV (`gemv_*` and `gemv_q8_*` in kernels/gemv.cu, blocks of 4 warps) is
/// launched over `n` rows and `tokens` tokens.
pub(super) struct RowGemv {
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

    /// Launches the GEMV of the weights of kernel suffix `suffix` over rows of `kdim`, chunk by
    /// chunk of tokens: `run(kernel, grid, first token, tail)` launches one with the weights
    /// and activations, then `tail`: the outputs (rows below `out.2` into `out.0`, the others
    /// into `out.1`) and the shape.
    fn launch(
        &self,
        suffix: &str,
        (y, y2, rows1): (u64, u64, usize),
        kdim: usize,
        run: impl Fn(&str, (u32, u32), usize, RowTail) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let name = format!("gemv{}_{suffix}", if self.per_token { "1" } else { "" });
        let chunks: Vec<(usize, usize)> = if self.per_token {
            vec![(0, self.tokens)]
        } else {
            token_chunks(self.tokens).collect()
        };
        for (t0, tc) in chunks {
            let tail = RowTail {
                y: row_at(y, t0, rows1),
                y2: row_at(y2, t0, self.rows - rows1),
                n: self.rows as i32,
                k: kdim as i32,
                t: tc as i32,
                split: self.split as i32,
                rows1: rows1 as i32,
            };
            let grid = if self.per_token {
                self.group * tc as u32
            } else {
                self.group
            };
            run(&name, (grid, 128), t0, tail)?;
        }
        Ok(())
    }
}

/// The f32-decoding GEMV (every format; the exact reference) of rows `row0..row0 + n` of `w`
/// (from `base`) over f32 activations `x`. Rows below `out.2` go to `out.0` `[tokens, out.2]`,
/// the others to `out.1`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_float(
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
    let row_bytes = w.row_bytes as i64;
    RowGemv::new(n, tokens).launch(suffix, out, kdim, |name, grid, t0, r| {
        let x = x + (t0 * kdim * 4) as u64;
        launch::gemv(
            gpu, k, name, grid, base, row_bytes, scales, biases, group, x, r.y, r.y2, r.n, r.k,
            r.t, r.split, r.rows1,
        )
    })
}

/// Scale and bias pointers of an affine weight from row `row0` (null for other formats).
pub(super) fn group_args(gpu: &Gpu, w: &DeviceWeight, row0: usize) -> (u64, u64, i32) {
    match &w.groups {
        Some((s, b, g)) => {
            let per_row = w.cols / g;
            (
                ptr(gpu, s, row0 * per_row),
                ptr(gpu, b, row0 * per_row),
                *g as i32,
            )
        }
        None => (0, 0, 32),
    }
}
