//! Helpers shared by the integration tests (each test file uses some of them).
#![allow(dead_code)]

/// Fixtures generated at test time (the GGUFs, the dequantised twins, the real-vocabulary
/// weights).
#[path = "../../../../tests/fixtures/derived.rs"]
mod derived;
#[allow(unused_imports)] // each test binary uses some
pub use derived::{dir, fixture, gguf, realvocab, twin, vl_gguf, FOR_THE_GPU};

/// Largest |a - b| relative to the largest |b| (infinite if `a` holds a NaN).
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    if a.is_empty() && b.is_empty() {
        return 0.0;
    }
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

/// Three prompts (5, 40 and 12 tokens, ids below 400: within every fixture's vocabulary) and
/// the tokens of three batched steps over them: ragged (one token, three, none), one token
/// each, then three blocks of 9 (27 rows in all, past the 16 rows a product takes row by row
/// on its own).
pub fn ragged_batches() -> ([Vec<u32>; 3], Vec<Vec<Vec<u32>>>) {
    let prompts = [
        (0..5).map(|i| i * 31 % 400).collect(),
        (0..40).map(|i| (i * 17 + 3) % 400).collect(),
        (0..12).map(|i| (i * 7 + 11) % 400).collect(),
    ];
    let block = |b: u32| (0..9).map(|i| b + i).collect::<Vec<u32>>();
    let steps = vec![
        vec![vec![7u32], vec![8, 9, 10], vec![]],
        vec![vec![11], vec![12], vec![13]],
        vec![block(20), block(40), block(60)],
    ];
    (prompts, steps)
}
