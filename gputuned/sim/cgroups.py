"""cgroup v2 directories in a tree, as the kernel makes and changes them.

- ``mkdir``: a new cgroup comes with its interface files (the cpuset ones where the parent
  enables cpuset in ``cgroup.subtree_control``); ``rmdir``: EBUSY while it is in use;
- ``cgroup.subtree_control``: ``+name``/``-name``, with the kernel's refusals;
- ``cgroup.procs``: a process moves, with every one of its threads.

The cgroups are those under the tree's cgroup2 mounts (its ``/proc/mounts``). Not modelled:
interface files of controllers other than cpuset and cpu (``cpu.weight`` and ``cpu.max``
only), and cgroup events.
"""

from __future__ import annotations

import errno as E
import os

from gputuned.cpulist import parse_cpulist
from gputuned.sim import cpusets
from gputuned.sim.files import TreeFiles, fail

#: cgroup v2 controllers in the kernel's print order (enum order of include/linux/cgroup_subsys.h).
CONTROLLERS = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc", "dmem")
#: Files the kernel computes; a write is refused at open.
READ_ONLY = frozenset(
    {"cgroup.controllers", "cgroup.events", "cgroup.stat", "cpuset.cpus.effective"}
    | {"cpuset.mems.effective", "cpuset.cpus.exclusive.effective", "cpuset.cpus.isolated"}
)


def _ctrls(text: str | None) -> set[str]:
    return set((text or "").split())


def format_controllers(names: set[str]) -> str:
    """cgroup_print_ss_mask(): names in subsystem order, a newline only if any was printed."""
    ordered = [c for c in CONTROLLERS if c in names] + sorted(names - set(CONTROLLERS))
    return " ".join(ordered) + "\n" if ordered else ""


def mkdir(tf: TreeFiles, hpath: str) -> None:
    """kernel/cgroup/cgroup.c cgroup_mkdir(): a new cgroup comes with its interface files.

    Simplified: only the core files the tuners read and the cpuset files are made.
    """
    mount = tf.cgroup2_mount(hpath)
    if mount is None or hpath == mount:
        os.mkdir(tf.real(hpath))
        return
    parent = hpath.rsplit("/", 1)[0]
    exclusive = tf.has_exclusive(mount)
    os.mkdir(tf.real(hpath))
    sub = _ctrls(tf.get(f"{parent}/cgroup.subtree_control"))
    tf.put(f"{hpath}/cgroup.controllers", format_controllers(sub), create=True)
    tf.put(f"{hpath}/cgroup.procs", "", create=True)
    tf.put(f"{hpath}/cgroup.subtree_control", "", create=True)
    tf.put(f"{hpath}/cgroup.type", "domain\n", create=True)
    if "cpu" in sub:
        _add_cpu_files(tf, hpath)
    if "cpuset" in sub:
        _add_cpuset_files(tf, hpath, parent, exclusive=exclusive)
        cpusets.recompute(tf, mount)


def rmdir(tf: TreeFiles, hpath: str) -> None:
    """cgroup_destroy_locked(): EBUSY while it has processes or child cgroups.

    A valid partition is turned back into a member first (cpuset_css_killed()), so its CPUs
    return to the parent.
    """
    mount = tf.cgroup2_mount(hpath)
    real = tf.real(hpath)
    if mount is None or hpath == mount:
        os.rmdir(real)
        return
    if not real.is_dir():
        raise fail(E.ENOENT)
    if tf.children(hpath):
        raise fail(E.EBUSY, "the cgroup has child cgroups; remove them first")
    if tf.procs(hpath):
        raise fail(E.EBUSY, "processes are still in the cgroup (cgroup.procs); move them out")
    cpusets.recompute(tf, mount, override={hpath: "member"})
    for entry in os.scandir(real):
        os.unlink(entry.path)
    os.rmdir(real)


def _add_cpuset_files(tf: TreeFiles, cg: str, parent: str, *, exclusive: bool) -> None:
    files = {
        "cpuset.cpus": "\n",
        "cpuset.cpus.effective": tf.get(f"{parent}/cpuset.cpus.effective") or "\n",
        "cpuset.cpus.partition": "member\n",
        "cpuset.mems": "\n",
        "cpuset.mems.effective": tf.get(f"{parent}/cpuset.mems.effective") or "\n",
    }
    if exclusive:
        files |= {"cpuset.cpus.exclusive": "\n", "cpuset.cpus.exclusive.effective": "\n"}
    for name, text in files.items():
        if not tf.real(f"{cg}/{name}").exists():
            tf.put(f"{cg}/{name}", text, create=True)


#: The cpu controller's files gputuned writes, with the kernel's defaults (kernel/sched/core.c).
CPU_FILES = {"cpu.weight": "100\n", "cpu.max": "max 100000\n"}


def _add_cpu_files(tf: TreeFiles, cg: str) -> None:
    for name, text in CPU_FILES.items():
        if not tf.real(f"{cg}/{name}").exists():
            tf.put(f"{cg}/{name}", text, create=True)


def write_cpu_weight(tf: TreeFiles, _mount: str, cg: str, text: str) -> None:
    """cpu_weight_write_u64(): 1..10000 (CGROUP_WEIGHT_MIN..MAX), else ERANGE."""
    try:
        weight = int(text.strip())
    except ValueError as exc:
        raise fail(E.EINVAL, "write a number from 1 to 10000") from exc
    if not 1 <= weight <= 10000:
        raise fail(E.ERANGE)
    tf.put(f"{cg}/cpu.weight", f"{weight}\n")


def write_cpu_max(tf: TreeFiles, _mount: str, cg: str, text: str) -> None:
    """cpu_max_write() / cpu_period_quota_parse(): "max" or a quota in µs, then optionally the
    period (1 ms to 1 s); a quota under 1 ms is EINVAL. Printed as "QUOTA PERIOD"."""
    words = text.split()
    old = (tf.get(f"{cg}/cpu.max") or "max 100000").split()
    if not 1 <= len(words) <= 2:
        raise fail(E.EINVAL, "write 'max' or a quota in microseconds, then the period")
    try:
        period = int(words[1]) if len(words) == 2 else int(old[1])
        quota = None if words[0] == "max" else int(words[0])
    except ValueError as exc:
        raise fail(E.EINVAL) from exc
    if not 1000 <= period <= 1_000_000 or (quota is not None and quota < 1000):
        raise fail(E.EINVAL)
    tf.put(f"{cg}/cpu.max", f"{'max' if quota is None else quota} {period}\n")


def write_subtree_control(tf: TreeFiles, mount: str, cg: str, text: str) -> None:
    """cgroup_subtree_control_write(): "+name" / "-name" tokens, printed in kernel order."""
    enable: set[str] = set()
    disable: set[str] = set()
    for tok in text.split():
        if tok[0] not in "+-" or tok[1:] not in CONTROLLERS:
            raise fail(E.EINVAL, f"{tok!r}: write +name or -name of a controller")
        (enable if tok[0] == "+" else disable).add(tok[1:])
    if enable & disable:
        raise fail(E.EINVAL, "a controller is both enabled and disabled")
    missing = enable - _ctrls(tf.get(f"{cg}/cgroup.controllers"))
    if missing:
        raise fail(E.ENOENT, f"{' '.join(sorted(missing))} not in cgroup.controllers here")
    cur = _ctrls(tf.get(f"{cg}/cgroup.subtree_control"))
    enable, disable = enable - cur, disable & cur
    kids = tf.children(cg)
    for kid in kids:
        if disable & _ctrls(tf.get(f"{kid}/cgroup.subtree_control")):
            raise fail(E.EBUSY, f"{kid} still enables it for its own children")
    if enable and cg != mount and tf.procs(cg):
        raise fail(E.EBUSY, "the cgroup has processes (no internal processes rule)")
    had_exclusive = "cpuset" in disable and tf.has_exclusive(mount)
    if "cpuset" in disable:  # the children's cpusets go: partitions end first
        cpusets.recompute(tf, mount, override=dict.fromkeys(kids, "member"))
    new = (cur | enable) - disable
    tf.put(f"{cg}/cgroup.subtree_control", format_controllers(new))
    exclusive = tf.has_exclusive(mount)
    for kid in kids:
        tf.put(f"{kid}/cgroup.controllers", format_controllers(new))
        if "cpu" in enable:
            _add_cpu_files(tf, kid)
        if "cpu" in disable:
            for name in CPU_FILES:
                tf.real(f"{kid}/{name}").unlink(missing_ok=True)
        if "cpuset" in enable:
            _add_cpuset_files(tf, kid, cg, exclusive=exclusive)
        if "cpuset" in disable:
            for entry in os.scandir(tf.real(kid)):
                if entry.name.startswith("cpuset.") and entry.is_file():
                    os.unlink(entry.path)
    if had_exclusive and not tf.has_exclusive(mount):  # the last cgroup that showed it
        tf.remember_exclusive()
    if "cpuset" in enable:
        cpusets.recompute(tf, mount)


def write_procs(tf: TreeFiles, mount: str, cg: str, text: str) -> None:
    """__cgroup_procs_write(): the whole thread group moves to ``cg``.

    Updates the ``0::`` line of /proc/PID/cgroup and of every task, and both cgroup.procs
    files (kept in ascending order; the kernel prints css_set order). Simplified: tasks keep
    their CPU affinity (the kernel applies the new cpuset to them).
    """
    try:
        pid = int(text.strip())
    except ValueError as exc:
        raise fail(E.EINVAL, "write one process ID") from exc
    base = f"/proc/{pid}"
    if pid <= 0 or not tf.real(base).is_dir():
        raise fail(E.ESRCH, f"no process {pid} in this tree")
    if cg != mount and _ctrls(tf.get(f"{cg}/cgroup.subtree_control")):
        raise fail(E.EBUSY, "controllers are enabled in its cgroup.subtree_control")
    eff = tf.get(f"{cg}/cpuset.cpus.effective")
    if eff is not None and not parse_cpulist(eff):
        raise fail(E.ENOSPC, "its cpuset.cpus.effective is empty")
    rel = "/" + cg[len(mount) :].strip("/")
    old = tf.cgroup_of(pid)
    paths = [f"{base}/cgroup"]
    if tf.real(f"{base}/task").is_dir():
        paths += [f"{base}/task/{t}/cgroup" for t in sorted(os.listdir(tf.real(f"{base}/task")))]
    for path in paths:
        lines = (tf.get(path) or "").splitlines(keepends=True)
        tf.put(path, "".join(f"0::{rel}\n" if ln.startswith("0::") else ln for ln in lines))
    if old is not None and old != rel:
        _procs_edit(tf, mount if old == "/" else mount + old, pid, add=False)
    _procs_edit(tf, cg, pid, add=True)


def _procs_edit(tf: TreeFiles, cg: str, pid: int, *, add: bool) -> None:
    if tf.get(f"{cg}/cgroup.procs") is None:
        return  # not captured in this tree
    pids = [p for p in tf.procs(cg) if p != pid]
    if add:
        pids.insert(next((i for i, p in enumerate(pids) if p > pid), len(pids)), pid)
    tf.put(f"{cg}/cgroup.procs", "".join(f"{p}\n" for p in pids))
