//! The scheduler on the CUDA backend: concurrent sequences share batched GPU passes and keep
//! their solo outputs (plain and speculative); a repeated prompt resumes from a GPU prefix
//! cache entry, from memory and from the disk tier; preempted sequences resume exactly.
//! Needs a GPU: skipped without one unless `SPLASH_REQUIRE_GPU` is set.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use splash_engine::{DiskCacheConfig, Drafter, Engine, Request};
use splash_model::Model;

mod common;
use common::{gpu, greedy, on_gpu};

/// The demo and its draft on GPU 0 (None without a GPU).
fn demo_on_gpu() -> Option<(Arc<Model>, Arc<dyn Drafter>)> {
    gpu().map(|g| on_gpu(&g, "models/demo", "models/demo/draft"))
}

fn prompts(m: &Model) -> Vec<Vec<u32>> {
    [
        "What is 47 + 38?",
        "Write a Python function that reverses a string.",
        "Name the planets of the solar system.",
        "Call the weather tool for Paris.",
        "What is the capital of Kenya?",
    ]
    .iter()
    .map(|q| {
        let system = "You are a helpful assistant. ".repeat(20);
        let text = format!(
            "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        );
        m.tokenizer.encode(&text).unwrap()
    })
    .collect()
}

/// A greedy request that ends at EOS. Past EOS the demo's logits come close to ties, and a
/// solo pass (the fast kernels) and a batched one (the batch-invariant kernels) may break them
/// differently; nothing past EOS is served.
fn request(prompt: &[u32], max_tokens: usize) -> Request {
    Request {
        ignore_eos: false,
        ..greedy(prompt.to_vec(), max_tokens)
    }
}

/// Runs all prompts in one engine; returns the outputs in order.
fn together(engine: &mut Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| engine.add(request(p, max_tokens)).unwrap())
        .collect();
    while engine.has_work() {
        engine.step().unwrap();
    }
    ids.into_iter()
        .map(|id| engine.take_finished(id).unwrap().output().to_vec())
        .collect()
}

#[test]
fn concurrent_gpu_sequences_match_their_solo_runs() {
    let Some((m, draft)) = demo_on_gpu() else {
        return;
    };
    let prompts = prompts(&m);
    for drafter in [None, Some(&draft)] {
        let engine = || {
            let e = Engine::new(m.clone()).with_prefill_chunk(64);
            match drafter {
                Some(d) => e.with_drafter(d.clone()).with_draft_every_step(true),
                None => e,
            }
        };
        let solo: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| engine().generate(request(p, 64), |_| {}).unwrap().tokens)
            .collect();
        let mut e = engine();
        let got = together(&mut e, &prompts, 64);
        let stats = e.batch_stats();
        println!("draft {}: {stats:?}", drafter.is_some());
        assert!(
            stats.sequences > stats.passes,
            "passes were shared: {stats:?}"
        );
        for (i, (g, s)) in got.iter().zip(&solo).enumerate() {
            assert_eq!(
                g,
                s,
                "sequence {i} (draft {}) changed when batched",
                drafter.is_some()
            );
        }
        // Preempted under a small KV budget: resumed from the GPU prefix cache, exactly.
        let longest = prompts.iter().map(Vec::len).max().unwrap() + 64 + 16;
        let mut small = engine()
            .with_kv_budget(2 * longest)
            .with_prefix_cache(1 << 30);
        let got = together(&mut small, &prompts, 64);
        let stats = small.batch_stats();
        println!("draft {} under a KV budget: {stats:?}", drafter.is_some());
        assert!(
            stats.preemptions > 0 && stats.resumed_cached == stats.preemptions,
            "{stats:?}"
        );
        assert_eq!(
            got,
            solo,
            "preemption changed an output (draft {})",
            drafter.is_some()
        );
    }
}

#[test]
fn the_gpu_prefix_cache_serves_repeats_from_memory_and_disk() {
    let Some((m, draft)) = demo_on_gpu() else {
        return;
    };
    let prompt = prompts(&m).remove(1);
    let root = std::env::temp_dir().join(format!("splash-gpu-cache-{}", std::process::id()));
    let want = Engine::new(m.clone())
        .with_drafter(draft.clone())
        .generate(greedy(prompt.clone(), 48), |_| {})
        .unwrap()
        .tokens;
    for memory in [1usize << 30, 0] {
        let mut e = Engine::new(m.clone())
            .with_drafter(draft.clone())
            .with_prefix_cache(memory)
            .with_disk_cache(DiskCacheConfig {
                root: root.clone(),
                budget_bytes: 1 << 30,
                persistent: false,
                identity: "demo on the GPU".into(),
            })
            .unwrap();
        let first = e.generate(greedy(prompt.clone(), 48), |_| {}).unwrap();
        e.flush_disk_cache();
        let again = e.generate(greedy(prompt.clone(), 48), |_| {}).unwrap();
        let stats = e.prefix_cache_stats();
        println!("memory tier {memory}: {stats:?}");
        assert_eq!(first.tokens, want);
        assert_eq!(
            again.tokens, want,
            "resumed from the cache (memory tier {memory})"
        );
        assert!(again.cached_tokens > 100, "{again:?}");
        if memory == 0 {
            assert_eq!(stats.disk_hits, 1, "{stats:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
