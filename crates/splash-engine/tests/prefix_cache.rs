//! The prefix cache on the demo model with its draft: a repeated request and every turn of a
//! growing ten-turn conversation resume from the cached prefix, and decode exactly what an engine
//! without the cache decodes; a budget that holds a single entry evicts and stays exact.

use std::path::Path;

use splash_engine::{Completion, DiskCacheConfig, Engine, Request};
use splash_model::Model;

mod common;
use common::{demo, greedy};

fn request(prompt: Vec<u32>) -> Request {
    Request {
        ignore_eos: false,
        ..greedy(prompt, 60)
    }
}

/// The chat-template rendering of `turns` (user, assistant, user, ...) after a long system
/// prompt, ending with the generation prompt.
fn render(turns: &[String]) -> String {
    let mut s = format!(
        "<|im_start|>system\n{}<|im_end|>\n",
        "You are a helpful assistant. ".repeat(40)
    );
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        s += &format!("<|im_start|>{role}\n{t}<|im_end|>\n");
    }
    s + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
}

fn run(engine: &mut Engine, model: &Model, turns: &[String]) -> Completion {
    let prompt = model.tokenizer.encode(&render(turns)).unwrap();
    engine.generate(request(prompt), |_| {}).unwrap()
}

#[test]
fn repeated_and_growing_prompts_resume_from_the_cache_exactly() {
    let (model, draft) = demo();
    let mut cached = Engine::new(model.clone())
        .with_drafter(draft.clone())
        .with_draft_every_step(true)
        .with_prefix_cache(1 << 30);
    let mut plain = Engine::new(model.clone())
        .with_drafter(draft)
        .with_draft_every_step(true);
    let questions = [
        "What is the capital of Kenya?",
        "What is 17 + 25?",
        "How many legs does a spider have?",
        "What is the opposite of \"early\"?",
        "Name a primary color.",
        "What is 6 times 7?",
        "Which planet is closest to the Sun?",
        "Spell \"cat\" backwards.",
        "What color is a clear sky?",
        "Thanks!",
    ];
    let mut turns: Vec<String> = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        turns.push(q.to_string());
        let a = run(&mut cached, &model, &turns);
        let b = run(&mut plain, &model, &turns);
        assert_eq!(a.tokens, b.tokens, "turn {i}: the cache changed the output");
        assert_eq!(b.cached_tokens, 0);
        // Turn 0 finds nothing; later turns resume after at least the previous turn's prompt
        // up to its generation prompt.
        if i == 0 {
            assert_eq!(a.cached_tokens, 0);
        } else {
            assert!(a.cached_tokens > 200, "turn {i}: {}", a.cached_tokens);
        }
        // The same request again: everything up to its generation prompt is cached.
        let again = run(&mut cached, &model, &turns);
        assert_eq!(again.tokens, a.tokens, "turn {i}: repeat differs");
        assert!(again.cached_tokens > a.cached_tokens, "turn {i}");
        assert!(again.cached_tokens + 12 >= again.prompt_tokens, "turn {i}");
        turns.push(a.text.trim().to_string());
    }
    let stats = cached.prefix_cache_stats();
    assert_eq!(stats.hits, 2 * questions.len() as u64 - 1, "{stats:?}");
}

#[test]
fn a_budget_of_one_entry_evicts_and_stays_exact() {
    let (model, draft) = demo();
    let first = run(
        &mut Engine::new(model.clone()).with_drafter(draft.clone()),
        &model,
        &["What is 3 + 4?".to_string()],
    );
    // Room for about one prefix state of this prompt.
    let mut small = Engine::new(model.clone())
        .with_drafter(draft)
        .with_prefix_cache(1 << 20);
    for _ in 0..3 {
        for q in ["What is 3 + 4?", "What is 9 + 1?"] {
            let c = run(&mut small, &model, &[q.to_string()]);
            if q == "What is 3 + 4?" {
                assert_eq!(c.tokens, first.tokens);
            }
        }
    }
    let stats = small.prefix_cache_stats();
    assert!(
        stats.evictions > 0 && stats.bytes <= stats.budget_bytes,
        "{stats:?}"
    );
}

#[test]
fn a_long_prompt_changed_far_back_resumes_from_a_rolling_checkpoint() {
    let (model, draft) = demo();
    let tok = &model.tokenizer;
    let mut cached = Engine::new(model.clone())
        .with_drafter(draft.clone())
        .with_prefix_cache(1 << 30);
    let text = |tail: &str| {
        format!(
            "<|im_start|>system\n{}{tail}<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "You are a helpful assistant. ".repeat(900)
        )
    };
    let a = tok.encode(&text("Be brief.")).unwrap();
    let b = tok.encode(&text("Be kind.")).unwrap();
    assert!(
        a.len() > 4200 && a[..4096] == b[..4096],
        "{} tokens",
        a.len()
    );
    cached.generate(request(a), |_| {}).unwrap();
    let resumed = cached.generate(request(b.clone()), |_| {}).unwrap();
    assert_eq!(resumed.cached_tokens, 4096);
    let plain = Engine::new(model.clone())
        .with_drafter(draft)
        .generate(request(b), |_| {})
        .unwrap();
    assert_eq!(resumed.tokens, plain.tokens);
}

fn disk(root: &Path, persistent: bool) -> DiskCacheConfig {
    DiskCacheConfig {
        root: root.to_path_buf(),
        budget_bytes: 1 << 30,
        persistent,
        identity: "demo + draft, int8 KV".into(),
    }
}

fn temp_root(name: &str) -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("splash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

#[test]
fn the_disk_tier_serves_what_memory_evicted_exactly() {
    let (model, draft) = demo();
    let root = temp_root("disk-tier");
    let questions = ["What is 3 + 4?", "What is 9 + 1?", "Name a color."];
    let plain: Vec<_> = questions
        .iter()
        .map(|q| {
            run(
                &mut Engine::new(model.clone()).with_drafter(draft.clone()),
                &model,
                &[q.to_string()],
            )
        })
        .collect();
    // No memory tier at all: every entry goes to disk, every hit comes from it.
    let mut engine = Engine::new(model.clone())
        .with_drafter(draft.clone())
        .with_disk_cache(disk(&root, false))
        .unwrap();
    let dir = engine.disk_cache_dir().unwrap().to_path_buf();
    for (q, want) in questions.iter().zip(&plain) {
        let first = run(&mut engine, &model, &[q.to_string()]);
        assert_eq!(first.tokens, want.tokens, "{q}: first run");
        engine.flush_disk_cache();
        let again = run(&mut engine, &model, &[q.to_string()]);
        assert_eq!(again.tokens, want.tokens, "{q}: from disk");
        assert!(
            again.cached_tokens + 12 >= again.prompt_tokens,
            "{q}: {again:?}"
        );
    }
    let stats = engine.prefix_cache_stats();
    let d = stats.disk.unwrap();
    assert!(stats.disk_hits >= questions.len() as u64, "{stats:?}");
    assert!(
        d.entries > 0 && d.writes > 0 && d.bytes <= d.budget_bytes,
        "{d:?}"
    );
    assert_eq!(stats.entries, 0, "nothing in memory");

    // A damaged file is detected, deleted, and its prefix recomputed: same output.
    engine.flush_disk_cache();
    let files = std::fs::read_dir(&dir).unwrap().flatten();
    for f in files.filter(|f| f.path().extension().is_some_and(|x| x == "splc")) {
        let mut b = std::fs::read(f.path()).unwrap();
        let n = b.len();
        b[n / 2] ^= 0x40;
        std::fs::write(f.path(), b).unwrap();
    }
    let errors_before = engine.prefix_cache_stats().disk.unwrap().errors;
    let c = run(&mut engine, &model, &[questions[0].to_string()]);
    assert_eq!(c.tokens, plain[0].tokens, "after damage");
    assert_eq!(c.cached_tokens, 0, "a damaged file is never used");
    assert!(engine.prefix_cache_stats().disk.unwrap().errors > errors_before);
    drop(engine);
    assert!(!dir.exists(), "the tier's files are removed at exit");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_persistent_disk_tier_serves_the_next_process() {
    let (model, draft) = demo();
    let root = temp_root("disk-persistent");
    let turns = ["What is the capital of Kenya?".to_string()];
    let want = run(
        &mut Engine::new(model.clone()).with_drafter(draft.clone()),
        &model,
        &turns,
    );
    {
        let mut first = Engine::new(model.clone())
            .with_drafter(draft.clone())
            .with_prefix_cache(1 << 30)
            .with_disk_cache(disk(&root, true))
            .unwrap();
        run(&mut first, &model, &turns);
        // Memory entries go to disk when the engine ends (a restart keeps them).
    }
    let mut second = Engine::new(model.clone())
        .with_drafter(draft.clone())
        .with_disk_cache(disk(&root, true))
        .unwrap();
    let c = run(&mut second, &model, &turns);
    assert_eq!(c.tokens, want.tokens);
    assert!(c.cached_tokens + 12 >= c.prompt_tokens, "{c:?}");
    assert_eq!(second.prefix_cache_stats().disk_hits, 1);
    drop(second);
    // Another identity (another model or format) does not see these files.
    let mut other = Engine::new(model.clone())
        .with_drafter(draft)
        .with_disk_cache(DiskCacheConfig {
            identity: "another model".into(),
            ..disk(&root, true)
        })
        .unwrap();
    assert_eq!(run(&mut other, &model, &turns).cached_tokens, 0);
    drop(other);
    let _ = std::fs::remove_dir_all(&root);
}
