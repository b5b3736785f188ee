"""Shared helpers of the reliability gauntlet (docs/dev/reliability.md quotes what these tests print).

Trees are copied from tests/data/hosts and compared with :func:`tests.unit.test_apply.digest`
(every file, link and directory except gputuned's own state); :func:`fingerprint` shortens a
digest to 12 hex digits for the printed tables.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.engine.journal import Journal
from gputuned.settings.registry import holds
from tests.faults import tree_kernel
from tests.localuser import LocalUser, NoUser, local_user
from tests.unit.test_apply import digest

REPO = Path(__file__).resolve().parents[2]


def fingerprint(d: dict[str, str]) -> str:
    """A digest of a tree, shortened for tables: equal trees print equal fingerprints."""
    return hashlib.sha256(json.dumps(sorted(d.items())).encode()).hexdigest()[:12]


def tree_fingerprint(root: Path) -> str:
    return fingerprint(digest(root))


def diff_keys(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def journal_only_names_values_in_place(root: Path) -> list[str]:
    """Entries left in the journal whose original is NOT what the host holds now (should be none).

    After a rollback whose "drop" records could not be written (a full /run), entries stay in
    the file; they are harmless exactly when the host already holds their old value.
    """
    host = tree_kernel(root)
    bad = []
    for e in Journal(host).entries():
        try:
            ok = holds(host, e.op, e.old)[0]
        except Exception as exc:  # a process that is gone: nothing to restore
            ok = "gone" in str(exc) or "not there" in str(exc)
        if not ok:
            bad.append(e.op.key)
    return bad


#: Byte code of the many short ``python3 -m gputuned...`` runs, cached outside the checkout
#: (this host sets PYTHONDONTWRITEBYTECODE; compiling gputuned costs ~0.1 s per start).
PYCACHE = Path(tempfile.gettempdir()) / f"gputuned-reliability-pycache-{os.getuid()}"


def subprocess_env() -> dict[str, str]:
    """This environment for a child gputuned: no inherited failpoint, cached byte code."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GPUTUNED_FAILPOINT", "PYTHONDONTWRITEBYTECODE")
    }
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python3 -m MODULE ARGS`` from the checkout, with ``env`` added to this environment.

    With ``GPUTUNED_FAILPOINT`` in ``env``, through the test entry point that gives the
    module's kernels that crash point (tests/failpoint.py)."""
    entry = ["tests.failpoint"] if "GPUTUNED_FAILPOINT" in (env or {}) else []
    return subprocess.run(
        [sys.executable, "-m", *entry, module, *args],
        capture_output=True,
        text=True,
        env=subprocess_env() | (env or {}),
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The one-shot ``gputunectl``."""
    return run_module("gputuned.cli", *args, env=env)


@pytest.fixture
def terminal(capsys: pytest.CaptureFixture[str]) -> Iterator[list[str]]:
    """Lines to show on the terminal after the test even under -q (the figures for the docs)."""
    lines: list[str] = []
    yield lines
    with capsys.disabled():
        sys.stdout.write("\n" + "\n".join(lines) + "\n")


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: run scripts/test as root (CI does)")


# ---- a real unprivileged user and a daemon it can reach (test_permissions, test_local_users) --

#: The user the gauntlet plays (made when missing and removed again: tests/localuser.py).
USER = "gputuned-test2"


@pytest.fixture
def user() -> Iterator[LocalUser]:
    try:
        with local_user(USER) as u:
            yield u
    except NoUser as exc:
        pytest.skip(str(exc))


@pytest.fixture
def open_tree() -> Iterator[Path]:
    """A tree under a directory other users may traverse (pytest's own tmp dirs are 0700)."""
    from tests.unit.test_apply import tree_copy

    work = Path(tempfile.mkdtemp(prefix="gputuned-perm-"))
    work.chmod(0o755)
    try:
        yield tree_copy("degraded-link", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def daemon(
    root: Path, profile: Path, *, log: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A real gputuned on ``root``, ready when its control socket answers a status (the socket
    is there before the start's apply, its requests are answered after); SIGTERM at the end
    must make it exit 0. ``log``: its stderr goes there (a pipe fills up under many requests)."""
    from gputuned.service.control import daemon_running, request

    out = log.open("w") if log is not None else None
    d = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--root", str(root), "--profile", str(profile)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=out if out is not None else subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not daemon_running(tree_kernel(root)):
            err = log.read_text() if log is not None else ""
            assert d.poll() is None, err[-800:] or d.communicate()[1][-800:]
            assert time.monotonic() < deadline, "daemon not ready"
            time.sleep(0.02)
        request(tree_kernel(root), {"cmd": "status"}, timeout=30)
        yield d
        stop_daemon(d)
    finally:
        reap_daemon(d)
        if out is not None:
            out.close()


def stop_daemon(d: subprocess.Popen[str]) -> None:
    """SIGTERM: the daemon reverts and must exit 0."""
    d.send_signal(signal.SIGTERM)
    assert d.wait(timeout=30) == 0


def reap_daemon(d: subprocess.Popen[str]) -> None:
    """Kill a daemon a failed test left running."""
    if d.poll() is None:
        d.kill()
        d.wait()
