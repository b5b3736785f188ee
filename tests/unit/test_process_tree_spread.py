"""spread_threads over a whole process tree in an isolated partition (issue 13).

The shipped dedicated-inference profile on the 16-CPU H200 tree, its inference set cut to 8 CPUs
(2-9), and a server shaped like vLLM V1: the API server (matched), EngineCore (spawned by it)
and 4 workers (spawned by EngineCore), each with threads of its own. Each main thread runs a
hot loop that launches GPU work: no two may share a CPU while there are CPUs enough, and a
re-plan moves nothing already placed on a CPU that suits it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gputuned.changes import Change
from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.engine.plan import plan_profile
from gputuned.kernel.proc import read_process
from gputuned.profile.load import load_profile
from gputuned.profile.model import Profile
from gputuned.service.procwatch import ProcEvent
from gputuned.tuners.spread import Member, spread
from tests.fakeproc import add_process, add_thread, remove_thread
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import PROFILES, SERVER_UID, digest, tree_copy
from tests.unit.test_process_tree import HOME, PART, SPAWN, feed

API, CORE = 5000, 5100
WORKERS = (5200, 5300, 5400, 5500)
TREE = (API, CORE, *WORKERS)
SET = frozenset(range(2, 10))
ALL = frozenset(range(16))


@pytest.fixture(autouse=True)
def _quiet_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


def dedicated(tmp_path: Path) -> Path:
    """The shipped dedicated-inference profile with an 8-CPU inference set (2-9 on this tree)."""
    for name in ("shared-host.toml", "dedicated-inference.toml"):
        shutil.copy(PROFILES / name, tmp_path / name)
    p = tmp_path / "dedicated-inference.toml"
    text = p.read_text()
    cut = text.replace('exclude = ["housekeeping"]\n', 'exclude = ["housekeeping"]\ncount = 8\n', 1)
    assert cut != text
    p.write_text(cut)
    return p


def load(tmp_path: Path) -> Profile:
    return load_profile(tmp_path / "dedicated-inference.toml")


def proc(root: Path, pid: int, ppid: int, *, inherited: str | None = None) -> None:
    """A process of the tree, with 3 (API server) or 4 threads besides its main one.
    ``inherited``: started after its parent was placed, from a thread pinned to that CPU
    (fork copies CPU, nice and cgroup), else as it was before gputuned."""
    match = pid == API
    add_process(
        root,
        pid,
        comm={API: "python3", CORE: "VLLM::EngineCore"}.get(pid, f"VLLM::Worker_TP{pid}"),
        cmdline=["python3", "-m", "vllm.entrypoints.openai.api_server"] if match else SPAWN,
        exe="/usr/bin/python3.11",
        start_time=pid // 10,  # the order the tree starts in
        threads=[pid + i for i in range(1, 4 if match else 5)],
        cgroup=PART if inherited else HOME,
        nice=-10 if inherited else 0,
        cpus=inherited or "0-15",
        ppid=ppid,
        uid=SERVER_UID,
    )


def server(root: Path, pids: tuple[int, ...] = TREE) -> None:
    for pid in pids:
        proc(root, pid, {API: 1, CORE: API}.get(pid, CORE))


def cpus(root: Path, pids: tuple[int, ...] = TREE) -> dict[int, frozenset[int]]:
    """Every thread's CPUs, by TID."""
    kernel = tree_kernel(root)
    return {t.tid: t.affinity for pid in pids for t in read_process(kernel, pid).threads}


def mains(root: Path, pids: tuple[int, ...] = TREE) -> dict[int, int]:
    got = cpus(root, pids)
    assert all(len(got[pid]) == 1 for pid in pids), {pid: got[pid] for pid in pids}
    return {pid: min(got[pid]) for pid in pids}


def assert_spread(root: Path, pids: tuple[int, ...] = TREE) -> None:
    """One CPU of the set a thread; main threads on CPUs of their own; the rest evenly over
    the CPUs left."""
    got = cpus(root, pids)
    assert all(len(c) == 1 and c <= SET for c in got.values()), got
    main = mains(root, pids)
    assert len(set(main.values())) == len(pids), main
    others = [min(c) for tid, c in got.items() if tid not in main]
    assert not set(others) & set(main.values()), (main, others)
    loads = [others.count(c) for c in SET - set(main.values())]
    assert max(loads) - min(loads) <= 1, loads


def affinity_settings(settings: list[Change]) -> dict[int, Change]:
    return {
        c.data["pid"]: c for c in settings if c.kind == "thread" and c.data["attr"] == "affinity"
    }


# ---- the policy, on its own -------------------------------------------------------------------


def member(pid: int, n: int, where: str | frozenset[int] = "0-15") -> Member:
    from gputuned.cpulist import parse_cpulist

    aff = parse_cpulist(where) if isinstance(where, str) else where
    return Member(pid, (pid,), {pid + i: aff for i in range(n)})


def test_main_threads_take_a_cpu_each_and_the_rest_share_what_is_left() -> None:
    got = spread(SET, [member(10, 3), member(20, 4), member(30, 1)])
    assert [got.cpu[p] for p in (10, 20, 30)] == [2, 3, 4]
    assert sorted(got.cpu[t] for t in (11, 12, 21, 22, 23)) == [5, 6, 7, 8, 9]
    assert got.describe(10, (10, 11, 12)) == (
        "main thread alone on 2; other threads over 5-6 (the tree's threads one CPU each over 2-9)"
    )


def test_more_processes_than_cpus_share_evenly_and_leave_one_cpu_to_the_other_threads() -> None:
    three = frozenset({1, 2, 3})
    got = spread(three, [member(p, 3) for p in (10, 20, 30, 40, 50)])
    main = [got.cpu[p] for p in (10, 20, 30, 40, 50)]
    assert sorted(main.count(c) for c in (1, 2)) == [2, 3] and 3 not in main
    assert {got.cpu[p + i] for p in (10, 20, 30, 40, 50) for i in (1, 2)} == {3}
    assert "main thread on 1 with 2 other main threads" in got.describe(10, (10,))
    # Without other threads every CPU takes main threads.
    alone = spread(three, [member(p, 1) for p in (10, 20, 30)])
    assert sorted(alone.cpu.values()) == [1, 2, 3]


def test_what_suits_its_cpu_stays_and_an_inherited_cpu_does_not() -> None:
    one = frozenset
    placed = [
        Member(10, (0,), {10: one({5}), 11: one({2}), 12: one({3})}),
        Member(20, (1,), {20: one({7}), 21: one({6}), 22: one({4})}),
    ]
    first = spread(SET, placed)
    assert first.cpu == {10: 5, 11: 2, 12: 3, 20: 7, 21: 6, 22: 4}
    assert not any(first.moves(m) for m in placed)
    # A child forked by pid 20's main thread: everything on 7, its parent's main CPU.
    child = Member(30, (2,), {30: one({7}), 31: one({7}), 32: one({7})})
    got = spread(SET, [*placed, child])
    assert not any(got.moves(m) for m in placed)
    assert got.cpu[30] in {8, 9}, "a CPU of its own, where no thread is"
    assert got.cpu[31] not in {5, 7, got.cpu[30]} and got.cpu[32] not in {5, 7, got.cpu[30]}


# ---- one-shot apply and re-plans ----------------------------------------------------------------


def test_apply_gives_each_process_of_the_tree_a_main_cpu_and_revert_is_exact(
    tmp_path: Path,
) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    server(root)
    before = digest(root)
    dedicated(tmp_path)
    plan, report = apply_profile(tree_kernel(root), load(tmp_path))
    assert report.failed == []
    assert plan.sets["inference"] == "2-9"
    # The matched process first, then descendants by start time.
    assert mains(root) == {API: 2, CORE: 3, 5200: 4, 5300: 5, 5400: 6, 5500: 7}
    assert_spread(root)
    shown = affinity_settings(plan.settings)
    assert shown[API].wanted == (
        "main thread alone on 2; other threads over 8-9 (the tree's threads one CPU each over 2-9)"
    )
    assert shown[5300].wanted.startswith("main thread alone on 5; other threads over 8-9")
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    assert digest(root) == before


def test_a_replan_moves_no_thread_that_suits_its_cpu(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    server(root)
    dedicated(tmp_path)
    apply_profile(tree_kernel(root), load(tmp_path))
    again = plan_profile(tree_kernel(root), load(tmp_path))
    assert [c.target for c in again.changes if c.tuner == "process"] == []
    placed = cpus(root)
    # A thread of one worker exits; another worker's main thread starts a thread (on its own
    # CPU, as clone copies it).
    remove_thread(root, 5300, 5302)
    del placed[5302]
    add_thread(root, 5200, 5205, cpus=str(min(placed[5200])), nice=-10)
    plan, report = apply_profile(tree_kernel(root), load(tmp_path))
    assert report.failed == []
    now = cpus(root)
    assert {tid for tid in placed if now[tid] != placed[tid]} == set()
    assert now[5205] <= SET - {2, 3, 4, 5, 6, 7}
    assert_spread(root)
    changed = [c.target for c in plan.changes if c.tuner == "process"]
    assert changed == [f"pid 5200 (VLLM::Worker_TP, started by {CORE}, 6 threads) affinity"]


def test_a_child_that_inherited_its_parents_cpu_gets_its_own(tmp_path: Path) -> None:
    """Forked after a one-shot apply: its main thread shows one CPU of the set, the API
    server's main CPU, which does not make it in sync."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    server(root, (API,))
    before = digest(root)
    dedicated(tmp_path)
    apply_profile(tree_kernel(root), load(tmp_path))
    api_main = mains(root, (API,))[API]
    proc(root, CORE, API, inherited=str(api_main))
    plan = plan_profile(tree_kernel(root), load(tmp_path))
    core = affinity_settings(plan.settings)[CORE]
    assert not core.in_sync and core.data["threads"][CORE] != str(api_main)
    apply_profile(tree_kernel(root), load(tmp_path))
    assert_spread(root, (API, CORE))
    # Its original is the API server's (fork passed on the placement), and revert puts it back.
    old = {
        e.op.data["tid"]: e.old
        for e in Journal(tree_kernel(root)).entries()
        if e.op.kind == "affinity"
    }
    assert old[CORE] == old[API] == "cgroup-default"
    assert revert_all(tree_kernel(root)).failed == []
    assert all(c == ALL for c in cpus(root, (API, CORE)).values())
    home = f"sys/fs/cgroup{HOME}/cgroup.procs"
    assert (root / home).read_text().split() == [str(API), str(CORE)]
    mine = {k: v for k, v in digest(root).items() if str(CORE) not in k and k != home}
    assert mine == {k: v for k, v in before.items() if k != home}


# ---- the daemon: processes arrive one by one ------------------------------------------------------


def test_the_daemon_spreads_a_tree_that_arrives_one_process_at_a_time(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root), profile_path=dedicated(tmp_path))
    d.start()
    proc(root, API, 1)
    feed(d, ProcEvent("exec", API, API))
    assert_spread(root, (API,))
    here = (API,)
    for pid in (CORE, *WORKERS):
        parent = API if pid == CORE else CORE
        # Spawned from its parent's main thread: its main thread and the threads it starts
        # before gputuned places it all hold the parent's main CPU.
        proc(root, pid, parent, inherited=str(mains(root, (parent,))[parent]))
        was_main, was = mains(root, here), cpus(root, here)
        feed(d, ProcEvent("fork", pid, pid, parent), ProcEvent("exec", pid, pid))
        here = (*here, pid)
        assert_spread(root, here)
        assert mains(root, here[:-1]) == was_main, "no main thread placed earlier moved"
        new_main = mains(root, (pid,))[pid]
        moved = {tid for tid, c in cpus(root, here[:-1]).items() if c != was[tid]}
        assert all(was[tid] == {new_main} for tid in moved), "only what held its new CPU moved"
    assert set(d.placed) == set(TREE)
    # The full plans the daemon makes (drift repair, every 10th tick) and verify agree.
    plan = plan_profile(tree_kernel(root), d.profile)  # type: ignore[arg-type]
    assert [c.target for c in plan.changes if c.tuner == "process"] == []
    report = d.reapply("drift repair")
    assert report is not None and report.written == []
    assert d.last_verify["drifted"] == 0
    assert d.stop() == 0
    for pid in TREE:
        p = read_process(tree_kernel(root), pid)
        assert p.cgroup == HOME and {(t.nice, t.affinity) for t in p.threads} == {(0, ALL)}, pid


def test_the_daemon_places_a_late_worker_on_a_free_cpu_against_what_it_placed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree runs when the daemon starts; a worker arrives later, from EngineCore's main
    thread. Its main thread takes a CPU no main thread holds; only the threads that held that
    CPU move, and only their processes are read again. A new thread of a placed process is
    placed reading that process alone."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    server(root, TREE[:-1])
    d = Daemon(tree_kernel(root), profile_path=dedicated(tmp_path))
    d.start()
    assert mains(root, TREE[:-1]) == {API: 2, CORE: 3, 5200: 4, 5300: 5, 5400: 6}
    was = cpus(root, TREE[:-1])
    on = {c: [t for t, w in was.items() if w == {c}] for c in (7, 8, 9)}
    fewest = min(on, key=lambda c: (len(on[c]), c))
    read: list[str] = []
    real = FaultKernel.read_bytes

    def reading(self: FaultKernel, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        read.append(hpath)
        return real(self, hpath, offset, size)

    monkeypatch.setattr(FaultKernel, "read_bytes", reading)
    proc(root, 5500, CORE, inherited="3")
    feed(d, ProcEvent("fork", 5500, 5500, CORE))
    assert_spread(root)
    assert mains(root)[5500] == fewest, "the free CPU that holds the fewest threads"
    now = cpus(root, TREE[:-1])
    assert {t for t in was if now[t] != was[t]} == set(on[fewest])
    owners = {str(pid) for pid in TREE[:-1] if set(on[fewest]) & set(cpus(root, (pid,)))}
    assert {p.split("/")[2] for p in read if "/task/" in p} == {"5500"} | owners
    assert not d._drifted(), "the drift check knows where the moved threads went"
    add_thread(root, 5300, 5309, cpus=str(mains(root)[5300]), nice=-10)
    before = cpus(root)
    read.clear()
    feed(d, ProcEvent("thread", 5300, 5309, CORE))
    assert {p.split("/")[2] for p in read if "/task/" in p} == {"5300"}
    assert_spread(root)
    assert {t for t, c in cpus(root).items() if before[t] != c} == {5309}
    assert d.stop() == 0
