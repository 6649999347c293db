#!/usr/bin/env python3
"""GPU time, DRAM bytes and bandwidth per kernel of forward passes from an Nsight Compute CSV.

Takes the CSV that `ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
--csv --log-file F ./splash bench ...` writes (every graph node profiled as its own kernel; the
two byte metrics are optional), cuts the launches into passes at each LM-head GEMV (the one
launch of a pass with a grid of 15,000 blocks or more that is not an expert product), and lists
the passes (launches, total microseconds, DRAM bytes). Given one pass, it prints that pass's
kernels: launches, microseconds, megabytes read and written, and the bandwidth they reached.
Given two, it compares them kernel by kernel: launches and microseconds in each, and the
difference. Negative pass numbers count from the end.

    python3 bench/ncu_passes.py prof.csv            # the list of passes
    python3 bench/ncu_passes.py prof.csv -2         # the last but one pass, kernel by kernel
    python3 bench/ncu_passes.py prof.csv 6 14       # pass 6 against pass 14
    python3 bench/ncu_passes.py prof.csv --tail 40  # the last 40 launches, then their kernels

`--tail` is for a profile of some kernels only (`ncu -k regex:...`, `gpu-run.sh profile` with
PROFILE_KERNELS), where there are no LM-head launches to cut passes at.

Nsight Compute locks the clock and flushes the caches around each kernel, so its times are
longer than the bench's (BENCHMARKS.md gives the factor per run) and every kernel reads its
inputs from DRAM; compare passes of one file.
"""

import collections
import csv
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"


class Launch:
    """One profiled launch: kernel name, grid blocks, microseconds, DRAM bytes read and written."""

    def __init__(self, name, grid):
        self.name, self.grid = name, grid
        self.us = self.read = self.written = 0.0


def launches(path):
    """Every profiled launch, in order (the CSV has a row per launch and metric)."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    by_id = {}
    for row in csv.DictReader(lines):
        metric, value = row["Metric Name"], float(row["Metric Value"].replace(",", ""))
        if metric not in (TIME, READ, WRITE):
            continue
        launch = by_id.get(row["ID"])
        if launch is None:
            x, y, z = (int(v) for v in row["Grid Size"].strip("()").split(","))
            launch = by_id[row["ID"]] = Launch(row["Kernel Name"].split("(")[0], x * y * z)
        if metric == TIME:
            launch.us = value * UNITS[row["Metric Unit"]]
        elif metric == READ:
            launch.read = value * BYTES[row["Metric Unit"]]
        else:
            launch.written = value * BYTES[row["Metric Unit"]]
    return [by_id[i] for i in sorted(by_id, key=int)]


def passes(rows):
    """The launches cut after each LM-head GEMV (the pass's last large product)."""
    cut, current = [], []
    for launch in rows:
        current.append(launch)
        if launch.grid >= 15000 and "experts" not in launch.name:
            cut.append(current)
            current = []
    return cut


def by_kernel(launches_of_pass):
    """kernel name -> [launches, microseconds, bytes read, bytes written]."""
    table = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for launch in launches_of_pass:
        row = table[launch.name]
        row[0] += 1
        row[1] += launch.us
        row[2] += launch.read
        row[3] += launch.written
    return table


def pass_table(launches_of_pass):
    """The pass's kernels, most time first: launches, us, MB read / written, GB/s."""
    table = by_kernel(launches_of_pass)
    print(f"{'kernel':44s} {'n':>5s} {'us':>9s} {'us each':>8s} {'MB read':>9s} {'MB wr':>8s} {'GB/s':>7s}")
    for name, (n, us, read, written) in sorted(table.items(), key=lambda kv: -kv[1][1]):
        rate = (read + written) / (us * 1e3) if us else 0.0
        print(f"{name[:44]:44s} {n:5d} {us:9.1f} {us / n:8.2f} {read / 1e6:9.1f} {written / 1e6:8.1f} {rate:7.0f}")
    us = sum(row[1] for row in table.values())
    moved = sum(row[2] + row[3] for row in table.values())
    print(f"{'all':44s} {sum(row[0] for row in table.values()):5d} {us:9.1f} {'':8s} {moved / 1e6:18.1f} {moved / (us * 1e3):7.0f}")


def tail(rows, n):
    """The last n launches, one a line, then their kernels as pass_table lists them."""
    print(f"{'kernel':44s} {'grid':>7s} {'us':>9s} {'MB read':>9s} {'MB wr':>8s} {'GB/s':>7s}")
    for launch in rows[-n:]:
        rate = (launch.read + launch.written) / (launch.us * 1e3) if launch.us else 0.0
        print(f"{launch.name[:44]:44s} {launch.grid:7d} {launch.us:9.2f} {launch.read / 1e6:9.2f} "
              f"{launch.written / 1e6:8.2f} {rate:7.0f}")
    print()
    pass_table(rows[-n:])


def main():
    if len(sys.argv) == 4 and sys.argv[2] == "--tail":
        return tail(launches(sys.argv[1]), int(sys.argv[3]))
    if len(sys.argv) not in (2, 3, 4):
        sys.exit(__doc__)
    cut = passes(launches(sys.argv[1]))
    for i, p in enumerate(cut):
        moved = sum(launch.read + launch.written for launch in p)
        print(f"pass {i:3d}: {len(p):5d} launches, {sum(launch.us for launch in p):10.1f} us, {moved / 1e6:9.1f} MB")
    if len(sys.argv) == 2:
        return
    try:
        chosen = [cut[int(a)] for a in sys.argv[2:]]
    except (ValueError, IndexError):
        sys.exit(f"passes are numbered 0..{len(cut) - 1} (or -1 back to -{len(cut)})")
    print()
    if len(chosen) == 1:
        pass_table(chosen[0])
        return
    a, b = sys.argv[2], sys.argv[3]
    ta, tb = by_kernel(chosen[0]), by_kernel(chosen[1])
    zero = [0, 0.0, 0.0, 0.0]
    names = sorted(set(ta) | set(tb), key=lambda n: -(tb.get(n, zero)[1] - ta.get(n, zero)[1]))
    print(f"{'kernel':44s} {'n ' + a:>7s} {'us':>9s} {'n ' + b:>7s} {'us':>9s} {'+us':>9s}")
    for n in names:
        (na, ua, _, _), (nb, ub, _, _) = ta.get(n, zero), tb.get(n, zero)
        print(f"{n[:44]:44s} {na:7d} {ua:9.1f} {nb:7d} {ub:9.1f} {ub - ua:9.1f}")


if __name__ == "__main__":
    main()
