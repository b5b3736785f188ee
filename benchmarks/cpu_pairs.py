#!/usr/bin/env python3
"""Which CPUs slow each other down? A probe for hidden SMT siblings and shared clocks.

A virtual machine's CPU list may not say which of its CPUs are hyperthreads of one physical
core (this host's topology files say one thread per core). This probe measures it: a
pure-Python loop on CPU ``--cpu`` counts iterations for ``--seconds``, first alone, then with
one busy loop on each other CPU in turn, then with busy loops on more and more of them (alone again between each). A CPU whose
busy loop costs the probe far more than the others is likely its SMT sibling; a loss with all
of them busy and none alone is a shared clock or cache.

    python3 benchmarks/cpu_pairs.py [--cpu 1] [--seconds 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from typing import Any


def spin(cpu: int, stop: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        for _ in range(100_000):
            pass


def count(cpu: int, seconds: float) -> float:
    os.sched_setaffinity(0, {cpu})
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            pass
        n += 1
    return n / seconds


def measure(cpu: int, others: list[int], seconds: float) -> float:
    stop = mp.Event()
    procs = [mp.Process(target=spin, args=(c, stop), daemon=True) for c in others]
    for p in procs:
        p.start()
    time.sleep(0.2)
    try:
        return count(cpu, seconds)
    finally:
        stop.set()
        for p in procs:
            p.join(2)
            if p.is_alive():
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    others = [c for c in cpus if c != args.cpu]
    count(args.cpu, 1.0)  # warm up: the first second ran slower on the H200 host
    # Alone between every other measurement, each ratio against the mean of its neighbours:
    # the host's own speed drifts.
    alone = [measure(args.cpu, [], args.seconds)]
    per: dict[int, float] = {}
    for c in others:
        x = measure(args.cpu, [c], args.seconds)
        alone.append(measure(args.cpu, [], args.seconds))
        per[c] = x / statistics.fmean(alone[-2:])
    # Busy CPUs counted from the far end of the list: 1, 3, 7, 11, ... others.
    by_count: dict[int, float] = {}
    for n in sorted({1, 3, 7, 11, len(others)} & set(range(1, len(others) + 1))):
        x = measure(args.cpu, others[-n:], args.seconds)
        alone.append(measure(args.cpu, [], args.seconds))
        by_count[n] = x / statistics.fmean(alone[-2:])
    print(
        f"CPU {args.cpu} alone: {statistics.fmean(alone):,.0f} loops/s "
        f"(min {min(alone):,.0f}, max {max(alone):,.0f} over {len(alone)} measurements)"
    )
    for c, x in per.items():
        print(f"  with CPU {c:2} busy: {x:.3f}x")
    for n, x in by_count.items():
        print(f"  with {n:2} CPUs busy ({others[-n]}-{others[-1]}): {x:.3f}x")
    if args.json:
        with open(args.json, "w") as f:  # noqa: PTH123
            json.dump({"cpu": args.cpu, "alone": alone, "one_busy_x": per,
                       "n_busy_x": by_count}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
