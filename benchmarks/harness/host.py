"""The host as a benchmark reads it back and sets it by hand: what gputuned may change (IRQ
affinities, its cgroups, the worker's threads), a ``capture --stable`` before and after, the
published mitigation done by hand (pinned and reniced), steal time and file system types."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: The nice level of the published mitigation (and of the shipped profile's rule).
PINNED_NICE = -10


def fingerprint(pid: int | list[int]) -> dict[str, Any]:
    """What gputuned may change, read back: IRQ affinities, gputuned cgroups, the worker's
    processes (``pid``: one, or every process of a server-shaped worker; the first is the one
    whose cgroup is shown)."""
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process
    from gputuned.kernel.system import read_cgroup_layout, read_default_affinity, read_interrupts

    host = LiveKernel()
    mount = read_cgroup_layout(host).v2_mount
    pids = [pid] if isinstance(pid, int) else pid
    procs = []
    for p in pids:
        with contextlib.suppress(errors.TargetGone):
            procs.append(read_process(host, p))
    return {
        "irqs": {str(i.irq): sorted(i.affinity or ()) for i in read_interrupts(host)},
        "default_irq_affinity": sorted(read_default_affinity(host) or ()),
        "gputuned_cgroups": [n for n in host.listdir(mount) if "gputuned" in n] if mount else [],
        "worker_cgroup": procs[0].cgroup if procs else "-",
        "worker_cgroups": {str(p.pid): p.cgroup for p in procs},
        "worker_threads": {
            str(t.tid): [t.nice, t.policy, sorted(t.affinity)] for p in procs for t in p.threads
        },
    }


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for key in ("default_irq_affinity", "gputuned_cgroups", "worker_cgroup", "worker_cgroups"):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a[key]} -> {b[key]}")
    for table in ("irqs", "worker_threads"):
        for k in sorted(set(a[table]) & set(b[table])):  # threads may come and go
            if a[table][k] != b[table][k]:
                out.append(f"{table}[{k}]: {a[table][k]} -> {b[table][k]}")
    return out


def fresh_diff(ref: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """A server started while the daemon ran, after the daemon stopped: each of its processes
    in the cgroup the untuned server's are in, each thread with a (nice, policy, CPUs) that
    the untuned server's threads have."""
    out = []
    home = set(ref["worker_cgroups"].values())
    for pid, cg in after["worker_cgroups"].items():
        if cg not in home:
            out.append(f"pid {pid}: cgroup {cg}, not {sorted(home)}")
    untuned = {json.dumps(v) for v in ref["worker_threads"].values()}
    for tid, v in after["worker_threads"].items():
        if json.dumps(v) not in untuned:
            out.append(f"thread {tid}: {v}, untuned threads have {sorted(untuned)}")
    return out


def placement(pid: int | list[int]) -> dict[str, Any]:
    """How the worker's threads are placed now (nice, policy, CPUs; cgroup)."""
    fp = fingerprint(pid)
    shapes: dict[str, int] = {}
    for nice, policy, cpus in fp["worker_threads"].values():
        key = f"nice {nice} {policy} cpus {cpulist(cpus)}"
        shapes[key] = shapes.get(key, 0) + 1
    return {"cgroup": fp["worker_cgroup"], "threads": shapes}


def cpulist(cpus: list[int]) -> str:
    from gputuned.cpulist import format_cpulist

    return format_cpulist(frozenset(cpus))


def _tids(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def pin_by_hand(pids: list[int], cpus: frozenset[int], nice: int) -> int:
    """Every thread of ``pids`` on ``cpus`` at ``nice``, as taskset -a and renice would do it;
    threads started meanwhile are caught by a second pass. Returns how many were set."""
    done: set[int] = set()
    for _ in range(3):
        new = [(p, t) for p in pids for t in _tids(p) if t not in done]
        if not new:
            break
        for _pid, tid in new:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
                os.setpriority(os.PRIO_PROCESS, tid, nice)  # per thread on Linux (setpriority(2))
            done.add(tid)
    return len(done)


def put_back_by_hand(threads: dict[str, list[Any]]) -> None:
    """Each thread's nice and CPUs as ``fingerprint`` recorded them (threads gone: skipped)."""
    for tid, (nice, _policy, cpus) in threads.items():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def host_capture() -> Path:
    """``gputunectl capture --stable`` of this host into a new temporary directory."""
    from gputuned.kernel.capture import capture
    from gputuned.kernel.live import LiveKernel

    dest = Path(tempfile.mkdtemp(prefix="nn-capture-"))
    capture(LiveKernel(), dest, stable=True)
    return dest


def compare_captures(a: Path, b: Path) -> list[str]:
    """What ``diff -r a b`` would list (file names); both directories are removed."""
    try:
        fa = {p.relative_to(a): p for p in a.rglob("*") if p.is_file() or p.is_symlink()}
        fb = {p.relative_to(b): p for p in b.rglob("*") if p.is_file() or p.is_symlink()}
        out = [f"only before: {k}" for k in sorted(fa.keys() - fb.keys())]
        out += [f"only after: {k}" for k in sorted(fb.keys() - fa.keys())]
        for k in sorted(fa.keys() & fb.keys()):
            x, y = fa[k], fb[k]
            same = (
                x.readlink() == y.readlink()
                if x.is_symlink() or y.is_symlink()
                else x.read_bytes() == y.read_bytes()
            )
            if not same:
                out.append(f"differs: {k}")
        return out
    finally:
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)


def steal_ticks() -> dict[int, int]:
    """Per CPU, the "steal" column of /proc/stat (clock ticks)."""
    out = {}
    with Path("/proc/stat").open() as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                parts = line.split()
                out[int(parts[0][3:])] = int(parts[8]) if len(parts) > 8 else 0
    return out


def allowed_cpus(pid: int) -> list[int]:
    """The CPUs the worker's main thread may run on ([] once it is gone)."""
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    try:
        threads = read_process(LiveKernel(), pid).threads
    except errors.GputunedError:
        return []
    return sorted(next((t.affinity for t in threads if t.tid == pid), frozenset()))


def fs_type(path: str) -> str:
    best, fs = "", "?"
    with contextlib.suppress(OSError), Path("/proc/mounts").open() as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fs = parts[1], parts[2]
    return fs
