//! The CUDA forward pass reproduces the CPU forward pass on the committed fixtures (dense,
//! MoE, MLX 4-bit, GGUF), for prefill and token-by-token decode and every KV format. Needs a
//! GPU: skipped without one unless `SPLASH_REQUIRE_GPU` is set.
#![cfg(feature = "cuda")]

use splash_backend::cuda::Gpu;

mod common;
use common::{argmax, fixture, max_rel};
use splash_model::{load, KvFormat, Logits, Model};

/// The same checkpoint twice: on the CPU and on GPU 0 (None without a GPU).
fn pair(name: &str) -> Option<(Model, Model)> {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            assert!(
                std::env::var_os("SPLASH_REQUIRE_GPU").is_none(),
                "SPLASH_REQUIRE_GPU is set but no GPU is usable: {e}"
            );
            eprintln!("skipped: {e}");
            return None;
        }
    };
    // f32 arithmetic: these tiny random models amplify int8/bf16 activation rounding beyond
    // any useful tolerance (those paths are checked op by op in splash-backend's cuda_ops).
    gpu.set_exact(true);
    let cpu = load(&fixture(name)).unwrap();
    let mut on_gpu = load(&fixture(name)).unwrap();
    on_gpu.graph.to_gpu(gpu).unwrap();
    assert!(on_gpu.graph.device().starts_with("cuda"));
    Some((cpu, on_gpu))
}

const CHECKPOINTS: [&str; 6] = [
    "qwen35-dense",
    "qwen35-moe",
    "qwen35-dense-mlx4",
    "qwen35-moe-mlx4",
    "qwen35-dense-gguf/model-Q4_mix.gguf",
    "qwen35-moe-gguf/model-Q8_0.gguf",
];

#[test]
fn prefill_logits_match_the_cpu() {
    for name in CHECKPOINTS {
        let Some((cpu, gpu)) = pair(name) else { return };
        let text = std::fs::read_to_string(fixture("qwen35-dense/ppl.txt")).unwrap();
        let ids = cpu.tokenizer.encode(&text).unwrap();
        for kv in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let lc = cpu
                .graph
                .forward(&mut cpu.graph.new_state_with(kv), &ids, Logits::All)
                .unwrap();
            let lg = gpu
                .graph
                .forward(&mut gpu.graph.new_state_with(kv), &ids, Logits::All)
                .unwrap();
            let err = max_rel(&lg, &lc);
            let v = cpu.config.vocab_size;
            let agree = lg
                .chunks_exact(v)
                .zip(lc.chunks_exact(v))
                .filter(|(a, b)| argmax(a) == argmax(b))
                .count();
            println!(
                "{name} {kv:?}: GPU vs CPU logits {err:.2e}, top-1 agreement {agree}/{}",
                ids.len()
            );
            assert!(
                err < 1e-3,
                "{name} {kv:?}: GPU logits differ from the CPU by {err}"
            );
        }
    }
}

#[test]
fn greedy_decode_matches_the_cpu() {
    for name in CHECKPOINTS {
        let Some((cpu, gpu)) = pair(name) else { return };
        let prompt = cpu
            .tokenizer
            .encode("The quick brown fox jumps over the lazy dog.")
            .unwrap();
        let (mut sc, mut sg) = (cpu.graph.new_state(), gpu.graph.new_state());
        let mut lc = cpu.graph.forward(&mut sc, &prompt, Logits::Last).unwrap();
        let mut lg = gpu.graph.forward(&mut sg, &prompt, Logits::Last).unwrap();
        for step in 0..40 {
            let err = max_rel(&lg, &lc);
            assert!(err < 1e-3, "{name} step {step}: {err}");
            let mut sorted = lc.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let (tc, tg) = (argmax(&lc), argmax(&lg));
            // A near-tie may flip on summation order; anything else must agree.
            if sorted[0] - sorted[1] > 1e-3 {
                assert_eq!(tg, tc, "{name} step {step}: GPU picked another token");
            }
            lc = cpu
                .graph
                .forward(&mut sc, &[tc as u32], Logits::Last)
                .unwrap();
            lg = gpu
                .graph
                .forward(&mut sg, &[tc as u32], Logits::Last)
                .unwrap();
        }
        // The state reports device memory.
        assert!(sg.memory_bytes() > 0);
    }
}

#[test]
fn long_sequences_grow_the_device_cache() {
    let Some((cpu, gpu)) = pair("qwen35-dense") else {
        return;
    };
    // Past the initial 1024-position capacity of the device KV cache, in chunks.
    let ids: Vec<u32> = (0..1500u32).map(|i| (i * 37 + 11) % 500).collect();
    let (mut sc, mut sg) = (
        cpu.graph.new_state_with(KvFormat::Int8),
        gpu.graph.new_state_with(KvFormat::Int8),
    );
    let mut last = (Vec::new(), Vec::new());
    for chunk in ids.chunks(300) {
        last.0 = cpu.graph.forward(&mut sc, chunk, Logits::Last).unwrap();
        last.1 = gpu.graph.forward(&mut sg, chunk, Logits::Last).unwrap();
    }
    let err = max_rel(&last.1, &last.0);
    assert!(err < 1e-3, "after 1500 tokens: {err}");
}
