#!/usr/bin/env python3
"""Measure the demo model through the server: tool-call validity, JSON-schema answers, and the
real acceptance length and speed-up of its DFlash draft; optionally the held-out perplexity
of transformers next to `splash perplexity`.

    cargo build --release
    python3 train/evaluate.py [--splash target/release/splash] [--perplexity]   # writes train/results/eval.json

The held-out prompts come from train/data.py with a seed the training data did not use (the
generators are templated, so a held-out prompt can still equal a training one). Requests
are greedy (temperature 0) and sent one at a time through the OpenAI-compatible HTTP API, so
the server's own tool-call parser and grammar engine are what is measured.
--perplexity needs torch and transformers (any CPU build).
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import data  # noqa: E402

SEED = 99  # training used 2026 (train) and 2027 (held-out perplexity text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, splash, *flags):
        self.port = free_port()
        self.proc = subprocess.Popen([splash, "serve", "--model", "demo", "--port", str(self.port), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("Ready"):
                break
        else:
            raise RuntimeError("splash serve did not start")

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def status(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=10) as r:
            return json.load(r)["metrics"]

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def prompt_of(conv):
    """The conversation up to its first assistant turn, and that turn."""
    msgs = conv["messages"]
    i = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return [{"role": m["role"], "content": m["content"]} for m in msgs[:i]], msgs[i]


def check_tool_call(reply, expected, tools):
    """(well-formed, exact): a call of an offered tool, JSON arguments with every required
    parameter and no unknown one; exact: the expected name and arguments."""
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        return False, False
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    ok = True
    for c in calls:
        params = offered.get(c["function"]["name"])
        try:
            args = json.loads(c["function"]["arguments"])
        except json.JSONDecodeError:
            return False, False
        ok &= params is not None and isinstance(args, dict) and set(params["required"]) <= set(args) \
            and set(args) <= set(params["properties"])
    want = [(t["function"]["name"], t["function"]["arguments"]) for t in expected["tool_calls"]]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    exact = [(n, {k: str(v) for k, v in a.items()}) for n, a in got] == \
            [(n, {k: str(v) for k, v in a.items()}) for n, a in want]
    return ok, exact


def run_set(server, name, requests, check):
    before = server.status()
    t0 = time.time()
    good = exact = 0
    failures = []
    for body, expected in requests:
        reply = server.post("/v1/chat/completions", {"model": "demo", "temperature": 0, "max_tokens": 400, **body})
        ok, ex = check(reply, expected, body)
        good += ok
        exact += ex
        if not ok and len(failures) < 5:
            failures.append({"prompt": body["messages"][-1]["content"], "reply": reply["choices"][0]["message"]})
    after = server.status()
    spec_b, spec_a = before["speculation"], after["speculation"]
    passes = spec_a["target_passes_total"] - spec_b["target_passes_total"]
    gen = after["generated_tokens_total"] - before["generated_tokens_total"]
    dec = after["decode_seconds_total"] - before["decode_seconds_total"]
    return {"set": name, "requests": len(requests), "valid": good, "exact": exact, "generated_tokens": gen,
            "decode_tok_s": gen / dec if dec else 0.0, "target_passes": passes,
            "tokens_per_pass": (spec_a["accepted_tokens_total"] - spec_b["accepted_tokens_total"] + passes) / passes
            if passes else None, "wall_s": time.time() - t0, "failures": failures}


def request_sets(n_tools, n_json, n_chat, n_code):
    rng = random.Random(SEED)
    tools, jsons, chats, codes = [], [], [], []
    while len(tools) < n_tools:
        c = rng.choice([data.gen_tool, data.gen_tool, data.gen_tool, data.gen_tool_parallel])(rng)
        msgs, first = prompt_of(c)
        tools.append(({"messages": msgs, "tools": c["tools"]}, first))
    while len(jsons) < n_json:
        c = data.gen_json(rng)
        msgs, first = prompt_of(c)
        q = msgs[-1]["content"]
        schema = json.loads(q[q.index("{\"type\""):].split("\n")[0])
        body = {"messages": msgs, "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "answer", "schema": schema}}}
        jsons.append((body, first))
    while len(chats) < n_chat:
        c = rng.choice([data.gen_fact, data.gen_arith, data.gen_smalltalk])(rng)
        msgs, first = prompt_of(c)
        chats.append(({"messages": msgs}, first))
    while len(codes) < n_code:
        c = rng.choice([data.gen_code_task, data.gen_code])(rng)
        msgs, first = prompt_of(c)
        codes.append(({"messages": msgs}, first))
    return tools, jsons, chats, codes


def check_json(reply, expected, body):
    text = reply["choices"][0]["message"]["content"] or ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False, False
    schema = body["response_format"]["json_schema"]["schema"]
    types = {"string": str, "integer": int, "number": (int, float), "array": list}
    ok = isinstance(value, dict) and set(schema["required"]) <= set(value) and all(
        isinstance(value[k], types[schema["properties"][k]["type"]]) for k in value if k in schema["properties"])
    return ok, ok and value == json.loads(expected["content"])


def check_answer(reply, expected, body):
    text = (reply["choices"][0]["message"]["content"] or "").strip()
    return bool(text), text == expected["content"].strip()


def perplexity_pair(splash, window=512):
    """Held-out perplexity from transformers (f32 on the CPU) and from `splash perplexity`."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    import train  # its perplexity: the same windows as `splash perplexity`
    rng = random.Random(SEED + 1)
    template = open(os.path.join(ROOT, "models", "demo", "chat_template.jinja")).read()
    text = "".join(data.render(data.generate(rng), template) for _ in range(60))
    path = os.path.join(HERE, "results", "heldout.txt")
    open(path, "w").write(text)
    tok = Tokenizer.from_file(os.path.join(ROOT, "models", "demo", "tokenizer.json"))
    ids = tok.encode(text).ids
    model = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "models", "demo"), dtype=torch.float32).eval()
    ppl, _, n = train.perplexity(model, ids, window, "cpu")
    out = subprocess.run([splash, "perplexity", "--model", "demo", "--file", path, "--window", str(window), "--json"],
                         capture_output=True, text=True, check=True)
    ours = json.loads(out.stdout)
    return {"tokens": len(ids), "window": window, "transformers_ppl": ppl, "transformers_predicted": n,
            "splash_ppl": ours["perplexity"], "splash_predicted": ours["predicted"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splash", default=os.path.join(ROOT, "target", "release", "splash"))
    ap.add_argument("--perplexity", action="store_true")
    ap.add_argument("--tools", type=int, default=200)
    ap.add_argument("--json", type=int, default=100)
    ap.add_argument("--chat", type=int, default=100)
    ap.add_argument("--code", type=int, default=60)
    args = ap.parse_args()
    os.chdir(ROOT)
    tools, jsons, chats, codes = request_sets(args.tools, args.json, args.chat, args.code)
    results = {"seed": SEED, "sets": {}}
    for mode, flags in (("speculative", []), ("plain", ["--speculative", "off"])):
        server = Server(args.splash, *flags)
        try:
            for name, reqs, check in (("tool calls", tools, lambda r, e, b: check_tool_call(r, e, b["tools"])),
                                      ("json schema", jsons, check_json), ("chat", chats, check_answer),
                                      ("code", codes, check_answer)):
                r = run_set(server, name, reqs, check)
                results["sets"].setdefault(name, {})[mode] = r
                print(f"{mode:12} {name:12} valid {r['valid']}/{r['requests']} exact {r['exact']} "
                      f"decode {r['decode_tok_s']:.0f} tok/s tokens/pass {r['tokens_per_pass']}", flush=True)
        finally:
            server.close()
    if args.perplexity:
        results["perplexity"] = perplexity_pair(args.splash)
        print(json.dumps(results["perplexity"]))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    json.dump(results, open(os.path.join(HERE, "results", "eval.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
