#!/usr/bin/env python3
"""GPU time per kernel of two forward passes from an Nsight Compute CSV, side by side.

Takes the CSV that `ncu --metrics gpu__time_duration.sum --csv --log-file F ./splash bench ...`
writes (every graph node profiled as its own kernel), cuts the launches into passes at each
LM-head GEMV (the one launch of a pass with a grid of 15,000 blocks or more that is not an
expert product), lists the passes (launches, total microseconds), and compares two of them
kernel by kernel: launches and microseconds in each, and the difference.

    python3 bench/ncu_passes.py prof.csv            # the list of passes
    python3 bench/ncu_passes.py prof.csv 6 14       # pass 6 against pass 14

Nsight Compute locks the clock and flushes the caches around each kernel, so its times are
longer than the bench's (BENCHMARKS.md gives the factor per run); compare passes of one file.
"""

import collections
import csv
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def launches(path):
    """(kernel name, grid blocks, microseconds) for every profiled launch, in order."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    out = []
    for row in csv.DictReader(lines):
        if row["Metric Name"] != "gpu__time_duration.sum":
            continue
        x, y, z = (int(v) for v in row["Grid Size"].strip("()").split(","))
        us = float(row["Metric Value"].replace(",", "")) * UNITS[row["Metric Unit"]]
        out.append((row["Kernel Name"].split("(")[0], x * y * z, us))
    return out


def passes(rows):
    """The launches cut after each LM-head GEMV (the pass's last large product)."""
    cut, current = [], []
    for name, grid, us in rows:
        current.append((name, grid, us))
        if grid >= 15000 and "experts" not in name:
            cut.append(current)
            current = []
    return cut


def by_kernel(launches_of_pass):
    """kernel name -> [launches, microseconds]."""
    table = collections.defaultdict(lambda: [0, 0.0])
    for name, _, us in launches_of_pass:
        table[name][0] += 1
        table[name][1] += us
    return table


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    cut = passes(launches(sys.argv[1]))
    for i, p in enumerate(cut):
        print(f"pass {i:3d}: {len(p):5d} launches, {sum(us for _, _, us in p):10.1f} us")
    if len(sys.argv) == 2:
        return
    a, b = int(sys.argv[2]), int(sys.argv[3])
    if not (0 <= a < len(cut) and 0 <= b < len(cut)):
        sys.exit(f"passes are numbered 0..{len(cut) - 1}")
    ta, tb = by_kernel(cut[a]), by_kernel(cut[b])
    names = sorted(set(ta) | set(tb), key=lambda n: -(tb.get(n, [0, 0.0])[1] - ta.get(n, [0, 0.0])[1]))
    print(f"\n{'kernel':44s} {'n ' + str(a):>7s} {'us':>9s} {'n ' + str(b):>7s} {'us':>9s} {'+us':>9s}")
    for n in names:
        (na, ua), (nb, ub) = ta.get(n, [0, 0.0]), tb.get(n, [0, 0.0])
        print(f"{n[:44]:44s} {na:7d} {ua:9.1f} {nb:7d} {ub:9.1f} {ub - ua:9.1f}")


if __name__ == "__main__":
    main()
