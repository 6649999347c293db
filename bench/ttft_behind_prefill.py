#!/usr/bin/env python3
"""Time to first token of a short chat request sent while a long prompt is being prefilled.

    .venv/bin/python bench/ttft_behind_prefill.py [--bin target/release/splash] [--tokens 32000]
        [--model demo] [--device cuda]

Starts `splash serve` (the demo, or `--model`) on a loopback port (context raised to fit the long
prompt), sends one chat request of about `--tokens` prompt tokens, `--delay` seconds later a
streamed "Hello friend", and reports each one's time to its first streamed content or
reasoning token; then the short request's alone, on the idle server (another wording, so the
prefix cache does not serve it). Every request and the whole run are bounded by `--timeout`.
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))
from splash_server import Server  # noqa: E402
WORDS = ("river stone cloud lantern harbor meadow copper violet signal orchard anchor "
         "thunder pebble canyon willow ember glacier falcon velvet compass").split()


def ttft(url, content, max_tokens, timeout, out, key):
    """Streams one chat request; stores (seconds to the first token, prompt tokens)."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, prompt = None, None
    with httpx.Client(timeout=timeout) as c, c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[len("data: "):])
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if first is None and (d.get("content") or d.get("reasoning_content")):
                    first = time.perf_counter() - t0
            if ev.get("usage"):
                prompt = ev["usage"]["prompt_tokens"]
    out[key] = (first, prompt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "splash"))
    ap.add_argument("--tokens", type=int, default=32000, help="approximate long prompt tokens")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds between the two requests")
    ap.add_argument("--timeout", type=float, default=480.0)
    ap.add_argument("--model", default="demo", help="what `splash serve --model` takes")
    ap.add_argument("--device", help="what `splash serve --device` takes (default: its own)")
    a = ap.parse_args()
    device = ["--device", a.device] if a.device else []
    server = Server("--max-context", str(a.tokens + 8000), *device, binary=a.bin, model=a.model,
                    ready_timeout=600)
    url = server.url
    try:
        # Words for about --tokens tokens, from the model's own count of a sample (the
        # reported size is exact).
        words = lambda n: " ".join(WORDS[(i * 7 + i // 20) % len(WORDS)] for i in range(n))  # noqa: E731
        sample = httpx.post(f"{url}/tokenize", json={"content": words(1000)}, timeout=60).json()
        long = "Summarise: " + words(int(a.tokens * 1000 / len(sample["tokens"])))
        res = {}
        t_long = threading.Thread(target=ttft, args=(url, long, 4, a.timeout, res, "long"))
        t_long.start()
        time.sleep(a.delay)
        t_short = threading.Thread(target=ttft, args=(url, "Hello friend", 16, a.timeout, res, "short"))
        t_short.start()
        t_short.join(a.timeout)
        t_long.join(a.timeout)
        ttft(url, "Hello there, friend", 16, a.timeout, res, "alone")
        fmt = lambda k: "timed out" if res.get(k, (None,))[0] is None else f"{res[k][0]:.2f} s"  # noqa: E731
        print(f"long prompt: {res.get('long', (None, '?'))[1]} tokens, first token after {fmt('long')}")
        print(f"short request sent {a.delay:.1f} s later: first token after {fmt('short')}")
        print(f"short request alone: first token after {fmt('alone')}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
