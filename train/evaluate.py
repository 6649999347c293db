#!/usr/bin/env python3
"""Measure the demo model through the server: tool-call validity, JSON-schema answers, and the
real acceptance length and speed-up of its DFlash draft; optionally the held-out perplexity
of transformers next to `splash perplexity`.

    cargo build --release
    python3 train/evaluate.py [--splash target/release/splash] [--perplexity]   # writes train/results/eval.json
    python3 train/evaluate.py --tool-rate [--url http://127.0.0.1:8311] [--label NAME]
        # writes train/results/tool_rate[_NAME].json

The held-out prompts come from train/data.py with a seed the training data did not use (the
generators are templated, so a held-out prompt can still equal a training one). Requests
are greedy (temperature 0) and sent one at a time through the OpenAI-compatible HTTP API, so
the server's own tool-call parser and grammar engine are what is measured.
--perplexity needs torch and transformers (any CPU build).

--tool-rate measures how often the model calls the right tool (offered, `tool_choice: auto`)
with JSON arguments that satisfy its schema, on prompts that training never saw (held-out
phrasings, argument values and whole tools: data.HELDOUT_*), beside the same rate on
prompts of the training distribution, and how often it calls no tool when none is needed.
It talks to a running server (--url) or starts `splash serve --model demo` itself.
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
    def __init__(self, splash, *flags, url=None):
        if url:  # a server that is already running
            self.base, self.proc = url.rstrip("/"), None
            return
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([splash, "serve", "--model", "demo", "--port", str(self.port), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("Ready"):
                break
        else:
            raise RuntimeError("splash serve did not start")

    def post(self, path, body):
        req = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def status(self):
        with urllib.request.urlopen(f"{self.base}/status", timeout=10) as r:
            return json.load(r)["metrics"]

    def close(self):
        if self.proc:
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


# ---------------------------------------------------------------------------------------------
# Tool-call rate: held out vs in distribution.

ISSUE_PROMPT = "What is the weather in Osaka right now?"  # issue 30's example, held out


def schema_errors(args, params):
    """What is wrong with call arguments for a JSON schema of the tools' kind (object of
    string / number / integer properties, enums, required), or [] when they satisfy it."""
    if not isinstance(args, dict):
        return ["arguments are not an object"]
    errors = [f"missing {k}" for k in params.get("required", []) if k not in args]
    types = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "array": list, "object": dict}
    for k, v in args.items():
        spec = params["properties"].get(k)
        if spec is None:
            errors.append(f"unknown {k}")
        elif not isinstance(v, types[spec["type"]]) or (spec["type"] in ("number", "integer") and isinstance(v, bool)):
            errors.append(f"{k} is not a {spec['type']}")
        elif "enum" in spec and v not in spec["enum"]:
            errors.append(f"{k} not in {spec['enum']}")
    return errors


def tool_rate_sets(n_heldout, n_train, n_none):
    """(held out, in distribution, no tool needed): lists of (user text, tools, expected call or None)."""
    weather = next(t for t, _ in data.TOOLS if t["function"]["name"] == "get_weather")
    rng = random.Random(SEED + 30)
    heldout = [(ISSUE_PROMPT, [weather], ("get_weather", {"city": "Osaka"}))]
    while len(heldout) < n_heldout:
        heldout.append(data.heldout_tool_request(rng))
    train = []
    while len(train) < n_train:
        c = (data.gen_tool if rng.random() < 0.75 else data.gen_tool_synth)(rng)
        msgs, first = prompt_of(c)
        call = first["tool_calls"][0]["function"]
        train.append((msgs[-1]["content"], c["tools"], (call["name"], call["arguments"])))
    none = []
    while len(none) < n_none:
        c = data.gen_tool_unneeded(rng)
        msgs, _ = prompt_of(c)
        none.append((msgs[-1]["content"], c["tools"], None))
    return heldout, train, none


def tool_rate(server, name, prompts):
    """Greedy requests one at a time; per prompt: the right tool called with schema-valid
    arguments (or, with nothing expected, no call), and the arguments exactly as expected."""
    right = exact = 0
    alone = [0, 0]  # right calls and prompts where the right tool was the only one offered
    rows = []
    for text, tools, want in prompts:
        reply = server.post("/v1/chat/completions", {
            "model": "demo", "temperature": 0, "max_tokens": 200, "tool_choice": "auto", "tools": tools,
            "messages": [{"role": "user", "content": text}]})
        msg = reply["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        ok, ex, why = False, False, ""
        if want is None:
            ok = ex = not calls
            why = "" if ok else "called " + calls[0]["function"]["name"]
        elif not calls:
            why = "no call: " + (msg.get("content") or "")[:120]
        else:
            c = calls[0]["function"]
            params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}.get(want[0])
            try:
                args = json.loads(c["arguments"])
            except json.JSONDecodeError:
                args, why = None, "arguments are not JSON"
            if c["name"] != want[0]:
                why = f"called {c['name']}"
            elif args is not None:
                errors = schema_errors(args, params)
                ok, why = not errors, "; ".join(errors)
                ex = ok and {k: str(v) for k, v in args.items()} == {k: str(v) for k, v in want[1].items()}
                if ok and not ex:
                    why = "arguments " + json.dumps(args, ensure_ascii=False)
        right += ok
        exact += ex
        if want is not None and len(tools) == 1:
            alone[0] += ok
            alone[1] += 1
        rows.append({"prompt": text, "tools": [t["function"]["name"] for t in tools],
                     "expected": list(want) if want else None, "right": ok, "exact": ex, "why": why})
    n = len(prompts)
    out = {"set": name, "prompts": n, "right_tool_valid_args": right, "rate": right / n, "exact_args": exact,
           "exact_rate": exact / n}
    if alone[1]:
        out["tool_alone"] = {"prompts": alone[1], "right": alone[0], "rate": alone[0] / alone[1]}
    print(f"{name:16} right tool, valid arguments {right}/{n} ({100 * right / n:.0f}%), exact arguments {exact}/{n}"
          + (f"; offered alone {alone[0]}/{alone[1]}" if alone[1] else ""), flush=True)
    return out, rows


def tool_rate_main(args):
    heldout, train, none = tool_rate_sets(args.heldout, args.in_dist, args.no_tool)
    server = Server(args.splash, url=args.url)
    results = {"seed": SEED + 30, "server": args.url or f"{args.splash} serve --model demo", "sets": {}}
    examples = {}
    try:
        for name, prompts in (("held out", heldout), ("in distribution", train), ("no tool needed", none)):
            r, rows = tool_rate(server, name, prompts)
            results["sets"][name] = r
            examples[name] = rows
    finally:
        server.close()
    results["issue_prompt"] = examples["held out"][0]
    results["failures"] = {k: [r for r in v if not r["right"]][:12] for k, v in examples.items()}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "tool_rate" + (f"_{args.label}" if args.label else "") + ".json")
    json.dump(results, open(path, "w"), indent=1, ensure_ascii=False)
    print(f"wrote {path}")


def perplexity_pair(splash, window=512):
    """Held-out perplexity from transformers (f32 on the CPU) and from `splash perplexity`."""
    import torch
    from transformers import AutoModelForCausalLM

    import train  # its perplexity: the same windows as `splash perplexity`
    rng = random.Random(SEED + 1)
    template = open(os.path.join(ROOT, "models", "demo", "chat_template.jinja")).read()
    text = "".join(data.render(data.generate(rng), template) for _ in range(60))
    path = os.path.join(HERE, "results", "heldout.txt")
    open(path, "w").write(text)
    tok = data.load_tokenizer(os.path.join(ROOT, "models", "demo"))
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
    ap.add_argument("--tool-rate", action="store_true", help="only the held-out / in-distribution tool-call rate")
    ap.add_argument("--url", help="with --tool-rate: a running server, e.g. http://127.0.0.1:8311")
    ap.add_argument("--label", default="", help="with --tool-rate: suffix of the result file (before, after...)")
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--in-dist", type=int, default=100)
    ap.add_argument("--no-tool", type=int, default=50)
    args = ap.parse_args()
    os.chdir(ROOT)
    if args.tool_rate:
        return tool_rate_main(args)
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
