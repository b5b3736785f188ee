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

from gputuned.apply import apply_profile
from gputuned.daemon import Daemon
from gputuned.host import Host
from gputuned.host.fs import WriteRecord
from gputuned.host.state import JOURNAL
from gputuned.profile import load_profile
from tests.fakeproc import add_process, stat_line, status_text
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
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
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
    d = Daemon(Host(root), profile_path=prof)
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
        Host(root), load_profile(profile_file(tmp_path)), source=str(profile_file(tmp_path))
    )
    events.clear()
    d = Daemon(Host(root))
    d.start()
    assert not [e for e in events if e[0] == "write"], "adopting: the host stays tuned, no writes"
    assert d.profile is not None and d.profile.name == "shared-host"
    d.stop()
    assert digest(root) == before


def test_stale_journal_without_profile_is_replayed(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    apply_profile(Host(root), load_profile(profile_file(tmp_path)))
    (root / "etc/gputuned/active.json").unlink()
    d = Daemon(Host(root))
    d.start()
    assert digest(root) == before and not (root / JOURNAL.lstrip("/")).exists()
    assert d.status.startswith("idle")
    d.stop()


def test_new_process_and_its_later_threads_are_placed(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    before = digest(root)
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
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
    from gputuned.host.control import PeerCred, request

    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
    d.start()
    peer = PeerCred(1, 0, 0)
    status: dict[str, Any] = d._handle({"cmd": "status"}, peer)
    assert status["active_profile"] == "shared-host" and status["daemon"]["watcher"] == "polling"
    ver = d._handle({"cmd": "verify"}, peer)
    assert ver["exit_code"] == 0
    with pytest.raises(Exception, match="unknown command 'frobnicate'"):
        d._handle({"cmd": "frobnicate"}, peer)
    rev = d._handle({"cmd": "revert"}, peer)
    assert rev["failed"] == [] and d.profile is None
    again = d._handle({"cmd": "apply", "profile": sent(profile_file(tmp_path))}, peer)
    assert again["failed"] == [] and again["written"]
    d.stop()
    json.dumps(status)
    assert request  # the client is exercised end to end in tests/unit/test_daemon_process.py


def test_bad_profile_at_start_is_reported(tmp_path: Path, events: Events) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[irq]\nspread = "yes"\n')
    d = Daemon(Host(root), profile_path=bad)
    with pytest.raises(Exception, match=r"irq\.spread"):
        d.start()
    d.lock.__exit__(None, None, None)
    shutil.rmtree(root)


def test_drift_is_repaired_and_counted(tmp_path: Path, events: Events) -> None:
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
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
    d = Daemon(Host(root), profile_path=prof)
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
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
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


def test_a_placement_journals_with_one_fsync(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every original of a placement is journaled before its write, in one append and fsync."""
    import gputuned.host.state as state

    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
    d.start()
    appends: list[bytes] = []
    real_append = state.append_durable

    def append(host: Host, hpath: str, line: bytes, *, sync: bool = True) -> None:
        if sync:
            # Nothing of the process may have been written yet when its originals are synced.
            assert not [w for k, w in events if k == "write" and "/proc/6000" in w]
            appends.append(line)
        real_append(host, hpath, line, sync=sync)

    monkeypatch.setattr("gputuned.journal.append_durable", append)
    _server(root, 6000, [6001, 6002, 6003])
    time.sleep(d.watcher.timeout if d.watcher else 0)
    d._on_proc_events()
    assert 6000 in d.placed
    assert len(appends) == 1, "one durable append for the whole placement"
    saved = [json.loads(line)["entry"]["target"] for line in appends[0].splitlines()]
    assert len(saved) >= 4 * 2, saved  # nice and CPUs of each of the 4 threads, at least
    for tid in (6000, 6001, 6002, 6003):
        stat = (root / f"proc/6000/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "-10", tid
    # The journal in memory is the one on disk.
    from gputuned.journal import Journal

    assert d.journal is not None
    assert [e.op.key for e in Journal(Host(root)).entries()] == [
        e.op.key for e in d.journal.entries()
    ]
    d.stop()
    for tid in (6000, 6001, 6002, 6003):
        stat = (root / f"proc/6000/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "0", tid


def test_a_crash_between_journal_and_writes_reverts_exactly(tmp_path: Path, events: Events) -> None:
    """Killed after the batch is durable and before any write: the revert finds every value
    still the original and the host ends as before."""
    from gputuned.apply import ApplyReport, apply_settings, revert_all
    from gputuned.engine import read_context
    from gputuned.journal import Journal

    root = tree_copy("h200-captured", tmp_path, server=False)
    host = Host(root)
    _server(root, 6000, [6001])
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))
    ctx = read_context(host, prof)
    from gputuned.engine import plan_processes

    settings, _claims = plan_processes(ctx, [6000])
    assert settings
    journal = Journal(host)

    class Killed(BaseException):
        pass

    def crash(_self: Host, _rec: WriteRecord) -> None:
        raise Killed

    real_wrote = Host._wrote
    Host._wrote = crash  # type: ignore[method-assign]
    try:
        with pytest.raises(Killed):
            apply_settings(host, journal, settings, ApplyReport(), keep_going=True, batch=True)
    finally:
        Host._wrote = real_wrote  # type: ignore[method-assign]
    assert len(Journal(host)) >= 2, "the originals were durable before the first write"
    rep = revert_all(host)
    assert rep.failed == []
    assert digest(root) == before


def test_the_daemon_journal_is_compacted_as_processes_come_and_go(
    tmp_path: Path, events: Events
) -> None:
    from gputuned.host.procwatch import ProcEvent

    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(Host(root), profile_path=profile_file(tmp_path))
    d.start()
    assert d.journal is not None and d.watcher is not None
    journal_file = root / JOURNAL.lstrip("/")
    sizes = []
    for n in range(60):
        pid = 7000 + n
        _server(root, pid, [])
        d._place([pid], "test")
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
    from gputuned.host.control import PeerCred

    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    d = Daemon(Host(root), profile_path=prof)
    d.start()
    applied = digest(root)

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise errors.PlanError("CPUs 1-2 are held by another valid partition")

    with monkeypatch.context() as m:
        m.setattr("gputuned.apply.plan_profile", refuse)
        d._drift_ticks = 9
        d._next["drift"] = 0.0
        d._timers()
        assert d.status.startswith("degraded: drift repair: CPUs 1-2"), d.status
        assert digest(root) == applied
        os.kill(os.getpid(), signal.SIGHUP)
        d.loop.run_once(1.0)
        assert d.profile is not None and d.profile.name == "shared-host"
        with pytest.raises(errors.PlanError):
            d._handle({"cmd": "apply", "profile": sent(prof)}, PeerCred(1, 0, 0))
        assert d.profile is not None and d.source == str(prof.absolute())
        assert d.running
    d.stop()
    assert digest(root) == before
