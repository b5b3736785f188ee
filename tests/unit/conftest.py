"""Unit tests run against trees only: any escape to the real machine fails the test loudly.

An audit hook (PEP 578) sees every ``open``, ``os.listdir`` and ``os.scandir`` in the process,
including those inside third-party code, so a forgotten kernel port cannot hide behind a helper, and
``gputuned.kernel.mount``, which gputuned raises before its one ``mount(2)`` call (a remount).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FORBIDDEN = ("/sys", "/proc", "/dev", "/run/gputuned", "/etc/gputuned")
ALLOWED = ("/dev/null", "/dev/urandom", "/proc/self/fd", "/dev/shm")

_active = False
_escapes: list[str] = []


def _path_of(arg: Any) -> str | None:
    if isinstance(arg, int):
        return None
    try:
        p = os.fsdecode(os.fspath(arg))
    except TypeError:
        return None
    return os.path.abspath(p)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if _active and event == "gputuned.kernel.mount":
        _escapes.append(f"mount(2) {args}")
        raise RuntimeError(f"unit test escaped to the real host: mount(2) {args}")
    if not _active or event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    p = _path_of(args[0])
    if p is None:
        return
    for pre in FORBIDDEN:
        if (p == pre or p.startswith(pre + "/")) and not p.startswith(ALLOWED):
            _escapes.append(f"{event} {p}")
            raise RuntimeError(
                f"unit test escaped to the real host: {event} {p}; go through tree_kernel(tree)"
            )


sys.addaudithook(_hook)


@pytest.fixture(autouse=True)
def _no_host_escape() -> Iterator[None]:
    global _active
    _escapes.clear()
    _active = True
    try:
        yield
    finally:
        _active = False
    assert not _escapes, f"unit test escaped to the real host: {_escapes}"


# ---- scratch folders in memory ------------------------------------------------------------------

#: Most unit tests copy a host tree (up to 3,700 small files) and throw it away: on this machine
#: kind's virtual disk the copies and their removal took about half of test_apply.py's time.
#: ``tmp_path`` therefore lies in /dev/shm (a tmpfs) when it has room, one folder per test,
#: removed as soon as the test passed; a failed test's folder is kept and named at the end.
#: GPUTUNED_TEST_SCRATCH=disk keeps pytest's own folders under the system's temp folder.
RAM_SCRATCH = Path("/dev/shm")
RAM_SCRATCH_ROOM = 2 << 30  # bytes free in it, or the disk is used
_FAILED = pytest.StashKey[bool]()
_kept: list[Path] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


def _ram_room(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= RAM_SCRATCH_ROOM


@pytest.fixture(scope="session")
def _scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    if os.environ.get("GPUTUNED_TEST_SCRATCH", "ram") == "disk" or not _ram_room(RAM_SCRATCH):
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="gputuned-unit-", dir=RAM_SCRATCH))
    try:
        yield root
    finally:
        if not _kept:  # (a test's own child may still be removing its files: rmtree, not rmdir)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _scratch_root: Path | None,
) -> Iterator[Path]:
    """pytest's ``tmp_path``, in memory where there is room (see RAM_SCRATCH)."""
    if _scratch_root is None:
        yield tmp_path_factory.mktemp(re.sub(r"\W", "_", request.node.name)[:30])
        return
    path = Path(tempfile.mkdtemp(prefix=re.sub(r"\W", "_", request.node.name)[:30] + "-",
                                 dir=_scratch_root))  # fmt: skip
    yield path
    if request.node.stash.get(_FAILED, False):
        _kept.append(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _kept:
        terminalreporter.write_line(f"the folders of {len(_kept)} failed test(s) are kept: "
                                    f"{_kept[0].parent}")  # fmt: skip


# ---- the daemon's notifications and host writes, in order (test_daemon*.py) ----------------

Events = list[tuple[str, str]]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Events]:
    """Notifications and host writes, in the order they happened."""
    from gputuned.service.notify import Notifier
    from tests.faults import FaultKernel, WriteRecord

    log: Events = []
    real_send = Notifier.send
    real_wrote = FaultKernel._wrote

    def send(self: Notifier, *fields: str) -> None:
        log.append(("notify", fields[0]))
        real_send(self, *fields)

    def wrote(self: FaultKernel, rec: WriteRecord) -> None:
        log.append(("write", rec.path))
        real_wrote(self, rec)

    monkeypatch.setattr(Notifier, "send", send)
    monkeypatch.setattr(FaultKernel, "_wrote", wrote)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    yield log
