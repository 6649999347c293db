//! The engine on the transformers fixtures (`tests/fixtures/qwen35-{dense,moe}`): greedy
//! continuations and perplexity as transformers computed them, stop rules, seeded sampling.

use std::path::Path;
use std::sync::Arc;

use splash_engine::{
    perplexity, Engine, EngineError, FinishReason, PerplexityOptions, Request, SamplingParams,
};
use splash_model::{load, KvFormat, Model};

mod common;
use common::{fixture, greedy};

fn reference(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn model(name: &str) -> (Arc<Model>, serde_json::Value) {
    let dir = fixture(name);
    (Arc::new(load(&dir).unwrap()), reference(&dir))
}

fn greedy_matches_transformers(name: &str) {
    let (m, r) = model(name);
    let prompts = r["prompts"].as_array().unwrap();
    for g in r["greedy"].as_array().unwrap() {
        let prompt = ids(&prompts[g["prompt_index"].as_u64().unwrap() as usize]["ids"]);
        let want = ids(&g["output_ids"]);
        // Small prefill chunks: the engine's chunked prefill must not change the result.
        let mut engine = Engine::new(m.clone())
            .with_prefill_chunk(5)
            .with_kv_format(KvFormat::F32);
        let c = engine.generate(greedy(prompt, want.len()), |_| {}).unwrap();
        assert_eq!(
            c.tokens, want,
            "{name}: greedy output differs from transformers"
        );
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert_eq!(c.text, m.tokenizer.decode(&want, false).unwrap());
    }
}

#[test]
fn perplexity_beside_a_baseline_kv_format() {
    let (m, _) = model("qwen35-dense");
    let text = std::fs::read_to_string(fixture("qwen35-dense").join("ppl.txt")).unwrap();
    let tokens = m.tokenizer.encode(&text).unwrap();
    let run = |kv, baseline| {
        let opts = PerplexityOptions {
            kv,
            baseline,
            ..PerplexityOptions::new(4096, 64)
        };
        perplexity(&m, &tokens, &opts).unwrap()
    };
    let exact = run(KvFormat::F32, None);
    assert!(exact.baseline.is_none() && exact.top1 > 0.0 && exact.top1 <= 1.0);
    // Against itself: the same numbers, nothing between them.
    let same = run(KvFormat::F32, Some(KvFormat::F32)).baseline.unwrap();
    assert_eq!(same.perplexity, exact.perplexity);
    assert!(
        same.mean_kl.abs() < 1e-12 && same.same_top1 == 1.0,
        "{same:?}"
    );
    // int8 against f32: the int8 run is what is scored, f32 the baseline.
    let int8 = run(KvFormat::Int8, Some(KvFormat::F32));
    let b = int8.baseline.unwrap();
    assert_eq!(b.perplexity, exact.perplexity);
    assert_eq!(int8.perplexity, run(KvFormat::Int8, None).perplexity);
    assert_ne!(int8.perplexity, exact.perplexity);
    assert!(b.mean_kl > 0.0 && b.mean_kl < 0.05, "{b:?}");
    assert!(b.same_top1 > 0.9, "{b:?}");
}

fn perplexity_matches_transformers(name: &str) {
    let (m, r) = model(name);
    let p = &r["perplexity"];
    let text = std::fs::read_to_string(fixture(name).join(p["file"].as_str().unwrap())).unwrap();
    let tokens = m.tokenizer.encode(&text).unwrap();
    assert_eq!(tokens.len() as u64, p["tokens"].as_u64().unwrap());
    let got = perplexity(&m, &tokens, &PerplexityOptions::new(4096, 64)).unwrap();
    let want = p["perplexity"].as_f64().unwrap();
    let rel = (got.perplexity - want).abs() / want;
    println!(
        "{name}: perplexity {:.6} vs transformers {want:.6} (rel {rel:.2e})",
        got.perplexity
    );
    assert!(
        rel < 1e-4,
        "{name}: perplexity {} vs {want}",
        got.perplexity
    );
    assert_eq!(got.predicted, tokens.len() - 1);
}

#[test]
fn dense_greedy_matches_transformers() {
    greedy_matches_transformers("qwen35-dense");
}

#[test]
fn moe_greedy_matches_transformers() {
    greedy_matches_transformers("qwen35-moe");
}

#[test]
fn dense_perplexity_matches_transformers() {
    perplexity_matches_transformers("qwen35-dense");
}

#[test]
fn moe_perplexity_matches_transformers() {
    perplexity_matches_transformers("qwen35-moe");
}

#[test]
fn eos_ends_the_sequence_at_the_right_token() {
    // The MoE fixture's greedy continuation of prompt 0 contains <|im_end|> (an EOS id).
    let (m, r) = model("qwen35-moe");
    let g = &r["greedy"][0];
    let prompt = ids(&r["prompts"][0]["ids"]);
    let full = ids(&g["output_ids"]);
    let eos = &m.generation.eos_token_ids;
    let at = full
        .iter()
        .position(|t| eos.contains(t))
        .expect("fixture output contains an EOS token");
    let mut engine = Engine::new(m.clone()).with_kv_format(KvFormat::F32);
    let c = engine
        .generate(
            Request {
                ignore_eos: false,
                ..greedy(prompt, full.len())
            },
            |_| {},
        )
        .unwrap();
    assert_eq!(c.tokens, full[..=at].to_vec());
    assert_eq!(c.finish_reason, FinishReason::Eos(full[at]));
}

#[test]
fn stop_string_cuts_the_text_before_it() {
    let (m, r) = model("qwen35-dense");
    let prompt = ids(&r["prompts"][1]["ids"]);
    let mut engine = Engine::new(m.clone());
    let full = engine
        .generate(greedy(prompt.clone(), 30), |_| {})
        .unwrap()
        .text;
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let first = full.find(&stop).unwrap();
    let mut streamed = String::new();
    let c = engine
        .generate(
            Request {
                stop: vec![stop.clone()],
                ..greedy(prompt, 30)
            },
            |t| streamed.push_str(t),
        )
        .unwrap();
    assert_eq!(c.text, full[..first]);
    assert_eq!(streamed, c.text);
    assert_eq!(c.finish_reason, FinishReason::StopString(stop));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (m, r) = model("qwen35-dense");
    let prompt = ids(&r["prompts"][0]["ids"]);
    let sampled = |seed| {
        let sampling = SamplingParams {
            temperature: 1.0,
            top_k: 50,
            top_p: 0.95,
            seed: Some(seed),
            ..Default::default()
        };
        Engine::new(m.clone())
            .generate(
                Request {
                    sampling,
                    ..greedy(prompt.clone(), 24)
                },
                |_| {},
            )
            .unwrap()
            .tokens
    };
    assert_eq!(sampled(1), sampled(1));
    assert_ne!(sampled(1), sampled(2));
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let (m, _) = model("qwen35-dense");
    let mut engine = Engine::new(m).with_max_context(16);
    let cases = [
        (greedy(vec![], 4), "prompt is empty"),
        (greedy(vec![1, 100_000], 4), "outside the vocabulary"),
        (greedy(vec![1; 16], 4), "context limit is 16"),
        (greedy(vec![1], 0), "max_tokens"),
        (
            Request {
                sampling: SamplingParams {
                    top_p: 2.0,
                    ..Default::default()
                },
                ..greedy(vec![1], 4)
            },
            "top_p",
        ),
    ];
    for (req, needle) in cases {
        match engine.add(req) {
            Err(EngineError::InvalidRequest(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("expected InvalidRequest({needle}), got {other:?}"),
        }
    }
}

#[test]
fn generation_stops_at_the_context_limit() {
    let (m, r) = model("qwen35-dense");
    let prompt = ids(&r["prompts"][0]["ids"]);
    let limit = prompt.len() + 5;
    let mut engine = Engine::new(m).with_max_context(limit);
    let c = engine
        .generate(greedy(prompt.clone(), 100), |_| {})
        .unwrap();
    assert_eq!(c.finish_reason, FinishReason::ContextFull);
    assert_eq!(prompt.len() + c.tokens.len(), limit);
}

/// Sequences decoding together share batched forward passes (one weight read for all); each
/// still gets the tokens it gets alone.
#[test]
fn concurrent_sequences_match_their_solo_runs() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        concurrent_matches_solo(name);
    }
}

fn concurrent_matches_solo(name: &str) {
    let (m, r) = model(name);
    let prompts: Vec<Vec<u32>> = r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["ids"]))
        .collect();
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            Engine::new(m.clone())
                .generate(greedy(p.clone(), 40), |_| {})
                .unwrap()
                .tokens
        })
        .collect();
    // All prompts in one engine, prefilled in small chunks while the others decode.
    let mut engine = Engine::new(m.clone()).with_prefill_chunk(4);
    let seq_ids: Vec<_> = prompts
        .iter()
        .map(|p| engine.add(greedy(p.clone(), 40)).unwrap())
        .collect();
    let mut texts = vec![String::new(); prompts.len()];
    while engine.has_work() {
        for ev in engine.step().unwrap() {
            if let splash_engine::Event::Text { id, text } = ev {
                texts[seq_ids.iter().position(|&s| s == id).unwrap()].push_str(&text);
            }
        }
    }
    for (i, id) in seq_ids.into_iter().enumerate() {
        let seq = engine.take_finished(id).unwrap();
        assert_eq!(
            seq.output(),
            &solo[i][..],
            "{name}: sequence {i} changed when batched with others"
        );
        assert_eq!(texts[i], m.tokenizer.decode(&solo[i], false).unwrap());
    }
}

#[test]
fn json_schema_constraint_gives_valid_json() {
    use splash_engine::{Constraint, GrammarRequest};
    let (m, r) = model("qwen35-dense");
    let prompt = ids(&r["prompts"][1]["ids"]);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    for temperature in [0.0, 1.0] {
        let req = Request {
            sampling: SamplingParams {
                temperature,
                seed: Some(5),
                ..Default::default()
            },
            grammar: Some(GrammarRequest {
                constraint: Constraint::JsonSchema(schema.clone()),
                after: Vec::new(),
            }),
            ..greedy(prompt.clone(), 300)
        };
        let c = Engine::new(m.clone()).generate(req, |_| {}).unwrap();
        assert_eq!(c.finish_reason, FinishReason::GrammarEnd, "{:?}", c.text);
        let v: serde_json::Value =
            serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {:?}", c.text));
        assert!(v["name"].as_str().unwrap().chars().count() <= 8);
        assert!(v["age"].as_u64().unwrap() <= 150);
        assert!(v["tags"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t == "a" || t == "b"));
    }
    let bad = Request {
        grammar: Some(GrammarRequest {
            constraint: Constraint::Lark("start: ???".into()),
            after: Vec::new(),
        }),
        ..greedy(prompt, 4)
    };
    match Engine::new(m).add(bad) {
        Err(EngineError::InvalidRequest(msg)) => {
            assert!(msg.contains("constraint is invalid"), "{msg}")
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

/// Long prompts arriving while a stream decodes are prefilled one chunk's worth of tokens
/// per step in all (oldest first), and the stream gets its token every step meanwhile.
#[test]
fn prefill_takes_one_chunk_per_step_while_streams_decode() {
    let (m, _) = model("qwen35-dense");
    let mut engine = Engine::new(m.clone()).with_prefill_chunk(8);
    let stream = engine.add(greedy(vec![5, 6, 7], 10)).unwrap();
    engine.step().unwrap(); // its prompt
    for seed in [3u32, 11] {
        let long: Vec<u32> = (0..40).map(|i| (i * 37 + seed) % 500).collect();
        engine.add(greedy(long, 4)).unwrap();
    }
    let mut pending = engine.prefill_pending();
    assert_eq!(pending, 80);
    for step in 1..=10 {
        engine.step().unwrap();
        let now = engine.prefill_pending();
        assert_eq!(
            pending - now,
            8,
            "step {step}: one chunk of prompt tokens per step"
        );
        pending = now;
        // The stream decodes a token every step: its 10th comes with the last chunk.
        let finished = engine.take_finished(stream);
        assert_eq!(finished.is_some(), step == 10, "step {step}");
        if let Some(seq) = finished {
            assert_eq!(seq.output().len(), 10);
        }
    }
    while engine.has_work() {
        engine.step().unwrap();
    }
}
