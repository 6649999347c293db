//! `splash bench`: prefill throughput at a fixed prompt length and single-sequence decode speed.

use std::time::Instant;

use serde_json::json;
use splash_engine::{Engine, Request, SamplingParams};
use splash_model::Logits;

use crate::model_arg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: model_arg::ModelArgs,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// KV-cache storage for the decode measurement: int8, bf16, or f32.
    #[arg(long, default_value = "int8")]
    kv_format: splash_model::KvFormat,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let model = model_arg::load(&a.model)?;
    let vocab = model.config.vocab_size as u64;
    // Deterministic pseudo-random prompt: speed does not depend on the ids.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let prompt: Vec<u32> = (0..a.prompt_tokens)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab) as u32
        })
        .collect();
    let repeat = a.repeat.max(1);

    // Warm-up (thread pool, page cache of the weights).
    model.graph.forward(
        &mut model.graph.new_state_with(a.kv_format),
        &prompt[..prompt.len().min(16)],
        Logits::Last,
    )?;

    let mut prefill = Vec::new();
    for _ in 0..repeat {
        let mut state = model.graph.new_state_with(a.kv_format);
        let t0 = Instant::now();
        model.graph.forward(&mut state, &prompt, Logits::Last)?;
        prefill.push(prompt.len() as f64 / t0.elapsed().as_secs_f64());
    }
    let mut decode = Vec::new();
    for _ in 0..repeat {
        let mut engine = Engine::new(model.clone()).with_kv_format(a.kv_format);
        let c = engine.generate(
            Request {
                prompt: prompt[..prompt.len().min(16)].to_vec(),
                sampling: SamplingParams::greedy(),
                max_tokens: a.decode_tokens,
                stop: Vec::new(),
                ignore_eos: true,
                grammar: None,
            },
            |_| {},
        )?;
        decode.push(c.tokens.len() as f64 / c.decode_time.as_secs_f64());
    }
    let (p, d) = (median(&mut prefill), median(&mut decode));
    let threads = rayon::current_num_threads();
    if a.json {
        println!(
            "{}",
            json!({
                "model": model.dir.display().to_string(),
                "parameters": model.graph.num_parameters(),
                "threads": threads,
                "prompt_tokens": a.prompt_tokens,
                "prefill_tok_s": p,
                "decode_tokens": a.decode_tokens,
                "decode_tok_s": d,
            })
        );
    } else {
        println!(
            "{}: {} parameters, {threads} threads\nprefill {:>5} tokens: {p:>9.1} tok/s\ndecode  {:>5} tokens: {d:>9.2} tok/s",
            model.dir.display(),
            model.graph.num_parameters(),
            a.prompt_tokens,
            a.decode_tokens,
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
