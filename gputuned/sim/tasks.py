"""Threads in a tree: nice, CPU affinity and scheduling policy, as the kernel would show them.

The thread's ``/proc/PID/task/TID/stat`` and ``status`` (and ``/proc/PID/...`` for the main
thread, which shows the leader) are edited field by field, keeping every other byte, so that
writing the old value back restores them exactly. The kernel's checks are repeated: the set
must meet the thread's cpuset, and a real-time policy is refused in a cgroup with the cpu
controller (CONFIG_RT_GROUP_SCHED: such groups get no RT budget; seen on the H200 host).
Simplified: the tree keeps the requested affinity where the kernel shows it intersected with
the cpuset (the kernel remembers the request and re-applies it when cpusets change; a tree,
which does not propagate cpuset changes to tasks, stays exact by keeping the request).
"""

from __future__ import annotations

import errno as E
import os

from gputuned import errors
from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist
from gputuned.kernel import procfs
from gputuned.kernel.tasks import RT_POLICIES, check_scheduler, explain, where
from gputuned.sim.files import TreeFiles


def set_nice(tf: TreeFiles, pid: int, tid: int, nice: int) -> None:
    nice = max(-20, min(19, nice))  # kernel/sys.c set_one_prio() clamps, it does not refuse
    _edit_stat(tf, pid, tid, {procfs.NICE: nice})


def set_affinity(tf: TreeFiles, pid: int, tid: int, cpus: frozenset[int]) -> None:
    nr = tf.nr_cpu_ids()
    want = frozenset(c for c in cpus if 0 <= c < nr)  # the kernel reads nr_cpu_ids bits only
    if not want & _cpuset_of(tf, pid) & tf.online():
        raise explain(
            OSError(E.EINVAL, os.strerror(E.EINVAL)), where(pid, tid, "affinity"), cpus=cpus
        )
    _edit_status(
        tf,
        pid,
        tid,
        {"Cpus_allowed": format_mask(want, nr), "Cpus_allowed_list": format_cpulist(want)},
    )


def set_scheduler(tf: TreeFiles, pid: int, tid: int, policy: str, priority: int) -> None:
    number = check_scheduler(policy, priority)
    if policy in RT_POLICIES and _rt_refused(tf, pid):
        at = where(pid, tid, "scheduler")
        raise explain(OSError(E.EPERM, os.strerror(E.EPERM)), at, policy=policy)
    _edit_stat(tf, pid, tid, {procfs.POLICY: number, procfs.RT_PRIORITY: priority})


def thread_owner(tf: TreeFiles, tid: int) -> int | None:
    """The process holding thread ``tid``: a tree holds only /proc/PID/task/TID for threads
    other than the main one, where the kernel serves /proc/TID for every thread."""
    proc = tf.real("/proc")
    for name in sorted(os.listdir(proc), key=lambda n: int(n) if n.isdigit() else 0):
        if name.isdigit() and (proc / name / "task" / str(tid)).exists():
            return int(name)
    return None


def _rt_refused(tf: TreeFiles, pid: int) -> bool:
    """Whether the task's cpu cgroup is not the root one (CONFIG_RT_GROUP_SCHED refuses RT there).

    kernel/sched/syscalls.c __sched_setscheduler(): EPERM when the task group has no RT runtime,
    which is every non-root group unless cpu.rt_runtime_us was given some. On cgroup v2 a cgroup
    is its own task group when its parent enables cpu in cgroup.subtree_control.
    """
    rel = tf.cgroup_of(pid)
    mounts = tf.cgroup2_mounts()
    if not rel or rel == "/" or not mounts:
        return False
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts), 0, -1):
        group = "/".join([mounts[0], *parts[:depth]])
        parent = "/".join([mounts[0], *parts[: depth - 1]])
        if "cpu" in (tf.get(f"{parent}/cgroup.subtree_control") or "").split():
            runtime = (tf.get(f"{group}/cpu.rt_runtime_us") or "0").strip()
            return not (runtime.lstrip("-").isdigit() and int(runtime) != 0)
    return False


def _cpuset_of(tf: TreeFiles, pid: int) -> frozenset[int]:
    """cpuset.cpus.effective of the task's cgroup (the nearest captured ancestor's)."""
    rel = tf.cgroup_of(pid) or "/"
    mounts = tf.cgroup2_mounts()
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts), -1, -1):
        if not mounts:
            break
        eff = tf.get("/".join([mounts[0], *parts[:depth]]) + "/cpuset.cpus.effective")
        if eff is not None:
            return parse_cpulist(eff)
    return tf.online()


def _task_files(tf: TreeFiles, pid: int, tid: int, name: str) -> list[tuple[str, str]]:
    """(path, text) of the thread's ``name`` file, and of the process's for the main thread."""
    main = f"/proc/{pid}/task/{tid}/{name}"
    # /proc/PID/{stat,status} show the thread-group leader (fs/proc/array.c).
    paths = [main, f"/proc/{pid}/{name}"] if tid == pid else [main]
    out = []
    for path in paths:
        text = tf.get(path)
        if text is None:
            raise errors.TargetGone(
                f"set {where(pid, tid, name)}: not there (ESRCH); the thread has exited",
                path=main,
                errno=E.ESRCH,
            )
        out.append((path, text))
    return out


def _edit_stat(tf: TreeFiles, pid: int, tid: int, values: dict[int, int]) -> None:
    """Set numbered fields of stat; the priority field follows when it agreed before."""
    for path, text in _task_files(tf, pid, tid, "stat"):
        st = procfs.parse_stat(text)

        def now(n: int, st: procfs.Stat = st) -> int:
            return values.get(n, st.field(n))

        agreed = st.field(procfs.PRIORITY) == _priority(
            st.field(procfs.POLICY), st.field(procfs.NICE), st.field(procfs.RT_PRIORITY)
        )
        edits = dict(values)
        if agreed:
            edits[procfs.PRIORITY] = _priority(
                now(procfs.POLICY), now(procfs.NICE), now(procfs.RT_PRIORITY)
            )
        tf.put(path, procfs.edit_stat(text, edits))


def _priority(policy: int, nice: int, rt_priority: int) -> int:
    """stat field 18, task_prio(): -1 - rt_priority for fifo/rr, else 20 + nice."""
    return -1 - rt_priority if policy in (1, 2) else 20 + nice


def _edit_status(tf: TreeFiles, pid: int, tid: int, values: dict[str, str]) -> None:
    for path, text in _task_files(tf, pid, tid, "status"):
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            key, sep, rest = line.partition(":")
            if sep and key in values:
                pad = rest[: len(rest) - len(rest.lstrip(" \t"))]
                end = "\n" if line.endswith("\n") else ""
                lines[i] = f"{key}:{pad}{values[key]}{end}"
        tf.put(path, "".join(lines))
