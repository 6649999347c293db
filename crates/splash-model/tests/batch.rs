//! `Qwen35::forward_batch`: several sequences in one pass (ragged: one token, a few, none)
//! give each, bit for bit, the logits and state a pass of its own gives (every other step
//! asks only each row's argmax, which must be that of the row).

mod common;
use common::{argmax, fixture, max_rel, ragged_batches};
use splash_model::{load, BatchItem, Logits};

#[test]
fn a_batched_pass_matches_separate_passes() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let m = load(&fixture(name)).unwrap();
        let g = &m.graph;
        let (prompts, steps) = ragged_batches();
        let (mut alone, mut together): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for p in &prompts {
            for states in [&mut alone, &mut together] {
                let mut s = g.new_state();
                g.forward(&mut s, p, Logits::None).unwrap();
                states.push(s);
            }
        }
        for (step, next) in steps.into_iter().enumerate() {
            let want: Vec<Vec<f32>> = alone
                .iter_mut()
                .zip(&next)
                .map(|(s, t)| g.forward(s, t, Logits::All).unwrap())
                .collect();
            let mut items: Vec<BatchItem> = together
                .iter_mut()
                .zip(&next)
                .map(|(state, tokens)| BatchItem::text(state, tokens))
                .collect();
            let v = m.config.vocab_size;
            if step % 2 == 1 {
                let got = g.forward_batch(&mut items, Logits::Argmax, &[]).unwrap();
                for (i, (out, w)) in got.iter().zip(&want).enumerate() {
                    let rows: Vec<u32> = w.chunks_exact(v).map(|r| argmax(r) as u32).collect();
                    assert!(out.logits.is_empty(), "{name} step {step} item {i}: rows");
                    assert_eq!(out.argmax, rows, "{name} step {step} item {i}: argmax");
                }
                continue;
            }
            let got = g.forward_batch(&mut items, Logits::All, &[]).unwrap();
            for (i, (out, w)) in got.iter().zip(&want).enumerate() {
                let l = &out.logits;
                assert_eq!(l.len(), w.len(), "{name} step {step} item {i}: rows");
                if w.is_empty() {
                    continue;
                }
                // Up to 16 rows the products are batch-invariant: the same bits.
                assert!(
                    l == w,
                    "{name} step {step} item {i}: differs by {:e} (argmax {:?} vs {:?})",
                    max_rel(l, w),
                    l.chunks_exact(v).map(argmax).collect::<Vec<_>>(),
                    w.chunks_exact(v).map(argmax).collect::<Vec<_>>()
                );
            }
        }
        for (a, b) in alone.iter().zip(&together) {
            assert_eq!(a.len(), b.len(), "{name}: positions");
        }
    }
}

/// A block of up to 16 tokens (a speculative verify) gives each token the bits one-token
/// passes give it: greedy speculation is exactly lossless only so. (Longer passes, prefill
/// chunks, may take the chunked GDN form and the tiled GEMM.)
#[test]
fn a_verify_block_has_the_bits_of_one_token_passes() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let m = load(&fixture(name)).unwrap();
        let (g, v) = (&m.graph, m.config.vocab_size);
        let prompt: Vec<u32> = vec![39, 440, 365, 285, 267, 75, 67];
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 400).collect();
        // One token at a time after the prompt: the logits after each token.
        let mut s = g.new_state();
        g.forward(&mut s, &prompt, Logits::None).unwrap();
        let one: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| g.forward(&mut s, &[t], Logits::Last).unwrap())
            .collect();
        for (start, rows) in [(3usize, 2usize), (5, 16), (20, 7)] {
            let mut s = g.new_state();
            g.forward(&mut s, &prompt, Logits::None).unwrap();
            for &t in &tokens[..start] {
                g.forward(&mut s, &[t], Logits::None).unwrap();
            }
            let block = g
                .forward(&mut s, &tokens[start..start + rows], Logits::All)
                .unwrap();
            for (r, got) in block.chunks_exact(v).enumerate() {
                assert!(
                    got == one[start + r].as_slice(),
                    "{name}: row {r} of the block from token {start} differs by {:e}",
                    max_rel(got, &one[start + r])
                );
            }
        }
    }
}
