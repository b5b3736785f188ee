"""A real unprivileged account for tests that need one (root only)."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


def python_for(uid: int, gid: int) -> str | None:
    """An interpreter the account can run (this one may sit under /root, which is 0700)."""
    for cand in ("/usr/bin/python3", sys.executable, shutil.which("python3")):
        if cand is None:
            continue
        probe = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", cand, "-c", ""]
        if subprocess.run(probe, check=False, capture_output=True, cwd="/").returncode == 0:
            return cand
    return None


#: Suites that run at once on one kernel (the quick-start lane runs the suite in fresh roots
#: beside the outer one) each make their test accounts in their own /etc/passwd, where
#: ``useradd --system`` picks the same free uid (999): one suite's processes then run as the
#: other's user, and its ``userdel`` fails ("currently used by process N") and leaves the
#: account behind. So a test account exists in one suite at a time: this lock, in /dev/shm
#: (which the roots share), is held from making an account until it is removed. It is taken
#: after the live-kernel lock of tests/conftest.py when a test holds both, never before.
USERS_LOCK = Path(os.environ.get("GPUTUNED_USERS_LOCK", "/dev/shm/gputuned-test-users.lock"))
_depth_lock = threading.Lock()
_depth = 0
_fd: int | None = None


@contextlib.contextmanager
def users_lock() -> Iterator[None]:
    """Hold USERS_LOCK (re-entrant within this process: nested accounts share the hold)."""
    global _depth, _fd
    with _depth_lock:
        if _depth == 0:
            fd = os.open(USERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            _fd = fd
        _depth += 1
    try:
        yield
    finally:
        with _depth_lock:
            _depth -= 1
            if _depth == 0 and _fd is not None:
                os.close(_fd)  # closing the last descriptor releases the flock
                _fd = None


@contextlib.contextmanager
def system_user(name: str) -> Iterator[pwd.struct_passwd]:
    """The system account ``name``, made (no home, no login) when missing and removed again
    at the end only then; skipped where setpriv or useradd is missing."""
    for tool in ("setpriv", "useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing")
    with users_lock():
        yield from _system_user(name)


def _system_user(name: str) -> Iterator[pwd.struct_passwd]:
    created = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group", "--shell",
             "/usr/sbin/nologin", name],
            check=True,
        )  # fmt: skip
        created = True
    try:
        yield pwd.getpwnam(name)
    finally:
        if created:
            subprocess.run(["userdel", name], check=True)
            with contextlib.suppress(KeyError):  # userdel leaves the group when it is shared
                grp.getgrnam(name)
                subprocess.run(["groupdel", name], check=True)
