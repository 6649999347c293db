//! Mixture of experts on the device: routing, the grouped expert products and the combine
//! (kernels/moe.cu, kernels/gemv_tc.cu).

use super::*;

/// Whether the experts of a MoE layer stored like `w` have the grouped device kernel
/// ([`matmul_experts`], outside the exact mode): the tensor-core formats.
pub fn has_expert_kernel(w: &DeviceWeight) -> bool {
    weights::is_tiled(w.format)
}

/// A MoE layer's routing on the device: each token's experts and weights, and its pairs
/// (token, expert) grouped by expert for [`matmul_experts`].
pub struct ExpertRouting {
    /// Expert of pair `t · per_token + j` (`[tokens, per_token]`): the shared expert first when
    /// routed with the others (its id the number of routed experts), then the routed ones, most
    /// probable first.
    pub ids: CudaSlice<i32>,
    /// Its weight: the shared expert's gate, the routed ones renormalised over the token's
    /// `top_k`.
    pub weights: CudaSlice<f32>,
    /// Pairs a token: `top_k`, and one more with the shared expert.
    pub per_token: usize,
    active: CudaSlice<i32>,
    offsets: CudaSlice<i32>,
    order: CudaSlice<i32>,
    slots: usize,
    /// A prefill pass's per-chunk counts (`moe_group_counts`), kept until the products ran.
    chunk_counts: Option<CudaSlice<i32>>,
}

/// Pairs above which the grouping takes its three-launch form over many blocks (up to it the
/// routing's last block groups them, scanning every pair once per active expert).
pub(super) const MOE_GROUP_ONE_BLOCK: usize = 1024;

/// Pairs a block of `moe_group_counts` and `moe_group_scatter` takes (`MOE_GROUP_CHUNK`).
pub(super) const MOE_GROUP_CHUNK: usize = 256;

/// Tokens a block of `moe_route` routes, a warp each (`MOE_ROUTE_TOKENS` in kernels/moe.cu).
pub(super) const MOE_ROUTE_TOKENS: usize = 32;

/// The most experts a token may keep for device routing (`MOE_TOP_K_MAX` in kernels/moe.cu).
pub(super) const MOE_TOP_K_MAX: usize = 32;

/// Routes `tokens` rows of router logits `[tokens, experts]` on the device: softmax, the
/// `top_k` most probable experts, their probabilities renormalised (as the CPU's `route`).
/// With `shared_gate` (`[tokens]`), the shared expert is each token's first pair too: expert
/// `routed` (its tables' last entry) with weight `sigmoid(shared_gate[t])`.
pub fn moe_route(
    gpu: &Gpu,
    k: &Kernels,
    logits: u64,
    tokens: usize,
    (routed, top_k): (usize, usize),
    shared_gate: Option<u64>,
) -> Result<ExpertRouting, GpuError> {
    // The grouping's experts: the shared one is the last.
    let shared = usize::from(shared_gate.is_some());
    let experts = routed + shared;
    if experts > 1024 || top_k > routed || top_k > MOE_TOP_K_MAX {
        return Err(GpuError::Unsupported(format!(
            "device routing takes up to 1024 experts, the shared one included, and top-k ≤ min(experts, {MOE_TOP_K_MAX}) (got {routed} + {shared}, {top_k})"
        )));
    }
    let per_token = top_k + shared;
    let pairs = tokens * per_token;
    let slots = experts.min(pairs);
    let chunks = pairs.div_ceil(MOE_GROUP_CHUNK);
    let r = ExpertRouting {
        ids: gpu.uninit::<i32>(pairs)?,
        weights: gpu.uninit::<f32>(pairs)?,
        per_token,
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
    let p = |b: &CudaSlice<i32>| ptr(gpu, b, 0);
    let (ids, e, slots) = (p(&r.ids), experts as i32, slots as i32);
    let (active, offsets, order) = (p(&r.active), p(&r.offsets), p(&r.order));
    // Up to MOE_GROUP_ONE_BLOCK pairs the routing groups them, in its one block or the last of
    // several to finish (`done`: their counter; with GpuOptions::fold_moe), else `moe_group` or
    // the chunked grouping's launches follow.
    let one_block = r.chunk_counts.is_none();
    let fold = one_block && gpu.options().fold_moe;
    let done = if fold { gpu.route_done() } else { 0 };
    // Up to a warp's worth of pairs (a decode step's) one warp routes and groups them.
    let grid = if pairs <= 32 {
        (1, 32)
    } else {
        (tokens.div_ceil(MOE_ROUTE_TOKENS) as u32, 1024)
    };
    launch::moe_route(
        gpu,
        k,
        grid,
        logits,
        tokens as i32,
        ids,
        ptr(gpu, &r.weights, 0),
        routed as i32,
        top_k as i32,
        shared_gate.unwrap_or(0),
        done,
        slots,
        active,
        offsets,
        order,
    )?;
    let pairs = pairs as i32;
    let Some(counts) = &r.chunk_counts else {
        if !fold {
            let grid = (1, 1024);
            launch::moe_group(gpu, k, grid, ids, pairs, e, slots, active, offsets, order)?;
        }
        return Ok(r);
    };
    let counts = p(counts);
    let spread = (chunks as u32, MOE_GROUP_CHUNK as u32);
    launch::moe_group_counts(gpu, k, spread, ids, pairs, e, counts)?;
    let n = chunks as i32;
    launch::moe_group_slots(gpu, k, (1, 1024), counts, n, e, slots, active, offsets)?;
    launch::moe_group_scatter(gpu, k, spread, ids, pairs, e, counts, order)?;
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
    let converted = convert_f16_tc(gpu, k, TcInput::SiluMul(g, u), pairs, proto.cols)?;
    let x = Activations::with_f16(g, pairs, proto.cols, converted);
    matmul_experts(gpu, k, out, &x, table, proto, routing, 1)
}

/// One launch of the grouped expert kernel for one or two `(table, out)` products (a second
/// table of 0: none).
pub(super) fn launch_experts(
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
    let p = |b: &CudaSlice<i32>| ptr(gpu, b, 0);
    let tables = if products[1].0 == 0 { 1 } else { 2 };
    let blocks = tables * routing.slots * n.div_ceil(16);
    let options = gpu.options();
    let chains = tensor_core_warps(&options, n, kdim);
    // More than 16 pairs a slot on average (prefill passes): the kernels that decode a tile's
    // weights for more pairs at a time may pay.
    let many = x.tokens * col_div > 16 * routing.slots;
    // One-token passes take the build of up to 8 pairs at a time (fewer registers; an expert
    // has one pair there): on an H100 it made the 35B-A3B's one-token pass faster, its 4- and
    // 8-row passes slower (BENCHMARKS.md, thirty-fourth session).
    let tokens = routing.ids.len() / routing.per_token;
    let (kernel, warps) = match options.prefill_experts {
        PrefillExperts::Gemm if many => ("gemm_tc_experts_", 4),
        _ if tokens == 1 && options.narrow_experts => ("gemv_tc_experts8_", 0),
        _ => ("gemv_tc_experts_", 0),
    };
    // The bench's sweep may force the warps; the same bits either way.
    let warps = match (options.expert_warps, warps) {
        (None, 0) => expert_warps(blocks, chains, expert_warps_in_flight(proto.format)),
        (None, w) => w.min(chains),
        (Some(forced), _) => forced.min(chains),
    };
    let name = format!("{kernel}{}", proto.format.kernel_suffix());
    let grid = (blocks as u32, 32 * warps as u32);
    let ((table, y), (table_b, y_b)) = (products[0], products[1]);
    let (active, offsets, order) = (p(&routing.active), p(&routing.offsets), p(&routing.order));
    let (xh, xscale) = (ptr(gpu, xh, 0), ptr(gpu, xscale, 0));
    let (n, kdim, col_div, chains) = (n as i32, kdim as i32, col_div as i32, chains as i32);
    launch::experts(
        gpu,
        k,
        &name,
        grid,
        table,
        y,
        table_b,
        y_b,
        active,
        offsets,
        order,
        proto.row_bytes as i64,
        xh,
        xscale,
        n,
        kdim,
        col_div,
        chains,
    )
}

/// The kernel of the grouped expert products with more than 16 pairs an expert on average (a
/// prefill pass's); both give each pair the same bits. `gemm` by default: on the H200 the
/// 35B-A3B's 8K prefill ran at 13,241 tok/s with it against 11,440 (BENCHMARKS.md, eighth
/// session). [`GpuOptions::prefill_experts`](crate::cuda::GpuOptions) picks.
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

    /// The kernel's name as `SPLASH_PREFILL_EXPERTS` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gemm => "gemm",
            Self::Gemv => "gemv",
        }
    }
}

/// Warps in flight that a grouped expert product of `format` aims for: about as many as the
/// H200's SMs hold of its 16-pair kernel (`EXPERT_REGS_*` in kernels/gemv_tc.cu: Q4_K's at 128
/// registers, 16 an SM; Q6_K's at ~230, 8 an SM). Measured there (`gemv_cuda`, 35B-A3B
/// experts), each fastest at 1, 4 and 16 tokens (1 to 8 warps a tile); twice as many ran
/// 15-40% slower, half as many (Q4_K at 1,024) up to 55% slower. The 8-pair kernel
/// (`gemv_tc_experts8_*`: Q4_K 15 an SM, Q6_K 12) takes the same targets, not re-measured.
pub(super) fn expert_warps_in_flight(format: GpuFormat) -> usize {
    match format {
        GpuFormat::Ggml(crate::ggml::GgmlType::Q4_K) => 2048,
        _ => 1024,
    }
}

/// Warps per block of a grouped expert product of `blocks` tiles whose K blocks are summed in
/// `chains` chains: as many as keep `in_flight` warps busy, a power of two, at most one a
/// chain. The chains, not the warps, set the bits, so this may follow the number of tokens.
pub(super) fn expert_warps(blocks: usize, chains: usize, in_flight: usize) -> usize {
    let fill = (in_flight / blocks.max(1)).max(1);
    (1usize << fill.ilog2()).min(chains)
}

/// `out[t, :] = out[t, :] · sigmoid(gate[t]) + Σ_j weights[t, j] · y[t · per_token + j, :]`
/// (`d` values per row), the pairs added in order `j`: the bits of [`scale_rows_sigmoid`]
/// then the sum. Without a `gate` (the shared expert routed as a pair), the sum alone.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    y: u64,
    gate: Option<u64>,
    routing: &ExpertRouting,
    tokens: usize,
    d: usize,
) -> Result<(), GpuError> {
    launch::moe_combine(
        gpu,
        k,
        ((tokens * d.div_ceil(256)) as u32, 256),
        y,
        ptr(gpu, &routing.weights, 0),
        out,
        gate.unwrap_or(0),
        routing.per_token as i32,
        d as i32,
    )
}
