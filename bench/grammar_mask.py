#!/usr/bin/env python3
"""Per-token cost of constrained decoding (llguidance masks) in `splash serve`.

    .venv/bin/python bench/grammar_mask.py [--url http://127.0.0.1:8000] [-n 20]

Sends JSON-schema-constrained chat requests and reads `timings.grammar_mask_ms` /
`timings.grammar_masks` (time spent computing token masks, and how many) next to the decode
time, so the mask's share of each decoded token is visible. The first request also builds the
token tables of the whole vocabulary; its extra latency is reported separately.
"""

import argparse
import json
import statistics
import time

import httpx

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=20)
    a = ap.parse_args()
    body = {"messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 300, "reasoning_effort": "none",
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    plain = {**body, "response_format": {"type": "text"}, "max_tokens": 40, "ignore_eos": True}
    with httpx.Client(base_url=a.url, timeout=300) as c:
        t = time.perf_counter()
        first = c.post("/v1/chat/completions", json={**body, "seed": 0}).json()
        first_ms = (time.perf_counter() - t) * 1e3
        per_mask, per_token_decode, per_token_plain = [], [], []
        for i in range(a.n):
            r = c.post("/v1/chat/completions", json={**body, "seed": i + 1}).json()
            tm = r["timings"]
            json.loads(r["choices"][0]["message"]["content"])  # valid by construction
            per_mask.append(tm["grammar_mask_ms"] / tm["grammar_masks"])
            per_token_decode.append(tm["predicted_ms"] / tm["predicted_n"])
            p = c.post("/v1/chat/completions", json={**plain, "seed": i}).json()["timings"]
            per_token_plain.append(p["predicted_ms"] / p["predicted_n"])
    print(json.dumps({
        "requests": a.n,
        "first_request_ms (includes building the token tables)": first_ms,
        "first_request_engine_ms": first["timings"]["prompt_ms"] + first["timings"]["predicted_ms"],
        "mask_ms_per_token": {"median": statistics.median(per_mask), "max": max(per_mask)},
        "constrained_decode_ms_per_token": statistics.median(per_token_decode),
        "unconstrained_decode_ms_per_token": statistics.median(per_token_plain),
    }, indent=2))


if __name__ == "__main__":
    main()
