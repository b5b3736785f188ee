#!/usr/bin/env python3
"""Why does a placed worker still lose throughput under noise? Compare placements directly.

The noisy-neighbour benchmark (noisy_neighbor.py) compares whole profiles through the daemon.
This script varies one thing at a time around shared-host.toml's partition, in one interleaved
run, with the same worker, noise and figures (benchmarks/harness/, as noisy_neighbor.py):

    clean             nothing running beside the worker
    noisy             noise on, nothing done
    nice              every worker thread at nice -10, no CPU placement (set here, then undone)
    <profile stem>    `gputunectl apply` of each --profile (its partition, nice, IRQs), the
                      worker matched by a copy of the profile's first rule; reverted after
    <stem>+poll       (--halt-test) ... and the profile's CPUs limited to polling idle (their
                      power/pm_qos_resume_latency_us = "n/a": no halt, so no exit to the
                      hypervisor while idle); only where a cpuidle driver is loaded
    <stem>+keep       (--halt-test) ... and, instead, a SCHED_IDLE busy loop on each of the
                      worker's CPUs, which any other thread preempts at once: another way to keep
                      a virtual CPU from halting
    clean-again       noise off, everything reverted

Per window, besides noisy_neighbor's figures: host ms per token (the CPU-bound launch part)
and steal time on the worker's CPUs. Root only; everything set here is put back, and checked.

    python3 benchmarks/placement_variants.py --out DIR [--noise heavy,cpu] [--rounds 2] \
        [--profile P ...] [--halt-test]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.block import Block
from harness.children import Children
from harness.daemon import check_untuned, isolated_profile
from harness.figures import add_ratios
from harness.host import allowed_cpus, fingerprint, fingerprint_diff
from harness.noise import Noise, default_noise_counts
from harness.options import parse_args
from harness.repo import REPO
from harness.worker import Worker

WORKER_RE = r"noisy_neighbor\.py --role worker"
KEEPER = (
    "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"
)


def gputunectl(*argv: str) -> None:
    cmd = [sys.executable, "-m", "gputuned.cli", *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr or r.stdout}")


def threads(pid: int) -> list[int]:
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    return [t.tid for t in read_process(LiveKernel(), pid).threads]


def cgroup_of(pid: int) -> str:
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    return read_process(LiveKernel(), pid, threads=False).cgroup


class Variants:
    def __init__(self, args: argparse.Namespace, worker: Worker, children: Children):
        self.args, self.worker, self.children = args, worker, children
        self.ctx = {"args": args, "worker": worker}
        work = Path(tempfile.mkdtemp(prefix="variants-"))
        self.profiles = [isolated_profile(Path(p), work, cmdline=WORKER_RE) for p in args.profile]
        # isolated_profile names its output after the input: keep the names apart.
        assert len({p.name for p in self.profiles}) == len(self.profiles), "profile names repeat"

    def n_windows(self) -> int:
        return 3 + len(self.profiles) * (2 if self.args.halt_test else 1)

    def block(self, kind: str, rnd: int, counts: dict[str, int], disk_dir: str) -> list[Any]:
        b = Block(self.ctx, kind, rnd)
        settle = self.args.settle
        b.measure("clean")
        noise = Noise(self.children, kind, counts, disk_dir)
        noise.start(self.n_windows() * (self.args.window + self.args.warmup + settle + 2) + 60)
        b.noise = noise
        try:
            time.sleep(settle)
            b.measure("noisy")
            self.nice(b)
            for prof in self.profiles:
                gputunectl("apply", str(prof))
                try:
                    time.sleep(settle)
                    b.measure(prof.stem)
                    if self.args.halt_test:
                        self.poll(b, prof.stem)
                        self.keep(b, prof.stem)
                finally:
                    gputunectl("revert")
        finally:
            b.noise = None
            noise.stop()
        time.sleep(settle)
        b.measure("clean-again")
        add_ratios(b.windows)
        return b.windows

    def nice(self, b: Block) -> None:
        pid = self.worker.pid
        old = {t: os.getpriority(os.PRIO_PROCESS, t) for t in threads(pid)}
        try:
            for t in old:
                os.setpriority(os.PRIO_PROCESS, t, -10)
            time.sleep(self.args.settle)
            b.measure("nice")
        finally:
            for t, n in old.items():
                with contextlib.suppress(ProcessLookupError):
                    os.setpriority(os.PRIO_PROCESS, t, n)

    def poll(self, b: Block, name: str) -> None:
        cpus = allowed_cpus(self.worker.pid)
        files = [
            Path(f"/sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us") for c in cpus
        ]
        old = {f: f.read_text().strip() for f in files if f.exists()}
        driver = Path("/sys/devices/system/cpu/cpuidle/current_driver")
        if not old or not driver.exists() or driver.read_text().strip() == "none":
            # Without a cpuidle driver the idle loop always halts; the limit changes nothing.
            print("  (no cpuidle driver or PM QoS file here: +poll not measured)")
            return
        try:
            for f in old:
                f.write_text("n/a")
            time.sleep(self.args.settle)
            b.measure(f"{name}+poll", idle_limit={str(f): "n/a" for f in old})
        finally:
            for f, v in old.items():
                f.write_text(v)

    def keep(self, b: Block, name: str) -> None:
        pid = self.worker.pid
        cg = cgroup_of(pid)
        procs = []
        try:
            for cpu in allowed_cpus(pid):
                p = self.children.start([sys.executable, "-c", KEEPER])
                procs.append(p)
                Path(f"/sys/fs/cgroup{cg}/cgroup.procs").write_text(str(p.pid))
                os.sched_setaffinity(p.pid, {cpu})
            time.sleep(self.args.settle)
            b.measure(f"{name}+keep")
        finally:
            for p in procs:
                self.children.stop(p, wait=2.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--noise", default="heavy,cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument(
        "--profile",
        action="append",
        help="a profile to compare (more than once for several; default shared-host.toml)",
    )
    ap.add_argument(
        "--halt-test",
        action="store_true",
        help="after each profile also measure it with its CPUs kept from halting",
    )
    ap.add_argument("--worker", choices=("auto", "gpu", "cpu"), default="auto")
    args = ap.parse_args()
    args.profile = args.profile or [str(REPO / "profiles/shared-host.toml")]
    if os.geteuid() != 0:
        print("placement_variants.py: needs root (it applies a profile)", file=sys.stderr)
        return 2
    from gputuned.kernel.live import LiveKernel

    check_untuned(LiveKernel())
    args.out.mkdir(parents=True, exist_ok=True)
    counts = default_noise_counts()
    disk_dir = tempfile.mkdtemp(prefix="variants-disk-", dir="/var/tmp")
    children = Children()
    windows: list[dict[str, Any]] = []
    try:
        opts = parse_args(["--role", "worker", "--worker", args.worker, "--token-ms", "2.0"])
        worker = Worker(children, opts)
        print(f"worker: {worker.info.get('desc')}", flush=True)
        before = fingerprint(worker.pid)
        v = Variants(args, worker, children)
        kinds = args.noise.split(",")
        for rnd in range(1, args.rounds + 1):
            for kind in kinds if rnd % 2 else kinds[::-1]:
                windows += v.block(kind, rnd, counts, disk_dir)
        diff = fingerprint_diff(before, fingerprint(worker.pid))
        worker.close()
    finally:
        children.stop_all()
    summary: dict[str, dict[str, Any]] = {}
    for w in windows:
        s = summary.setdefault(f"{w['noise']} {w['condition']}", {})
        for k in ("tok_s_x", "p50_x", "p99_x", "host_ms_per_token", "runq_ms_per_token",
                  "steal_ms_per_s_worker_cpus", "steal_ms_per_s_all_cpus"):  # fmt: skip
            s.setdefault(k, []).append(w[k])
    print(f"\n{'noise condition':28} tok/s x  p50 x  p99 x  host ms  runq ms  steal mine/all ms/s")
    for name, s in summary.items():
        med = {k: statistics.median(v) for k, v in s.items()}
        print(
            f"{name:28} {med['tok_s_x']:6.2f} {med['p50_x']:6.2f} {med['p99_x']:6.2f} "
            f"{med['host_ms_per_token']:8.3f} {med['runq_ms_per_token']:8.3f} "
            f"{med['steal_ms_per_s_worker_cpus']:8.1f}/{med['steal_ms_per_s_all_cpus']:.1f}"
        )
    print(f"worker as before: {not diff} {diff}; leftover pids: {children.alive()}")
    out = {
        "worker": worker.info,
        "windows": [{k: v for k, v in w.items() if k != "_lat"} for w in windows],
        "worker_back": not diff,
        "differences": diff,
        "leftover_pids": children.alive(),
    }
    (args.out / "placement_variants.json").write_text(json.dumps(out, indent=1))
    return 0 if not diff else 1


if __name__ == "__main__":
    sys.exit(main())
