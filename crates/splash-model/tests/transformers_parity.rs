//! The Qwen3.5 graph against transformers 5.17 on the committed tiny fixtures
//! (`tests/fixtures/qwen35-{dense,moe}`, made by `tests/fixtures/make_fixtures.py`).

use std::path::Path;

use safetensors::SafeTensors;

mod common;
use common::fixture;
use splash_model::{load, Logits, Model};

struct Reference {
    json: serde_json::Value,
    tensors: Vec<u8>,
}

impl Reference {
    fn load(dir: &Path) -> Self {
        let json =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let tensors = std::fs::read(dir.join("reference.safetensors")).unwrap();
        Self { json, tensors }
    }

    fn f32s(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.tensors).unwrap();
        let t = st.tensor(key).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn ids(&self, v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }
}

/// max |a - b| / max |b|: the error relative to the scale of the reference logits.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn argmax(x: &[f32]) -> u32 {
    x.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as u32
}

fn check_prefill_logits(model: &Model, r: &Reference) {
    for (i, p) in r.json["prompts"].as_array().unwrap().iter().enumerate() {
        let ids = r.ids(&p["ids"]);
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            model.tokenizer.encode(text).unwrap(),
            ids,
            "tokenizer disagrees on prompt {i}"
        );
        let want = r.f32s(p["logits_key"].as_str().unwrap());
        let mut state = model.graph.new_state();
        let got = model.graph.forward(&mut state, &ids, Logits::All).unwrap();
        let err = rel_err(&got, &want);
        println!(
            "prompt {i} ({} tokens): max logit error {err:.2e} (relative to max |logit|)",
            ids.len()
        );
        assert!(
            err < 1e-4,
            "prompt {i}: logits differ from transformers by {err:e}"
        );
    }
}

fn check_greedy(model: &Model, r: &Reference) {
    let prompts = r.json["prompts"].as_array().unwrap();
    for g in r.json["greedy"].as_array().unwrap() {
        let pi = g["prompt_index"].as_u64().unwrap() as usize;
        let want = r.ids(&g["output_ids"]);
        let prompt = r.ids(&prompts[pi]["ids"]);
        let mut state = model.graph.new_state();
        let mut logits = model
            .graph
            .forward(&mut state, &prompt, Logits::Last)
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let next = argmax(&logits);
            got.push(next);
            logits = model
                .graph
                .forward(&mut state, &[next], Logits::Last)
                .unwrap();
        }
        assert_eq!(
            got, want,
            "greedy continuation of prompt {pi} differs from transformers"
        );
    }
}

fn check_chunked_prefill(model: &Model, r: &Reference) {
    let p = &r.json["prompts"].as_array().unwrap()[3];
    let ids = r.ids(&p["ids"]);
    let mut one = model.graph.new_state();
    let want = model.graph.forward(&mut one, &ids, Logits::All).unwrap();
    for chunk in [1, 7, 64] {
        let mut state = model.graph.new_state();
        let mut got = Vec::new();
        for piece in ids.chunks(chunk) {
            got.extend(model.graph.forward(&mut state, piece, Logits::All).unwrap());
        }
        let err = rel_err(&got, &want);
        println!("prefill in chunks of {chunk}: max logit difference to one pass {err:.2e}");
        // Chunks of 1 take the GEMV and recurrent-GDN paths, longer chunks the GEMM and
        // chunked-GDN ones: the summation orders differ, so the bound is the same float-noise
        // bound as against transformers.
        assert!(
            err < 1e-4,
            "prefill in chunks of {chunk} differs from one pass by {err:e}"
        );
        assert_eq!(state.len(), ids.len());
    }
}

fn run(name: &str) {
    let dir = fixture(name);
    let model = load(&dir).unwrap_or_else(|e| panic!("loading {name}: {e}"));
    let r = Reference::load(&dir);
    check_prefill_logits(&model, &r);
    check_greedy(&model, &r);
    check_chunked_prefill(&model, &r);
}

#[test]
fn dense_matches_transformers() {
    run("qwen35-dense");
}

#[test]
fn moe_matches_transformers() {
    run("qwen35-moe");
}
