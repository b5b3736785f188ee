"""End-to-end tests: gputuned installed into, and run by, a real systemd in a container.

Marked ``e2e``; they run as root only (the container needs it) and take well under a minute
once the root file system is cached (``pytest -m "not e2e"`` leaves them out).
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.nspawn import harness

#: scripts/test's switch for the lanes (README, "Development"); the quick-start lane runs the
#: suite with it off inside its containers, so that it does not start itself again.
LANES_OFF = os.environ.get("GPUTUNED_LANES", "on") == "off"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
            if LANES_OFF:
                item.add_marker(pytest.mark.skip(reason="not run: GPUTUNED_LANES=off"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not harness.CHECKS and not harness.NOTES:
        return
    tr = terminalreporter
    tr.section("gputuned e2e (systemd-nspawn)")
    for note in harness.NOTES:
        tr.write_line(f"  {note}")
    total = 0.0
    for c in harness.CHECKS:
        total += c.seconds
        mark = "ok  " if c.ok else "FAIL"
        tail = f"  {c.detail}" if c.detail else ""
        tr.write_line(f"  {mark} {c.seconds:6.2f} s  {c.name}{tail}")
    passed = sum(c.ok for c in harness.CHECKS)
    tr.write_line(f"  {passed} of {len(harness.CHECKS)} checks passed in {total:.1f} s")
