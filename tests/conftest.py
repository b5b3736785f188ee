"""Shared fixtures for the whole suite."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults import FaultKernel, tree_kernel

# ---- host trees (tests/data/hosts, built by tests/data/build_trees.py) ---------------------

TREES_DIR = Path(__file__).resolve().parent / "data" / "hosts"

#: Every tree under tests/data/hosts; docs/dev/trees.md describes the layout. All but h200-captured
#: (a `gputunectl capture` of the lent H200 VM) are built by tests/data/build_trees.py.
ALL_TREES = (
    "h200-vm",
    "h200-captured",
    "ci-vm",
    "dual-socket-8gpu",
    "degraded-link",
    "four-gpu-one-socket",
    "two-gpu-one-node",
)


@pytest.fixture
def tree_host() -> Callable[[str], FaultKernel]:
    """``tree_host("h200-vm")`` -> the kernel of that committed tree, with faults and a write
    log (tests/faults.py; read it, don't write it: copy the tree to ``tmp_path`` first for tests
    that apply changes)."""

    def make(name: str) -> FaultKernel:
        if name not in ALL_TREES:
            raise ValueError(f"no host tree {name!r}; known: {', '.join(ALL_TREES)}")
        return tree_kernel(TREES_DIR / name)

    return make


@pytest.fixture
def fault_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels the command line opens in this process (``--root``) take the faults their
    tree lists under ``inject`` (tests/faults.py)."""
    import gputuned.root

    real = gputuned.root.open_kernel
    monkeypatch.setattr(gputuned.root, "open_kernel", lambda root: FaultKernel(real(root)))


# ---- end of host trees ----------------------------------------------------------------------


# ---- how long each part of the suite took (scripts/test prints it with lint and types) --------

#: Parts of the suite by path: the folder under tests/, and each lane (a module of tests/e2e).
_LANES = {"test_nspawn.py": "lane nspawn", "test_vm.py": "lane qemu", "test_deb.py": "lane deb"}
_part_seconds: dict[str, float] = {}
_part_outcomes: dict[str, dict[str, int]] = {}


def _part(nodeid: str) -> str:
    parts = nodeid.split("::", maxsplit=1)[0].split("/")
    if len(parts) >= 3 and parts[1] == "e2e":
        return _LANES.get(parts[2], f"lane {parts[2].removeprefix('test_').removesuffix('.py')}")
    return parts[1] if len(parts) >= 2 else "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    part = _part(report.nodeid)
    _part_seconds[part] = _part_seconds.get(part, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        counts = _part_outcomes.setdefault(part, {})
        outcome = report.outcome
        if hasattr(report, "wasxfail"):  # pytest's own summary says xfailed / xpassed
            outcome = "xfailed" if outcome == "skipped" else "xpassed"
        counts[outcome] = counts.get(outcome, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _part_seconds:
        return
    terminalreporter.section("time per part of the suite")
    for part, secs in sorted(_part_seconds.items(), key=lambda kv: -kv[1]):
        counts = ", ".join(f"{n} {k}" for k, n in sorted(_part_outcomes.get(part, {}).items()))
        terminalreporter.write_line(f"  {part:<16} {secs:7.1f} s  ({counts})")
    out = os.environ.get("GPUTUNED_TEST_TIMES")
    if out:  # scripts/test: one "part seconds" line each, for its own table
        Path(out).write_text("".join(f"{p}\t{s:.1f}\n" for p, s in _part_seconds.items()))


# ---- one test at a time on the live kernel -------------------------------------------------------

#: Tests that change this machine's kernel state (IRQ affinities, cgroups, mounts, other
#: processes' scheduling) take this lock for their whole run, so that two suites on one machine
#: (the quick-start lane runs one per Debian release at once, in chroots sharing this kernel and
#: its /dev) never see each other's changes. /dev/shm: the one place the chroots share.
LIVE_LOCK = Path(os.environ.get("GPUTUNED_LIVE_LOCK", "/dev/shm/gputuned-live-kernel.lock"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("integration") is None:
        yield
        return
    with LIVE_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
