"""Processes and threads read from /proc/PID (proc(5)), through Host so trees can hold them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.host.fs import Host

#: sched policies by number (include/uapi/linux/sched.h SCHED_*).
POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}
#: include/linux/sched.h: the flags field (9) of /proc/PID/stat for a kernel thread.
PF_KTHREAD = 0x00200000
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
    kernel: bool = False
    #: Read with ``brief``: exe, cgroup (and the user IDs) were not read.
    brief: bool = False


def list_pids(host: Host) -> list[int]:
    return sorted(int(n) for n in host.listdir("/proc") if n.isdigit())


def _stat_fields(text: str) -> tuple[str, list[str]]:
    # comm is in parentheses and may itself contain spaces and ')': split at the last ')'.
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def read_thread(host: Host, base: str, tid: int) -> ThreadInfo:
    """One thread from ``base`` = /proc/PID/task/TID."""
    comm, f = _stat_fields(host.read_text(f"{base}/stat"))
    # After comm, fields are numbered from 3 (state): nice is field 19, rt_priority 40, policy 41.
    nice, rt_prio, policy = int(f[19 - 3]), int(f[40 - 3]), int(f[41 - 3])
    allowed = ""
    for line in host.read_text(f"{base}/status").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            allowed = line.split(":", 1)[1]
    return ThreadInfo(
        tid, comm, nice, POLICIES.get(policy, str(policy)), rt_prio, parse_cpulist(allowed)
    )


def read_process(
    host: Host,
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
    comm, f = _stat_fields(host.read_text(f"{base}/stat"))
    start = int(f[22 - 3])
    uid = euid = None
    if owner:
        uid, euid = read_uids(host, pid)
    exe: str | None = None
    cgroup = ""
    if not brief:
        try:
            exe = host.readlink(f"{base}/exe")
        except errors.HostError:
            exe = None  # kernel threads have no exe; another user's needs privilege
        for line in host.read_text(f"{base}/cgroup").splitlines():
            if line.startswith("0::"):
                cgroup = line[3:]
    raw = host.read_bytes(f"{base}/cmdline", 0, CMDLINE_BYTES)
    cmdline = raw.decode("utf-8", errors="replace").replace("\0", " ").strip()
    found = []
    if threads:
        listed = (
            sorted({pid, *tids})
            if tids is not None
            else sorted(int(t) for t in host.listdir(f"{base}/task") if t.isdigit())
        )
        for tid in listed:
            try:
                found.append(read_thread(host, f"{base}/task/{tid}", tid))
            except errors.TargetGone:
                continue  # the thread exited between listing and reading
    return ProcInfo(
        pid,
        start,
        comm,
        exe,
        cmdline,
        cgroup,
        tuple(found),
        ppid=int(f[4 - 3]),
        uid=uid,
        euid=euid,
        kernel=bool(int(f[9 - 3]) & PF_KTHREAD),
        brief=brief,
    )


def read_uids(host: Host, pid: int) -> tuple[int | None, int | None]:
    """Real and effective user ID of a process (proc(5) status, "Uid:" real effective saved fs)."""
    for line in host.read_text(f"/proc/{pid}/status").splitlines():
        if line.startswith("Uid:"):
            ids = line.split()[1:3]
            if len(ids) == 2 and all(i.isdigit() for i in ids):
                return int(ids[0]), int(ids[1])
    return None, None


def read_identity(host: Host, pid: int) -> tuple[int, int, str, bool]:
    """(start time, parent PID, comm, kernel thread) of ``pid`` from one read of its stat."""
    comm, f = _stat_fields(host.read_text(f"/proc/{pid}/stat"))
    return int(f[22 - 3]), int(f[4 - 3]), comm, bool(int(f[9 - 3]) & PF_KTHREAD)


def iter_processes(
    host: Host, *, threads: bool = False, brief: bool = False, owner: bool = False
) -> list[ProcInfo]:
    """Every process readable now (without threads unless asked); exiting ones are skipped."""
    out = []
    for pid in list_pids(host):
        try:
            out.append(read_process(host, pid, threads=threads, brief=brief, owner=owner))
        except (errors.TargetGone, errors.PermissionDenied):
            continue
    return out


def user_id(host: Host, name: str) -> int | None:
    """The user ID of account ``name``, None when the host has no such account.

    The machine asks the system's user database (NSS: /etc/passwd, LDAP, ...); a tree has only
    its /etc/passwd (passwd(5): name:password:UID:GID:...).
    """
    if host.live:
        import pwd

        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None
    text = host.read_optional("/etc/passwd") or ""
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] == name and fields[2].isdigit():
            return int(fields[2])
    return None
