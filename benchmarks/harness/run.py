"""A run: start the worker, run every block a schedule yields, stop everything it started,
write ``DIR/NAME.json`` (noisy_neighbor.py's rounds, matrix.py's paired blocks)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.block import Block, conditions, run_orders
from harness.children import Children, running
from harness.daemon import Gputuned, isolated_profile
from harness.figures import public_window, summarize
from harness.host import fs_type
from harness.noise import NOISE_PARTS, noise_counts
from harness.worker import API_MATCH, Worker


def plan_seconds(args: argparse.Namespace, kinds: list[str]) -> float:
    per_window = args.window + args.warmup + args.settle
    orders = run_orders(args)
    windows = len(conditions(args.profile, orders))
    starts = 6.0 * len(args.profile) * len(orders) + 2.0
    return args.rounds * len(kinds) * (windows * per_window + starts)


def _terminated(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
    print("noisy_neighbor: SIGTERM: stopping everything it started", file=sys.stderr)
    sys.exit(143)


def run(
    args: argparse.Namespace,
    kinds: list[str],
    schedule: Callable[[dict[str, Any]], Iterator[Block]],
    name: str = "noisy_neighbor",
    summarizer: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Start the worker, run every block ``schedule`` yields, stop everything; write and return
    the result (``DIR/NAME.json``). benchmarks/matrix.py runs its own schedule through this."""
    signal.signal(signal.SIGTERM, _terminated)  # run the finally blocks
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    children = Children()
    disk_dir = tempfile.mkdtemp(prefix="noisy-disk-", dir=args.disk_dir)
    result: dict[str, Any] = {"benchmark": name, "command": sys.argv, "ok": False}
    windows: list[dict[str, Any]] = []  # of whole blocks only
    try:
        ctx = setup(args, children, disk_dir, kinds, result)
        ctx["result"] = result
        for block in schedule(ctx):
            windows += block.run()
        ctx["worker"].close()
        result["ok"] = True
    finally:
        children.stop_all()
        shutil.rmtree(disk_dir, ignore_errors=True)
        # An interrupted run still leaves the figures of the blocks it finished.
        result["summary"] = (summarizer or summarize)(windows) if windows else {}
        result["windows"] = [public_window(w, args.keep_latencies) for w in windows]
        result["started_pids"] = children.started
        result["leftover_pids"] = children.alive() + [
            p for p in result.get("worker_pids", []) if p not in children.started and running(p)
        ]
        result["elapsed_s"] = round(time.monotonic() - t_start, 1)
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def setup(
    args: argparse.Namespace,
    children: Children,
    disk_dir: str,
    kinds: list[str],
    result: dict[str, Any],
) -> dict[str, Any]:
    from gputuned.profile.load import load_profile

    counts = noise_counts(args)
    rules = {}
    for p in args.profile:
        prof = load_profile(p)
        if not prof.process:
            sys.exit(f"{p} has no [[process]] rule to register the worker by")
        rules[p] = args.rule or prof.process[0].name
    if args.shape == "server":
        # Copies whose rule matches this benchmark's API process (by command line and this
        # account) and nothing else; what the rule does is the profile's own, children too.
        rules = {
            isolated_profile(
                p, Path(tempfile.mkdtemp(prefix="nn-profile-")), API_MATCH, rule_name=r
            ): r
            for p, r in rules.items()
        }
        args.profile = list(rules)
    elif args.register_only:  # copies whose rules match nothing: only the worker is placed
        rules = {
            isolated_profile(p, Path(tempfile.mkdtemp(prefix="nn-profile-")), rule_name=r): r
            for p, r in rules.items()
        }
        args.profile = list(rules)
    wanted = {p: next(r.nice for r in load_profile(p).process if r.name == rules[p]) for p in rules}
    gputuned = None
    if args.profile:
        log = (args.out / "daemon.log").open("wb")
        gputuned = Gputuned(children, log)
    print(
        f"planned: about {plan_seconds(args, kinds) / 60:.1f} min of windows; starting the worker"
    )
    t0 = time.monotonic()
    worker = Worker(children, args)
    info = {k: v for k, v in worker.info.items() if k != "ready"}
    args.cpu_steps, args.api_chars = info.get("steps"), info.get("prompt_chars")
    print(f"worker: {info['worker']}: {info['desc']} (ready in {time.monotonic() - t0:.1f} s)")
    if info.get("note"):
        print(f"worker: {info['note']}")
    result.update(
        worker=info["worker"],
        worker_info=info,
        worker_start_s=round(time.monotonic() - t0, 1),
        worker_pids=worker.pids,
        host={
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "disk_dir": disk_dir,
            "disk_dir_fs": fs_type(disk_dir),
        },
        config={
            "rounds": args.rounds,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "settle_s": args.settle,
            "noise": kinds,
            "noise_processes": {k: {p: counts[p] for p in NOISE_PARTS[k]} for k in kinds},
            "profiles": [str(p) for p in args.profile],
            "conditions": conditions(args.profile, run_orders(args)),
            "shape": args.shape,
            "orders": list(run_orders(args)),
        },
        gputuned=[],
    )
    return {
        "args": args,
        "worker": worker,
        "children": children,
        "counts": counts,
        "disk_dir": disk_dir,
        "rule": rules,
        "wanted": wanted,
        "gputuned": gputuned,
        "gputuned_runs": result["gputuned"],
    }
