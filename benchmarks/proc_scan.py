"""What psutil would cost or save: gputuned's own /proc reads against psutil's, on this machine.

    python3 benchmarks/proc_scan.py [--rounds 7] [--scans 20] [--json FILE]

Two reads matter for speed (docs/dev/benchmarks.md, "psutil"):

- **the full plan's process scan**: every process's comm, command line, parent and start time
  (``gputuned.kernel.proc.iter_processes(kernel, brief=True)``; rules are matched on these, and
  only the few processes they match are read further);
- **the daemon's read of one new process** at a fork, exec or rename event, before it is
  matched and placed (``read_process(kernel, pid, threads=False, brief=True)``): the part of
  exec -> placed that psutil could serve. The rest of a placement reads every thread's nice,
  policy and CPU affinity, which psutil does not give per thread (``Process.threads()`` has
  only the CPU times), and writes them with system calls.

psutil does the same with ``process_iter(["pid", "ppid", "name", "cmdline", "create_time"])``
and ``Process(pid).as_dict(...)`` (it reads /proc/PID/stat and /proc/PID/cmdline too; it turns
the start time into seconds since the epoch, which needs /proc/stat's ``btime``). Each figure
is the median over ``--rounds`` rounds of ``--scans`` scans (or reads); the two are interleaved
so that load on a shared machine falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

try:
    import psutil
except ImportError:
    sys.exit("benchmarks/proc_scan.py compares gputuned with psutil: pip install psutil first")

from gputuned.kernel.live import LiveKernel
from gputuned.kernel.proc import iter_processes, read_process

ATTRS = ["pid", "ppid", "name", "cmdline", "create_time"]


def ours_scan(kernel: LiveKernel) -> int:
    return len(iter_processes(kernel, brief=True))


def psutil_scan() -> int:
    return sum(1 for _ in psutil.process_iter(ATTRS))


def ours_one(kernel: LiveKernel, pid: int) -> None:
    read_process(kernel, pid, threads=False, brief=True)


def psutil_one(pid: int) -> None:
    psutil.Process(pid).as_dict(attrs=ATTRS)


def timed(fn: Callable[[], object], n: int) -> float:
    """Milliseconds per call, over ``n`` calls."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--scans", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    kernel = LiveKernel()
    pid = os.getpid()
    rows: dict[str, list[float]] = {
        k: [] for k in ("ours_scan", "psutil_scan", "ours_one", "psutil_one")
    }
    for _ in range(args.rounds):
        rows["ours_scan"].append(timed(lambda: ours_scan(kernel), args.scans))
        rows["psutil_scan"].append(timed(psutil_scan, args.scans))
        rows["ours_one"].append(timed(lambda: ours_one(kernel, pid), args.scans * 50))
        rows["psutil_one"].append(timed(lambda: psutil_one(pid), args.scans * 50))
    result = {
        "processes": ours_scan(kernel),
        "psutil": psutil.__version__,
        "python": sys.version.split()[0],
        "rounds": args.rounds,
        **{f"{k}_ms_median": round(statistics.median(v), 4) for k, v in rows.items()},
        **{f"{k}_ms_rounds": [round(x, 4) for x in v] for k, v in rows.items()},
    }
    print(
        f"{result['processes']} processes; full scan: gputuned "
        f"{result['ours_scan_ms_median']:.2f} ms, psutil {result['psutil_scan_ms_median']:.2f} ms; "
        f"one process: gputuned {result['ours_one_ms_median'] * 1e3:.0f} us, psutil "
        f"{result['psutil_one_ms_median'] * 1e3:.0f} us (median of {args.rounds} rounds)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
