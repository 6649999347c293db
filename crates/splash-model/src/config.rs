//! `config.json` of the Qwen3.5 family: the text config, wherever it sits, validated once.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use splash_backend::cpu::{GdnDims, VHeadOrder};

use crate::error::{read_json, ModelError};

/// The token mixer of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    Linear,
    /// Gated full attention (`full_attention`).
    Full,
}

/// Mixture-of-experts hyper-parameters (every layer is MoE in `qwen3_5_moe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    pub shared_intermediate: usize,
}

/// Architecture hyper-parameters of a Qwen3.5 / 3.6 text model.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// `model_type` as written in config.json (the outer one for vision-language configs).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    /// Rotated dims per head (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Interleaved M-RoPE: how many of the `rotary_dim / 2` frequencies turn with the
    /// temporal, height and width positions (`mrope_section`; only image tokens tell them
    /// apart).
    pub mrope_section: [usize; 3],
    /// `image_token_id` of a vision-language config: the placeholder token an image's
    /// embedding rows replace.
    pub image_token_id: Option<u32>,
    pub gdn: GdnDims,
    pub conv_kernel: usize,
    /// Dense SwiGLU width (unused by MoE models).
    pub intermediate_size: usize,
    pub moe: Option<MoeConfig>,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// `eos_token_id` of config.json (root and text config).
    pub eos_token_ids: Vec<u32>,
    /// MLX affine quantisation (`quantization` in config.json), if the weights are quantised.
    pub quantization: Option<Quantization>,
}

/// MLX affine quantisation: default bits and group size, and per-module overrides keyed by
/// the module path as the checkpoint names it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quantization {
    pub bits: u32,
    pub group_size: usize,
    pub overrides: std::collections::HashMap<String, (u32, usize)>,
}

impl Quantization {
    /// Bits and group size of `module`.
    pub fn for_module(&self, module: &str) -> (u32, usize) {
        self.overrides
            .get(module)
            .copied()
            .unwrap_or((self.bits, self.group_size))
    }

    fn from_value(v: &Value) -> Option<Self> {
        let o = v.as_object()?;
        let pair = |m: &Map<String, Value>| {
            Some((
                m.get("bits")?.as_u64()? as u32,
                m.get("group_size")?.as_u64()? as usize,
            ))
        };
        let (bits, group_size) = pair(o)?;
        let overrides = o
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), pair(v.as_object()?)?)))
            .collect();
        Some(Self {
            bits,
            group_size,
            overrides,
        })
    }
}

const SUPPORTED: &str = "qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text";

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        Self::from_value(&path, &read_json(&path)?)
    }

    /// Parses a config.json value; `path` is only used in error messages.
    pub fn from_value(path: &Path, root: &Value) -> Result<Self, ModelError> {
        let f = Fields { path, scope: "" };
        let root_obj = f.object(root)?;
        let model_type = f.str(root_obj, "model_type")?.to_string();
        let (text, is_moe) = match model_type.as_str() {
            // mlx_lm.convert writes text-only conversions flat (the text fields at the top
            // level, as mlx-lm's own loader reads them when `text_config` is absent).
            "qwen3_5" | "qwen3_5_moe" => match root_obj.get("text_config") {
                Some(text) => (f.object(text)?, model_type == "qwen3_5_moe"),
                None => (root_obj, model_type == "qwen3_5_moe"),
            },
            "qwen3_5_text" | "qwen3_5_moe_text" => (root_obj, model_type == "qwen3_5_moe_text"),
            other => {
                return Err(ModelError::config(
                    path,
                    format!("unsupported model_type `{other}`; splash serves {SUPPORTED}"),
                ))
            }
        };
        let t = Fields {
            path,
            scope: if std::ptr::eq(text, root_obj) {
                ""
            } else {
                "text_config."
            },
        };
        let num_layers = t.usize(text, "num_hidden_layers")?;
        let layer_kinds = match text.get("layer_types") {
            Some(Value::Array(kinds)) => kinds
                .iter()
                .map(|k| match k.as_str() {
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some("full_attention") => Ok(LayerKind::Full),
                    _ => Err(t.err(format!(
                        "layer_types entry {k} is neither \"linear_attention\" nor \"full_attention\""
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                let interval = t.usize(text, "full_attention_interval")?;
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % interval == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Linear
                        }
                    })
                    .collect()
            }
        };
        if layer_kinds.len() != num_layers {
            return Err(t.err(format!(
                "layer_types has {} entries but num_hidden_layers is {num_layers}",
                layer_kinds.len()
            )));
        }
        let hidden_size = t.usize(text, "hidden_size")?;
        let num_heads = t.usize(text, "num_attention_heads")?;
        let head_dim = match text.get("head_dim") {
            Some(_) => t.usize(text, "head_dim")?,
            None => hidden_size / num_heads,
        };
        // rope_parameters (transformers 5) or the older flat fields.
        let rope = text
            .get("rope_parameters")
            .or_else(|| text.get("rope_scaling"));
        let rope_obj = rope.and_then(Value::as_object);
        let lookup = |key: &str| rope_obj.and_then(|r| r.get(key)).or_else(|| text.get(key));
        if let Some(kind) = lookup("rope_type").and_then(Value::as_str) {
            if kind != "default" {
                return Err(t.err(format!(
                    "rope_type `{kind}` is not supported yet; splash implements the default (θ, partial) RoPE"
                )));
            }
        }
        let rope_theta = lookup("rope_theta")
            .and_then(Value::as_f64)
            .ok_or_else(|| t.err("missing rope_theta (in rope_parameters or at top level)"))?;
        let partial = lookup("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0);
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(t.err(format!("rotary dim {rotary_dim} (head_dim × partial_rotary_factor) must be even and ≤ head_dim")));
        }
        let mrope_section = match lookup("mrope_section") {
            None => [11, 11, 10],
            Some(v) => match v
                .as_array()
                .map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>())
            {
                Some(a) if a.len() >= 3 && a.iter().all(Option::is_some) => {
                    let a: Vec<usize> = a.into_iter().map(|x| x.unwrap_or(0) as usize).collect();
                    if a[3..].iter().any(|&x| x != 0) || a[0] + a[1] + a[2] > rotary_dim / 2 {
                        return Err(t.err(format!(
                            "mrope_section {v} must have three parts (a fourth may be 0) adding up to at most the {} rotary frequencies",
                            rotary_dim / 2
                        )));
                    }
                    [a[0], a[1], a[2]]
                }
                _ => return Err(t.err(format!("mrope_section {v} is not a list of three counts"))),
            },
        };
        if let Some(false) = text.get("attn_output_gate").and_then(Value::as_bool) {
            return Err(t.err(
                "attn_output_gate=false is not a Qwen3.5 layout; splash expects the gated q_proj",
            ));
        }
        let gdn = GdnDims {
            hk: t.usize(text, "linear_num_key_heads")?,
            hv: t.usize(text, "linear_num_value_heads")?,
            dk: t.usize(text, "linear_key_head_dim")?,
            dv: t.usize(text, "linear_value_head_dim")?,
            v_order: VHeadOrder::Grouped,
        };
        if !gdn.hv.is_multiple_of(gdn.hk) {
            return Err(t.err(format!(
                "linear_num_value_heads {} must be a multiple of linear_num_key_heads {}",
                gdn.hv, gdn.hk
            )));
        }
        let num_kv_heads = t.usize(text, "num_key_value_heads")?;
        if num_heads % num_kv_heads != 0 {
            return Err(t.err(format!(
                "num_attention_heads {num_heads} must be a multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        let moe = if is_moe {
            Some(MoeConfig {
                num_experts: t.usize(text, "num_experts")?,
                experts_per_token: t.usize(text, "num_experts_per_tok")?,
                expert_intermediate: t.usize(text, "moe_intermediate_size")?,
                shared_intermediate: t.usize(text, "shared_expert_intermediate_size")?,
            })
        } else {
            None
        };
        if let Some(m) = &moe {
            if m.experts_per_token == 0 || m.experts_per_token > m.num_experts {
                return Err(t.err("num_experts_per_tok must be between 1 and num_experts"));
            }
        }
        // The top level decides, as in transformers: a VL checkpoint saved with tied
        // embeddings says `true` there and `false` in its `text_config`, and has no lm_head.
        let tie = root_obj
            .get("tie_word_embeddings")
            .or_else(|| text.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut eos_token_ids = token_ids(root_obj.get("eos_token_id"));
        for id in token_ids(text.get("eos_token_id")) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Self {
            model_type,
            vocab_size: t.usize(text, "vocab_size")?,
            hidden_size,
            layer_kinds,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rotary_dim,
            mrope_section,
            image_token_id: root_obj
                .get("image_token_id")
                .and_then(Value::as_u64)
                .map(|id| id as u32),
            gdn,
            conv_kernel: t.usize(text, "linear_conv_kernel_dim")?,
            intermediate_size: if is_moe {
                0
            } else {
                t.usize(text, "intermediate_size")?
            },
            moe,
            rms_norm_eps: text
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            tie_word_embeddings: tie,
            max_position_embeddings: t.usize(text, "max_position_embeddings")?,
            eos_token_ids,
            quantization: root_obj
                .get("quantization")
                .or_else(|| root_obj.get("quantization_config"))
                .and_then(Quantization::from_value),
        })
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layer_kinds.len()
    }

    /// Width of the GDN conv input: `2·Hk·dk + Hv·dv`.
    pub fn conv_dim(&self) -> usize {
        2 * self.gdn.hk * self.gdn.dk + self.gdn.hv * self.gdn.dv
    }
}

/// Sampling defaults and stop tokens of a checkpoint.
#[derive(Clone, Debug, Default)]
pub struct GenerationDefaults {
    /// Token ids that end a generation (config.json and generation_config.json together).
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

impl GenerationDefaults {
    /// Reads `dir/generation_config.json` when present and merges the config's EOS ids.
    pub fn from_dir(dir: &Path, config: &ModelConfig) -> Result<Self, ModelError> {
        let path = dir.join("generation_config.json");
        let mut out = Self {
            eos_token_ids: config.eos_token_ids.clone(),
            ..Self::default()
        };
        if !path.exists() {
            return Ok(out);
        }
        let v = read_json(&path)?;
        for id in token_ids(v.get("eos_token_id")) {
            if !out.eos_token_ids.contains(&id) {
                out.eos_token_ids.push(id);
            }
        }
        out.temperature = v
            .get("temperature")
            .and_then(Value::as_f64)
            .map(|x| x as f32);
        out.top_p = v.get("top_p").and_then(Value::as_f64).map(|x| x as f32);
        out.top_k = v.get("top_k").and_then(Value::as_u64).map(|x| x as usize);
        Ok(out)
    }
}

impl GenerationDefaults {
    /// The stop tokens of a GGUF model, and the sampling defaults newer converters record
    /// under `general.sampling.*`.
    pub fn from_gguf(h: &crate::gguf::GgufHeader, config: &ModelConfig) -> Self {
        let get = |k: &str| h.get(k).and_then(crate::gguf::Value::as_f64);
        Self {
            eos_token_ids: config.eos_token_ids.clone(),
            temperature: get("general.sampling.temp").map(|x| x as f32),
            top_p: get("general.sampling.top_p").map(|x| x as f32),
            top_k: get("general.sampling.top_k").map(|x| x as usize),
        }
    }
}

/// An `eos_token_id`-style field: absent, one id, or a list of ids.
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Field access that names the file and field in every error.
struct Fields<'a> {
    path: &'a Path,
    scope: &'static str,
}

impl Fields<'_> {
    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::config(PathBuf::from(self.path), message)
    }

    fn object<'v>(&self, v: &'v Value) -> Result<&'v Map<String, Value>, ModelError> {
        v.as_object()
            .ok_or_else(|| self.err(format!("{}expected a JSON object", self.scope)))
    }

    fn str<'v>(&self, o: &'v Map<String, Value>, key: &str) -> Result<&'v str, ModelError> {
        o.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| self.err(format!("missing string field `{}{key}`", self.scope)))
    }

    fn usize(&self, o: &Map<String, Value>, key: &str) -> Result<usize, ModelError> {
        match o.get(key) {
            Some(v) => v
                .as_u64()
                .filter(|&x| x > 0)
                .map(|x| x as usize)
                .ok_or_else(|| {
                    self.err(format!(
                        "field `{}{key}` must be a positive integer, found {v}",
                        self.scope
                    ))
                }),
            None => Err(self.err(format!("missing field `{}{key}`", self.scope))),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A small text config: three GDN layers (2 key heads, 4 value heads of 8) and one
    /// attention layer (2 KV heads of 16).
    pub(crate) fn text_config() -> Value {
        json!({
            "model_type": "qwen3_5_text", "vocab_size": 100, "hidden_size": 32,
            "num_hidden_layers": 4, "full_attention_interval": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4, "intermediate_size": 64, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "eos_token_id": 7,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
        })
    }

    #[test]
    fn flat_text_config() {
        let c = ModelConfig::from_value(Path::new("config.json"), &text_config()).unwrap();
        assert_eq!(
            c.layer_kinds,
            [
                LayerKind::Linear,
                LayerKind::Linear,
                LayerKind::Linear,
                LayerKind::Full
            ]
        );
        assert_eq!(
            (c.rotary_dim, c.conv_dim(), c.eos_token_ids.clone()),
            (4, 64, vec![7])
        );
        assert!(c.moe.is_none() && !c.tie_word_embeddings);
    }

    #[test]
    fn nested_vision_language_moe_config() {
        let mut text = text_config();
        let t = text.as_object_mut().unwrap();
        t.insert("model_type".into(), json!("qwen3_5_moe_text"));
        t.insert("num_experts".into(), json!(8));
        t.insert("num_experts_per_tok".into(), json!(2));
        t.insert("moe_intermediate_size".into(), json!(16));
        t.insert("shared_expert_intermediate_size".into(), json!(16));
        let root = json!({"model_type": "qwen3_5_moe", "text_config": text, "vision_config": {}, "eos_token_id": [9, 7]});
        let c = ModelConfig::from_value(Path::new("config.json"), &root).unwrap();
        assert_eq!(c.moe.as_ref().unwrap().num_experts, 8);
        assert_eq!(c.eos_token_ids, vec![9, 7]);
    }

    #[test]
    fn flat_config_under_the_vision_language_model_type() {
        // What mlx_lm.convert writes for a text-only conversion.
        for (model_type, moe) in [("qwen3_5", false), ("qwen3_5_moe", true)] {
            let mut v = text_config();
            let t = v.as_object_mut().unwrap();
            t.insert("model_type".into(), json!(model_type));
            t.insert("architectures".into(), json!(["Qwen3_5ForCausalLM"]));
            if moe {
                t.insert("num_experts".into(), json!(8));
                t.insert("num_experts_per_tok".into(), json!(2));
                t.insert("moe_intermediate_size".into(), json!(16));
                t.insert("shared_expert_intermediate_size".into(), json!(16));
            }
            let c = ModelConfig::from_value(Path::new("config.json"), &v).unwrap();
            assert_eq!((c.hidden_size, c.moe.is_some()), (32, moe), "{model_type}");
        }
    }

    #[test]
    fn the_top_level_decides_whether_embeddings_are_tied() {
        let mut text = text_config();
        text.as_object_mut()
            .unwrap()
            .insert("tie_word_embeddings".into(), json!(false));
        let root = json!({"model_type": "qwen3_5", "text_config": text.clone(), "tie_word_embeddings": true});
        let c = ModelConfig::from_value(Path::new("config.json"), &root).unwrap();
        assert!(c.tie_word_embeddings);
        // Without a top-level flag the text config's counts.
        text.as_object_mut()
            .unwrap()
            .insert("tie_word_embeddings".into(), json!(true));
        let root = json!({"model_type": "qwen3_5", "text_config": text});
        let c = ModelConfig::from_value(Path::new("config.json"), &root).unwrap();
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn errors_name_the_field() {
        let mut v = text_config();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_value(Path::new("x/config.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hidden_size") && e.contains("x/config.json"),
            "{e}"
        );
        let e = ModelConfig::from_value(Path::new("c.json"), &json!({"model_type": "llama"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported model_type `llama`"), "{e}");
    }
}
