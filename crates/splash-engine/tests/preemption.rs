//! Preemption under a KV budget smaller than what the running requests grow to: the newest
//! sequences are parked and resumed, and no request loses or repeats a token. With the prefix
//! cache the parked state itself comes back, so every output is exactly its solo run's.

use std::sync::Arc;

use splash_engine::{Engine, Event, FinishReason, Request, SamplingParams};
use splash_model::Model;

mod common;
use common::{demo, greedy};

const MAX_TOKENS: usize = 48;

/// A greedy request of `MAX_TOKENS` that ignores EOS.
fn request(prompt: Vec<u32>) -> Request {
    greedy(prompt, MAX_TOKENS)
}

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    [
        "What is 12 + 30?",
        "Name three rivers.",
        "Count to five.",
        "Say hello in French.",
    ]
    .iter()
    .map(|q| {
        let text = format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n");
        model.tokenizer.encode(&text).unwrap()
    })
    .collect()
}

/// Runs all prompts at once; returns each output and the text streamed for it.
fn run_all(engine: &mut Engine, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, String)> {
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| engine.add(request(p.clone())).unwrap())
        .collect();
    let mut texts = vec![String::new(); ids.len()];
    let mut most_parked = 0;
    while engine.has_work() {
        for ev in engine.step().unwrap() {
            if let Event::Text { id, text } = ev {
                texts[ids.iter().position(|&s| s == id).unwrap()].push_str(&text);
            }
        }
        most_parked = most_parked.max(engine.num_parked());
        assert!(
            engine.kv_tokens_in_use() <= engine.kv_budget(),
            "the running sequences hold more than the budget"
        );
    }
    assert!(most_parked > 0, "the budget never forced a preemption");
    ids.into_iter()
        .zip(texts)
        .map(|(id, text)| {
            let seq = engine.take_finished(id).unwrap();
            assert_eq!(seq.finish_reason(), Some(&FinishReason::Length));
            (seq.output().to_vec(), text)
        })
        .collect()
}

#[test]
fn preempted_sequences_resume_from_the_cache_exactly() {
    let (model, draft) = demo();
    let prompts = prompts(&model);
    for drafter in [None, Some(draft)] {
        let engine = |m: &Arc<Model>| {
            let e = Engine::new(m.clone()).with_prefill_chunk(8);
            match &drafter {
                Some(d) => e.with_drafter(d.clone()).with_draft_every_step(true),
                None => e,
            }
        };
        let solo: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                engine(&model)
                    .generate(request(p.clone()), |_| {})
                    .unwrap()
                    .tokens
            })
            .collect();
        // Room for two sequences at their longest, not four.
        let longest = prompts.iter().map(Vec::len).max().unwrap() + MAX_TOKENS + 16;
        let mut e = engine(&model)
            .with_kv_budget(2 * longest)
            .with_prefix_cache(1 << 30);
        let got = run_all(&mut e, &prompts);
        let stats = e.batch_stats();
        println!("draft {}: {stats:?}", drafter.is_some());
        for (i, ((out, text), want)) in got.iter().zip(&solo).enumerate() {
            assert_eq!(out, want, "sequence {i} (draft: {})", drafter.is_some());
            assert_eq!(text, &model.tokenizer.decode(want, false).unwrap());
        }
        assert!(stats.preemptions > 0, "{stats:?}");
        assert_eq!(stats.resumed_cached, stats.preemptions, "{stats:?}");
        assert_eq!(stats.resumed_recomputed, 0, "{stats:?}");
    }
}

#[test]
fn without_a_cache_preempted_sequences_are_recomputed_and_lose_nothing() {
    let (model, draft) = demo();
    let prompts = prompts(&model);
    let longest = prompts.iter().map(Vec::len).max().unwrap() + MAX_TOKENS + 16;
    let mut e = Engine::new(model.clone())
        .with_drafter(draft)
        .with_prefill_chunk(8)
        .with_kv_budget(2 * longest);
    let got = run_all(&mut e, &prompts);
    let stats = e.batch_stats();
    println!("{stats:?}");
    assert!(stats.resumed_recomputed > 0, "{stats:?}");
    for (i, (out, text)) in got.iter().enumerate() {
        // Every token once, and the streamed text is exactly the output's.
        assert_eq!(out.len(), MAX_TOKENS, "sequence {i}");
        assert_eq!(
            text,
            &model.tokenizer.decode(out, false).unwrap(),
            "sequence {i}"
        );
    }
}

/// Greedy, seeded sampled and JSON-schema requests preempted together: each resumes with its
/// sampler and grammar state, and ends exactly as it does alone.
#[test]
fn sampled_and_constrained_sequences_survive_preemption_exactly() {
    use splash_engine::{Constraint, GrammarRequest};
    let (model, draft) = demo();
    let prompts = prompts(&model);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["answer", "n"],
        "additionalProperties": false
    });
    let requests: Vec<Request> = vec![
        request(prompts[0].clone()),
        Request {
            sampling: SamplingParams {
                temperature: 0.8,
                seed: Some(3),
                ..Default::default()
            },
            ..request(prompts[1].clone())
        },
        Request {
            grammar: Some(GrammarRequest {
                constraint: Constraint::JsonSchema(schema),
                after: Vec::new(),
            }),
            ignore_eos: false,
            ..request(prompts[2].clone())
        },
        request(prompts[3].clone()),
    ];
    let engine = || {
        Engine::new(model.clone())
            .with_drafter(draft.clone())
            .with_prefill_chunk(64)
    };
    let solo: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| engine().generate(r.clone(), |_| {}).unwrap().tokens)
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap() + MAX_TOKENS + 16;
    let mut e = engine()
        .with_kv_budget(longest * 3 / 2)
        .with_prefix_cache(1 << 30);
    let ids: Vec<_> = requests.into_iter().map(|r| e.add(r).unwrap()).collect();
    while e.has_work() {
        e.step().unwrap();
    }
    let stats = e.batch_stats();
    assert!(stats.preemptions > 0, "{stats:?}");
    for (i, (id, want)) in ids.into_iter().zip(&solo).enumerate() {
        let seq = e.take_finished(id).unwrap();
        assert_eq!(seq.output(), &want[..], "request {i}");
    }
    let json = model.tokenizer.decode(&solo[2], false).unwrap();
    serde_json::from_str::<serde_json::Value>(&json).unwrap_or_else(|err| panic!("{err}: {json}"));
}
