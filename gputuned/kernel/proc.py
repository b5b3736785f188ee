"""Processes and threads read from /proc/PID (proc(5)), through the kernel port so trees can
hold them; the formats are parsed by :mod:`gputuned.kernel.procfs`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.procfs import NICE, POLICY, RT_PRIORITY, cgroup_path, parse_stat, parse_status

#: sched policies by number (include/uapi/linux/sched.h SCHED_*).
POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}
#: Bytes of /proc/PID/cmdline read: any user writes their own command line, up to 2 MiB, and
#: rules' regexes are searched in it (tuners/cmdmatch.py; issue 14, finding 5).
CMDLINE_BYTES = 4096


@dataclass(frozen=True)
class ThreadInfo:
    tid: int
    comm: str
    nice: int
    policy: str
    rt_priority: int
    affinity: frozenset[int]


@dataclass(frozen=True)
class ProcInfo:
    """One process. ``start_time`` (clock ticks since boot) plus ``pid`` is its identity."""

    pid: int
    start_time: int
    comm: str
    exe: str | None
    cmdline: str  # arguments joined by spaces; the first CMDLINE_BYTES bytes only
    cgroup: str  # the cgroup v2 path ("0::/..." line); "" when none
    threads: tuple[ThreadInfo, ...]
    ppid: int = 0
    #: Real and effective user ID (status "Uid:"), when read (``owner=True``); else None.
    uid: int | None = None
    euid: int | None = None
    #: A kernel thread (PF_KTHREAD): never a server, never to be registered.
    kernel_thread: bool = False
    #: Read with ``brief``: exe, cgroup (and the user IDs) were not read.
    brief: bool = False


def list_pids(kernel: Kernel) -> list[int]:
    return sorted(int(n) for n in kernel.listdir("/proc") if n.isdigit())


def read_thread(kernel: Kernel, base: str, tid: int) -> ThreadInfo:
    """One thread from ``base`` = /proc/PID/task/TID."""
    st = parse_stat(kernel.read_text(f"{base}/stat"))
    policy = st.field(POLICY)
    allowed = parse_status(kernel.read_text(f"{base}/status")).get("Cpus_allowed_list", "")
    return ThreadInfo(
        tid,
        st.comm,
        st.field(NICE),
        POLICIES.get(policy, str(policy)),
        st.field(RT_PRIORITY),
        parse_cpulist(allowed),
    )


def read_process(
    kernel: Kernel,
    pid: int,
    *,
    threads: bool = True,
    brief: bool = False,
    owner: bool = False,
    tids: Iterable[int] | None = None,
) -> ProcInfo:
    """Read a process and all its threads; :class:`TargetGone` if it exits meanwhile.

    ``threads=False`` skips the per-thread files; ``brief`` also skips exe and cgroup (exe
    None, cgroup ""): enough to match comm and cmdline rules across every process cheaply.
    ``owner`` also reads the user IDs (one more file, /proc/PID/status). ``tids``: only these
    threads and the main one, not every thread (the daemon's answer to a new thread reads that
    thread, not all of them again: issue 14, finding 6); those that have ended are left out.
    """
    base = f"/proc/{pid}"
    st = parse_stat(kernel.read_text(f"{base}/stat"))
    uid = euid = None
    if owner:
        uid, euid = read_uids(kernel, pid)
    exe: str | None = None
    cgroup = ""
    if not brief:
        try:
            exe = kernel.readlink(f"{base}/exe")
        except errors.HostError:
            exe = None  # kernel threads have no exe; another user's needs privilege
        cgroup = cgroup_path(kernel.read_text(f"{base}/cgroup")) or ""
    raw = kernel.read_bytes(f"{base}/cmdline", 0, CMDLINE_BYTES)
    cmdline = raw.decode("utf-8", errors="replace").replace("\0", " ").strip()
    found = []
    if threads:
        listed = (
            sorted({pid, *tids})
            if tids is not None
            else sorted(int(t) for t in kernel.listdir(f"{base}/task") if t.isdigit())
        )
        for tid in listed:
            try:
                found.append(read_thread(kernel, f"{base}/task/{tid}", tid))
            except errors.TargetGone:
                continue  # the thread exited between listing and reading
    return ProcInfo(
        pid,
        st.start_time,
        st.comm,
        exe,
        cmdline,
        cgroup,
        tuple(found),
        ppid=st.ppid,
        uid=uid,
        euid=euid,
        kernel_thread=st.kernel_thread,
        brief=brief,
    )


def read_uids(kernel: Kernel, pid: int) -> tuple[int | None, int | None]:
    """Real and effective user ID of a process (proc(5) status, "Uid:" real effective saved fs)."""
    ids = parse_status(kernel.read_text(f"/proc/{pid}/status")).get("Uid", "").split()[:2]
    if len(ids) == 2 and all(i.isdigit() for i in ids):
        return int(ids[0]), int(ids[1])
    return None, None


def read_identity(kernel: Kernel, pid: int) -> tuple[int, int, str, bool]:
    """(start time, parent PID, comm, kernel thread) of ``pid`` from one read of its stat."""
    st = parse_stat(kernel.read_text(f"/proc/{pid}/stat"))
    return st.start_time, st.ppid, st.comm, st.kernel_thread


def ancestor_in(kernel: Kernel, pid: int, starts: Mapping[int, int]) -> int | None:
    """The nearest ancestor of ``pid`` that is in ``starts`` (PID -> start time) as the same
    process, by start time (PIDs are reused). None: none is, or the walk ended first, at init,
    at a process that is gone, after 64 generations."""
    at = pid
    for _ in range(64):
        try:
            ppid = read_identity(kernel, at)[1]
        except errors.GputunedError:
            return None
        if ppid <= 1:
            return None
        if ppid in starts:
            try:
                if read_identity(kernel, ppid)[0] == starts[ppid]:
                    return ppid
            except errors.GputunedError:
                return None
        at = ppid
    return None


def iter_processes(
    kernel: Kernel, *, threads: bool = False, brief: bool = False, owner: bool = False
) -> list[ProcInfo]:
    """Every process readable now (without threads unless asked); exiting ones are skipped."""
    out = []
    for pid in list_pids(kernel):
        try:
            out.append(read_process(kernel, pid, threads=threads, brief=brief, owner=owner))
        except (errors.TargetGone, errors.PermissionDenied):
            continue
    return out


def user_name(kernel: Kernel, uid: int) -> str | None:
    """The account name of ``uid`` (the reverse of :meth:`Kernel.user_id`), None when there is
    none: the machine asks the system's user database (NSS: /etc/passwd, LDAP, ...); a tree
    has only its /etc/passwd (passwd(5): name:password:UID:GID:...)."""
    if kernel.runs_gputuned:
        import pwd

        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return None
    for line in (kernel.read_optional("/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit() and int(fields[2]) == uid:
            return fields[0]
    return None
