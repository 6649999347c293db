//! Where each row of a pass sits when a sequence holds images: its rotary position (interleaved
//! M-RoPE) and, for an image's placeholder tokens, the embedding row that replaces the token's.
//!
//! Text tokens sit at (p, p, p); token k of an image of `rows × cols` merged patches whose first
//! placeholder would have been at position s sits at (s, s + k / cols, s + k % cols), and the
//! text after it continues at s + max(rows, cols) rather than s + rows · cols. So past an image
//! the rotary position of a row is its index plus a shift (≤ 0) that the sequence state keeps:
//! without images the shift is 0 and every row turns exactly as 1-D RoPE turns it.

use std::sync::Arc;

use crate::error::ModelError;

/// One image in a sequence: the vision tower's merged rows, which stand in for the image's
/// placeholder tokens (`image_token_id`) at `start..start + rows · cols`.
#[derive(Clone, Debug)]
pub struct ImageSpan {
    /// Index in the sequence of the image's first placeholder token.
    pub start: usize,
    /// The merged patch grid: (rows, columns).
    pub grid: (usize, usize),
    /// The tower's output, `[rows · columns, hidden]` in raster order.
    pub embeddings: Arc<[f32]>,
}

impl ImageSpan {
    /// Placeholder tokens the image takes.
    pub fn len(&self) -> usize {
        self.grid.0 * self.grid.1
    }

    /// True for an image of no rows (never valid in a pass).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index just past its last placeholder.
    pub fn end(&self) -> usize {
        self.start + self.len()
    }

    /// How far the text after the image falls behind its row index: max(rows, cols) − rows · cols.
    pub fn rotary_shift(&self) -> i64 {
        self.grid.0.max(self.grid.1) as i64 - self.len() as i64
    }
}

/// The rotary positions of one sequence's rows in a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rotary {
    /// Text rows at consecutive positions from this one (the same on all three axes).
    From(usize),
    /// A (temporal, height, width) position per row: the pass holds image rows.
    Each(Vec<[u32; 3]>),
}

/// What a device needs beyond the token ids to run rows `pos0..pos0 + n` of a sequence.
#[derive(Debug)]
pub(crate) struct RowPlan<'a> {
    pub(crate) rotary: Rotary,
    /// Runs of rows whose input is an image's embedding rows instead of their token's:
    /// (first row of the run in this pass, `[run, hidden]`).
    pub(crate) embedded: Vec<(usize, &'a [f32])>,
    /// The sequence's rotary shift after these rows.
    pub(crate) shift_after: i64,
}

/// Checks a sequence's images: in order, not overlapping, each with `rows · cols · hidden`
/// embedding values and a non-empty grid.
pub(crate) fn check_images(images: &[ImageSpan], hidden: usize) -> Result<(), ModelError> {
    let mut end = 0;
    for (i, image) in images.iter().enumerate() {
        if image.is_empty() || image.embeddings.len() != image.len() * hidden {
            return Err(ModelError::Image(format!(
                "image {i} has a {}×{} grid and {} embedding values; the model needs rows × columns × {hidden}",
                image.grid.0,
                image.grid.1,
                image.embeddings.len()
            )));
        }
        if image.start < end {
            return Err(ModelError::Image(format!(
                "image {i} starts at token {} inside the image before it (which ends at {end}); images must be in order",
                image.start
            )));
        }
        end = image.end();
    }
    Ok(())
}

/// Writes a sequence's image rows over its token embeddings: `x` holds the pass's rows of
/// width `hidden`, the sequence's from row `off`; `embedded` is its [`RowPlan::embedded`].
pub(crate) fn place_image_rows(
    x: &mut [f32],
    hidden: usize,
    off: usize,
    embedded: &[(usize, &[f32])],
) {
    for &(row, values) in embedded {
        x[(off + row) * hidden..][..values.len()].copy_from_slice(values);
    }
}

/// Plans rows `pos0..pos0 + n` of a sequence whose images are `images` (checked by
/// [`check_images`]) and whose text rows sit `shift` behind their index. The shift of an image
/// counts once its last row has run, so an image split across passes keeps its start position.
pub(crate) fn plan_rows(
    pos0: usize,
    n: usize,
    shift: i64,
    images: &[ImageSpan],
    hidden: usize,
) -> RowPlan<'_> {
    let end = pos0 + n;
    let inside: Vec<&ImageSpan> = images
        .iter()
        .filter(|im| im.end() > pos0 && im.start < end)
        .collect();
    if inside.is_empty() {
        return RowPlan {
            rotary: Rotary::From((pos0 as i64 + shift) as usize),
            embedded: Vec::new(),
            shift_after: shift,
        };
    }
    let mut positions = Vec::with_capacity(n);
    let mut embedded = Vec::new();
    let mut shift = shift;
    let mut next = inside.iter().peekable();
    let mut i = pos0;
    while i < end {
        match next.peek() {
            Some(im) if im.start <= i => {
                let first = i;
                let stop = im.end().min(end);
                let s = (im.start as i64 + shift) as u32;
                let cols = im.grid.1;
                for k in first - im.start..stop - im.start {
                    positions.push([s, s + (k / cols) as u32, s + (k % cols) as u32]);
                }
                embedded.push((
                    first - pos0,
                    &im.embeddings[(first - im.start) * hidden..(stop - im.start) * hidden],
                ));
                if stop == im.end() {
                    shift += im.rotary_shift();
                    next.next();
                }
                i = stop;
            }
            later => {
                let stop = later.map_or(end, |im| im.start.min(end));
                for row in i..stop {
                    let p = (row as i64 + shift) as u32;
                    positions.push([p, p, p]);
                }
                i = stop;
            }
        }
    }
    RowPlan {
        rotary: Rotary::Each(positions),
        embedded,
        shift_after: shift,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(start: usize, rows: usize, cols: usize, hidden: usize) -> ImageSpan {
        let values = (0..rows * cols * hidden)
            .map(|v| v as f32)
            .collect::<Vec<_>>();
        ImageSpan {
            start,
            grid: (rows, cols),
            embeddings: values.into(),
        }
    }

    /// transformers' `get_rope_index` for one sequence: text (p, p, p); an image's token k at
    /// (s, s + k / cols, s + k % cols); after it s + max(rows, cols).
    fn reference(len: usize, images: &[ImageSpan]) -> Vec<[u32; 3]> {
        let mut out = Vec::new();
        let mut cur = 0u32;
        let mut i = 0;
        while i < len {
            if let Some(im) = images.iter().find(|im| im.start == i) {
                for k in 0..im.len() {
                    let (r, c) = ((k / im.grid.1) as u32, (k % im.grid.1) as u32);
                    out.push([cur, cur + r, cur + c]);
                }
                cur += im.grid.0.max(im.grid.1) as u32;
                i += im.len();
            } else {
                out.push([cur; 3]);
                cur += 1;
                i += 1;
            }
        }
        out
    }

    #[test]
    fn positions_match_the_reference_however_the_rows_are_cut() {
        let hidden = 2;
        // Text, a 2×3 image, text, a 4×1 image, text: 3 + 6 + 2 + 4 + 3 rows.
        let images = [image(3, 2, 3, hidden), image(11, 4, 1, hidden)];
        check_images(&images, hidden).unwrap();
        let want = reference(18, &images);
        for cut in [1, 2, 4, 5, 7, 18] {
            let (mut pos0, mut shift, mut got, mut rows_embedded) = (0, 0, Vec::new(), 0);
            while pos0 < 18 {
                let n = cut.min(18 - pos0);
                let plan = plan_rows(pos0, n, shift, &images, hidden);
                match plan.rotary {
                    Rotary::From(p) => got.extend((p..p + n).map(|p| [p as u32; 3])),
                    Rotary::Each(p) => got.extend(p),
                }
                for (row, values) in plan.embedded {
                    // Each embedded row is the image row of the token it replaces.
                    let index = pos0 + row;
                    let im = images
                        .iter()
                        .find(|im| im.start <= index && index < im.end());
                    let im = im.expect("an embedded row is an image row");
                    let k = index - im.start;
                    assert_eq!(values[..hidden], im.embeddings[k * hidden..][..hidden]);
                    rows_embedded += values.len() / hidden;
                }
                shift = plan.shift_after;
                pos0 += n;
            }
            assert_eq!(got, want, "passes of {cut} rows");
            assert_eq!(rows_embedded, 10);
            // max(r, c) - r·c per image: 3 - 6 for the 2×3, 4 - 4 for the 4×1.
            assert_eq!(shift, -3);
        }
    }

    #[test]
    fn text_only_rows_keep_one_dimensional_positions() {
        let plan = plan_rows(5, 3, 0, &[], 4);
        assert_eq!(plan.rotary, Rotary::From(5));
        let images = [image(2, 4, 4, 1)];
        let plan = plan_rows(20, 3, -12, &images, 1);
        assert_eq!(plan.rotary, Rotary::From(8), "past the image, shifted");
        assert!(plan.embedded.is_empty());
    }

    #[test]
    fn bad_images_are_refused() {
        let mut short = image(0, 2, 2, 3);
        short.embeddings = vec![0.0; 5].into();
        assert!(check_images(&[short], 3).is_err());
        assert!(check_images(&[image(0, 2, 2, 1), image(3, 1, 1, 1)], 1).is_err());
        assert!(check_images(&[image(4, 0, 2, 1)], 1).is_err());
    }
}
