"""The daemon in-process against a tree: ordering of READY/STOPPING and writes, reload diff,
journal adoption and replay, control commands. Signals are delivered for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile
from gputuned.profile.load import load_profile
from gputuned.store.state import JOURNAL
from tests.fakeproc import add_process, stat_line, status_text
from tests.faults import FaultKernel, WriteRecord, tree_kernel
from tests.unit.conftest import Events
from tests.unit.test_apply import PROFILES, SERVER_UID, digest, tree_copy


def profile_file(tmp_path: Path, count: int = 4) -> Path:
    text = (PROFILES / "shared-host.toml").read_text().replace("count = 8", f"count = {count}")
    p = tmp_path / "prof.toml"
    p.write_text(text)
    return p


def sent(path: Path) -> dict[str, Any]:
    """A profile as gputunectl apply sends it over the control socket: its content."""
    return load_profile(path).model_dump(mode="json", by_alias=True, exclude_none=True)


def index(log: Events, kind: str, what: str) -> int:
    return next(i for i, e in enumerate(log) if e == (kind, what))


def test_ready_after_apply_and_stopping_before_revert(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    ready = index(events, "notify", "READY=1")
    writes = [i for i, e in enumerate(events) if e[0] == "write"]
    assert writes and max(writes) < ready, "every apply write happens before READY=1"
    assert (root / "proc/irq/42/smp_affinity_list").read_text() == "1\n"
    assert d.status.startswith("applied shared-host:")
    os.kill(os.getpid(), signal.SIGTERM)
    d.loop.run_once(1.0)
    assert d.running is False
    assert d.stop() == 0
    stopping = index(events, "notify", "STOPPING=1")
    revert_writes = [i for i, e in enumerate(events) if e[0] == "write" and i > ready]
    assert revert_writes and min(revert_writes) > stopping, "STOPPING=1 comes before the revert"
    assert digest(root) == before


def test_sighup_applies_only_the_difference(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path, count=4)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    events.clear()
    prof.write_text(prof.read_text().replace("count = 4", "count = 6"))
    os.kill(os.getpid(), signal.SIGHUP)
    d.loop.run_once(1.0)
    written = [w for kind, w in events if kind == "write"]
    assert "/proc/irq/46/smp_affinity_list" in written  # CPU 1 -> CPU 5
    assert "/proc/irq/42/smp_affinity_list" not in written  # CPU 1 under both: untouched
    assert (root / "proc/irq/46/smp_affinity_list").read_text() == "5\n"
    assert (root / "sys/fs/cgroup/gputuned.inference/cpuset.cpus").read_text() == "1-6\n"
    assert next(e for e in events if e[0] == "notify") == ("notify", "RELOADING=1")
    assert ("notify", "READY=1") in events
    assert d.counters["reloads"] == 1
    d.stop()
    assert digest(root) == before


def test_stale_journal_is_adopted_then_restored(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    # A one-shot apply (or a killed daemon) left its journal and the active profile.
    apply_profile(
        tree_kernel(root), load_profile(profile_file(tmp_path)), source=str(profile_file(tmp_path))
    )
    events.clear()
    d = Daemon(tree_kernel(root))
    d.start()
    assert not [e for e in events if e[0] == "write"], "adopting: the host stays tuned, no writes"
    assert d.profile is not None and d.profile.name == "shared-host"
    d.stop()
    assert digest(root) == before


def test_stale_journal_without_profile_is_replayed(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    apply_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    (root / "etc/gputuned/active.json").unlink()
    d = Daemon(tree_kernel(root))
    d.start()
    assert digest(root) == before and not (root / JOURNAL.lstrip("/")).exists()
    assert d.status.startswith("idle")
    d.stop()


def test_new_process_and_its_later_threads_are_placed(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    before = digest(root)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    assert d.placed == {}
    add_process(
        root,
        5000,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.api"],
        exe="/usr/bin/python3.11",
        start_time=777,
        threads=[5001],
        cpus="0-15",
        uid=SERVER_UID,
    )
    time.sleep(d.watcher.timeout if d.watcher else 0)  # the next polling scan is due
    d._on_proc_events()  # the polling watcher sees the new /proc/5000
    assert 5000 in d.placed
    stat = (root / "proc/5000/task/5001/stat").read_text()
    assert stat.rpartition(")")[2].split()[19 - 3] == "-10"
    # A thread created later, with the defaults a new thread has.
    task = root / "proc/5000/task/5002"
    task.mkdir()
    task.joinpath("stat").write_text(
        stat_line(
            5000, 5002, "python3", start_time=777, nthreads=3, nice=0, policy=0, rt_priority=0
        )
    )
    task.joinpath("status").write_text(
        status_text(5000, 5002, "python3", nthreads=3, cpus=frozenset(range(16)), nr_cpus=16)
    )
    task.joinpath("comm").write_text("python3\n")
    time.sleep(d.watcher.timeout if d.watcher else 0)
    d._on_proc_events()
    d._place_threads()  # the new thread, at the next turn of the loop
    stat = (root / "proc/5000/task/5002/stat").read_text()
    assert stat.rpartition(")")[2].split()[19 - 3] == "-10"
    assert d.counters["placements"] >= 2
    # A thread that inherited the tuned values (clone copies nice and affinity): nothing to
    # write, but revert must still give it the process's original values.
    task = root / "proc/5000/task/5003"
    task.mkdir()
    task.joinpath("stat").write_text(
        stat_line(
            5000, 5003, "python3", start_time=777, nthreads=4, nice=-10, policy=0, rt_priority=0
        )
    )
    task.joinpath("status").write_text(
        status_text(5000, 5003, "python3", nthreads=4, cpus=frozenset(range(1, 5)), nr_cpus=16)
    )
    task.joinpath("comm").write_text("python3\n")
    time.sleep(d.watcher.timeout if d.watcher else 0)
    d._on_proc_events()
    d._place_threads()
    d.stop()
    for tid in (5000, 5001, 5002, 5003):
        stat = (root / f"proc/5000/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "0", tid
        status = (root / f"proc/5000/task/{tid}/status").read_text()
        assert "Cpus_allowed_list:\t0-15" in status, tid

    # add_process made the process's own cgroup (user.slice) after `before`: leave it out.
    def mine(k: str) -> bool:
        return "5000" in k or "user.slice" in k

    assert {k: v for k, v in digest(root).items() if not mine(k)} == {
        k: v for k, v in before.items() if not mine(k)
    }


def test_control_commands(tmp_path: Path, events: Events) -> None:
    from gputuned.service.control import PeerCred, request

    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    peer = PeerCred(1, 0, 0)
    status: dict[str, Any] = d.requests.handle({"cmd": "status"}, peer)
    assert status["active_profile"] == "shared-host" and status["daemon"]["watcher"] == "polling"
    ver = d.requests.handle({"cmd": "verify"}, peer)
    assert ver["exit_code"] == 0
    with pytest.raises(Exception, match="unknown command 'frobnicate'"):
        d.requests.handle({"cmd": "frobnicate"}, peer)
    rev = d.requests.handle({"cmd": "revert"}, peer)
    assert rev["failed"] == [] and d.profile is None
    again = d.requests.handle({"cmd": "apply", "profile": sent(profile_file(tmp_path))}, peer)
    assert again["failed"] == [] and again["written"]
    d.stop()
    json.dumps(status)
    assert request  # the client is exercised end to end in tests/unit/test_daemon_process.py


def test_bad_profile_at_start_is_reported(tmp_path: Path, events: Events) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[irq]\nspread = "yes"\n')
    d = Daemon(tree_kernel(root), profile_path=bad)
    with pytest.raises(Exception, match=r"irq\.spread"):
        d.start()
    d.lock.__exit__(None, None, None)
    shutil.rmtree(root)


def test_drift_is_repaired_and_counted(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    events.clear()
    assert not d._drifted(), "every applied setting reads back as applied"
    d._next["drift"] = 0
    d._timers()  # nothing drifted: the cheap check reads, writes nothing
    assert not [e for e in events if e[0] == "write"] and d.counters["repairs"] == 0
    (root / "proc/irq/45/smp_affinity_list").write_text("0-15\n")  # irqbalance moved it back
    d._next["drift"] = 0
    d._timers()
    assert (root / "proc/irq/45/smp_affinity_list").read_text() == "4\n"
    assert d.counters["repairs"] == 1
    assert ("notify", f"STATUS={d.status}") in events
    d.stop()


def test_metrics_port_serves_the_daemon_figures(tmp_path: Path, events: Events) -> None:
    """``[daemon] metrics_port`` starts the HTTP exposition inside the daemon's own loop."""
    import socket
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = tree_copy("h200-captured", tmp_path)
    prof = profile_file(tmp_path)
    prof.write_text(prof.read_text() + f"\n[daemon]\nmetrics_port = {port}\n")
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    assert d.metrics is not None
    got: list[bytes] = []

    def fetch() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while chunk := s.recv(65536):
                got.append(chunk)

    th = threading.Thread(target=fetch)
    th.start()
    deadline = time.monotonic() + 10
    while th.is_alive() and time.monotonic() < deadline:
        d.loop.run_once(0.05)
    th.join(1)
    body = b"".join(got).decode()
    assert body.startswith("HTTP/1.1 200"), body[:200]
    assert 'gputuned_info{version="' in body and 'profile="shared-host"' in body
    assert "gputuned_verify_exit_code" in body
    d.stop()
    with pytest.raises(OSError):  # the port is closed with the daemon
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_metrics_port_off_by_default(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    assert d.metrics is None
    d.stop()


def _server(root: Path, pid: int, threads: list[int]) -> None:
    add_process(
        root,
        pid,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.api"],
        exe="/usr/bin/python3.11",
        start_time=777,
        threads=threads,
        cpus="0-15",
        uid=SERVER_UID,
    )


def test_a_placement_journals_with_one_append_no_fsync(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every original of a placement is journaled before its write, in one append, without
    an fsync: process settings end with the process, which ends with the kernel, so the record
    need only outlive the daemon (gputuned/engine/journal.py; an fsync under disk load was most of a
    placement's time, issue 20)."""
    import gputuned.store.state as state

    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    appends: list[bytes] = []
    synced: list[bool] = []
    real_append = state.append_durable

    def append(host: FaultKernel, hpath: str, line: bytes, *, sync: bool = True) -> None:
        if b'"op": "save"' in line:
            # Nothing of the process may have been written yet when its originals are saved.
            assert not [w for k, w in events if k == "write" and "/proc/6000" in w]
            appends.append(line)
            synced.append(sync)
        real_append(host, hpath, line, sync=sync)

    monkeypatch.setattr("gputuned.engine.journal.append_durable", append)
    _server(root, 6000, [6001, 6002, 6003])
    time.sleep(d.watcher.timeout if d.watcher else 0)
    d._on_proc_events()
    assert 6000 in d.placed
    assert len(appends) == 1, "one append for the whole placement"
    assert synced == [False], "a placement's originals are not fsynced"
    saved = [json.loads(line)["entry"]["target"] for line in appends[0].splitlines()]
    assert len(saved) >= 4 * 2, saved  # nice and CPUs of each of the 4 threads, at least
    for tid in (6000, 6001, 6002, 6003):
        stat = (root / f"proc/6000/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "-10", tid
    # The journal in memory is the one on disk.
    from gputuned.engine.journal import Journal

    assert d.journal is not None
    assert [e.op.key for e in Journal(tree_kernel(root)).entries()] == [
        e.op.key for e in d.journal.entries()
    ]
    d.stop()
    for tid in (6000, 6001, 6002, 6003):
        stat = (root / f"proc/6000/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "0", tid


def test_a_crash_between_journal_and_writes_reverts_exactly(tmp_path: Path, events: Events) -> None:
    """Killed after the batch is durable and before any write: the revert finds every value
    still the original and the host ends as before."""
    from gputuned.engine.apply import ApplyReport, apply_settings, revert_all
    from gputuned.engine.journal import Journal
    from gputuned.engine.plan import read_context

    root = tree_copy("h200-captured", tmp_path, server=False)
    host = tree_kernel(root)
    _server(root, 6000, [6001])
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))
    ctx = read_context(host, prof)
    from gputuned.engine.plan import plan_processes

    settings, _claims = plan_processes(ctx, [6000])
    assert settings
    journal = Journal(host)

    class Killed(BaseException):
        pass

    def crash(_self: FaultKernel, _rec: WriteRecord) -> None:
        raise Killed

    real_wrote = FaultKernel._wrote
    FaultKernel._wrote = crash  # type: ignore[method-assign]
    try:
        with pytest.raises(Killed):
            apply_settings(host, journal, settings, ApplyReport(), keep_going=True, batch=True)
    finally:
        FaultKernel._wrote = real_wrote  # type: ignore[method-assign]
    assert len(Journal(host)) >= 2, "the originals were durable before the first write"
    rep = revert_all(host)
    assert rep.failed == []
    assert digest(root) == before


def test_the_daemon_journal_is_compacted_as_processes_come_and_go(
    tmp_path: Path, events: Events
) -> None:
    from gputuned.service.procwatch import ProcEvent

    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    assert d.journal is not None and d.watcher is not None
    journal_file = root / JOURNAL.lstrip("/")
    sizes = []
    for n in range(60):
        pid = 7000 + n
        _server(root, pid, [])
        d.place([pid], "test")
        assert pid in d.placed
        shutil.rmtree(root / f"proc/{pid}")
        d.watcher.read = lambda pid=pid: [ProcEvent("exit", pid, pid)]  # type: ignore[method-assign]
        d._on_proc_events()
        assert pid not in d.placed
        sizes.append(journal_file.stat().st_size)
    live = len(d.journal)
    assert d.journal.lines <= 2 * live + 256 + 8, "compacted when it grew"
    assert max(sizes) > sizes[-1], "the file shrank at least once"
    d.stop()


def test_a_profile_that_cannot_be_planned_later_leaves_the_daemon_running(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drift repair, reload and control apply meet a plan error (say a neighbour's partition
    took the CPUs): what is applied stays, the daemon keeps running and says so."""
    from gputuned import errors
    from gputuned.service.control import PeerCred

    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    applied = digest(root)

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise errors.PlanError("CPUs 1-2 are held by another valid partition")

    with monkeypatch.context() as m:
        m.setattr("gputuned.engine.apply.plan_profile", refuse)
        d._drift_ticks = 9
        d._next["drift"] = 0.0
        d._timers()
        assert d.status.startswith("degraded: drift repair: CPUs 1-2"), d.status
        assert digest(root) == applied
        os.kill(os.getpid(), signal.SIGHUP)
        d.loop.run_once(1.0)
        assert d.profile is not None and d.profile.name == "shared-host"
        with pytest.raises(errors.PlanError):
            d.requests.handle({"cmd": "apply", "profile": sent(prof)}, PeerCred(1, 0, 0))
        assert d.profile is not None and d.source == str(prof.absolute())
        assert d.running
    d.stop()
    assert digest(root) == before


def _realtime_profile(tmp_path: Path, priority: int) -> Path:
    p = profile_file(tmp_path)
    p.write_text(p.read_text() + f"\n[daemon]\nrealtime_priority = {priority}\n")
    return p


def test_realtime_priority_is_fifo_for_the_event_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[daemon] realtime_priority: SCHED_FIFO for the calling (event) thread, with
    SCHED_RESET_ON_FORK so that what it starts is SCHED_OTHER; on a tree, no system call."""
    calls: list[tuple[int, int, int]] = []

    def setscheduler(pid: int, policy: int, param: os.sched_param) -> None:
        calls.append((pid, policy, param.sched_priority))

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=_realtime_profile(tmp_path, 1))
    d.start()
    assert calls == [], "a tree is not the machine: the daemon's own policy is left alone"
    d._realtime(1)
    assert calls == [(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, 1)]
    assert d.stop() == 0


def test_realtime_priority_refused_says_why_and_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=_realtime_profile(tmp_path, 1))
    d._realtime(1)
    assert len(d.setup_notes) == 1 and d.setup_notes[0].startswith("realtime_priority refused")
    assert "RT budget" in d.setup_notes[0] or "CAP_SYS_NICE" in d.setup_notes[0]


@pytest.mark.parametrize("priority", [-1, 11])
def test_realtime_priority_bounds(tmp_path: Path, priority: int) -> None:
    from gputuned.errors import GputunedError

    with pytest.raises(GputunedError, match="realtime_priority"):
        load_profile(_realtime_profile(tmp_path, priority))


def test_sigusr1_hands_over_to_the_next_daemon_without_a_write(
    tmp_path: Path, events: Events
) -> None:
    """An upgrade's handover (issue 19): the old daemon exits leaving the host tuned, the new
    one adopts the journal without one write, and its stop restores the originals."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    tuned = digest(root)
    assert tuned != before
    events.clear()
    os.kill(os.getpid(), signal.SIGUSR1)
    d.loop.run_once(1.0)
    assert d.running is False and d.handover
    assert d.stop() == 0
    assert not [e for e in events if e[0] == "write"], "a handover writes nothing"
    assert ("notify", "STOPPING=1") in events
    assert digest(root) == tuned and (root / JOURNAL.lstrip("/")).is_file()
    # the next daemon: same profile file, adopts, writes nothing, and reverts at its stop
    events.clear()
    d2 = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d2.start()
    assert not [e for e in events if e[0] == "write"], "adopting: no untuned window, no writes"
    assert d2.stop() == 0
    assert digest(root) == before


def test_metrics_address_option_binds_there(tmp_path: Path, events: Events) -> None:
    """gputuned --metrics-address (a pod's IP in deploy/kubernetes) overrides [daemon]
    metrics_address; 127.0.0.2 stands in for it (all of 127/8 is loopback on Linux)."""
    import socket

    from gputuned.daemon.main import build_parser

    assert build_parser().parse_args(["--metrics-address", "127.0.0.2"]).metrics_address == (
        "127.0.0.2"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--metrics-address", "pod-ip"])
    root = tree_copy("h200-captured", tmp_path)
    prof = profile_file(tmp_path)
    prof.write_text(prof.read_text() + "\n[daemon]\nmetrics_port = 1\n")  # replaced below
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    prof.write_text(prof.read_text().replace("metrics_port = 1", f"metrics_port = {port}"))
    d = Daemon(tree_kernel(root), profile_path=prof, metrics_address="127.0.0.2")
    d.start()
    try:
        assert d.metrics is not None and d.metrics._sock.getsockname() == ("127.0.0.2", port)
        with pytest.raises(OSError):  # not on the profile's 127.0.0.1
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        d.stop()


def test_the_watchdog_is_pinged_when_due_after_a_long_apply(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WatchdogSec=30 pings every 15 s. An apply answered at 18 s (a slow guest took 17 s) must
    be followed by a ping, not by a new 15 s wait: the apply used to push the ping on, and a
    13 s verify after it went past 30 s without one (systemd killed the daemon mid-request)."""
    import gputuned.daemon.keeper as keeper

    clock = [0.0]
    monkeypatch.setattr(keeper, "now", lambda: clock[0])
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    pings = lambda: sum(1 for e in events if e == ("notify", "WATCHDOG=1"))  # noqa: E731
    clock[0] = 14.0
    d._timers()
    assert pings() == 0, "not due before half of WatchdogSec="
    real_apply = keeper.apply_profile

    def slow_apply(*a: Any, **k: Any) -> Any:
        clock[0] += 17.0
        return real_apply(*a, **k)

    monkeypatch.setattr(keeper, "apply_profile", slow_apply)
    from gputuned.service.control import PeerCred

    d.requests.handle({"cmd": "apply", "profile": sent(profile_file(tmp_path))}, PeerCred(1, 0, 0))
    assert pings() == 1, "the apply itself pings once the ping is due (15 s), at 31 s"
    clock[0] = 40.0
    d._timers()
    assert pings() == 1, "the next ping is 15 s after the last one"
    clock[0] = 46.5
    d._timers()
    assert pings() == 2
    d.stop()
