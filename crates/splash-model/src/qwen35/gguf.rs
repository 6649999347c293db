//! llama.cpp's `qwen35` / `qwen35moe` GGUF layout: hyper-parameters and tensor names mapped to
//! their Hugging Face equivalents (model-spec §1.5, §5.3).

use std::path::Path;

use serde_json::{json, Value as Json};

use crate::error::ModelError;
use crate::gguf::{GgufHeader, Value};

/// GGUF architectures of the Qwen3.5 family.
pub const ARCHITECTURES: [&str; 2] = ["qwen35", "qwen35moe"];

/// The equivalent `config.json` of a `qwen35` / `qwen35moe` GGUF header, so that one parser
/// validates both formats. Layers past `block_count - nextn_predict_layers` (the MTP block)
/// are left out.
pub fn config_json(path: &Path, h: &GgufHeader) -> Result<Json, ModelError> {
    let arch = h.architecture().unwrap_or("");
    if !ARCHITECTURES.contains(&arch) {
        return Err(ModelError::Gguf {
            path: path.to_path_buf(),
            message: format!(
                "general.architecture is `{arch}`; splash serves the Qwen3.5/3.6 hybrid models (GGUF architectures {})",
                ARCHITECTURES.join(", ")
            ),
        });
    }
    let missing = |key: &str| ModelError::Gguf {
        path: path.to_path_buf(),
        message: format!("metadata `{key}` is missing or not a number"),
    };
    let num = |key: &str| -> Result<u64, ModelError> {
        let k = format!("{arch}.{key}");
        h.get(&k).and_then(Value::as_u64).ok_or_else(|| missing(&k))
    };
    let float = |key: &str| -> Result<f64, ModelError> {
        let k = format!("{arch}.{key}");
        h.get(&k).and_then(Value::as_f64).ok_or_else(|| missing(&k))
    };
    let mtp = h
        .get(&format!("{arch}.nextn_predict_layers"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let layers = num("block_count")?.saturating_sub(mtp);
    let head_dim = num("attention.key_length")?;
    let hv = num("ssm.time_step_rank")?;
    let embd = tensor_dims(h, "token_embd.weight").ok_or_else(|| missing("token_embd.weight"))?;
    let vocab = embd
        .get(1)
        .copied()
        .ok_or_else(|| missing("token_embd.weight"))?;
    let eos: Vec<u64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| h.get(k).and_then(Value::as_u64))
        .collect();
    let mut config = json!({
        "model_type": if arch == "qwen35moe" { "qwen3_5_moe_text" } else { "qwen3_5_text" },
        "vocab_size": vocab,
        "hidden_size": num("embedding_length")?,
        "num_hidden_layers": layers,
        "full_attention_interval": num("full_attention_interval")?,
        "num_attention_heads": num("attention.head_count")?,
        "num_key_value_heads": num("attention.head_count_kv")?,
        "head_dim": head_dim,
        "rope_theta": float("rope.freq_base")?,
        "partial_rotary_factor": num("rope.dimension_count")? as f64 / head_dim as f64,
        "linear_num_key_heads": num("ssm.group_count")?,
        "linear_num_value_heads": hv,
        "linear_key_head_dim": num("ssm.state_size")?,
        "linear_value_head_dim": num("ssm.inner_size")? / hv.max(1),
        "linear_conv_kernel_dim": num("ssm.conv_kernel")?,
        "rms_norm_eps": float("attention.layer_norm_rms_epsilon")?,
        "max_position_embeddings": num("context_length")?,
        "tie_word_embeddings": tensor_dims(h, "output.weight").is_none(),
        "eos_token_id": eos,
    });
    let c = config.as_object_mut().expect("object");
    // The converter writes the real layout only as a per-layer flag (true = GDN); its
    // `full_attention_interval` may be a default that does not describe the model.
    if let Some(flags) = h
        .get(&format!("{arch}.attention.recurrent_layers"))
        .and_then(Value::as_array)
    {
        let kinds: Vec<&str> = flags
            .iter()
            .take(layers as usize)
            .map(|f| match f {
                Value::Bool(false) => "full_attention",
                _ => "linear_attention",
            })
            .collect();
        c.insert("layer_types".into(), kinds.into());
    }
    if let Some(sections) = h
        .get(&format!("{arch}.rope.dimension_sections"))
        .and_then(Value::as_array)
    {
        let sections: Vec<u64> = sections.iter().filter_map(Value::as_u64).collect();
        c.insert("mrope_section".into(), sections.into());
    }
    if arch == "qwen35moe" {
        c.insert("num_experts".into(), num("expert_count")?.into());
        c.insert(
            "num_experts_per_tok".into(),
            num("expert_used_count")?.into(),
        );
        c.insert(
            "moe_intermediate_size".into(),
            num("expert_feed_forward_length")?.into(),
        );
        c.insert(
            "shared_expert_intermediate_size".into(),
            num("expert_shared_feed_forward_length")?.into(),
        );
    } else {
        c.insert(
            "intermediate_size".into(),
            num("feed_forward_length")?.into(),
        );
    }
    Ok(config)
}

fn tensor_dims(h: &GgufHeader, name: &str) -> Option<Vec<u64>> {
    h.tensors
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.dims.clone())
}

/// The HF name and shape of GGUF tensor `name` of `shape` (outermost first), or `None` for
/// tensors the text model does not use (the MTP block at index ≥ `layers`, vision tensors).
pub fn hf_tensor(name: &str, shape: &[usize], layers: usize) -> Option<(String, Vec<usize>)> {
    let hf = tensor_name(name, layers)?;
    // The shared-expert gate is a [1, H] linear in HF, a vector in GGUF.
    let shape = match shape {
        [h] if hf.ends_with("shared_expert_gate.weight") => vec![1, *h],
        _ => shape.to_vec(),
    };
    Some((hf, shape))
}

fn tensor_name(name: &str, layers: usize) -> Option<String> {
    let global = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (index, tensor) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    if index >= layers {
        return None;
    }
    let hf = match tensor {
        "attn_norm.weight" => "input_layernorm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        // Gated DeltaNet.
        "attn_qkv.weight" => "linear_attn.in_proj_qkv.weight",
        "attn_gate.weight" => "linear_attn.in_proj_z.weight",
        "ssm_beta.weight" => "linear_attn.in_proj_b.weight",
        "ssm_alpha.weight" => "linear_attn.in_proj_a.weight",
        "ssm_conv1d.weight" => "linear_attn.conv1d.weight",
        "ssm_dt.bias" | "ssm_dt" => "linear_attn.dt_bias",
        // Holds -exp(A_log), not A_log: the GDN loader knows this name.
        "ssm_a" => "linear_attn.ssm_a",
        "ssm_norm.weight" => "linear_attn.norm.weight",
        "ssm_out.weight" => "linear_attn.out_proj.weight",
        // Gated attention.
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        // Dense MLP.
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        // MoE: expert stacks [E, ...] like MLX's switch_mlp.
        "ffn_gate_inp.weight" => "mlp.gate.weight",
        "ffn_gate_exps.weight" => "mlp.switch_mlp.gate_proj.weight",
        "ffn_up_exps.weight" => "mlp.switch_mlp.up_proj.weight",
        "ffn_down_exps.weight" => "mlp.switch_mlp.down_proj.weight",
        "ffn_gate_shexp.weight" => "mlp.shared_expert.gate_proj.weight",
        "ffn_up_shexp.weight" => "mlp.shared_expert.up_proj.weight",
        "ffn_down_shexp.weight" => "mlp.shared_expert.down_proj.weight",
        "ffn_gate_inp_shexp.weight" => "mlp.shared_expert_gate.weight",
        _ => return None,
    };
    Some(format!("model.layers.{index}.{hf}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf_and_skip_the_mtp_block() {
        assert_eq!(
            tensor_name("blk.3.ssm_alpha.weight", 64).as_deref(),
            Some("model.layers.3.linear_attn.in_proj_a.weight")
        );
        assert_eq!(
            tensor_name("output.weight", 64).as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(tensor_name("blk.64.attn_q.weight", 64), None);
        assert_eq!(tensor_name("blk.x.attn_q.weight", 64), None);
        assert_eq!(tensor_name("v.blk.0.attn_q.weight", 64), None);
    }
}
