#!/usr/bin/env python3
"""Write a random-weight DFlash (v1) or DFlash2 draft for a target checkpoint, for speed
measurements (`splash bench --draft-model DIR`): the layout, names and config of the published
z-lab / incoai drafts (model-spec §4.4), bf16, std 0.02. Its proposals are noise, so its
acceptance is meaningless; only the cost of its passes is.

    python3 bench/make_synthetic_draft.py TARGET_DIR OUT_DIR [--dflash2] [--layers 5] [--block 16]

Needs numpy and safetensors.
"""
import argparse
import json
import os

import numpy as np


def bf16(a):
    """float32 -> bf16 bits (round to nearest even), stored as uint16 viewed by safetensors."""
    u = a.astype(np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--dflash2", action="store_true")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--block", type=int, default=None, help="default 16 (DFlash) or 8 (DFlash2)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t = json.load(open(os.path.join(a.target, "config.json")))
    t = t.get("text_config", t)
    h, n_target, vocab = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    heads, kv, hd = max(h // 128, 4), max(h // 512, 2), 128 if h >= 512 else h // 4
    inter = max(64, int(h * 3.4) // 64 * 64)
    # build_target_layer_ids(n_target, layers)
    start, end = 1, n_target - 3
    taps = [round(start + i * (end - start) / (a.layers - 1)) for i in range(a.layers)]
    block = a.block or (8 if a.dflash2 else 16)
    dflash = {"block_size": block, "mask_token_id": vocab - 250, "target_layer_ids": taps}
    if a.dflash2:
        dflash.update({"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16})
    cfg = {
        "architectures": ["DFlash2DraftModel" if a.dflash2 else "DFlashDraftModel"],
        "model_type": "qwen3", "is_causal": False, "hidden_size": h, "num_hidden_layers": a.layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": inter,
        "rms_norm_eps": 1e-6, "vocab_size": vocab, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"}, "sliding_window": 2048,
        "layer_types": ["sliding_attention"] * a.layers if a.dflash2 else ["sliding_attention"] * (a.layers - 1) + ["full_attention"],
        "num_target_layers": n_target, "dflash_config": dflash, "tie_word_embeddings": False, "dtype": "bfloat16",
    }
    rng = np.random.default_rng(a.seed)
    w = {}

    def mat(name, *shape, std=0.02, mean=0.0):
        w[name] = bf16(rng.standard_normal(shape, dtype=np.float32) * std + mean)

    mat("fc.weight", h, len(taps) * h)
    mat("hidden_norm.weight", h, mean=1.0)
    mat("norm.weight", h, mean=1.0)
    for l in range(a.layers):
        p = f"layers.{l}."
        mat(p + "input_layernorm.weight", h, mean=1.0)
        mat(p + "post_attention_layernorm.weight", h, mean=1.0)
        mat(p + "self_attn.q_proj.weight", heads * hd, h)
        mat(p + "self_attn.k_proj.weight", kv * hd, h)
        mat(p + "self_attn.v_proj.weight", kv * hd, h)
        mat(p + "self_attn.o_proj.weight", h, heads * hd)
        mat(p + "self_attn.q_norm.weight", hd, mean=1.0)
        mat(p + "self_attn.k_norm.weight", hd, mean=1.0)
        mat(p + "mlp.gate_proj.weight", inter, h)
        mat(p + "mlp.up_proj.weight", inter, h)
        mat(p + "mlp.down_proj.weight", h, inter)
        if a.dflash2:
            for side in ("attention_conv", "mlp_conv"):
                mat(p + f"{side}.base_kernel", 2, 2, h, std=0.1)
                mat(p + f"{side}.kernel_projection.weight", 2 * 2 * (h // 16), h)
    if a.dflash2:
        mat("candidate_selector.predecessor_codebook", vocab, 256)
        mat("candidate_selector.successor_codebook", vocab, 256)
        mat("candidate_selector.hidden_projection.weight", 256, h)
    os.makedirs(a.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
    # safetensors.numpy has no bf16: write the raw header ourselves.
    header, offset, blobs = {}, 0, []
    for name in sorted(w):
        b = w[name].tobytes()
        header[name] = {"dtype": "BF16", "shape": list(w[name].shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for b in blobs:
            f.write(b)
    params = sum(x.size for x in w.values())
    print(f"{a.out}: {cfg['architectures'][0]}, {a.layers} layers, block {block}, taps {taps}, {params / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main()
