"""A thread's nice level, scheduling policy and CPU affinity: one op per thread.

A plan's ``thread`` change carries one attribute of every thread of a process (``data``:
pid, start time, ``attr`` and ``threads`` {tid: value}); it becomes one op per thread, keyed
``thread:PID:START:TID:ATTR``, each checking the process's identity (PID and start time)
before it reads or writes. An op's ``data`` also carries what plan knew: ``planned_old``
(the value before this apply moved the process: a move into a partition narrows the affinity
by itself, cpuset_attach), ``origin`` (what the thread had before gputuned, where it shows what
a placement passed on at fork: journaled instead of the value read) and ``cgmount``.

Values: nice ``-20``..``19``; policy ``other``, ``batch``, ``idle`` or ``fifo:N``/``rr:N``; an
affinity is a CPU list, or :data:`DEFAULT_AFFINITY`: every CPU the thread's cgroup allows (the
thread never chose its CPUs).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.kernel.proc import read_thread
from gputuned.kernel.procfs import cgroup_path
from gputuned.kernel.system import cgroup_cpus
from gputuned.settings.base import Op, Setting, check_identity, process_ids_refusal

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel
    from gputuned.kernel.proc import ThreadInfo

#: Journal value of an affinity the thread never set itself (gputuned/tuners/procplan.py _plan_proc).
DEFAULT_AFFINITY = "cgroup-default"
_CPULIST = re.compile(r"[0-9,\-:/]{0,4096}")
_POLICY = re.compile(r"(other|batch|idle)|(fifo|rr):\d{1,2}")


class ThreadAttribute(Setting):
    """What the three per-thread kinds share: expansion, identity, reading the thread."""

    change_kind = "thread"
    placement = True

    def ops(self, ch: Change) -> list[Op]:
        d = ch.data
        return [
            Op(
                f"thread:{d['pid']}:{d['start']}:{tid}:{d['attr']}",
                ch.tuner,
                f"{ch.target} (thread {tid})",
                d["attr"],
                "",
                str(value),
                data={
                    "pid": d["pid"],
                    "start": d["start"],
                    "tid": int(tid),
                    "ppid": d.get("ppid", 0),
                    "planned_old": d.get("old", {}).get(tid),
                    "origin": d.get("origin", {}).get(tid),
                    "cgmount": d.get("cgmount"),
                },
            )
            for tid, value in sorted(d["threads"].items(), key=lambda kv: int(kv[0]))
        ]

    def read(self, kernel: Kernel, op: Op) -> str:
        check_identity(kernel, op)
        pid, tid = int(op.data["pid"]), int(op.data["tid"])
        return thread_value(read_thread(kernel, f"/proc/{pid}/task/{tid}", tid), self.kind)

    def refusal(self, op: Op, value: str) -> str | None:
        missing = process_ids_refusal(op, thread=True)
        if missing:
            return missing
        return (
            None
            if self.valid(value)
            else f"{value[:80]!r} is not a {op.kind} value gputuned writes"
        )

    def valid(self, value: str) -> bool:
        raise NotImplementedError


class Nice(ThreadAttribute):
    kind = "nice"
    what = "a thread's nice level"

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        check_identity(kernel, op)
        kernel.set_nice(int(op.data["tid"]), int(value))

    def valid(self, value: str) -> bool:
        return re.fullmatch(r"-?\d{1,2}", value) is not None and -20 <= int(value) <= 19


class Policy(ThreadAttribute):
    kind = "policy"
    what = "a thread's scheduling policy and real-time priority"

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        check_identity(kernel, op)
        pol, _, prio = value.partition(":")
        kernel.set_scheduler(int(op.data["tid"]), pol, int(prio or 0))

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        # A real-time policy in a cgroup without an RT budget (kernel/tasks.py RT_REFUSED).
        if isinstance(exc, errors.PermissionDenied):
            return str(exc)
        return None

    def valid(self, value: str) -> bool:
        return _POLICY.fullmatch(value) is not None


class Affinity(ThreadAttribute):
    kind = "affinity"
    what = "the CPUs a thread may run on"

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        check_identity(kernel, op)
        # DEFAULT_AFFINITY: allow every CPU; the kernel narrows it to what the cgroup allows
        # and widens it again when the cgroup gets CPUs back (the user mask is kept).
        cpus = _online(kernel) if value == DEFAULT_AFFINITY else parse_cpulist(value)
        kernel.set_affinity(int(op.data["tid"]), cpus)

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        if value != DEFAULT_AFFINITY:
            return super().holds(kernel, op, value, just_written=just_written)
        # The thread restricts nothing its cgroup allows. The kernel shows the intersection
        # of the thread's own mask with its cpuset (sched_getaffinity()), so a thread that
        # allows every CPU reads back exactly what the cgroup allows; a tree keeps the mask
        # as written, a superset.
        now = self.read(kernel, op)
        return parse_cpulist(now) >= _cgroup_allows(kernel, op), now

    def holds_already(self, kernel: Kernel, op: Op, value: str) -> bool:
        """ "All the cgroup allows" never counts as held, and is always written: a thread
        pinned to exactly its cgroup's CPUs reads the same, but keeps that pin as its own mask
        when it moves to another cgroup; writing it sets the kernel's user mask, which the
        thread keeps when it moves back and its cgroup gets CPUs back."""
        return value != DEFAULT_AFFINITY and super().holds_already(kernel, op, value)

    def set_back(self, kernel: Kernel, op: Op, old: str) -> bool:
        """The kernel sets a thread's CPUs as asked (narrowed to what its cpuset allows, which
        reads back as neither value) or refuses; back on its old CPUs right after the write,
        the thread was set back by its process, or by whoever else binds it."""
        return self.holds(kernel, op, old)[0]

    def original(self, kernel: Kernel, op: Op) -> str:
        now = super().original(kernel, op)  # and the process's identity checked
        if op.data.get("planned_old") == DEFAULT_AFFINITY:
            return DEFAULT_AFFINITY  # the thread never chose its CPUs: restore "all it allows"
        return now

    def valid(self, value: str) -> bool:
        return value == DEFAULT_AFFINITY or _CPULIST.fullmatch(value) is not None


def policy_value(policy: str, priority: int) -> str:
    """One string per scheduling setting: "other", "batch", "fifo:10"."""
    return f"{policy}:{priority}" if policy in ("fifo", "rr") else policy


def thread_value(t: ThreadInfo, attr: str) -> str:
    """Thread ``t``'s ``attr`` (nice, policy or affinity) in the journal's form."""
    if attr == "nice":
        return str(t.nice)
    if attr == "policy":
        return policy_value(t.policy, t.rt_priority)
    return format_cpulist(t.affinity)


def _online(kernel: Kernel) -> frozenset[int]:
    return parse_cpulist(kernel.read_value("/sys/devices/system/cpu/online"))


def _cgroup_allows(kernel: Kernel, op: Op) -> frozenset[int]:
    """CPUs the thread's current cgroup allows (cgroup v2 cpuset), else all online CPUs."""
    mount = op.data.get("cgmount")
    if mount:
        cgroup = cgroup_path(kernel.read_text(f"/proc/{op.data['pid']}/cgroup"))
        cpus = cgroup_cpus(kernel, str(mount), cgroup) if cgroup is not None else None
        if cpus is not None:
            return cpus
    return _online(kernel)
