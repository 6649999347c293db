//! Prefill scheduling: a short prompt that arrives while a long one is being prefilled gets
//! its first token within a few steps, the long one still progresses at every step, and
//! sharing the chunk changes no output.

use splash_engine::{Engine, Event, SeqId};
use splash_model::Model;

mod common;
use common::{demo, greedy};

const CHUNK: usize = 64;

/// A prompt of `len` tokens (ids inside the demo's vocabulary); prompts of different `seed`s
/// share no prefix (the prefix cache must not serve one from another).
fn long_prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 300 + (i * 37 + seed * 101) % 5000)
        .collect()
}

fn chat(model: &Model, q: &str) -> Vec<u32> {
    let text = format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n");
    model.tokenizer.encode(&text).unwrap()
}

fn engine(model: &std::sync::Arc<Model>) -> Engine {
    Engine::new(model.clone())
        .with_prefill_chunk(CHUNK)
        .with_prefix_cache(64 << 20)
}

/// Steps until `id` finishes; returns the steps taken.
fn steps_until_finished(engine: &mut Engine, id: SeqId, limit: usize) -> usize {
    for n in 1..=limit {
        let events = engine.step().unwrap();
        if events.contains(&Event::Finished { id }) {
            return n;
        }
    }
    panic!("sequence {id} did not finish within {limit} steps");
}

#[test]
fn a_short_prompt_is_not_stuck_behind_a_long_prefill() {
    let (model, _) = demo();
    let long = long_prompt(CHUNK * 20, 0);
    let short = chat(&model, "Hello friend");
    assert!(short.len() < CHUNK / 2);
    let solo = |prompt: &[u32], n| {
        engine(&model)
            .generate(greedy(prompt.to_vec(), n), |_| {})
            .unwrap()
            .tokens
    };
    let (long_solo, short_solo) = (solo(&long, 4), solo(&short, 1));

    let mut e = engine(&model);
    let long_id = e.add(greedy(long.clone(), 4)).unwrap();
    for _ in 0..3 {
        e.step().unwrap();
    }
    let pending = e.prefill_pending();
    let short_id = e.add(greedy(short.clone(), 1)).unwrap();
    // One step to prefill it, one to sample its first (here: only) token; the oldest-first
    // order made it wait for the 17 chunks the long prompt had left.
    let steps = steps_until_finished(&mut e, short_id, 40);
    assert!(steps <= 2, "the short request took {steps} steps");
    assert!(
        e.prefill_pending() > 0 && e.prefill_pending() < pending,
        "the long prompt kept being prefilled meanwhile ({} of {pending} tokens left)",
        e.prefill_pending()
    );
    assert_eq!(e.take_finished(short_id).unwrap().output(), &short_solo[..]);
    steps_until_finished(&mut e, long_id, 40);
    assert_eq!(e.take_finished(long_id).unwrap().output(), &long_solo[..]);
}

#[test]
fn short_prompts_at_every_step_do_not_starve_the_oldest() {
    let (model, _) = demo();
    let chunks = 12;
    let mut e = engine(&model);
    let long_id = e.add(greedy(long_prompt(CHUNK * chunks, 0), 1)).unwrap();
    // A chunk-long prompt arrives at every step: alone, each would take the whole chunk.
    let mut shorts = Vec::new();
    let mut steps = 0;
    loop {
        shorts.push(
            e.add(greedy(
                long_prompt(CHUNK + shorts.len() % 7, 1 + shorts.len() as u32),
                1,
            ))
            .unwrap(),
        );
        steps += 1;
        if e.step().unwrap().contains(&Event::Finished { id: long_id }) {
            break;
        }
        assert!(steps <= 5 * chunks, "the oldest prompt starved");
    }
    // Shortest first still served the newcomers along the way.
    let done = shorts
        .iter()
        .filter(|&&id| e.take_finished(id).is_some())
        .count();
    assert!(done > 0, "no short prompt finished in {steps} steps");
}
