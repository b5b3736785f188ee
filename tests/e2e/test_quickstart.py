"""README's quick start, as written, on fresh Debian 12 and Debian 13 roots.

The two commands are taken from README.md itself (tests/e2e/quickstart/roots.py), so the README
cannot drift from what is tested. In a fresh root of each release (debootstrap minbase plus git,
python3 and ca-certificates, nothing else), as root, in a copy of this checkout:

- command 1 runs in full: it installs what it needs and shows the shared-host plan of this host;
  the system's Python must be left as it was (no package of ours, no pip in it: PEP 668);
- command 2 runs with the lanes switched off (``GPUTUNED_LANES=off``, so that it does not start
  this lane again inside): lint, types and every other test must pass there.

Then, in a second fresh root of each release (nothing run before it), the package is built and
installed as docs/systemd.md writes it (``scripts/build-deb``, ``apt install ./dist/...``), and
used: ``gputunectl list`` and ``plan shared-host`` from the package, its docs in place.

Both releases run at once, each in its own root (the tests that change the live kernel take a
lock that the roots share, tests/conftest.py), and each release's seconds are printed in a table
at the end of the run.
"""

from __future__ import annotations

import os
import re
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.nspawn.harness import CACHE, flock
from tests.e2e.quickstart.roots import (
    RELEASES,
    fresh_root,
    missing_tools,
    package_commands,
    readme_commands,
    remove_stale_runs,
)
from tests.e2e.quickstart.roots import base_root as cached_root

pytestmark = pytest.mark.e2e

LOGS = CACHE / "quickstart" / "last-run"
RUNS = CACHE / "quickstart" / "runs"
#: What gputunectl plan prints first: its report of the profile on this host.
PLAN_SHOWN = re.compile(r"Profile shared-host\b")


@dataclass
class Outcome:
    """What happened on one release; ``problems`` empty means it passed."""

    release: str
    suite: str
    root: str = ""
    command_1: float | None = None
    command_2: float | None = None
    package: float | None = None
    summary: str = ""
    problems: list[str] = field(default_factory=list)


class _Table:
    def __init__(self, outcomes: dict[str, Outcome], notes: list[str]) -> None:
        self.outcomes, self.notes = outcomes, notes

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.section("README quick start on fresh Debian roots")
        tr.write_line(
            f"  {'release':<20} {'root':<15} {'command 1':>9} {'command 2':>9} {'package':>9}  result"
        )
        for o in self.outcomes.values():
            c1, c2, pk = (
                f"{t:.0f} s" if t is not None else "-"
                for t in (o.command_1, o.command_2, o.package)
            )
            result = "ok" if not o.problems else "FAIL: " + o.problems[0].splitlines()[0]
            name = f"Debian {o.release} ({o.suite})"
            tr.write_line(f"  {name:<20} {o.root:<15} {c1:>9} {c2:>9} {pk:>9}  {result}")
            if o.summary:
                tr.write_line(f"  {'':<20} command 2's pytest: {o.summary}")
        for note in self.notes:
            tr.write_line(f"  note: {note}")
        tr.write_line(f"  logs: {LOGS}")


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> Iterator[dict[str, Outcome]]:
    give_up = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
    if os.geteuid() != 0:
        give_up("the quick-start lane builds Debian roots and mounts them: run as root")
    missing = missing_tools()
    if missing:
        give_up(f"missing {', '.join(missing)}: scripts/test installs them")
    commands = readme_commands()
    package_commands()  # the docs' block is there before any root is built
    found = {r: Outcome(r, s) for r, s in sorted(RELEASES.items())}
    notes: list[str] = []
    request.config.pluginmanager.register(_Table(found, notes), "gputuned-quickstart-table")
    LOGS.mkdir(parents=True, exist_ok=True)
    for old in LOGS.glob("*.log"):
        old.unlink()
    with flock(CACHE / "quickstart" / "run.lock"):
        stale = remove_stale_runs(RUNS)
        if stale:
            notes.append(f"removed run folders left by killed runs: {', '.join(stale)}")
        workers = [
            threading.Thread(target=_guarded, args=(o, commands), name=f"quickstart-{o.suite}")
            for o in found.values()
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    yield found


def _guarded(o: Outcome, commands: list[str]) -> None:
    try:
        _run_release(o, commands)
        _run_package(o)
    except Exception:  # reported by the release's test, not lost in a thread
        o.problems.append(f"the lane itself failed:\n{traceback.format_exc()}")


#: apt asks before it installs the package's Recommends (systemd, udev), and the lane has no one
#: to answer: the root is told yes, as an operator's unattended host would be.
ASSUME_YES = 'APT::Get::Assume-Yes "true";\n'
#: After the install: the package's commands work from the system's PATH, on this host.
PACKAGE_USE = (
    "command -v gputunectl && gputunectl list && gputunectl plan shared-host"
    " && test -f /usr/share/doc/gputuned/README.md && test -f /usr/share/doc/gputuned/usage.md"
)


def _run_package(o: Outcome) -> None:
    """The package built and installed by the docs' commands in a root nothing ran in before."""
    base, _ = cached_root(o.suite)
    with fresh_root(o.suite, base, RUNS) as fr:
        conf = fr.root / "etc/apt/apt.conf.d/90gputuned-lane-assume-yes"
        conf.write_text(ASSUME_YES)
        build, install = package_commands()
        ran = fr.run(
            f"{build} && {install} && {PACKAGE_USE}",
            env={"DEBIAN_FRONTEND": "noninteractive"},
            log=LOGS / f"{o.suite}-package.log",
            timeout=900,
        )
        o.package = ran.seconds
        if ran.rc != 0:
            o.problems.append(f"package (docs/systemd.md) exit {ran.rc}:\n{ran.tail()}")
        elif not PLAN_SHOWN.search(ran.log.read_text(errors="replace")):
            o.problems.append(f"the package's gputunectl showed no plan:\n{ran.tail()}")


def _run_release(o: Outcome, commands: list[str]) -> None:
    base, built = cached_root(o.suite)
    o.root = f"built {built:.0f} s" if built is not None else "cached"
    with fresh_root(o.suite, base, RUNS) as fr:
        first = fr.run(commands[0], env={}, log=LOGS / f"{o.suite}-command-1.log", timeout=1200)
        o.command_1 = first.seconds
        if first.rc != 0:
            o.problems.append(f"command 1 exit {first.rc}:\n{first.tail()}")
            return
        if not PLAN_SHOWN.search(first.log.read_text(errors="replace")):
            o.problems.append(f"command 1 showed no plan:\n{first.tail()}")
        system = fr.run(
            "python3 -c 'import pydantic' 2>&1 | tail -1; python3 -m pip --version 2>&1",
            env={},
            log=LOGS / f"{o.suite}-system-python.log",
            timeout=60,
        )
        text = system.log.read_text(errors="replace")
        if not ("No module named 'pydantic'" in text and "No module named pip" in text):
            o.problems.append(f"command 1 changed the system's Python:\n{text}")
        second = fr.run(
            commands[1],
            env={"GPUTUNED_LANES": "off"},
            log=LOGS / f"{o.suite}-command-2.log",
            timeout=1800,
        )
        o.command_2 = second.seconds
        o.summary = _pytest_summary(second.log.read_text(errors="replace"))
        if second.rc != 0:
            o.problems.append(f"command 2 exit {second.rc}:\n{second.tail(80)}")
        elif " passed" not in o.summary or re.search(r"\b\d+ failed", o.summary):  # not "xfailed"
            o.problems.append(f"command 2's pytest summary: {o.summary!r}")


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_readme_quickstart(release: str, outcomes: dict[str, Outcome]) -> None:
    o = outcomes[release]
    assert not o.problems, f"Debian {release} ({o.suite}):\n" + "\n".join(o.problems)


def _pytest_summary(log: str) -> str:
    """pytest's last summary line ("N passed, M skipped in S s"), or "" when there is none."""
    lines = [ln.strip("= ") for ln in log.splitlines() if re.search(r"\d+ passed", ln)]
    return lines[-1] if lines else ""
