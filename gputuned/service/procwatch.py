"""Process events as they happen: exec, new threads, exits.

The daemon tunes processes that start after it does, so it must hear of them. Two sources sit
behind one interface, :class:`ProcWatcher`:

- :class:`NetlinkWatcher`, the kernel's process events connector (drivers/connector/cn_proc.c,
  Documentation/driver-api/connector.rst): a ``NETLINK_CONNECTOR`` socket bound to the
  ``CN_IDX_PROC`` multicast group receives one message per fork, exec and exit, in well under a
  millisecond, and nothing is missed unless the receive buffer overflows.
- :class:`PollingWatcher`, a diff of /proc every ``interval`` seconds, read through
  the kernel port so that it runs on trees too. It is the fallback where the
  connector is refused (older kernels want CAP_NET_ADMIN; a process outside the initial PID or
  user namespace is ignored by ``cn_proc_mcast_ctl``) and the only source on a tree.

Use::

    watcher = open_watcher(kernel)     # first, so nothing that starts during the scan is lost
    scan_everything()
    while True:
        select([watcher] if watcher.fileno() >= 0 else [], [], [], watcher.timeout)
        for ev in watcher.read(): ...  # "overflow": events were lost, scan everything again

The connector's wire format is :mod:`gputuned.service.procwire`. Events say *that* something
changed, not what the process is: read it through :mod:`gputuned.kernel.proc` and check (pid,
start time) before acting, since a PID can be reused.
"""

from __future__ import annotations

import abc
import contextlib
import errno as E
import logging
import os
import socket
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.oserrors import translate
from gputuned.kernel.procfs import NUM_THREADS, parse_stat
from gputuned.service.procwire import (
    CN_IDX_PROC,
    NETLINK_CONNECTOR,
    PROC_CN_MCAST_IGNORE,
    PROC_CN_MCAST_LISTEN,
    PROC_EVENT_COMM,
    PROC_EVENT_EXEC,
    PROC_EVENT_EXIT,
    PROC_EVENT_FORK,
    PROC_EVENT_NONE,
    PROC_EVENT_NONZERO_EXIT,
    SO_RCVBUFFORCE,
    ConnectorEvent,
    mcast_request,
    parse_datagram,
)

log = logging.getLogger(__name__)

# ---- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcEvent:
    """Something happened to a process.

    ``kind`` is one of:

    - ``"exec"``: ``pid`` runs a new program (connector: ``PROC_EVENT_EXEC``; polling: a PID not
      seen before, or whose main thread changed its name, see :class:`PollingWatcher`).
    - ``"comm"``: ``pid``'s main thread took a new name (connector: ``PROC_EVENT_COMM``;
      prctl(PR_SET_NAME), a write to /proc/PID/comm, setproctitle). Polling reports it as
      ``"exec"``, since it cannot tell the two apart.
    - ``"fork"``: a new process ``pid`` (not yet exec'd); ``parent`` is its parent's tgid.
    - ``"thread"``: a new thread ``tid`` in process ``pid``. ``parent`` is the *process's* parent,
      as the kernel reports it: kernel/fork.c gives a CLONE_THREAD task its creator's
      ``real_parent``.
    - ``"exit"``: with ``tid == pid`` the process is gone; with ``tid != pid`` one thread ended.
      The connector reports every thread's exit, the leader's possibly before the others'.
    - ``"overflow"``: events were lost (the connector's receive buffer overflowed, ENOBUFS).
      ``pid`` and ``tid`` are 0. Rescan every process: anything may have started or ended, and
      the events around it in the list do not bound the gap.

    ``pid`` is always the thread group id (what ``ps`` calls the PID). ``parent`` is 0 where the
    source does not say (connector exec and exit events).
    """

    kind: str
    pid: int
    tid: int
    parent: int = 0


OVERFLOW = ProcEvent("overflow", 0, 0)


def to_proc_event(ev: ConnectorEvent) -> ProcEvent | None:
    """The :class:`ProcEvent` for a connector event; None for those the daemon does not need.

    uid/gid/sid/ptrace changes, coredumps (an exit follows) and replies are dropped, and so
    is a thread other than the main one taking a new name: rules match a process by its main
    thread's name (what /proc/PID/comm shows), and thread pools name their threads by the
    hundred, so passing those on would cost the daemon a read per thread for nothing.
    """
    if ev.what == PROC_EVENT_FORK:
        kind = "fork" if ev.tid == ev.tgid else "thread"
        return ProcEvent(kind, ev.tgid, ev.tid, ev.parent_tgid)
    if ev.what == PROC_EVENT_EXEC:
        return ProcEvent("exec", ev.tgid, ev.tid)
    if ev.what == PROC_EVENT_COMM and ev.tid == ev.tgid:
        # prctl(PR_SET_NAME) and writes to /proc/PID/comm (kernel/sys.c, fs/proc/base.c
        # comm_write() call proc_comm_connector()); setproctitle renames this way too.
        return ProcEvent("comm", ev.tgid, ev.tid)
    if ev.what in (PROC_EVENT_EXIT, PROC_EVENT_NONZERO_EXIT):
        return ProcEvent("exit", ev.tgid, ev.tid)
    return None


# ---- watchers --------------------------------------------------------------------------------


class ProcWatcher(abc.ABC):
    """A source of :class:`ProcEvent`; see the module docstring for the loop that drives it."""

    mode: str = ""

    @abc.abstractmethod
    def fileno(self) -> int:
        """A descriptor that turns readable when events wait, or -1: then use :attr:`timeout`."""

    @property
    def timeout(self) -> float | None:
        """Seconds until :meth:`read` has something to do without a readable fd; None: never."""
        return None

    @abc.abstractmethod
    def read(self) -> list[ProcEvent]:
        """The events available now, oldest first; never blocks, may be empty."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop watching and free what the watcher holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_CONNECTOR = "NETLINK_CONNECTOR/CN_IDX_PROC"
_NO_ACK = (
    "the kernel did not answer PROC_CN_MCAST_LISTEN: cn_proc ignores requests from processes "
    "outside the initial PID and user namespaces (a container), or CONFIG_PROC_EVENTS is off"
)


class NetlinkWatcher(ProcWatcher):
    """The proc connector: every fork, exec and exit on the machine, as it happens.

    Opening it binds to the CN_IDX_PROC group, sends PROC_CN_MCAST_LISTEN and waits up to
    ``ack_timeout`` for the kernel's reply (a PROC_EVENT_NONE whose cn_msg ``ack`` is ours + 1;
    the reply's ``seq`` is not ours to match: ``send_msg`` overwrites it with a per-CPU
    counter). Without that reply the socket would stay silent forever, so no reply is an error.

    The kernel drops events when the receive buffer is full and the next ``recv`` fails with
    ENOBUFS (netlink(7)); :meth:`read` then returns :data:`OVERFLOW`. The error comes first,
    ahead of the events still queued (``__skb_try_recv_datagram`` checks ``sock_error`` before
    the queue), so its place in the list does not say which events were lost: rescan all.
    The buffer is raised to ``rcvbuf`` (SO_RCVBUFFORCE as root, else SO_RCVBUF up to
    net.core.rmem_max; the kernel doubles it). One event is a 76-byte datagram but costs about
    830 bytes of buffer (its skb): the default 4 MiB (8 MiB effective) held 10,083 events on the
    CI machine kind (Linux 6.18, measured), more than a server starting its thread pools makes.
    """

    mode = "netlink"
    #: Most datagrams one :meth:`read` takes, so a fork storm cannot starve the daemon's other
    #: duties; the descriptor stays readable for the rest.
    max_batch = 4096

    def __init__(self, *, rcvbuf: int = 4 << 20, ack_timeout: float = 1.0) -> None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as exc:
            raise _explain(exc, "open") from exc
        try:
            _set_rcvbuf(sock, rcvbuf)
            sock.bind((0, 1 << (CN_IDX_PROC - 1)))  # nl_groups is a bitmask of groups 1..32
            pending = _subscribe(sock, ack_timeout)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise _explain(exc, "listen on") from exc
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._pending = pending
        self._buf = bytearray(65536)
        #: Effective receive buffer in bytes (the kernel doubles what was asked, socket(7)).
        self.rcvbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    @classmethod
    def _attached(cls, sock: socket.socket) -> NetlinkWatcher:
        """A watcher over a socket that is already listening (tests give a stand-in)."""
        self = cls.__new__(cls)
        self._sock, self._pending, self._buf, self.rcvbuf = sock, [], bytearray(65536), 0
        return self

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[ProcEvent]:
        out, self._pending = self._pending, []
        for _ in range(self.max_batch):
            try:
                n, addr = self._sock.recvfrom_into(self._buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno == E.ENOBUFS:
                    if not out or out[-1] is not OVERFLOW:
                        out.append(OVERFLOW)
                    continue
                raise translate(exc, "receive from", _CONNECTOR) from exc
            if addr[0] != 0:
                continue  # only the kernel (port 0) speaks for cn_proc; a process could forge
            for raw in parse_datagram(memoryview(self._buf)[:n]):
                ev = to_proc_event(raw)
                if ev is not None:
                    out.append(ev)
        return out

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        # Balances the kernel's listener count, so cn_proc stops building events nobody reads;
        # it would find out at the next send anyway (send_msg, -ESRCH).
        with contextlib.suppress(OSError):
            self._sock.sendto(mcast_request(PROC_CN_MCAST_IGNORE, 0), (0, 0))
        self._sock.close()


def _set_rcvbuf(sock: socket.socket, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)  # capped at rmem_max


def _subscribe(sock: socket.socket, timeout: float) -> list[ProcEvent]:
    """Send LISTEN and wait for the kernel's reply; events that arrive first are returned."""
    nonce = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    sock.sendto(mcast_request(PROC_CN_MCAST_LISTEN, nonce), (0, 0))
    early: list[ProcEvent] = []
    buf = bytearray(65536)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            n, addr = sock.recvfrom_into(buf)
        except TimeoutError:
            break
        except OSError as exc:
            if exc.errno != E.ENOBUFS:
                raise
            early.append(OVERFLOW)
            continue
        if addr[0] != 0:
            continue
        for raw in parse_datagram(memoryview(buf)[:n]):
            if raw.what == PROC_EVENT_NONE and raw.ack == nonce + 1:
                if raw.err:
                    why = f"the kernel refused PROC_CN_MCAST_LISTEN ({os.strerror(raw.err)})"
                    raise OSError(raw.err, why)
                return early
            ev = to_proc_event(raw)
            if ev is not None:
                early.append(ev)
    raise OSError(E.ETIMEDOUT, _NO_ACK)


def _explain(exc: OSError, op: str) -> errors.HostError:
    """Translate, with the reason that applies to the connector in place of the generic one."""
    code = exc.errno or 0
    if exc.strerror and exc.strerror != os.strerror(code):
        return translate(exc, op, _CONNECTOR)  # carries its own reason (_subscribe)
    reason = {
        E.EPERM: "this kernel wants CAP_NET_ADMIN to join the proc connector: run as root",
        E.EACCES: "this kernel wants CAP_NET_ADMIN to join the proc connector: run as root",
        E.EPROTONOSUPPORT: "the kernel has no netlink connector (CONFIG_CONNECTOR is off)",
        E.EAFNOSUPPORT: "the kernel has no netlink sockets",
    }.get(code)
    return translate(OSError(code, reason) if reason else exc, op, _CONNECTOR)


@dataclass(frozen=True)
class _Seen:
    start: int  # starttime, clock ticks since boot: with the PID, the process's identity
    comm: str  # the main thread's name; exec changes it
    ppid: int
    tids: frozenset[int]


class PollingWatcher(ProcWatcher):
    """Events from a diff of /proc every ``interval`` seconds, through ``kernel``.

    ``fileno()`` is -1: wait :attr:`timeout` seconds, then :meth:`read` scans (before that it
    returns nothing); :meth:`scan` scans now. The first scan happens at construction and yields
    no events: it is the baseline.

    Each scan reads /proc/PID/stat and lists /proc/PID/task of every process (kernel threads'
    task lists are skipped: they never have more than one). From the difference:

    - a PID not seen before: ``exec``, then ``thread`` for each thread but the main one. Polling
      cannot tell a fork from an exec, so every new process is an ``exec`` (``parent``: ppid).
    - the same PID with another start time: the PID was reused, ``exit`` then as new.
    - the same process whose main-thread name (comm) changed: ``exec`` again. An exec in place
      (a shell wrapper's ``exec python ...``) keeps PID and start time and changes only comm; a
      rename through prctl(PR_SET_NAME) or setproctitle also lands here, and deserves the same
      re-evaluation. An exec of a program with the same name is not seen.
    - a new thread id in a known process: ``thread``; a thread id gone: ``exit`` (tid != pid).
    - a PID gone, or a zombie (state Z with no thread left, stat's num_threads <= 1, or X):
      ``exit``. A zombie has exited and waits only for its parent's wait(2); the connector
      reports the exit at that moment, too.

    Anything that starts and ends between two scans is not seen at all.
    """

    mode = "polling"

    def __init__(self, kernel: Kernel, *, interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"poll interval must be positive, not {interval}")
        self.kernel = kernel
        self.interval = interval
        #: Seconds the latest scan took.
        self.last_scan_s = 0.0
        self._due = 0.0
        self._known: dict[int, _Seen] = {}
        self.scan()

    def fileno(self) -> int:
        return -1

    @property
    def timeout(self) -> float:
        return max(0.0, self._due - time.monotonic())

    def read(self) -> list[ProcEvent]:
        return self.scan() if time.monotonic() >= self._due else []

    def scan(self) -> list[ProcEvent]:
        """Scan /proc now and return what changed since the previous scan."""
        t0 = time.monotonic()
        now = self._snapshot()
        events = _diff(self._known, now)
        self._known = now
        t1 = time.monotonic()
        self.last_scan_s = t1 - t0
        # Scans start every `interval`; one that took longer than half of it leaves at least
        # half an interval idle, so polling never eats a CPU on a host with many processes.
        self._due = max(t0 + self.interval, t1 + self.interval / 2)
        return events

    def close(self) -> None:
        self._known = {}

    def _snapshot(self) -> dict[int, _Seen]:
        seen: dict[int, _Seen] = {}
        for name in self.kernel.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                item = self._read(pid)
            except (errors.TargetGone, errors.PermissionDenied):
                continue  # exited between listing and reading: as if not listed
            if item is not None:
                seen[pid] = item
        return seen

    def _read(self, pid: int) -> _Seen | None:
        st = parse_stat(self.kernel.read_text(f"/proc/{pid}/stat"))
        if st.state == "X" or (st.state == "Z" and st.field(NUM_THREADS) <= 1):
            return None
        if st.kernel_thread:
            tids = frozenset((pid,))
        else:
            listing = self.kernel.listdir(f"/proc/{pid}/task")
            tids = frozenset(int(t) for t in listing if t.isdigit())
        return _Seen(st.start_time, st.comm, st.ppid, tids)


def _diff(old: dict[int, _Seen], new: dict[int, _Seen]) -> list[ProcEvent]:
    out: list[ProcEvent] = []
    for pid in sorted(old.keys() | new.keys()):
        was, now = old.get(pid), new.get(pid)
        if now is None:
            out.append(ProcEvent("exit", pid, pid))
            continue
        if was is not None and was.start != now.start:
            out.append(ProcEvent("exit", pid, pid))
            was = None
        if was is None:
            out.append(ProcEvent("exec", pid, pid, now.ppid))
            out += [ProcEvent("thread", pid, t, now.ppid) for t in sorted(now.tids - {pid})]
            continue
        out += [ProcEvent("exit", pid, t) for t in sorted(was.tids - now.tids)]
        if was.comm != now.comm:
            out.append(ProcEvent("exec", pid, pid, now.ppid))
        out += [ProcEvent("thread", pid, t, now.ppid) for t in sorted(now.tids - was.tids)]
    return out


def open_watcher(kernel: Kernel, *, poll_interval: float = 1.0) -> ProcWatcher:
    """The best watcher for ``kernel``: the proc connector where it has one, else polling.

    On a tree (no ``proc_connector``) polling over the tree's /proc, so tests drive it by adding
    and removing /proc/PID directories. On the live machine a refused connector is logged once,
    with the reason, and polling every ``poll_interval`` seconds takes over.
    """
    if not kernel.proc_connector:
        return PollingWatcher(kernel, interval=poll_interval)
    try:
        return NetlinkWatcher()
    except errors.HostError as exc:
        log.warning(
            "process events: proc connector unavailable, polling /proc every %.3g s instead: %s",
            poll_interval,
            exc,
        )
    return PollingWatcher(kernel, interval=poll_interval)
