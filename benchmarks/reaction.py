"""Reaction and overhead of the daemon: exec -> placed latency, idle CPU, apply and revert.

    python3 benchmarks/reaction.py [--profile profiles/shared-host.toml] [--starts 200]
        [--idle-seconds 60] [--apply-rounds 20] [--json FILE]

Run as root on a host where no profile is applied and no daemon runs; everything is put back.

1. Apply and revert of the full profile, ``--apply-rounds`` times, by benchmarks/apply_revert.py
   (one-shot, no daemon). Goal: <= 50 ms each.
2. ``gputuned --profile PROFILE`` is started; once it is up, its CPU time is read from
   /proc/PID/stat (utime + stime, clock ticks) and from its threads' schedstat (nanoseconds)
   before and after ``--idle-seconds`` of doing nothing. Goal: <= 0.1 % of one CPU.
3. ``--starts`` times: a Python process whose command line the rule matches is started
   (``python3 -S DIR/gputuned-reaction-probe.py``, matched by a copy of the profile's first rule
   that matches nothing else, so that other people's processes are left alone; with
   ``--profile-rules``, ``DIR/vllm-probe.py`` matched by the profile's own rules), and /proc of
   the new process is polled every 0.5 ms until its cgroup, nice level and the affinity of every
   thread are what the rule asks for. The time runs from just before ``Popen`` (fork and exec
   included, so it is an upper bound; also reported from Popen's return) to the first poll that
   sees it placed. The probe also reports what it saw of itself at its first line of Python,
   and starts two threads, which must end up placed too.
   Goal: p99 <= 20 ms.
4. The daemon is stopped (SIGTERM: it reverts) and the host compared with before.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import trace
from harness.children import Children
from harness.daemon import Gputuned, isolated_profile
from harness.figures import percentile
from harness.host import fingerprint, fingerprint_diff, fs_type
from harness.noise import NOISE_PARTS, Noise, add_noise_args, noise_counts
from harness.repo import REPO

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.live import LiveKernel
from gputuned.kernel.proc import ProcInfo, read_process
from gputuned.kernel.sampling import clock_ticks, sample_process
from gputuned.profile.load import load_profile
from gputuned.profile.model import Profile

PROBE_NAME = "gputuned-reaction-probe.py"
PROBE = """\
import os, sys, threading, time
t = time.monotonic()
nice = os.getpriority(os.PRIO_PROCESS, 0)
cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
with open("/proc/self/cgroup") as f:
    cg = [ln[3:].strip() for ln in f if ln.startswith("0::")]
for _ in range(2):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
sys.stdout.write(f"{t} {nice} {cpus} {cg[0] if cg else '-'}\\n")
sys.stdout.flush()
time.sleep(60)
"""


@dataclass(frozen=True)
class Wanted:
    nice: int | None
    cpus: frozenset[int] | None
    cgroup: str | None

    def holds(self, p: ProcInfo) -> bool:
        return (
            (self.nice is None or all(t.nice == self.nice for t in p.threads))
            and (self.cpus is None or all(t.affinity <= self.cpus for t in p.threads))
            and (self.cgroup is None or p.cgroup == self.cgroup)
        )


def wanted_placement(profile: Profile, argv: list[str]) -> tuple[str, Wanted]:
    """The rule that matches the probe, and what it makes of a process (as the daemon plans)."""
    from gputuned.engine.plan import read_context
    from gputuned.tuners.procmatch import matches

    me = os.geteuid()
    fake = ProcInfo(0, 0, Path(argv[0]).name[:15], argv[0], " ".join(argv), "", (), uid=me, euid=me)
    uids = {
        r.match.user: LiveKernel().user_id(r.match.user) for r in profile.process if r.match.user
    }
    rule = next(
        (
            r
            for r in profile.process
            if matches(r.match, fake, {}, uid=uids.get(r.match.user or ""))
        ),
        None,
    )
    if rule is None:
        sys.exit(f"no [[process]] rule of {profile.name} matches the probe {' '.join(argv)}")
    ctx = read_context(LiveKernel(), profile)
    cs = profile.cpuset
    moves = rule.move_to_partition and cs is not None and cs.mode in ("root", "isolated")
    return rule.name, Wanted(
        rule.nice,
        ctx.sets.sets[rule.cpus] if rule.cpus != "keep" else None,
        "/" + cs.cgroup if moves and cs is not None and ctx.cgroup.partitions_possible else None,
    )


def apply_revert(profile: Path, rounds: int, out: Path) -> dict[str, Any]:
    path = out / "apply_revert.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "apply_revert.py"), str(profile)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    subprocess.run([*argv, "--rounds", str(rounds), "--json", str(path)], check=True, env=env)
    return dict(json.loads(path.read_text()))


def set_policy(pid: int, spec: str, nice: int) -> None:
    """--daemon-policy on every thread of ``pid``: an experiment from outside, as chrt(1)."""
    kind, _, value = spec.partition(":")
    if kind.endswith("-root"):
        # The kernel refuses a real-time policy in a cgroup whose cpu controller has no RT
        # budget (CONFIG_RT_GROUP_SCHED; docs/profiles.md): to see what the class would give
        # where it is allowed, the daemon is moved to the cgroup v2 root first. Not a way to run
        # it: under systemd it belongs in its unit's cgroup.
        kind = kind.removesuffix("-root")
        v2 = [
            ln.split()[1]
            for ln in Path("/proc/mounts").read_text().splitlines()
            if " cgroup2 " in ln
        ]
        if v2:
            Path(v2[0], "cgroup.procs").write_text(f"{pid}\n")
    for task in Path(f"/proc/{pid}/task").iterdir():
        tid = int(task.name)
        if kind in ("fifo", "rr"):
            pol = os.SCHED_FIFO if kind == "fifo" else os.SCHED_RR
            os.sched_setscheduler(tid, pol, os.sched_param(int(value)))
        elif kind == "slice":
            sched_setattr_slice(tid, int(value) * 1000, nice)
        else:
            sys.exit(
                f"--daemon-policy {spec}: use fifo:PRIO, rr:PRIO, fifo-root:PRIO, "
                "rr-root:PRIO or slice:MICROSECONDS"
            )


def sched_setattr_slice(tid: int, slice_ns: int, nice: int) -> None:
    """SCHED_OTHER at ``nice`` with an EEVDF request (slice) of ``slice_ns``: struct sched_attr
    (include/uapi/linux/sched/types.h, SCHED_ATTR_SIZE_VER0), sched_runtime taken as the slice
    for fair tasks since Linux 6.12 (clamped to 0.1-100 ms, kernel/sched/syscalls.c)."""
    import ctypes
    import platform
    import struct

    nr = {"x86_64": 314, "aarch64": 274}[platform.machine()]
    attr = struct.pack("=IIQiIQQQ", 48, 0, 0, nice, 0, slice_ns, 0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, len(attr))
    if libc.syscall(nr, tid, buf, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_setattr({tid}): {os.strerror(err)}")


def idle_cpu(pid: int, seconds: float) -> dict[str, Any]:
    host = LiveKernel()
    forks0 = _forks(host)
    a, t0 = sample_process(host, pid), time.monotonic()
    time.sleep(seconds)
    b, t1 = sample_process(host, pid), time.monotonic()
    forks = _forks(host) - forks0
    wall = t1 - t0
    ticks = (b.cpu_ticks - a.cpu_ticks) / clock_ticks()
    run_ns = sum(t.run_ns or 0 for t in b.threads) - sum(t.run_ns or 0 for t in a.threads)
    return {
        "seconds": round(wall, 2),
        "utime_stime_s": ticks,
        "percent_of_one_cpu_stat": round(100 * ticks / wall, 4),
        "schedstat_cpu_ms": round(run_ns / 1e6, 2),
        "percent_of_one_cpu_schedstat": round(100 * run_ns / 1e9 / wall, 4),
        # Every fork and exec on the host is an event the daemon reads: say how busy it was.
        "forks_on_host": forks,
    }


def _forks(host: Kernel) -> int:
    """Processes and threads created since boot (the ``processes`` line of /proc/stat)."""
    for line in host.read_text("/proc/stat").splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def one_start(children: Children, argv: list[str], want: Wanted) -> dict[str, Any]:
    host = LiveKernel()
    t0_ns = time.monotonic_ns()
    t0 = t0_ns / 1e9
    proc = children.start(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    t_exec = time.monotonic()
    placed_at = None
    polls = 0
    try:
        while time.monotonic() - t0 < 2.0:
            polls += 1
            try:
                if want.holds(read_process(host, proc.pid)):
                    placed_at = time.monotonic()
                    break
            except errors.GputunedError:  # a thread exited mid-read, or /proc raced: poll again
                pass
            # Not a busy loop: on a small machine the poller would take the CPU the daemon and
            # the probe need. 0.5 ms is fine-grained enough for a 20 ms goal.
            time.sleep(0.0005)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()  # the probe's view of its first line
        final = read_process(host, proc.pid)
    finally:
        children.stop(proc, sig=signal.SIGKILL)
    t_first = float(line[0]) if line else None
    return {
        "pid": proc.pid,
        # CLOCK_MONOTONIC ns, the daemon's trace clock: which of its placements were this one's.
        "t0_ns": t0_ns,
        "stopped_ns": time.monotonic_ns(),
        "ms": None if placed_at is None else (placed_at - t0) * 1e3,
        # From Popen's return (the exec has happened by then); 0 if placed before it returned.
        "after_exec_ms": None if placed_at is None else max(0.0, placed_at - t_exec) * 1e3,
        "popen_ms": (t_exec - t0) * 1e3,
        "polls": polls,
        "python_first_line_ms": None if t_first is None else (t_first - t0) * 1e3,
        "placed_at_first_line": bool(line) and _seen_placed(line, want),
        "threads": len(final.threads),
        "all_threads_placed": want.holds(final),
    }


def _seen_placed(line: list[str], want: Wanted) -> bool:
    _, nice, cpus, cg = line
    return (
        (want.nice is None or int(nice) == want.nice)
        and (want.cpus is None or {int(c) for c in cpus.split(",")} <= want.cpus)
        and (want.cgroup is None or cg == want.cgroup)
    )


def starts(children: Children, probe: Path, n: int, want: Wanted) -> list[dict[str, Any]]:
    argv = [sys.executable, "-S", str(probe)]
    runs = []
    for _ in range(n):
        runs.append(one_start(children, argv, want))
        time.sleep(0.05)  # the exit is an event too: let the daemon forget it first
    return runs


def summarize_starts(runs: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(runs)
    ms = [r["ms"] for r in runs if r["ms"] is not None]
    firsts = [r["python_first_line_ms"] for r in runs if r["python_first_line_ms"] is not None]
    return {
        "starts": n,
        "placed": len(ms),
        "not_placed_within_2s": n - len(ms),
        "ms": quantiles(ms),
        "after_exec_ms": {
            q: round(percentile([r["after_exec_ms"] for r in runs if r["ms"] is not None], n), 3)
            for q, n in (("p50", 50), ("p99", 99))
        },
        "popen_ms_p50": round(percentile([r["popen_ms"] for r in runs], 50), 3),
        "python_first_line_ms_p50": round(percentile(firsts, 50), 3),
        "placed_before_first_python_line": sum(r["placed_at_first_line"] for r in runs),
        "all_threads_placed": sum(r["all_threads_placed"] for r in runs),
        "runs": runs,
    }


def quantiles(xs: list[float]) -> dict[str, float | None]:
    return {
        "p50": round(percentile(xs, 50), 3),
        "p90": round(percentile(xs, 90), 3),
        "p99": round(percentile(xs, 99), 3),
        "max": round(max(xs), 3) if xs else None,
        "mean": round(statistics.fmean(xs), 3) if xs else None,
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, default=REPO / "profiles" / "shared-host.toml")
    ap.add_argument("--starts", type=int, default=200)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--apply-rounds", type=int, default=20)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument(
        "--daemon-nice",
        type=int,
        default=0,
        help="renice the daemon's threads to this after start (as systemd's Nice= would)",
    )
    ap.add_argument(
        "--daemon-policy",
        help="also give the daemon's threads this scheduling class after start: fifo:PRIO, "
        "rr:PRIO (fifo-root:PRIO, rr-root:PRIO: moved to the cgroup v2 root first, where the "
        "kernel allows real time), or slice:MICROSECONDS (SCHED_OTHER with a shorter EEVDF "
        "request, Linux 6.12+)",
    )
    ap.add_argument(
        "--daemon-tree",
        type=Path,
        help="run the daemon from the gputuned package in this folder (a copy of another "
        "version, to compare) instead of this checkout's",
    )
    ap.add_argument(
        "--profile-rules",
        action="store_true",
        help="match the probe by the profile's own rules (it is named vllm-probe.py) instead "
        "of a copy of its first rule that matches nothing but the probe",
    )
    ap.add_argument(
        "--noise",
        default="none",
        help="noise while the starts run, comma-separated: none, cpu, net, disk, heavy (the "
        "generators of noisy_neighbor.py); --starts starts under each",
    )
    ap.add_argument(
        "--blocks",
        type=int,
        default=2,
        help="with several --noise kinds: each kind's starts in this many blocks, the kinds "
        "taking turns, so that a drifting host weighs on all alike",
    )
    ap.add_argument("--settle", type=float, default=1.0, help="seconds after noise starts")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="run the daemon through benchmarks/daemon_trace.py and say where each start's "
        "time went (fork+exec, event receipt, the daemon's wakeup, each step of a placement)",
    )
    add_noise_args(ap)
    args = ap.parse_args()
    args.kinds = [k.strip() for k in args.noise.split(",") if k.strip()]
    bad = [k for k in args.kinds if k != "none" and k not in NOISE_PARTS]
    if bad or not args.kinds:
        ap.error(f"--noise: unknown kind(s) {bad}; use {', '.join(NOISE_PARTS)}")
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="reaction-"))
    result: dict[str, Any] = {"benchmark": "reaction", "profile": str(args.profile)}
    if not args.profile_rules:
        args.profile = isolated_profile(args.profile, work, rf"/{PROBE_NAME}\b")
    result["probe_matched_by"] = "profile's rules" if args.profile_rules else "copy of rule 1"
    # The shipped rule matches a vLLM-like command line, as it would the real server's.
    probe = work / ("vllm-probe.py" if args.profile_rules else PROBE_NAME)
    probe.write_text(PROBE)
    disk_dir = tempfile.mkdtemp(prefix="reaction-disk-", dir=args.disk_dir)
    try:
        with (work / "daemon.log").open("wb") as log:
            measure(args, probe, log, result, disk_dir)
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)
    result["daemon_log"] = str(work / "daemon.log")
    if args.breakdown:
        trace_file = work / "trace.jsonl"
        result["trace"] = str(trace_file)
        records = trace.load(trace_file)
        for ex in result["exec_to_placed"].values():
            ex["breakdown"] = trace.breakdown(ex["runs"], records)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not result["leftover_pids"] and not result["host_differences"] else 1


def measure(
    args: argparse.Namespace, probe: Path, log: Any, result: dict[str, Any], disk_dir: str
) -> None:
    children = Children()
    daemon = Gputuned(children, log)  # checks: root, no daemon, nothing applied
    daemon.launcher = [sys.executable, str(REPO / "benchmarks" / "daemon_trace.py")]
    if args.breakdown:
        daemon.launcher += ["--trace", str(probe.parent / "trace.jsonl")]
    if args.daemon_tree:
        daemon.launcher += ["--tree", str(args.daemon_tree)]
    result["daemon_tree"] = str(args.daemon_tree or REPO)
    before = fingerprint(os.getpid())
    counts = noise_counts(args)
    result["noise"] = {
        "kinds": args.kinds,
        "processes": {k: {p: counts[p] for p in NOISE_PARTS.get(k, ())} for k in args.kinds},
        "disk_dir_fs": fs_type(disk_dir),
        "journal_fs": fs_type("/run/gputuned"),
        "cpus": os.cpu_count(),
    }
    try:
        if args.apply_rounds:
            result["apply_revert"] = apply_revert(args.profile, args.apply_rounds, probe.parent)
        result["daemon_start_s"] = round(daemon.start(args.profile), 3)
        assert daemon.proc is not None
        if args.daemon_nice:
            for task in Path(f"/proc/{daemon.proc.pid}/task").iterdir():
                os.setpriority(os.PRIO_PROCESS, int(task.name), args.daemon_nice)
        result["daemon_nice"] = args.daemon_nice
        result["daemon_policy"] = args.daemon_policy
        if args.daemon_policy:
            try:
                set_policy(daemon.proc.pid, args.daemon_policy, args.daemon_nice)
            except OSError as exc:  # e.g. EPERM: a cgroup without an RT budget
                print(f"--daemon-policy {args.daemon_policy} refused: {exc}; measured without")
                result["daemon_policy"] = f"refused: {exc}"
        argv = [sys.executable, "-S", str(probe)]
        result["rule"], want = wanted_placement(load_profile(args.profile), argv)
        cpus = sorted(want.cpus) if want.cpus is not None else None
        result["wanted"] = {"nice": want.nice, "cpus": cpus, "cgroup": want.cgroup}
        time.sleep(3.0)  # the start-up apply and verify are done
        if args.idle_seconds:
            result["idle"] = idle_cpu(daemon.proc.pid, args.idle_seconds)
        runs = noisy_starts(args, children, probe, want, counts, disk_dir)
        result["exec_to_placed"] = {k: summarize_starts(v) for k, v in runs.items()}
        result["status"] = daemon.request({"cmd": "status"})["daemon"]
    finally:
        if daemon.proc is not None:
            result["stop"] = daemon.stop()
        children.stop_all()
        result["leftover_pids"] = children.alive()
    result["host_differences"] = fingerprint_diff(before, fingerprint(os.getpid()))


def noisy_starts(
    args: argparse.Namespace,
    children: Children,
    probe: Path,
    want: Wanted,
    counts: dict[str, int],
    disk_dir: str,
) -> dict[str, list[dict[str, Any]]]:
    """``--starts`` starts under each noise kind, in ``--blocks`` blocks taking turns."""
    blocks = max(1, args.blocks) if len(args.kinds) > 1 else 1
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in args.kinds}
    for b in range(blocks):
        for kind in args.kinds if b % 2 == 0 else args.kinds[::-1]:
            n = args.starts * (b + 1) // blocks - args.starts * b // blocks
            noise = Noise(children, kind, counts, disk_dir) if kind != "none" else None
            if noise is not None:
                noise.start(60 + 3.0 * n)  # bounded even if this process is killed
                time.sleep(args.settle)
            try:
                print(f"{n} starts, noise {kind}", flush=True)
                runs[kind] += starts(children, probe, n, want)
            finally:
                if noise is not None:
                    noise.stop()
            time.sleep(args.settle)
    return runs


def report(r: dict[str, Any]) -> None:
    if "apply_revert" in r:
        ar = r["apply_revert"]
        print(
            f"apply/revert ({ar['rounds']} rounds, {ar['writes_per_apply']:.0f} writes): apply "
            f"median {ar['apply']['median_ms']} ms (max {ar['apply']['max_ms']}), revert median "
            f"{ar['revert']['median_ms']} ms (max {ar['revert']['max_ms']}); goal <= 50 ms"
        )
    if "idle" in r:
        idle = r["idle"]
        print(
            f"idle daemon over {idle['seconds']} s: {idle['percent_of_one_cpu_stat']} % of one "
            f"CPU (utime+stime), {idle['percent_of_one_cpu_schedstat']} % (schedstat, "
            f"{idle['schedstat_cpu_ms']} ms; {idle['forks_on_host']} forks on the host "
            "meanwhile); goal <= 0.1 %"
        )
    w = r["wanted"]
    print(
        f"exec -> placed (daemon nice {r['daemon_nice']}, policy {r['daemon_policy'] or 'other'}"
        f", gputuned from {r['daemon_tree']}; {r['rule']}: nice {w['nice']}, cpus "
        f"{w['cpus']}, cgroup {w['cgroup']}); journal on {r['noise']['journal_fs']}, disk "
        f"noise on {r['noise']['disk_dir_fs']}; goal p99 <= 20 ms"
    )
    for kind, ex in r["exec_to_placed"].items():
        ms = ex["ms"]
        print(
            f" noise {kind} {r['noise']['processes'][kind]}: {ex['starts']} starts: p50 "
            f"{ms['p50']} ms, p90 {ms['p90']}, p99 {ms['p99']}, max {ms['max']}; "
            f"{ex['not_placed_within_2s']} not placed in 2 s"
        )
        print(
            f"  placed before the probe's first Python line: "
            f"{ex['placed_before_first_python_line']}/{ex['starts']} (first line at p50 "
            f"{ex['python_first_line_ms_p50']} ms); all threads placed: "
            f"{ex['all_threads_placed']}/{ex['starts']}; fork+exec (Popen) p50 "
            f"{ex['popen_ms_p50']} ms; counted from Popen's return instead: p50 "
            f"{ex['after_exec_ms']['p50']} ms, p99 {ex['after_exec_ms']['p99']} ms"
        )
        if "breakdown" in ex:
            print("\n".join(trace.show(ex["breakdown"])))
    print(
        f"daemon stop: exit {r['stop']['exit_status']}, journal entries left "
        f"{r['stop']['journal_entries_left']}; processes left: {len(r['leftover_pids'])}; "
        f"host as before: {not r['host_differences'] or r['host_differences']}"
    )


if __name__ == "__main__":
    sys.exit(main())
