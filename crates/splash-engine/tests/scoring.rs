//! Score-only requests on the demo model: one prefill, the final position's logits at the
//! answer tokens, exactly what a plain forward pass gives; a second request on the same shared
//! prefix (kept by `keep_state_at`) prefills only what differs and scores the same.

use splash_engine::{Engine, EngineError, FinishReason, ScoreRequest};
use splash_model::{KvFormat, Logits, Model};

mod common;
use common::demo;

/// A judgment-like prompt: a long shared evidence, then a question that differs.
fn prompt(model: &Model, question: &str) -> (Vec<u32>, usize) {
    let shared = format!(
        "<|im_start|>system\nAnswer with one letter.<|im_end|>\n<|im_start|>user\n{{\"evidence\": \"{}",
        "The invoice was paid twice on Monday. ".repeat(30)
    );
    let text = format!(
        "{shared}\", \"criterion\": \"{question}\"}}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let ids = model.tokenizer.encode(&text).unwrap();
    let head = model.tokenizer.encode(&shared).unwrap();
    let keep = ids.iter().zip(&head).take_while(|(a, b)| a == b).count();
    (ids, keep)
}

fn run(engine: &mut Engine, req: ScoreRequest) -> (Vec<f32>, usize) {
    let id = engine.add_score(req).unwrap();
    while engine.has_work() {
        engine.step().unwrap();
    }
    let seq = engine.take_finished(id).unwrap();
    assert_eq!(seq.finish_reason(), Some(&FinishReason::Scored));
    assert!(seq.output().is_empty(), "a score request generates nothing");
    (seq.scores().unwrap().to_vec(), seq.cached_tokens())
}

#[test]
fn scores_are_the_final_logits_and_reuse_the_shared_prefix() {
    let (model, draft) = demo();
    let answers: Vec<u32> = ["A", "B", "C"]
        .iter()
        .map(|l| model.tokenizer.encode(l).unwrap()[0])
        .collect();
    // f32 keys and values: the engine's chunked prefill then reads what one whole pass does.
    let mut engine = Engine::new(model.clone())
        .with_drafter(draft)
        .with_kv_format(KvFormat::F32)
        .with_prefix_cache(1 << 30);
    for (i, question) in ["Was it paid twice?", "Was it paid on a Friday?"]
        .iter()
        .enumerate()
    {
        let (ids, keep) = prompt(&model, question);
        let mut state = model.graph.new_state_with(KvFormat::F32);
        let logits = model.graph.forward(&mut state, &ids, Logits::Last).unwrap();
        let want: Vec<f32> = answers.iter().map(|&t| logits[t as usize]).collect();
        let req = ScoreRequest {
            prompt: ids,
            answers: answers.clone(),
            keep_state_at: Some(keep),
        };
        let (scores, cached) = run(&mut engine, req);
        for (s, w) in scores.iter().zip(&want) {
            assert!(
                (s - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{scores:?} vs {want:?}"
            );
        }
        if i == 1 {
            assert_eq!(
                cached, keep,
                "the second question resumes after the evidence"
            );
        }
    }
}

#[test]
fn bad_score_requests_are_refused() {
    let (model, _) = demo();
    let mut engine = Engine::new(model.clone());
    let refused = |e: Result<_, EngineError>| matches!(e, Err(EngineError::InvalidRequest(_)));
    let no_answers = ScoreRequest {
        prompt: vec![1, 2, 3],
        answers: Vec::new(),
        keep_state_at: None,
    };
    assert!(refused(engine.add_score(no_answers)));
    let outside = ScoreRequest {
        prompt: vec![1, 2, 3],
        answers: vec![model.config.vocab_size as u32],
        keep_state_at: None,
    };
    assert!(refused(engine.add_score(outside)));
    let empty = ScoreRequest {
        prompt: Vec::new(),
        answers: vec![1],
        keep_state_at: None,
    };
    assert!(refused(engine.add_score(empty)));
}
