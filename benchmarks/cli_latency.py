"""How long a gputunectl command takes, start to exit, beside ``python3 -c pass`` (issue 31).

    python3 benchmarks/cli_latency.py [--runs 21] [--tree h200-captured] [--json FILE]

Each command runs as a process of its own (``python3 -m gputuned.cli ...``, what the
``gputunectl`` script runs), ``--runs`` times, taking turns with the others and with
``python3 -c pass`` so that a change in the machine's load falls on all of them alike. The
commands work on a copy of a captured tree (``--root``, tests/data/hosts/TREE, with a server
process to place), where ``gputuned --root TREE --profile profiles/shared-host.toml`` runs, as
on a host where the daemon is up: ``--help``, ``list``, ``plan shared-host``, and ``status``
and ``verify`` answered by the daemon. Nothing outside the copy is touched; it is removed at
the end and the daemon stopped (SIGTERM: it reverts the copy). Run it as root (the daemon's
control socket answers root).

The commands run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` unset, one unmeasured
run first writes the ``.pyc`` files), as an installed package runs; without it every start
compiles gputuned's sources again.

It prints, per command, the median and p90 of the wall time (the goal), the median CPU time
(user + system: less moved by other processes on a shared machine), the median less
``python3 -c pass``'s, the goal and whether the median meets it; and the load average before
and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.repo import REPO

from gputuned.root import open_kernel
from gputuned.service.controlclient import daemon_running, request
from tests.unit.test_apply import tree_copy

PROFILE = REPO / "profiles" / "shared-host.toml"

#: (label, gputunectl's arguments, goal in ms); {root} is the tree's copy.
COMMANDS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("--help", ("--help",), 120.0),
    ("list", ("list", "--root", "{root}"), 120.0),
    ("status (daemon)", ("status", "--root", "{root}"), 200.0),
    ("verify (daemon)", ("verify", "--root", "{root}"), 200.0),
    ("plan shared-host", ("plan", "shared-host", "--root", "{root}"), 350.0),
)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall ms, CPU ms, exit status) of one run of ``argv``, its output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, (usage.ru_utime + usage.ru_stime) * 1000, proc.returncode


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def start_daemon(root: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "gputuned.daemon", "--root", str(root), "--profile", str(PROFILE)]
    with log.open("wb") as out:
        daemon = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    host = open_kernel(root)
    deadline = time.monotonic() + 60
    while not daemon_running(host):
        if daemon.poll() is not None or time.monotonic() > deadline:
            stop(daemon)
            sys.exit(f"gputuned did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    request(host, {"cmd": "status"}, timeout=60)  # answered after the start's apply
    return daemon


def stop(daemon: subprocess.Popen[bytes]) -> int:
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            return daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    return daemon.wait()


def measure(root: Path, runs: int, env: dict[str, str]) -> dict[str, Any]:
    jobs = [("python3 -c pass", [sys.executable, "-c", "pass"], None)]
    for label, args, goal in COMMANDS:
        argv = [sys.executable, "-m", "gputuned.cli", *(a.format(root=root) for a in args)]
        jobs.append((label, argv, goal))
    status: dict[str, int] = {}
    for label, argv, _goal in jobs:  # unmeasured: writes the .pyc files, warms the caches
        status[label] = timed(argv, env)[2]
    wall: dict[str, list[float]] = {label: [] for label, _a, _g in jobs}
    cpu: dict[str, list[float]] = {label: [] for label, _a, _g in jobs}
    for i in range(runs):
        turn = jobs[i % len(jobs) :] + jobs[: i % len(jobs)]
        for label, argv, _goal in turn:
            w, c, _rc = timed(argv, env)
            wall[label].append(w)
            cpu[label].append(c)
    base = statistics.median(wall["python3 -c pass"])
    rows = []
    for label, argv, goal in jobs:
        median = statistics.median(wall[label])
        rows.append({
            "command": label, "argv": argv[1:], "exit_status": status[label],
            "median_ms": round(median, 1), "p90_ms": round(p90(wall[label]), 1),
            "cpu_median_ms": round(statistics.median(cpu[label]), 1),
            "over_python_ms": round(median - base, 1), "goal_ms": goal,
            "met": None if goal is None else median <= goal,
        })  # fmt: skip
    return {"runs": runs, "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| command | median ms | p90 ms | CPU ms (median) | over `python3 -c pass` | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        goal = "" if r["goal_ms"] is None else f"≤ {r['goal_ms']:g}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "no")
        lines.append(
            f"| `{r['command']}` | {r['median_ms']:.0f} | {r['p90_ms']:.0f} | "
            f"{r['cpu_median_ms']:.0f} | {r['over_python_ms']:+.0f} | {goal} | {met} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=21, help="measured runs per command")
    p.add_argument("--tree", default="h200-captured", help="a tree of tests/data/hosts/")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the daemon's control socket answers root")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    work = Path(tempfile.mkdtemp(prefix="gputuned-cli-latency-"))
    try:
        root = tree_copy(args.tree, work)
        load_before = os.getloadavg()
        daemon = start_daemon(root, env, work / "daemon.log")
        try:
            result = measure(root, args.runs, env)
        finally:
            daemon_exit = stop(daemon)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(
        tree=args.tree, cpus=os.cpu_count(), python=sys.version.split()[0],
        load_before=[round(x, 2) for x in load_before],
        load_after=[round(x, 2) for x in load_after], daemon_exit=daemon_exit,
    )  # fmt: skip
    print(f"gputunectl on a copy of {args.tree}, gputuned running on it; {args.runs} runs each")
    print(table(result))
    print(
        f"{result['cpus']} CPUs, Python {result['python']}; load average (1, 5, 15 min) "
        f"{result['load_before']} before, {result['load_after']} after; daemon exit "
        f"{daemon_exit}; exit status of each command: "
        + ", ".join(f"{r['command']} {r['exit_status']}" for r in result["rows"])
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
