"""A real spawn-based server tree on this machine's kernel: placed whole, put back exactly.

The tree is shaped like vLLM V1: an "API server" (its command line carries this test's token,
which the rule matches) starts an "engine" with multiprocessing's *spawn* context; the engine
starts a "worker" the same way (a grandchild); the first spawn also starts Python's resource
tracker. The engine and worker rename themselves, as setproctitle does, by writing
/proc/self/comm (prctl(PR_SET_NAME) underneath; the kernel sends PROC_EVENT_COMM). Their
command lines are spawn's own (``python3 -c from multiprocessing.spawn import spawn_main...``)
and name nothing the rule could match.

This machine has no cgroup v2 cpuset (v1/v2 hybrid), so the rule places by nice and per-thread
CPU affinity only; the cgroup half (partition) runs in the QEMU lane (tests/e2e/test_vm.py,
phase "process tree"). Orders: daemon first (children inherit at fork and are journaled with
the API server's originals), tree first then the daemon, tree first then a one-shot apply (a
child spawned after it inherits and revert puts it back). Every thread's nice and affinity
must end exactly as before. Everything started here is killed by PID at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.kernel.proc import read_process
from gputuned.profile.load import load_profile
from tests.faults import live_kernel
from tests.integration.livedaemon import running_daemon

pytestmark = pytest.mark.usefixtures("as_root")

TREE = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys, threading, time
    from multiprocessing import resource_tracker

    def rename(name):  # what setproctitle does to the thread name (comm)
        with open("/proc/self/comm", "w") as f:
            f.write(name)

    def idle(n):
        for _ in range(n):
            threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()

    def worker(q):
        rename("TREE::Worker0")
        idle(1)
        q.put(("worker", os.getpid()))
        time.sleep(3600)

    def engine(q):
        rename("TREE::Engine")
        idle(2)
        w = mp.get_context("spawn").Process(target=worker, args=(q,))
        w.start()
        q.put(("engine", os.getpid()))
        time.sleep(3600)

    def late(q):
        idle(1)
        q.put(("late", os.getpid()))
        time.sleep(3600)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        idle(1)
        print(json.dumps({"api": os.getpid()}), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd in ("spawn", "late"):
                ctx.Process(target=engine if cmd == "spawn" else late, args=(q,)).start()
                got = dict(q.get() for _ in range(2 if cmd == "spawn" else 1))
                if cmd == "spawn":
                    got["tracker"] = resource_tracker._resource_tracker._pid
                print(json.dumps(got), flush=True)
            else:
                break
    """
)

Threads = dict[int, dict[int, tuple[int, frozenset[int]]]]


class Tree:
    """The tree's processes, started from ``script``; killed by PID at the end."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pids: dict[str, int] = {}
        self.pids.update(self._read())

    def _read(self) -> dict[str, int]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the tree's API process exited ({self.proc.wait()})")
        return {k: int(v) for k, v in json.loads(line).items()}

    def send(self, cmd: str) -> dict[str, int]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        got = self._read()
        self.pids.update(got)
        return got

    def kill(self) -> None:
        for name in ("late", "worker", "engine", "tracker"):
            pid = self.pids.get(name)
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()


def threads(pids: list[int]) -> Threads:
    """Every thread's (nice, CPUs), per process."""
    out: Threads = {}
    for pid in pids:
        p = read_process(live_kernel(), pid)
        out[pid] = {t.tid: (t.nice, t.affinity) for t in p.threads}
    return out


def wait_until(what: str, pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except errors.TargetGone:
            pass
        time.sleep(0.01)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[dict[str, Any]]:
    if os.cpu_count() is None or (os.cpu_count() or 0) < 2:
        pytest.skip("needs 2 CPUs or more: the rule pins the tree to CPU 1")
    if len(Journal(live_kernel())):
        pytest.fail("a profile is applied on this machine (journal not empty): not touched")
    token = f"gputuned-tree-{uuid.uuid4().hex[:8]}"
    script = tmp_path / f"{token}.py"
    script.write_text(TREE)
    me = read_process(live_kernel(), os.getpid())
    main = next(t for t in me.threads if t.tid == os.getpid())
    yield {"token": token, "script": script, "tmp": tmp_path, "own": (main.nice, main.affinity)}
    if len(Journal(live_kernel())):
        revert_all(live_kernel())  # a failed test leaves nothing applied


def profile(tmp: Path, token: str, *, exclude_tracker: bool = False) -> Path:
    path = tmp / "tree.toml"
    extra = "exclude.cmdline = 'multiprocessing\\.resource_tracker'\n" if exclude_tracker else ""
    path.write_text(
        textwrap.dedent(
            f"""
            name = "tree-live"
            [cpusets.inference]
            cpus = "1"
            [daemon]
            drift_interval_s = 3600
            [[process]]
            name = "server"
            match.uid = 0
            match.cmdline = "{token}"
            cpus = "inference"
            nice = -3
            """
        )
        + extra
    )
    return path


def placed(pids: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        return all(
            v == (-3, frozenset({1})) for per in threads(pids).values() for v in per.values()
        )

    return check


def test_daemon_first_the_whole_spawned_tree_is_placed_and_put_back(setup: dict[str, Any]) -> None:
    prof = profile(setup["tmp"], setup["token"], exclude_tracker=True)
    with running_daemon(prof, setup["tmp"]) as d:
        tree = Tree(setup["script"])
        try:
            wait_until("the API server placed", placed([tree.pids["api"]]))
            # Spawned after the placement: fork copies nice and CPUs to the children.
            got = tree.send("spawn")
            kids = [got["engine"], got["worker"]]
            wait_until("engine and worker placed, every thread", placed([tree.pids["api"], *kids]))
            assert read_process(live_kernel(), got["engine"]).comm == "TREE::Engine"
            # The tracker is left out (exclude.cmdline): it gets the API server's originals.
            wait_until(
                "the resource tracker given its originals back",
                lambda: set(threads([got["tracker"]])[got["tracker"]].values()) == {setup["own"]},
            )
            d.send_signal(signal.SIGTERM)
            assert d.wait(timeout=30) == 0
            after = threads([tree.pids["api"], *kids, got["tracker"]])
            for pid, per in after.items():
                assert set(per.values()) == {setup["own"]}, (pid, per)
        finally:
            tree.kill()
    assert len(Journal(live_kernel())) == 0


def test_tree_first_then_the_daemon(setup: dict[str, Any]) -> None:
    tree = Tree(setup["script"])
    try:
        got = tree.send("spawn")
        pids = [tree.pids["api"], got["engine"], got["worker"], got["tracker"]]
        before = threads(pids)
        with running_daemon(profile(setup["tmp"], setup["token"]), setup["tmp"]) as d:
            wait_until("the running tree placed at daemon start", placed(pids))
            d.send_signal(signal.SIGTERM)
            assert d.wait(timeout=30) == 0
        assert threads(pids) == before
    finally:
        tree.kill()


def test_tree_first_then_a_one_shot_apply_and_a_late_child(setup: dict[str, Any]) -> None:
    tree = Tree(setup["script"])
    try:
        got = tree.send("spawn")
        pids = [tree.pids["api"], got["engine"], got["worker"], got["tracker"]]
        before = threads(pids)
        plan, report = apply_profile(
            live_kernel(), load_profile(profile(setup["tmp"], setup["token"]))
        )
        assert report.failed == []
        assert placed(pids)()
        assert any("placed only while the daemon" in n for n in plan.notes)
        # Started after the one-shot apply: no daemon places it, fork passed the placement on.
        late = tree.send("late")["late"]
        assert placed([late])()
        rep = revert_all(live_kernel())
        assert rep.failed == [], rep.failed
        assert threads(pids) == before
        assert set(threads([late])[late].values()) == {setup["own"]}
        assert any(r["target"].startswith(f"pid {late} ") for r in rep.restored), rep.restored
    finally:
        tree.kill()
