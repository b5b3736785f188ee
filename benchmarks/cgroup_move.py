#!/usr/bin/env python3
"""How long does moving a process between cgroup v2 groups take, with and without favordynmods?

Writing a PID to ``cgroup.procs`` write-locks the kernel's cgroup_threadgroup_rwsem. Unless the
cgroup2 hierarchy is mounted with ``favordynmods``, that lock waits for an RCU grace period
(Documentation/admin-guide/cgroup-v2.rst, "favordynmods"), which on some hosts is most of the
time from a server's exec to its placement. This probe moves a sleeping child back and forth
``--moves`` times (``--gap`` apart) as the hierarchy is mounted, then
(``--try-favordynmods``) remounts it with ``favordynmods`` added (gputuned's own remount), measures again and remounts it with its original options, checking
they are back.

    python3 benchmarks/cgroup_move.py [--moves 40] [--try-favordynmods] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gputuned.kernel.live import LiveKernel
from gputuned.kernel.mounts import find
from gputuned.kernel.proc import read_process
from gputuned.kernel.system import read_cgroup_layout

HOST = LiveKernel()


def cgroup2_point() -> str:
    point = read_cgroup_layout(HOST).v2_mount
    if point is None:
        raise SystemExit("no cgroup2 hierarchy mounted")
    return point


def super_options(point: str) -> str:
    return find(HOST, point, "cgroup2").super_options


def moves(pid: int, there: Path, back: Path, n: int, gap: float) -> list[float]:
    """``n`` moves, ``gap`` seconds apart: right after a move the lock stays in its slow mode
    for a grace period, so back-to-back moves would not show what a lone placement costs."""
    out = []
    for i in range(n):
        time.sleep(gap)
        dst = there if i % 2 == 0 else back
        t = time.perf_counter()
        (dst / "cgroup.procs").write_text(str(pid))
        out.append((time.perf_counter() - t) * 1e3)
    return out


def summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_ms": round(statistics.median(s), 3), "p90_ms": round(s[int(0.9 * (len(s) - 1))], 3),
            "max_ms": round(s[-1], 3)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between moves")
    ap.add_argument("--try-favordynmods", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    point = cgroup2_point()
    root = Path(point)
    orig = super_options(point)
    child = subprocess.Popen(["sleep", "120"])
    home = root / read_process(HOST, child.pid, threads=False).cgroup.lstrip("/")
    probe = root / f"gputuned-move-probe-{os.getpid()}"
    probe.mkdir()
    result: dict[str, object] = {"mount_options": orig}
    try:
        result["as_mounted"] = summary(moves(child.pid, probe, home, args.moves, args.gap))
        print(f"mounted {orig}: move {result['as_mounted']}")
        if args.try_favordynmods and "favordynmods" not in orig.split(","):
            HOST.remount(point, "cgroup2", f"{orig},favordynmods")
            try:
                result["favordynmods"] = summary(
                    moves(child.pid, probe, home, args.moves, args.gap)
                )
                print(f"with favordynmods: move {result['favordynmods']}")
            finally:
                HOST.remount(point, "cgroup2", orig)
            result["options_after"] = super_options(point)
            print(f"options back: {result['options_after'] == orig} ({result['options_after']})")
    finally:
        (home / "cgroup.procs").write_text(str(child.pid))
        child.kill()
        child.wait()
        probe.rmdir()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result.get("options_after", orig) == orig else 1


if __name__ == "__main__":
    sys.exit(main())
