//! Loading checkpoints: every stored float dtype works, and broken checkpoints give errors
//! that name the file, tensor or field — never a panic.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use splash_model::{load, Logits};

/// A scratch copy of the dense fixture, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen35-dense");
        let dir =
            std::env::temp_dir().join(format!("splash-load-errors-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        Self(dir)
    }

    /// Rewrites model.safetensors; `edit` returns the new shape and bytes, or None to drop.
    fn edit_tensors(&self, edit: impl Fn(&str, &[usize], &[u8]) -> Option<(Vec<usize>, Vec<u8>)>) {
        self.rewrite(safetensors::Dtype::F32, edit)
    }

    /// Rewrites model.safetensors with tensors of `dtype` (`edit` returns bytes of that dtype).
    fn rewrite(
        &self,
        dtype: safetensors::Dtype,
        edit: impl Fn(&str, &[usize], &[u8]) -> Option<(Vec<usize>, Vec<u8>)>,
    ) {
        let path = self.0.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut kept: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, view) in st.tensors() {
            if let Some((shape, data)) = edit(&name, view.shape(), view.data()) {
                kept.push((name, shape, data));
            }
        }
        let views: Vec<(String, TensorView)> = kept
            .iter()
            .map(|(n, s, d)| (n.clone(), TensorView::new(dtype, s.clone(), d).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
    }

    fn error(&self) -> String {
        match load(&self.0) {
            Ok(_) => panic!("loading {} should fail", self.0.display()),
            Err(e) => e.to_string(),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn assert_mentions(err: &str, needles: &[&str]) {
    for n in needles {
        assert!(err.contains(n), "error `{err}` should mention `{n}`");
    }
}

#[test]
fn unknown_model_type() {
    let s = Scratch::new("type");
    let cfg = std::fs::read_to_string(s.0.join("config.json")).unwrap();
    std::fs::write(
        s.0.join("config.json"),
        cfg.replace("qwen3_5_text", "llama"),
    )
    .unwrap();
    assert_mentions(
        &s.error(),
        &[
            "config.json",
            "unsupported model_type `llama`",
            "qwen3_5_text",
        ],
    );
}

#[test]
fn missing_tensor() {
    let s = Scratch::new("missing");
    s.edit_tensors(|name, shape, data| {
        (name != "model.layers.2.self_attn.k_norm.weight").then(|| (shape.to_vec(), data.to_vec()))
    });
    assert_mentions(
        &s.error(),
        &["model.layers.2.self_attn.k_norm.weight", "missing"],
    );
}

#[test]
fn misshaped_tensor() {
    let s = Scratch::new("shape");
    s.edit_tensors(|name, shape, data| {
        if name == "model.layers.0.linear_attn.in_proj_a.weight" {
            Some((
                vec![shape[0] - 1, shape[1]],
                data[..(shape[0] - 1) * shape[1] * 4].to_vec(),
            ))
        } else {
            Some((shape.to_vec(), data.to_vec()))
        }
    });
    assert_mentions(
        &s.error(),
        &[
            "model.layers.0.linear_attn.in_proj_a.weight",
            "[3, 64]",
            "expected [4, 64]",
        ],
    );
}

#[test]
fn missing_tokenizer() {
    let s = Scratch::new("tok");
    std::fs::remove_file(s.0.join("tokenizer.json")).unwrap();
    assert_mentions(&s.error(), &["tokenizer.json", "not found"]);
}

#[test]
fn corrupt_files() {
    let s = Scratch::new("corrupt");
    std::fs::write(
        s.0.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    assert_mentions(
        &s.error(),
        &["model.safetensors", "not a valid safetensors file"],
    );
    std::fs::write(s.0.join("config.json"), "{").unwrap();
    assert_mentions(&s.error(), &["config.json", "not valid JSON"]);
    std::fs::write(s.0.join("tokenizer.json"), "{}").unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen35-dense/config.json"),
        s.0.join("config.json"),
    )
    .unwrap();
    std::fs::remove_file(s.0.join("model.safetensors")).unwrap();
    assert_mentions(&s.error(), &["no *.safetensors weights found"]);
}

#[test]
fn not_a_directory() {
    let err = load(Path::new("/nonexistent/splash-model"))
        .err()
        .unwrap()
        .to_string();
    assert_mentions(&err, &["/nonexistent/splash-model", "not a directory"]);
}

#[test]
fn bf16_and_f16_checkpoints_load_and_stay_close() {
    let f32_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen35-dense");
    let prompt = [10u32, 200, 33, 47, 501, 7, 9];
    let logits = |dir: &Path| {
        let m = load(dir).unwrap();
        m.graph
            .forward(&mut m.graph.new_state(), &prompt, Logits::All)
            .unwrap()
    };
    let want = logits(&f32_dir);
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (dtype, tol) in [
        (safetensors::Dtype::BF16, 0.05),
        (safetensors::Dtype::F16, 0.01),
    ] {
        let s = Scratch::new(&format!("{dtype:?}"));
        s.rewrite(dtype, |_, shape, data| {
            let bits: Vec<u8> = data
                .chunks_exact(4)
                .flat_map(|b| {
                    let v = f32::from_le_bytes(b.try_into().unwrap());
                    match dtype {
                        safetensors::Dtype::BF16 => half::bf16::from_f32(v).to_le_bytes(),
                        _ => half::f16::from_f32(v).to_le_bytes(),
                    }
                })
                .collect();
            Some((shape.to_vec(), bits))
        });
        let got = logits(&s.0);
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale;
        println!("{dtype:?} checkpoint: max logit difference to f32 {err:.2e}");
        assert!(err < tol, "{dtype:?}: {err}");
    }
}

#[test]
fn sharded_checkpoint_with_index() {
    let s = Scratch::new("shards");
    let path = s.0.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<(String, TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &s.0.join(&file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    std::fs::rename(&path, s.0.join("unsharded.bin")).unwrap();
    std::fs::write(
        s.0.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let prompt = [5u32, 6, 7, 300];
    let sharded = load(&s.0).unwrap();
    let whole =
        load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen35-dense"))
            .unwrap();
    let a = sharded
        .graph
        .forward(&mut sharded.graph.new_state(), &prompt, Logits::All)
        .unwrap();
    let b = whole
        .graph
        .forward(&mut whole.graph.new_state(), &prompt, Logits::All)
        .unwrap();
    assert_eq!(a, b);
}
