//! Key/value cache storage: rows of `d` values (one per token and kv head), kept in f32,
//! bf16, or int8 with one f32 scale per row (symmetric).

/// How cached keys and values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvFormat {
    /// Exact (the reference; tests against transformers).
    F32,
    /// Half the memory of f32; rounding as bf16.
    Bf16,
    /// A quarter of f32 plus a scale per row: `x ≈ scale · q`, `q ∈ [-127, 127]`.
    #[default]
    Int8,
}

impl KvFormat {
    /// Bytes one cached row of `d` values takes (int8: the codes plus one f32 scale).
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            Self::F32 => 4 * d,
            Self::Bf16 => 2 * d,
            Self::Int8 => d + 4,
        }
    }
}

impl std::str::FromStr for KvFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "int8" => Ok(Self::Int8),
            "bf16" => Ok(Self::Bf16),
            "f32" => Ok(Self::F32),
            other => Err(format!(
                "unknown KV format `{other}`: use int8, bf16 or f32"
            )),
        }
    }
}

/// A growing cache of rows of `d` values.
#[derive(Clone, Debug)]
pub enum KvStore {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Int8 { q: Vec<i8>, scale: Vec<f32> },
}

impl KvStore {
    /// An empty store of `format`.
    pub fn new(format: KvFormat) -> Self {
        match format {
            KvFormat::F32 => Self::F32(Vec::new()),
            KvFormat::Bf16 => Self::Bf16(Vec::new()),
            KvFormat::Int8 => Self::Int8 {
                q: Vec::new(),
                scale: Vec::new(),
            },
        }
    }

    /// Number of values stored.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
            Self::Int8 { q, .. } => q.len(),
        }
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::Bf16(v) => v.len() * 2,
            Self::Int8 { q, scale } => q.len() + scale.len() * 4,
        }
    }

    /// Appends rows of `d` values.
    pub fn append(&mut self, rows: &[f32], d: usize) {
        match self {
            Self::F32(v) => v.extend_from_slice(rows),
            Self::Bf16(v) => v.extend(rows.iter().map(|&x| half::bf16::from_f32(x).to_bits())),
            Self::Int8 { q, scale } => {
                for row in rows.chunks_exact(d) {
                    let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let s = if max > 0.0 { max / 127.0 } else { 1.0 };
                    let inv = 1.0 / s;
                    q.extend(
                        row.iter()
                            .map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8),
                    );
                    scale.push(s);
                }
            }
        }
    }

    /// Drops everything after the first `rows` rows of `d` values.
    pub fn truncate(&mut self, rows: usize, d: usize) {
        match self {
            Self::F32(v) => v.truncate(rows * d),
            Self::Bf16(v) => v.truncate(rows * d),
            Self::Int8 { q, scale } => {
                q.truncate(rows * d);
                scale.truncate(rows);
            }
        }
    }

    /// The stored values as bytes (f32 or bf16 little-endian, or int8 codes) and the int8 row
    /// scales (empty for the other formats): what a saved state image holds.
    pub fn raw(&self) -> (&[u8], &[f32]) {
        match self {
            Self::F32(v) => (bytemuck::cast_slice(v), &[]),
            Self::Bf16(v) => (bytemuck::cast_slice(v), &[]),
            Self::Int8 { q, scale } => (bytemuck::cast_slice(q), scale),
        }
    }

    /// A store of `format` holding `bytes` and `scales` as [`raw`](Self::raw) gave them.
    pub fn from_raw(format: KvFormat, bytes: &[u8], scales: Vec<f32>) -> Self {
        match format {
            KvFormat::F32 => Self::F32(bytemuck::pod_collect_to_vec(bytes)),
            KvFormat::Bf16 => Self::Bf16(bytemuck::pod_collect_to_vec(bytes)),
            KvFormat::Int8 => Self::Int8 {
                q: bytemuck::cast_slice(bytes).to_vec(),
                scale: scales,
            },
        }
    }

    /// Row `r` (of `out.len()` values) as f32.
    #[inline]
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let d = out.len();
        match self {
            Self::F32(v) => out.copy_from_slice(&v[r * d..(r + 1) * d]),
            Self::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[r * d..(r + 1) * d]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
            Self::Int8 { q, scale } => {
                let s = scale[r];
                for (o, &x) in out.iter_mut().zip(&q[r * d..(r + 1) * d]) {
                    *o = x as f32 * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip_within_their_precision() {
        let d = 8;
        let rows: Vec<f32> = (0..3 * d).map(|i| ((i as f32) * 0.7).sin() * 3.0).collect();
        for (format, tol) in [
            (KvFormat::F32, 0.0),
            (KvFormat::Bf16, 3.0 / 128.0),
            (KvFormat::Int8, 3.0 / 127.0 * 0.51),
        ] {
            let mut s = KvStore::new(format);
            s.append(&rows, d);
            s.append(&[0.0; 8], d); // an all-zero row must not divide by zero
            let mut out = vec![0.0; d];
            for r in 0..3 {
                s.row(r, &mut out);
                for (a, b) in out.iter().zip(&rows[r * d..(r + 1) * d]) {
                    assert!((a - b).abs() <= tol, "{format:?}: {a} vs {b}");
                }
            }
            s.row(3, &mut out);
            assert_eq!(out, vec![0.0; d]);
            s.truncate(2, d);
            assert_eq!(s.len(), 2 * d);
        }
        let int8 = {
            let mut s = KvStore::new(KvFormat::Int8);
            s.append(&rows, d);
            s.bytes()
        };
        assert_eq!(int8, 3 * KvFormat::Int8.row_bytes(d));
        assert_eq!("BF16".parse::<KvFormat>(), Ok(KvFormat::Bf16));
        assert!("fp8"
            .parse::<KvFormat>()
            .unwrap_err()
            .contains("int8, bf16 or f32"));
    }
}
