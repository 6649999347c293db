"""Qwen3.5 text-only checkpoint layout (HF `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`
tensor names), shared by `tests/fixtures/qwen35-realvocab/make_demo.py` and `bench/make_synthetic.py`.

Conventions follow transformers' modeling_qwen3_5.py / modeling_qwen3_5_moe.py:
  * `model.norm`, `input_layernorm`, `post_attention_layernorm`, `q_norm`, `k_norm` are
    Qwen3_5RMSNorm: zero-initialised, applied as (1 + w) -> we store small noise around 0.
  * `linear_attn.norm` is the gated RMSNorm: one-initialised, applied as w -> noise around 1.
  * `self_attn.q_proj` has 2*Hq*head_dim rows (attn_output_gate): per head, head_dim query
    rows followed by head_dim gate rows (HF views it as [.., Hq, 2*head_dim] and chunks).
  * `linear_attn.in_proj_qkv` rows are [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)].
  * `mlp.experts.gate_up_proj` is [E, 2*I, H] with the gate rows first.
  * `A_log` is float32 (log of uniform(1,16)), everything else bf16.
"""

from __future__ import annotations

import zlib

import numpy as np

from st_writer import TensorSpec

NORM_STD = 0.05  # noise on norm weights
MAT_STD = 0.02  # matrices
CONV_STD = 0.2  # depthwise conv kernel (only 4 taps, so larger than MAT_STD)


def layer_types(num_layers: int, interval: int) -> list[str]:
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]


def text_config(*, moe: bool, vocab_size: int, hidden_size: int, num_hidden_layers: int,
                full_attention_interval: int, num_attention_heads: int, num_key_value_heads: int,
                head_dim: int, linear_num_key_heads: int, linear_num_value_heads: int,
                linear_key_head_dim: int, linear_value_head_dim: int, linear_conv_kernel_dim: int,
                intermediate_size: int, tie_word_embeddings: bool, partial_rotary_factor: float = 0.25,
                num_experts: int = 0, num_experts_per_tok: int = 0, moe_intermediate_size: int = 0,
                shared_expert_intermediate_size: int = 0, max_position_embeddings: int = 262144) -> dict:
    rotary_dim = int(head_dim * partial_rotary_factor)
    # mrope_section must sum to rotary_dim/2; text-only inference treats it as plain RoPE.
    half = rotary_dim // 2
    a = (half + 2) // 3
    mrope_section = [a, a, half - 2 * a] if half >= 3 else [half, 0, 0]
    cfg = {
        "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "layer_types": layer_types(num_hidden_layers, full_attention_interval),
        "full_attention_interval": full_attention_interval,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_num_value_heads": linear_num_value_heads,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_value_head_dim": linear_value_head_dim,
        "linear_conv_kernel_dim": linear_conv_kernel_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": partial_rotary_factor,
            "mrope_interleaved": True,
            "mrope_section": mrope_section,
        },
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": [248046, 248044],
        "pad_token_id": 248044,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "mamba_ssm_dtype": "float32",
    }
    if moe:
        cfg.update({
            "num_experts": num_experts,
            "num_experts_per_tok": num_experts_per_tok,
            "moe_intermediate_size": moe_intermediate_size,
            "shared_expert_intermediate_size": shared_expert_intermediate_size,
            "norm_topk_prob": True,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        })
    else:
        cfg["intermediate_size"] = intermediate_size
    return cfg


def generation_config() -> dict:
    return {
        "bos_token_id": None,
        "pad_token_id": 248044,
        "eos_token_id": [248046, 248044],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }


def _a_log(seed: int, name: str, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), 1])
    return np.log(rng.uniform(1.0, 16.0, size=n)).astype(np.float32)


def tensor_specs(cfg: dict, seed: int) -> list[TensorSpec]:
    H = cfg["hidden_size"]
    V = cfg["vocab_size"]
    moe = cfg["model_type"] == "qwen3_5_moe_text"
    Hq, Hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    K = cfg["linear_conv_kernel_dim"]
    conv_dim = 2 * Hk * dk + Hv * dv

    def mat(name, shape, std=MAT_STD):
        return TensorSpec(name, tuple(shape), "BF16", "normal", std=std)

    def norm0(name, n):  # (1 + w) style norm
        return TensorSpec(name, (n,), "BF16", "normal", std=NORM_STD, mean=0.0)

    def norm1(name, n):  # w style norm
        return TensorSpec(name, (n,), "BF16", "normal", std=NORM_STD, mean=1.0)

    s = [mat("model.embed_tokens.weight", (V, H)), norm0("model.norm.weight", H)]
    if not cfg["tie_word_embeddings"]:
        s.append(mat("lm_head.weight", (V, H)))
    for i, lt in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        s += [norm0(p + "input_layernorm.weight", H), norm0(p + "post_attention_layernorm.weight", H)]
        if lt == "linear_attention":
            q = p + "linear_attn."
            s += [
                mat(q + "in_proj_qkv.weight", (conv_dim, H)),
                mat(q + "in_proj_z.weight", (Hv * dv, H)),
                mat(q + "in_proj_b.weight", (Hv, H)),
                mat(q + "in_proj_a.weight", (Hv, H)),
                mat(q + "conv1d.weight", (conv_dim, 1, K), std=CONV_STD),
                TensorSpec(q + "dt_bias", (Hv,), "BF16", "normal", std=NORM_STD, mean=1.0),
                TensorSpec(q + "A_log", (Hv,), "F32", "array", array=_a_log(seed, q + "A_log", Hv)),
                norm1(q + "norm.weight", dv),
                mat(q + "out_proj.weight", (H, Hv * dv)),
            ]
        elif lt == "full_attention":
            q = p + "self_attn."
            s += [
                mat(q + "q_proj.weight", (Hq * hd * 2, H)),
                mat(q + "k_proj.weight", (Hkv * hd, H)),
                mat(q + "v_proj.weight", (Hkv * hd, H)),
                mat(q + "o_proj.weight", (H, Hq * hd)),
                norm0(q + "q_norm.weight", hd),
                norm0(q + "k_norm.weight", hd),
            ]
        else:
            raise ValueError(lt)
        m = p + "mlp."
        if moe:
            E, I, Is = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            s += [
                mat(m + "gate.weight", (E, H)),
                mat(m + "experts.gate_up_proj", (E, 2 * I, H)),
                mat(m + "experts.down_proj", (E, H, I)),
                mat(m + "shared_expert.gate_proj.weight", (Is, H)),
                mat(m + "shared_expert.up_proj.weight", (Is, H)),
                mat(m + "shared_expert.down_proj.weight", (H, Is)),
                mat(m + "shared_expert_gate.weight", (1, H)),
            ]
        else:
            I = cfg["intermediate_size"]
            s += [mat(m + "gate_proj.weight", (I, H)), mat(m + "up_proj.weight", (I, H)),
                  mat(m + "down_proj.weight", (H, I))]
    return s


def count_params(specs: list[TensorSpec]) -> int:
    return sum(t.numel for t in specs)
