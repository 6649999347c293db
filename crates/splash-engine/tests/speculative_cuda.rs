//! Speculative decoding on the CUDA backend, through the engine's real path: target taps,
//! verify and GDN rollback on the device, the DFlash draft on the device. Greedy output with
//! the draft is identical token for token to output without it (on the same GPU, in its
//! default fast arithmetic), for dense and MoE fixtures in bf16 and GGUF with random drafts
//! (frequent partial acceptance) and for the trained demo with its trained draft (long
//! acceptances), as stored and quantised to Q4_K on load (the tensor-core GEMVs; it must be
//! accepted about as often as the same quantised draft on the CPU).
//! Needs a GPU: skipped without one unless `SPLASH_REQUIRE_GPU` is set.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use splash_engine::{Drafter, Engine};
use splash_model::{load, Model};

mod common;
use common::{demo_draft, gguf, gpu, greedy, on_gpu_with, repo};

fn generate(
    m: &Arc<Model>,
    drafter: Option<(&Arc<dyn Drafter>, bool)>,
    prompt: &[u32],
    max_tokens: usize,
) -> (Vec<u32>, f64) {
    let mut engine = Engine::new(m.clone()).with_prefill_chunk(64);
    if let Some((d, every_step)) = drafter {
        engine = engine
            .with_drafter(d.clone())
            .with_draft_every_step(every_step);
    }
    let c = engine
        .generate(greedy(prompt.to_vec(), max_tokens), |_| {})
        .unwrap();
    let tau = c.speculation.map_or(0.0, |s| s.acceptance_length());
    (c.tokens, tau)
}

#[test]
fn greedy_output_with_the_draft_is_the_output_without_it() {
    let Some(gpu) = gpu() else { return };
    // bf16 targets (float GEMVs) and GGUF targets (the integer GEMVs, generated fixtures).
    let dense_q4 = gguf("qwen35-dense-gguf/model-Q4_mix.gguf");
    let moe_q8 = gguf("qwen35-moe-gguf/model-Q8_0.gguf");
    let (dense_q4, moe_q8) = (dense_q4.to_str().unwrap(), moe_q8.to_str().unwrap());
    let cases = [
        (
            "tests/fixtures/qwen35-dense",
            "tests/fixtures/dflash/dense-dflash",
        ),
        (
            "tests/fixtures/qwen35-moe",
            "tests/fixtures/dflash/moe-dflash",
        ),
        (dense_q4, "tests/fixtures/dflash/dense-dflash"),
        (moe_q8, "tests/fixtures/dflash/moe-dflash"),
        // DFlash2: dynamic convolutions on the device, the candidate selector on the host.
        (
            "tests/fixtures/qwen35-dense",
            "tests/fixtures/dflash/dense-dflash2",
        ),
        (moe_q8, "tests/fixtures/dflash/moe-dflash2"),
        ("models/demo", "models/demo/draft"),
    ];
    let quantized = ("models/demo", "models/demo/draft");
    // The quantised demo draft's mean τ with a block every step: on the GPU, then on the CPU.
    let mut demo_taus = Vec::new();
    let runs = cases.iter().map(|&c| (c, false)).chain([(quantized, true)]);
    for ((target, draft), quantize) in runs {
        let (m, d) = on_gpu_with(&gpu, target, draft, quantize);
        let mut taus = Vec::new();
        let chat = |q: &str| {
            m.tokenizer
                .encode(&format!(
                    "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
                ))
                .unwrap()
        };
        let prompts = [
            chat("What is 47 + 38?"),
            chat("Write a Python function that reverses a list."),
            (0..150u32).map(|i| (i * 53 + 7) % 500).collect(),
        ];
        for prompt in &prompts {
            let (plain, _) = generate(&m, None, prompt, 96);
            for every_step in [true, false] {
                let (spec, tau) = generate(&m, Some((&d, every_step)), prompt, 96);
                println!(
                    "{target}: {} tokens, τ = {tau:.2} (draft every step: {every_step}, Q4_K draft: {quantize})",
                    spec.len()
                );
                if every_step {
                    taus.push(tau);
                }
                assert_eq!(
                    spec, plain,
                    "{target}: speculative output differs (draft every step: {every_step})"
                );
            }
        }
        if quantize {
            demo_taus.push(taus.iter().sum::<f64>() / taus.len() as f64);
            // The same prompts on the CPU, with the draft quantised there.
            let (m, d) = (Arc::new(load(&repo(target)).unwrap()), demo_draft(true));
            let cpu: Vec<f64> = prompts
                .iter()
                .map(|p| generate(&m, Some((&d, true)), p, 96).1)
                .collect();
            demo_taus.push(cpu.iter().sum::<f64>() / cpu.len() as f64);
        }
    }
    println!("demo τ with the Q4_K draft, GPU and CPU: {demo_taus:?}");
    assert!(
        demo_taus[0] > 0.9 * demo_taus[1],
        "the Q4_K draft is accepted less on the GPU than on the CPU: τ {demo_taus:?}"
    );
}
