//! RMS norms (plain, fused with a residual add or a conversion, gated) and elementwise ops
//! (kernels/norm.cu).

use super::*;

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
    let grid = (rows as u32, norm_threads(d));
    launch::rms_norm(gpu, k, grid, x, w, out, d as i32, eps)
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
    check_add_rms_norm(out, x, y);
    let grid = (rows as u32, norm_threads(d));
    launch::add_rms_norm(gpu, k, grid, x, y, w, out, d as i32, eps, 0, 0)
}

/// What a residual add adds to each row.
#[derive(Clone, Copy)]
pub enum Addend<'a> {
    /// Rows `[rows, d]` at this address.
    Rows(u64),
    /// A MoE layer's pair outputs `[rows · per_token, d]` at `y`, weighted and summed in the
    /// same launch as [`moe_combine`] without a gate sums them (the same bits, a launch fewer).
    Pairs { y: u64, routing: &'a ExpertRouting },
}

impl Addend<'_> {
    /// The kernels' `y`, pair weights and pairs a row (0: rows).
    fn args(self, gpu: &Gpu) -> (u64, u64, i32) {
        match self {
            Self::Rows(y) => (y, 0, 0),
            Self::Pairs { y, routing } => {
                (y, ptr(gpu, &routing.weights, 0), routing.per_token as i32)
            }
        }
    }
}

/// The fused add and norm kernels write `out` while they read `x` and `y`.
fn check_add_rms_norm(out: u64, x: u64, y: u64) {
    assert!(
        out != x && out != y,
        "add_rms_norm writes out while it reads x and y"
    );
}

/// What reads a norm's output first, so that the norm's launch writes the conversion it takes.
#[derive(Clone, Copy)]
pub enum NextProducts<'a> {
    /// Products by the first weight, and maybe by the second.
    Weights(&'a DeviceWeight, Option<&'a DeviceWeight>),
    /// A MoE layer's grouped expert products ([`matmul_experts`]), its shared expert among
    /// them: they read the tensor-core GEMV's f16 whatever the tiled GEMV.
    Experts,
}

/// [`add_rms_norm`] of `y`, its output returned as the activations of the products `next` that
/// read it. When the first runs on the tensor-core GEMV (see [`reads_f16`]), or the next are grouped
/// experts, the same launch writes its f16 conversion too (`add_rms_norm_to_f16_tc`: the bits of
/// the two kernels), one launch fewer than converting at the product; with
/// `GpuOptions::fold_launches` also the other's int8 when it runs on the dp4a GEMV (a GDN
/// layer's b and a), the bits of `quantize_q8`; or instead of the f16 the first's int8 when it
/// runs on the int8 GEMV of the tiles (`TiledGemv::Int8`), or its int8 blocks when it runs on
/// the int8 tensor-core GEMV (`TiledGemv::Int8Mma`, `quantize_q8_blocks`).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_activations(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    y: Addend<'_>,
    w: u64,
    rows: usize,
    d: usize,
    eps: f32,
    next: NextProducts<'_>,
) -> Result<Activations, GpuError> {
    let (y, pw, per) = y.args(gpu);
    check_add_rms_norm(out, x, y);
    let (grid, d_i) = ((rows as u32, norm_threads(d)), d as i32);
    let (first, other) = match next {
        NextProducts::Weights(first, other) => (Some(first), other),
        // Grouped experts run outside the exact mode only.
        NextProducts::Experts => (None, None),
    };
    if first.is_some_and(|f| reads_bf16(gpu, f, rows)) {
        let xb = gpu.uninit::<u16>(rows * d)?;
        let xbp = ptr(gpu, &xb, 0);
        launch::add_rms_norm_to_bf16(gpu, k, grid, x, y, w, out, xbp, d_i, eps, pw, per)?;
        return Ok(Activations::with_bf16(out, rows, d, xb));
    }
    // The kernel converts whole 256-value blocks (a tiled weight's rows are made of them).
    let f16 = first.map_or(!gpu.exact(), |f| reads_f16(gpu, f, rows)) && d.is_multiple_of(256);
    let fold = gpu.options().fold_launches && d.is_multiple_of(256);
    let int8_for = |w: &DeviceWeight| fold && reads_int8(gpu, w, rows);
    // The int8 blocks of the first product, when it runs on the int8 tensor-core GEMV.
    let blocks8 = if fold && first.is_some_and(|f| reads_int8_blocks(gpu, f, rows)) {
        Some(int8_blocks(gpu, rows * d)?)
    } else {
        None
    };
    // The int8 rows of the first product, when it runs on the int8 GEMV of the tiles, or of
    // the other beside the first's converted input.
    let converts = f16 || blocks8.is_some();
    let int8 = if first.is_some_and(int8_for) || (converts && other.is_some_and(int8_for)) {
        Some(int8_rows(gpu, rows * d)?)
    } else {
        None
    };
    if !converts && int8.is_none() {
        launch::add_rms_norm(gpu, k, grid, x, y, w, out, d_i, eps, pw, per)?;
        return Ok(Activations::new(out, rows, d));
    }
    let f16_rows = if f16 {
        Some((
            gpu.uninit::<u16>(rows * d)?,
            gpu.uninit::<f32>(rows * d / 256)?,
        ))
    } else {
        None
    };
    let [xhp, xsp] = f16_rows
        .as_ref()
        .map_or([0; 2], |(h, s)| [ptr(gpu, h, 0), ptr(gpu, s, 0)]);
    let (xq, xd, xs) = int8.as_ref().map_or((0, 0, 0), |r| int8_at(gpu, r, 0));
    let (bq, bd, bs) = blocks8
        .as_ref()
        .map_or((0, 0, 0), |b| int8_blocks_at(gpu, b, 0));
    launch::add_rms_norm_to_f16_tc(
        gpu, k, grid, x, y, w, out, xhp, xsp, d_i, eps, xq, xd, xs, bq, bd, bs, pw, per,
    )?;
    let a = Activations::new(out, rows, d);
    if let Some(f16_rows) = f16_rows {
        let _ = a.f16.set(f16_rows);
    }
    if let Some(blocks8) = blocks8 {
        let _ = a.int8_blocks.set(blocks8);
    }
    if let Some(int8) = int8 {
        let _ = a.int8.set(int8);
    }
    Ok(a)
}

/// Whether a product of `tokens` rows by `w` reads its input in bf16 (cuBLAS, outside the
/// exact mode).
pub(super) fn reads_bf16(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    !gpu.exact() && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_some()
}

/// Whether a product of `tokens` rows by `w` reads its input in the dp4a GEMV's int8.
pub(super) fn reads_int8(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    int8_gemv(gpu, w) && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_none()
}

/// Whether a product of `tokens` rows by `w` reads its input in the int8 tensor-core GEMV's
/// int8 blocks.
pub(super) fn reads_int8_blocks(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    int8_mma(gpu, w) && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_none()
}

/// Whether a product of `tokens` rows by `w` reads its input in the tensor-core GEMV's f16
/// (rather than cuBLAS's bf16 or the other GEMVs' int8 or f32).
pub fn reads_f16(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    tensor_core(gpu, w) && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_none()
}

/// Threads of a row norm: a float4 each, up to 1024, so that a hidden-size row takes one or
/// two loads per thread.
pub(super) fn norm_threads(d: usize) -> u32 {
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
    let (rows_i, d) = (rows as i32, d as i32);
    launch::rms_norm_gated(gpu, k, gated_norm_grid(rows), x, z, w, out, rows_i, d, eps)
}

/// [`rms_norm_gated`] whose `[tokens, rows / tokens · d]` output is the input of products by
/// `next`: the same launch writes the conversion those read (bf16 for cuBLAS; with
/// `GpuOptions::fold_launches` the tensor-core GEMV's f16 or the int8 one's blocks).
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
    // The conversions take whole 256-value blocks, a warp each.
    let blocks_of_rows = 256 % d == 0 && d >= 32;
    let input = TcInput::GatedNorm {
        x,
        z,
        w,
        out,
        d,
        eps,
    };
    if blocks_of_rows {
        if let Some(a) = fused_conversion(gpu, k, (input, out), tokens, kdim, next)? {
            return Ok(a);
        }
    }
    if !reads_bf16(gpu, next, tokens) {
        rms_norm_gated(gpu, k, out, x, z, w, rows, d, eps)?;
        return Ok(Activations::new(out, tokens, kdim));
    }
    let ob = gpu.uninit::<u16>(rows * d)?;
    let (grid, obp) = (gated_norm_grid(rows), ptr(gpu, &ob, 0));
    let (rows_i, d_i) = (rows as i32, d as i32);
    launch::rms_norm_gated_to_bf16(gpu, k, grid, x, z, w, out, obp, rows_i, d_i, eps)?;
    Ok(Activations::with_bf16(out, tokens, kdim, ob))
}

/// The activations a gate's launch (`input`, its rows at `rows`) writes together with the input
/// of the products by `next`, when those run on a tensor-core GEMV: its f16 or its int8 blocks
/// (`GpuOptions::fold_launches`; whole 256-value blocks a row). `None`, launching nothing, when
/// they read another conversion.
fn fused_conversion(
    gpu: &Gpu,
    k: &Kernels,
    (input, rows): (TcInput, u64),
    tokens: usize,
    kdim: usize,
    next: &DeviceWeight,
) -> Result<Option<Activations>, GpuError> {
    if !gpu.options().fold_launches || !kdim.is_multiple_of(256) {
        return Ok(None);
    }
    if reads_f16(gpu, next, tokens) {
        let f16 = convert_f16_tc(gpu, k, input, tokens, kdim)?;
        return Ok(Some(Activations::with_f16(rows, tokens, kdim, f16)));
    }
    if reads_int8_blocks(gpu, next, tokens) {
        let blocks8 = convert_int8_blocks(gpu, k, input, tokens, kdim)?;
        return Ok(Some(Activations::with_int8_blocks(
            rows, tokens, kdim, blocks8,
        )));
    }
    Ok(None)
}

/// The grid of `rms_norm_gated*` over `rows` rows: a warp a row.
pub(super) fn gated_norm_grid(rows: usize) -> (u32, u32) {
    (
        rows.div_ceil(GATED_NORM_ROWS) as u32,
        32 * GATED_NORM_ROWS as u32,
    )
}

/// Rows (a warp each) a block of `rms_norm_gated*`.
pub(super) const GATED_NORM_ROWS: usize = 8;

/// The grid of an elementwise kernel over `n` values: a thread each.
pub(super) fn elementwise_grid(n: usize) -> (u32, u32) {
    (blocks(n, 256), 256)
}

/// `x += y` over `n` values.
pub fn add_in_place(gpu: &Gpu, k: &Kernels, x: u64, y: u64, n: usize) -> Result<(), GpuError> {
    launch::add_in_place(gpu, k, elementwise_grid(n), x, y, n as i64)
}

/// `g = silu(g) * u` over `n` values.
pub fn silu_mul(gpu: &Gpu, k: &Kernels, g: u64, u: u64, n: usize) -> Result<(), GpuError> {
    launch::silu_mul(gpu, k, elementwise_grid(n), g, u, n as i64)
}

/// `x *= sigmoid(gate)` over `n` values.
pub fn sigmoid_gate(gpu: &Gpu, k: &Kernels, x: u64, gate: u64, n: usize) -> Result<(), GpuError> {
    launch::sigmoid_gate(gpu, k, elementwise_grid(n), x, gate, n as i64)
}

/// [`sigmoid_gate`] of `[tokens, kdim]` rows that are the input of products by `next`: when
/// those read the tensor-core GEMV's f16 or the int8 one's blocks, the same launch writes them
/// (`sigmoid_gate_to_f16_tc`, the bits of the two kernels).
pub fn sigmoid_gate_activations(
    gpu: &Gpu,
    k: &Kernels,
    (x, gate): (u64, u64),
    tokens: usize,
    kdim: usize,
    next: &DeviceWeight,
) -> Result<Activations, GpuError> {
    let input = TcInput::SigmoidGate { x, gate };
    if let Some(a) = fused_conversion(gpu, k, (input, x), tokens, kdim, next)? {
        return Ok(a);
    }
    sigmoid_gate(gpu, k, x, gate, tokens * kdim)?;
    Ok(Activations::new(x, tokens, kdim))
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
    let grid = (rows as u32, row_threads(d));
    launch::scale_rows_sigmoid(gpu, k, grid, x, g, d as i32)
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
    let grid = (rows as u32, row_threads(d));
    launch::gather_rows(gpu, k, grid, x, idx, out, d as i32)
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
    let grid = (rows as u32, row_threads(d));
    launch::scatter_add_rows(gpu, k, grid, y, idx, w, out, d as i32)
}
