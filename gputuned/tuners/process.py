"""Process placement: nice level, scheduling policy, CPUs and partition for matched processes.

Each `[[process]]` rule matches processes by the keys under `match` (all given keys must match)
and sets what the rule names. gputuned watches for new processes and threads (the proc
connector), so a server started after gputuned is placed too, and new threads follow it.

What helps, as measured on a 16-vCPU H200 host under CPU, network and disk noise (decode
throughput and p99 token latency as ratios to a quiet run): untuned 0.53x / 2.56x;
`nice = -10` on all threads 0.91x / 1.05x, the largest single gain; `SCHED_FIFO` 0.86-0.92x /
2.28-2.40x, far worse. A CUDA thread that spin-waits on the GPU exhausts the real-time budget
(`kernel.sched_rt_runtime_us`, 950 ms per second by default) and is throttled. Real-time
policies also fail with EPERM in cgroups that have the cpu controller but no RT budget. Use
`policy = "other"` with a negative `nice` unless you have measured otherwise.

Confining a server to few CPUs can cost throughput; the best count depends on host and workload,
so the CPU sets in `[cpusets]` say it explicitly: measure before settling on one.

Before every change and every revert gputuned checks that the PID still belongs to the same
process (PID and start time), since PIDs are reused.

Match keys:

- `exe`: exact path of the executable, as `/proc/PID/exe` points to.
- `comm`: exact command name (`/proc/PID/comm`; the kernel keeps 15 characters).
- `cmdline`: Python regular expression searched (`re.search`) in the command line, arguments
  joined by single spaces.
- `unit`: the systemd unit the process runs in (`.service` or `.scope`).
- `cgroup`: prefix of the process's cgroup v2 path as `/proc/PID/cgroup` shows it.
- `uses_gpu`: the process has this GPU (index) open.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gputuned import errors
from gputuned.changes import Change, PlanContext, TunerPlan
from gputuned.cpulist import format_cpulist
from gputuned.host.proc import ProcInfo, ThreadInfo, read_process
from gputuned.host.system import cgroup_cpus

#: TASK_COMM_LEN is 16 bytes including the NUL (include/linux/sched.h).
COMM_MAX = 15


class Match(BaseModel):
    """The `match` table of a `[[process]]` rule: which processes the rule applies to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exe: StrictStr | None = Field(
        default=None, description="Exact path of the executable (/proc/PID/exe)."
    )
    comm: StrictStr | None = Field(
        default=None, description="Exact command name (/proc/PID/comm), at most 15 characters."
    )
    cmdline: StrictStr | None = Field(
        default=None,
        description="Python regex searched in the command line (arguments joined by spaces).",
    )
    unit: StrictStr | None = Field(
        default=None, description="systemd unit name ending in .service or .scope."
    )
    cgroup: StrictStr | None = Field(
        default=None,
        description="Prefix of the cgroup v2 path as /proc/PID/cgroup shows it, starting with '/'.",
    )
    uses_gpu: StrictInt | None = Field(
        default=None, ge=0, description="Index of a GPU the process has open."
    )

    @field_validator("exe")
    @classmethod
    def _absolute_exe(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(
                f"{value!r} is not an absolute path; give the executable's full path as "
                "/proc/PID/exe shows it (e.g. '/usr/bin/python3.11')"
            )
        return value

    @field_validator("comm")
    @classmethod
    def _short_comm(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must not be empty; give the command name as /proc/PID/comm shows it")
        if len(value) > COMM_MAX:
            raise ValueError(
                f"{value!r} is {len(value)} characters; the kernel keeps only the first 15 "
                f"(TASK_COMM_LEN), so write {value[:COMM_MAX]!r}"
            )
        return value

    @field_validator("cmdline")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(
                f"{value!r} is not a valid Python regular expression ({exc}); "
                "escape literal characters such as ( [ . * + ? with a backslash"
            ) from None
        return value

    @field_validator("unit")
    @classmethod
    def _unit_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        stem, dot, suffix = value.rpartition(".")
        if not (dot and stem and suffix in ("service", "scope") and "/" not in value):
            raise ValueError(
                f"{value!r} is not a systemd unit name; write one ending in '.service' or "
                "'.scope' (e.g. 'vllm.service')"
            )
        return value

    @field_validator("cgroup")
    @classmethod
    def _cgroup_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(
                f"{value!r} is not a cgroup path; write it as /proc/PID/cgroup shows it, "
                "starting with '/' (e.g. '/system.slice/vllm.service')"
            )
        return value

    @model_validator(mode="after")
    def _something(self) -> Match:
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise ValueError(
                "give at least one of exe, comm, cmdline, unit, cgroup or uses_gpu; "
                "a rule without one would match every process"
            )
        return self


class Config(BaseModel):
    """One `[[process]]` rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(
        min_length=1, description="Name of the rule, used in reports and logs; unique."
    )
    match: Match = Field(
        description="Which processes the rule applies to; all given keys must match."
    )
    cpus: StrictStr = Field(
        default="keep",
        description="CPU set (a [cpusets] name) every thread is pinned to, or 'keep'.",
    )
    nice: StrictInt | None = Field(
        default=None, ge=-20, le=19, description="Nice level for every thread, -20..19."
    )
    policy: Literal["keep", "other", "batch", "idle", "fifo", "rr"] = Field(
        default="keep",
        description=(
            "Scheduling policy for every thread: SCHED_OTHER, BATCH, IDLE, FIFO or RR, or 'keep'. "
            "fifo and rr made tail latency far worse in measurements (RT throttling)."
        ),
    )
    priority: StrictInt | None = Field(
        default=None,
        validate_default=True,
        description="Real-time priority 1..99, only with policy fifo or rr.",
    )
    move_to_partition: StrictBool = Field(
        default=False,
        description="Move the process into the [cpuset] partition (mode 'isolated' or 'root').",
    )
    spread_threads: StrictBool = Field(
        default=False,
        description=(
            "Inside an isolated partition, pin each thread to its own CPU and leave the main "
            "thread a CPU alone (there is no load balancing there)."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )

    @field_validator("priority")
    @classmethod
    def _priority_fits_policy(cls, value: int | None, info: ValidationInfo) -> int | None:
        policy = info.data.get("policy")
        if policy in ("fifo", "rr"):
            if value is None:
                raise ValueError(f"policy {policy!r} needs a priority from 1 to 99; add one")
            if not 1 <= value <= 99:
                raise ValueError(f"policy {policy!r} needs a priority from 1 to 99; got {value}")
        elif value not in (None, 0) and policy is not None:
            raise ValueError(
                f"{value} is not allowed with policy {policy!r}; a priority is only for "
                "'fifo' or 'rr': remove it or set it to 0"
            )
        return value


_OWN_COMMS = ("gputunectl", "gputuned")


def matches(rule: Match, proc: ProcInfo, gpu_pids: dict[int, frozenset[int]]) -> bool:
    """All keys the rule gives must match; kernel threads (no exe, no cmdline) never do."""
    if proc.exe is None and not proc.cmdline:
        return False
    unit_parts = proc.cgroup.split("/")
    checks = (
        rule.exe is None or proc.exe == rule.exe,
        rule.comm is None or proc.comm == rule.comm,
        rule.cmdline is None or re.search(rule.cmdline, proc.cmdline) is not None,
        rule.unit is None or rule.unit in unit_parts,
        rule.cgroup is None
        or proc.cgroup == rule.cgroup
        or proc.cgroup.startswith(rule.cgroup.rstrip("/") + "/"),
        rule.uses_gpu is None or proc.pid in gpu_pids.get(rule.uses_gpu, frozenset()),
    )
    return all(checks)


def _summary(values: list[str]) -> str:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


class ProcessTuner:
    """Nice level, scheduling policy, CPU placement and cgroup of matching processes' threads."""

    name = "process"

    def plan(self, ctx: PlanContext) -> TunerPlan:
        out = TunerPlan()
        by_index = {g.index: g.bdf for g in ctx.cpus.gpus}
        gpu_pids = {
            idx: frozenset(p for g in ctx.snap.nvml or [] if g.bdf == bdf for p in g.pids)
            for idx, bdf in by_index.items()
        }
        candidates = [p for p in ctx.processes if p.comm not in _OWN_COMMS]
        for rule in ctx.profile.process:
            if rule.match.uses_gpu is not None and ctx.snap.nvml is None:
                out.notes.append(
                    f"process[{rule.name}]: match.uses_gpu needs NVML, which is not available here"
                )
            found = [
                p
                for p in candidates
                if matches(rule.match, p, gpu_pids) or ctx.registered.get(p.pid) == rule.name
            ]
            if not found:
                out.notes.append(
                    f"process[{rule.name}]: no running process matches; it is placed when it starts"
                )
            for proc in found:
                try:  # the scan read no threads: read them for the processes that matter
                    full = read_process(ctx.host, proc.pid)
                except errors.TargetGone:
                    continue  # exited since the scan
                if full.start_time == proc.start_time:
                    out.changes += self._plan_proc(ctx, rule, full)
        return out

    def _plan_proc(self, ctx: PlanContext, rule: Config, proc: ProcInfo) -> list[Change]:
        """Settings for one process, in apply order: nice, policy, cgroup, then affinity.

        The move comes before the affinity: once a partition holds its CPUs they leave every
        other cgroup's effective set, so a thread outside the partition cannot be pinned to
        them (sched_setaffinity returns EINVAL). On revert the affinity is restored while the
        process is still inside; the kernel keeps only the part its cpuset allows, so revert
        makes a second pass for such values once the process is back in its own cgroup.
        """
        label = f"pid {proc.pid} ({proc.comm}, {len(proc.threads)} threads)"
        why = f"process rule {rule.name!r}"
        out: list[Change] = []
        threads = proc.threads

        def per_thread(
            attr: str,
            have: dict[int, str],
            want: dict[int, str],
            shown: str,
            old: dict[int, str] | None = None,
        ) -> None:
            out.append(
                Change(
                    self.name,
                    f"{label} {attr}",
                    _summary(list(have.values())),
                    shown,
                    why,
                    report_only=rule.report_only,
                    key=f"thread:{proc.pid}:{proc.start_time}:{attr}",
                    kind="thread",
                    data={
                        "pid": proc.pid,
                        "start": proc.start_time,
                        "ppid": proc.ppid,
                        "attr": attr,
                        "threads": want,
                        "old": old if old is not None else have,
                        "cgmount": ctx.cgroup.v2_mount,
                    },
                    in_sync=all(have[t] == want[t] for t in want),
                )
            )

        if rule.nice is not None:
            per_thread(
                "nice",
                {t.tid: str(t.nice) for t in threads},
                {t.tid: str(rule.nice) for t in threads},
                str(rule.nice),
            )
        if rule.policy != "keep":
            want = policy_value(rule.policy, rule.priority or 0)
            per_thread(
                "policy",
                {t.tid: policy_value(t.policy, t.rt_priority) for t in threads},
                {t.tid: want for t in threads},
                want,
            )
        cs = ctx.profile.cpuset
        if cs is not None and rule.move_to_partition and cs.mode in ("root", "isolated"):
            want_cg = "/" + cs.cgroup
            mount = ctx.cgroup.v2_mount
            if ctx.cgroup.partitions_possible and mount is not None:
                out.append(
                    Change(
                        self.name,
                        f"{label} cgroup",
                        proc.cgroup or "-",
                        want_cg,
                        why,
                        report_only=rule.report_only,
                        key=f"proc_cgroup:{proc.pid}:{proc.start_time}",
                        kind="proc_cgroup",
                        data={"pid": proc.pid, "start": proc.start_time, "mount": mount},
                        in_sync=proc.cgroup == want_cg,
                    )
                )
        if rule.cpus != "keep":
            cpus = ctx.sets.sets[rule.cpus]
            isolated = cs is not None and cs.mode == "isolated"
            plan = thread_cpus(threads, cpus, rule.spread_threads and isolated)
            shown = format_cpulist(cpus)
            if len(set(plan.values())) > 1:
                main = format_cpulist(plan[proc.pid])
                shown = f"one CPU each over {shown}, main thread alone on {main}"
            # A thread whose affinity is just what its cgroup allows never chose one: its
            # original is "whatever the cgroup allows" (DEFAULT_AFFINITY), not the CPU list
            # of the moment, which a partition may have narrowed.
            allowed = _cgroup_cpus(ctx, proc.cgroup)
            per_thread(
                "affinity",
                {t.tid: format_cpulist(t.affinity) for t in threads},
                {tid: format_cpulist(c) for tid, c in plan.items()},
                shown,
                {
                    t.tid: DEFAULT_AFFINITY if t.affinity == allowed else format_cpulist(t.affinity)
                    for t in threads
                },
            )
        return out


#: Journal value of an affinity the thread never set itself (see _plan_proc).
DEFAULT_AFFINITY = "cgroup-default"


def _cgroup_cpus(ctx: PlanContext, cgroup: str) -> frozenset[int]:
    """The CPUs a process's cgroup lets it use: cpuset.cpus.effective, else all online."""
    mount = ctx.cgroup.v2_mount
    if mount and ctx.cgroup.partitions_possible:
        cpus = cgroup_cpus(ctx.host, mount, cgroup)
        if cpus is not None:
            return cpus
    return ctx.cpus.online


def policy_value(policy: str, priority: int) -> str:
    """One string per scheduling setting: "other", "batch", "fifo:10"."""
    return f"{policy}:{priority}" if policy in ("fifo", "rr") else policy


def thread_cpus(
    threads: tuple[ThreadInfo, ...], cpus: frozenset[int], spread: bool
) -> dict[int, frozenset[int]]:
    """CPU set per thread. Spread: the main thread alone on the first CPU, the rest round robin.

    Inside an isolated partition the scheduler does not balance load (cgroup-v2.rst, "isolated"
    partitions), so threads left on the whole set would pile onto one CPU.
    """
    if not spread or len(cpus) < 2 or not threads:
        return {t.tid: cpus for t in threads}
    order = sorted(cpus)
    main, rest = order[0], order[1:]
    out = {}
    workers = [t for t in threads if t.tid != threads[0].tid]
    out[threads[0].tid] = frozenset({main})
    for i, t in enumerate(workers):
        out[t.tid] = frozenset({rest[i % len(rest)]})
    return out
