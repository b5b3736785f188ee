"""A block: one noise kind, one round: a clean window, every step under the noise (untuned,
gputuned with each profile and start order, after the daemon reverted, pinned by hand), a clean
window again; each ratio is to the block's own clean windows. Rounds take turns."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.daemon import Gputuned, start_time, wait_placed
from harness.figures import add_ratios, percentile, window_figures
from harness.host import (
    PINNED_NICE,
    allowed_cpus,
    compare_captures,
    cpulist,
    fingerprint,
    fingerprint_diff,
    fresh_diff,
    host_capture,
    pin_by_hand,
    placement,
    put_back_by_hand,
    steal_ticks,
)
from harness.noise import Noise
from harness.worker import Worker

#: A step of a block under noise: ("noisy",), ("tuned", profile, order), ("reverted",) or
#: ("pinned", cpus) (the server pinned and reniced by hand, no gputuned: benchmarks/matrix.py).
Step = tuple[Any, ...]


def conditions(profiles: list[Path], orders: tuple[str, ...] = ("",)) -> list[str]:
    tuned = [f"tuned:{p.stem}{f':{o}' if o else ''}" for p in profiles for o in orders]
    return ["clean", "noisy", *tuned, *(["reverted"] if profiles else []), "clean-again"]


def run_orders(args: argparse.Namespace) -> tuple[str, ...]:
    """Start orders measured per profile: the server-shaped worker's, else one (registered)."""
    if args.shape != "server":
        return ("",)
    return ("server-first", "daemon-first") if args.order == "both" else (args.order,)


def default_steps(args: argparse.Namespace, gputuned: bool) -> list[Step]:
    """noisy, then every profile in every start order, then reverted (with gputuned)."""
    tuned: list[Step] = [
        ("tuned", prof, order) for prof in args.profile if gputuned for order in run_orders(args)
    ]
    return [("noisy",), *tuned, *([("reverted",)] if tuned else [])]


def rounds(
    args: argparse.Namespace, kinds: list[str]
) -> Callable[[dict[str, Any]], Iterator[Block]]:
    """``--rounds`` rounds of a block per noise kind, every other round in reverse order, so
    that the drift of a shared machine cancels over rounds."""

    def blocks(ctx: dict[str, Any]) -> Iterator[Block]:
        for rnd in range(1, args.rounds + 1):
            order = kinds if rnd % 2 else list(reversed(kinds))  # drift cancels over rounds
            for kind in order:
                yield Block(ctx, kind, rnd)

    return blocks


class Block:
    """One noise kind, one round: clean, every step once in order under the noise, clean
    again (``steps``: default_steps)."""

    def __init__(
        self, ctx: dict[str, Any], noise_kind: str, rnd: int, steps: list[Step] | None = None
    ) -> None:
        self.ctx, self.noise_kind, self.rnd = ctx, noise_kind, rnd
        self.args, self.worker = ctx["args"], ctx["worker"]
        self.steps = steps  # None: default_steps, when run
        self.windows: list[dict[str, Any]] = []
        self.noise: Noise | None = None  # running: each window also measures its work

    def run(self) -> list[dict[str, Any]]:
        args = self.args
        noise = Noise(
            self.ctx["children"], self.noise_kind, self.ctx["counts"], self.ctx["disk_dir"]
        )
        if self.steps is None:
            self.steps = default_steps(args, bool(self.ctx["gputuned"]))
        self.measure("clean")
        # A daemon-first window starts a server of its own: its start-up (model, CUDA) too.
        extra = 120 + 90 * sum(1 for s in self.steps if s[1:] and s[-1] == "daemon-first")
        noise.start(len(self.steps) * (args.window + args.warmup + args.settle) + extra)
        self.noise = noise
        try:
            for step in self.steps:
                if step[0] == "tuned":
                    self.tuned(self.ctx["gputuned"], step[1], step[2])
                elif step[0] == "pinned":
                    self.pinned(step[1])
                else:  # noisy, reverted: after a pause for the change (noise on, daemon gone)
                    time.sleep(args.settle)
                    self.measure(step[0])
        finally:
            self.noise = None
            noise.stop()
        time.sleep(args.settle)
        self.measure("clean-again")
        add_ratios(self.windows)
        return self.windows

    def pinned(self, cpus: frozenset[int]) -> None:
        """The published mitigation, by hand and without gputuned: every thread of the worker's
        processes on ``cpus`` (as ``taskset -a -p -c``) at nice -10 (``renice`` per thread);
        measured, then put back as it was and checked."""
        before = fingerprint(self.worker.pids)
        threads = pin_by_hand(self.worker.pids, cpus, PINNED_NICE)
        time.sleep(self.args.settle)
        placed = placement(self.worker.pids)
        self.measure("pinned", placement=placed)
        put_back_by_hand(before["worker_threads"])
        diff = fingerprint_diff(before, fingerprint(self.worker.pids))
        self.ctx.setdefault("result", {}).setdefault("pinned", []).append(
            {
                "round": self.rnd,
                "noise": self.noise_kind,
                "cpus": cpulist(sorted(cpus)),
                "threads_set": threads,
                "placement": placed,
                "put_back": not diff,
                "differences": diff,
            }
        )
        if diff:
            print(f"  WARNING: pinned by hand, not put back: {'; '.join(diff[:3])}")

    def measure(self, cond: str, worker: Worker | None = None, **extra: Any) -> None:
        worker = worker or self.worker
        cpus = allowed_cpus(worker.pids[-1] if self.args.shape == "server" else worker.pid)
        s0, t0 = steal_ticks(), time.monotonic()
        n0 = self.noise.work() if self.noise else {}
        res = worker.window(self.args.window, self.args.warmup)
        n1 = self.noise.work() if self.noise else {}
        s1, secs = steal_ticks(), time.monotonic() - t0
        w = {"round": self.rnd, "noise": self.noise_kind, "condition": cond}
        w.update(window_figures(res), **extra)
        if n1:  # the neighbours' work in this window, per second (warm-up included)
            w["neighbour_work_per_s"] = {p: (n1[p] - n0[p]) / secs for p in n1}
        # Time the hypervisor ran something else on this VM's CPUs (/proc/stat "steal"), in ms
        # per second per CPU: on the worker's CPUs, and on all.
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        per = {c: (s1.get(c, 0) - s0.get(c, 0)) * tick_ms / secs for c in s1}
        mine = [per[c] for c in cpus if c in per]
        w["steal_ms_per_s_worker_cpus"] = statistics.fmean(mine) if mine else float("nan")
        w["steal_ms_per_s_all_cpus"] = statistics.fmean(per.values()) if per else float("nan")
        w["_lat"] = res["lat_ms"]  # for the pooled percentiles; in the JSON with --keep-latencies
        if res.get("ttft_ms"):
            w["ttft_p50_ms"] = percentile(res["ttft_ms"], 50)
        self.windows.append(w)
        print(
            f"  round {self.rnd} {self.noise_kind:5} {cond:35} {w['tok_s']:8.1f} tok/s  p50 "
            f"{w['p50_ms']:7.3f} p99 {w['p99_ms']:7.3f} ms  runq {w['runq_ms_per_token']:.3f} "
            f"host {w['host_ms_per_token']:.3f} ms/tok  steal {w['steal_ms_per_s_worker_cpus']:.1f}"
            f"/{w['steal_ms_per_s_all_cpus']:.1f} ms/s",
            flush=True,
        )

    def tuned(self, gputuned: Gputuned, prof: Path, order: str = "") -> None:
        """One tuned window: start the daemon (and, daemon first, a server of its own after it),
        measure, stop the daemon (it reverts), check the worker and the host are as before.

        The single-process worker is registered with the daemon; the server-shaped one is
        placed by the profile's rule, its engine as the API process's child. ``capture
        --stable`` of the host before the daemon starts and after it stopped must be equal.
        """
        fresh = order == "daemon-first"
        worker = self.worker
        before_capture = host_capture()
        before = fingerprint(worker.pids)  # the untuned server: a fresh one must end like it
        took = gputuned.start(prof)
        reg: dict[str, Any] | None = None
        try:
            if fresh:
                worker = Worker(self.ctx["children"], self.args)
            elif self.args.shape != "server":
                reg = gputuned.request(
                    {
                        "cmd": "register",
                        "pid": worker.pid,
                        "start": start_time(worker.pid),
                        "rule": self.ctx["rule"][prof],
                    }
                )
            placed_s = wait_placed(worker.pids, self.ctx["wanted"].get(prof))
            time.sleep(self.args.settle)
            placed = placement(worker.pids)
            cond = f"tuned:{prof.stem}{f':{order}' if order else ''}"
            self.measure(cond, worker, placement=placed)
            stopped = gputuned.stop()
            # The long-running server (placed too, daemon first: the rule matches it) as before;
            # a fresh one as the untuned one is.
            diff = fingerprint_diff(before, fingerprint(self.worker.pids))
            if fresh:
                diff += fresh_diff(before, fingerprint(worker.pids))
        finally:
            if fresh and worker is not self.worker:
                worker.close()
        capture_diff = compare_captures(before_capture, host_capture())
        self.ctx["gputuned_runs"].append(
            {
                "round": self.rnd,
                "noise": self.noise_kind,
                "profile": str(prof),
                "order": order or "registered",
                "daemon_start_s": round(took, 3),
                "placed_after_s": placed_s,
                "registered": reg,
                "placement": placed,
                **stopped,
                "host_back": not diff and not stopped["journal_entries_left"] and not capture_diff,
                "differences": diff,
                "capture_equal": not capture_diff,
                "capture_differences": capture_diff[:20],
            }
        )
        for what, d in (("not as before the daemon", diff), ("capture differs", capture_diff)):
            if d:
                more = f" and {len(d) - 3} more" if len(d) > 3 else ""
                print(f"  WARNING: {what}: {'; '.join(d[:3])}{more}")
