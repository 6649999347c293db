//! The prefix cache on the demo model with its draft: a repeated request and every turn of a
//! growing conversation resume from the cached prefix, and decode exactly what an engine
//! without the cache decodes; a budget that holds a single entry evicts and stays exact.

use std::path::Path;
use std::sync::Arc;

use splash_engine::{Completion, DFlashDrafter, Drafter, Engine, Request, SamplingParams};
use splash_model::{load, DFlashDraft, Model};

fn demo() -> (Arc<Model>, Arc<dyn Drafter>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let model = Arc::new(load(&dir).unwrap());
    let draft = DFlashDraft::load(&dir.join("draft")).unwrap();
    (model, Arc::new(DFlashDrafter::new(draft.into())))
}

fn request(prompt: Vec<u32>) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens: 60,
        stop: Vec::new(),
        ignore_eos: false,
        grammar: None,
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
