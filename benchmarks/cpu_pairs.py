#!/usr/bin/env python3
"""Which CPUs slow each other down? A probe for hidden SMT siblings and shared clocks.

A virtual machine's CPU list may not say which of its CPUs are hyperthreads of one physical
core (this host's topology files say one thread per core). This probe measures it: a
pure-Python loop on CPU ``--cpu`` counts iterations for ``--seconds``, first alone, then with
one busy loop on each other CPU in turn, then with busy loops on all other CPUs. A CPU whose
busy loop costs the probe far more than the others is likely its SMT sibling; a loss with all
of them busy and none alone is a shared clock or cache.

    python3 benchmarks/cpu_pairs.py [--cpu 1] [--seconds 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
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
    alone = statistics_mean([measure(args.cpu, [], args.seconds) for _ in range(2)])
    per = {c: measure(args.cpu, [c], args.seconds) / alone for c in others}
    everything = measure(args.cpu, others, args.seconds) / alone
    again = measure(args.cpu, [], args.seconds) / alone
    print(f"CPU {args.cpu} alone: {alone:,.0f} loops/s (again at the end: {again:.3f}x)")
    for c, x in per.items():
        print(f"  with CPU {c:2} busy: {x:.3f}x")
    print(f"  with all {len(others)} other CPUs busy: {everything:.3f}x")
    if args.json:
        with open(args.json, "w") as f:  # noqa: PTH123
            json.dump({"cpu": args.cpu, "alone": alone, "again_x": again, "one_busy_x": per,
                       "all_busy_x": everything}, f, indent=1)  # fmt: skip
    return 0


def statistics_mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


if __name__ == "__main__":
    raise SystemExit(main())
