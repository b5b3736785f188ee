"""Process events: proc connector messages parsed from bytes laid out as the kernel sends them,
and the polling watcher driven by fake processes in a tree.

Messages are built here with struct from the uapi headers (include/uapi/linux/netlink.h,
connector.h, cn_proc.h), independently of the module's own struct formats: nlmsghdr (16 bytes),
cn_msg (20), struct proc_event (what, cpu, timestamp_ns, then the 24-byte union: 40 bytes).
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.service import procwatch as pw
from gputuned.service import procwire as wire
from gputuned.service.procwatch import OVERFLOW, ProcEvent
from gputuned.service.procwire import ConnectorEvent
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process, remove_process
from tests.faults import tree_kernel

# ---- messages as the kernel lays them out ---------------------------------------------------

NLMSG_ERROR, NLMSG_DONE = 2, 3


def proc_event(what: int, union: bytes, *, cpu: int = 5, ts: int = 987_654_321_000) -> bytes:
    """struct proc_event: enum what (u32), cpu (u32), timestamp_ns (u64), union (24 bytes)."""
    assert len(union) <= 24
    return struct.pack("=IIQ", what, cpu, ts) + union.ljust(24, b"\0")


def message(
    event: bytes,
    *,
    idx: int = 1,
    val: int = 1,
    seq: int = 41,
    ack: int = 0,
    nl_type: int = NLMSG_DONE,
) -> bytes:
    """nlmsghdr around cn_msg around ``event``, as cn_netlink_send_mult() builds it."""
    cn = struct.pack("=IIIIHH", idx, val, seq, ack, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(cn), nl_type, 0, seq, 0) + cn


def fork(parent_pid: int, parent_tgid: int, child_pid: int, child_tgid: int) -> bytes:
    return message(
        proc_event(0x1, struct.pack("=iiii", parent_pid, parent_tgid, child_pid, child_tgid))
    )


def exec_(pid: int, tgid: int) -> bytes:
    return message(proc_event(0x2, struct.pack("=ii", pid, tgid)))


def exit_(pid: int, tgid: int, code: int, sig: int, ppid: int, ptgid: int) -> bytes:
    return message(
        proc_event(0x80000000, struct.pack("=iiIIii", pid, tgid, code, sig, ppid, ptgid))
    )


def one(data: bytes) -> ConnectorEvent:
    evs = wire.parse_datagram(data)
    assert len(evs) == 1
    return evs[0]


# ---- the ABI ----------------------------------------------------------------------------------


def test_constants_are_the_uapi_headers() -> None:
    assert wire.NETLINK_CONNECTOR == 11
    assert (wire.CN_IDX_PROC, wire.CN_VAL_PROC) == (1, 1)
    assert (wire.PROC_CN_MCAST_LISTEN, wire.PROC_CN_MCAST_IGNORE) == (1, 2)
    assert [
        wire.PROC_EVENT_NONE,
        wire.PROC_EVENT_FORK,
        wire.PROC_EVENT_EXEC,
        wire.PROC_EVENT_UID,
        wire.PROC_EVENT_GID,
        wire.PROC_EVENT_SID,
        wire.PROC_EVENT_PTRACE,
        wire.PROC_EVENT_COMM,
        wire.PROC_EVENT_NONZERO_EXIT,
        wire.PROC_EVENT_COREDUMP,
        wire.PROC_EVENT_EXIT,
    ] == [0, 0x1, 0x2, 0x4, 0x40, 0x80, 0x100, 0x200, 0x20000000, 0x40000000, 0x80000000]


def test_sizes_and_offsets() -> None:
    assert (wire.NLMSGHDR.size, wire.CN_MSG.size, wire.PROC_EVENT_SIZE) == (16, 20, 40)
    data = fork(100, 100, 4243, 4242)
    assert len(data) == 76  # what a live datagram measures
    # The union starts 16 bytes into proc_event, which starts after both headers.
    assert struct.unpack_from("=i", data, 16 + 20 + 16 + 8)[0] == 4243  # fork.child_pid
    assert struct.unpack_from("=Q", data, 16 + 20 + 8)[0] == 987_654_321_000  # timestamp_ns


# ---- parsing ----------------------------------------------------------------------------------


def test_fork_of_a_process() -> None:
    raw = one(fork(4000, 4000, 4242, 4242))
    assert (raw.what, raw.cpu, raw.timestamp_ns) == (wire.PROC_EVENT_FORK, 5, 987_654_321_000)
    assert (raw.parent_tid, raw.parent_tgid, raw.tid, raw.tgid) == (4000, 4000, 4242, 4242)
    assert pw.to_proc_event(raw) == ProcEvent("fork", 4242, 4242, 4000)


def test_fork_of_a_thread_is_a_thread_event() -> None:
    # A CLONE_THREAD task gets its creator's real_parent: the parent is the process's parent.
    raw = one(fork(4000, 4000, 4243, 4242))
    assert pw.to_proc_event(raw) == ProcEvent("thread", 4242, 4243, 4000)


def test_exec() -> None:
    raw = one(exec_(4242, 4242))
    assert (raw.what, raw.tid, raw.tgid) == (wire.PROC_EVENT_EXEC, 4242, 4242)
    assert pw.to_proc_event(raw) == ProcEvent("exec", 4242, 4242)


def test_exit_of_process_and_of_thread() -> None:
    main = one(exit_(4242, 4242, 256, 17, 4000, 4000))  # exit(1): code 1 << 8, SIGCHLD
    assert (main.exit_code, main.exit_signal, main.parent_tgid) == (256, 17, 4000)
    assert pw.to_proc_event(main) == ProcEvent("exit", 4242, 4242)
    thread = one(exit_(4243, 4242, 0, 0xFFFFFFFF, 0, 0))  # a thread's exit_signal is -1
    assert thread.exit_signal == 0xFFFFFFFF
    assert pw.to_proc_event(thread) == ProcEvent("exit", 4242, 4243)


def test_nonzero_exit_as_what_reads_as_exit() -> None:
    # Today only a filter bit, but a kernel that sends it must not lose the exit.
    body = struct.pack("=iiIIii", 4242, 4242, 9, 17, 1, 1)
    raw = one(message(proc_event(0x20000000, body)))
    assert (raw.exit_code, pw.to_proc_event(raw)) == (9, ProcEvent("exit", 4242, 4242))


def test_comm() -> None:
    raw = one(message(proc_event(0x200, struct.pack("=ii16s", 4243, 4242, b"VLLM::Worker"))))
    assert (raw.tid, raw.tgid, raw.comm) == (4243, 4242, "VLLM::Worker")
    full = one(message(proc_event(0x200, struct.pack("=ii16s", 1, 1, b"a" * 15 + b"\0"))))
    assert full.comm == "a" * 15  # TASK_COMM_LEN 16, NUL-terminated
    # A worker thread renamed: rules look at the main thread's name only, so it is dropped.
    assert pw.to_proc_event(raw) is None
    # The main thread renamed (setproctitle, prctl(PR_SET_NAME)): the process is looked at again.
    main = one(message(proc_event(0x200, struct.pack("=ii16s", 4242, 4242, b"VLLM::EngineCor"))))
    assert pw.to_proc_event(main) == ProcEvent("comm", 4242, 4242)


@pytest.mark.parametrize(
    ("what", "union"),
    [
        (0x4, struct.pack("=iiII", 4242, 4242, 1000, 1000)),  # uid: ruid, euid
        (0x40, struct.pack("=iiII", 4242, 4242, 1000, 1000)),  # gid
        (0x80, struct.pack("=ii", 4242, 4242)),  # sid
        (0x100, struct.pack("=iiii", 4242, 4242, 4000, 4000)),  # ptrace: tracer
        (0x40000000, struct.pack("=iiii", 4242, 4242, 4000, 4000)),  # coredump: parent
    ],
)
def test_events_the_daemon_does_not_need(what: int, union: bytes) -> None:
    raw = one(message(proc_event(what, union)))
    assert (raw.what, raw.tid, raw.tgid) == (what, 4242, 4242)
    assert pw.to_proc_event(raw) is None


def test_coredump_keeps_its_parent() -> None:
    raw = one(message(proc_event(0x40000000, struct.pack("=iiii", 4242, 4242, 4000, 4001))))
    assert (raw.parent_tid, raw.parent_tgid) == (4000, 4001)


def test_ack() -> None:
    # cn_proc_ack(): what NONE, cpu -1 (send_msg overwrites it), ack.err, cn_msg.ack = ours + 1.
    raw = one(message(proc_event(0, struct.pack("=I", errno.EPERM), cpu=0xFFFFFFFF), ack=1235))
    assert (raw.what, raw.err, raw.ack) == (wire.PROC_EVENT_NONE, errno.EPERM, 1235)
    assert pw.to_proc_event(raw) is None


def test_several_messages_in_one_datagram_are_aligned() -> None:
    noop = struct.pack("=IHHII", 17, 1, 0, 0, 0) + b"\x01" + b"\0\0\0"  # len 17, NLMSG_ALIGN 20
    data = exec_(1, 1) + noop + fork(1, 1, 2, 2)
    assert [pw.to_proc_event(e) for e in wire.parse_datagram(data)] == [
        ProcEvent("exec", 1, 1),
        ProcEvent("fork", 2, 2, 1),
    ]


def test_what_is_not_ours_is_skipped() -> None:
    ev = proc_event(0x2, struct.pack("=ii", 7, 7))
    assert wire.parse_datagram(message(ev, idx=2)) == []  # CN_IDX_CIFS
    assert wire.parse_datagram(message(ev, val=2)) == []
    err = struct.pack("=IHHIIi", 36, NLMSG_ERROR, 0, 0, 0, -errno.EINVAL) + bytes(16)
    assert wire.parse_datagram(err) == []
    assert wire.parse_datagram(exec_(7, 7)[:60]) == []  # truncated datagram
    short = message(ev)[:-8]
    short = struct.pack("=I", len(short)) + short[4:]  # consistent nlmsg_len, short cn_msg data
    assert wire.parse_datagram(short) == []
    assert wire.parse_datagram(b"") == []


def test_mcast_request_layout() -> None:
    data = wire.mcast_request(wire.PROC_CN_MCAST_LISTEN, 1234)
    assert len(data) == 16 + 20 + 4
    assert struct.unpack("=IHHII", data[:16]) == (40, NLMSG_DONE, 0, 0, 0)
    assert struct.unpack("=IIIIHH", data[16:36]) == (1, 1, 0, 1234, 4, 0)
    assert struct.unpack("=I", data[36:]) == (1,)


# ---- the netlink watcher over a stand-in socket ----------------------------------------------


class FakeSocket:
    """Plays the kernel's side: datagrams (from port 0 unless given), errors, then EAGAIN."""

    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)
        self.sent: list[bytes] = []
        self.closed = False

    def recvfrom_into(self, buf: bytearray) -> tuple[int, tuple[int, int]]:
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "again")
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        data, port = item if isinstance(item, tuple) else (item, 0)
        buf[: len(data)] = data
        return len(data), (port, 1)

    def sendto(self, data: bytes, addr: tuple[int, int]) -> int:
        self.sent.append(data)
        return len(data)

    def settimeout(self, t: float) -> None:
        pass

    def fileno(self) -> int:
        return -1 if self.closed else 99

    def close(self) -> None:
        self.closed = True


def enobufs() -> OSError:
    return OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))


def test_read_maps_events_and_reports_an_overflow_once() -> None:
    sock = FakeSocket(
        [
            fork(10, 10, 20, 20),
            enobufs(),
            enobufs(),  # two in a row: one overflow
            exec_(20, 20),
            (exec_(66, 66), 4321),  # from a process, not the kernel: forged
            message(proc_event(0x200, struct.pack("=ii16s", 20, 20, b"x"))),
            fork(10, 10, 21, 20),
            exit_(20, 20, 0, 17, 10, 10),
        ]
    )
    w = pw.NetlinkWatcher._attached(sock)  # type: ignore[arg-type]
    assert (w.mode, w.fileno(), w.timeout) == ("netlink", 99, None)
    assert w.read() == [
        ProcEvent("fork", 20, 20, 10),
        OVERFLOW,
        ProcEvent("exec", 20, 20),
        ProcEvent("comm", 20, 20),  # the main thread renamed itself (setproctitle)
        ProcEvent("thread", 20, 21, 10),
        ProcEvent("exit", 20, 20),
    ]
    assert w.read() == []
    w.close()
    assert sock.closed
    assert struct.unpack("=I", sock.sent[0][36:]) == (wire.PROC_CN_MCAST_IGNORE,)
    w.close()  # twice is fine
    assert len(sock.sent) == 1


def test_read_takes_at_most_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pw.NetlinkWatcher, "max_batch", 2)
    w = pw.NetlinkWatcher._attached(FakeSocket([exec_(1, 1), exec_(2, 2), exec_(3, 3)]))  # type: ignore[arg-type]
    assert [e.pid for e in w.read()] == [1, 2]
    assert [e.pid for e in w.read()] == [3]


def test_other_receive_errors_are_translated() -> None:
    w = pw.NetlinkWatcher._attached(FakeSocket([OSError(errno.EBADF, "bad")]))  # type: ignore[arg-type]
    with pytest.raises(errors.HostError, match="NETLINK_CONNECTOR"):
        w.read()


class Kernel(FakeSocket):
    """Answers LISTEN with cn_proc_ack() after ``before`` events, as the kernel would."""

    def __init__(self, before: list[bytes], err: int = 0, answer: bool = True) -> None:
        super().__init__([])
        self.before, self.err, self.answer = before, err, answer

    def sendto(self, data: bytes, addr: tuple[int, int]) -> int:
        super().sendto(data, addr)
        ack = struct.unpack_from("=I", data, 16 + 12)[0]
        other = message(proc_event(0, struct.pack("=I", 0)), ack=ack + 7)  # another listener's
        mine = message(proc_event(0, struct.pack("=I", self.err)), seq=3, ack=ack + 1)
        self.items = [*self.before, other] + ([mine] if self.answer else [])
        return len(data)

    def recvfrom_into(self, buf: bytearray) -> tuple[int, tuple[int, int]]:
        if not self.items:
            raise TimeoutError("timed out")
        return super().recvfrom_into(buf)


def test_subscribe_waits_for_its_own_ack_and_keeps_earlier_events() -> None:
    sock = Kernel([exec_(5, 5), fork(5, 5, 6, 5)])
    early = pw._subscribe(sock, 1.0)  # type: ignore[arg-type]
    assert early == [ProcEvent("exec", 5, 5), ProcEvent("thread", 5, 6, 5)]
    assert struct.unpack("=I", sock.sent[0][36:]) == (wire.PROC_CN_MCAST_LISTEN,)


def test_subscribe_refused_or_unanswered() -> None:
    with pytest.raises(OSError, match="refused PROC_CN_MCAST_LISTEN") as info:
        pw._subscribe(Kernel([], err=errno.EPERM), 1.0)  # type: ignore[arg-type]
    assert info.value.errno == errno.EPERM
    with pytest.raises(OSError, match="initial PID and user namespaces") as info:
        pw._subscribe(Kernel([], answer=False), 0.05)  # type: ignore[arg-type]
    assert info.value.errno == errno.ETIMEDOUT
    translated = pw._explain(info.value, "listen on")
    assert "namespaces" in str(translated) and translated.errno == errno.ETIMEDOUT


def test_explain_says_why_the_connector_is_refused() -> None:
    denied = pw._explain(OSError(errno.EPERM, os.strerror(errno.EPERM)), "listen on")
    assert isinstance(denied, errors.PermissionDenied)
    assert "CAP_NET_ADMIN" in str(denied)
    missing = pw._explain(OSError(errno.EPROTONOSUPPORT, "x"), "open")
    assert "x" in str(missing)  # an OSError with its own text keeps it
    missing = pw._explain(
        OSError(errno.EPROTONOSUPPORT, os.strerror(errno.EPROTONOSUPPORT)), "open"
    )
    assert "CONFIG_CONNECTOR" in str(missing)


# ---- polling over a tree --------------------------------------------------------------------

PID = 4242


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ci-vm"
    shutil.copytree(TREES_DIR / "ci-vm", root, symlinks=True)
    add_process(
        root,
        1,
        comm="systemd",
        cmdline=["/sbin/init"],
        exe="/usr/lib/systemd/systemd",
        start_time=1,
    )
    return root


def spawn(root: Path, pid: int = PID, *, threads: list[int] | None = None, **kw: Any) -> None:
    kw = {
        "comm": "python3",
        "cmdline": ["python3", "-m", "vllm"],
        "exe": "/usr/bin/python3.11",
        "start_time": 9000,
    } | kw
    add_process(root, pid, threads=threads, **kw)


def set_stat_field(root: Path, pid: int, field: int, value: str) -> None:
    """Field numbers as in proc(5); 3 (state) is the first after comm."""
    p = root / "proc" / str(pid) / "stat"
    head, _, rest = p.read_text().rpartition(")")
    f = rest.split()
    f[field - 3] = value
    p.write_text(f"{head}) {' '.join(f)}\n")


def test_open_watcher_on_a_tree_polls_it(tree: Path) -> None:
    w = pw.open_watcher(tree_kernel(tree), poll_interval=0.5)
    assert isinstance(w, pw.PollingWatcher)
    assert (w.mode, w.fileno(), w.interval) == ("polling", -1, 0.5)
    assert 0 < w.timeout <= 0.5
    assert w.scan() == []  # what was there at the start is the baseline, not news


def test_new_process_with_threads_then_exit(tree: Path) -> None:
    with pw.PollingWatcher(tree_kernel(tree), interval=60) as w:
        spawn(tree, threads=[4244, 4243])
        assert w.scan() == [
            ProcEvent("exec", PID, PID, 1),  # ppid, from stat
            ProcEvent("thread", PID, 4243, 1),
            ProcEvent("thread", PID, 4244, 1),
        ]
        assert w.scan() == []
        remove_process(tree, PID)
        assert w.scan() == [ProcEvent("exit", PID, PID)]


def test_threads_come_and_go(tree: Path) -> None:
    spawn(tree, threads=[4243])
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    remove_process(tree, PID)
    spawn(tree, threads=[4244, 4245])  # same process (start time): 4243 ended, two began
    assert w.scan() == [
        ProcEvent("exit", PID, 4243),
        ProcEvent("thread", PID, 4244, 1),
        ProcEvent("thread", PID, 4245, 1),
    ]


def test_reused_pid_is_exit_then_exec(tree: Path) -> None:
    spawn(tree)
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    remove_process(tree, PID)
    spawn(tree, start_time=9500, comm="bash")
    assert w.scan() == [ProcEvent("exit", PID, PID), ProcEvent("exec", PID, PID, 1)]


def test_exec_in_place_changes_comm(tree: Path) -> None:
    spawn(tree, comm="bash", threads=[4243])
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    remove_process(tree, PID)
    spawn(tree, comm="python3")  # `exec python3 ...` in a wrapper: same PID, same start time
    assert w.scan() == [ProcEvent("exit", PID, 4243), ProcEvent("exec", PID, PID, 1)]


def test_zombie_counts_as_exited(tree: Path) -> None:
    spawn(tree, threads=[4243])
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    set_stat_field(tree, PID, 3, "Z")  # leader gone, thread 4243 still runs: alive
    assert w.scan() == []
    set_stat_field(tree, PID, 20, "1")  # last thread gone: waiting only for wait(2)
    assert w.scan() == [ProcEvent("exit", PID, PID)]
    set_stat_field(tree, PID, 3, "X")
    assert w.scan() == []


def test_kernel_threads_are_not_listed(tree: Path) -> None:
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    spawn(tree, 77, comm="kworker/0:1", cmdline=[], exe=None)
    set_stat_field(tree, 77, 9, str(0x00208040))  # PF_KTHREAD | PF_NOFREEZE | PF_WQ_WORKER
    shutil.rmtree(tree / "proc/77/task")  # were it listed, the scan would skip the process
    assert w.scan() == [ProcEvent("exec", 77, 77, 1)]


def test_process_vanishing_mid_scan_is_skipped(tree: Path) -> None:
    w = pw.PollingWatcher(tree_kernel(tree), interval=60)
    (tree / "proc/5555").mkdir()  # listed, but its files are already gone
    spawn(tree, 5556)
    shutil.rmtree(tree / "proc/5556/task")
    assert w.scan() == []


def test_read_waits_for_the_interval(tree: Path) -> None:
    w = pw.PollingWatcher(tree_kernel(tree), interval=3600)
    spawn(tree)
    assert w.read() == []  # not due: nothing scanned
    assert w.timeout > 3500
    assert w.scan() == [ProcEvent("exec", PID, PID, 1)]
    assert w.last_scan_s > 0
    w._due = 0.0
    remove_process(tree, PID)
    assert w.read() == [ProcEvent("exit", PID, PID)]
    assert w.timeout > 3500


def test_interval_must_be_positive(tree: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        pw.PollingWatcher(tree_kernel(tree), interval=0)
