//! The chunked GDN prefill: the scan as matrix products over chunks (kernels/gdn_chunked.cu).

use super::*;

/// Whether a prefill's GDN scan runs chunked ([`gdn_chunked`]): as
/// [`GpuOptions::gdn_chunked`](crate::cuda::GpuOptions) says, off by default. On the H200 the
/// chunked kernels took 1.4 ms a 2,048-token 27B layer (scan 984 µs, prep 412 µs) where the
/// per-token scan takes about 0.9 ms: 8K prefill 6,661 against 6,865 tok/s (27B), 13,059
/// against 14,040 (35B-A3B; BENCHMARKS.md, 2026-12-03).
pub fn gdn_chunked_prefill(gpu: &Gpu) -> bool {
    gpu.options().gdn_chunked
}
/// Tokens of a chunk of the chunked GDN prefill (`GDN_CHUNK` in kernels/gdn_chunked.cu).
pub const GDN_CHUNK: usize = 64;

/// Floats of the chunked GDN prefill's scratch for a pass of `tokens` tokens over `hv` value
/// heads of `dk` × `dv` states (`GDN_CHUNK_SCRATCH` in kernels/gdn_chunked.cu, per chunk and
/// head).
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
    launch::gdn_chunk_prep(
        gpu,
        k,
        ((tokens.div_ceil(GDN_CHUNK) * hv) as u32, 256),
        mixed,
        g,
        beta,
        scratch,
        tokens as i32,
        hk as i32,
        hv as i32,
        tiled as i32,
    )?;
    launch::gdn_chunk_scan(
        gpu,
        k,
        (chunk_scan_blocks(hv, dv), 256),
        mixed,
        scratch,
        state,
        out,
        tokens as i32,
        hk as i32,
        hv as i32,
        tiled as i32,
    )
}
