#!/usr/bin/env python3
"""HTTP-layer latency of `splash serve`: client-side time minus the engine's own time.

    .venv/bin/python bench/http_overhead.py [--url http://127.0.0.1:8000] [-n 200]

For each non-streaming chat request with max_tokens=1 the overhead is the client's wall time
minus the engine's prefill + decode time reported in `timings` (prompt_ms + predicted_ms):
JSON parsing, template rendering, tokenisation, queueing to the engine thread, response
encoding and the loopback round trip. Also reports GET /health round trips and the time to
the first SSE byte of a streaming request.
"""

import argparse
import json
import statistics
import time

import httpx


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    body = {"messages": [{"role": "user", "content": "Hello there, how are you?"}], "max_tokens": 1,
            "temperature": 0, "reasoning_effort": "none"}
    with httpx.Client(base_url=a.url, timeout=60) as c:
        for _ in range(10):  # warm-up
            c.post("/v1/chat/completions", json=body)
        health, overhead, total = [], [], []
        for _ in range(a.n):
            t = time.perf_counter()
            c.get("/health")
            health.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            r = c.post("/v1/chat/completions", json=body)
            ms = (time.perf_counter() - t) * 1e3
            tm = r.json()["timings"]
            total.append(ms)
            overhead.append(ms - tm["prompt_ms"] - tm["predicted_ms"])
        ttfb = []
        for _ in range(a.n // 4):
            t = time.perf_counter()
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                for _ in r.iter_bytes():
                    ttfb.append((time.perf_counter() - t) * 1e3)
                    break
    out = {
        "requests": a.n,
        "health_rtt_ms": {"median": statistics.median(health), "p90": pct(health, 90)},
        "chat_total_ms": {"median": statistics.median(total), "p90": pct(total, 90)},
        "http_overhead_ms": {"median": statistics.median(overhead), "p90": pct(overhead, 90)},
        "stream_first_byte_ms": {"median": statistics.median(ttfb), "p90": pct(ttfb, 90)},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
