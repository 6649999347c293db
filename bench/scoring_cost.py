#!/usr/bin/env python3
"""What a judgment costs: a scoring request on a long state against a 1-token chat completion
on a state of the same length, and a second question on the same state (prefix reuse).

    .venv/bin/python bench/scoring_cost.py [--bin target/release/splash] [--model demo]
        [--tokens 4096] [--rounds 3] [--device cpu]

Starts `splash serve` on a loopback port. Each round makes two fresh states of about `--tokens`
tokens (random words, so nothing is cached): one is judged twice (two questions), the other is
sent as a chat message with `max_tokens: 1`. Prints each round and the medians.
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))
from splash_server import Server  # noqa: E402

WORDS = ("river stone cloud lantern harbor meadow copper violet signal orchard anchor thunder pebble "
         "canyon willow ember glacier falcon velvet compass").split()
OPTIONS = [{"id": "yes", "description": "yes"}, {"id": "no", "description": "no"}]


def state(rng, tokens):
    # The demo tokenizer takes about 3.2 tokens per word of these (1.3 for Qwen's).
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens / 3.2)))


def timed(h, path, body):
    t0 = time.perf_counter()
    r = h.post(path, json=body)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    s = Server("--device", a.device, "--max-context", str(4 * a.tokens), binary=a.bin, model=a.model)
    rng = random.Random(7)
    rows = []
    try:
        with httpx.Client(base_url=s.url, timeout=600) as h:
            for i in range(a.rounds):
                judged, chatted = state(rng, a.tokens), state(rng, a.tokens)
                row = {"id": f"r{i}", "state": judged, "question": "Is the river mentioned?", "options": OPTIONS}
                t1, j1 = timed(h, "/v1/judgments", row)
                t2, j2 = timed(h, "/v1/judgments", {**row, "question": "Is a falcon mentioned?"})
                tc, c = timed(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": chatted}],
                                                          "max_tokens": 1, "temperature": 0})
                rows.append((t1, t2, tc))
                print(f"round {i}: judgment {t1:.3f} s ({j1['input_tokens']} tokens, {j1['cached_tokens']} cached, "
                      f"prefill {j1['forward_seconds']:.3f} s); second question {t2:.3f} s "
                      f"({j2['cached_tokens']} of {j2['input_tokens']} cached); 1-token chat {tc:.3f} s "
                      f"({c['usage']['prompt_tokens']} tokens)", flush=True)
    finally:
        s.stop()
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"median: judgment {med[0]:.3f} s, second question {med[1]:.3f} s, 1-token chat {med[2]:.3f} s; "
          f"judgment / chat {med[0] / med[2]:.2f}, second / first {med[1] / med[0]:.3f}")


if __name__ == "__main__":
    main()
