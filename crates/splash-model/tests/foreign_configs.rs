//! Checkpoints as other tools write them: `mlx_lm.convert`'s flat text-only configs under the
//! vision-language `model_type`, and transformers' vision-language checkpoints with tied
//! embeddings (`tests/fixtures/qwen35-vl-tied`, made by `make_vl_tied_fixture.py`).

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde_json::{Map, Value};

mod common;
use common::{fixture, max_rel};
use splash_model::{load, Logits};

/// A copy of a fixture directory whose config.json is rewritten; removed on drop.
struct Rewritten(PathBuf);

impl Rewritten {
    fn new(name: &str, edit: impl Fn(Map<String, Value>) -> Map<String, Value>) -> Self {
        let src = fixture(name);
        let dir = std::env::temp_dir().join(format!(
            "splash-foreign-config-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
            }
        }
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let Value::Object(config) = config else {
            panic!("config.json of {name} is not an object")
        };
        let edited = Value::Object(edit(config));
        std::fs::write(dir.join("config.json"), edited.to_string()).unwrap();
        Self(dir)
    }
}

impl Drop for Rewritten {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The config as `mlx_lm.convert` writes a text-only conversion: the text fields at the top
/// level under `model_type` (`qwen3_5` / `qwen3_5_moe`), no `text_config`, the rest kept.
fn flattened(model_type: &str) -> impl Fn(Map<String, Value>) -> Map<String, Value> + '_ {
    move |mut config| {
        let text = match config.remove("text_config") {
            Some(Value::Object(text)) => text,
            _ => Map::new(),
        };
        config.remove("vision_config");
        for (k, v) in text {
            config.entry(k).or_insert(v);
        }
        config.insert("model_type".into(), model_type.into());
        config.insert("architectures".into(), vec!["Qwen3_5ForCausalLM"].into());
        config
    }
}

fn logits(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let m = load(dir).unwrap();
    m.graph
        .forward(&mut m.graph.new_state(), ids, Logits::All)
        .unwrap()
}

#[test]
fn flat_configs_under_the_vision_language_model_type_load() {
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
    for (name, model_type) in [
        ("qwen35-dense", "qwen3_5"),
        ("qwen35-moe", "qwen3_5_moe"),
        ("qwen35-dense-mlx4", "qwen3_5"),
        ("qwen35-moe-mlx4", "qwen3_5_moe"),
    ] {
        let flat = Rewritten::new(name, flattened(model_type));
        let m = load(&flat.0).unwrap_or_else(|e| panic!("{name} flattened: {e}"));
        assert_eq!(m.config.model_type, model_type);
        assert_eq!(
            m.config.quantization.is_some(),
            name.ends_with("mlx4"),
            "{name}"
        );
        let err = max_rel(&logits(&flat.0, &ids), &logits(&fixture(name), &ids));
        assert_eq!(err, 0.0, "{name}: flattened config changes the logits");
    }
}

#[test]
fn vision_language_checkpoint_with_tied_embeddings_matches_transformers() {
    let dir = fixture("qwen35-vl-tied");
    let m = load(&dir).unwrap();
    assert!(m.config.tie_word_embeddings);
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let reference = SafeTensors::deserialize(&bytes).unwrap();
    for i in 0..2 {
        let ids: Vec<u32> = reference
            .tensor(&format!("prompt{i}.ids"))
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect();
        let want: Vec<f32> = reference
            .tensor(&format!("prompt{i}.logits"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = m
            .graph
            .forward(&mut m.graph.new_state(), &ids, Logits::All)
            .unwrap();
        let err = max_rel(&got, &want);
        assert!(
            err < 1e-4,
            "prompt {i}: logits differ from transformers by {err}"
        );
    }
}
