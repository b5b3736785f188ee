"""Unit tests run against trees only: any escape to the real machine fails the test loudly.

An audit hook (PEP 578) sees every ``open``, ``os.listdir`` and ``os.scandir`` in the process,
including those inside third-party code, so a forgotten kernel port cannot hide behind a helper, and
``gputuned.kernel.mount``, which gputuned raises before its one ``mount(2)`` call (a remount).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
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
