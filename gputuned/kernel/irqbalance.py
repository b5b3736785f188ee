"""Talking to a running irqbalance through its control socket.

irqbalance only keeps off the CPUs in /sys/devices/system/cpu/isolated and nohz_full (and its
IRQBALANCE_BANNED_CPUS); it knows nothing of cgroup partitions and would move IRQs back onto
them. Its socket (irqbalance.c ``sock_handle``; root peers only, SO_PEERCRED) takes:

- ``setup``: answers ``SLEEP <s> [IRQ <n> LOAD <l> DIFF <d> CLASS <c> ...] BANNED <hex mask>``;
- ``settings cpus <cpulist>`` / ``settings cpus NULL``: CPUs it must not use (NULL: back to its
  own configuration);
- ``settings ban irqs <n> <n> ...`` / ``settings ban irqs NONE``: IRQs it must leave alone.

The socket is ``/run/irqbalance/irqbalance<PID>.sock`` (1.8+), or the abstract
``@irqbalance<PID>.sock`` on older versions. On a tree the first form is used under its root,
so tests can stand a fake irqbalance there.
"""

from __future__ import annotations

import errno as E
import os
import re
import socket

from gputuned import errors
from gputuned.cpulist import format_cpulist, parse_mask
from gputuned.kernel import Kernel

SOCKET_DIR = "/run/irqbalance"
_TIMEOUT_S = 2.0
_MAX_REPLY = 1 << 16


def _address(kernel: Kernel, pid: int) -> str:
    hpath = f"{SOCKET_DIR}/irqbalance{pid}.sock"
    if kernel.exists(hpath):
        return str(kernel.path(hpath))
    if kernel.abstract_sockets:
        return f"\0irqbalance{pid}.sock"
    raise errors.TargetGone(f"irqbalance {pid}: no control socket at {hpath}", path=hpath)


def _connect(s: socket.socket, addr: str) -> None:
    """connect(2), also to a path longer than sun_path's 108 bytes (deep --root trees): go
    through /proc/self/fd/N/NAME of the socket's directory instead."""
    if addr.startswith("\0") or len(addr.encode()) < 100:
        s.connect(addr)
        return
    parent, _, name = addr.rpartition("/")
    fd = os.open(parent, os.O_PATH | os.O_DIRECTORY)
    try:
        s.connect(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def request(kernel: Kernel, pid: int, message: str) -> str:
    """Send one command; return the reply (empty for commands that have none)."""
    where = f"irqbalance {pid} socket"
    addr = _address(kernel, pid)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(_TIMEOUT_S)
            _connect(s, addr)
            s.sendall(message.encode())
            s.shutdown(socket.SHUT_WR)
            chunks = []
            total = 0
            while total < _MAX_REPLY:
                b = s.recv(4096)
                if not b:
                    break
                chunks.append(b)
                total += len(b)
    except TimeoutError:
        raise errors.HostError(
            f"{where}: no answer in {_TIMEOUT_S:g} s; is irqbalance hung?", errno=E.ETIMEDOUT
        ) from None
    except OSError as exc:
        if exc.errno in (E.ECONNREFUSED, E.ENOENT):
            raise errors.TargetGone(f"{where}: gone ({exc.strerror}); irqbalance exited") from exc
        raise errors.HostError(f"{where}: {exc.strerror or exc}", errno=exc.errno) from exc
    return b"".join(chunks).decode(errors="replace")


def read_settings(kernel: Kernel, pid: int) -> tuple[frozenset[int], tuple[int, ...]]:
    """(banned CPUs, IRQs banned through the socket) as irqbalance reports them."""
    reply = request(kernel, pid, "setup")
    m = re.search(r"BANNED\s+([0-9a-fA-F,]+)", reply)
    banned = parse_mask(m.group(1)) if m else frozenset()
    irqs = tuple(sorted(int(n) for n in re.findall(r"IRQ\s+(\d+)", reply)))
    return banned, irqs


def ban_cpus(kernel: Kernel, pid: int, cpus: frozenset[int]) -> None:
    request(kernel, pid, f"settings cpus {format_cpulist(cpus) if cpus else 'NULL'}")


def ban_irqs(kernel: Kernel, pid: int, irqs: tuple[int, ...]) -> None:
    request(kernel, pid, "settings ban irqs " + (" ".join(map(str, irqs)) if irqs else "NONE"))
