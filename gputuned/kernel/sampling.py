"""Counters for watching processes: scheduler delay, context switches, IRQs per CPU.

The figures behind ``gputunectl top``, the daemon's metrics and the benchmarks, read through
the kernel port so that trees can hold them:

- ``/proc/PID/task/TID/schedstat``: three numbers (fs/proc/base.c proc_pid_schedstat):
  nanoseconds on a CPU, nanoseconds waiting on a run queue while runnable, and the number of
  time slices run. The second is the delay a busy neighbour
  causes; it tracked the damage closely on the H200 host (docs/dev/benchmarks.md). Absent without
  CONFIG_SCHED_INFO; then it reads as ``None``.
- ``/proc/PID/task/TID/status``: ``voluntary_ctxt_switches`` (the thread blocked) and
  ``nonvoluntary_ctxt_switches`` (it was preempted: the neighbour's share), and
  ``Cpus_allowed_list``. ``/proc/PID/status`` shows only the main thread's switches
  (fs/proc/array.c task_context_switch_counts), so every thread is read.
- ``/proc/interrupts``: counts per CPU; a column belongs to the CPU its header names (offline
  CPUs have no column).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.procfs import NICE, STIME, UTIME, parse_stat, parse_status


@dataclass(frozen=True)
class ThreadSample:
    tid: int
    run_ns: int | None  # None: no schedstat (kernel without CONFIG_SCHED_INFO)
    wait_ns: int | None
    voluntary: int
    involuntary: int
    cpus: frozenset[int]


@dataclass(frozen=True)
class ProcSample:
    """One process's counters at one moment; ``(pid, start_time)`` is its identity."""

    pid: int
    start_time: int
    comm: str
    nice: int  # the main thread's
    utime: int  # clock ticks, the whole process (exited threads included)
    stime: int
    threads: tuple[ThreadSample, ...]

    @property
    def cpus(self) -> frozenset[int]:
        """Every CPU one of its threads may run on."""
        return frozenset().union(*(t.cpus for t in self.threads))

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


@dataclass(frozen=True)
class IrqCounts:
    """Totals of /proc/interrupts per CPU number.

    ``device``: the numbered lines (device IRQs, which ``smp_affinity`` moves); ``other``: the
    per-CPU system lines (local timer, rescheduling and function-call IPIs, ...).
    """

    device: dict[int, int]
    other: dict[int, int]

    def on(self, cpus: frozenset[int]) -> int:
        return sum(self.device.get(c, 0) for c in cpus)


def read_schedstat(kernel: Kernel, hpath: str) -> tuple[int, int] | None:
    """(ns on CPU, ns waiting on a run queue) from a schedstat file; None when absent."""
    raw = kernel.read_optional(hpath)
    if raw is None:
        return None
    fields = raw.split()
    return int(fields[0]), int(fields[1])


def read_thread_sample(kernel: Kernel, pid: int, tid: int) -> ThreadSample:
    base = f"/proc/{pid}/task/{tid}"
    status = parse_status(kernel.read_text(f"{base}/status"))
    sched = read_schedstat(kernel, f"{base}/schedstat")
    return ThreadSample(
        tid,
        sched[0] if sched else None,
        sched[1] if sched else None,
        int(status.get("voluntary_ctxt_switches", "0")),
        int(status.get("nonvoluntary_ctxt_switches", "0")),
        parse_cpulist(status.get("Cpus_allowed_list", "")),
    )


def sample_process(kernel: Kernel, pid: int) -> ProcSample:
    """Counters of ``pid`` and all its threads; :class:`TargetGone` if it has exited."""
    st = parse_stat(kernel.read_text(f"/proc/{pid}/stat"))
    threads = []
    for name in kernel.listdir(f"/proc/{pid}/task"):
        if not name.isdigit():
            continue
        try:
            threads.append(read_thread_sample(kernel, pid, int(name)))
        except errors.TargetGone:
            continue  # the thread exited between listing and reading
    return ProcSample(
        pid,
        st.start_time,
        st.comm,
        st.field(NICE),
        st.field(UTIME),
        st.field(STIME),
        tuple(sorted(threads, key=lambda t: t.tid)),
    )


def read_irq_counts(kernel: Kernel) -> IrqCounts:
    """Per-CPU totals of /proc/interrupts (kernel/irq/proc.c show_interrupts, arch_show_interrupts).

    Lighter than :func:`gputuned.kernel.system.read_interrupts`, which also reads every IRQ's
    affinity: this runs once a second.
    """
    lines = kernel.read_text("/proc/interrupts").splitlines()
    if not lines:
        return IrqCounts({}, {})
    cpus = [int(h[3:]) for h in lines[0].split() if h.startswith("CPU") and h[3:].isdigit()]
    device = dict.fromkeys(cpus, 0)
    other = dict.fromkeys(cpus, 0)
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        into = device if head.strip().isdigit() else other
        # ERR and MIS have one total, not a column per CPU: skip lines shorter than the header.
        fields = rest.split()[: len(cpus)]
        if len(fields) < len(cpus) or not all(x.isdigit() for x in fields):
            continue
        for cpu, value in zip(cpus, fields, strict=True):
            into[cpu] += int(value)
    return IrqCounts(device, other)


def clock_ticks() -> int:
    """USER_HZ: the unit of utime and stime in /proc/PID/stat."""
    return os.sysconf("SC_CLK_TCK")
