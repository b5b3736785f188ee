"""Run inside the container, under gputuned.service's own sandbox: can the daemon still do its job?

The e2e test starts this as ``gputuned-e2e-probe.service``, a oneshot unit whose [Service]
section is the installed gputuned.service's sandboxing, line for line. It tries each kind of
access the daemon needs on the workload process (another user's, like a real inference server)
and a few the sandbox must refuse, and prints one JSON object: check -> "ok" or the error.

Usage: sandbox_probe.py WORKLOAD_PID
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
SO_RCVBUFFORCE = 33


def check(results: dict[str, str], name: str, fn: Callable[[], object]) -> None:
    try:
        value = fn()
    except Exception as exc:  # the point is to report every failure, whatever its type
        results[name] = f"{type(exc).__name__}: {exc}"
    else:
        results[name] = "ok" if value is None else f"ok: {value}"


def write_and_remove(path: str) -> None:
    p = Path(path)
    p.write_text("probe\n")
    p.unlink()


def proc_connector() -> str:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    with s:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)  # CAP_NET_ADMIN
        s.bind((os.getpid(), CN_IDX_PROC))
        op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
        s.send(struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, os.getpid()) + cn)
        return "socket, SO_RCVBUFFORCE, bind and LISTEN accepted"


def renice(pid: int) -> str:
    old = os.getpriority(os.PRIO_PROCESS, pid)
    os.setpriority(os.PRIO_PROCESS, pid, -3)  # below 0: CAP_SYS_NICE
    got = os.getpriority(os.PRIO_PROCESS, pid)
    os.setpriority(os.PRIO_PROCESS, pid, old)
    return f"{old} -> {got} -> {old}"


def pin(pid: int) -> str:
    old = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, {min(old)})
    got = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, old)
    return f"{sorted(old)} -> {sorted(got)}"


def scheduler(pid: int) -> str:
    os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
    got = os.sched_getscheduler(pid)
    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    return f"SCHED_BATCH={got == os.SCHED_BATCH}"


def pidfd(pid: int) -> None:
    os.close(os.pidfd_open(pid))


def pci_config() -> str:
    dev = sorted(Path("/sys/bus/pci/devices").iterdir())[0]
    n = len((dev / "config").read_bytes())  # past 64 bytes only with CAP_SYS_ADMIN
    return f"{dev.name}: {n} bytes"


def cgroup_dir() -> None:
    for mnt in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if Path(mnt, "cgroup.procs").exists():
            d = Path(mnt, "gputuned-e2e-probe")
            d.mkdir()
            d.rmdir()
            return
    raise FileNotFoundError("no cgroup v2 mount")


def ctypes_callback() -> None:
    # libffi closures: must not need writable+executable memory (MemoryDenyWriteExecute=yes)
    ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)()


def imports() -> None:
    import pydantic_core  # noqa: F401
    import pynvml  # noqa: F401
    import pyudev  # noqa: F401

    import gputuned.daemon  # noqa: F401


def metrics_listener() -> str:
    """[daemon] metrics_port: a TCP listener on loopback (RestrictAddressFamilies= AF_INET)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        return f"port {s.getsockname()[1]}"


def sock_diag() -> None:
    """The metrics port asks NETLINK_SOCK_DIAG who owns a local scraper's socket."""
    socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4).close()


def chown_to_a_group() -> None:
    """[daemon] control_group: control.sock is given to the group (CAP_CHOWN)."""
    path = "/run/gputuned/.probe-chown"
    Path(path).write_text("")
    try:
        os.chown(path, -1, 65534)
    finally:
        os.unlink(path)


def packet_socket() -> None:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()


def main() -> int:
    pid = int(sys.argv[1])
    r: dict[str, str] = {}
    # what the daemon must be able to do
    check(r, "write /etc/gputuned", lambda: write_and_remove("/etc/gputuned/.probe"))
    check(r, "write /run/gputuned", lambda: write_and_remove("/run/gputuned/.probe"))
    check(r, "unix socket in /run/gputuned", unix_socket)
    check(r, "proc connector", proc_connector)
    check(r, "readlink /proc/PID/exe", lambda: os.readlink(f"/proc/{pid}/exe"))
    check(r, "setpriority", lambda: renice(pid))
    check(r, "sched_setaffinity", lambda: pin(pid))
    check(r, "sched_setscheduler", lambda: scheduler(pid))
    check(r, "pidfd_open", lambda: pidfd(pid))
    check(r, "PCI config past 64 bytes", pci_config)
    check(r, "cgroup mkdir/rmdir", cgroup_dir)
    check(r, "ctypes callback", ctypes_callback)
    check(r, "imports", imports)
    check(r, "TCP listener on 127.0.0.1 (metrics_port)", metrics_listener)
    check(r, "sock_diag netlink socket (metrics_allow)", sock_diag)
    check(r, "chown to a group (control_group)", chown_to_a_group)
    # what the sandbox must refuse
    check(r, "write /etc (must fail)", lambda: write_and_remove("/etc/gputuned-probe"))
    check(r, "write /root (must fail)", lambda: write_and_remove("/root/gputuned-probe"))
    check(r, "AF_PACKET socket (must fail)", packet_socket)
    json.dump(r, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def unix_socket() -> None:
    path = "/run/gputuned/probe.sock"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with s:
        s.bind(path)
        s.listen(1)
    os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
