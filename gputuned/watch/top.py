"""What the neighbours cost each inference process, for ``gputunectl top`` (gputuned/cli/top.py
shows it, once a second).

Per process: run-queue delay (milliseconds per second its threads spent runnable but waiting
for a CPU, from ``schedstat``), CPU use, involuntary and voluntary context switches per second,
device IRQs per second landing on the CPUs its threads may use, and the utilisation of the GPUs
it has open (NVML, when present). No eBPF: everything comes from /proc, through
:mod:`gputuned.kernel.sampling`.

Which processes: with the daemon running, those it placed or had registered (its ``status``);
otherwise the ``--pid`` given, or the processes matching the rules of the profile applied last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gputuned import errors
from gputuned.cpulist import format_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.nvml import NvmlGpu, read_gpus
from gputuned.kernel.sampling import IrqCounts, ProcSample, read_irq_counts, sample_process

#: Commands gputuned itself runs under; never watched as a server.
#: Without the daemon, rule matching scans every process: do it every this many refreshes.
RESCAN_EVERY = 5
#: The longest refresh --interval takes, in seconds.
MAX_INTERVAL = 3600


@dataclass(frozen=True)
class Target:
    pid: int
    source: str  # "placed", "registered (rule server)", "rule server", "--pid"


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    procs: dict[int, ProcSample]
    irqs: IrqCounts | None
    gpus: list[NvmlGpu] | None


@dataclass(frozen=True)
class Row:
    pid: int
    comm: str
    source: str
    threads: int
    cpus: str
    nice: int
    runq_ms_per_s: float | None  # None: no schedstat on this kernel
    cpu_percent: float | None  # of one CPU
    invol_cs_per_s: float
    vol_cs_per_s: float
    irqs_per_s: float | None  # device IRQs on its CPUs; None: no /proc/interrupts
    gpus: list[dict[str, Any]] = field(default_factory=list)  # {"index", "utilization"}


@dataclass(frozen=True)
class Targets:
    procs: list[Target]
    where: str  # a line saying where the list came from
    mode: str  # "pid", "daemon" or "rules"

    @property
    def refresh_every(self) -> int:
        """Look for new processes every this many refreshes (0: never)."""
        return {"pid": 0, "daemon": 1, "rules": RESCAN_EVERY}[self.mode]


def find_targets(kernel: Kernel, pids: list[int]) -> Targets:
    """The processes to watch."""
    if pids:
        _check_pids(kernel, pids)
        return Targets([Target(p, "--pid") for p in pids], "processes named with --pid", "pid")
    from gputuned.service.controlclient import daemon_running, request

    if daemon_running(kernel):
        st = request(kernel, {"cmd": "top"})
        registered = {int(k): str(v) for k, v in st.get("registered", {}).items()}
        out = [Target(p, "placed") for p in st.get("placed", []) if p not in registered]
        out += [Target(p, f"registered (rule {r})") for p, r in sorted(registered.items())]
        profile = st.get("active_profile") or "no profile"
        return Targets(
            sorted(out, key=lambda t: t.pid),
            f"processes the gputuned daemon placed ({profile})",
            "daemon",
        )
    return _rule_targets(kernel)


def _check_pids(kernel: Kernel, pids: list[int]) -> None:
    """Every --pid names a running process: watching one that is not there would show an
    empty table and exit 0, as if it had been watched (issue 19)."""
    from gputuned.kernel.proc import read_identity

    bad = [p for p in pids if p <= 0]
    if bad:
        raise errors.UsageError(f"--pid {bad[0]} is not a process ID; give a positive PID")
    gone = []
    for pid in pids:
        try:
            read_identity(kernel, pid)
        except errors.TargetGone:
            gone.append(pid)
        except errors.PermissionDenied:
            continue  # there, not ours to read: top says what it can
    if gone:
        raise errors.GputunedError(
            f"there is no process {', '.join(map(str, gone))}; give the PID of a running "
            "process (pgrep -f NAME finds it)"
        )


def _rule_targets(kernel: Kernel) -> Targets:
    from gputuned.engine.apply import read_active
    from gputuned.engine.plan import journal_originals
    from gputuned.kernel.pci import scan
    from gputuned.kernel.proc import iter_processes
    from gputuned.kernel.system import read_host_cpus
    from gputuned.profile.load import parse_profile
    from gputuned.store.state import ACTIVE
    from gputuned.tuners.gpuuse import gpu_use
    from gputuned.tuners.procmatch import ClaimInput
    from gputuned.tuners.proctree import claim, journal_key, readers

    active = read_active(kernel)
    if active is None:
        raise errors.GputunedError(
            "no gputuned daemon runs and no profile is applied here: name the processes to "
            "watch with --pid PID"
        )
    profile = parse_profile(active["profile"], ACTIVE)
    rules = profile.process
    gpu_rules = any(r.match.uses_gpu is not None for r in rules)
    nvml = read_gpus(kernel) if gpu_rules else None
    refs = read_host_cpus(kernel, scan(kernel, gpu_trees_only=True), nvml).gpus if gpu_rules else ()
    uses = gpu_use(kernel, refs, nvml).of
    uids = {r.match.user: kernel.user_id(r.match.user) for r in rules if r.match.user}
    original = journal_originals(kernel, None)

    claims = claim(
        iter_processes(kernel, brief=True),
        ClaimInput(
            rules,
            uses,
            uids,
            {},
            {},
            lambda p: original(journal_key(p.pid, p.start_time, "cgroup")),
            **readers(kernel, owner=True),
        ),
    )
    out = [
        Target(pid, f"rule {c.rule}" + (f", started by {c.parent}" if c.role == "child" else ""))
        for pid, c in claims.items()
        if c.role != "excluded"
    ]
    where = f"processes matching the rules of {profile.name} (no daemon running)"
    return Targets(out, where, "rules")


def take_snapshot(
    kernel: Kernel,
    targets: list[Target],
    *,
    nvml: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Snapshot:
    procs = {}
    for t in targets:
        try:
            procs[t.pid] = sample_process(kernel, t.pid)
        except (errors.TargetGone, errors.PermissionDenied):
            continue  # exited, or not ours to read: left out of this refresh
    try:
        irqs: IrqCounts | None = read_irq_counts(kernel)
    except errors.HostError:
        irqs = None
    return Snapshot(clock(), procs, irqs, read_gpus(kernel) if nvml else None)


def _per_s(delta: float, seconds: float) -> float:
    return max(0.0, delta) / seconds


def compute_rows(prev: Snapshot, cur: Snapshot, targets: list[Target]) -> list[Row]:
    """Rates between two snapshots for every target present in both (same start time)."""
    dt = cur.at - prev.at
    if dt <= 0:
        raise ValueError("snapshots must be taken in order, at different times")
    out = []
    for t in targets:
        a, b = prev.procs.get(t.pid), cur.procs.get(t.pid)
        if a is None or b is None or a.start_time != b.start_time:
            continue  # new, exited or a reused PID: no rate yet
        before = {th.tid: th for th in a.threads}
        wait = run = invol = vol = 0
        has_sched = True
        for th in b.threads:
            old = before.get(th.tid)  # a thread born meanwhile counts from zero
            if th.wait_ns is None or th.run_ns is None:
                has_sched = False
            else:
                wait += th.wait_ns - ((old.wait_ns or 0) if old else 0)
                run += th.run_ns - ((old.run_ns or 0) if old else 0)
            invol += th.involuntary - (old.involuntary if old else 0)
            vol += th.voluntary - (old.voluntary if old else 0)
        cpus = b.cpus
        irqs = None
        if prev.irqs is not None and cur.irqs is not None:
            irqs = _per_s(cur.irqs.on(cpus) - prev.irqs.on(cpus), dt)
        gpus = [
            {"index": g.index, "utilization": g.utilization_gpu}
            for g in cur.gpus or []
            if t.pid in g.pids
        ]
        out.append(
            Row(
                pid=t.pid,
                comm=b.comm,
                source=t.source,
                threads=len(b.threads),
                cpus=format_cpulist(cpus),
                nice=b.nice,
                runq_ms_per_s=_per_s(wait / 1e6, dt) if has_sched else None,
                cpu_percent=_per_s(run / 1e7, dt) if has_sched else None,
                invol_cs_per_s=_per_s(invol, dt),
                vol_cs_per_s=_per_s(vol, dt),
                irqs_per_s=irqs,
                gpus=gpus,
            )
        )
    return out


def to_json(rows: list[Row], snap: Snapshot, where: str) -> dict[str, Any]:
    return {
        "time": time.time(),
        "source": where,
        "processes": [asdict(r) for r in rows],
        "gpus": None
        if snap.gpus is None
        else [
            {"index": g.index, "bdf": g.bdf, "name": g.name, "utilization": g.utilization_gpu}
            for g in snap.gpus
        ],
    }
