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
pub(super) fn launch_add_rms_norm(
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
        let converted = [Arg::Ptr(ptr(gpu, &xb, 0))];
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
    let converted = [Arg::Ptr(ptr(gpu, &xh, 0)), Arg::Ptr(ptr(gpu, &xscale, 0))];
    let kernel = "add_rms_norm_to_f16_tc";
    launch_add_rms_norm(gpu, k, kernel, [out, x, y, w], &converted, rows, d, eps)?;
    Ok(Activations::with_f16(out, rows, d, (xh, xscale)))
}

/// Whether a product of `tokens` rows by `w` reads its input in bf16 (cuBLAS, outside the
/// exact mode).
pub(super) fn reads_bf16(gpu: &Gpu, w: &DeviceWeight, tokens: usize) -> bool {
    !gpu.exact() && gemm_blas(gpu, w, tokens, GEMM_MIN_T).is_some()
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
    let ob_ptr = Some(ptr(gpu, &ob, 0));
    launch_rms_norm_gated(gpu, k, kernel, [x, z, w, out], ob_ptr, rows, d, eps)?;
    Ok(Activations::with_bf16(out, tokens, kdim, ob))
}

/// Launches `kernel`, `rms_norm_gated` or its variant that also writes the bf16 rows `ob`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_rms_norm_gated(
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
pub(super) const GATED_NORM_ROWS: usize = 8;

pub(super) fn elementwise(
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
