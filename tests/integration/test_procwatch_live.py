"""Process events from this machine's kernel: the proc connector, and polling /proc alone.

Each test starts one child of its own (a Python that starts two threads, holds them a moment,
joins them and exits) and watches for that child's events only. Nothing on the host is changed.
The child prints, on CLOCK_MONOTONIC (shared with this process), when its threads were running
and when it was about to exit, so each event's delay can be measured from the moment it became
true.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from gputuned.kernel.proc import list_pids
from gputuned.service import procwatch as pw
from gputuned.service import procwire as wire
from gputuned.service.procwatch import ProcEvent, ProcWatcher
from tests.faults import live_kernel

pytestmark = pytest.mark.integration

HOLD_S = 0.3  # how long the child keeps its threads: three poll intervals
CHILD = f"""
import threading, time
go = threading.Event()
threads = [threading.Thread(target=go.wait) for _ in range(2)]
for t in threads:
    t.start()
print(time.monotonic(), flush=True)
time.sleep({HOLD_S})
go.set()
for t in threads:
    t.join()
print(time.monotonic(), flush=True)
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root: the proc connector wants CAP_NET_ADMIN on older kernels, and "
            "polling must read every process's /proc/PID/task (CI runs as root)"
        )


@dataclass
class Run:
    t_popen: float  # just before Popen was called
    t_threads: float  # the child's two threads were running
    t_exit: float  # the child was about to exit
    pid: int
    seen: list[tuple[float, ProcEvent]]  # the child's events, with when they were read

    def first(self, kind: str, tid: int | None = None) -> float:
        hits = [t for t, e in self.seen if e.kind == kind and (tid is None or e.tid == tid)]
        assert hits, f"no {kind} event for pid {self.pid}: {self.seen}"
        return hits[0]

    def threads(self) -> list[tuple[float, ProcEvent]]:
        return [(t, e) for t, e in self.seen if e.kind == "thread"]


def run_child(w: ProcWatcher, timeout: float = 5.0) -> Run:
    """Start the child from a helper thread while this one waits in select(), as the daemon's
    loop does; collect the child's events until its exit event (pid == tid) or ``timeout``."""
    started: dict[str, object] = {}

    def start() -> None:
        started["t"] = time.monotonic()
        started["proc"] = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True
        )

    launcher = threading.Thread(target=start)
    seen: list[tuple[float, ProcEvent]] = []
    pending: list[tuple[float, ProcEvent]] = []
    deadline = time.monotonic() + timeout
    launcher.start()
    try:
        while time.monotonic() < deadline:
            fds = [w] if w.fileno() >= 0 else []
            wait = w.timeout
            select.select(fds, [], [], min(0.5 if wait is None else wait, 0.5))
            events = w.read()
            now = time.monotonic()
            pending += [(now, e) for e in events]
            proc = started.get("proc")
            if not isinstance(proc, subprocess.Popen):
                continue  # the pid is not known yet; keep what arrived
            seen += [(t, e) for t, e in pending if e.pid == proc.pid]
            pending = []
            if any(e.kind == "exit" and e.tid == proc.pid for _, e in seen):
                break
    finally:
        launcher.join()
    proc = started["proc"]
    assert isinstance(proc, subprocess.Popen)
    out, _ = proc.communicate(timeout=10)
    t_popen = started["t"]
    assert isinstance(t_popen, float)
    t_threads, t_exit = (float(x) for x in out.split())
    return Run(t_popen, t_threads, t_exit, proc.pid, seen)


def check_events(r: Run, within: float) -> dict[str, float]:
    """exec, two threads of the child, its exit, each read within ``within`` s of happening."""
    exec_at = r.first("exec")
    threads = r.threads()
    assert len(threads) == 2, f"expected the child's two threads: {r.seen}"
    for _, e in threads:
        assert e.pid == r.pid and e.tid != e.pid, e
    exit_at = r.first("exit", tid=r.pid)
    delays = {
        # Popen returns only after the child's exec (its error pipe closes on exec), so the exec
        # event is due from the moment Popen was called.
        "exec": exec_at - r.t_popen,
        "threads": max(t for t, _ in threads) - r.t_threads,
        "exit": exit_at - r.t_exit,
    }
    for what, d in delays.items():
        assert d <= within, f"{what} event after {d * 1e3:.1f} ms (limit {within * 1e3:.0f} ms)"
    return delays


@pytest.mark.needs("proc_connector")
def test_netlink_exec_threads_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the kernel's timestamps (CLOCK_MONOTONIC, like time.monotonic) of every exec, to tell
    # the kernel's part of the delay from this test's (the launcher thread holds the GIL).
    stamped: dict[int, float] = {}
    parse = pw.parse_datagram

    def keep(data: memoryview) -> list[wire.ConnectorEvent]:
        evs = parse(data)
        stamped.update(
            (e.tgid, e.timestamp_ns / 1e9) for e in evs if e.what == wire.PROC_EVENT_EXEC
        )
        return evs

    monkeypatch.setattr(pw, "parse_datagram", keep)
    w = pw.open_watcher(live_kernel())
    try:
        assert isinstance(w, pw.NetlinkWatcher), "this machine kind allows the connector as root"
        runs = [run_child(w) for _ in range(5)]  # a few runs for a steadier figure
    finally:
        w.close()
    for r in runs:
        delays = check_events(r, within=2.0)
        assert r.first("fork") <= r.first("exec")
    ms = [
        (
            (r.first("exec") - r.t_popen) * 1e3,
            (stamped[r.pid] - r.t_popen) * 1e3,
            (r.first("exec") - stamped[r.pid]) * 1e3,
        )
        for r in runs
    ]
    med = [statistics.median(col) for col in zip(*ms, strict=True)]
    print(
        f"\nnetlink, median of {len(runs)}: Popen -> exec event read {med[0]:.2f} ms "
        f"(Popen -> kernel's exec stamp {med[1]:.2f} ms, stamp -> read {med[2]:.2f} ms); "
        f"runs: {', '.join(f'{a:.2f}' for a, _, _ in ms)} ms. Last run: threads read "
        f"{delays['threads'] * 1e3:+.2f} ms, exit {delays['exit'] * 1e3:+.2f} ms after the "
        f"child said so; receive buffer {w.rcvbuf // 1024} KiB"
    )


def test_polling_alone_within_one_interval() -> None:
    interval = 0.1
    w = pw.PollingWatcher(live_kernel(), interval=interval)
    scans = []
    for _ in range(10):
        w.scan()
        scans.append(w.last_scan_s)
    r = run_child(w)
    scan = statistics.median(scans)
    # One interval, plus the scan that notices it, plus the child's interpreter teardown after
    # it printed its exit time.
    delays = check_events(r, within=interval + max(scans) + 0.05)
    print(
        f"\npolling every {interval} s: one scan of /proc ({len(list_pids(live_kernel()))} processes) "
        f"takes {scan * 1e3:.2f} ms (max {max(scans) * 1e3:.2f}); exec seen "
        f"{delays['exec'] * 1e3:.0f} ms after Popen, threads {delays['threads'] * 1e3:.0f} ms, "
        f"exit {delays['exit'] * 1e3:.0f} ms"
    )


def test_refused_connector_falls_back_to_polling(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(pw.socket, "socket", refuse)
    with caplog.at_level(logging.WARNING, logger=pw.__name__):
        w = pw.open_watcher(live_kernel(), poll_interval=0.25)
    assert (w.mode, w.fileno()) == ("polling", -1)
    assert isinstance(w, pw.PollingWatcher) and w.interval == 0.25
    [rec] = caplog.records
    assert "CAP_NET_ADMIN" in rec.getMessage() and "polling /proc every 0.25 s" in rec.getMessage()


@pytest.mark.needs("proc_connector")
def test_overflow_is_reported() -> None:
    # The smallest receive buffer the kernel allows (SOCK_MIN_RCVBUF) holds a handful of events;
    # a child making 200 threads while nobody reads overflows it.
    with pw.NetlinkWatcher(rcvbuf=1) as w:
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import threading\nfor _ in range(200): threading.Thread(target=int).start()",
            ],
            check=True,
        )
        events = w.read()
        assert pw.OVERFLOW in events, f"{len(events)} events, no overflow; rcvbuf {w.rcvbuf}"
        print(f"\noverflow: {len(events) - 1} events kept in a {w.rcvbuf}-byte receive buffer")
