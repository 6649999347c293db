#!/usr/bin/env python3
"""Judgment discrimination of a running `splash serve` (the demo model): true/false claim pairs
from data.py's tables (capitals, element symbols, animal legs, sums with the true and an
off-by-one result), each asked through POST /v1/judgments with the options in both orders
(yes/no and no/yes), plus a few /v1/systemone `noul` checks.

    python3 train/eval_judgments.py --url http://127.0.0.1:8611 [--model demo-ft] [--out FILE]

Reports: the share of (pair, order) comparisons where the true claim gets a higher P(yes) than
the false one, the mean probability of the right option over all requests, and the share of
requests where the right option is the more likely one.
"""
import argparse
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def pairs(seed=31337):
    rng = random.Random(seed)
    out = []
    for country, city in rng.sample(sorted(data.CAPITALS.items()), 12):
        other = rng.choice([c for c in data.CAPITALS.values() if c != city])
        out.append(("capital", f"{city} is the capital of {country}.", f"{other} is the capital of {country}."))
    for name, sym in rng.sample(sorted(data.ELEMENTS.items()), min(10, len(data.ELEMENTS))):
        other = rng.choice([s for s in data.ELEMENTS.values() if s != sym])
        out.append(("symbol", f"The symbol of {name} is {sym}.", f"The symbol of {name} is {other}."))
    for animal, legs in rng.sample(sorted(data.ANIMAL_LEGS.items()), min(8, len(data.ANIMAL_LEGS))):
        other = rng.choice([n for n in (0, 2, 4, 6, 8) if n != legs])
        out.append(("legs", f"A {animal} has {legs} legs.", f"A {animal} has {other} legs."))
    for _ in range(10):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        out.append(("sum", f"{a} + {b} = {a + b}", f"{a} + {b} = {a + b + rng.choice([-1, 1])}"))
    return out


def p_yes(url, claim, order):
    opts = [{"id": "yes", "description": "yes"}, {"id": "no", "description": "no"}]
    if order == "no/yes":
        opts = opts[::-1]
    r = post(url, "/v1/judgments", {"id": "r", "state": claim, "question": "Is this correct?", "options": opts})
    return dict(zip(r["option_ids"], r["probabilities"]))["yes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8611")
    ap.add_argument("--model", default=None, help="served model id (default: the first of GET /v1/models)")
    ap.add_argument("--out")
    args = ap.parse_args()
    model = args.model or json.loads(urllib.request.urlopen(args.url + "/v1/models").read())["data"][0]["id"]
    rows, wins, right, correct, by_kind = [], 0, [], 0, {}
    for kind, true, false in pairs():
        for order in ("yes/no", "no/yes"):
            pt, pf = p_yes(args.url, true, order), p_yes(args.url, false, order)
            win = pt > pf
            wins += win
            right += [pt, 1 - pf]
            correct += (pt > 0.5) + (pf < 0.5)
            k = by_kind.setdefault(kind, [0, 0])
            k[0] += win
            k[1] += 1
            rows.append({"kind": kind, "order": order, "true": true, "false": false, "p_yes_true": pt, "p_yes_false": pf})
    n = len(rows)
    noul = []
    for claim, truth in [("Is 47 + 38 = 85?", True), ("Is 47 + 38 = 86?", False), ("Is 12 + 30 = 42?", True),
                         ("Is 12 + 30 = 43?", False), ("Is Paris the capital of France?", True),
                         ("Is Madrid the capital of France?", False), ("Does a spider have 8 legs?", True),
                         ("Does a spider have 6 legs?", False)]:
        r = post(args.url, "/v1/systemone", {"model": model, "state": claim,
                                             "questions": {"q": {"type": "noul", "instructions": claim}}})
        noul.append({"instructions": claim, "truth": truth, "noul": r["answers"]["q"]["noul"] if "answers" in r else r})
    summary = {"pairs": n, "true_above_false": wins / n, "mean_p_right": sum(right) / len(right),
               "right_more_likely": correct / len(right),
               "by_kind": {k: f"{w}/{t}" for k, (w, t) in by_kind.items()}, "noul": noul}
    print(json.dumps({k: v for k, v in summary.items() if k != "noul"}, indent=1))
    for x in noul:
        print(f"  noul {x['noul'] if isinstance(x['noul'], dict) else round(x['noul'], 3)}  {x['instructions']} (truth {x['truth']})")
    if args.out:
        json.dump(summary | {"rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
