#!/usr/bin/env python3
"""The peer run of the vision tower: transformers' `Qwen3_5VisionModel` in bf16 with sdpa
attention on one GPU, random weights at Qwen3.5's tower size (27 blocks of 1152, 16 heads, MLP
4304), timed as `splash bench --image` times splash's tower (one untimed run, then the median of
`--repeat`, the GPU synchronised around each).

    python3 bench/peers/transformers_vision.py [--out-hidden 5120,2048] [--repeat 5]

Cases: one 1024×1024 image (64×64 patches, 1,024 tokens), one 2048×2048 (128×128, 4,096
tokens), and a 10-page PDF: ten US Letter pages rendered at 1 Mpx (891×1153 pixels, resized to
896×1152: 56×72 patches each) in one call, as transformers batches a request's images. One JSON
line per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

CASES = [("1024x1024", [(64, 64)]), ("2048x2048", [(128, 128)]), ("pdf-10-pages", [(72, 56)] * 10)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-hidden", default="5120,2048", help="merger output widths (27B: 5120, 35B-A3B: 2048)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for out_hidden in [int(x) for x in args.out_hidden.split(",")]:
        cfg = Qwen3_5VisionConfig(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304,
                                  out_hidden_size=out_hidden, patch_size=16, temporal_patch_size=2,
                                  spatial_merge_size=2, num_position_embeddings=2304, in_channels=3)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = Qwen3_5VisionModel(cfg).to(torch.bfloat16).eval()
        for name, grids in CASES:
            n = sum(h * w for h, w in grids)
            x = torch.randn(n, 3 * 2 * 16 * 16, device="cuda", dtype=torch.bfloat16)
            grid = torch.tensor([[1, h, w] for h, w in grids], device="cuda")
            times = []
            with torch.inference_mode():
                for i in range(args.repeat + 1):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(x, grid_thw=grid)
                    torch.cuda.synchronize()
                    if i > 0:
                        times.append((time.perf_counter() - t0) * 1e3)
            merged = out.pooler_output
            print(json.dumps({
                "engine": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(), "out_hidden": out_hidden, "case": name, "patches": n,
                "tokens": int(merged.shape[0]), "ms": statistics.median(times),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            }), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
