//! Accuracy of the compressed KV caches: top-1 agreement of next-token predictions with int8
//! and bf16 keys/values, teacher-forced over the fixture texts.

use std::path::Path;

use splash_model::{load, KvFormat, Logits};

fn argmaxes(logits: &[f32], v: usize) -> Vec<usize> {
    logits
        .chunks_exact(v)
        .map(|r| {
            r.iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                )
                .0
        })
        .collect()
}

fn agreement(a: &[usize], b: &[usize]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

#[test]
fn int8_and_bf16_kv_agree_with_exact_kv() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(name);
        let model = load(&dir).unwrap();
        let v = model.config.vocab_size;
        let mut texts: Vec<String> = vec![std::fs::read_to_string(dir.join("ppl.txt")).unwrap()];
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        texts.extend(
            r["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["text"].as_str().unwrap().to_string()),
        );
        let top1 = |kv: KvFormat| -> Vec<usize> {
            texts
                .iter()
                .flat_map(|t| {
                    let ids = model.tokenizer.encode(t).unwrap();
                    // Prefill in chunks so later chunks read the cache in its stored format.
                    let mut state = model.graph.new_state_with(kv);
                    let mut logits = Vec::new();
                    for piece in ids.chunks(16) {
                        logits.extend(model.graph.forward(&mut state, piece, Logits::All).unwrap());
                    }
                    argmaxes(&logits, v)
                })
                .collect()
        };
        let (exact, bf16, int8) = (
            top1(KvFormat::F32),
            top1(KvFormat::Bf16),
            top1(KvFormat::Int8),
        );
        let (int8_bf16, int8_f32, bf16_f32) = (
            agreement(&int8, &bf16),
            agreement(&int8, &exact),
            agreement(&bf16, &exact),
        );
        println!(
            "{name}: top-1 agreement over {} positions: int8 vs bf16 {:.4}, int8 vs f32 {:.4}, bf16 vs f32 {:.4}",
            exact.len(),
            int8_bf16,
            int8_f32,
            bf16_f32
        );
        assert!(
            int8_bf16 >= 0.97 && int8_f32 >= 0.97 && bf16_f32 >= 0.97,
            "{name}"
        );
    }
}
