//! The query / gate split and partial RoPE, for one sequence or the sequences of a pass
//! (kernels/rope.cu).

use super::*;

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
    let grid = (rows as u32, row_threads(d));
    launch::split_q_gate(gpu, k, grid, qg, q, gate, d as i32)
}

/// [`split_q_gate`] of `q_rows` heads, then [`rms_norm`] of the `q` rows (weight `wq`) and of
/// `k_rows` key rows in place (`wk`), in one launch with the bits of the three.
#[allow(clippy::too_many_arguments)]
pub fn split_q_gate_qk_norm(
    gpu: &Gpu,
    k: &Kernels,
    (q, gate, qg): (u64, u64, u64),
    keys: u64,
    (wq, wk): (u64, u64),
    (q_rows, k_rows): (usize, usize),
    d: usize,
    eps: f32,
) -> Result<(), GpuError> {
    let grid = ((q_rows + k_rows) as u32, norm_threads(d));
    let (d, q_rows) = (d as i32, q_rows as i32);
    launch::split_q_gate_qk_norm(gpu, k, grid, qg, q, gate, keys, wq, wk, d, eps, q_rows)
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
    pub(super) fn args(self) -> (i32, u64) {
        match self {
            Position::Host(p) => (p as i32, 0),
            Position::Device { at, .. } => (0, at),
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
    let (p0, p_at) = pos.into().args();
    let grid = ((tokens * heads) as u32, row_threads(rot / 2));
    let (heads, d, rot) = (heads as i32, d as i32, rot as i32);
    launch::rope(gpu, k, grid, x, inv_freq, heads, d, rot, p0, p_at)
}

/// [`rope`] of every sequence's query rows `q` `[rows, hq, d]` and key rows `keys`
/// `[rows, hkv, d]` at its own positions, in one launch per [`ATTN_SLOTS`] sequences.
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
        let grid = ((per * group.len()) as u32, row_threads(rot / 2));
        let (hq, hkv, d, rot, per) = (hq as i32, hkv as i32, d as i32, rot as i32, per as i32);
        launch::rope_seqs(gpu, k, grid, q, keys, inv_freq, hq, hkv, d, rot, slots, per)?;
    }
    Ok(())
}

/// RoPE of one sequence's `n` query rows `q` `[n, hq, d]` and key rows `keys` `[n, hkv, d]`,
/// row t's frequency j turned by `table[t · rot/2 + j] · inv_freq[j]` (M-RoPE rows of an image,
/// and text after one: [`crate::cpu::Rope::position_table`]).
#[allow(clippy::too_many_arguments)]
pub fn rope_table(
    gpu: &Gpu,
    k: &Kernels,
    q: u64,
    keys: u64,
    inv_freq: u64,
    table: u64,
    n: usize,
    (hq, hkv, d): (usize, usize, usize),
    rot: usize,
) -> Result<(), GpuError> {
    let grid = ((n * (hq + hkv)) as u32, row_threads(rot / 2));
    let (hq, hkv, d, rot) = (hq as i32, hkv as i32, d as i32, rot as i32);
    launch::rope_table(gpu, k, grid, q, keys, inv_freq, table, hq, hkv, d, rot)
}
