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
        Ok(DeviceWeight {
            format,
            rows,
            cols,
            row_bytes,
            data: self.upload(w.raw_bytes())?,
            groups,
        })
    }
}
