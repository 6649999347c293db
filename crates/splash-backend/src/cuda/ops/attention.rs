//! Gated attention: the KV cache appends, split decode attention and flash prefill, for one
//! sequence or the sequences of a pass (kernels/attention.cu).

use super::*;

/// Keys per chunk of the split attention by default (`ATTN_CHUNK` in kernels/attention.cu;
/// [`KernelOptions::attention_chunk`] sets another): small enough that a decode step at 1K of
/// context has a block per SM or so (1,024 made 48 blocks for the 27B's 24 heads, each walking
/// 1,024 keys).
pub const ATTN_CHUNK: usize = 256;
/// The fewest keys per chunk when `attention_prefill` splits a short pass's keys.
pub(super) const FLASH_MIN_CHUNK: usize = 1024;
/// Query rows (of one sequence) up to which attention splits the keys into chunks: decode
/// rows, verify blocks and draft blocks, whose few queries would leave most of the GPU idle
/// over a long context. Longer passes (prefill) have enough queries to fill it.
pub(super) const SPLIT_ATTENTION_ROWS: usize = 32;

pub(super) fn kv_code(f: KvFormat) -> i32 {
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
    let (p0, p_at) = pos.into().args();
    let (grid, fmt) = (((tokens * heads) as u32, 128), kv_code(format));
    let (d, heads) = (d as i32, heads as i32);
    launch::kv_append(gpu, k, grid, x, cache, scales, fmt, d, heads, p0, p_at)
}

/// Query heads of one KV head that a block of decode attention takes at once in a pass of `rows`
/// query rows (per sequence): the largest divisor of the group size `hq / hkv` up to `most`
/// (`ATTN_HEADS_MAX` in kernels/attention.cu, [`KernelOptions::attention_heads`]), so that each
/// key a block loads serves that many heads; one for a one-row pass, whose few blocks would
/// otherwise leave most SMs idle (measured: BENCHMARKS.md, 2026-12-06, twentieth session).
pub(crate) fn attention_heads(rows: usize, hq: usize, hkv: usize, most: usize) -> usize {
    if rows == 1 {
        return 1;
    }
    let group = hq / hkv;
    (1..=most)
        .rev()
        .find(|h| group.is_multiple_of(*h))
        .unwrap_or(1)
}

/// The split-attention kernel of `family` (`attention_part` or `attention_part_seqs`) for
/// `heads` heads a block: the one-head kernel keeps its register bound (more blocks an SM).
pub(crate) fn split_kernel(family: &'static str, heads: usize) -> &'static str {
    match (family, heads) {
        ("attention_part", 1) => "attention_part",
        ("attention_part", _) => "attention_part_grouped",
        ("attention_part_seqs", 1) => "attention_part_seqs",
        _ => "attention_part_seqs_grouped",
    }
}

/// Most query heads a block of the staged split attention takes (`STAGED_HEADS`).
pub(crate) const STAGED_HEADS: usize = 8;

/// Whether the split attention over these caches takes the staged kernels
/// (`attention_part_staged`, `attention_part_seqs_staged`): int8 caches whose rows the kernels
/// copy 16 bytes at a time (aligned bases, a head dim that is a multiple of 128, up to 256). It
/// depends on the caches alone, never on the pass, so decode and verify rows keep equal bits;
/// `SPLASH_STAGED_ATTENTION=0` keeps the warp-per-key kernels.
pub(crate) fn staged_attention(
    gpu: &Gpu,
    k: &Kernels,
    format: KvFormat,
    caches: impl IntoIterator<Item = u64>,
) -> bool {
    let d = k.dims().head_dim;
    gpu.options().staged_attention
        && format == KvFormat::Int8
        && d.is_multiple_of(128)
        && d <= 256
        && caches.into_iter().all(|c| c.is_multiple_of(16))
}

/// Query heads of one KV head a staged block takes, for `queries` (row, head) pairs over
/// `chunks` chunks: the most (a divisor of the group up to [`STAGED_HEADS`]) that still leave
/// one and a half blocks per SM, since each block walks its chunk's keys in turn; one head when
/// even that leaves too few. A head's bits do not depend on it.
pub(crate) fn staged_heads(
    queries: usize,
    chunks: usize,
    hq: usize,
    hkv: usize,
    sms: usize,
) -> usize {
    let group = hq / hkv;
    (1..=STAGED_HEADS.min(group))
        .rev()
        .filter(|h| group.is_multiple_of(*h))
        .find(|h| queries / h * chunks >= 3 * sms / 2)
        .unwrap_or(1)
}

/// Chunks of `chunk` keys ([`KernelOptions::attention_chunk`]) the split attention
/// (`attention_part`) gives each query row of a pass of `tokens` at `pos`: up to the furthest
/// key of any query (a draft block sees the whole block), and with a window at most the chunks
/// the window and the pass's keys span (the kernel starts at the chunk of the first query's
/// first key).
pub fn split_chunks(pos: Position, tokens: usize, mask: KeyMask, chunk: usize) -> usize {
    let reach = if mask.block > 0 { mask.block } else { tokens };
    let span = match pos {
        Position::Host(p) => p + reach,
        Position::Device { limit, .. } => limit,
    };
    let chunks = span.div_ceil(chunk).max(1);
    match mask.window {
        Some(w) => chunks.min((w + reach).div_ceil(chunk) + 1),
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
    let (p0, p_at) = pos.args();
    let (fmt, hq_i, hkv_i) = (kv_code(format), hq as i32, hkv as i32);
    let (block, window) = (mask.block as i32, mask.window.unwrap_or(0) as i32);
    let (kc, ks, vc, vs) = (keys.0, keys.1, values.0, values.1);
    let heads = attention_heads(tokens, hq, hkv, k.options().attention_heads());
    if tokens <= SPLIT_ATTENTION_ROWS {
        let chunks = split_chunks(pos, tokens, mask, k.options().attention_chunk());
        let rows = tokens * hq;
        let part = gpu.uninit::<f32>(rows * chunks * (k.dims().head_dim + 2))?;
        let pp = ptr(gpu, &part, 0);
        if staged_attention(gpu, k, format, [kc, vc]) {
            let heads = staged_heads(rows, chunks, hq, hkv, gpu.sms());
            let grid = ((rows / heads * chunks) as u32, 128);
            let (n, hb) = (chunks as i32, heads as i32);
            launch::attention_part_staged(
                gpu, k, grid, q, kc, ks, vc, vs, pp, hq_i, hkv_i, p0, p_at, scale, block, window,
                n, hb,
            )?;
            return launch::attention_combine(gpu, k, (rows as u32, 128), pp, out, n);
        }
        let grid = ((rows / heads * chunks) as u32, 128);
        launch::attention_part(
            gpu,
            k,
            split_kernel("attention_part", heads),
            grid,
            q,
            kc,
            ks,
            vc,
            vs,
            pp,
            fmt,
            hq_i,
            hkv_i,
            p0,
            p_at,
            scale,
            block,
            window,
            chunks as i32,
            heads as i32,
        )?;
        return launch::attention_combine(gpu, k, (rows as u32, 128), pp, out, chunks as i32);
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
        let pp = part.as_ref().map_or(0, |p| ptr(gpu, p, 0));
        // The int8 rows copied a tile ahead (16-byte copies: the caches' rows must be aligned).
        let aligned = (keys.0 | values.0).is_multiple_of(16);
        let kernel = if format == KvFormat::Int8 && aligned && gpu.options().flash_async {
            "attention_prefill_async"
        } else {
            "attention_prefill"
        };
        let grid = ((tiles * hq * nchunks) as u32, 128);
        let (t, chunk, n) = (tokens as i32, chunk as i32, nchunks as i32);
        launch::attention_prefill(
            gpu, k, kernel, grid, q, kc, ks, vc, vs, out, fmt, hq_i, hkv_i, p0, p_at, scale, block,
            window, t, chunk, n, pp,
        )?;
        if nchunks > 1 {
            launch::attention_combine(gpu, k, (rows as u32, 128), pp, out, n)?;
        }
        return Ok(());
    }
    let (grid, hb) = (((tokens * hq / heads) as u32, 128), heads as i32);
    launch::attention(
        gpu, k, grid, q, kc, ks, vc, vs, out, fmt, hq_i, hkv_i, p0, p_at, scale, block, window, hb,
    )
}

/// Query tokens per block of `attention_prefill` (16 per warp, `FA_WARPS` = 4 warps).
pub(super) const FLASH_QUERY_ROWS: usize = 64;
/// Keys per shared-memory tile of `attention_prefill` (`FA_KEYS`).
pub(super) const FLASH_KEYS: usize = 32;
/// Blocks a prefill attention launch should have: two per SM of an H200 (132).
pub(super) const FLASH_MIN_BLOCKS: usize = 264;

/// How `attention_prefill` splits the keys `0..span` for `blocks` (query tile, head) pairs:
/// (keys per chunk, chunks). One chunk when the pairs fill the GPU; otherwise enough chunks
/// of at least [`FLASH_MIN_CHUNK`] keys to make [`FLASH_MIN_BLOCKS`] blocks. It depends only on the
/// pass's shape, so a pass gives the same result every time.
pub(super) fn flash_split(blocks: usize, span: usize) -> (usize, usize) {
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
pub(super) fn flash_prefill(gpu: &Gpu, k: &Kernels, format: KvFormat) -> bool {
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

/// `parts` in launches of at most [`ATTN_SLOTS`]: each group, its table and its longest
/// sequence.
pub(super) fn attn_groups(
    parts: &[AttnPart],
) -> impl Iterator<Item = (&[AttnPart], AttnSlots, usize)> + '_ {
    parts.chunks(ATTN_SLOTS).map(|group| {
        let mut s = AttnSlots::default();
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

/// [`kv_append`] of every sequence's key and value rows (`keys`, `values` `[rows, hkv, d]`) to
/// its own caches at its positions, in one launch per [`ATTN_SLOTS`] sequences.
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
        let (grid, fmt) = (((per * group.len()) as u32, 128), kv_code(format));
        let (d, hkv, per) = (d as i32, hkv as i32, per as i32);
        launch::kv_append_seqs(gpu, k, grid, keys, values, fmt, d, hkv, slots, per)?;
    }
    Ok(())
}

/// Causal [`attention`] of every sequence's query rows (`q`, `out` `[rows, hq, HEAD_DIM]`) over
/// its own caches: for passes of up to 32 tokens a sequence, one split-attention launch and one
/// merge per [`ATTN_SLOTS`] sequences, each row with the bits of its sequence's own
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
            .div_ceil(k.options().attention_chunk())
            .max(1);
        let rows = longest * hq;
        let part = gpu.uninit::<f32>(group.len() * rows * chunks * (d + 2))?;
        let pp = ptr(gpu, &part, 0);
        let (fmt, hq_i, hkv_i) = (kv_code(format), hq as i32, hkv as i32);
        let (rows_i, n) = (rows as i32, chunks as i32);
        let caches = group.iter().flat_map(|p| [p.keys.0, p.values.0]);
        if staged_attention(gpu, k, format, caches) {
            let heads = staged_heads(group.len() * rows, chunks, hq, hkv, gpu.sms());
            let grid = ((group.len() * rows / heads * chunks) as u32, 128);
            let hb = heads as i32;
            launch::attention_part_seqs_staged(
                gpu, k, grid, q, pp, hq_i, hkv_i, scale, slots, rows_i, n, hb,
            )?;
        } else {
            let heads = attention_heads(longest, hq, hkv, k.options().attention_heads());
            let grid = ((group.len() * rows / heads * chunks) as u32, 128);
            let hb = heads as i32;
            let kernel = split_kernel("attention_part_seqs", heads);
            launch::attention_part_seqs(
                gpu, k, kernel, grid, q, pp, fmt, hq_i, hkv_i, scale, slots, rows_i, n, hb,
            )?;
        }
        let grid = ((group.len() * rows) as u32, 128);
        launch::attention_combine_seqs(gpu, k, grid, pp, out, hq_i, slots, rows_i, n)?;
    }
    Ok(())
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

    /// A staged block takes the whole group when the chunks leave enough blocks, fewer heads
    /// over a shorter context, and one head when even that is too few (132 SMs).
    #[test]
    fn a_staged_block_takes_as_many_heads_as_the_gpu_allows() {
        // (queries, chunks, (hq, hkv)) → heads: the 27B (groups of 6), the 35B-A3B (8).
        for (queries, chunks, (hq, hkv), heads) in [
            (24, 129, (24, 4), 6),
            (24, 33, (24, 4), 3),
            (24, 5, (24, 4), 1),
            (16 * 24, 5, (24, 4), 6),
            (16, 129, (16, 2), 8),
            (16, 17, (16, 2), 1),
            (64, 129, (64, 4), 8),
        ] {
            assert_eq!(
                staged_heads(queries, chunks, hq, hkv, 132),
                heads,
                "{queries} queries, {chunks} chunks, hq {hq}, hkv {hkv}"
            );
        }
    }

    #[test]
    fn a_block_takes_the_most_heads_of_a_group_up_to_the_limit() {
        // (hq, hkv) of the 27B (groups of 6), the 35B-A3B (8), a draft (4) and small fixtures.
        for ((hq, hkv), heads) in [
            ((24, 4), 3),
            ((16, 2), 4),
            ((32, 8), 4),
            ((2, 1), 2),
            ((5, 5), 1),
            ((10, 2), 1),
        ] {
            assert_eq!(attention_heads(16, hq, hkv, 4), heads, "hq {hq}, hkv {hkv}");
            assert_eq!(attention_heads(2, hq, hkv, 4), heads, "hq {hq}, hkv {hkv}");
            assert_eq!(attention_heads(16, hq, hkv, 1), 1);
            assert_eq!(
                attention_heads(1, hq, hkv, 4),
                1,
                "one row: a block per head"
            );
        }
        assert_eq!(attention_heads(16, 16, 2, 2), 2);
    }
}
