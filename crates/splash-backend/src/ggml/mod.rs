//! GGML block-quantised tensor types (the weights of GGUF files) and their dequantisation.
//!
//! A row of `K` values is `K / block_elems` blocks of `block_bytes` bytes each; blocks never
//! straddle rows. The formulas follow llama.cpp's `dequantize_row_*` (model-spec §5.2) and
//! are checked value for value against the `gguf` Python package
//! (`tests/fixtures/gguf/dequant.safetensors`).

mod dequant;
mod grids;
mod quantize;

use std::fmt;

pub use dequant::dequantize;
pub(crate) use dequant::row_dot;
pub use quantize::quantize_row_q4_k;

/// A GGML tensor type that splash can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
    IQ4_NL,
    IQ4_XS,
}

/// Elements per super-block of the K-quants and I-quants.
const QK_K: usize = 256;

impl GgmlType {
    /// The type with GGML id `id` (`ggml_type` in ggml.h), or the type's name when splash cannot
    /// read it (for the error message), or `None` for an id GGML does not define.
    pub fn from_id(id: u32) -> Result<Self, Option<&'static str>> {
        use GgmlType::*;
        Ok(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            29 => IQ1_M,
            30 => BF16,
            unsupported => {
                return Err(match unsupported {
                    9 => Some("Q8_1"),
                    15 => Some("Q8_K"),
                    24 => Some("I8"),
                    25 => Some("I16"),
                    26 => Some("I32"),
                    27 => Some("I64"),
                    28 => Some("F64"),
                    34 => Some("TQ1_0"),
                    35 => Some("TQ2_0"),
                    39 => Some("MXFP4"),
                    _ => None,
                })
            }
        })
    }

    /// The GGML id of this type.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            IQ1_M => 29,
            BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            IQ4_NL => 18,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ2_S => 82,
            IQ3_XXS => 98,
            IQ3_S => 110,
            IQ1_S => 50,
            IQ1_M => 56,
            IQ4_XS => 136,
        }
    }

    /// Bytes of a row of `cols` elements (`cols` a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    /// Bits per weight, for reports.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_elems() as f64
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
