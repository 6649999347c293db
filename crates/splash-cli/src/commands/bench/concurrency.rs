//! `splash bench --concurrency 1,4,16`: aggregate decode speed of N sequences decoding at
//! once in one engine (each step one batched pass for all of them), against one alone.

use std::sync::Arc;
use std::time::Instant;

use splash_engine::{Drafter, Engine, Request, SamplingParams};
use splash_model::{KvFormat, Model};

/// One row of the table.
pub struct Concurrency {
    pub sequences: usize,
    /// Generated tokens per second, all sequences together.
    pub tok_s: f64,
    /// Mean rows per batched pass.
    pub rows_per_pass: f64,
}

/// Decodes `tokens` tokens in each of `n` sequences (distinct short prompts) at once; the clock
/// starts once every prompt is prefilled.
pub fn run(
    model: &Arc<Model>,
    drafter: Option<&Arc<dyn Drafter>>,
    n: usize,
    tokens: usize,
    kv: KvFormat,
) -> anyhow::Result<Concurrency> {
    let mut engine = Engine::new(model.clone()).with_kv_format(kv);
    if let Some(d) = drafter {
        engine = engine.with_drafter(d.clone());
    }
    let vocab = model.config.vocab_size as u32;
    for s in 0..n as u32 {
        let prompt: Vec<u32> = (0..16u32)
            .map(|i| (s * 7919 + i * 104_729) % vocab)
            .collect();
        engine.add(Request {
            prompt,
            sampling: SamplingParams::greedy(),
            max_tokens: tokens,
            stop: Vec::new(),
            ignore_eos: true,
            grammar: None,
            images: Vec::new(),
        })?;
    }
    while engine.prefill_pending() > 0 {
        engine.step()?;
    }
    let before = engine.batch_stats();
    let t0 = Instant::now();
    let mut generated = 0;
    while engine.has_work() {
        for ev in engine.step()? {
            if let splash_engine::Event::Finished { id } = ev {
                generated += engine.take_finished(id).map_or(0, |s| s.output().len());
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = engine.batch_stats();
    let passes = (after.passes - before.passes).max(1);
    Ok(Concurrency {
        sequences: n,
        // The first token of each came from its prefill logits: count the rest.
        tok_s: generated.saturating_sub(n) as f64 / secs,
        rows_per_pass: (after.rows - before.rows) as f64 / passes as f64,
    })
}
