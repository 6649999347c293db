//! GGUF checkpoints (`qwen35-{dense,moe}-gguf/`, generated into target/fixtures/ by
//! `tests/fixtures/gguf/make_gguf_fixture.py` the way llama.cpp's converter writes them) and
//! the tokenizer built from GGUF metadata.

use std::io::Read;
use std::path::Path;

use splash_model::gguf::GgufHeader;

mod common;
use common::{argmax, fixture, gguf, max_rel, twin};
use splash_model::{load, Format, Logits, Tokenizer};

fn all_logits(m: &splash_model::Model, ids: &[u32]) -> Vec<f32> {
    m.graph
        .forward(&mut m.graph.new_state(), ids, Logits::All)
        .unwrap()
}

/// The GGUF file gives the logits of its twin (the same weights, dequantised and un-transformed
/// into the HF layout): proves names, V-head order, `ssm_a`, norms and block decoding. The
/// error against the f32 original is the quantisation error, reported.
fn check_against_twin(family: &str, quant: &str) {
    let dir = gguf(&format!("qwen35-{family}-gguf"));
    let q = load(&dir.join(format!("model-{quant}.gguf"))).unwrap();
    assert_eq!(q.format, Format::Gguf);
    let twin = load(&twin(&format!("qwen35-{family}-gguf/twin-{quant}"))).unwrap();
    let original = load(&fixture(&format!("qwen35-{family}"))).unwrap();
    let text = std::fs::read_to_string(fixture("qwen35-dense/ppl.txt")).unwrap();
    let ids = original.tokenizer.encode(&text).unwrap();
    assert_eq!(q.tokenizer.encode(&text).unwrap(), ids, "GGUF tokenizer");
    let lq = all_logits(&q, &ids);
    let exact = max_rel(&lq, &all_logits(&twin, &ids));
    let lf = all_logits(&original, &ids);
    let vs_f32 = max_rel(&lq, &lf);
    let v = q.config.vocab_size;
    let agree = lq
        .chunks_exact(v)
        .zip(lf.chunks_exact(v))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    println!(
        "{family} GGUF {quant}: logits vs its twin {exact:.2e}; vs the f32 original {vs_f32:.2e} (relative to max |logit|), top-1 agreement {agree}/{}",
        ids.len()
    );
    assert!(
        exact < 1e-4,
        "{family} {quant}: the GGUF differs from the weights it encodes: {exact}"
    );
}

#[test]
fn dense_q8_0_computes_what_its_weights_encode() {
    check_against_twin("dense", "Q8_0");
}

#[test]
fn dense_q4_mix_computes_what_its_weights_encode() {
    check_against_twin("dense", "Q4_mix");
}

#[test]
fn moe_q8_0_computes_what_its_weights_encode() {
    check_against_twin("moe", "Q8_0");
}

#[test]
fn moe_q4_mix_computes_what_its_weights_encode() {
    check_against_twin("moe", "Q4_mix");
}

#[test]
fn decode_steps_match_the_twin() {
    // One token at a time: the block GEMV path.
    let dir = gguf("qwen35-dense-gguf");
    let q = load(&dir.join("model-Q4_mix.gguf")).unwrap();
    let d = load(&twin("qwen35-dense-gguf/twin-Q4_mix")).unwrap();
    let (mut sq, mut sd) = (q.graph.new_state(), d.graph.new_state());
    let mut token = 10u32;
    for step in 0..24 {
        let lq = q.graph.forward(&mut sq, &[token], Logits::Last).unwrap();
        let ld = d.graph.forward(&mut sd, &[token], Logits::Last).unwrap();
        let err = max_rel(&lq, &ld);
        assert!(err < 1e-4, "step {step}: {err}");
        token = argmax(&ld) as u32;
    }
}

#[test]
fn metadata_gives_config_template_and_stop_tokens() {
    let dir = gguf("qwen35-moe-gguf");
    let g = load(&dir.join("model-Q8_0.gguf")).unwrap();
    let hf = load(&fixture("qwen35-moe")).unwrap();
    let (a, b) = (&g.config, &hf.config);
    assert_eq!(
        (
            a.vocab_size,
            a.hidden_size,
            &a.layer_kinds,
            a.num_heads,
            a.num_kv_heads
        ),
        (
            b.vocab_size,
            b.hidden_size,
            &b.layer_kinds,
            b.num_heads,
            b.num_kv_heads
        )
    );
    assert_eq!(
        (a.head_dim, a.rotary_dim, a.moe.clone()),
        (b.head_dim, b.rotary_dim, b.moe.clone())
    );
    assert_eq!(a.rms_norm_eps, b.rms_norm_eps);
    assert!(g.generation.eos_token_ids.contains(&505));
    let inputs = splash_model::TemplateInputs {
        messages: serde_json::json!([{"role": "user", "content": "Hi"}]),
        add_generation_prompt: true,
        ..Default::default()
    };
    let render = |m: &splash_model::Model| m.template.as_ref().unwrap().render(&inputs).unwrap();
    assert_eq!(render(&g), render(&hf));
}

/// A copy of a fixture GGUF with tensor `name`'s type id replaced.
fn with_tensor_type(src: &Path, name: &str, type_id: u32, dst: &Path) {
    let mut bytes = std::fs::read(src).unwrap();
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend(name.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor info");
    let dims_at = at + needle.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    bytes[type_at..type_at + 4].copy_from_slice(&type_id.to_le_bytes());
    std::fs::write(dst, bytes).unwrap();
}

#[test]
fn unsupported_tensor_types_are_refused_by_name() {
    let src = gguf("qwen35-dense-gguf/model-Q8_0.gguf");
    let tmp = std::env::temp_dir().join(format!("splash-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let dst = tmp.join("model.gguf");
    with_tensor_type(&src, "blk.1.attn_qkv.weight", 39, &dst);
    let err = load(&dst).err().expect("refused").to_string();
    assert!(
        err.contains("blk.1.attn_qkv.weight") && err.contains("MXFP4"),
        "{err}"
    );
    // A truncated file is named as such, not a crash.
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&dst, &bytes[..bytes.len() / 2]).unwrap();
    let err = load(&dst).err().expect("refused").to_string();
    assert!(err.contains("truncated"), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `text` in Unicode normal form C, as the HF tokenizer's normalizer makes it.
fn nfc(text: &str) -> String {
    use tokenizers::{NormalizedString, Normalizer};
    let mut n = NormalizedString::from(text);
    tokenizers::normalizers::unicode::NFC
        .normalize(&mut n)
        .unwrap();
    n.get().to_string()
}

/// Runs llama.cpp's test vectors `NAME.inp` / `NAME.out` (test-tokenizer-0: inputs separated
/// by a marker line, one line of ids per input) through `tok`. llama.cpp does not apply the
/// NFC normaliser of the HF Qwen tokenizers; splash does, as transformers does, so inputs that
/// NFC changes are checked against their composed form instead.
fn check_vectors(tok: &Tokenizer, name: &str) -> usize {
    let dir = fixture("gguf/vocab");
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<&str> = out.lines().collect();
    assert!(outputs.len() > 20, "{} outputs", outputs.len());
    assert_eq!(
        inputs.len(),
        outputs.len() + 1,
        "{name}: the last input is empty"
    );
    let mut failures = Vec::new();
    let mut composed = 0;
    for (text, expected) in inputs.iter().zip(&outputs) {
        let got = tok.encode(text).unwrap();
        let want: Vec<u32> = expected
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        let nfc_text = nfc(text);
        if nfc_text != *text {
            composed += 1;
            if tok.decode(&got, false).unwrap() != nfc_text {
                failures.push(format!("{text:?}: ids {got:?} do not spell its NFC form"));
            }
        } else if got != want {
            failures.push(format!("{text:?}: got {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} differ:\n{}",
        failures.len(),
        outputs.len(),
        failures.join("\n")
    );
    println!(
        "{name}: {} vectors, {composed} checked in NFC form",
        outputs.len()
    );
    outputs.len()
}

/// llama.cpp's tokenizer test vectors for its `ggml-vocab-qwen35.gguf` (from the
/// llama-cpp-python source package; despite the name it holds the 151,936-token Qwen2
/// vocabulary with the `qwen35` pre-tokenizer): our tokenizer, built from the GGUF metadata,
/// gives llama.cpp's ids, with both the `qwen35` and the `qwen2` pre-tokenizer.
#[test]
fn tokenizer_from_gguf_metadata_matches_llama_cpp_test_vectors() {
    let dir = fixture("gguf/vocab");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(dir.join("ggml-vocab-qwen35.gguf.gz")).unwrap(),
    )
    .read_to_end(&mut bytes)
    .unwrap();
    let path = dir.join("ggml-vocab-qwen35.gguf");
    let mut header = GgufHeader::parse(&path, &bytes).unwrap();
    let tok = Tokenizer::from_gguf(&path, &header).unwrap();
    assert_eq!(tok.vocab_size(), 151_936);
    check_vectors(&tok, "ggml-vocab-qwen35.gguf");
    header.metadata.insert(
        "tokenizer.ggml.pre".into(),
        splash_model::gguf::Value::String("qwen2".into()),
    );
    let tok = Tokenizer::from_gguf(&path, &header).unwrap();
    check_vectors(&tok, "ggml-vocab-qwen2.gguf");
    header.metadata.insert(
        "tokenizer.ggml.pre".into(),
        splash_model::gguf::Value::String("llama-bpe".into()),
    );
    let err = Tokenizer::from_gguf(&path, &header)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("llama-bpe") && err.contains("qwen2"), "{err}");
}
