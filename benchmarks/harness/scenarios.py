"""The scenario matrix's summary (benchmarks/matrix.py, matrix_glance.py): the scenarios, the
goal, and one row per scenario and condition from the per-block ratios, with its verdict."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness import figures

SCENARIOS = ("baseline", "cpu", "net", "disk", "heavy", "pinned")
#: The noise kind each scenario's blocks run under (pinned: inside heavy's blocks).
NOISE_OF = {"baseline": "none", "pinned": "heavy"}
GOAL_TOK, GOAL_P99 = figures.GOAL_TOK, 1.05
#: Blocks a verdict needs: under heavy noise (and pinned, in heavy's blocks), elsewhere.
NEED_HEAVY, NEED = 6, 2
#: Figures summarised per condition (medians over blocks).
ABSOLUTE = ("tok_s", "p99_ms", "runq_ms_per_token", "invol_cs_per_1k", "vol_cs_per_1k")


def condition_label(cond: str) -> str:
    if cond == "noisy":
        return "untuned"
    if cond == "pinned":
        return "pinned by hand"
    parts = cond.split(":")  # tuned:PROFILE[:ORDER]
    return "gputuned" + (f" ({parts[2].replace('-', ' ')})" if len(parts) > 2 else "")


def verdict(tok: dict[str, float], p99: dict[str, float], need: int) -> str:
    """Against the goal, on the medians of the per-block ratios."""
    n = int(tok["n"])
    if n < need:
        return f"too few blocks ({n} < {need})"
    misses = []
    if tok["median"] < GOAL_TOK:
        misses.append(f"tok/s {tok['median']:.3f}x < {GOAL_TOK}")
    if p99["median"] > GOAL_P99:
        misses.append(f"p99 {p99['median']:.3f}x > {GOAL_P99}")
    return "not met: " + ", ".join(misses) if misses else "met"


def rows(
    summary: dict[str, dict[str, Any]], scenarios: list[str], need: int, need_heavy: int
) -> list[dict[str, Any]]:
    """One row per scenario and condition, from harness/figures.py summarize's per-noise figures."""
    out = []
    for scenario in scenarios:
        conds = summary.get(NOISE_OF.get(scenario, scenario), {})
        first = "pinned" if scenario == "pinned" else "noisy"
        for cond in [first, *(c for c in conds if c.startswith("tuned"))]:
            s = conds.get(cond)
            if s is None:
                continue
            row: dict[str, Any] = {
                "scenario": scenario,
                "condition": condition_label(cond),
                "window_condition": cond,
                "blocks": s["tok_s_x"]["n"],
                **{k: s[k] for k in ("tok_s_x", "p50_x", "p99_x")},
                "p99_pooled_x": s["p99_pooled_x"],
                **{k: s[k]["median"] for k in ABSOLUTE},
                "neighbour_loss": {
                    k.removeprefix("neighbour_loss_"): v["median"]
                    for k, v in s.items()
                    if k.startswith("neighbour_loss_") and cond != "noisy"
                },
            }
            heavy = scenario in ("heavy", "pinned")
            row["verdict"] = verdict(s["tok_s_x"], s["p99_x"], need_heavy if heavy else need)
            out.append(row)
    return out


def summarizer(mine: argparse.Namespace) -> Any:
    def summarize(windows: list[dict[str, Any]]) -> dict[str, Any]:
        per_noise = figures.summarize(windows)
        return {
            "per_noise": per_noise,
            "rows": rows(per_noise, mine.scenarios, mine.need, mine.need_heavy),
        }

    return summarize


def pooled_windows(paths: list[Path]) -> list[dict[str, Any]]:
    """The windows of several runs' matrix.json, their rounds renamed RUN.ROUND so that blocks
    of different runs stay apart, each with its tokens' latencies (``--keep-latencies``)."""
    windows: list[dict[str, Any]] = []
    for i, path in enumerate(paths, 1):
        for w in json.loads(path.read_text())["windows"]:
            if "lat_ms" not in w:
                sys.exit(f"{path}: windows without their tokens; run with --keep-latencies")
            windows.append({**w, "round": f"{i}.{w['round']}", "_lat": w["lat_ms"]})
    return windows
