//! Key/value cache storage: rows of `d` values (one per token and kv head), kept in f32,
//! bf16, or int8 with one f32 scale per row (symmetric), in pages that clones share.

use std::sync::Arc;

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
    /// Bytes one stored value takes (int8: its code; the row's scale is apart).
    pub fn value_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
            Self::Int8 => 1,
        }
    }

    /// Bytes one cached row of `d` values takes (int8: the codes plus one f32 scale).
    pub fn row_bytes(self, d: usize) -> usize {
        d * self.value_bytes() + if self == Self::Int8 { 4 } else { 0 }
    }
}

impl KvFormat {
    /// The name `--kv-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

/// Rows per page of a [`KvStore`]: the unit in which sequences and prefix-cache entries share
/// keys and values without copying them.
pub const KV_PAGE_ROWS: usize = 64;

/// A growing cache of rows of `d` values, in pages of [`KV_PAGE_ROWS`] rows. A clone shares
/// every page (no copy); a page is copied only when one of its holders writes to it, which is
/// only ever the partly filled last page (copy on write).
#[derive(Clone, Debug)]
pub struct KvStore {
    format: KvFormat,
    pages: Vec<Arc<KvPage>>,
    /// Rows stored.
    rows: usize,
    /// Values per row (0 before the first append).
    width: usize,
}

/// The rows of one page, in the store's format.
#[derive(Clone, Debug)]
enum KvPage {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Int8 { q: Vec<i8>, scale: Vec<f32> },
}

impl KvPage {
    fn new(format: KvFormat, width: usize) -> Self {
        let values = KV_PAGE_ROWS * width;
        match format {
            KvFormat::F32 => Self::F32(Vec::with_capacity(values)),
            KvFormat::Bf16 => Self::Bf16(Vec::with_capacity(values)),
            KvFormat::Int8 => Self::Int8 {
                q: Vec::with_capacity(values),
                scale: Vec::with_capacity(KV_PAGE_ROWS),
            },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.capacity() * 4,
            Self::Bf16(v) => v.capacity() * 2,
            Self::Int8 { q, scale } => q.capacity() + scale.capacity() * 4,
        }
    }

    fn push(&mut self, row: &[f32]) {
        // A page copied on write holds just its rows: give it the whole page's room once.
        let (values, rows) = (KV_PAGE_ROWS * row.len(), KV_PAGE_ROWS);
        match self {
            Self::F32(v) => v.reserve_exact(values - v.len()),
            Self::Bf16(v) => v.reserve_exact(values - v.len()),
            Self::Int8 { q, scale } => {
                q.reserve_exact(values - q.len());
                scale.reserve_exact(rows - scale.len());
            }
        }
        match self {
            Self::F32(v) => v.extend_from_slice(row),
            Self::Bf16(v) => v.extend(row.iter().map(|&x| half::bf16::from_f32(x).to_bits())),
            Self::Int8 { q, scale } => {
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

    fn truncate(&mut self, rows: usize, width: usize) {
        match self {
            Self::F32(v) => v.truncate(rows * width),
            Self::Bf16(v) => v.truncate(rows * width),
            Self::Int8 { q, scale } => {
                q.truncate(rows * width);
                scale.truncate(rows);
            }
        }
    }

    #[inline]
    fn row(&self, r: usize, out: &mut [f32]) {
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

impl KvStore {
    /// An empty store of `format`.
    pub fn new(format: KvFormat) -> Self {
        Self {
            format,
            pages: Vec::new(),
            rows: 0,
            width: 0,
        }
    }

    /// Number of values stored.
    pub fn len(&self) -> usize {
        self.rows * self.width
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Bytes held (the pages' capacity), shared pages included.
    pub fn bytes(&self) -> usize {
        self.pages.iter().map(|p| p.bytes()).sum()
    }

    /// The pages held, as (identity, bytes): two stores hold the same page, unduplicated, when
    /// their identities match (the prefix cache counts a shared page once).
    pub fn pages(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.pages
            .iter()
            .map(|p| (Arc::as_ptr(p) as usize, p.bytes()))
    }

    /// Appends rows of `d` values.
    pub fn append(&mut self, rows: &[f32], d: usize) {
        if self.rows == 0 {
            self.width = d;
        }
        assert_eq!(
            d, self.width,
            "rows of {d} values in a store of {}",
            self.width
        );
        for row in rows.chunks_exact(d) {
            if self.rows.is_multiple_of(KV_PAGE_ROWS) {
                self.pages.push(Arc::new(KvPage::new(self.format, d)));
            }
            let last = self.pages.last_mut().expect("a page for the row");
            Arc::make_mut(last).push(row);
            self.rows += 1;
        }
    }

    /// Drops everything after the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.rows {
            return;
        }
        self.pages.truncate(rows.div_ceil(KV_PAGE_ROWS));
        let kept = rows % KV_PAGE_ROWS;
        if kept > 0 {
            let last = self.pages.last_mut().expect("the partly kept page");
            Arc::make_mut(last).truncate(kept, self.width);
        }
        self.rows = rows;
    }

    /// The stored values as bytes (f32 or bf16 little-endian, or int8 codes) and the int8 row
    /// scales (empty for the other formats), pages back to back: what a saved state image
    /// holds.
    pub fn raw(&self) -> (Vec<u8>, Vec<f32>) {
        let (mut bytes, mut scales) = (Vec::new(), Vec::new());
        for page in &self.pages {
            match &**page {
                KvPage::F32(v) => bytes.extend_from_slice(bytemuck::cast_slice(v)),
                KvPage::Bf16(v) => bytes.extend_from_slice(bytemuck::cast_slice(v)),
                KvPage::Int8 { q, scale } => {
                    bytes.extend_from_slice(bytemuck::cast_slice(q));
                    scales.extend_from_slice(scale);
                }
            }
        }
        (bytes, scales)
    }

    /// A store of `format` holding rows of `d` values from `bytes` and `scales` as
    /// [`raw`](Self::raw) gave them.
    pub fn from_raw(format: KvFormat, bytes: &[u8], scales: &[f32], d: usize) -> Self {
        let mut store = Self::new(format);
        let row_bytes = d * format.value_bytes();
        if d == 0 || bytes.is_empty() {
            return store;
        }
        store.width = d;
        for (i, chunk) in bytes.chunks(KV_PAGE_ROWS * row_bytes).enumerate() {
            let rows = chunk.len() / row_bytes;
            store.pages.push(Arc::new(match format {
                KvFormat::F32 => KvPage::F32(bytemuck::pod_collect_to_vec(chunk)),
                KvFormat::Bf16 => KvPage::Bf16(bytemuck::pod_collect_to_vec(chunk)),
                KvFormat::Int8 => KvPage::Int8 {
                    q: bytemuck::cast_slice(chunk).to_vec(),
                    scale: scales[i * KV_PAGE_ROWS..i * KV_PAGE_ROWS + rows].to_vec(),
                },
            }));
            store.rows += rows;
        }
        store
    }

    /// Row `r` (of `out.len()` values) as f32.
    #[inline]
    pub fn row(&self, r: usize, out: &mut [f32]) {
        self.pages[r / KV_PAGE_ROWS].row(r % KV_PAGE_ROWS, out);
    }

    /// Rows `first`, `first + step`, ... (`count` of them, `d` values each) as f32, read into
    /// `block` as many at a time as it holds, and each full (or the last, partial) block handed
    /// to `f` with the index of its first row: what [`row`](Self::row) gives, the page looked
    /// up once per page.
    #[inline]
    pub fn for_each_block(
        &self,
        (first, step, count): (usize, usize, usize),
        d: usize,
        block: &mut [f32],
        mut f: impl FnMut(usize, &[f32]),
    ) {
        let per_block = block.len() / d;
        assert!(
            per_block > 0,
            "a block of {} values holds no row of {d}",
            block.len()
        );
        let mut at = usize::MAX;
        let mut page: &KvPage = match self.pages.first() {
            Some(p) => p,
            None => return,
        };
        for i in 0..count {
            let r = first + i * step;
            if r / KV_PAGE_ROWS != at {
                at = r / KV_PAGE_ROWS;
                page = &self.pages[at];
            }
            let slot = i % per_block;
            page.row(r % KV_PAGE_ROWS, &mut block[slot * d..][..d]);
            if slot + 1 == per_block || i + 1 == count {
                f(i - slot, &block[..(slot + 1) * d]);
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
            s.truncate(2);
            assert_eq!(s.len(), 2 * d);
        }
        let int8 = {
            let mut s = KvStore::new(KvFormat::Int8);
            s.append(&rows, d);
            s.bytes()
        };
        // One page, whole: its rows are reserved when it is made.
        assert_eq!(int8, KV_PAGE_ROWS * KvFormat::Int8.row_bytes(d));
        assert_eq!("BF16".parse::<KvFormat>(), Ok(KvFormat::Bf16));
        assert!("fp8"
            .parse::<KvFormat>()
            .unwrap_err()
            .contains("int8, bf16 or f32"));
    }

    /// Rows `0..n` of width `d`, each value naming its row.
    fn rows(n: usize, d: usize, from: usize) -> Vec<f32> {
        (0..n * d).map(|i| (from + i / d) as f32 + 0.25).collect()
    }

    fn read(s: &KvStore, d: usize) -> Vec<f32> {
        let mut out = vec![0.0; s.len()];
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            s.row(r, o);
        }
        out
    }

    /// A clone shares every page; writing to either copies only the last page, and neither
    /// sees the other's rows.
    #[test]
    fn clones_share_pages_and_copy_on_write() {
        let d = 4;
        let n = 2 * KV_PAGE_ROWS + 5;
        for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let mut a = KvStore::new(format);
            a.append(&rows(n, d, 0), d);
            let mut b = a.clone();
            let ids = |s: &KvStore| s.pages().map(|(id, _)| id).collect::<Vec<_>>();
            assert_eq!(ids(&a), ids(&b), "{format:?}: a clone shares its pages");
            a.append(&rows(3, d, 1000), d);
            b.truncate(n - 2);
            b.append(&rows(1, d, 2000), d);
            let (pa, pb) = (ids(&a), ids(&b));
            assert_eq!(pa[..2], pb[..2], "{format:?}: full pages stay shared");
            assert_ne!(pa[2], pb[2], "{format:?}: the written page was copied");
            let mut want_a = rows(n, d, 0);
            want_a.extend(rows(3, d, 1000));
            let mut want_b = rows(n - 2, d, 0);
            want_b.extend(rows(1, d, 2000));
            let tol = if format == KvFormat::F32 {
                0.0
            } else {
                0.02 * (n + 2000) as f32
            };
            for (got, want) in [(read(&a, d), want_a), (read(&b, d), want_b)] {
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= tol, "{format:?}: {g} vs {w}");
                }
            }
            // Back to a page boundary, then past it again.
            a.truncate(KV_PAGE_ROWS);
            assert_eq!(a.pages().count(), 1);
            a.append(&rows(2, d, 0), d);
            assert_eq!(a.pages().count(), 2);
        }
    }

    /// `raw` and `from_raw` keep every row across page boundaries.
    #[test]
    fn raw_round_trips_across_pages() {
        let d = 6;
        let n = 3 * KV_PAGE_ROWS + 7;
        for format in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let mut a = KvStore::new(format);
            a.append(&rows(n, d, 0), d);
            let (bytes, scales) = a.raw();
            let b = KvStore::from_raw(format, &bytes, &scales, d);
            assert_eq!(b.len(), a.len());
            assert_eq!(read(&a, d), read(&b, d), "{format:?}");
            assert_eq!(b.raw(), (bytes, scales));
            assert!(KvStore::from_raw(format, &[], &[], d).is_empty());
        }
    }
}
