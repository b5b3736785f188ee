"""Threads and processes: nice, CPU affinity, scheduling policy, and why the kernel refused.

:class:`~gputuned.host.fs.Host` has the public methods (``set_nice``, ``set_affinity``,
``set_scheduler``, ``move_to_cgroup``); they find the thread's process, fire injected faults,
call here and record the change as a write to a pseudo-path such as
``/proc/1234/task/1235:nice``. This module is the mechanism for both kinds of Host:

- live: ``setpriority(2)`` (per thread when given a TID), ``sched_setaffinity(2)`` and
  ``sched_setscheduler(2)``; ``OSError`` becomes a gputuned error that says why.
- tree: the thread's ``/proc/PID/task/TID/stat`` and ``status`` (and ``/proc/PID/...`` for the
  main thread, which shows the leader) are edited field by field, keeping every other byte, so
  that writing the old value back restores them exactly. The kernel's checks are repeated: the
  set must meet the thread's cpuset, and a real-time policy is refused in a cgroup with the cpu
  controller (CONFIG_RT_GROUP_SCHED: such groups get no RT budget; seen on the H200 host).
  Simplified: the tree keeps the requested affinity where the kernel shows it intersected with
  the cpuset (the kernel remembers the request and re-applies it when cpusets change; a tree,
  which does not propagate cpuset changes to tasks, stays exact by keeping the request).
"""

from __future__ import annotations

import errno as E
import os
from collections.abc import Callable

from gputuned import errors
from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist
from gputuned.host.fs import Host, translate
from gputuned.host.proc import list_pids
from gputuned.host.treekernel import TreeKernel

#: sched_setscheduler(2) policies by name (include/uapi/linux/sched.h; deadline needs sched_setattr).
POLICY_NUMBERS = {"other": 0, "fifo": 1, "rr": 2, "batch": 3, "idle": 5}
_RT = ("fifo", "rr")
_OS_POLICY = {
    "other": os.SCHED_OTHER,
    "fifo": os.SCHED_FIFO,
    "rr": os.SCHED_RR,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
}
RT_REFUSED = (
    "the kernel refuses real-time policy in a cgroup whose cpu controller has no RT budget "
    "(cpu.rt_runtime_us); move the process to the root cgroup or keep policy 'other'"
)
# proc(5) /proc/PID/stat field numbers.
_PRIORITY, _NICE, _RT_PRIORITY, _POLICY = 18, 19, 40, 41


def where(pid: int, tid: int, what: str) -> str:
    """The pseudo-path naming a thread operation in ``Host.writes``, faults and errors."""
    return f"/proc/{pid}/task/{tid}:{what}"


def thread_group(host: Host, tid: int) -> int:
    """The process (thread group ID) of thread ``tid``; TargetGone when there is none."""
    try:
        status = host.read_text(f"/proc/{tid}/status")  # the kernel serves /proc/TID for threads
    except errors.TargetGone:
        status = ""
    for line in status.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    if not host.live:  # a tree holds only /proc/PID/task/TID for other threads
        for pid in list_pids(host):
            if host.exists(f"/proc/{pid}/task/{tid}"):
                return pid
    raise errors.TargetGone(
        f"thread {tid}: not there (ESRCH); the process or thread has exited",
        path=f"/proc/{tid}",
        errno=E.ESRCH,
    )


def check_scheduler(policy: str, priority: int) -> int:
    """The policy number, or InvalidValue for a policy or priority the kernel would refuse."""
    if policy not in POLICY_NUMBERS:
        raise errors.InvalidValue(
            f"scheduling policy {policy!r} is not one of {', '.join(POLICY_NUMBERS)}"
        )
    if policy in _RT and not 1 <= priority <= 99:
        raise errors.InvalidValue(f"policy {policy!r} needs a priority from 1 to 99")
    if policy not in _RT and priority != 0:
        raise errors.InvalidValue(f"policy {policy!r} takes priority 0 (only fifo and rr use it)")
    return POLICY_NUMBERS[policy]


# -- the operations ---------------------------------------------------------------------------


def set_nice(host: Host, pid: int, tid: int, nice: int) -> None:
    if host.live:
        _syscall(lambda: os.setpriority(os.PRIO_PROCESS, tid, nice), where(pid, tid, "nice"))
        return
    nice = max(-20, min(19, nice))  # kernel/sys.c set_one_prio() clamps, it does not refuse
    _edit_stat(host, pid, tid, {_NICE: nice})


def set_affinity(host: Host, pid: int, tid: int, cpus: frozenset[int]) -> None:
    at = where(pid, tid, "affinity")
    if host.live:
        _syscall(lambda: os.sched_setaffinity(tid, cpus), at, cpus=cpus)
        return
    tk = TreeKernel(host.root)
    nr = tk.nr_cpu_ids()
    want = frozenset(c for c in cpus if 0 <= c < nr)  # the kernel reads nr_cpu_ids bits only
    if not want & _cpuset_of(tk, pid) & tk.online():
        raise explain(OSError(E.EINVAL, os.strerror(E.EINVAL)), at, cpus=cpus)
    _edit_status(
        host,
        pid,
        tid,
        {"Cpus_allowed": format_mask(want, nr), "Cpus_allowed_list": format_cpulist(want)},
    )


def set_scheduler(host: Host, pid: int, tid: int, policy: str, priority: int) -> None:
    number = check_scheduler(policy, priority)
    at = where(pid, tid, "scheduler")
    if host.live:
        param = os.sched_param(priority)
        _syscall(lambda: os.sched_setscheduler(tid, _OS_POLICY[policy], param), at, policy=policy)
        return
    if policy in _RT and _rt_refused(TreeKernel(host.root), pid):
        raise explain(OSError(E.EPERM, os.strerror(E.EPERM)), at, policy=policy)
    _edit_stat(host, pid, tid, {_POLICY: number, _RT_PRIORITY: priority})


def set_own_realtime(priority: int) -> None:
    """SCHED_FIFO at ``priority`` for the calling thread (the daemon's event thread), with
    SCHED_RESET_ON_FORK: a thread or process it starts begins at SCHED_OTHER (sched(7))."""
    check_scheduler("fifo", priority)
    param = os.sched_param(priority)
    policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    _syscall(
        lambda: os.sched_setscheduler(0, policy, param),
        "/proc/thread-self:scheduler",
        policy="fifo",
    )


# -- errors -----------------------------------------------------------------------------------


def _syscall(call: Callable[[], None], at: str, **ctx: object) -> None:
    try:
        call()
    except OSError as exc:
        raise explain(exc, at, **ctx) from exc


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
        elif what == "scheduler" and policy in _RT:
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


def nearest_cgroup(host: Host, mount: str, cgroup: str) -> str:
    """``cgroup`` (a path as /proc/PID/cgroup shows it) if it still exists under the cgroup v2
    ``mount``, else its nearest existing ancestor ("/" at the end): where a process goes back
    to when the cgroup it came from was removed meanwhile (a unit restarted, a container gone).
    """
    parts = [p for p in cgroup.split("/") if p]
    while parts and not host.is_dir("/".join([mount, *parts])):
        parts.pop()
    return "/" + "/".join(parts)


# -- trees ------------------------------------------------------------------------------------


def _rt_refused(tk: TreeKernel, pid: int) -> bool:
    """Whether the task's cpu cgroup is not the root one (CONFIG_RT_GROUP_SCHED refuses RT there).

    kernel/sched/syscalls.c __sched_setscheduler(): EPERM when the task group has no RT runtime,
    which is every non-root group unless cpu.rt_runtime_us was given some. On cgroup v2 a cgroup
    is its own task group when its parent enables cpu in cgroup.subtree_control.
    """
    rel = tk.cgroup_of(pid)
    mounts = tk.cgroup2_mounts()
    if not rel or rel == "/" or not mounts:
        return False
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts), 0, -1):
        group = "/".join([mounts[0], *parts[:depth]])
        parent = "/".join([mounts[0], *parts[: depth - 1]])
        if "cpu" in (tk.get(f"{parent}/cgroup.subtree_control") or "").split():
            runtime = (tk.get(f"{group}/cpu.rt_runtime_us") or "0").strip()
            return not (runtime.lstrip("-").isdigit() and int(runtime) != 0)
    return False


def _cpuset_of(tk: TreeKernel, pid: int) -> frozenset[int]:
    """cpuset.cpus.effective of the task's cgroup (the nearest captured ancestor's)."""
    rel = tk.cgroup_of(pid) or "/"
    mounts = tk.cgroup2_mounts()
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts), -1, -1):
        if not mounts:
            break
        eff = tk.get("/".join([mounts[0], *parts[:depth]]) + "/cpuset.cpus.effective")
        if eff is not None:
            return parse_cpulist(eff)
    return tk.online()


def _task_files(host: Host, pid: int, tid: int, name: str) -> list[str]:
    main = f"/proc/{pid}/task/{tid}/{name}"
    if not host.exists(main):
        raise errors.TargetGone(
            f"set {where(pid, tid, name)}: not there (ESRCH); the thread has exited",
            path=main,
            errno=E.ESRCH,
        )
    # /proc/PID/{stat,status} show the thread-group leader (fs/proc/array.c).
    return [main, f"/proc/{pid}/{name}"] if tid == pid else [main]


def _put(host: Host, hpath: str, text: str) -> None:
    host.path(hpath).write_bytes(text.encode())


def _edit_stat(host: Host, pid: int, tid: int, values: dict[int, int]) -> None:
    """Set numbered fields of stat; the priority field follows when it agreed before."""
    for path in _task_files(host, pid, tid, "stat"):
        text = host.read_text(path)
        cut = text.rindex(")") + 1  # comm may hold spaces and ')'
        body, newline = (text[cut:-1], "\n") if text.endswith("\n") else (text[cut:], "")
        fields = body.split(" ")  # fields[0] is "" (the space after comm); field N is [N - 2]

        def num(n: int, fields: list[str] = fields) -> int:
            return int(fields[n - 2])

        agreed = num(_PRIORITY) == _priority(num(_POLICY), num(_NICE), num(_RT_PRIORITY))
        for n, v in values.items():
            fields[n - 2] = str(v)
        if agreed:
            fields[_PRIORITY - 2] = str(_priority(num(_POLICY), num(_NICE), num(_RT_PRIORITY)))
        _put(host, path, text[:cut] + " ".join(fields) + newline)


def _priority(policy: int, nice: int, rt_priority: int) -> int:
    """stat field 18, task_prio(): -1 - rt_priority for fifo/rr, else 20 + nice."""
    return -1 - rt_priority if policy in (1, 2) else 20 + nice


def _edit_status(host: Host, pid: int, tid: int, values: dict[str, str]) -> None:
    for path in _task_files(host, pid, tid, "status"):
        lines = host.read_text(path).splitlines(keepends=True)
        for i, line in enumerate(lines):
            key, sep, rest = line.partition(":")
            if sep and key in values:
                pad = rest[: len(rest) - len(rest.lstrip(" \t"))]
                end = "\n" if line.endswith("\n") else ""
                lines[i] = f"{key}:{pad}{values[key]}{end}"
        _put(host, path, "".join(lines))
