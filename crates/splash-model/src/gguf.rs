//! GGUF files: header, metadata and tensor directory (format versions 2 and 3).
//!
//! Layout: magic `GGUF`, version, tensor count, metadata count, the metadata key-value pairs,
//! the tensor infos (name, dims innermost first, GGML type, offset), then the tensor data,
//! aligned to `general.alignment` (default 32). All integers are little-endian.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::ModelError;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "[{} values]", a.len()),
            other => match other.as_f64() {
                Some(v) => write!(f, "{v}"),
                None => write!(f, "{other:?}"),
            },
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions innermost first (GGML `ne`): a `[rows, cols]` matrix is `[cols, rows]`.
    pub dims: Vec<u64>,
    /// GGML type id.
    pub type_id: u32,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

/// The parsed header of a GGUF file: metadata and tensor directory.
#[derive(Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Byte offset of the tensor data section in the file.
    pub data_start: u64,
}

/// Why a buffer could not be parsed.
#[derive(Debug, PartialEq)]
pub(crate) enum ParseError {
    /// The buffer ends before the header does (only an error for a whole file).
    Truncated,
    Invalid(String),
}

impl GgufHeader {
    /// Parses the header of a whole file (`bytes` is the file or its memory map).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, ModelError> {
        Self::parse_bytes(bytes).map_err(|e| gguf_error(path, e))
    }

    pub(crate) fn parse_bytes(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader { bytes, pos: 0 };
        let (version, n_tensors, n_kv) = r.preamble()?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 20) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > 4 {
                return Err(ParseError::Invalid(format!(
                    "tensor `{name}` has {n_dims} dimensions (GGUF allows at most 4)"
                )));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let type_id = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(ParseError::Invalid(format!(
                "general.alignment {alignment} is not a power of two"
            )));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        Ok(Self {
            version,
            metadata,
            tensors,
            data_start,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }
}

/// `general.architecture` from the first bytes of a GGUF file (a download probe): `Ok(None)`
/// when the prefix ends before the key is reached.
pub fn architecture_from_prefix(prefix: &[u8]) -> Result<Option<String>, String> {
    let mut r = Reader {
        bytes: prefix,
        pos: 0,
    };
    let mut scan = || -> Result<Option<String>, ParseError> {
        let (_, _, n_kv) = r.preamble()?;
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            if key == "general.architecture" {
                return Ok(value.as_str().map(str::to_string));
            }
        }
        Ok(None)
    };
    match scan() {
        Ok(arch) => Ok(arch),
        Err(ParseError::Truncated) => Ok(None),
        Err(ParseError::Invalid(m)) => Err(m),
    }
}

pub(crate) fn gguf_error(path: &Path, e: ParseError) -> ModelError {
    let message = match e {
        ParseError::Truncated => "the file ends inside its header (truncated download?)".into(),
        ParseError::Invalid(m) => m,
    };
    ModelError::Gguf {
        path: PathBuf::from(path),
        message,
    }
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ParseError> {
        let end = self.pos.checked_add(n).ok_or(ParseError::Truncated)?;
        let s = self.bytes.get(self.pos..end).ok_or(ParseError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn preamble(&mut self) -> Result<(u32, u64, u64), ParseError> {
        if self.take(4)? != MAGIC {
            return Err(ParseError::Invalid(
                "not a GGUF file (it does not start with `GGUF`)".into(),
            ));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ParseError::Invalid(format!(
                "GGUF version {version} is not supported (splash reads versions 2 and 3; re-convert the model with a current llama.cpp)"
            )));
        }
        Ok((version, self.u64()?, self.u64()?))
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let len = self.u64()?;
        let len = usize::try_from(len).map_err(|_| ParseError::Truncated)?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| ParseError::Invalid("a metadata string is not valid UTF-8".into()))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, ParseError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth == 0 => {
                let elem = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least one byte: a count beyond the buffer is truncation.
                if n > (self.bytes.len() - self.pos) as u64 {
                    return Err(ParseError::Truncated);
                }
                let items = (0..n)
                    .map(|_| self.value(elem, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(ParseError::Invalid(format!(
                    "unknown metadata value type {other}"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny GGUF v3 image: two metadata keys and one F32 tensor of 2 values, and the length
    /// of its header.
    fn sample() -> (Vec<u8>, usize) {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, v: &str| {
            b.extend((v.len() as u64).to_le_bytes());
            b.extend(v.as_bytes());
        };
        b.extend(MAGIC);
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "qwen35");
        s(&mut b, "qwen35.rope.dimension_sections");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(11i32.to_le_bytes());
        b.extend(10i32.to_le_bytes());
        s(&mut b, "w");
        b.extend(1u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let header_len = b.len();
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend(1.5f32.to_le_bytes());
        b.extend((-2.0f32).to_le_bytes());
        (b, header_len)
    }

    #[test]
    fn parses_metadata_and_tensors() {
        let (bytes, _) = sample();
        let h = GgufHeader::parse_bytes(&bytes).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.architecture(), Some("qwen35"));
        assert_eq!(
            h.get("qwen35.rope.dimension_sections"),
            Some(&Value::Array(vec![Value::I32(11), Value::I32(10)]))
        );
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.tensors[0].dims, vec![2]);
        assert_eq!(h.data_start as usize, bytes.len() - 8);
    }

    #[test]
    fn truncation_and_garbage_are_errors_not_panics() {
        let (bytes, header_len) = sample();
        for cut in 0..header_len {
            assert!(GgufHeader::parse_bytes(&bytes[..cut]).is_err(), "cut {cut}");
        }
        assert_eq!(
            architecture_from_prefix(&bytes[..40]).unwrap(),
            None,
            "prefix too short"
        );
        assert_eq!(
            architecture_from_prefix(&bytes[..80]).unwrap().as_deref(),
            Some("qwen35")
        );
        assert!(architecture_from_prefix(b"PK\x03\x04 not gguf at all").is_err());
        let mut huge = bytes.clone();
        huge[4] = 9; // version 9
        assert!(matches!(
            GgufHeader::parse_bytes(&huge),
            Err(ParseError::Invalid(m)) if m.contains("version 9")
        ));
    }
}
