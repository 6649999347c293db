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
    gpu.launch(
        k,
        "grouped_dynamic_conv",
        blocks(t * h, 256),
        256,
        &[
            Arg::Ptr(x),
            Arg::Ptr(dynamic),
            Arg::I64(stride as i64),
            Arg::Ptr(base),
            Arg::Ptr(out),
            Arg::I32(t as i32),
            Arg::I32(h as i32),
            Arg::I32(kernel as i32),
            Arg::I32(group as i32),
        ],
    )
}
