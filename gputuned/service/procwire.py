"""The proc connector's wire format: netlink and connector headers, ``struct proc_event``, and
the LISTEN/IGNORE request (include/uapi/linux/{netlink,connector,cn_proc}.h;
drivers/connector/cn_proc.c). :mod:`gputuned.service.procwatch` turns these into process events."""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11  # include/uapi/linux/netlink.h; Python's socket module does not name it
CN_IDX_PROC = 0x1  # include/uapi/linux/connector.h
CN_VAL_PROC = 0x1
NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE = 1, 2, 3  # include/uapi/linux/netlink.h
SO_RCVBUFFORCE = 33  # include/uapi/asm-generic/socket.h: SO_RCVBUF past rmem_max (CAP_NET_ADMIN)

# enum proc_cn_mcast_op and enum proc_cn_event, include/uapi/linux/cn_proc.h
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_NONE = 0x00000000  # the connector's reply to LISTEN/IGNORE ("ack")
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXEC = 0x00000002
PROC_EVENT_UID = 0x00000004
PROC_EVENT_GID = 0x00000040
PROC_EVENT_SID = 0x00000080
PROC_EVENT_PTRACE = 0x00000100
PROC_EVENT_COMM = 0x00000200
PROC_EVENT_NONZERO_EXIT = 0x20000000  # a filter bit for struct proc_input; never sent as `what`
PROC_EVENT_COREDUMP = 0x40000000
PROC_EVENT_EXIT = 0x80000000

#: struct nlmsghdr: len, type, flags, seq, pid. Host byte order, no padding (netlink(7)).
NLMSGHDR = struct.Struct("=IHHII")
#: struct cn_msg: id.idx, id.val, seq, ack, len, flags (connector.h; 20 bytes, BUILD_BUG_ON'd).
CN_MSG = struct.Struct("=IIIIHH")
#: struct proc_event up to its union: what, cpu, timestamp_ns (CLOCK_MONOTONIC, ktime_get_ns).
PROC_EVENT_HEAD = struct.Struct("=IIQ")
#: The union's largest members (exit, comm) are 24 bytes: sizeof(struct proc_event) == 40.
PROC_EVENT_SIZE = PROC_EVENT_HEAD.size + 24
# Union members. __kernel_pid_t is a signed int; exit_code and exit_signal are __u32 (a thread's
# exit_signal is -1, so it reads 0xffffffff).
_FORK = struct.Struct("=iiii")  # parent_pid parent_tgid child_pid child_tgid
_IDS = struct.Struct("=ii")  # process_pid process_tgid: exec, sid, and the start of every other
_EXIT = struct.Struct("=iiIIii")  # process_pid process_tgid exit_code exit_signal parent_pid/tgid
_COMM = struct.Struct("=ii16s")
_ACK = struct.Struct("=I")


@dataclass(frozen=True)
class ConnectorEvent:
    """One ``struct proc_event`` as the kernel sent it, before it becomes a :class:`ProcEvent`.

    Kernel names map as cn_proc.h's comment says: ``process_pid``/``child_pid`` is the thread
    id (``tid`` here), ``*_tgid`` the process id. ``ack`` is the enclosing cn_msg's ``ack``
    (the request's ``ack + 1`` in a reply to LISTEN) and ``err`` a reply's positive errno.
    """

    what: int
    cpu: int
    timestamp_ns: int
    tid: int = 0
    tgid: int = 0
    parent_tid: int = 0
    parent_tgid: int = 0
    exit_code: int = 0
    exit_signal: int = 0
    comm: str = ""
    err: int = 0
    ack: int = 0


def parse_datagram(data: bytes | bytearray | memoryview) -> list[ConnectorEvent]:
    """Every proc connector event in one datagram from a ``NETLINK_CONNECTOR`` socket.

    The kernel sends one event per datagram (``cn_netlink_send_mult``: one nlmsghdr of type
    NLMSG_DONE around one cn_msg), but netlink allows several messages, NLMSG_ALIGN'ed, so all
    are read. Messages of other connector users (another ``cb_id``), netlink errors and
    truncated messages are skipped: none is ours to act on.
    """
    out: list[ConnectorEvent] = []
    view = memoryview(data)
    off = 0
    while off + NLMSGHDR.size <= len(view):
        nl_len, nl_type, _flags, _seq, _port = NLMSGHDR.unpack_from(view, off)
        if nl_len < NLMSGHDR.size or off + nl_len > len(view):
            log.debug("proc connector: truncated netlink message skipped")
            break
        body = view[off + NLMSGHDR.size : off + nl_len]
        off += (nl_len + 3) & ~3  # NLMSG_ALIGN
        if nl_type in (NLMSG_NOOP, NLMSG_ERROR) or len(body) < CN_MSG.size:
            continue
        idx, val, _cseq, ack, length, _cflags = CN_MSG.unpack_from(body)
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or length < PROC_EVENT_SIZE:
            continue
        if CN_MSG.size + PROC_EVENT_SIZE > len(body):
            log.debug("proc connector: cn_msg shorter than its len; skipped")
            continue
        out.append(_parse_event(body[CN_MSG.size : CN_MSG.size + PROC_EVENT_SIZE], ack))
    return out


def _parse_event(ev: memoryview, ack: int) -> ConnectorEvent:
    what, cpu, ts = PROC_EVENT_HEAD.unpack_from(ev)
    u = ev[PROC_EVENT_HEAD.size :]
    if what == PROC_EVENT_FORK:
        ppid, ptgid, cpid, ctgid = _FORK.unpack_from(u)
        return ConnectorEvent(what, cpu, ts, cpid, ctgid, ppid, ptgid, ack=ack)
    if what in (PROC_EVENT_EXIT, PROC_EVENT_NONZERO_EXIT):
        tid, tgid, code, sig, ppid, ptgid = _EXIT.unpack_from(u)
        return ConnectorEvent(what, cpu, ts, tid, tgid, ppid, ptgid, code, sig, ack=ack)
    if what == PROC_EVENT_COREDUMP:
        tid, tgid, ppid, ptgid = _FORK.unpack_from(u)  # same shape: process, then parent
        return ConnectorEvent(what, cpu, ts, tid, tgid, ppid, ptgid, ack=ack)
    if what == PROC_EVENT_COMM:
        tid, tgid, raw = _COMM.unpack_from(u)
        name = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
        return ConnectorEvent(what, cpu, ts, tid, tgid, comm=name, ack=ack)
    if what == PROC_EVENT_NONE:
        (err,) = _ACK.unpack_from(u)
        return ConnectorEvent(what, cpu, ts, err=err, ack=ack)
    tid, tgid = _IDS.unpack_from(u)  # exec, uid, gid, sid, ptrace, and any newer event
    return ConnectorEvent(what, cpu, ts, tid, tgid, ack=ack)


def mcast_request(op: int, ack: int) -> bytes:
    """The message that turns this socket's events on (LISTEN) or off (IGNORE).

    An nlmsghdr to the kernel (port 0) around a cn_msg for (CN_IDX_PROC, CN_VAL_PROC) whose data
    is the 4-byte ``enum proc_cn_mcast_op``: the legacy form, which listens to every event
    (``cn_proc_mcast_ctl`` takes ``msg->len == sizeof(mc_op)`` as PROC_EVENT_ALL).
    """
    payload = struct.pack("=I", op)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, ack, len(payload), 0) + payload
    return NLMSGHDR.pack(NLMSGHDR.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn
