#!/usr/bin/env python3
"""Load, fuzz, disconnect and crash campaign against `splash serve` on the demo model.

Loopback only, every part bounded in time. Parts (all by default, or name some with --parts):

  load         N concurrent streaming chat clients for M minutes: requests, statuses,
               time-to-first-token and whole-request p50/p99, server RSS at start and end
  fuzz         K mutated requests across every endpoint (valid bodies with fields dropped,
               retyped, oversized or corrupted, random JSON and bytes, odd methods and
               headers): every answer must be < 500, within the timeout, server alive
  disconnects  D streams closed after their first chunk: afterwards /status and /metrics
               must show no running request
  kills        R times: a server with the persistent disk cache under memory pressure is
               killed with SIGKILL while it writes a cache file (its temporary name exists),
               then restarted on the same directory: it must start, leave no partial file, and
               answer a prompt it answered before the same way

    .venv/bin/python bench/reliability.py [--bin target/release/splash] [--parts load fuzz]
        [--clients 64] [--minutes 10] [--fuzz 10000] [--disconnects 200] [--kills 5]
        [--json results.json]

Exit status 1 when any check fails; the summary is printed (and written with --json).
"""
import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "sdk"))
from splash_server import Server  # noqa: E402
TIMEOUT = 120.0  # a request unanswered for this long is a hang


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 3)


QUESTIONS = ["What is {a} + {b}?", "What is {a} times {b}?", "What is the capital of Peru?",
             "Write a Python function that returns the larger of two numbers.",
             "What is the chemical symbol for gold?", "How many centimeters are in {a} meters?"]


def question(rng):
    return rng.choice(QUESTIONS).format(a=rng.randint(2, 99), b=rng.randint(2, 99))


def first_text(line):
    """Whether an SSE line carries generated text (reasoning or content), not just the role."""
    if not line.startswith("data: {"):
        return False
    delta = json.loads(line[6:]).get("choices", [{}])[0].get("delta", {})
    return bool(delta.get("content") or delta.get("reasoning_content"))


async def running_now(c):
    status = (await c.get("/status")).json()
    metrics = (await c.get("/metrics")).text
    gauge = re.search(r"^splash_running_requests (\d+)", metrics, re.M)
    return status["queue"]["running"], int(gauge.group(1)) if gauge else None


# ------------------------------------------------------------------------------------------
async def part_load(s, clients, minutes):
    rng = random.Random(1)
    stats = {"requests": 0, "statuses": {}, "ttft_s": [], "total_s": [], "errors": []}
    end = time.monotonic() + minutes * 60
    rss_start = s.rss_mib()

    async def client(i, c):
        while time.monotonic() < end:
            body = {"model": "demo", "stream": True, "max_tokens": rng.choice([16, 64, 160]),
                    "temperature": rng.choice([0, 0.7]),
                    "messages": [{"role": "user", "content": question(rng)}]}
            t0 = time.monotonic()
            ttft = None
            try:
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if ttft is None and first_text(line):
                            ttft = time.monotonic() - t0
                    code = r.status_code
            except Exception as e:  # noqa: BLE001
                code = type(e).__name__
                stats["errors"].append(f"client {i}: {e!r}")
            stats["requests"] += 1
            stats["statuses"][str(code)] = stats["statuses"].get(str(code), 0) + 1
            if code == 200:
                stats["ttft_s"].append(ttft or 0.0)
                stats["total_s"].append(time.monotonic() - t0)

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT, limits=limits) as c:
        await asyncio.gather(*(client(i, c) for i in range(clients)))
        await asyncio.sleep(1)
        running = await running_now(c)
        cache = (await c.get("/status")).json()["metrics"]["prefix_cache"]
    ok = stats["statuses"].get("200", 0)
    return {
        "clients": clients, "minutes": minutes, "requests": stats["requests"],
        "statuses": stats["statuses"], "ttft_p50_s": pct(stats["ttft_s"], 50),
        "ttft_p99_s": pct(stats["ttft_s"], 99), "request_p50_s": pct(stats["total_s"], 50),
        "request_p99_s": pct(stats["total_s"], 99), "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(s.rss_mib(), 1), "running_after": running,
        "prefix_cache_mib": round(cache["bytes"] / 2**20, 1),
        "prefix_cache_budget_mib": round(cache["budget_bytes"] / 2**20, 1),
        "errors": stats["errors"][:10],
        "pass": ok > 0 and all(k in ("200", "429", "503") for k in stats["statuses"])
        and running == (0, 0) and s.alive(),
    }


# ------------------------------------------------------------------------------------------
SEEDS = {
    "/v1/chat/completions": {"model": "demo", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}],
                             "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                                 "type": "object", "properties": {"a": {"type": "string"}}}}}],
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "x", "schema": {"type": "object"}}}},
    "/v1/completions": {"model": "demo", "prompt": "hi", "max_tokens": 8},
    "/v1/messages": {"model": "demo", "max_tokens": 8,
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                     "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                     "thinking": {"type": "enabled", "budget_tokens": 1024}},
    "/v1/messages/count_tokens": {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "demo", "max_output_tokens": 8, "input": "hi",
                      "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
    "/tokenize": {"content": "hello"},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/apply-template": {"messages": [{"role": "user", "content": "hi"}]},
}
GETS = ["/health", "/ready", "/status", "/metrics", "/v1/models", "/v1/models/demo", "/",
        "/webui/app.js", "/nope", "/v1/chat/completions"]
ODD = [None, True, -1, 0, 2**63, -2**63, 1e308, -1e-320, float("nan"), "", "x" * 5000, "\u0000\ud7ff",
       [], {}, [[[[[[]]]]]], {"$ref": "#"}, {"type": "object", "additionalProperties": {"$ref": "#"}},
       "<tool_call>", "<|im_end|>", {"type": "image", "source": {"type": "url", "url": "http://x"}}]
LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def mutate(rng, value, depth=0):
    """A randomly damaged copy of a JSON value."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        v = dict(value)
        k = rng.choice(list(v))
        op = rng.random()
        if op < 0.25:
            del v[k]
        elif op < 0.6:
            v[k] = rng.choice(ODD)
        elif op < 0.85:
            v[k] = mutate(rng, v[k], depth + 1)
        else:
            v[rng.choice(["extra", "stream", "n", "temperature", "top_p", "stop", "seed", "tool_choice",
                          "logprobs", "top_logprobs", "stream_options", "system"])] = rng.choice(ODD + [1, 2, 5])
        return v
    if isinstance(value, list) and value and rng.random() < 0.8:
        v = list(value)
        i = rng.randrange(len(v))
        v[i] = mutate(rng, v[i], depth + 1) if rng.random() < 0.6 else rng.choice(ODD)
        if rng.random() < 0.2:
            v = v * rng.randint(2, 40)
        return v
    return rng.choice(ODD)


def bounded(body):
    """Keeps generation short: a numeric output limit above 8 becomes 8."""
    if isinstance(body, dict):
        for k in LIMIT_KEYS:
            if isinstance(body.get(k), (int, float)) and not isinstance(body.get(k), bool) and body[k] > 8:
                body[k] = 8
        if body.get("n") not in (None, 1) and isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
    return body


def fuzz_request(rng):
    r = rng.random()
    headers = {"content-type": "application/json"}
    if r < 0.08:
        return rng.choice(["GET", "DELETE", "OPTIONS", "PUT"]), rng.choice(GETS + list(SEEDS)), None, headers
    path = rng.choice(list(SEEDS))
    if r < 0.16:
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
        return "POST", path, raw, rng.choice([headers, {"content-type": "text/plain"}, {}])
    if r < 0.22:
        text = json.dumps(SEEDS[path])
        cut = text[: rng.randint(0, len(text))]
        return "POST", path, cut.encode(), headers
    body = bounded(mutate(rng, json.loads(json.dumps(SEEDS[path]))))
    if rng.random() < 0.05:
        headers = {**headers, rng.choice(["Host", "Origin", "Authorization", "x-api-key"]):
                   rng.choice(["evil.example", "null", "https://127.0.0.1", "Bearer x", "\t"])}
    try:
        raw = json.dumps(body, allow_nan=True).encode()
    except (TypeError, ValueError):
        raw = b"{"
    return "POST", path, raw, headers


async def part_fuzz(s, count, concurrency=8):
    rng = random.Random(7)
    statuses, failures, n = {}, [], 0
    reqs = [fuzz_request(rng) for _ in range(count)]

    async def worker(c):
        nonlocal n
        while reqs:
            method, path, raw, headers = reqs.pop()
            try:
                r = await c.request(method, path, content=raw, headers=headers)
                code = r.status_code
                if code >= 500 and code != 503:
                    failures.append({"method": method, "path": path, "status": code,
                                     "body": (raw or b"")[:300].decode("utf-8", "replace"),
                                     "answer": r.text[:300]})
            except httpx.TimeoutException:
                code = "timeout"
                failures.append({"method": method, "path": path, "status": "hang",
                                 "body": (raw or b"")[:300].decode("utf-8", "replace")})
            except httpx.LocalProtocolError:
                code = "not sent (invalid header)"  # refused by the client library itself
            except httpx.HTTPError as e:
                code = type(e).__name__
                failures.append({"method": method, "path": path, "status": code})
            statuses[str(code)] = statuses.get(str(code), 0) + 1
            n += 1

    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as c:
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
        await asyncio.sleep(1)
        alive = s.alive() and (await c.get("/health")).status_code == 200
    return {"requests": n, "seconds": round(time.monotonic() - t0, 1), "statuses": dict(sorted(statuses.items())),
            "failures": failures[:20], "failure_count": len(failures), "alive_after": alive,
            "pass": not failures and alive}


# ------------------------------------------------------------------------------------------
async def part_disconnects(s, count, concurrency=16):
    rng = random.Random(3)
    left = list(range(count))
    closed = 0

    async def worker():
        nonlocal closed
        while left:
            left.pop()
            body = {"model": "demo", "stream": True, "max_tokens": 300, "temperature": 0.8,
                    "messages": [{"role": "user", "content": question(rng)}]}
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as c:
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for _ in r.aiter_bytes():
                        break  # hang up after the first chunk
            closed += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
        deadline = time.monotonic() + 30
        while True:
            running = await running_now(c)
            if running == (0, 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    return {"disconnects": closed, "running_after": running, "pass": running == (0, 0) and s.alive()}


# ------------------------------------------------------------------------------------------
def part_kills(bin_, rounds):
    rng = random.Random(5)
    cache = tempfile.mkdtemp(prefix="splash-kill-cache-")
    # A small plan, so that prefixes are evicted from memory and written to disk all the time.
    flags = ["--max-memory", "400M", "--persistent-cache", "--max-cache-disk", "300M", "--cache-dir", cache]
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
             "sigma tau upsilon phi chi psi omega").split()

    def prompt(i):
        r = random.Random(i)
        return " ".join(r.choice(words) for _ in range(1500)) + f"\nWhat is {i} + 1?"

    def ask(url, text):
        r = httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT, json={
            "model": "demo", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": text}]})
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]

    repeat = "What is 47 + 38?"
    first = Server(*flags, binary=bin_, ready_timeout=120)
    want = ask(first.url, repeat)
    first.stop()
    results = []
    for k in range(rounds):
        s = Server(*flags, binary=bin_, ready_timeout=120)
        stop = threading.Event()

        def load():
            i = k * 1000
            while not stop.is_set():
                try:
                    ask(s.url, prompt(i))
                except Exception:  # noqa: BLE001 (the kill cuts it)
                    return
                i += 1

        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        # Kill the moment a cache file is being written (its temporary name exists), or after
        # a random 4-12 s when none is seen.
        deadline = time.monotonic() + rng.uniform(4, 12)
        writing = False
        while time.monotonic() < deadline and not writing:
            writing = any(f.endswith(".tmp") for _, _, fs in os.walk(cache) for f in fs)
            time.sleep(0.001)
        files_before = sum(len(f) for _, _, f in os.walk(cache))
        s.proc.kill()
        s.proc.wait()
        stop.set()
        for t in threads:
            t.join()
        try:
            again = Server(*flags, binary=bin_, ready_timeout=120)
            got = ask(again.url, repeat)
            warnings = [line.strip() for line in again.lines if "WARN" in line][:5]
            again.stop()
            leftovers = [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".tmp")]
            results.append({"round": k, "cache_files_at_kill": files_before, "killed_mid_write": writing,
                            "restarted": True, "same_answer": got == want, "tmp_left": leftovers,
                            "warnings": warnings})
        except Exception as e:  # noqa: BLE001
            results.append({"round": k, "cache_files_at_kill": files_before, "restarted": False, "error": str(e)[-500:]})
    return {"rounds": results,
            "pass": all(r.get("restarted") and r.get("same_answer") and not r.get("tmp_left") for r in results)}


# ------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/splash"))
    ap.add_argument("--parts", nargs="+", default=["load", "fuzz", "disconnects", "kills"],
                    choices=["load", "fuzz", "disconnects", "kills"])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--fuzz", type=int, default=10000)
    ap.add_argument("--disconnects", type=int, default=200)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {}
    if {"load", "fuzz", "disconnects"} & set(a.parts):
        # A queue deep enough for the load's clients: overload answers are checked by the tests.
        s = Server("--queue-size", str(max(32, a.clients)), binary=a.bin, ready_timeout=120)
        try:
            if "load" in a.parts:
                out["load"] = asyncio.run(part_load(s, a.clients, a.minutes))
                print("load:", json.dumps(out["load"]), flush=True)
            if "fuzz" in a.parts:
                out["fuzz"] = asyncio.run(part_fuzz(s, a.fuzz))
                print("fuzz:", json.dumps(out["fuzz"]), flush=True)
            if "disconnects" in a.parts:
                out["disconnects"] = asyncio.run(part_disconnects(s, a.disconnects))
                print("disconnects:", json.dumps(out["disconnects"]), flush=True)
            out["server_alive_at_end"] = s.alive()
        finally:
            s.stop()
            if s.proc.returncode not in (0, None):
                out["server_exit"] = s.proc.returncode
    if "kills" in a.parts:
        out["kills"] = part_kills(a.bin, a.kills)
        print("kills:", json.dumps(out["kills"]), flush=True)
    ok = all(v.get("pass", True) for v in out.values() if isinstance(v, dict))
    out["pass"] = ok
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
