"""Time a full-profile apply and revert, N rounds, and print the figures.

    python3 benchmarks/apply_revert.py PROFILE [--root DIR] [--rounds N] [--json FILE]
                                       [--gap S] [--breakdown]

On the live host (no --root) this really applies and reverts the profile N times: run it as
root on a machine you may tune. With --root it works on a copy of that tree. Goal from the
engine issue: apply and revert each <= 50 ms for the full profile.

--breakdown also times where an apply's time goes: the state-file check, the plan (and each
of its reads of the host), journaling each old value (append + fsync), each write with its
read-back (named by tuner and kind: the IRQ writes, the cgroup writes, the remount), the
leftovers pass, journal compaction and the state record; the rest (the lock, bookkeeping) is
"not in a phase above". Only the apply is timed, not the revert. Median ms per round, largest
first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from harness import applysteps

import gputuned.engine.plan as engine_mod
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.profile.load import load_profile
from gputuned.root import open_kernel

F = TypeVar("F", bound=Callable[..., Any])


class Breakdown:
    """Wraps apply's phases (module functions) and sums their time per round, while
    ``active`` (the apply; revert calls some of the same functions)."""

    # Each phase by its names, the first also its label: an earlier checkout's, then this
    # one's where it differs (benchmarks/harness/applysteps.py; scripts/device/applytime.sh times
    # other checkouts too).
    PHASES = (
        ("check_state_files",),
        ("plan_profile",),
        ("_prepare", "prepare"),
        ("_commit", "commit"),
        ("_restore_leftovers",),
        ("_record", "record_applied"),
    )

    # What plan_profile reads, shown as "plan: ..." lines inside its total.
    PLAN_READS = (
        "snapshot",
        "read_host_cpus",
        "read_interrupts",
        "read_default_affinity",
        "read_cgroup_layout",
        "iter_processes",
    )

    def __init__(self) -> None:
        self.round: defaultdict[str, float] = defaultdict(float)
        self.rounds: list[dict[str, float]] = []
        self.active = False
        mods = applysteps.modules()
        for names in self.PHASES:
            applysteps.wrap(mods, names, lambda fn, label=names[0]: self._timed(label, fn))
        for name in self.PLAN_READS:
            setattr(engine_mod, name, self._timed(f"plan: {name}", getattr(engine_mod, name)))
        Journal.compact = self._timed("journal.compact", Journal.compact)  # type: ignore[method-assign]

    def _timed(self, name: str, fn: F) -> F:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = (time.perf_counter() - t0) * 1000
                label = name
                if name in ("_prepare", "_commit"):
                    op = args[2]
                    what = "journal" if name == "_prepare" else "write+read-back"
                    label = f"{what}: {op.tuner} {op.kind}"
                self.round[label] += ms

        return wrapper  # type: ignore[return-value]

    def end_round(self, total_ms: float) -> None:
        self.active = False
        self.round["(total)"] = total_ms
        self.rounds.append(dict(self.round))
        self.round.clear()

    def summary(self) -> dict[str, float]:
        labels = {k for r in self.rounds for k in r}
        med = {k: statistics.median(r.get(k, 0.0) for r in self.rounds) for k in labels}
        named = sum(v for k, v in med.items() if k != "(total)" and not k.startswith("plan: "))
        med["(not in a phase above)"] = max(0.0, med["(total)"] - named)
        reads = sum(v for k, v in med.items() if k.startswith("plan: "))
        med["plan: the tuners (no reads above)"] = max(0.0, med.get("plan_profile", 0.0) - reads)
        return {k: round(v, 2) for k, v in sorted(med.items(), key=lambda kv: -kv[1])}


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
    ap.add_argument(
        "--breakdown", action="store_true", help="also time each phase and kind of write"
    )
    args = ap.parse_args()
    breakdown = Breakdown() if args.breakdown else None
    profile = load_profile(args.profile)
    work = None
    if args.root:
        work = Path(tempfile.mkdtemp()) / "tree"
        shutil.copytree(args.root, work, symlinks=True)
    root = work or Path("/")
    applies, reverts, writes = [], [], []
    for _ in range(args.rounds):
        host = open_kernel(root)
        time.sleep(args.gap)
        if breakdown:
            breakdown.active = True
        t0 = time.perf_counter()
        _plan, report = apply_profile(host, profile)
        applied = time.perf_counter() - t0
        if breakdown:
            breakdown.end_round(applied * 1000)
        time.sleep(args.gap)
        t1 = time.perf_counter()
        rev = revert_all(open_kernel(root))
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
    if breakdown:
        result["apply_breakdown_median_ms"] = breakdown.summary()
        print("where an apply's time goes (median ms per round):")
        for label, ms in result["apply_breakdown_median_ms"].items():
            print(f"  {ms:8.2f}  {'  ' if label.startswith('plan: ') else ''}{label}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
