//! The tensor-core GEMV for Q4_K and Q6_K: tiled and stream-K launches, and the f16 activations
//! it reads (kernels/gemv_tc.cu).

use super::*;

/// The tensor-core GEMV of activations converted by [`Activations`] (or by a fused
/// conversion, see [`matmul_swiglu`]), 16 tokens per launch. Rows below `out.2` go to `out.0`
/// `[tokens, out.2]`, the others to `out.1`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_tc(
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
    let warps = tensor_core_warps(&gpu.options(), n, kdim) as u32;
    let (y, y2, split) = out;
    let plan = stream_k(gpu, n, kdim);
    for (t0, tc) in token_chunks(tokens) {
        let (y_at, y2_at) = (row_at(y, t0, split), row_at(y2, t0, n - split));
        let (xh_at, xs_at) = (ptr(gpu, xh, t0 * kdim), ptr(gpu, xscale, t0 * kdim / 256));
        let (row_bytes, split_i, n_i) = (w.row_bytes as i64, split as i32, n as i32);
        let (k_i, t_i) = (kdim as i32, tc as i32);
        if let Some(plan) = plan {
            let name = format!("gemv_tcs{}_{suffix}", if tc <= 8 { 8 } else { 16 });
            let partials = gpu.uninit::<f32>(plan.partials(n))?;
            let pp = ptr(gpu, &partials, 0);
            let (blocks_i, pieces) = (plan.blocks as i32, plan.max_pieces as i32);
            let grid = (plan.blocks as u32, 32 * STREAM_K_WARPS);
            launch::gemv_tcs(
                gpu, k, &name, grid, base, row_bytes, xh_at, xs_at, y_at, y2_at, split_i, n_i, k_i,
                t_i, pp, pieces,
            )?;
            let grid = (blocks(n.div_ceil(16) * tc * 16, 256), 256);
            launch::gemv_tc_fixup(
                gpu, k, grid, pp, y_at, y2_at, split_i, n_i, k_i, t_i, blocks_i, pieces,
            )?;
            continue;
        }
        // A block per 16-row tile.
        let name = format!("gemv_tc{}_{suffix}", if tc <= 8 { 8 } else { 16 });
        let grid = (blocks(n, 16), 32 * warps);
        launch::gemv_tc(
            gpu, k, &name, grid, base, row_bytes, xh_at, xs_at, y_at, y2_at, split_i, n_i, k_i, t_i,
        )?;
    }
    Ok(())
}

/// Warps per block of a stream-K launch.
pub(super) const STREAM_K_WARPS: u32 = 4;

/// How a stream-K launch cuts a matrix (`gemv_tcs` in kernels/gemv_tc.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StreamK {
    /// Blocks of the launch: three per SM, at most one per unit.
    blocks: usize,
    /// The most blocks that share one tile.
    max_pieces: usize,
}

impl StreamK {
    /// The schedule for `n` rows of `kdim` values over `sms` SMs of `per_sm` blocks each: units
    /// are (16-row tile, 256-value block) pairs, each block gets an equal range of them.
    fn new(n: usize, kdim: usize, sms: usize, per_sm: usize) -> Self {
        let units = n.div_ceil(16) * (kdim / 256);
        let blocks = (sms * per_sm).clamp(1, units.max(1));
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

/// The stream-K schedule for a tensor-core GEMV of `n` rows of `kdim` values, when
/// [`GpuOptions::stream_k`](crate::cuda::GpuOptions) is on. It depends on the shape and the GPU
/// only, never on the token count, so tokens keep their bits in any batch.
pub(super) fn stream_k(gpu: &Gpu, n: usize, kdim: usize) -> Option<StreamK> {
    let o = gpu.options();
    o.stream_k
        .then(|| StreamK::new(n, kdim, gpu.sms(), o.stream_k_blocks_per_sm))
}

/// What a conversion to a tensor-core GEMV's input reads (`[rows, kdim]` f32 each).
#[derive(Clone, Copy)]
pub(super) enum TcInput {
    /// The rows themselves (`to_f16_tc`, `quantize_q8_blocks`).
    Rows(u64),
    /// `silu(g) · u` of the rows of `g` and `u` (`silu_mul_to_f16_tc`, `silu_mul_to_q8_blocks`).
    SiluMul(u64, u64),
    /// `x · sigmoid(gate)`, also left in `x` (`sigmoid_gate_to_f16_tc`, the attention output
    /// gate).
    SigmoidGate { x: u64, gate: u64 },
    /// `w · rms_norm(x) · silu(z)` over rows of `d` (a divisor of 256, from 32), also written
    /// to `out` (`rms_norm_gated_to_f16_tc`, the GDN output norm).
    GatedNorm {
        x: u64,
        z: u64,
        w: u64,
        out: u64,
        d: usize,
        eps: f32,
    },
}

/// `rows` rows of `kdim` activations as the tensor-core GEMV reads them (f16 in its k order,
/// one power-of-two scale per 256 values), from `input`.
pub(super) fn convert_f16_tc(
    gpu: &Gpu,
    k: &Kernels,
    input: TcInput,
    rows: usize,
    kdim: usize,
) -> Result<F16Rows, GpuError> {
    let blocks256 = rows * kdim / 256;
    let xh = gpu.uninit::<u16>(rows * kdim)?;
    let xscale = gpu.uninit::<f32>(blocks256)?;
    let out = [ptr(gpu, &xh, 0), ptr(gpu, &xscale, 0), 0, 0, 0];
    convert(gpu, k, input, (blocks256, kdim / 256), out)?;
    Ok((xh, xscale))
}

/// `rows` rows of `kdim` activations as the int8 tensor-core GEMV reads them (int8 in its k
/// order, a scale per 256 values, the codes' sum per 32), from `input`.
pub(super) fn convert_int8_blocks(
    gpu: &Gpu,
    k: &Kernels,
    input: TcInput,
    rows: usize,
    kdim: usize,
) -> Result<Int8Blocks, GpuError> {
    let converted = int8_blocks(gpu, rows * kdim)?;
    let (xq, xd, xs) = int8_blocks_at(gpu, &converted, 0);
    convert(
        gpu,
        k,
        input,
        (rows * kdim / 256, kdim / 256),
        [0, 0, xq, xd, xs],
    )?;
    Ok(converted)
}

/// The launch of a conversion of `blocks256` blocks, `per_row` a row, into the f16 rows (`xh`,
/// `xscale`) or, with `xh` 0, the int8 blocks (`bq`, `bd`, `bs`): a warp a block.
fn convert(
    gpu: &Gpu,
    k: &Kernels,
    input: TcInput,
    (blocks256, per_row): (usize, usize),
    [xh, xscale, bq, bd, bs]: [u64; 5],
) -> Result<(), GpuError> {
    let grid = (blocks(blocks256 * 32, 256), 256);
    let (n, nb) = (blocks256 as i64, per_row as i32);
    let f16 = xh != 0;
    match input {
        TcInput::Rows(x) if f16 => launch::to_f16_tc(gpu, k, grid, x, xh, xscale, n),
        TcInput::Rows(x) => launch::quantize_q8_blocks(gpu, k, grid, x, bq, bd, bs, n, nb),
        TcInput::SiluMul(g, u) if f16 => {
            launch::silu_mul_to_f16_tc(gpu, k, grid, g, u, xh, xscale, n)
        }
        TcInput::SiluMul(g, u) => {
            launch::silu_mul_to_q8_blocks(gpu, k, grid, g, u, bq, bd, bs, n, nb)
        }
        TcInput::SigmoidGate { x, gate } => {
            launch::sigmoid_gate_to_f16_tc(gpu, k, grid, x, gate, xh, xscale, n, bq, bd, bs, nb)
        }
        TcInput::GatedNorm {
            x,
            z,
            w,
            out,
            d,
            eps,
        } => launch::rms_norm_gated_to_f16_tc(
            gpu, k, grid, x, z, w, out, xh, xscale, d as i32, eps, n, bq, bd, bs, nb,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let plan = StreamK::new(n, kdim, sms, GpuOptions::default().stream_k_blocks_per_sm);
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
