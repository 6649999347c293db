//! The vision tower's ops (kernels/vision.cu): LayerNorm with bias, bias and activation, the
//! learned positions, the rotary split into f16 heads, the bidirectional attention, and its
//! products on cuBLAS.

use super::*;

/// The activation after a linear layer's bias ([`bias_act`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None = 0,
    /// GELU, tanh approximation (the tower's blocks).
    GeluTanh = 1,
    /// GELU, exact (the merger).
    GeluErf = 2,
}

/// `out[r] = (x[r] − mean) / sqrt(var + eps) · w + b` for `rows` rows of `d` (out may alias x).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    gpu: &Gpu,
    k: &Kernels,
    x: u64,
    (w, b): (u64, u64),
    out: u64,
    rows: usize,
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    let grid = (rows as u32, row_threads(d));
    launch::layer_norm(gpu, k, grid, x, w, b, out, d as i32, eps)
}

/// `y[r, c] = act(y[r, c] + b[c])` over `rows` rows of `cols`; with a `residual` (a device
/// address), `residual[r, c] += act(y[r, c] + b[c])` instead, y unchanged.
#[allow(clippy::too_many_arguments)]
pub fn bias_act(
    gpu: &Gpu,
    k: &Kernels,
    y: u64,
    b: u64,
    residual: Option<u64>,
    rows: usize,
    cols: usize,
    act: Activation,
) -> Result<(), GpuError> {
    let grid = (
        rows.min(1 << 16) as u32,
        row_threads(cols.div_ceil(4)).max(64),
    );
    let (rows, cols) = (rows as i32, cols as i32);
    launch::bias_act(
        gpu,
        k,
        grid,
        y,
        b,
        residual.unwrap_or(0),
        rows,
        cols,
        act as i32,
    )
}

/// `x[r] += Σ_j weights[4r + j] · table[taps[4r + j]]` for `rows` rows of `d`: learned
/// positions resampled by four taps a row.
#[allow(clippy::too_many_arguments)]
pub fn add_position_taps(
    gpu: &Gpu,
    k: &Kernels,
    x: u64,
    table: u64,
    (taps, weights): (u64, u64),
    rows: usize,
    d: usize,
) -> Result<(), GpuError> {
    let grid = (rows as u32, row_threads(d));
    launch::add_position_taps(gpu, k, grid, x, table, taps, weights, d as i32)
}

/// The head dim the attention kernels take for `hd`: the next multiple of 16, up to 128.
pub fn padded_head_dim(hd: usize) -> Option<usize> {
    let p = hd.div_ceil(16) * 16;
    (hd > 0 && hd.is_multiple_of(2) && p <= 128 && p != 112).then_some(p)
}

/// The rows of `qkv` `[n, 3, heads, hd]` as f16 heads `q`, `k`, `v` `[heads, n, hdp]`: q and k
/// turned by the rotary of `cos`, `sin` `[n, hd]` (rotate-half), q times `scale`: the
/// attention's scale times log2 e ([`vision_attention`]'s softmax is in base 2).
#[allow(clippy::too_many_arguments)]
pub fn vision_qkv(
    gpu: &Gpu,
    kernels: &Kernels,
    qkv: u64,
    (cos, sin): (u64, u64),
    (q, k, v): (u64, u64, u64),
    n: usize,
    (heads, hd, hdp): (usize, usize, usize),
    scale: f32,
) -> Result<(), GpuError> {
    let grid = (n as u32, row_threads(heads * hdp));
    let (n, heads, hd, hdp) = (n as i32, heads as i32, hd as i32, hdp as i32);
    launch::vision_qkv(
        gpu, kernels, grid, qkv, cos, sin, q, k, v, n, heads, hd, hdp, scale,
    )
}

/// The largest padded head dim with a two-tile attention kernel (`vision_attention_{hdp}x2`).
pub(crate) const TWO_TILES_MAX_HDP: usize = 80;

/// Attention of each of `n` patches to all `n`, per head, from [`vision_qkv`]'s f16 heads (head
/// dim `hd`, padded to `hdp`), into `out` `[n, heads · hd]` f32; each warp takes two tiles of
/// 16 queries where the options and the head dim allow it.
#[allow(clippy::too_many_arguments)]
pub fn vision_attention(
    gpu: &Gpu,
    kernels: &Kernels,
    (q, k, v): (u64, u64, u64),
    out: u64,
    n: usize,
    (heads, hd, hdp): (usize, usize, usize),
) -> Result<(), GpuError> {
    const QUERIES: usize = 128; // VA_QUERIES in kernels/vision.cu
    let (name, warps) = match gpu.options().vision_query_tiles == 2 && hdp <= TWO_TILES_MAX_HDP {
        true => (format!("vision_attention_{hdp}x2"), QUERIES / 32),
        false => (format!("vision_attention_{hdp}"), QUERIES / 16),
    };
    let grid = (blocks(n, QUERIES) * heads as u32, 32 * warps as u32);
    let (n, heads, hd) = (n as i32, heads as i32, hd as i32);
    launch::vision_attention(gpu, kernels, &name, grid, q, k, v, out, n, heads, hd)
}

/// `out = x · Wᵀ` for `tokens` rows of `x` by cuBLAS (bf16 operands, f32 accumulation), in
/// every mode: the tower's passes are one image each, nothing to keep batch-invariant.
pub fn matmul_dense(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    w: &DeviceWeight,
    tokens: usize,
) -> Result<(), GpuError> {
    let blas = gpu
        .blas()
        .ok_or_else(|| GpuError::Unsupported("the vision tower needs cuBLAS".into()))?;
    let x = Activations::new(x, tokens, w.cols);
    gemm(gpu, k, &blas, out, &x, w, 0, w.rows)
}
