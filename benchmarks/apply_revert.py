"""Time a full-profile apply and revert, N rounds, and print the figures.

    python3 benchmarks/apply_revert.py PROFILE [--root DIR] [--rounds N] [--json FILE]

On the live host (no --root) this really applies and reverts the profile N times: run it as
root on a machine you may tune. With --root it works on a copy of that tree. Goal from the
engine issue: apply and revert each <= 50 ms for the full profile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gputuned.apply import apply_profile, revert_all
from gputuned.host import Host
from gputuned.profile import load_profile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--root", type=Path, help="a tree (copied first; the original is untouched)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", type=Path, help="write the figures here as JSON too")
    ap.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds of pause before each apply and revert: back to back, a remount that "
        "switches cgroup2's favordynmods on can skip the grace period a lone one waits for",
    )
    args = ap.parse_args()
    profile = load_profile(args.profile)
    work = None
    if args.root:
        work = Path(tempfile.mkdtemp()) / "tree"
        shutil.copytree(args.root, work, symlinks=True)
    root = work or Path("/")
    applies, reverts, writes = [], [], []
    for _ in range(args.rounds):
        host = Host(root)
        time.sleep(args.gap)
        t0 = time.perf_counter()
        _plan, report = apply_profile(host, profile)
        applied = time.perf_counter() - t0
        time.sleep(args.gap)
        t1 = time.perf_counter()
        rev = revert_all(Host(root))
        t2 = time.perf_counter()
        if report.failed or rev.failed:
            print(f"failed: {report.failed} {rev.failed}", file=sys.stderr)
            return 1
        applies.append(applied * 1000)
        reverts.append((t2 - t1) * 1000)
        writes.append(len(report.written))
    if work:
        shutil.rmtree(work.parent)

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {
            "median_ms": round(statistics.median(xs), 2),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))], 2),
            "max_ms": round(xs[-1], 2),
        }

    result = {
        "profile": profile.name,
        "root": str(args.root or "/"),
        "rounds": args.rounds,
        "gap_s": args.gap,
        "writes_per_apply": statistics.median(writes),
        "apply": stats(applies),
        "revert": stats(reverts),
    }
    print(
        f"{profile.name} on {result['root']}: {result['writes_per_apply']:.0f} writes per apply; "
        f"apply median {result['apply']['median_ms']} ms (p90 {result['apply']['p90_ms']}, max "
        f"{result['apply']['max_ms']}); revert median {result['revert']['median_ms']} ms (p90 "
        f"{result['revert']['p90_ms']}, max {result['revert']['max_ms']}); {args.rounds} rounds"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
