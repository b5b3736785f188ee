#!/usr/bin/env python3
"""The six-scenario matrix at a glance: one table and one figure over the H200 runs.

    python3 benchmarks/matrix_glance.py [docs/dev/data/matrix-h200.json] [--out DIR] [--check]

Each matrix.py run covers a slice (some scenarios, one worker shape) and fits one device call;
this gathers the slices' rows (one per scenario, worker shape and condition: the median and
[min-max] over paired blocks of the per-block ratios to clean, and the run-queue delay per
token) from a data file into one markdown table (stdout) with the verdict against the goal
(tokens/s >= 0.97x and p99 <= 1.05x of clean; >= 6 blocks under heavy noise, >= 2 elsewhere),
and one figure, DIR/matrix-glance.png (the harness's bars: tokens/s, p99, run-queue
delay; one bar per condition, scenario and shape along the x axis).

The data file names the run of every row; where a run's matrix.json files are kept beside the
data file (its ``files``), its rows hold four decimals and ``--check`` recomputes them from
the windows in those files, exiting 1 on any row that differs (tests/unit/test_matrix_glance.py
runs it on the shipped data). The others are transcribed from their runs' printed tables (two
decimals). The verdict is taken on the figures as the data file holds them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness beside this file

from harness import scenarios
from harness.plot import plain_png

DATA = Path(__file__).resolve().parents[1] / "docs" / "dev" / "data" / "matrix-h200.json"
SHAPES = ("single", "server")
CONDITIONS = (
    "untuned",
    "gputuned",
    "gputuned (server first)",
    "gputuned (daemon first)",
    "pinned by hand",
)
FIGURES = ("tok_s_x", "p99_x")


def load(path: Path) -> dict[str, Any]:
    """The data file, each row checked: a malformed one stops with what is wrong and where."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    runs = doc.get("runs") if isinstance(doc, dict) else None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(runs, dict) or not isinstance(rows, list) or not rows:
        sys.exit(f"{path}: needs 'runs' (an object) and 'rows' (a non-empty list)")
    for i, r in enumerate(rows, 1):
        where = f"{path}: row {i}"
        if not isinstance(r, dict):
            sys.exit(f"{where}: not an object")
        if r.get("scenario") not in scenarios.SCENARIOS or r["scenario"] == "pinned":
            sys.exit(f"{where}: scenario {r.get('scenario')!r} (pinned is a condition of heavy)")
        if r.get("shape") not in SHAPES or r.get("condition") not in CONDITIONS:
            sys.exit(f"{where}: shape {r.get('shape')!r} or condition {r.get('condition')!r}")
        if r.get("run") not in runs:
            sys.exit(f"{where}: run {r.get('run')!r} is not one of 'runs'")
        if not isinstance(r.get("blocks"), int) or r["blocks"] < 1:
            sys.exit(f"{where}: blocks must be a whole number >= 1")
        for key in FIGURES:
            v = r.get(key)
            ok = isinstance(v, list) and len(v) == 3 and all(isinstance(x, int | float) for x in v)
            if not ok or not v[1] <= v[0] <= v[2]:
                sys.exit(f"{where}: {key} must be [median, min, max] with min <= median <= max")
        if not isinstance(r.get("runq_ms_per_token"), int | float):
            sys.exit(f"{where}: runq_ms_per_token must be a number")
    return doc


def spread(v: list[float], n: int) -> dict[str, float]:
    return {"median": v[0], "min": v[1], "max": v[2], "n": n}


def verdict(r: dict[str, Any]) -> str:
    need = scenarios.NEED_HEAVY if r["scenario"] == "heavy" else scenarios.NEED
    return scenarios.verdict(
        spread(r["tok_s_x"], r["blocks"]), spread(r["p99_x"], r["blocks"]), need
    )


def table(doc: dict[str, Any]) -> str:
    def r3(v: list[float]) -> str:
        return f"{v[0]:.2f} [{v[1]:.2f}-{v[2]:.2f}]"

    lines = [
        "| scenario | worker | condition | blocks | tok/s x | p99 x | run-queue ms/token "
        "| goal (>= 0.97x, p99 <= 1.05x) | run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['shape']} | {r['condition']} | {r['blocks']} "
            f"| {r3(r['tok_s_x'])} | {r3(r['p99_x'])} | {r['runq_ms_per_token']:.3f} "
            f"| {verdict(r)} | {r['run']} |"
        )
    return "\n".join(lines)


def figure(doc: dict[str, Any], path: Path, title: str) -> str:
    """Two panels, tokens/s and p99 as ratios to clean: one bar per condition, whiskers from
    the lowest to the highest block, scenario and worker shape along the x axis, the goal
    dashed. Without matplotlib, the harness's plain bars."""
    series: dict[str, dict[str, Any]] = {}
    for r in doc["rows"]:
        series.setdefault(r["condition"], {})[f"{r['scenario']}\n{r['shape']}"] = {
            k: spread(r[k], r["blocks"]) for k in FIGURES
        }
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plain_png(series, path)
        return "plain (matplotlib not installed: bars only, no labels)"
    groups = list(dict.fromkeys(g for s in series.values() for g in s))
    conds = [c for c in CONDITIONS if c in series]
    width = 0.8 / len(conds)
    panels = (
        ("tok_s_x", "tokens/s (x clean)", scenarios.GOAL_TOK),
        ("p99_x", "p99 (x clean)", scenarios.GOAL_P99),
    )
    fig, axes = plt.subplots(2, 1, figsize=(15, 8), sharex=True)
    for ax, (key, label, goal) in zip(axes, panels, strict=True):
        for i, cond in enumerate(conds):
            xs, ys, lo, hi = [], [], [], []
            for j, g in enumerate(groups):
                s = series[cond].get(g)
                if s is not None:
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(s[key]["median"])
                    lo.append(s[key]["median"] - s[key]["min"])
                    hi.append(s[key]["max"] - s[key]["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=cond)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(goal, color="red", ls="--", lw=0.8, label=f"goal {goal}")
        ax.set_ylabel(label)
    axes[0].legend(ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1.25))
    axes[1].set_xticks(range(len(groups)))
    axes[1].set_xticklabels(groups)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"


def recomputed(doc: dict[str, Any], base: Path, run: str) -> dict[tuple[str, str], Any]:
    """The rows of one run, from the windows of its kept matrix.json files."""
    windows = scenarios.pooled_windows([base / name for name in doc.get("files", {}).get(run, [])])
    ns = argparse.Namespace(
        scenarios=list(scenarios.SCENARIOS), need=scenarios.NEED, need_heavy=scenarios.NEED_HEAVY
    )
    rows = scenarios.summarizer(ns)(windows)["rows"]
    return {(r["scenario"], r["condition"]): r for r in rows}


def check(doc: dict[str, Any], base: Path) -> list[str]:
    """Every row whose run has kept files, against the same figures recomputed from them."""
    problems: list[str] = []
    cache: dict[str, dict[tuple[str, str], Any]] = {}
    for r in doc["rows"]:
        if r["run"] not in doc.get("files", {}):
            continue
        if r["run"] not in cache:
            cache[r["run"]] = recomputed(doc, base, r["run"])
        scenario = "pinned" if r["condition"] == "pinned by hand" else r["scenario"]
        got = cache[r["run"]].get((scenario, r["condition"]))
        what = f"{r['scenario']} / {r['shape']} / {r['condition']} ({r['run']})"
        if got is None:
            problems.append(f"{what}: no such row in the run's files")
            continue
        want = {
            "blocks": got["blocks"],
            **{k: [round(got[k][s], 4) for s in ("median", "min", "max")] for k in FIGURES},
            "runq_ms_per_token": round(got["runq_ms_per_token"], 4),
        }
        for key, value in want.items():
            if r[key] != value:
                problems.append(f"{what}: {key} is {r[key]}, the files give {value}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="?", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, help="write matrix-glance.png there")
    ap.add_argument("--check", action="store_true", help="rows against their runs' files")
    args = ap.parse_args(argv)
    doc = load(args.data)
    if args.check:
        problems = check(doc, args.data.parent)
        for p in problems:
            print(p)
        print(f"check: {len(problems)} row(s) differ from their runs' files")
        return 1 if problems else 0
    title = "scenario matrix on the H200 - per-block ratios to clean: median [min-max]"
    print(f"{title}\n{table(doc)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        how = figure(doc, args.out / "matrix-glance.png", title)
        print(f"wrote {args.out / 'matrix-glance.png'} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
