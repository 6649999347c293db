//! MLX affine 4-bit checkpoints (`tests/fixtures/qwen35-dense-mlx4`, made from the dense
//! transformers fixture by `tests/fixtures/make_mlx_fixture.py` with MLX's quantisation
//! formula): exact dequantisation, and the whole model against its f32 original.

use std::path::Path;

use safetensors::SafeTensors;

mod common;
use common::{fixture, max_rel, twin};
use splash_model::{load, Checkpoint, Logits};

#[test]
fn dequantisation_matches_the_mlx_formula() {
    let dir = fixture("qwen35-dense-mlx4");
    let ck = Checkpoint::open(&dir).unwrap();
    let bytes = std::fs::read(dir.join("dequantized.safetensors")).unwrap();
    let reference = SafeTensors::deserialize(&bytes).unwrap();
    for (module, bits, group) in [
        (
            "language_model.model.layers.0.linear_attn.in_proj_qkv",
            4,
            64,
        ),
        ("language_model.model.layers.0.mlp.down_proj", 8, 32),
        ("language_model.model.embed_tokens", 4, 64),
    ] {
        let want = reference.tensor(module).unwrap();
        let want_vals: Vec<f32> = want
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let w = ck.get_affine(module, want.shape(), bits, group).unwrap();
        let got = w.to_f32_vec();
        let worst = got
            .iter()
            .zip(&want_vals)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / (1e-6 + b.abs())));
        assert!(worst < 1e-6, "{module}: relative error {worst}");
    }
}

/// Logits of every position of the perplexity text.
fn all_logits(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let m = load(dir).unwrap();
    m.graph
        .forward(&mut m.graph.new_state(), ids, Logits::All)
        .unwrap()
}

/// A quantised fixture gives the logits of its dequantised twin (format correctness) and is
/// compared with its f32 original (the quantisation error, reported).
fn check_against_twin(name: &str, original: &str) {
    let q = load(&fixture(name)).unwrap();
    assert!(q.config.quantization.is_some());
    let text = std::fs::read_to_string(fixture(original).join("ppl.txt")).unwrap();
    let ids = q.tokenizer.encode(&text).unwrap();
    let lq = all_logits(&fixture(name), &ids);
    let exact = max_rel(&lq, &all_logits(&twin(&format!("{name}-dequant")), &ids));
    let lf = all_logits(&fixture(original), &ids);
    let vs_f32 = max_rel(&lq, &lf);
    let v = q.config.vocab_size;
    let argmax = |r: &[f32]| (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
    let agree = lq
        .chunks_exact(v)
        .zip(lf.chunks_exact(v))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    println!(
        "{name}: logits vs its dequantised twin {exact:.2e}; vs the f32 original {vs_f32:.2e} (relative to max |logit|), top-1 agreement {agree}/{}",
        ids.len()
    );
    assert!(
        exact < 1e-4,
        "{name}: the quantised path differs from its own dequantised weights: {exact}"
    );
}

#[test]
fn mlx_4bit_dense_computes_what_its_weights_encode() {
    check_against_twin("qwen35-dense-mlx4", "qwen35-dense");
}

#[test]
fn mlx_4bit_moe_with_switch_mlp_experts_computes_what_its_weights_encode() {
    check_against_twin("qwen35-moe-mlx4", "qwen35-moe");
}

#[test]
fn mlx_4bit_decode_steps_match_the_dequantised_twin() {
    // One token at a time: the fused affine GEMV path.
    let q = load(&fixture("qwen35-dense-mlx4")).unwrap();
    let d = load(&twin("qwen35-dense-mlx4-dequant")).unwrap();
    let (mut sq, mut sd) = (q.graph.new_state(), d.graph.new_state());
    let mut token = 10u32;
    for step in 0..24 {
        let lq = q.graph.forward(&mut sq, &[token], Logits::Last).unwrap();
        let ld = d.graph.forward(&mut sd, &[token], Logits::Last).unwrap();
        let err = max_rel(&lq, &ld);
        assert!(err < 1e-4, "step {step}: {err}");
        token = (0..ld.len()).fold(0, |b, i| if ld[i] > ld[b] { i } else { b }) as u32;
    }
}
