//! Weights on the device, in their stored format (bytes copied as they are on disk).

use cudarc::driver::CudaSlice;

use super::{Gpu, GpuError};
use crate::ggml::GgmlType;
use crate::{DType, Weight};

/// A stored weight format the CUDA kernels decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuFormat {
    F32,
    F16,
    Bf16,
    Ggml(GgmlType),
    Affine4,
    Affine8,
}

impl GpuFormat {
    /// The format of `dtype`, or why the CUDA backend cannot use it yet.
    pub fn of(dtype: DType) -> Result<Self, GpuError> {
        Ok(match dtype {
            DType::F32 => Self::F32,
            DType::F16 => Self::F16,
            DType::BF16 => Self::Bf16,
            DType::Affine { bits: 4 } => Self::Affine4,
            DType::Affine { bits: 8 } => Self::Affine8,
            DType::Ggml(
                t @ (GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS),
            ) => Self::Ggml(t),
            DType::Ggml(GgmlType::F32) => Self::F32,
            DType::Ggml(GgmlType::F16) => Self::F16,
            DType::Ggml(GgmlType::BF16) => Self::Bf16,
            other => {
                return Err(GpuError::Unsupported(format!(
                    "weights of type {other} are not supported by the CUDA backend yet; use --device cpu or another quantisation"
                )))
            }
        })
    }

    /// The suffix of this format's kernels (`gemv_<suffix>`, `dequant_{bf16,f32}_<suffix>`).
    pub(crate) fn kernel_suffix(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Affine4 => "affine4",
            Self::Affine8 => "affine8",
            Self::Ggml(t) => match t {
                GgmlType::Q4_0 => "q4_0",
                GgmlType::Q4_1 => "q4_1",
                GgmlType::Q5_0 => "q5_0",
                GgmlType::Q5_1 => "q5_1",
                GgmlType::Q8_0 => "q8_0",
                GgmlType::Q2_K => "q2_k",
                GgmlType::Q3_K => "q3_k",
                GgmlType::Q4_K => "q4_k",
                GgmlType::Q5_K => "q5_k",
                GgmlType::Q6_K => "q6_k",
                GgmlType::IQ4_NL => "iq4_nl",
                GgmlType::IQ4_XS => "iq4_xs",
                _ => unreachable!("GpuFormat::of admits no other GGML type"),
            },
        }
    }
}

/// A matrix `[rows, cols]` (experts stacked along rows) on the device.
pub struct DeviceWeight {
    pub(crate) format: GpuFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) data: CudaSlice<u8>,
    /// Affine group scales and biases as f32 `[rows, cols/group]`, and the group size.
    pub(crate) groups: Option<(CudaSlice<f32>, CudaSlice<f32>, usize)>,
}

impl DeviceWeight {
    /// Rows of the matrix view.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (the input width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The stored format.
    pub fn format(&self) -> GpuFormat {
        self.format
    }

    /// The device address of row 0 (for tables of expert weights, see `matmul_experts`).
    pub fn device_ptr(&self, gpu: &Gpu) -> u64 {
        super::ptr(gpu, &self.data, 0)
    }

    /// Bytes between consecutive rows.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
            + self
                .groups
                .as_ref()
                .map_or(0, |(s, b, _)| 4 * (s.len() + b.len()))
    }
}

impl Gpu {
    /// Copies `w` to the device in its stored format (affine scales and biases as f32).
    pub fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight, GpuError> {
        let format = GpuFormat::of(w.dtype())?;
        let (rows, cols) = (w.rows(), w.cols());
        // Quantised rows are whole 32-value sub-blocks; float rows may end in a partial one
        // but must keep 16-byte alignment of the activations they multiply.
        let float = matches!(format, GpuFormat::F32 | GpuFormat::F16 | GpuFormat::Bf16);
        if !cols.is_multiple_of(if float { 4 } else { 32 }) {
            return Err(GpuError::Unsupported(format!(
                "the CUDA kernels need rows of a multiple of {} values (weight {:?} of {format:?})",
                if float { 4 } else { 32 },
                w.shape()
            )));
        }
        let row_bytes = w
            .dtype()
            .row_bytes(cols)
            .expect("validated when the weight was made");
        let groups = match w.affine_parts() {
            Some((_, group, _, scales, biases)) => {
                if group < 32 || !group.is_multiple_of(32) {
                    return Err(GpuError::Unsupported(format!(
                        "affine group size {group} is not supported by the CUDA kernels (multiples of 32)"
                    )));
                }
                Some((
                    self.upload(&scales.to_f32_vec())?,
                    self.upload(&biases.to_f32_vec())?,
                    group,
                ))
            }
            None => None,
        };
        let data = match format {
            GpuFormat::Ggml(t) if is_tiled(format) => {
                self.upload(&tiled(t, w.raw_bytes(), rows, cols / 256))?
            }
            _ => self.upload(w.raw_bytes())?,
        };
        Ok(DeviceWeight {
            format,
            rows,
            cols,
            row_bytes,
            data,
            groups,
        })
    }
}

/// Whether `format` is stored tiled on the device (see [`tiled`]): the formats of the
/// tensor-core GEMV (the 256-value k-quants of 4-bit checkpoints). Their row ranges must start
/// at a multiple of 16 rows.
pub fn is_tiled(format: GpuFormat) -> bool {
    matches!(format, GpuFormat::Ggml(GgmlType::Q4_K | GgmlType::Q6_K))
}

/// Q4_K or Q6_K rows as the kernels read them (`tile_segment` in kernels/quant.cuh): rows in
/// tiles of 16 (the last padded with zero rows), and each 256-value block of a tile one contiguous
/// segment holding that block of its 16 rows, arranged so that each load instruction of the
/// tensor-core GEMV reads 512 contiguous bytes (lane 4g + q: row g or g + 8, code bytes
/// 64·(q >> 1) + 16·(q & 1) of a part). Stored row by row, a warp's loads touched 16 rows at
/// once and the L1 cache, not memory, bounded the GEMV. A tile keeps 16 rows' bytes, so row
/// `n` still starts `n · row_bytes` in (for whole tiles).
///
/// Q4_K segment (16 × 144 bytes): the 16-byte headers (d, dmin, scales), then parts
/// `2·half + c` of the code bytes (c = 0: bytes 64·(q>>1) + 16·(q&1); c = 1: the same + 32).
/// Q6_K segment (16 × 210 bytes): parts `3·half + k` (k = 0, 1: low bits at the same places
/// as Q4_K's codes; k = 2: high bits 32·(q>>1) + 16·(q&1)), then the 16 rows' 16 scales,
/// then their d.
pub(super) fn tiled(t: GgmlType, raw: &[u8], rows: usize, blocks: usize) -> Vec<u8> {
    let q4k = t == GgmlType::Q4_K;
    let block = if q4k { 144 } else { 210 };
    let segment = 16 * block;
    // Where the code parts start in a segment (Q4_K: after the headers).
    let parts = if q4k { 256 } else { 0 };
    let mut out = vec![0u8; rows.div_ceil(16) * blocks * segment];
    for (n, row) in raw.chunks_exact(blocks * block).enumerate() {
        let (tile, r) = (n / 16, n % 16);
        let (g, half) = (r % 8, r / 8);
        for (b, src) in row.chunks_exact(block).enumerate() {
            let seg = &mut out[(tile * blocks + b) * segment..][..segment];
            let mut put = |part: usize, q: usize, from: usize| {
                let at = parts + part * 512 + 16 * (4 * g + q);
                seg[at..at + 16].copy_from_slice(&src[from..from + 16]);
            };
            for q in 0..4 {
                let codes = 64 * (q >> 1) + 16 * (q & 1);
                if q4k {
                    put(2 * half, q, 16 + codes);
                    put(2 * half + 1, q, 16 + codes + 32);
                } else {
                    put(3 * half, q, codes);
                    put(3 * half + 1, q, codes + 32);
                    put(3 * half + 2, q, 128 + 32 * (q >> 1) + 16 * (q & 1));
                }
            }
            if q4k {
                seg[16 * r..16 * r + 16].copy_from_slice(&src[..16]);
            } else {
                seg[3072 + 16 * r..3072 + 16 * r + 16].copy_from_slice(&src[192..208]);
                seg[3328 + 2 * r..3328 + 2 * r + 2].copy_from_slice(&src[208..210]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stored byte lands exactly once, and the padding of the last tile stays zero.
    #[test]
    fn tiles_hold_every_byte_once() {
        for (t, block) in [(GgmlType::Q4_K, 144), (GgmlType::Q6_K, 210)] {
            let (rows, blocks) = (19, 3);
            let raw: Vec<u8> = (0..rows * blocks * block)
                .map(|i| (i % 251) as u8 + 1)
                .collect();
            let out = tiled(t, &raw, rows, blocks);
            assert_eq!(out.len(), 32 * blocks * block);
            let mut want: Vec<u8> = raw.clone();
            want.resize(out.len(), 0);
            let (mut a, mut b) = (out.clone(), want);
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{t}: not a permutation of the stored bytes and zeros");
        }
    }
}
