//! The DFlash2 draft's grouped dynamic conv (kernels/dflash.cu).

use super::*;

/// DFlash2's grouped dynamic causal conv (`cpu::grouped_dynamic_conv`) of `x` `[t, h]` into
/// `out` (not `x`): taps `base` `[kernel, h]` plus the dynamic kernel, row `i` of which starts
/// at `dynamic + i·stride` values and holds `[kernel, h/group]`.
#[allow(clippy::too_many_arguments)]
pub fn grouped_dynamic_conv(
    gpu: &Gpu,
    k: &Kernels,
    out: u64,
    x: u64,
    dynamic: u64,
    stride: usize,
    base: u64,
    t: usize,
    h: usize,
    kernel: usize,
    group: usize,
) -> Result<(), GpuError> {
    assert!(out != x, "grouped_dynamic_conv reads x while it writes out");
    launch::grouped_dynamic_conv(
        gpu,
        k,
        (blocks(t * h, 256), 256),
        x,
        dynamic,
        stride as i64,
        base,
        out,
        t as i32,
        h as i32,
        kernel as i32,
        group as i32,
    )
}
