"""The neighbours' bill as a curve (issue 20, item 3): server gain against neighbour loss for
each [neighbours] cap, from one noisy_neighbor.py run whose profiles are shared-host with
cap_cpus = N (scripts/device/neighbours.sh writes them and runs it).

    python3 benchmarks/neighbours_curve.py OUT/nn/noisy_neighbor.json [--json]
        [--reserved 8] [--cpus 16]

Per profile (condition ``tuned:<stem>``) under each noise kind: the server's tokens/s and p99 as
ratios to the block's clean windows, its gain in tokens/s against the untuned noisy window, and
each neighbour metric's loss, ``1 - value / untuned value`` (burner iterations, bytes sent,
bytes fsync'd): medians over the blocks, [min-max]. The bound of the issue: each neighbour
metric keeps >= (1 - reserved CPUs / all CPUs) of its untuned value, i.e. loses at most
``reserved / all``; the table says where a cap keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any


def cap_of(cond: str) -> str:
    """``tuned:shared-host-cap4`` -> "4"; the shipped profile (no cap) -> "none"."""
    m = re.search(r"-cap([0-9.]+)", cond)
    return m.group(1) if m else "none"


def rows(summary: dict[str, Any], bound: float) -> list[dict[str, Any]]:
    out = []
    for noise, conds in summary.items():
        for cond, s in conds.items():
            if not cond.startswith("tuned") or "server_gain" not in s:
                continue
            losses = {
                k.removeprefix("neighbour_loss_"): v
                for k, v in s.items()
                if k.startswith("neighbour_loss_")
            }
            out.append(
                {
                    "noise": noise,
                    "profile": cond.removeprefix("tuned:"),
                    "cap_cpus": cap_of(cond),
                    "blocks": s["tok_s_x"]["n"],
                    "tok_s_x": s["tok_s_x"],
                    "p99_x": s["p99_x"],
                    "server_gain": s["server_gain"],
                    "neighbour_loss": losses,
                    "bound_loss": bound,
                    "bound_kept": all(v["median"] <= bound for v in losses.values()),
                }
            )
    return sorted(out, key=lambda r: (r["noise"], _cap_key(r["cap_cpus"])))


def _cap_key(cap: str) -> float:
    return float("inf") if cap == "none" else float(cap)


def table(curve: list[dict[str, Any]]) -> str:
    def r(s: dict[str, float], pct: bool = False) -> str:
        if pct:
            return f"{s['median']:+.0%} [{s['min']:+.0%} to {s['max']:+.0%}]"
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    head = (
        "| noise | cap (CPUs) | blocks | server tok/s x clean | p99 x clean | server gain vs "
        "untuned | neighbours lose (cpu, net, disk) | loss <= reserved/all |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for w in curve:
        loss = ", ".join(f"{k} {r(v, True)}" for k, v in w["neighbour_loss"].items()) or "-"
        lines.append(
            f"| {w['noise']} | {w['cap_cpus']} | {w['blocks']} | {r(w['tok_s_x'])} "
            f"| {r(w['p99_x'])} | {r(w['server_gain'], True)} | {loss} "
            f"| {'yes' if w['bound_kept'] else 'NO'} (<= {w['bound_loss']:.0%}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="noisy_neighbor.json of the run")
    ap.add_argument("--reserved", type=int, default=8, help="CPUs the server's partition holds")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="all CPUs")
    ap.add_argument("--json", action="store_true", help="the curve as JSON on stdout")
    args = ap.parse_args(argv)
    doc = json.loads(args.result.read_text())
    curve = rows(doc.get("summary", {}), args.reserved / args.cpus)
    if args.json:
        print(json.dumps({"reserved": args.reserved, "cpus": args.cpus, "curve": curve}, indent=1))
    else:
        print(table(curve))
    return 0 if curve else 1


if __name__ == "__main__":
    sys.exit(main())
