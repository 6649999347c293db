#!/usr/bin/env python3
"""Aggregate decode speed of `splash serve` under N concurrent requests.

    .venv/bin/python bench/concurrency.py [--url http://127.0.0.1:8000] [--n 1 4 16] [--tokens 128]

For each N, N clients send the same kind of chat request at once (greedy, `ignore_eos`,
`max_tokens` tokens, each with a different question so that prompts differ); aggregate =
all generated tokens / wall time from the first send to the last answer. Start the server
with enough lanes (`--queue-size`) for the largest N.
"""

import argparse
import concurrent.futures
import time

import httpx


def one(url, i, tokens):
    body = {
        "messages": [{"role": "user", "content": f"What is {17 + i} + {25 + 2 * i}?"}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    one(a.url, 0, 8)  # warm-up
    print("| concurrent requests | tokens | wall | aggregate decode |")
    print("|---:|---:|---:|---:|")
    base = None
    for n in a.n:
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            total = sum(pool.map(lambda i: one(a.url, i, a.tokens), range(n)))
        wall = time.perf_counter() - t
        rate = total / wall
        base = base or rate
        print(f"| {n} | {total:,} | {wall:.1f} s | {rate:,.0f} tok/s ({rate / base:.2f}×) |")


if __name__ == "__main__":
    main()
