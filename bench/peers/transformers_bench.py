#!/usr/bin/env python3
"""The peer run of issue 6: PyTorch transformers in bf16 on one GPU, at a checkpoint's geometry,
measured as `splash bench` measures (prefill tok/s over a prompt, greedy decode tok/s after it,
median of repeats, peak GPU memory).

    python3 bench/peers/transformers_bench.py CONFIG_DIR [--prompt-tokens 1024] [--decode-tokens 64]
                                              [--repeat 3] [--json] [--device cuda|cpu]

CONFIG_DIR holds a `config.json` (e.g. one written by `bench/make_synthetic.py --config-only`).
The weights are random, made on the GPU: speed does not depend on their values, and the
checkpoints splash is measured on (synthetic GGUFs) have random weights too. Needs torch and
transformers with the Qwen3.5 models (`qwen3_5_text`, `qwen3_5_moe_text`); on the GPU machine,
`bash scripts/gpu-run.sh peers` runs it for the 27B and 35B-A3B geometries.

transformers runs its own kernels: sdpa attention, and for the GDN layers whatever its Qwen3.5
code finds installed (the flash-linear-attention kernels, else its PyTorch fallback); the MoE
layers loop over the experts in Python. The output says which transformers and torch ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str):
    """Seconds `fn` takes with the device's queue synchronised before and after, and its result."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


def random_model(config_dir: str, device: str):
    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(0)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        except TypeError:  # transformers before 5 names it torch_dtype
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    return config, model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config_dir")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of the script on a tiny config, not a measurement")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs on the GPU machine (--device cpu to smoke-test it)")

    made, (config, model) = timed(lambda: random_model(a.config_dir, a.device), a.device)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (1, a.prompt_tokens), generator=gen).to(a.device)

    prefill, decode = [], []
    with torch.inference_mode():
        # The first round warms up (kernel selection, autotuning, allocator) and is not counted.
        for round_ in range(a.repeat + 1):
            secs, out = timed(lambda: model(prompt, use_cache=True), a.device)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

            def steps():
                nonlocal past, token
                for _ in range(a.decode_tokens):
                    o = model(token, past_key_values=past, use_cache=True)
                    past, token = o.past_key_values, o.logits[:, -1:].argmax(-1)

            dsecs, _ = timed(steps, a.device)
            if round_ > 0:
                prefill.append(a.prompt_tokens / secs)
                decode.append(a.decode_tokens / dsecs)
            del out, past

    result = {
        "config": a.config_dir,
        "model_type": config.model_type,
        "parameters": params,
        "dtype": "bf16",
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        # transformers' Qwen3.5 GDN layers use these kernels when they are installed.
        "gdn_kernels": "flash-linear-attention"
        if importlib.util.find_spec("fla")
        else "PyTorch fallback (flash-linear-attention not installed)",
        "prompt_tokens": a.prompt_tokens,
        "decode_tokens": a.decode_tokens,
        "prefill_tok_s": statistics.median(prefill),
        "decode_tok_s": statistics.median(decode),
        "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else None,
        "model_made_s": made,
    }
    if a.json:
        print(json.dumps(result))
        return
    print(
        f"transformers {result['transformers']} (torch {result['torch']}, {result['device']}), "
        f"{config.model_type}, {params / 1e9:.2f} B parameters in bf16 (made in {made:.0f} s), "
        f"attention {result['attn_implementation']}, GDN {result['gdn_kernels']}\n"
        f"prefill {a.prompt_tokens:>5} tokens: {result['prefill_tok_s']:>9.1f} tok/s\n"
        f"decode  {a.decode_tokens:>5} tokens: {result['decode_tok_s']:>9.2f} tok/s"
        + (f"\npeak GPU memory {result['peak_memory_mib']:.0f} MiB" if a.device == "cuda" else "")
    )


if __name__ == "__main__":
    main()
