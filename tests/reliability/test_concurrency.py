"""Concurrency: applies racing each other and a revert, a daemon under a SIGHUP storm.

The host lock (/run/gputuned/lock, an flock) lets one apply or revert run at a time; the other
is refused with Busy naming the holder. Afterwards, in every test:

- the journal file reads line by line (no two writers' lines interleaved or torn), and no key
  is saved twice without a drop between (a lost or duplicated original);
- the host writes of one apply or revert never interleave with another's;
- a final revert leaves the tree byte-identical to the tree before the first apply.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.profile.load import load_profile
from gputuned.service.control import daemon_running, request
from gputuned.store.state import JOURNAL, HostLock
from tests.faults import FaultKernel, WriteRecord, tree_kernel
from tests.reliability.conftest import (
    REPO,
    cli,
    diff_keys,
    reap_daemon,
    stop_daemon,
    subprocess_env,
)
from tests.unit.test_apply import PROFILES, digest, full_profile, tree_copy

BUSY = "another gputuned apply or revert is running"


def journal_problems(root: Path) -> list[str]:
    """Lines that do not parse, and keys saved twice without a drop between."""
    path = root / JOURNAL.lstrip("/")
    if not path.exists():
        return []
    live: set[str] = set()
    bad = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad.append(f"line {n} does not parse: {line[:80]!r}")
            continue
        if rec.get("v") != 1 or rec.get("op") not in ("save", "drop"):
            bad.append(f"line {n}: {rec}")
        elif rec["op"] == "save":
            key = rec["entry"]["key"]
            if key in live:
                bad.append(f"line {n}: {key} saved twice")
            live.add(key)
        else:
            live.discard(rec["key"])
    Journal(tree_kernel(root))  # and the engine folds it
    return bad


@contextmanager
def write_log() -> Iterator[list[tuple[int, str]]]:
    """(serial number of the Host, path) of every write any Host makes, in order.

    Hosts are numbered on their first write, not told apart by ``id()``: a Host freed after
    one round and a new one made at the same address would read as one Host whose writes
    another split (seen once in 15 runs under load).
    """
    log: list[tuple[int, str]] = []
    real = FaultKernel._wrote
    lock = threading.Lock()
    serials = itertools.count()

    def wrote(self: FaultKernel, rec: WriteRecord) -> None:
        with lock:
            serial = self.__dict__.setdefault("_test_write_serial", next(serials))
            log.append((serial, rec.path))
        real(self, rec)

    FaultKernel._wrote = wrote  # type: ignore[method-assign]
    try:
        yield log
    finally:
        FaultKernel._wrote = real  # type: ignore[method-assign]


def interleaved(log: list[tuple[int, str]]) -> list[int]:
    """Hosts whose writes were split by another Host's writes (should be none)."""
    seen: list[int] = []
    for host_id, _ in log:
        if seen and seen[-1] == host_id:
            continue
        seen.append(host_id)
    return [h for h in set(seen) if seen.count(h) > 1]


def race(n: int, *jobs: Callable[[], Any], hold: bool = False) -> list[tuple[str, str]]:
    """Run ``jobs`` at once (a barrier), ``n`` rounds; each outcome is (job, "ok" | "busy").

    With ``hold``, whichever job takes the host lock keeps it until every other job of the
    round has tried and been refused: each round is then one run and the rest Busy, however
    the threads happen to be scheduled. Without it, the jobs race freely (how many collide
    depends on the machine's load, so nothing may be asserted about that number).
    """
    out = []
    for _ in range(n):
        barrier = threading.Barrier(len(jobs))
        refused = threading.Semaphore(0)

        def run(
            job: Callable[[], Any],
            barrier: threading.Barrier = barrier,
            refused: threading.Semaphore = refused,
        ) -> tuple[str, str]:
            barrier.wait()
            try:
                job()
            except errors.Busy as exc:
                assert BUSY in str(exc) and "PID" in str(exc), exc
                refused.release()
                return job.__name__, "busy"
            return job.__name__, "ok"

        with ThreadPoolExecutor(len(jobs)) as pool, holding_lock(hold, refused, len(jobs) - 1):
            out += list(pool.map(run, jobs))
    return out


@contextmanager
def holding_lock(on: bool, refused: threading.Semaphore, others: int) -> Iterator[None]:
    """While on: HostLock, once taken, waits for ``others`` refusals before the holder goes on.

    The holder waits at most 60 s per refusal: a job that never tries would otherwise hang the
    test (the assertions on the outcomes then fail and say so).
    """
    if not on:
        yield
        return
    real = HostLock.__enter__

    def enter(self: HostLock) -> HostLock:
        got = real(self)
        for _ in range(others):
            refused.acquire(timeout=60)
        return got

    HostLock.__enter__ = enter  # type: ignore[method-assign]
    try:
        yield
    finally:
        HostLock.__enter__ = real  # type: ignore[method-assign]


def test_two_applies_at_once(tmp_path: Path, terminal: list[str]) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    profile = full_profile()

    def apply_a() -> None:
        apply_profile(tree_kernel(root), profile)

    def apply_b() -> None:
        apply_profile(tree_kernel(root), profile)

    def revert() -> None:
        revert_all(tree_kernel(root))

    with write_log() as log:
        # Rounds where the lock holder waits for the others to be refused (a collision every
        # time, whatever the load), then rounds racing freely (apply, revert and apply again
        # in whatever order the scheduler picks).
        held = race(10, apply_a, apply_b, revert, hold=True)
        free = race(10, apply_a, apply_b, revert)
    assert not interleaved(log), "writes of two applies or reverts interleaved"
    assert journal_problems(root) == []
    rounds = [held[i : i + 3] for i in range(0, len(held), 3)]
    assert all(sorted(o for _, o in r) == ["busy", "busy", "ok"] for r in rounds), held
    assert all(o in ("ok", "busy") for _, o in free)
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before
    busy = sum(o == "busy" for _, o in held + free)
    terminal.append(
        f"concurrency: 20 rounds of apply + apply + revert in threads (10 with the lock held "
        f"until the others were refused): {len(held + free) - busy} ran, {busy} refused (Busy), "
        "0 interleaved writes, journal consistent, final revert exact"
    )


def test_cli_apply_refused_while_locked_and_cli_races(tmp_path: Path, terminal: list[str]) -> None:
    root = tree_copy("degraded-link", tmp_path)
    before = digest(root)
    prof = tmp_path / "shared-host.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    with HostLock(tree_kernel(root)):
        held = cli("apply", "--root", str(root), str(prof))
    assert held.returncode == 3
    assert f"{BUSY} (PID {os.getpid()})" in " ".join(held.stderr.split())
    assert digest(root) == before, "a refused apply writes nothing"
    # Processes racing: apply, apply, revert started together, 6 rounds.
    outcomes: list[tuple[str, int, bool]] = []
    for _ in range(6):
        cmds = [
            ["apply", "--root", str(root), str(prof)],
            ["apply", "--root", str(root), str(prof)],
            ["revert", "--root", str(root)],
        ]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "gputuned.cli", *c],
                cwd=REPO,
                env=subprocess_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in cmds
        ]
        for c, p in zip(cmds, procs, strict=True):
            _, err = p.communicate(timeout=60)
            busy = BUSY in " ".join(err.split())
            assert p.returncode == 0 or (p.returncode == 3 and busy), (c, p.returncode, err)
            outcomes.append((c[0], p.returncode, busy))
        assert journal_problems(root) == []
    assert cli("revert", "--root", str(root)).returncode == 0
    assert digest(root) == before
    refused = sum(b for *_, b in outcomes)
    terminal.append(
        f"concurrency: 6 rounds of gputunectl apply + apply + revert as processes: "
        f"{len(outcomes) - refused} ran, {refused} refused (Busy); final revert exact"
    )


# -- the daemon under SIGHUP --------------------------------------------------------------------


def start_daemon(root: Path, profile: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--root", str(root), "--profile", str(profile)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.005)


def hup_storm(pid: int, n: int, between: Callable[[int], object] | None = None) -> None:
    for i in range(n):
        if between is not None:
            between(i)
        os.kill(pid, signal.SIGHUP)
        time.sleep(0.002)


def test_sighup_storm_during_start_apply_and_reloads(tmp_path: Path, terminal: list[str]) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = tmp_path / "prof.toml"
    four = (PROFILES / "shared-host.toml").read_text().replace("count = 8", "count = 4")
    six = four.replace("count = 4", "count = 6")
    assert four != six
    prof.write_text(four)
    d = start_daemon(root, prof)
    try:
        # The storm starts as soon as the start apply writes its first journal entry.
        wait_for(lambda: (root / JOURNAL.lstrip("/")).exists() or d.poll() is not None, "journal")
        hup_storm(d.pid, 50)
        wait_for(
            lambda: daemon_running(tree_kernel(root)) or d.poll() is not None, "control socket"
        )
        assert d.poll() is None, (
            f"daemon died in the storm: {d.returncode} {d.communicate()[1][-800:]}"
        )
        # A second storm while the profile file flips between two versions: each reload
        # applies only the difference; the last one read wins.
        hup_storm(d.pid, 50, lambda i: prof.write_text(six if i % 2 == 0 else four))
        prof.write_text(six)
        os.kill(d.pid, signal.SIGHUP)
        host = tree_kernel(root)

        def settled() -> bool:
            st = request(host, {"cmd": "status"})
            v = request(host, {"cmd": "verify"})
            return bool(st["ok"] and v["ok"] and v["counts"]["drifted"] == 0) and (
                (root / "sys/fs/cgroup/gputuned.inference/cpuset.cpus").read_text() == "1-6\n"
            )

        wait_for(settled, "settled daemon")
        status = request(host, {"cmd": "status"})
        assert status["daemon"]["pid"] == d.pid
        reloads = status["daemon"]["reloads"]
        assert 1 <= reloads <= 101
        assert journal_problems(root) == []
        # The daemon holds the host lock for its life: a one-shot apply is refused.
        with pytest.raises(errors.Busy, match=f"PID {d.pid}"):
            apply_profile(tree_kernel(root), load_profile(prof))
        # Two control-socket applies at once: the daemon's single loop serialises them.
        data = load_profile(prof).model_dump(mode="json", by_alias=True, exclude_none=True)
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(lambda _: request(host, {"cmd": "apply", "profile": data}), range(2))
            )
        assert all(a["ok"] and not a["failed"] for a in answers), answers
        assert journal_problems(root) == []
        stop_daemon(d)
    finally:
        reap_daemon(d)
    after = digest(root)
    assert after == before, diff_keys(before, after)
    assert not (root / JOURNAL.lstrip("/")).exists()
    terminal.append(
        f"concurrency: daemon took 100 SIGHUPs (50 during its start apply, 50 while the profile "
        f"flipped) as {reloads} reloads; 2 simultaneous control applies served; journal "
        "consistent; SIGTERM revert exact"
    )
