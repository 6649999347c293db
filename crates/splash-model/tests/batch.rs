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
                .map(|(state, tokens)| BatchItem { state, tokens })
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
