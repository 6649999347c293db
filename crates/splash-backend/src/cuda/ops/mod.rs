//! Launch wrappers, one per kernel, named after the CPU op they mirror: a file per kernel family
//! of `kernels/`, and here what several share (block counts, converted activations, switches).
//! Pointers are device addresses from [`super::ptr`]; shapes follow the CPU ops' docs.

use std::cell::OnceCell;

use cudarc::driver::CudaSlice;

use super::signatures::launch;
use super::{
    ptr, weights, AttnSlots, DeviceWeight, Gpu, GpuError, GpuFormat, GpuOptions, Kernels,
    LayerSlots, ProductGroup, SeqSlots, TiledGemv, ATTN_SLOTS, LAYER_SLOTS, PRODUCT_GROUP_MAX,
    SEQ_SLOTS,
};
use crate::cpu::KvFormat;

mod attention;
mod dflash;
mod gdn;
mod gdn_chunked;
mod gemv;
mod gemv_tc;
mod moe;
mod norm;
mod rope;
mod sampling;
mod vision;

pub use attention::*;
pub use dflash::*;
pub use gdn::*;
pub use gdn_chunked::*;
pub use gemv::*;
use gemv_tc::*;
pub use moe::*;
pub use norm::*;
pub use rope::*;
pub use sampling::*;
pub use vision::*;

/// Blocks of `per` that cover `n`.
fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// Threads for a row-wise kernel over rows of `d` values: a multiple of 32, at most 256.
fn row_threads(d: usize) -> u32 {
    (d.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Activations as the tensor-core GEMV reads them: f16 in its k order, one power-of-two scale
/// per 256 values.
type F16Rows = (CudaSlice<u16>, CudaSlice<f32>);
/// Activations as the dp4a GEMV reads them: int8 codes, their scale and their sum per 32 values.
type Int8Rows = (CudaSlice<i8>, CudaSlice<f32>, CudaSlice<f32>);

/// Activations as the int8 tensor-core GEMV reads them: int8 codes in its k order, a scale per
/// 256 values and the codes' sum per 32 (`quantize_q8_blocks`).
type Int8Blocks = (CudaSlice<i8>, CudaSlice<f32>, CudaSlice<i16>);

/// Buffers of [`Int8Blocks`] for `n` values.
fn int8_blocks(gpu: &Gpu, n: usize) -> Result<Int8Blocks, GpuError> {
    Ok((
        gpu.uninit::<i8>(n)?,
        gpu.uninit::<f32>(n / 256)?,
        gpu.uninit::<i16>(n / 32)?,
    ))
}

/// Buffers of [`Int8Rows`] for `n` values (`quantize_q8`'s outputs).
fn int8_rows(gpu: &Gpu, n: usize) -> Result<Int8Rows, GpuError> {
    Ok((
        gpu.uninit::<i8>(n)?,
        gpu.uninit::<f32>(n / 32)?,
        gpu.uninit::<f32>(n / 32)?,
    ))
}

/// `tokens` rows of `kdim` f32 activations at `x`, the input of one or more products. Each
/// GEMV family reads them converted (f16 for the tensor-core GEMV, int8 for the dp4a one,
/// bf16 for cuBLAS), a launch each; a conversion is made at the first product that needs it
/// and reused by the others, e.g. an attention layer's q, k and v projections, or a MoE
/// layer's shared and routed experts. Conversions are exact functions of `x`, so reuse
/// changes no bits; the rows at `x` must not change while this lives.
pub struct Activations {
    x: u64,
    tokens: usize,
    kdim: usize,
    f16: OnceCell<F16Rows>,
    int8: OnceCell<Int8Rows>,
    int8_blocks: OnceCell<Int8Blocks>,
    bf16: OnceCell<CudaSlice<u16>>,
}

impl Activations {
    /// The activations `[tokens, kdim]` at `x`, not converted yet.
    pub fn new(x: u64, tokens: usize, kdim: usize) -> Self {
        Self {
            x,
            tokens,
            kdim,
            f16: OnceCell::new(),
            int8: OnceCell::new(),
            int8_blocks: OnceCell::new(),
            bf16: OnceCell::new(),
        }
    }

    /// The activations at `x` whose f16 conversion a kernel has already written.
    fn with_f16(x: u64, tokens: usize, kdim: usize, f16: F16Rows) -> Self {
        let a = Self::new(x, tokens, kdim);
        let _ = a.f16.set(f16);
        a
    }

    /// The activations at `x` whose int8 blocks a kernel has already written.
    fn with_int8_blocks(x: u64, tokens: usize, kdim: usize, int8_blocks: Int8Blocks) -> Self {
        let a = Self::new(x, tokens, kdim);
        let _ = a.int8_blocks.set(int8_blocks);
        a
    }

    /// The activations at `x` whose bf16 conversion a kernel has already written.
    fn with_bf16(x: u64, tokens: usize, kdim: usize, bf16: CudaSlice<u16>) -> Self {
        let a = Self::new(x, tokens, kdim);
        let _ = a.bf16.set(bf16);
        a
    }

    /// The device address of the f32 rows.
    pub fn rows(&self) -> u64 {
        self.x
    }

    /// Rows (tokens).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// `x` as the tensor-core GEMV reads it: f16 in its k order, one power-of-two scale per
    /// 256 values (`to_f16_tc`).
    fn f16(&self, gpu: &Gpu, k: &Kernels) -> Result<&F16Rows, GpuError> {
        converted(&self.f16, || {
            convert_f16_tc(gpu, k, TcInput::Rows(self.x), self.tokens, self.kdim)
        })
    }

    /// `x` as the dp4a GEMV reads it: int8 codes, scales and sums per 32 values.
    fn int8(&self, gpu: &Gpu, k: &Kernels) -> Result<&Int8Rows, GpuError> {
        converted(&self.int8, || {
            let blocks32 = self.tokens * self.kdim / 32;
            let rows = int8_rows(gpu, self.tokens * self.kdim)?;
            let (xq, xd, xs) = int8_at(gpu, &rows, 0);
            let grid = (blocks(blocks32 * 32, 256), 256);
            launch::quantize_q8(gpu, k, grid, self.x, xq, xd, xs, blocks32 as i64)?;
            Ok(rows)
        })
    }

    /// `x` as the int8 tensor-core GEMV reads it (`quantize_q8_blocks`).
    fn int8_blocks(&self, gpu: &Gpu, k: &Kernels) -> Result<&Int8Blocks, GpuError> {
        converted(&self.int8_blocks, || {
            convert_int8_blocks(gpu, k, TcInput::Rows(self.x), self.tokens, self.kdim)
        })
    }

    /// `x` in bf16, for cuBLAS.
    fn bf16(&self, gpu: &Gpu, k: &Kernels) -> Result<&CudaSlice<u16>, GpuError> {
        converted(&self.bf16, || {
            let n = self.tokens * self.kdim;
            let xb = gpu.uninit::<u16>(n)?;
            launch::to_bf16(
                gpu,
                k,
                (blocks(n.div_ceil(4), 256), 256),
                self.x,
                super::ptr(gpu, &xb, 0),
                n as i64,
            )?;
            Ok(xb)
        })
    }

    /// Checks that `w` multiplies these activations.
    fn check(&self, w: &DeviceWeight) {
        assert_eq!(
            w.cols, self.kdim,
            "a weight of {} columns times activations of {}",
            w.cols, self.kdim
        );
    }
}

/// The conversion in `cell`, made by `make` the first time.
fn converted<T>(
    cell: &OnceCell<T>,
    make: impl FnOnce() -> Result<T, GpuError>,
) -> Result<&T, GpuError> {
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let c = make()?;
    Ok(cell.get_or_init(|| c))
}
