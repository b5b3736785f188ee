"""The six-scenario matrix (issue 20, item 2): a decoding server under no noise, CPU, network,
disk and all three (heavy) noise, and pinned by hand (the published mitigation), each untuned
and with gputuned, in paired blocks.

    python3 benchmarks/matrix.py --out DIR [--scenarios baseline,cpu,net,disk,heavy,pinned]
        [--blocks 2] [--need-heavy 6] [--deadline EPOCH_S] [--try-out]
        [any option of noisy_neighbor.py: --shape server --order both --worker gpu --window 8
         --profile profiles/shared-host.toml ...]

A thin driver over the harness of noisy_neighbor.py (benchmarks/harness/: its worker, noise,
daemon handling, host checks, per-window figures and per-block ratios). A block is one noise
kind: a clean window, then under the noise the untuned window, gputuned's window(s) (each start
order with ``--shape server --order both``) and, under heavy noise when ``pinned`` is asked
for, the server pinned by hand (every thread on the CPUs the profile's rule gives it, at
nice -10, no daemon), then a clean window again. The windows under noise take turns in adjacent
windows and every other block runs them in reverse order; every ratio is to the mean of the
block's own two clean windows, so the host's drift cancels. ``baseline`` is a block without
noise (its "untuned" window is a second clean one: what drift alone does). The ``pinned``
scenario's gputuned windows are heavy's own: the same blocks, side by side with the hand-pinned
window.

Per scenario and condition the summary has the median and [min-max] of the per-block ratios
(tokens/s, p50, p99), p99 of all blocks' tokens pooled, run-queue delay and context switches
per token, the neighbours' loss against the untuned window, and the verdict against the goal:
tokens/s >= 0.97x and p99 <= 1.05x of clean in the median of >= 6 blocks under heavy noise (and
pinned), >= 2 elsewhere; with fewer blocks it says "too few blocks", not met or met.

``--deadline`` (seconds since the epoch): a block that would end after it is skipped, and the
output says so. Writes DIR/matrix.json, DIR/matrix.png and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness beside this file

from harness.block import Block, Step, default_steps
from harness.figures import add_ratios, public_window, summarize
from harness.host import cpulist
from harness.options import parse_args as nn_parse_args
from harness.plot import plot
from harness.repo import REPO
from harness.run import run
from harness.scenarios import (
    GOAL_P99,
    NEED,
    NEED_HEAVY,
    NOISE_OF,
    SCENARIOS,
    pooled_windows,
    rows,  # noqa: F401  tests/unit/test_matrix.py reaches it here, as when this script held it
    summarizer,
    verdict,  # noqa: F401  the same
)

# The per-window figures that tests/unit/test_matrix.py reaches as ``mx.nn``, as when this
# script imported noisy_neighbor.py as nn.
nn = SimpleNamespace(add_ratios=add_ratios, summarize=summarize, _public=public_window)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other options go to noisy_neighbor.py (see its --help).",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--blocks", type=int, default=2, help="paired blocks per scenario")
    ap.add_argument(
        "--need", type=int, default=NEED, help=f"blocks a verdict needs (default {NEED})"
    )
    ap.add_argument(
        "--need-heavy",
        type=int,
        default=NEED_HEAVY,
        help=f"blocks a heavy or pinned verdict needs (default {NEED_HEAVY})",
    )
    ap.add_argument("--deadline", type=float, help="skip blocks that would end after this")
    ap.add_argument(
        "--pin-cpus",
        help="CPUs for the pinned window (default: what `gputunectl plan` resolves for the "
        "profile's first rule on this host)",
    )
    ap.add_argument(
        "--try-out",
        action="store_true",
        help="CPU stand-in and sub-second windows: checks the run end to end, measures nothing",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="no run: pool the blocks of earlier runs' matrix.json (each run with "
        "--keep-latencies) into one summary in --out",
    )
    mine, rest = ap.parse_known_args(argv)
    scenarios = [s.strip() for s in mine.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; use {', '.join(SCENARIOS)}")
    mine.scenarios = scenarios
    if mine.try_out:
        rest = ["--worker", "cpu", "--window", "0.6", "--warmup", "0.1", "--settle", "0.2", *rest]
    nn_args = nn_parse_args([*rest, "--out", str(mine.out), "--rounds", str(mine.blocks)])
    return mine, nn_args


def noise_kinds(scenarios: list[str]) -> list[str]:
    """The noise kinds whose blocks the scenarios need, each once, in the scenarios' order."""
    return list(dict.fromkeys(NOISE_OF.get(s, s) for s in scenarios))


def block_steps(
    kind: str, scenarios: list[str], base: list[Step], pin: frozenset[int] | None, rnd: int
) -> list[Step]:
    """The windows under ``kind``'s noise: untuned, gputuned's, pinned by hand (heavy, when the
    pinned scenario is asked for); every other block in reverse order, so that each condition
    comes as often before as after the others."""
    steps = [s for s in base if s[0] != "reverted"]
    if kind == "heavy" and "pinned" in scenarios and pin:
        steps.append(("pinned", pin))
    return steps if rnd % 2 else list(reversed(steps))


def estimate_s(args: argparse.Namespace, steps: list[Step], server_start_s: float) -> float:
    """A block's length before one was measured: two clean windows, one per step, noise and
    daemon starts (about 6 s with the captures before and after), a fresh server per
    daemon-first step."""
    per = float(args.window + args.warmup + args.settle)
    tuned = sum(1 for s in steps if s[0] == "tuned")
    fresh = sum(1 for s in steps if s[0] == "tuned" and s[2] == "daemon-first")
    return (len(steps) + 2) * per + 2.0 + 6.0 * tuned + (server_start_s + 5.0) * fresh


def schedule(
    mine: argparse.Namespace, kinds: list[str], pin: frozenset[int] | None
) -> Any:  # Callable[[ctx], Iterator[Block]]
    def blocks(ctx: dict[str, Any]) -> Iterator[Block]:
        args, result = ctx["args"], ctx["result"]
        base = default_steps(args, bool(ctx["gputuned"]))
        took: dict[str, float] = {}
        result["skipped"] = []
        for rnd in range(1, mine.blocks + 1):
            for kind in kinds if rnd % 2 else list(reversed(kinds)):
                steps = block_steps(kind, mine.scenarios, base, pin, rnd)
                need = took.get(kind) or estimate_s(args, steps, result["worker_start_s"])
                if mine.deadline and time.time() + need > mine.deadline:
                    note = (
                        f"block {rnd} {kind}: skipped, about {need:.0f} s needed and "
                        f"{max(0.0, mine.deadline - time.time()):.0f} s left before the deadline"
                    )
                    print(f"  {note}", flush=True)
                    result["skipped"].append(note)
                    continue
                t0 = time.monotonic()
                yield Block(ctx, kind, rnd, steps)
                took[kind] = time.monotonic() - t0

    return blocks


def pin_cpus(mine: argparse.Namespace, args: argparse.Namespace) -> frozenset[int] | None:
    """The CPUs the profile's first rule gives the server on this host, from `gputunectl plan`
    (a named set resolved there, or the rule's own CPU list)."""
    from gputuned.cpulist import parse_cpulist
    from gputuned.profile.load import load_profile

    if mine.pin_cpus:
        return frozenset(parse_cpulist(mine.pin_cpus))
    if "pinned" not in mine.scenarios:
        return None
    profile = args.profile[0] if args.profile else REPO / "profiles" / "shared-host.toml"
    rule = load_profile(profile).process[0]
    plan = subprocess.run(
        [sys.executable, "-m", "gputuned.cli", "plan", str(profile), "--json"],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )
    try:
        sets = json.loads(plan.stdout)["cpusets"]
    except (ValueError, KeyError) as exc:
        sys.exit(f"gputunectl plan {profile} gave no CPU sets ({exc}): {plan.stderr[-500:]}")
    cpus = sets.get(str(rule.cpus), str(rule.cpus)) if rule.cpus is not None else None
    if not cpus:
        sys.exit(f"{profile}: its first rule names no CPUs; give --pin-cpus")
    return frozenset(parse_cpulist(cpus))


# ---- the output: a markdown table and the figure -----------------------------------------------


def table(matrix_rows: list[dict[str, Any]]) -> str:
    def r(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    head = (
        "| scenario | condition | blocks | tok/s x | p50 x | p99 x | p99 pooled x | tok/s "
        "| run-queue ms/token | invol. cs / 1k tok | vol. cs / 1k tok | neighbours lose "
        "| goal (>= 0.97x, p99 <= 1.05x) |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for w in matrix_rows:
        loss = ", ".join(f"{k} {v:+.0%}" for k, v in w["neighbour_loss"].items()) or "-"
        lines.append(
            f"| {w['scenario']} | {w['condition']} | {w['blocks']} | {r(w['tok_s_x'])} "
            f"| {r(w['p50_x'])} | {r(w['p99_x'])} | {w['p99_pooled_x']:.2f} | {w['tok_s']:.1f} "
            f"| {w['runq_ms_per_token']:.3f} | {w['invol_cs_per_1k']:.1f} "
            f"| {w['vol_cs_per_1k']:.1f} | {loss} | {w['verdict']} |"
        )
    return "\n".join(lines)


def figure(matrix_rows: list[dict[str, Any]], path: Path, title: str) -> str:
    """The harness's bars (harness/plot.py), one colour per condition, scenarios along the x
    axis."""
    series: dict[str, dict[str, Any]] = {}
    for w in matrix_rows:
        m = w["runq_ms_per_token"]  # a median over blocks: no whiskers
        series.setdefault(w["condition"], {})[w["scenario"]] = {
            "tok_s_x": w["tok_s_x"],
            "p99_x": w["p99_x"],
            "runq_ms_per_token": {"median": m, "min": m, "max": m},
        }
    return plot(series, path, title, goal_p99=GOAL_P99, legend="{}")


def merge(mine: argparse.Namespace) -> int:
    """One summary over the blocks of several runs (calls of the device tool): each block's
    ratios are to its own clean windows, so blocks of different runs pool as they are."""
    windows = pooled_windows(mine.merge)
    if not windows:
        sys.exit("nothing to merge: no finished block in those files")
    summary = summarizer(mine)(windows)
    mine.out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "matrix", "merged": [str(p) for p in mine.merge], "summary": summary}
    (mine.out / "matrix-merged.json").write_text(json.dumps(doc, indent=1) + "\n")
    title = f"scenario matrix - {len(mine.merge)} runs pooled - per-block ratios to clean"
    figure(summary["rows"], mine.out / "matrix-merged.png", title)
    print(f"{title}\n{table(summary['rows'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    mine, args = parse_args(argv)
    if mine.merge:
        return merge(mine)
    kinds = noise_kinds(mine.scenarios)
    pin = pin_cpus(mine, args)
    shape = args.shape + (f", {args.order}" if args.shape == "server" else "")
    print(
        f"matrix: scenarios {', '.join(mine.scenarios)}; {mine.blocks} block(s) of noise kinds "
        f"{', '.join(kinds)}; {shape} worker; {args.window:g} s windows"
        + (f"; pinned by hand on CPUs {cpulist(sorted(pin))} at nice -10" if pin else "")
    )
    result = run(args, kinds, schedule(mine, kinds, pin), "matrix", summarizer(mine))
    result["config"].update(scenarios=mine.scenarios, blocks=mine.blocks, try_out=mine.try_out)
    (args.out / "matrix.json").write_text(json.dumps(result, indent=1) + "\n")
    matrix_rows = result["summary"].get("rows", [])
    label = "CPU STAND-IN (no GPU)" if result.get("worker") == "cpu-standin" else "GPU worker"
    title = f"scenario matrix - {label}, {shape} - per-block ratios to clean: median [min-max]" + (
        " - TRY-OUT, not a measurement" if mine.try_out else ""
    )
    how = figure(matrix_rows, args.out / "matrix.png", title) if matrix_rows else "no figure"
    print(f"\n{title}\n{table(matrix_rows)}")
    for note in result.get("skipped", []):
        print(note)
    back = [g["host_back"] for g in result.get("gputuned", [])]
    pinned = [p["put_back"] for p in result.get("pinned", [])]
    print(
        f"host back after each daemon stop: {sum(back)}/{len(back)}; pinned windows put back: "
        f"{sum(pinned)}/{len(pinned)}; {len(result['leftover_pids'])} processes left; "
        f"wrote {args.out / 'matrix.json'} and matrix.png ({how}); {result['elapsed_s']} s"
    )
    ok = result.get("ok") and not result["leftover_pids"] and all(back) and all(pinned)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
