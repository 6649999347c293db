//! DFlash / DFlash2 drafts against the z-lab reference code (`tests/fixtures/dflash/`, made by
//! `make_dflash_fixtures.py` with transformers 5.17), target taps against transformers'
//! hidden states, and the GDN rollback of a verify pass.

use std::path::Path;

use safetensors::SafeTensors;

mod common;
use common::fixture;
use splash_model::{load, DFlashDraft, Logits, Model};

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

    fn has(&self, key: &str) -> bool {
        SafeTensors::deserialize(&self.tensors)
            .unwrap()
            .tensor(key)
            .is_ok()
    }

    fn f32s(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.tensors).unwrap();
        st.tensor(key)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn i64s(&self, key: &str) -> Vec<i64> {
        let st = SafeTensors::deserialize(&self.tensors).unwrap();
        st.tensor(key)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

const DRAFTS: [&str; 4] = ["dense-dflash", "dense-dflash2", "moe-dflash", "moe-dflash2"];

fn pair(name: &str) -> (Model, DFlashDraft, Reference) {
    let dir = fixture(&format!("dflash/{name}"));
    let r = Reference::load(&dir);
    let target = load(&fixture(r.json["target"].as_str().unwrap())).unwrap();
    let draft = DFlashDraft::load(&dir).unwrap();
    draft.config().check(&target.config).unwrap();
    (target, draft, r)
}

#[test]
fn draft_logits_match_the_reference() {
    for name in DRAFTS {
        let (target, draft, r) = pair(name);
        let block = draft.config().block_size;
        let h = target.config.hidden_size;
        let width = draft.config().target_layer_ids.len() * h;
        for (k, rec) in r.json["blocks"].as_array().unwrap().iter().enumerate() {
            let key = format!("block{k}.draft_logits");
            if !r.has(&key) {
                break;
            }
            let ctx_rows = r.f32s(&format!("block{k}.ctx"));
            let start = rec["start"].as_u64().unwrap() as usize;
            assert_eq!(ctx_rows.len(), start * width);
            // Context appended in uneven pieces: the sliding window must not depend on them.
            let mut ctx = draft.new_context();
            let split = (start / 3).max(1) * width;
            draft.append_context(&mut ctx, &ctx_rows[..split]).unwrap();
            for row in ctx_rows[split..].chunks(width) {
                draft.append_context(&mut ctx, row).unwrap();
            }
            let anchor = rec["anchor"].as_u64().unwrap() as u32;
            let hidden = draft
                .forward(&mut ctx, &target.graph, anchor, block)
                .unwrap();
            let logits = draft.logits(&target.graph, &hidden);
            let want = r.f32s(&key);
            let err = rel_err(&logits, &want);
            println!("{name} block {k}: draft logits rel err {err:.2e}");
            assert!(err < 1e-4, "{name} block {k}: rel err {err}");
            let proposals = ids(&rec["proposals"]);
            match draft.selector() {
                None => {
                    let argmax: Vec<u32> = logits
                        .chunks_exact(target.config.vocab_size)
                        .map(|row| {
                            (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
                                as u32
                        })
                        .collect();
                    assert_eq!(argmax, proposals, "{name} block {k}");
                }
                Some(sel) => {
                    let walk = sel.walk(&hidden, &logits, anchor, |s| {
                        (0..s.len()).fold(0, |b, i| if s[i] > s[b] { i } else { b })
                    });
                    let tokens: Vec<u32> = walk.iter().map(|s| s.token()).collect();
                    assert_eq!(tokens, proposals, "{name} block {k}: selector walk");
                    // The reference's top-k is unsorted: compare candidate sets and scores by token.
                    let cands = r.i64s(&format!("block{k}.candidates"));
                    let scores = r.f32s(&format!("block{k}.scores"));
                    let kk = sel.top_k();
                    let mut worst = 0.0f32;
                    for (slot, s) in walk.iter().enumerate() {
                        for (j, &c) in cands[slot * kk..(slot + 1) * kk].iter().enumerate() {
                            let i = s
                                .candidates
                                .iter()
                                .position(|&x| x as i64 == c)
                                .unwrap_or_else(|| {
                                    panic!("{name} block {k} slot {slot}: candidate {c} missing")
                                });
                            let want = scores[slot * kk + j];
                            worst = worst.max((s.scores[i] - want).abs() / want.abs().max(1.0));
                        }
                    }
                    println!("{name} block {k}: selector score err {worst:.2e}");
                    assert!(worst < 1e-4);
                }
            }
        }
    }
}

#[test]
fn target_taps_match_transformers_hidden_states() {
    for name in ["dense-dflash", "moe-dflash2"] {
        let (target, draft, r) = pair(name);
        let prompt = ids(&r.json["prompt_ids"]);
        let mut state = target.graph.new_state();
        let taps = target
            .graph
            .forward_with_taps(
                &mut state,
                &prompt,
                Logits::Last,
                &draft.config().target_layer_ids,
            )
            .unwrap()
            .features;
        let err = rel_err(&taps, &r.f32s("block0.ctx"));
        println!("{name}: tap features rel err {err:.2e}");
        assert!(err < 1e-4, "{name}: rel err {err}");
    }
}

#[test]
fn rollback_equals_running_only_the_kept_tokens() {
    for target_name in ["qwen35-dense", "qwen35-moe"] {
        let m = load(&fixture(target_name)).unwrap();
        let prompt: Vec<u32> = (0..70).map(|i| (i * 37 % 500) as u32).collect();
        let block: Vec<u32> = vec![11, 22, 33, 44, 55, 66, 77];
        for keep in [1, 3, 7] {
            let mut spec = m.graph.new_state();
            m.graph.forward(&mut spec, &prompt, Logits::None).unwrap();
            spec.checkpoint();
            m.graph.forward(&mut spec, &block, Logits::All).unwrap();
            spec.rollback(keep).unwrap();
            assert_eq!(spec.len(), prompt.len() + keep);
            let mut plain = m.graph.new_state();
            m.graph.forward(&mut plain, &prompt, Logits::None).unwrap();
            m.graph
                .forward(&mut plain, &block[..keep], Logits::None)
                .unwrap();
            // Continue both with the same tokens: the logits must agree.
            let next = [5u32, 6, 7, 8, 9];
            let a = m.graph.forward(&mut spec, &next, Logits::All).unwrap();
            let b = m.graph.forward(&mut plain, &next, Logits::All).unwrap();
            let err = rel_err(&a, &b);
            println!("{target_name} keep {keep}: rel err after rollback {err:.2e}");
            assert!(err < 1e-5, "{target_name} keep {keep}: {err}");
        }
    }
}
