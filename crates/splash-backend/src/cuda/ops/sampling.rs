//! The best k entries of each row of logits, on the device (kernels/sampling.cu).

use super::*;

/// The most candidates [`top_k_rows`] keeps per row (`TOPK_MAX` in kernels/sampling.cu).
pub const TOP_K_MAX: usize = 32;

/// Values of a row one block of [`top_k_rows`]'s first stage takes (`TOPK_CHUNK`).
pub(super) const TOP_K_CHUNK: usize = 256 * 8;

/// The `k` best entries of each of `rows` rows of `logits` `[rows, v]` (`k` ≤ [`TOP_K_MAX`],
/// ≤ `v`), after `v·mult` and, with a `cap`, `cap·tanh(v/cap)`: ids and values `[rows, k]`,
/// best first, ties to the lower id (as `cpu::top_k`).
#[allow(clippy::too_many_arguments)]
pub fn top_k_rows(
    gpu: &Gpu,
    k: &Kernels,
    logits: u64,
    rows: usize,
    v: usize,
    top: usize,
    mult: f32,
    cap: Option<f32>,
) -> Result<(CudaSlice<i32>, CudaSlice<f32>), GpuError> {
    assert!(
        (1..=TOP_K_MAX.min(v)).contains(&top),
        "top_k_rows keeps 1..={} of {v}, not {top}",
        TOP_K_MAX
    );
    let ids = gpu.uninit::<i32>(rows * top)?;
    let vals = gpu.uninit::<f32>(rows * top)?;
    // The first stage's blocks, each over TOP_K_CHUNK values of a row; with one a row it
    // writes the result, otherwise its candidates, which the second stage merges.
    let parts = v.div_ceil(TOP_K_CHUNK);
    let staged = if parts > 1 {
        Some((
            gpu.uninit::<i32>(rows * parts * top)?,
            gpu.uninit::<f32>(rows * parts * top)?,
        ))
    } else {
        None
    };
    let (first_ids, first_vals) = staged.as_ref().map_or((&ids, &vals), |(i, v)| (i, v));
    launch::top_k_part(
        gpu,
        k,
        ((rows * parts) as u32, 256),
        logits,
        v as i32,
        top as i32,
        mult,
        cap.unwrap_or(0.0),
        parts as i32,
        ptr(gpu, first_ids, 0),
        ptr(gpu, first_vals, 0),
    )?;
    if let Some((part_ids, part_vals)) = &staged {
        launch::top_k_merge(
            gpu,
            k,
            (rows as u32, 256),
            ptr(gpu, part_ids, 0),
            ptr(gpu, part_vals, 0),
            (parts * top) as i32,
            top as i32,
            ptr(gpu, &ids, 0),
            ptr(gpu, &vals, 0),
        )?;
    }
    Ok((ids, vals))
}
