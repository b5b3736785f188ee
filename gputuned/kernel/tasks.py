"""Threads and processes as the kernel port changes them: policies by name, how a thread
operation is named, and why the kernel refused one.

Both backends use these: the live one with ``setpriority(2)`` (per thread when given a TID),
``sched_setaffinity(2)``, ``sched_setscheduler(2)`` and a write to ``cgroup.procs``; the
simulated one by editing the tree's ``/proc`` files (:mod:`gputuned.sim.tasks`). A thread
operation is named by a pseudo-path such as ``/proc/1234/task/1235:nice`` in errors (and in
the write log of the tests' fault wrapper).
"""

from __future__ import annotations

import errno as E
import os

from gputuned import errors
from gputuned.cpulist import format_cpulist
from gputuned.kernel.oserrors import translate

#: sched_setscheduler(2) policies by name (include/uapi/linux/sched.h; deadline needs sched_setattr).
POLICY_NUMBERS = {"other": 0, "fifo": 1, "rr": 2, "batch": 3, "idle": 5}
#: The real-time policies: the ones that take a priority.
RT_POLICIES = ("fifo", "rr")
RT_REFUSED = (
    "the kernel refuses real-time policy in a cgroup whose cpu controller has no RT budget "
    "(cpu.rt_runtime_us); move the process to the root cgroup or keep policy 'other'"
)


def where(pid: int, tid: int, what: str) -> str:
    """The pseudo-path naming a thread operation in errors and write logs."""
    return f"/proc/{pid}/task/{tid}:{what}"


def check_scheduler(policy: str, priority: int) -> int:
    """The policy number, or InvalidValue for a policy or priority the kernel would refuse."""
    if policy not in POLICY_NUMBERS:
        raise errors.InvalidValue(
            f"scheduling policy {policy!r} is not one of {', '.join(POLICY_NUMBERS)}"
        )
    if policy in RT_POLICIES and not 1 <= priority <= 99:
        raise errors.InvalidValue(f"policy {policy!r} needs a priority from 1 to 99")
    if policy not in RT_POLICIES and priority != 0:
        raise errors.InvalidValue(f"policy {policy!r} takes priority 0 (only fifo and rr use it)")
    return POLICY_NUMBERS[policy]


def explain(
    exc: OSError, at: str, *, policy: object = None, cpus: object = None
) -> errors.HostError:
    """The gputuned error for a failed thread operation ``at`` (a pseudo-path), with the why."""
    code = exc.errno or 0
    what = at.rsplit(":", 1)[-1]
    reason = None
    if code == E.ESRCH:
        reason = "the thread has exited"
    elif code in (E.EPERM, E.EACCES):
        if os.geteuid() != 0:
            reason = "changing another process's scheduling needs CAP_SYS_NICE: run as root"
        elif what == "scheduler" and policy in RT_POLICIES:
            reason = RT_REFUSED
    elif code == E.EINVAL and what == "affinity" and isinstance(cpus, frozenset):
        reason = (
            f"no CPU of {format_cpulist(cpus) or 'the empty set'} is online and allowed by the "
            "cpuset of the thread's cgroup (cpuset.cpus.effective), or it is a per-CPU kernel "
            "thread; pick CPUs that cgroup allows, or move the process first"
        )
    return translate(OSError(code, reason) if reason else exc, "set", at)


def explain_move(exc: errors.HostError, pid: int, cgroup_dir: str) -> errors.HostError:
    """A failed write of ``pid`` to ``cgroup_dir``/cgroup.procs, said the way that helps."""
    reasons = {
        E.ESRCH: (errors.TargetGone, "the process has exited"),
        E.EBUSY: (
            errors.Busy,
            "the cgroup has controllers enabled in cgroup.subtree_control, so it may not hold "
            "processes (cgroup v2 'no internal processes'); move the process to a leaf cgroup",
        ),
        E.ENOSPC: (
            errors.NoSpace,
            "the cgroup's cpuset has no CPU or memory node (cpuset.cpus.effective or "
            "cpuset.mems.effective is empty); give it CPUs first",
        ),
        E.EOPNOTSUPP: (
            errors.NotSupported,
            "the cgroup is threaded; a whole process moves only into a domain cgroup",
        ),
    }
    if exc.errno not in reasons:
        return exc
    cls, reason = reasons[exc.errno]
    name = E.errorcode.get(exc.errno, str(exc.errno))
    return cls(
        f"move process {pid} to {cgroup_dir}: {reason} ({name})", path=exc.path, errno=exc.errno
    )
