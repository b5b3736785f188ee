"""A real unprivileged user playing one, for tests and benchmarks (root only).

``local_user(NAME)`` is tests/users.py's system account NAME (made when missing, removed again
then), whose programs run through ``setpriv`` with a Python interpreter it may run (the
checkout's may sit under /root, which is 0700) and only the standard library, or a copy of the
gputuned package placed where it can read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.users import python_for, system_user


class NoUser(Exception):
    """A user cannot be played here (not root, a tool missing); the message says why."""


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int
    python: str

    __test__ = False  # not a test class

    def own_group(self) -> tuple[str, ...]:
        """setpriv options: this user's group as primary, its supplementary groups from NSS."""
        return (f"--regid={self.gid}", "--init-groups")

    def nobody_group(self) -> tuple[str, ...]:
        return ("--regid=65534", "--clear-groups")

    def argv(self, *cmd: str, groups: tuple[str, ...] = ()) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", *(groups or self.own_group()), *cmd]

    def run(
        self, *cmd: str, groups: tuple[str, ...] = (), env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(
            self.argv(*cmd, groups=groups), capture_output=True, text=True, timeout=timeout,
            check=False, cwd="/", env={"PATH": "/usr/bin:/bin", **(env or {})},
        )  # fmt: skip

    def python_json(
        self, code: str, *args: str, groups: tuple[str, ...] = (), timeout: float = 120
    ) -> Any:
        """Run ``code`` (stdlib only) as this user; it prints one JSON document."""
        done = self.run(self.python, "-c", code, *args, groups=groups, timeout=timeout)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)


@contextlib.contextmanager
def local_user(name: str) -> Iterator[LocalUser]:
    """The account ``name`` (tests/users.py makes it when missing and removes it again), with an
    interpreter it may run. NoUser where that cannot be (benchmarks run outside pytest)."""
    if os.geteuid() != 0:
        raise NoUser("root is required: it makes a user and runs programs as that user")
    for tool in ("setpriv", "useradd", "userdel"):
        if shutil.which(tool) is None:
            raise NoUser(f"{tool} is missing")
    with system_user(name) as pw:
        python = python_for(pw.pw_uid, pw.pw_gid)
        if python is None:
            raise NoUser(f"no Python interpreter that {name} may run")
        yield LocalUser(name, pw.pw_uid, pw.pw_gid, python)


def gputuned_copy(dest: Path) -> Path:
    """A copy of the gputuned package under ``dest`` (readable by all), for PYTHONPATH."""
    import gputuned

    lib = dest / "lib"
    shutil.copytree(
        Path(gputuned.__file__).parent,
        lib / "gputuned",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for p in [lib, *lib.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return lib
