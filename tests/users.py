"""A real unprivileged account for tests that need one (root only)."""

from __future__ import annotations

import contextlib
import grp
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator

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


@contextlib.contextmanager
def system_user(name: str) -> Iterator[pwd.struct_passwd]:
    """The system account ``name``, made (no home, no login) when missing and removed again
    at the end only then; skipped where setpriv or useradd is missing."""
    for tool in ("setpriv", "useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing")
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
