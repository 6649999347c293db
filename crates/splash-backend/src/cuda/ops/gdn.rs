//! Gated DeltaNet: the causal conv, the gates, the recurrent scan (one sequence or a pass's
//! sequences) and the replay that rolls a verify pass back (kernels/gdn.cu).

use super::*;

/// Tokens per thread of the GDN conv with a `kernel`-tap filter (`conv_steps` in kernels/gdn.cu):
/// at least the history it reads, so that only the first chunk reads the conv state.
pub const fn conv_steps(kernel: usize) -> usize {
    if kernel - 1 > 4 {
        kernel - 1
    } else {
        4
    }
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
    launch::conv1d_silu(
        gpu,
        k,
        (conv_blocks(c, tokens, kernel)?, 128),
        x,
        y,
        state,
        w,
        tokens as i32,
        c as i32,
        kernel as i32,
    )
}

/// Blocks of 128 threads the GDN conv takes for one sequence of `tokens` rows of `c` channels
/// (a thread per channel and [`conv_steps`] tokens); its history is at most 8 rows.
pub(super) fn conv_blocks(c: usize, tokens: usize, kernel: usize) -> Result<u32, GpuError> {
    if kernel > 9 {
        return Err(GpuError::Unsupported(format!("conv kernel {kernel} > 9")));
    }
    Ok(blocks(c, 128) * blocks(tokens.max(1), conv_steps(kernel)))
}

/// Columns of a value head's state that one block of the GDN scan takes (`GDN_COLS` in
/// kernels/gdn.cu: 128 threads over `slices` lanes a column, `Kernels::gdn_slices`).
pub(crate) fn scan_columns(slices: usize) -> usize {
    128 / slices
}

/// Blocks the GDN scan takes for one sequence.
pub(super) fn scan_blocks(k: &Kernels, hv: usize) -> u32 {
    let dims = k.dims();
    (hv * dims.gdn_dv.div_ceil(scan_columns(k.gdn_slices()))) as u32
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

/// `parts` in launches of at most [`SEQ_SLOTS`]: each group's table and its longest
/// sequence.
pub(super) fn seq_groups(parts: &[SeqPart]) -> impl Iterator<Item = (usize, SeqSlots, usize)> + '_ {
    parts.chunks(SEQ_SLOTS).map(|group| {
        let mut slots = SeqSlots::default();
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
/// state, in one launch per [`SEQ_SLOTS`] sequences: the same bits as a launch each. A
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
        launch::conv1d_silu_seqs(
            gpu,
            k,
            (per * count as u32, 128),
            x,
            y,
            slots,
            w,
            per as i32,
            c as i32,
            kernel as i32,
        )?;
    }
    Ok(())
}

/// [`gdn_recurrent`] of every sequence of a pass, each on its own recurrent state, in one launch
/// per [`SEQ_SLOTS`] sequences: the same bits as a launch each. A recorded sequence saves
/// its recurrent state before the pass to `save[0]` and its gates `g`, `beta` to `save[1]`,
/// `save[2]`. With `raw_gates` = `(dt_bias, neg_a)`, `g` and `beta` are the raw `a` and `b`
/// and the kernel makes them gates as [`gdn_gates`] does (the same bits, a launch fewer).
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent_seqs(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    mixed: u64,
    (g, beta): (u64, u64),
    raw_gates: Option<(u64, u64)>,
    parts: &[SeqPart],
    hk: usize,
    hv: usize,
    tiled: bool,
) -> Result<(), GpuError> {
    let (dt_bias, neg_a) = raw_gates.unwrap_or((0, 0));
    let per = scan_blocks(k, hv);
    for (count, slots, _) in seq_groups(parts) {
        launch::gdn_recurrent_seqs(
            gpu,
            k,
            (per * count as u32, 128),
            mixed,
            g,
            beta,
            slots,
            out,
            hk as i32,
            hv as i32,
            tiled as i32,
            dt_bias,
            neg_a,
        )?;
    }
    Ok(())
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
/// states). Two launches per [`LAYER_SLOTS`] layers, whatever the model's depth; `mixed`
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
    for (group, at) in layers.chunks(LAYER_SLOTS).zip((0..).step_by(LAYER_SLOTS)) {
        let (mut conv, mut scan) = (LayerSlots::default(), LayerSlots::default());
        for (i, l) in group.iter().enumerate() {
            let out = mixed + ((at + i) * keep * c * 4) as u64;
            (conv.saved[i], conv.live[i]) = (l.conv_saved, l.conv);
            (conv.buf[0][i], conv.buf[1][i], conv.buf[2][i]) = (l.qkv, l.conv_w, out);
            (scan.saved[i], scan.live[i]) = (l.rec_saved, l.rec);
            (scan.buf[0][i], scan.buf[1][i], scan.buf[2][i]) = (out, l.g, l.beta);
        }
        let n = group.len() as u32;
        launch::conv1d_silu_replay(
            gpu,
            k,
            (per_conv * n, 128),
            conv,
            per_conv as i32,
            keep as i32,
            c as i32,
            kernel as i32,
        )?;
        launch::gdn_recurrent_replay(
            gpu,
            k,
            (per_scan * n, 128),
            scan,
            keep as i32,
            hk as i32,
            hv as i32,
            tiled as i32,
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
    launch::gdn_gates(
        gpu,
        k,
        (blocks(n, 256), 256),
        b,
        a,
        dt_bias,
        neg_a,
        hv as i32,
        n as i64,
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
    launch::gdn_recurrent(
        gpu,
        k,
        (scan_blocks(k, hv), 128),
        mixed,
        g,
        beta,
        state,
        out,
        tokens as i32,
        hk as i32,
        hv as i32,
        tiled as i32,
    )
}
