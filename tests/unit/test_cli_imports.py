"""The light commands stay light: what ``gputunectl --help``, ``list``, ``status`` and ``verify``
load (issue 31, item 2).

Each command runs as the ``gputunectl`` script runs it (``from gputuned.cli.main import main``)
in a process of its own, which writes the names in ``sys.modules`` at its exit. No timing here
(benchmarks/cli_latency.py measures): only which heavy modules a command loads, since each
costs every start tens of milliseconds: rich, pydantic and the profile's models, the
simulator, the live backend, the tuners, the engine's planner.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.root import open_kernel
from gputuned.service.controlclient import daemon_running, request
from tests.unit.test_apply import tree_copy

REPO = Path(__file__).resolve().parents[2]

# The console script's own lines, and the modules loaded, written at exit.
DRIVER = r"""
import atexit, json, pathlib, sys
out = pathlib.Path(sys.argv.pop(1))
atexit.register(lambda: out.write_text(json.dumps(sorted(sys.modules))))
from gputuned.cli.main import main
sys.exit(main())
"""

#: What a light command has no use for, by module (a package names all of its modules).
HEAVY = (
    "rich",
    "pydantic",
    "pydantic_core",
    "gputuned.profile.model",
    "gputuned.sim",
    "gputuned.kernel.live",
    "gputuned.tuners",
    "gputuned.engine.plan",
    "gputuned.engine.apply",
    "gputuned.trial",
    "gputuned.watch",
    "gputuned.daemon",
)


def loaded(tmp_path: Path, *args: str) -> tuple[set[str], str]:
    """(the modules ``gputunectl ARGS`` loaded, its output); it must succeed."""
    out = tmp_path / "modules.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return set(json.loads(out.read_text())), run.stdout


def heavy(modules: set[str]) -> set[str]:
    """The HEAVY prefixes that ``modules`` holds."""
    return {h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)}


def test_help_loads_nothing_heavy(tmp_path: Path) -> None:
    modules, out = loaded(tmp_path, "--help")
    assert "Exit status" in out or "exit" in out.lower()
    assert heavy(modules) == set()


def test_list_loads_the_tree_and_the_models_only(tmp_path: Path) -> None:
    """list loads every profile to show its description or why it does not load (pydantic);
    on a tree it needs the simulator, never the live backend, the planner or the tuners."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    modules, out = loaded(tmp_path, "list", "--root", str(root))
    assert "shared-host" in out
    assert heavy(modules) == {"gputuned.sim", "pydantic", "pydantic_core", "gputuned.profile.model"}


def test_status_without_a_daemon_loads_no_planner(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    modules, out = loaded(tmp_path, "status", "--root", str(root))
    assert "No profile applied" in out
    assert heavy(modules) == {"gputuned.sim"}


@pytest.fixture
def daemon_tree(tmp_path: Path) -> Iterator[Path]:
    """A tree where ``gputuned --root TREE --profile shared-host`` runs (and has applied)."""
    root = tree_copy("h200-captured", tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--root", str(root), "--profile",
         str(REPO / "profiles/shared-host.toml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        host = open_kernel(root)
        deadline = time.monotonic() + 30
        while not daemon_running(host):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        request(host, {"cmd": "status"}, timeout=30)  # answered after the start's apply
        yield root
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's control socket answers root")
def test_status_and_verify_through_the_daemon(daemon_tree: Path, tmp_path: Path) -> None:
    """status asks the daemon and reads no profile (unless irqbalance runs: coexist.py);
    verify asks the daemon, never plans here, and tells that the profile file did not change
    since apply by its digest, without pydantic (one that changed is loaded: test_cli_says)."""
    modules, out = loaded(tmp_path, "status", "--root", str(daemon_tree))
    assert "Active profile: shared-host" in out and "Daemon: PID" in out
    assert heavy(modules) == {"gputuned.sim"}
    modules, out = loaded(tmp_path, "verify", "--root", str(daemon_tree))
    assert "verify shared-host" in out and "changed since it was applied" not in out
    assert heavy(modules) == {"gputuned.sim"}
