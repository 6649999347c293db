#!/usr/bin/env python3
"""GPU memory across model switches of `splash serve-multi` (issue 33): starts serve-multi with
two checkpoints on the GPU, asks each in turn for one token (each request switches the engine),
and after each switch records the time it took, the GPU memory in use (nvidia-smi) and the
loaded engine's memory plan. Memory must come back to the same level at every switch: the
outgoing engine's process has exited before the next one loads.

    python3 bench/serve_multi_memory.py --bin .device/splash A.gguf B.gguf [--switches 10]

Loopback only; prints a Markdown table (and writes it to --out when given).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def post(url, body, timeout=900):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs=2)
    ap.add_argument("--bin", default="target/release/splash")
    ap.add_argument("--switches", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    cfg = {"models": [{"model": m, "aliases": [f"m{i}"]} for i, m in enumerate(a.models)]}
    path = os.path.join(tempfile.mkdtemp(), "models.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    idle = gpu_used_mib()
    proc = subprocess.Popen([a.bin, "serve-multi", "--config", path, "--port", "0", "--", "--device", "cuda"],
                            stderr=subprocess.PIPE, text=True)
    url, ready = None, threading.Event()

    def pump():
        nonlocal url
        for line in proc.stderr:
            m = re.match(r"Ready: (http://\S+)", line)
            if m and url is None:
                url = m.group(1)
                ready.set()
            if "error" in line.lower() or "memory plan" in line:
                sys.stderr.write(line)
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(60)
    rows = []
    try:
        for i in range(a.switches + 1):
            name = f"m{i % 2}"
            t0 = time.time()
            r = post(f"{url}/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
            took = time.time() - t0
            st = get(f"{url}/status")
            plan = ((st.get("engine") or {}).get("memory") or {}).get("plan") or {}
            rows.append((i, name, took, gpu_used_mib(), st["switches"], r["usage"]["prompt_tokens"], plan))
            print(f"switch {i}: {name} answered in {took:.1f} s; GPU memory {rows[-1][3]} MiB", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    after = gpu_used_mib()
    lines = [f"GPU memory before serve-multi: {idle} MiB; after it exits: {after} MiB", "",
             "| request | model | time (switch + load + 1 token) | GPU memory in use after | loads so far |",
             "|---:|---|---:|---:|---:|"]
    for i, name, took, used, switches, _, _ in rows:
        lines.append(f"| {i} | {a.models[int(name[1])]} | {took:.1f} s | {used:,} MiB | {switches} |")
    text = "\n".join(lines)
    print(text)
    plans = {name: plan for _, name, *_, plan in rows}
    print(json.dumps(plans, indent=1)[:3000])
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
