//! `config.json` of a DFlash / DFlash2 draft (a Qwen3 config with a `dflash_config`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{read_json, ModelError};

/// Which draft architecture (model-spec §4.1 / §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// `DFlashDraftModel`.
    DFlash,
    /// `DFlash2DraftModel`: grouped dynamic convolutions and the candidate selector.
    DFlash2,
}

/// DFlash2's extra hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DFlash2Config {
    pub conv_kernel: usize,
    pub conv_group: usize,
    pub selector_rank: usize,
    pub selector_top_k: usize,
}

/// Hyper-parameters of a draft.
#[derive(Clone, Debug)]
pub struct DraftConfig {
    /// The config file (for error messages).
    pub path: PathBuf,
    pub kind: DraftKind,
    pub dflash2: Option<DFlash2Config>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    /// Per layer: `Some(W)` for sliding-window layers, `None` for full attention.
    pub windows: Vec<Option<usize>>,
    /// Causal mask inside the block (`is_causal`; false for the published drafts).
    pub causal: bool,
    /// Verify rows per block: the anchor plus `block_size - 1` proposals.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose outputs feed `fc`, in concatenation order.
    pub target_layer_ids: Vec<usize>,
    /// `num_target_layers`, when the config states it.
    pub num_target_layers: Option<usize>,
    pub output_multiplier: f32,
    pub logit_softcap: Option<f32>,
    pub input_embedding_scale: f32,
}

impl DraftConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        Self::from_value(&path, &read_json(&path)?)
    }

    /// Parses a draft config; `path` names it in errors.
    pub fn from_value(path: &Path, root: &Value) -> Result<Self, ModelError> {
        let err = |m: String| ModelError::config(path, m);
        let arch = root["architectures"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = match arch {
            "DFlashDraftModel" => DraftKind::DFlash,
            "DFlash2DraftModel" => DraftKind::DFlash2,
            other => {
                return Err(err(format!(
                    "not a DFlash draft: architectures[0] is `{other}`, expected DFlashDraftModel or DFlash2DraftModel"
                )))
            }
        };
        let dflash = root.get("dflash_config").cloned().unwrap_or(Value::Null);
        // Like the reference's `_draft_value`: dflash_config first, then the root.
        let field = |name: &str| {
            dflash
                .get(name)
                .or_else(|| root.get(name))
                .filter(|v| !v.is_null())
        };
        let usize_of = |name: &str| -> Result<usize, ModelError> {
            field(name)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| err(format!("missing or non-integer `{name}`")))
        };
        let f64_of = |name: &str| field(name).and_then(Value::as_f64);
        let num_layers = usize_of("num_hidden_layers")?;
        let hidden_size = usize_of("hidden_size")?;
        let num_heads = usize_of("num_attention_heads")?;
        let head_dim = match field("head_dim") {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| err("`head_dim` is not an integer".into()))?
                as usize,
            None => hidden_size / num_heads,
        };
        let window = field("sliding_window")
            .and_then(Value::as_u64)
            .map(|w| w as usize);
        let windows = match root.get("layer_types").and_then(Value::as_array) {
            Some(types) => {
                if types.len() != num_layers {
                    return Err(err(format!(
                        "layer_types has {} entries for {num_layers} layers",
                        types.len()
                    )));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("full_attention") => Ok(None),
                        Some("sliding_attention") => window.map(Some).ok_or_else(|| {
                            err("a sliding_attention layer needs `sliding_window`".into())
                        }),
                        other => Err(err(format!("unknown layer type {other:?}"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => vec![None; num_layers],
        };
        let (rope_type, rope_theta) = match root
            .get("rope_parameters")
            .or_else(|| root.get("rope_scaling"))
        {
            Some(Value::Object(p)) => (
                p.get("rope_type")
                    .or_else(|| p.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string(),
                p.get("rope_theta")
                    .and_then(Value::as_f64)
                    .or_else(|| f64_of("rope_theta")),
            ),
            _ => ("default".to_string(), f64_of("rope_theta")),
        };
        if rope_type != "default" {
            return Err(err(format!(
                "rope type `{rope_type}` of the draft is not supported yet (only `default`)"
            )));
        }
        let target_layer_ids: Vec<usize> = match field("target_layer_ids").and_then(Value::as_array)
        {
            Some(ids) => ids
                .iter()
                .map(|v| v.as_u64().map(|x| x as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| err("`target_layer_ids` must be integers".into()))?,
            None => {
                let n = usize_of("num_target_layers")?;
                build_target_layer_ids(n, num_layers)
            }
        };
        let dflash2 = match kind {
            DraftKind::DFlash => None,
            DraftKind::DFlash2 => Some(DFlash2Config {
                conv_kernel: usize_of("conv_kernel_size")?,
                conv_group: usize_of("conv_group_size")?,
                selector_rank: usize_of("selector_rank")?,
                selector_top_k: usize_of("selector_top_k")?,
            }),
        };
        let cfg = Self {
            path: path.to_path_buf(),
            kind,
            dflash2,
            vocab_size: usize_of("vocab_size")?,
            hidden_size,
            intermediate_size: usize_of("intermediate_size")?,
            num_heads,
            num_kv_heads: usize_of("num_key_value_heads")?,
            head_dim,
            rms_norm_eps: f64_of("rms_norm_eps").unwrap_or(1e-6) as f32,
            rope_theta: rope_theta.unwrap_or(1e6),
            windows,
            causal: root
                .get("is_causal")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            block_size: field("block_size").and_then(Value::as_u64).unwrap_or(16) as usize,
            mask_token_id: usize_of("mask_token_id")? as u32,
            target_layer_ids,
            num_target_layers: field("num_target_layers")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
            output_multiplier: f64_of("output_multiplier").unwrap_or(1.0) as f32,
            logit_softcap: f64_of("final_logit_softcapping")
                .filter(|&c| c > 0.0)
                .map(|c| c as f32),
            input_embedding_scale: f64_of("input_embedding_scale").unwrap_or(1.0) as f32,
        };
        // A zero size would only fail later, inside a product or a kernel launch.
        let mut sizes = vec![
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_attention_heads", cfg.num_heads),
            ("num_key_value_heads", cfg.num_kv_heads),
            ("head_dim", cfg.head_dim),
            ("vocab_size", cfg.vocab_size),
        ];
        if let Some(d2) = cfg.dflash2 {
            sizes.extend([
                ("conv_kernel_size", d2.conv_kernel),
                ("selector_rank", d2.selector_rank),
                ("selector_top_k", d2.selector_top_k),
            ]);
        }
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(err(format!(
                "`{name}` is 0; a draft needs a positive value there"
            )));
        }
        if cfg.block_size < 2 {
            return Err(err(format!(
                "block_size {} leaves nothing to draft (need ≥ 2)",
                cfg.block_size
            )));
        }
        if !cfg.num_heads.is_multiple_of(cfg.num_kv_heads) {
            return Err(err(format!(
                "{} attention heads is not a multiple of {} kv heads",
                cfg.num_heads, cfg.num_kv_heads
            )));
        }
        if let Some(d2) = cfg.dflash2 {
            if d2.conv_group == 0 || !hidden_size.is_multiple_of(d2.conv_group) {
                return Err(err(format!(
                    "hidden_size {hidden_size} is not a multiple of conv_group_size {}",
                    d2.conv_group
                )));
            }
        }
        Ok(cfg)
    }

    /// Checks that this draft fits `target`: the same hidden size (the draft runs on the
    /// target's embeddings and LM head), tap layers that exist, the same vocabulary.
    pub fn check(&self, target: &ModelConfig) -> Result<(), ModelError> {
        let err = |m: String| {
            ModelError::config(
                &self.path,
                format!("this draft does not fit the target: {m}"),
            )
        };
        if self.hidden_size != target.hidden_size {
            return Err(err(format!(
                "its hidden size is {} but the target's is {} (the taps and the target's embeddings must have the draft's width)",
                self.hidden_size, target.hidden_size
            )));
        }
        let layers = target.num_layers();
        if let Some(&l) = self.target_layer_ids.iter().find(|&&l| l >= layers) {
            return Err(err(format!(
                "it reads target layer {l} (target_layer_ids {:?}) but the target has {layers} layers",
                self.target_layer_ids
            )));
        }
        if let Some(n) = self.num_target_layers.filter(|&n| n != layers) {
            return Err(err(format!(
                "it was made for a target of {n} layers (num_target_layers) but the target has {layers}"
            )));
        }
        if self.vocab_size != target.vocab_size {
            return Err(err(format!(
                "its vocabulary has {} tokens but the target's has {}",
                self.vocab_size, target.vocab_size
            )));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return Err(err(format!(
                "mask_token_id {} is outside the target's vocabulary ({})",
                self.mask_token_id, target.vocab_size
            )));
        }
        Ok(())
    }
}

/// The reference's default taps: `num_draft_layers` layers spread over `1..=num_target-3`.
pub fn build_target_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Vec<usize> {
    if num_draft_layers == 1 {
        return vec![num_target_layers / 2];
    }
    let (start, end) = (1.0f64, num_target_layers as f64 - 3.0);
    (0..num_draft_layers)
        .map(|i| {
            (start + i as f64 * (end - start) / (num_draft_layers - 1) as f64).round_ties_even()
                as usize
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_taps_match_the_published_drafts() {
        // model-spec §4.4: Qwen3.6-27B-DFlash [1,16,31,46,61]; Qwen3-8B [1,9,17,25,33].
        assert_eq!(build_target_layer_ids(64, 5), vec![1, 16, 31, 46, 61]);
        assert_eq!(build_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
    }

    #[test]
    fn a_zero_size_is_refused_by_name() {
        let dir = std::env::temp_dir();
        let mut v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../tests/fixtures/dflash/dense-dflash2/config.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert!(DraftConfig::from_value(&dir, &v).is_ok());
        v["intermediate_size"] = 0.into();
        let e = DraftConfig::from_value(&dir, &v).unwrap_err();
        assert!(e.to_string().contains("`intermediate_size` is 0"), "{e}");
    }

    #[test]
    fn unknown_architecture_is_refused_by_name() {
        let v = serde_json::json!({"architectures": ["Qwen3ForCausalLM"]});
        let e = DraftConfig::from_value(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("Qwen3ForCausalLM"), "{e}");
    }
}
