//! Weights in their stored dtype, borrowed from a memory map or owned.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use half::f16;

use crate::ggml::{self, GgmlType};

/// Element type of a stored weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Affine-quantised codes of `bits` bits, packed little-endian into u32 words (MLX):
    /// `w = scale · q + bias` with one scale and bias per group of columns.
    Affine {
        bits: u32,
    },
    /// GGML blocks (GGUF files): each row is `cols / block_elems` self-contained blocks.
    Ggml(GgmlType),
}

impl DType {
    /// Size of one element in bytes (float types; 1 for packed types, used for alignment).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Affine { .. } | DType::Ggml(_) => 1,
        }
    }

    /// Bytes of one row of `cols` elements, or `None` when `cols` does not fill whole
    /// blocks (GGML) or whole words (affine).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => Some(cols * self.size()),
            DType::Affine { bits } => (cols * bits as usize)
                .is_multiple_of(32)
                .then(|| cols * bits as usize / 8),
            DType::Ggml(t) => cols
                .is_multiple_of(t.block_elems())
                .then(|| t.row_bytes(cols)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("F32"),
            DType::F16 => f.write_str("F16"),
            DType::BF16 => f.write_str("BF16"),
            DType::Affine { bits } => write!(f, "affine {bits}-bit"),
            DType::Ggml(t) => write!(f, "GGML {t}"),
        }
    }
}

/// Errors raised when a weight does not have the shape or layout an op needs.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("weight has shape {actual:?}, expected {expected:?}")]
    Shape {
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("weight byte length {actual} does not match shape {shape:?} of dtype {dtype} ({expected} bytes)")]
    Length {
        shape: Vec<usize>,
        dtype: DType,
        expected: usize,
        actual: usize,
    },
    #[error("rows of {cols} elements do not fill whole blocks of dtype {dtype}")]
    Blocks { dtype: DType, cols: usize },
}

/// A shared, immutable byte range: part of a memory-mapped file or an owned buffer.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl HostBytes {
    /// Bytes `range` of `owner` (for example a memory map shared by all tensors of a file).
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Self {
        assert!(
            range.end <= (*owner).as_ref().len(),
            "byte range out of bounds"
        );
        Self { owner, range }
    }

    /// Bytes owned by this buffer alone.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Self::new(Arc::new(v), 0..len)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    /// A sub-range of these bytes, sharing the owner.
    pub fn slice(&self, r: Range<usize>) -> Self {
        assert!(r.end <= self.range.len());
        Self {
            owner: self.owner.clone(),
            range: self.range.start + r.start..self.range.start + r.end,
        }
    }

    /// These bytes, copied to a fresh allocation only when their address is not a multiple of
    /// `align` (safetensors does not promise aligned offsets; real files almost always are).
    pub fn aligned(self, align: usize) -> Self {
        if (self.as_slice().as_ptr() as usize).is_multiple_of(align) {
            return self;
        }
        // Vec<u64> guarantees 8-byte alignment; view it as bytes.
        let bytes = self.as_slice();
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        let len = bytes.len();
        Self::new(Arc::new(AlignedBytes(words)), 0..len)
    }
}

struct AlignedBytes(Vec<u64>);

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// A weight tensor in its stored dtype. Matrices are `[rows, cols]` with `y = W x`
/// (PyTorch's `[out, in]`); leading axes (experts) may be sliced off with [`Weight::index`].
#[derive(Clone)]
pub struct Weight {
    dtype: DType,
    shape: Vec<usize>,
    bytes: HostBytes,
    /// Group scales and biases of an affine weight.
    affine: Option<Arc<Groups>>,
}

/// Per-group scales and biases of an affine-quantised weight, each `[rows, cols / group]`.
struct Groups {
    group: usize,
    scales: Weight,
    biases: Weight,
}

impl fmt::Debug for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Weight({}, {:?})", self.dtype, self.shape)
    }
}

impl Weight {
    /// A weight over `bytes`, which must hold exactly `shape` elements of `dtype`.
    pub fn new(dtype: DType, shape: Vec<usize>, bytes: HostBytes) -> Result<Self, WeightError> {
        let cols = *shape.last().unwrap_or(&1);
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        let Some(row_bytes) = dtype.row_bytes(cols) else {
            return Err(WeightError::Blocks { dtype, cols });
        };
        let expected = rows * row_bytes;
        let actual = bytes.as_slice().len();
        if expected != actual {
            return Err(WeightError::Length {
                shape,
                dtype,
                expected,
                actual,
            });
        }
        let bytes = bytes.aligned(dtype.size());
        Ok(Self {
            dtype,
            shape,
            bytes,
            affine: None,
        })
    }

    /// An affine-quantised weight of logical `shape` (`[.., rows, cols]`): packed `bits`-bit
    /// codes (`cols·bits/32` u32 words per row) with `scales` and `biases` of shape
    /// `[.., rows, cols/group]` in a float dtype.
    pub fn affine(
        shape: Vec<usize>,
        bits: u32,
        group: usize,
        codes: HostBytes,
        scales: Weight,
        biases: Weight,
    ) -> Result<Self, WeightError> {
        let cols = *shape.last().unwrap_or(&0);
        let bad = |expected: Vec<usize>, actual: &[usize]| WeightError::Shape {
            expected,
            actual: actual.to_vec(),
        };
        // Widths that pack whole codes into 32-bit words (MLX's 3/5/6-bit layouts are not read).
        if !matches!(bits, 2 | 4 | 8)
            || group == 0
            || !cols.is_multiple_of(group)
            || !(cols * bits as usize).is_multiple_of(32)
        {
            return Err(bad(shape.clone(), &[bits as usize, group]));
        }
        let mut gshape = shape.clone();
        *gshape.last_mut().expect("non-empty shape") = cols / group;
        if scales.shape() != gshape.as_slice() {
            return Err(bad(gshape, scales.shape()));
        }
        if biases.shape() != gshape.as_slice() {
            return Err(bad(gshape, biases.shape()));
        }
        let elems: usize = shape.iter().product();
        let expected = elems * bits as usize / 8;
        if codes.as_slice().len() != expected {
            return Err(WeightError::Length {
                shape,
                dtype: DType::Affine { bits },
                expected,
                actual: codes.as_slice().len(),
            });
        }
        Ok(Self {
            dtype: DType::Affine { bits },
            shape,
            bytes: codes.aligned(4),
            affine: Some(Arc::new(Groups {
                group,
                scales,
                biases,
            })),
        })
    }

    /// An owned f32 weight (tests, synthetic models).
    pub fn from_f32(shape: Vec<usize>, data: &[f32]) -> Self {
        let bytes = HostBytes::from_vec(bytemuck::cast_slice(data).to_vec());
        Self::new(DType::F32, shape, bytes).expect("shape matches data")
    }

    /// Stored element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the weight has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of a matrix view: all axes but the last.
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// Columns of a matrix view: the last axis.
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    /// Checks the shape, naming both shapes on mismatch.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), WeightError> {
        if self.shape != expected {
            return Err(WeightError::Shape {
                expected: expected.to_vec(),
                actual: self.shape.clone(),
            });
        }
        Ok(())
    }

    /// The same bytes under another shape with the same number of elements.
    pub fn reshape(&self, shape: Vec<usize>) -> Result<Self, WeightError> {
        if shape.iter().product::<usize>() != self.len() {
            return Err(WeightError::Shape {
                expected: shape,
                actual: self.shape.clone(),
            });
        }
        Ok(Self {
            shape,
            ..self.clone()
        })
    }

    /// Sub-tensor `i` along the first axis (an expert of a stacked expert tensor).
    pub fn index(&self, i: usize) -> Self {
        assert!(i < self.shape[0], "index {i} out of {:?}", self.shape);
        let inner: usize = self.shape[1..].iter().product();
        self.narrow_rows_raw(i * inner, inner, self.shape[1..].to_vec())
    }

    /// The rows of `self`, then those of `other`, as one matrix (a copy), when both have the
    /// same plain or block dtype and row width; `None` for affine weights or a mismatch.
    pub fn stack_rows(&self, other: &Weight) -> Option<Weight> {
        if self.dtype != other.dtype
            || self.cols() != other.cols()
            || self.affine.is_some()
            || other.affine.is_some()
        {
            return None;
        }
        let bytes = [self.raw_bytes(), other.raw_bytes()].concat();
        let shape = vec![self.rows() + other.rows(), self.cols()];
        Weight::new(self.dtype, shape, HostBytes::from_vec(bytes)).ok()
    }

    /// Rows `start..start+n` of the matrix view (`[n, cols]`).
    pub fn narrow_rows(&self, start: usize, n: usize) -> Self {
        assert!(
            start + n <= self.rows(),
            "rows {start}+{n} out of {:?}",
            self.shape
        );
        let cols = self.cols();
        self.narrow_rows_raw(start * cols, n * cols, vec![n, cols])
    }

    fn narrow_rows_raw(&self, elem_start: usize, elems: usize, shape: Vec<usize>) -> Self {
        // Every caller starts and ends on a row boundary, so packed rows slice cleanly.
        let cols = self.cols();
        let row_bytes = self
            .dtype
            .row_bytes(cols)
            .expect("validated at construction");
        let affine = self.affine.as_ref().map(|g| {
            // The same rows of the group scales and biases.
            let per_row = self.cols() / g.group;
            let (start, n) = (
                elem_start / self.cols() * per_row,
                elems / self.cols() * per_row,
            );
            let mut gshape = shape.clone();
            *gshape.last_mut().expect("non-empty shape") = per_row;
            Arc::new(Groups {
                group: g.group,
                scales: g.scales.narrow_rows_raw(start, n, gshape.clone()),
                biases: g.biases.narrow_rows_raw(start, n, gshape),
            })
        });
        Self {
            dtype: self.dtype,
            shape,
            bytes: self
                .bytes
                .slice(elem_start / cols * row_bytes..(elem_start + elems) / cols * row_bytes),
            affine,
        }
    }

    /// Row `r` of the matrix view, converted to f32 into `out` (`cols` values).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let cols = self.cols();
        self.range_to_f32(r * cols, out);
    }

    /// Elements `start..start+out.len()` of row `r`, converted to f32.
    pub fn row_slice_to_f32(&self, r: usize, start: usize, out: &mut [f32]) {
        assert!(start + out.len() <= self.cols());
        self.range_to_f32(r * self.cols() + start, out);
    }

    /// All elements as f32 (for small tensors: norms, biases, conv kernels).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.range_to_f32(0, &mut out);
        out
    }

    fn range_to_f32(&self, start: usize, out: &mut [f32]) {
        let n = out.len();
        match self.dtype {
            DType::F32 => out.copy_from_slice(&self.f32_data()[start..start + n]),
            DType::BF16 => {
                // bf16 is the top half of an f32: widening is exact, NaNs included.
                for (o, &b) in out.iter_mut().zip(&self.u16_data()[start..start + n]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
            DType::F16 => {
                for (o, &b) in out.iter_mut().zip(&self.u16_data()[start..start + n]) {
                    *o = f16::from_bits(b).to_f32();
                }
            }
            DType::Affine { bits } => {
                let g = self
                    .affine
                    .as_ref()
                    .expect("affine weights carry their groups");
                let words: &[u32] = bytemuck::cast_slice(self.bytes.as_slice());
                let (per_word, mask) = (32 / bits as usize, (1u32 << bits) - 1);
                let mut sb = [0.0f32; 2];
                let mut current = usize::MAX;
                for (i, o) in out.iter_mut().enumerate() {
                    let e = start + i;
                    let gi = e / g.group;
                    if gi != current {
                        // One scale and bias lookup per group.
                        g.scales.range_to_f32(gi, &mut sb[..1]);
                        g.biases.range_to_f32(gi, &mut sb[1..]);
                        current = gi;
                    }
                    let q = (words[e / per_word] >> (bits as usize * (e % per_word))) & mask;
                    // scale · q is exact in f32 (bf16 scale, small q), so this is one rounding,
                    // as MLX computes it, without a software fma call.
                    *o = sb[0] * q as f32 + sb[1];
                }
            }
            DType::Ggml(t) => {
                // Dequantise the blocks that cover the range; rows hold whole blocks, so the
                // block of element `e` starts at byte `e / block_elems * block_bytes`.
                let (be, bb) = (t.block_elems(), t.block_bytes());
                let bytes = self.bytes.as_slice();
                let (first, last) = (start / be, (start + n).div_ceil(be));
                let skip = start - first * be;
                if skip == 0 && n.is_multiple_of(be) {
                    ggml::dequantize(t, &bytes[first * bb..last * bb], out);
                } else {
                    let mut tmp = vec![0.0f32; (last - first) * be];
                    ggml::dequantize(t, &bytes[first * bb..last * bb], &mut tmp);
                    out.copy_from_slice(&tmp[skip..skip + n]);
                }
            }
        }
    }

    /// A copy of this float matrix quantised to Q4_K (rows in parallel), or `None` when it
    /// is already quantised or its rows are not whole 256-value blocks.
    pub fn to_q4_k(&self) -> Option<Weight> {
        use rayon::prelude::*;
        let floats = matches!(self.dtype, DType::F32 | DType::F16 | DType::BF16);
        let (rows, cols) = (self.rows(), self.cols());
        if !floats || !cols.is_multiple_of(256) || self.shape.len() != 2 {
            return None;
        }
        let t = GgmlType::Q4_K;
        let row_bytes = t.row_bytes(cols);
        let mut bytes = vec![0u8; rows * row_bytes];
        bytes.par_chunks_mut(row_bytes).enumerate().for_each_init(
            || vec![0f32; cols],
            |x, (r, out)| {
                self.row_to_f32(r, x);
                ggml::quantize_row_q4_k(x, out);
            },
        );
        Weight::new(
            DType::Ggml(t),
            self.shape.clone(),
            HostBytes::from_vec(bytes),
        )
        .ok()
    }

    /// The blocks of row `r` of a GGML weight, with their type.
    pub fn ggml_row(&self, r: usize) -> Option<(GgmlType, &[u8])> {
        let DType::Ggml(t) = self.dtype else {
            return None;
        };
        let rb = t.row_bytes(self.cols());
        Some((t, &self.bytes.as_slice()[r * rb..(r + 1) * rb]))
    }

    /// The packed codes and group size of an affine weight, with its scales and biases
    /// (the matmul kernels read them directly).
    pub fn affine_parts(&self) -> Option<(u32, usize, &[u32], &Weight, &Weight)> {
        let g = self.affine.as_ref()?;
        let DType::Affine { bits } = self.dtype else {
            return None;
        };
        Some((
            bits,
            g.group,
            bytemuck::cast_slice(self.bytes.as_slice()),
            &g.scales,
            &g.biases,
        ))
    }

    /// The stored bytes (codes only, for affine weights), as laid out on disk.
    pub fn raw_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The elements of an F32 weight.
    pub fn f32_data(&self) -> &[f32] {
        assert_eq!(self.dtype, DType::F32);
        bytemuck::cast_slice(self.bytes.as_slice())
    }

    /// The raw 16-bit elements of an F16 or BF16 weight.
    pub fn u16_data(&self) -> &[u16] {
        assert!(matches!(self.dtype, DType::F16 | DType::BF16));
        bytemuck::cast_slice(self.bytes.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn misaligned_bytes_are_copied_and_read_back() {
        let data: Vec<f32> = vec![1.0, -2.5, 3.25];
        let mut raw = vec![0u8; 1];
        raw.extend_from_slice(bytemuck::cast_slice(&data));
        let bytes = HostBytes::from_vec(raw).slice(1..13);
        let w = Weight::new(DType::F32, vec![3], bytes).unwrap();
        assert_eq!(w.to_f32_vec(), data);
    }

    #[test]
    fn bf16_rows_and_expert_index() {
        let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let bits: Vec<u16> = vals.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        let bytes = HostBytes::from_vec(bytemuck::cast_slice(&bits).to_vec());
        let w = Weight::new(DType::BF16, vec![2, 3, 2], bytes).unwrap();
        let e1 = w.index(1);
        assert_eq!(e1.shape(), &[3, 2]);
        let mut row = [0.0; 2];
        e1.row_to_f32(2, &mut row);
        assert_eq!(row, [5.0, 5.5]);
        assert_eq!(e1.narrow_rows(1, 2).to_f32_vec(), vec![4.0, 4.5, 5.0, 5.5]);
    }

    #[test]
    fn stacked_rows_follow_each_other() {
        let a = Weight::from_f32(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = Weight::from_f32(vec![1, 3], &[7.0, 8.0, 9.0]);
        let ab = a.stack_rows(&b).unwrap();
        assert_eq!(ab.shape(), &[3, 3]);
        assert_eq!(
            ab.to_f32_vec(),
            (1..=9).map(|v| v as f32).collect::<Vec<_>>()
        );
        let wide = Weight::from_f32(vec![1, 4], &[0.0; 4]);
        assert!(a.stack_rows(&wide).is_none(), "rows of another width");
    }

    #[test]
    fn wrong_length_is_an_error() {
        let bytes = HostBytes::from_vec(vec![0u8; 10]);
        assert!(Weight::new(DType::F32, vec![3], bytes).is_err());
    }
}
