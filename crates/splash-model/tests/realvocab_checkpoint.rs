//! The random-weight checkpoint on the real Qwen3.5 vocabulary and chat template
//! (`tests/fixtures/qwen35-realvocab`; its weights are generated, see `common::realvocab`).

use std::path::PathBuf;

use splash_model::{load, ChatTemplate, Logits, TemplateInputs, Tokenizer};

mod common;

/// The committed files: tokenizer, template, configs (no weights).
fn demo() -> PathBuf {
    common::fixture("qwen35-realvocab")
}

#[test]
fn template_renders_like_transformers() {
    // Cases rendered by transformers' apply_chat_template (models/demo/make_demo.py).
    let samples: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(demo().join("template_samples.json")).unwrap(),
    )
    .unwrap();
    let template = ChatTemplate::from_dir(&demo())
        .unwrap()
        .expect("demo has a template");
    for (i, case) in samples["cases"].as_array().unwrap().iter().enumerate() {
        let mut extra = serde_json::Map::new();
        if let Some(b) = case["enable_thinking"].as_bool() {
            extra.insert("enable_thinking".into(), b.into());
        }
        let got = template
            .render(&TemplateInputs {
                messages: case["messages"].clone(),
                tools: Some(case["tools"].clone()).filter(|t| !t.is_null()),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                extra,
            })
            .unwrap();
        assert_eq!(
            got,
            case["rendered"].as_str().unwrap(),
            "case {i} renders differently"
        );
    }
}

#[test]
fn real_vocabulary_and_special_tokens() {
    let tok = Tokenizer::from_dir(&demo()).unwrap();
    assert_eq!(
        tok.encode("<|im_start|>user\nhi<|im_end|>").unwrap(),
        vec![248045, 846, 198, 5834, 248046]
    );
    assert_eq!(tok.encode("Hello world").unwrap(), vec![9419, 1814]);
    for (text, id) in [
        ("<think>", 248068),
        ("</think>", 248069),
        ("<tool_call>", 248058),
        ("<|endoftext|>", 248044),
    ] {
        assert_eq!(tok.token_to_id(text), Some(id), "{text}");
    }
    let text = "fn main() {\n\tprintln!(\"héllo 世界\");\n}";
    assert_eq!(tok.decode(&tok.encode(text).unwrap(), false).unwrap(), text);
}

#[test]
fn model_runs_on_the_full_vocabulary() {
    let model = load(&common::realvocab()).unwrap();
    assert_eq!(model.config.vocab_size, 248_320);
    assert_eq!(model.generation.eos_token_ids, vec![248046, 248044]);
    let mut state = model.graph.new_state();
    let logits = model
        .graph
        .forward(&mut state, &[248045, 846, 198], Logits::Last)
        .unwrap();
    assert_eq!(logits.len(), 248_320);
    assert!(logits.iter().all(|x| x.is_finite()));
}
