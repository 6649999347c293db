//! The bundled demo (`models/demo`): a model trained here (train/), with its own tokenizer and
//! DFlash draft. Checks what the rest of the system relies on: the Qwen special tokens are
//! single ids, the draft fits the target, and the weights answer a trained question.

mod common;

use std::path::{Path, PathBuf};

use splash_model::{load, DFlashDraft, Logits};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

#[test]
fn special_tokens_are_single_ids_and_eos_is_im_end() {
    let model = load(&demo()).unwrap();
    assert_eq!(model.config.vocab_size, 8192);
    let tok = &model.tokenizer;
    for t in [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<|mask|>",
    ] {
        assert_eq!(tok.encode(t).unwrap().len(), 1, "{t}");
    }
    let im_end = tok.encode("<|im_end|>").unwrap()[0];
    assert!(model.generation.eos_token_ids.contains(&im_end));
}

#[test]
fn bundled_draft_fits_the_target() {
    let model = load(&demo()).unwrap();
    let draft = DFlashDraft::load(&demo().join("draft")).unwrap();
    draft.config().check(&model.config).unwrap();
}

#[test]
fn greedy_answer_to_a_trained_question() {
    let model = load(&demo()).unwrap();
    let prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let mut ids = model.tokenizer.encode(prompt).unwrap();
    let n = ids.len();
    let mut state = model.graph.new_state();
    let mut logits = model.graph.forward(&mut state, &ids, Logits::Last).unwrap();
    for _ in 0..20 {
        let next = common::argmax(&logits) as u32;
        if model.generation.eos_token_ids.contains(&next) {
            break;
        }
        ids.push(next);
        logits = model
            .graph
            .forward(&mut state, &[next], Logits::Last)
            .unwrap();
    }
    let answer = model.tokenizer.decode(&ids[n..], true).unwrap();
    assert!(answer.contains("Paris"), "{answer}");
}
