"""A placed process that makes threads by the thousand (issue 14, finding 6).

Each new thread is placed alone: the daemon reads that thread (and the main one, for the
process's originals), not every thread of the process again, so a storm of N threads costs
it N reads, not N²/2. A thread that ends takes its journal entries with it, so the journal
holds the threads alive, and compaction keeps the file within twice that plus 256 lines
(Journal.compact_if_grown).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gputuned.daemon.core import THREADS_A_TURN, Daemon
from gputuned.engine.journal import Journal
from gputuned.service.procwatch import ProcEvent
from gputuned.store.state import JOURNAL
from tests.fakeproc import add_thread, remove_thread
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_process_tree import (
    API,
    CORE,
    PLACED,
    UNTUNED,
    api,
    child,
    daemon,
    feed,
    state,
)

__all__ = ["daemon"]  # the fixture

N = 300


def thread_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The TIDs whose /proc/PID/task/TID files the daemon reads from now on."""
    read: list[str] = []
    real = FaultKernel.read_bytes

    def reading(self: FaultKernel, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        if "/task/" in hpath:
            read.append(hpath.split("/")[4])
        return real(self, hpath, offset, size)

    monkeypatch.setattr(FaultKernel, "read_bytes", reading)
    return read


def api_thread_keys(root: Path) -> set[str]:
    return {e.op.key for e in Journal(tree_kernel(root)).entries() if e.op.data.get("pid") == API}


def lines(root: Path) -> int:
    return (root / JOURNAL.lstrip("/")).read_bytes().count(b"\n")


def test_each_new_thread_is_read_and_placed_alone(
    daemon: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, root = daemon
    d.start()
    api(root, cpus="0,5-15")
    feed(d, ProcEvent("exec", API, API))
    assert state(root, API) == PLACED
    read = thread_reads(monkeypatch)
    for i in range(N):
        tid = API + 100 + i
        # As clone leaves it: the placed thread's values (kernel/fork.c).
        add_thread(root, API, tid, cpus="1-4", nice=-10)
        read.clear()
        feed(d, ProcEvent("thread", API, tid, 1))
        # Before the fix every thread of the process was read again: i + 3 TIDs here.
        assert set(read) <= {str(API), str(tid)}, (i, sorted(set(read)))
    assert state(root, API) == PLACED
    # Every new thread is journaled with the server's original, so revert puts it back, and
    # the drift check knows it.
    keys = api_thread_keys(root)
    assert {f"thread:{API}:1000:{API + 100 + i}:nice" for i in range(N)} <= keys
    assert not d._drifted()
    assert d.stop() == 0
    assert state(root, API) == UNTUNED


def test_threads_that_end_leave_the_journal_and_it_stays_bounded(
    daemon: tuple[Daemon, Path],
) -> None:
    d, root = daemon
    d.start()
    api(root, cpus="0,5-15")
    feed(d, ProcEvent("exec", API, API))
    base = api_thread_keys(root)
    for wave in range(5):  # threads that come and go, N at a time
        tids = [API + 1000 * (wave + 1) + i for i in range(N)]
        for tid in tids:
            add_thread(root, API, tid, cpus="1-4", nice=-10)
        feed(d, *(ProcEvent("thread", API, t, 1) for t in tids))
        assert len(api_thread_keys(root)) == len(base) + 2 * N  # nice and affinity
        for tid in tids:
            remove_thread(root, API, tid)
        feed(d, *(ProcEvent("exit", API, t) for t in tids))
        # Before the fix the entries of every thread that ever lived stayed: 600 more a wave.
        assert api_thread_keys(root) == base, wave
        assert d.journal is not None
        assert lines(root) <= 2 * len(d.journal) + 256
        assert d.journal.lines == lines(root)
    # The process's own threads are still placed and reverted; the settings the drift check
    # re-reads hold no thread that ended.
    assert not d._drifted()
    tids = {
        tid for c in d.settings if c.kind == "thread" for tid in c.data["threads"]
    }  # fmt: skip
    assert tids == {API, API + 1, API + 2}
    assert d.stop() == 0
    assert state(root, API) == UNTUNED
    assert not (root / JOURNAL.lstrip("/")).exists() or Journal(tree_kernel(root)).entries() == []


def test_a_thread_storm_does_not_hold_up_a_new_process(daemon: tuple[Daemon, Path]) -> None:
    """New threads are placed a few hundred a turn of the loop; a process that starts
    meanwhile is placed in the turn its event arrives, before the threads still waiting."""
    d, root = daemon
    d.start()
    api(root, cpus="0,5-15")
    feed(d, ProcEvent("exec", API, API))
    storm = [API + 100 + i for i in range(2 * THREADS_A_TURN + 10)]
    for tid in storm:
        add_thread(root, API, tid, cpus="1-4", nice=-10)
    assert d.watcher is not None
    child(root, CORE, API, inherited=False)  # a child that has not inherited anything yet
    events = [ProcEvent("thread", API, t, 1) for t in storm]
    events += [ProcEvent("fork", CORE, CORE, API), ProcEvent("exec", CORE, CORE)]
    d.watcher.read = lambda: events  # type: ignore[method-assign]
    d._on_proc_events()
    assert state(root, CORE) == PLACED  # placed at once, though after the storm's events
    assert sum(map(len, d.new_threads.values())) == len(storm)
    d._place_threads()
    assert sum(map(len, d.new_threads.values())) == len(storm) - THREADS_A_TURN
    remove_thread(root, API, storm[-1])  # it ends before its turn
    feed(d, ProcEvent("exit", API, storm[-1]))
    assert d.new_threads == {}
    keys = api_thread_keys(root)
    assert {f"thread:{API}:1000:{t}:nice" for t in storm[:-1]} <= keys
    assert not any(f":{storm[-1]}:" in k for k in keys)
    assert d.stop() == 0
    assert state(root, API) == UNTUNED and state(root, CORE)[1:] == UNTUNED[1:]
