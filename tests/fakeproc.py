"""Fake processes in a host tree, in the formats of proc(5), for tests of process tuning.

``add_process(root, 4242, comm="vllm", cmdline=[...], exe="/usr/bin/python3", start_time=9000)``
writes ``/proc/4242/{stat,status,cmdline,comm,cgroup,exe}`` and ``task/TID/{stat,status,comm,
cgroup}`` for the main thread (TID = PID) and every extra thread in ``threads``. On a tree with a
cgroup v2 mount the process's cgroup is made where missing (as the kernel makes cgroups, through
``TreeModel.mkdir``, so a move out and back works) and the PID joins its ``cgroup.procs``. Field
layouts are the kernel's (fs/proc/array.c do_task_stat / proc_pid_status), values plausible for a
Python process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist
from gputuned.sim.model import TreeModel

POLICY_RT = (1, 2)  # SCHED_FIFO, SCHED_RR


def _nr_cpu_ids(root: Path) -> int:
    for name in ("possible", "online"):
        f = root / "sys/devices/system/cpu" / name
        if f.is_file() and f.read_text().strip():
            return max(parse_cpulist(f.read_text())) + 1
    return 1


def _cgroup2_mount(root: Path) -> str | None:
    mounts = TreeModel(root).cgroup2_mounts()
    return mounts[0] if mounts else None


def stat_line(
    pid: int,
    tid: int,
    comm: str,
    *,
    start_time: int,
    nthreads: int,
    nice: int,
    policy: int,
    rt_priority: int,
    ppid: int = 1,
    flags: int = 4194560,
) -> str:
    """52 fields, as /proc/PID/task/TID/stat prints them."""
    prio = -1 - rt_priority if policy in POLICY_RT else 20 + nice
    fields = [
        tid, f"({comm})", "S", ppid, pid, pid, 0, -1, flags,  # 1-9: pid comm state ppid pgrp session tty tpgid flags
        52831, 0, 12, 0, 934, 211, 0, 0,  # 10-17: minflt cminflt majflt cmajflt utime stime cutime cstime
        prio, nice, nthreads, 0, start_time,  # 18-22: priority nice num_threads itrealvalue starttime
        2419818496, 98304, 18446744073709551615,  # 23-25: vsize rss rsslim
        94863721390080, 94863724152129, 140726702342432, 0, 0,  # 26-30: startcode endcode startstack kstkesp kstkeip
        0, 0, 16781312, 134235650, 0, 0, 0, 17, 3,  # 31-39: signal blocked sigignore sigcatch wchan nswap cnswap exit_signal processor
        rt_priority, policy, 0, 0, 0,  # 40-44: rt_priority policy delayacct_blkio_ticks guest_time cguest_time
        94863725155824, 94863725311648, 94863756001280,  # 45-47: start_data end_data start_brk
        140726702347301, 140726702347395, 140726702347395, 140726702350285, 0,  # 48-52: arg/env start/end exit_code
    ]  # fmt: skip
    assert len(fields) == 52
    return " ".join(str(f) for f in fields) + "\n"


def status_text(
    pid: int,
    tid: int,
    comm: str,
    *,
    nthreads: int,
    cpus: frozenset[int],
    nr_cpus: int,
    ppid: int = 1,
    uid: int = 0,
) -> str:
    """/proc/PID/task/TID/status in the kernel's order, tab after each key."""
    mems = ",".join(["00000000"] * 31 + ["00000001"])
    rows = [
        ("Name", comm),
        ("Umask", "0022"),
        ("State", "S (sleeping)"),
        ("Tgid", pid),
        ("Ngid", 0),
        ("Pid", tid),
        ("PPid", ppid),
        ("TracerPid", 0),
        ("Uid", f"{uid}\t{uid}\t{uid}\t{uid}"),
        ("Gid", "0\t0\t0\t0"),
        ("FDSize", 64),
        ("Groups", " "),
        ("NStgid", pid),
        ("NSpid", tid),
        ("NSpgid", pid),
        ("NSsid", pid),
        ("Kthread", 0),
        ("VmPeak", " 2363104 kB"),
        ("VmSize", " 2363104 kB"),
        ("VmRSS", "   98304 kB"),
        ("Threads", nthreads),
        ("SigQ", "0/96365"),
        ("SigBlk", "0000000000000000"),
        ("SigIgn", "0000000001000000"),
        ("SigCgt", "0000000100004002"),
        ("CapEff", "000001ffffffffff"),
        ("NoNewPrivs", 0),
        ("Seccomp", 0),
        ("Cpus_allowed", format_mask(cpus, nr_cpus)),
        ("Cpus_allowed_list", format_cpulist(cpus)),
        ("Mems_allowed", mems),
        ("Mems_allowed_list", 0),
        ("voluntary_ctxt_switches", 1523),
        ("nonvoluntary_ctxt_switches", 87),
    ]
    return "".join(f"{k}:\t{v}\n" for k, v in rows)


def add_process(
    root: Path,
    pid: int,
    *,
    comm: str,
    cmdline: list[str],
    exe: str | None,
    start_time: int,
    threads: list[int] | None = None,
    cgroup: str = "/user.slice/user-0.slice/session-1.scope",
    nice: int = 0,
    policy: int = 0,
    rt_priority: int = 0,
    cpus: str = "0-15",
    ppid: int = 1,
    uid: int = 0,
) -> None:
    """Add process ``pid`` to the tree at ``root``; ``threads`` are TIDs besides the main one.
    ``ppid``: its parent; ``uid``: the account it runs as (real, effective, saved, fs)."""
    comm = comm[:15]  # TASK_COMM_LEN - 1
    tids = [pid, *sorted(t for t in threads or [] if t != pid)]
    nr = _nr_cpu_ids(root)
    allowed = parse_cpulist(cpus)
    base = root / "proc" / str(pid)
    base.mkdir(parents=True)
    cg_line = f"0::{cgroup}\n"
    for tid in tids:
        tdir = base / "task" / str(tid)
        tdir.mkdir(parents=True)
        kw = {"start_time": start_time, "nthreads": len(tids)}
        sched = {"nice": nice, "policy": policy, "rt_priority": rt_priority}
        (tdir / "stat").write_text(stat_line(pid, tid, comm, **kw, **sched, ppid=ppid))
        (tdir / "status").write_text(
            status_text(
                pid, tid, comm, nthreads=len(tids), cpus=allowed, nr_cpus=nr, ppid=ppid, uid=uid
            )
        )
        (tdir / "comm").write_text(comm + "\n")
        (tdir / "cgroup").write_text(cg_line)
    for name in ("stat", "status", "comm"):
        (base / name).write_bytes((base / "task" / str(pid) / name).read_bytes())
    (base / "cgroup").write_text(cg_line)
    (base / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
    if exe is not None:
        (base / "exe").symlink_to(exe)
    mount = _cgroup2_mount(root)
    if mount is None:
        return
    tk = TreeModel(root)
    cg = mount
    for part in [p for p in cgroup.split("/") if p]:
        cg = f"{cg}/{part}"
        if not tk.real(cg).is_dir():
            tk.mkdir(cg)
    procs = tk.real(f"{cg}/cgroup.procs")
    have = [int(p) for p in procs.read_text().split()] if procs.is_file() else []
    procs.write_text("".join(f"{p}\n" for p in sorted({*have, pid})))


def remove_process(root: Path, pid: int) -> None:
    """The process exits: its /proc directory goes, and it leaves every cgroup.procs."""
    shutil.rmtree(root / "proc" / str(pid))
    for procs in root.joinpath("sys/fs/cgroup").rglob("cgroup.procs"):
        pids = procs.read_text().split()
        if str(pid) in pids:
            pids.remove(str(pid))
            procs.write_text("".join(f"{p}\n" for p in pids))


def add_user(root: Path, name: str, uid: int) -> None:
    """An account in the tree's /etc/passwd (passwd(5)), as match.user looks it up."""
    passwd = root / "etc/passwd"
    passwd.parent.mkdir(parents=True, exist_ok=True)
    have = passwd.read_text() if passwd.is_file() else "root:x:0:0:root:/root:/bin/bash\n"
    passwd.write_text(have + f"{name}:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin\n")


def add_thread(
    root: Path, pid: int, tid: int, *, cpus: str, nice: int = 0, policy: int = 0
) -> None:
    """Process ``pid`` starts thread ``tid`` with what clone copied from the thread that made it
    (``cpus``, ``nice``, ``policy``: kernel/fork.c)."""
    base = root / "proc" / str(pid)
    stat = (base / "stat").read_text()
    comm, fields = stat.partition("(")[2].rpartition(")")[0], stat.rpartition(")")[2].split()
    start, ppid = int(fields[22 - 3]), int(fields[4 - 3])
    tids = [t for t in (base / "task").iterdir() if t.name.isdigit()]
    tdir = base / "task" / str(tid)
    tdir.mkdir()
    n = len(tids) + 1
    sched = {"nice": nice, "policy": policy, "rt_priority": 0}
    tdir.joinpath("stat").write_text(
        stat_line(pid, tid, comm, start_time=start, nthreads=n, ppid=ppid, **sched)
    )
    tdir.joinpath("status").write_text(
        status_text(
            pid,
            tid,
            comm,
            nthreads=n,
            cpus=parse_cpulist(cpus),
            nr_cpus=_nr_cpu_ids(root),
            ppid=ppid,
        )
    )
    tdir.joinpath("comm").write_text(comm + "\n")
    tdir.joinpath("cgroup").write_text((base / "cgroup").read_text())


def remove_thread(root: Path, pid: int, tid: int) -> None:
    """Thread ``tid`` of process ``pid`` exits."""
    shutil.rmtree(root / "proc" / str(pid) / "task" / str(tid))
