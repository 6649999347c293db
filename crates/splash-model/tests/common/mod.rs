//! Helpers shared by the integration tests (each test file uses some of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A committed fixture under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// Largest |a - b| relative to the largest |b| (infinite if `a` holds a NaN).
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        if x.is_nan() {
            f32::INFINITY
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

/// Index of the largest value (the first of equals).
pub fn argmax(r: &[f32]) -> usize {
    (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b })
}
