#!/usr/bin/env python3
"""Write a synthetic Qwen3.5 text-only checkpoint with random bf16 weights, for benchmarks.

    python3 bench/make_synthetic.py OUT_DIR [--size 0.5b|0.8b|tiny|27b|35b-a3b] [--moe] [--seed N] [--dry-run]
                                    [--config-only]

Needs only numpy (pip install numpy; `safetensors` is used for an extra check if installed).
Writes OUT_DIR/{config.json, generation_config.json, model.safetensors, tokenizer.json.gz,
tokenizer_config.json, chat_template.jinja} (tokenizer files copied from tests/fixtures/qwen35-realvocab/).

Sizes (real Qwen3.5 head geometry everywhere: 8 q heads / 2 kv heads of 256 with output gate,
GDN 16 k heads / 16 v heads of 128, conv 4, layers linear x3 + full, vocab 248320):
  0.5b  hidden 512, 24 layers, I 3584, untied lm_head   ~0.50B params (~1.0 GB)
        --moe: 16 layers, 16 experts top-4, expert I 512, shared I 512   ~0.55B
  0.8b  hidden 1024, 24 layers, I 3584, tied (the Qwen3.5-0.8B text geometry)  ~0.75B
        --moe: 16 experts top-4, expert I 512, shared I 512, untied   ~1.38B
  tiny  hidden 64, 4 layers, I 128, untied (quick CI smoke)
--vision adds Qwen3.5's vision tower at its real size (27 blocks of 1152, 16 heads, MLP 4304,
patch 16, merge 2, 2,304 positions; the merger's output the text hidden size) as
`model.visual.*` with `vision_config` in config.json, for `splash bench --image`; --vision-out
sets the merger's output width alone (5120: the 27B's tower, 2048: the 35B-A3B's) to time those
towers beside a small text model (`splash serve` refuses such a checkpoint; the bench does not).
--mmproj FILE writes that tower (F16, as llama.cpp's mmproj files) into a GGUF `mmproj` file
instead, to serve beside a synthetic GGUF text model (bench/make_synthetic_gguf.py; needs
`gguf`); with --config-only it is the only weights written.
With 248320 x hidden per embedding matrix, an untied 0.5B model cannot keep hidden 1024
(embed + lm_head alone would be 0.51B), hence hidden 512 for the 0.5b preset.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import qwen35_layout  # noqa: E402

COMMON = dict(vocab_size=248320, full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2,
              head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4)
MOE = dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512, shared_expert_intermediate_size=512)

PRESETS = {
    ("0.5b", False): dict(hidden_size=512, num_hidden_layers=24, intermediate_size=3584, tie_word_embeddings=False),
    ("0.5b", True): dict(hidden_size=512, num_hidden_layers=16, intermediate_size=0, tie_word_embeddings=False, **MOE),
    ("0.8b", False): dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=3584, tie_word_embeddings=True),
    ("0.8b", True): dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=0, tie_word_embeddings=False,
                         **MOE),
    ("tiny", False): dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128, tie_word_embeddings=False),
    ("tiny", True): dict(hidden_size=64, num_hidden_layers=4, intermediate_size=0, tie_word_embeddings=False,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                         shared_expert_intermediate_size=64),
    # The real geometries (model-spec §1.1, §1.2), for GPU benchmarks: use --config-only and
    # bench/make_synthetic_gguf.py (the bf16 weights would be 54 GB / 69 GB).
    ("27b", False): dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=17408, tie_word_embeddings=False,
                         num_attention_heads=24, num_key_value_heads=4, linear_num_value_heads=48),
    ("35b-a3b", True): dict(hidden_size=2048, num_hidden_layers=40, intermediate_size=0, tie_word_embeddings=False,
                            num_attention_heads=16, num_key_value_heads=2, linear_num_value_heads=32,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512),
}

DEMO = os.path.join(ROOT, "tests", "fixtures", "qwen35-realvocab")
COPY_FILES = ["tokenizer.json.gz", "tokenizer_config.json", "chat_template.jinja"]


def vision_specs(v):
    """The vision tower's tensors (transformers' names), random bf16."""
    from st_writer import TensorSpec

    d, i, m = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"] ** 2
    out = []

    def linear(name, rows, cols):
        out.append(TensorSpec(f"model.visual.{name}.weight", (rows, cols), "BF16", "normal", std=cols ** -0.5))
        out.append(TensorSpec(f"model.visual.{name}.bias", (rows,), "BF16", "normal", std=0.02))

    def norm(name, n):
        out.append(TensorSpec(f"model.visual.{name}.weight", (n,), "BF16", "normal", std=0.02, mean=1.0))
        out.append(TensorSpec(f"model.visual.{name}.bias", (n,), "BF16", "normal", std=0.02))

    out.append(TensorSpec("model.visual.patch_embed.proj.weight", (d, 3, 2, 16, 16), "BF16", "normal", std=1536 ** -0.5))
    out.append(TensorSpec("model.visual.patch_embed.proj.bias", (d,), "BF16", "normal", std=0.02))
    out.append(TensorSpec("model.visual.pos_embed.weight", (v["num_position_embeddings"], d), "BF16", "normal", std=0.02))
    for b in range(v["depth"]):
        norm(f"blocks.{b}.norm1", d)
        linear(f"blocks.{b}.attn.qkv", 3 * d, d)
        linear(f"blocks.{b}.attn.proj", d, d)
        norm(f"blocks.{b}.norm2", d)
        linear(f"blocks.{b}.mlp.linear_fc1", i, d)
        linear(f"blocks.{b}.mlp.linear_fc2", d, i)
    norm("merger.norm", d)
    linear("merger.linear_fc1", d * m, d * m)
    linear("merger.linear_fc2", v["out_hidden_size"], d * m)
    return out


def write_mmproj(path, cfg, vision, specs, seed):
    """The tower `specs` as an F16 mmproj file (tests/fixtures/gguf/make_gguf_fixture.py names
    and keys)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "gguf"))
    import numpy as np
    from make_gguf_fixture import Q, write_mmproj_tensors
    from st_writer import _chunks

    def tower():
        for k, spec in enumerate(specs):
            values = np.concatenate(list(_chunks(spec, seed + k)))
            yield spec.name.removeprefix("model.visual."), values.reshape(spec.shape)

    config = {"vision_config": vision, "text_config": cfg}
    t0 = time.time()
    write_mmproj_tensors(path, config, tower(), Q.F16, [0.5] * 3, [0.5] * 3)
    print(f"wrote {path}: {os.path.getsize(path):,} bytes in {time.time() - t0:.1f}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--size", default="0.5b", choices=sorted({k for k, _ in PRESETS}))
    ap.add_argument("--moe", action="store_true", help="Qwen3.5-MoE text layout (qwen3_5_moe_text)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the parameter count, write nothing")
    ap.add_argument("--vision", action="store_true", help="add Qwen3.5's vision tower (real size, random weights)")
    ap.add_argument("--vision-out", type=int, help="the tower's output width (default: the text hidden size)")
    ap.add_argument("--mmproj", help="write the tower into this mmproj GGUF file instead of model.safetensors")
    ap.add_argument("--config-only", action="store_true",
                    help="write config and tokenizer files but no weights (input of make_synthetic_gguf.py)")
    args = ap.parse_args()

    if (args.size, args.moe) not in PRESETS:
        ap.error(f"no preset for --size {args.size}{' --moe' if args.moe else ''}")
    cfg = qwen35_layout.text_config(moe=args.moe, **dict(COMMON, **PRESETS[(args.size, args.moe)]))
    specs = qwen35_layout.tensor_specs(cfg, args.seed)
    if args.vision:
        vision = dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304,
                      out_hidden_size=args.vision_out or cfg["hidden_size"], patch_size=16, temporal_patch_size=2,
                      spatial_merge_size=2, num_position_embeddings=2304, in_channels=3)
        if args.mmproj:
            write_mmproj(args.mmproj, cfg, vision, vision_specs(vision), args.seed)
        else:
            cfg["vision_config"] = vision
            specs += vision_specs(vision)
    n = qwen35_layout.count_params(specs)
    nbytes = sum(s.nbytes for s in specs)
    print(f"{cfg['model_type']} size={args.size}: {n:,} parameters ({n / 1e9:.3f}B), "
          f"{nbytes / 2**30:.2f} GiB of tensor data, {len(specs)} tensors")
    if args.dry_run:
        return

    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    for name, obj in (("config.json", cfg), ("generation_config.json", qwen35_layout.generation_config())):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    for name in COPY_FILES:
        shutil.copyfile(os.path.join(DEMO, name), os.path.join(out, name))
    if args.config_only:
        print(f"wrote the config and tokenizer files of {out}")
        return
    from st_writer import verify_safetensors, write_safetensors  # needs numpy

    st = os.path.join(out, "model.safetensors")
    write_safetensors(st, specs, args.seed, metadata={"format": "pt", "note": "splash synthetic: random weights"})
    verify_safetensors(st)
    dt = time.time() - t0
    print(f"wrote {st}: {os.path.getsize(st):,} bytes in {dt:.1f}s")


if __name__ == "__main__":
    main()
