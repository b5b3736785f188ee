"""The control socket's peer check against a real unprivileged user (root only).

Makes the system user ``gputuned-test`` when it is missing (and removes it at the end only then)
and serves ``/run/gputuned-test/control.sock`` from a directory of mode 0755. For the refusals
the socket file is made 0666, so that the kernel lets the user connect and SO_PEERCRED is what
refuses it. The client runs as that user through ``setpriv``, with a copy of the gputuned package
in the run directory (the checkout may sit where that user cannot read).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gputuned
from gputuned.service.control import ControlServer
from tests.faults import live_kernel
from tests.unit.test_control import Loop, echo
from tests.users import python_for, system_user

pytestmark = pytest.mark.integration

USER = "gputuned-test"
RUN_DIR = Path("/run/gputuned-test")
SOCK = f"{RUN_DIR}/control.sock"

# Runs as the test user: a raw request (its line, and whether the server hung up after it),
# then the same through gputuned's own client.
CLIENT = r"""
import json, socket, sys
from gputuned.service.control import daemon_running, request
from gputuned.kernel.live import LiveKernel
out = {"running": daemon_running(LiveKernel(), sys.argv[1])}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    out["connect_errno"] = exc.errno
else:
    try:
        s.sendall(b'{"v": 1, "cmd": "whoami"}\n')
    except OSError:
        pass
    buf = b""
    while b"\n" not in buf and (chunk := s.recv(4096)):
        buf += chunk
    out["line"] = json.loads(buf.split(b"\n")[0]) if buf else None
    s.settimeout(0.5)
    try:
        out["closed"] = s.recv(4096) == b""
    except ConnectionResetError:
        out["closed"] = True
    except TimeoutError:
        out["closed"] = False
try:
    out["request"] = request(LiveKernel(), {"cmd": "whoami"}, path=sys.argv[1], timeout=10)
except Exception as exc:
    out["request_error"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class TestUser:
    uid: int
    gid: int
    python: str
    lib: Path

    __test__ = False  # not a test class

    def run(self, *ids: str) -> dict[str, Any]:
        """Run CLIENT as this user (``ids``: setpriv's group options) and return what it saw."""
        cmd = ["setpriv", f"--reuid={self.uid}", *ids, self.python, "-c", CLIENT, SOCK]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(self.lib), "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=60, env=env, cwd="/"
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert isinstance(out, dict)
        return out

    def own_group(self) -> tuple[str, ...]:
        return (f"--regid={self.gid}", "--init-groups")


@pytest.fixture
def user() -> Iterator[TestUser]:
    if os.geteuid() != 0:
        pytest.skip("root is required: it makes a user and checks peers of other users")
    with system_user(USER) as pw:
        python = python_for(pw.pw_uid, pw.pw_gid)
        if python is None:
            pytest.skip(f"no Python interpreter that {USER} may run")
        shutil.rmtree(RUN_DIR, ignore_errors=True)  # a run that was killed
        RUN_DIR.mkdir()
        RUN_DIR.chmod(0o755)
        try:
            lib = RUN_DIR / "lib"
            shutil.copytree(
                Path(gputuned.__file__).parent,
                lib / "gputuned",
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            yield TestUser(pw.pw_uid, pw.pw_gid, python, lib)
        finally:
            shutil.rmtree(RUN_DIR, ignore_errors=True)


@contextlib.contextmanager
def serving(group: str | None = None) -> Iterator[ControlServer]:
    server = ControlServer(live_kernel(), echo, group=group, path=SOCK)
    loop = Loop(server)
    try:
        yield server
    finally:
        loop.stop()
        server.close()


def test_unprivileged_user_is_refused(user: TestUser, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gputuned.service.control")
    with serving():
        assert os.stat(SOCK).st_mode & 0o777 == 0o600
        # The file mode alone keeps the user out; gputuned's client says what to do.
        out = user.run(*user.own_group())
        assert out["connect_errno"] == 13  # EACCES
        assert out["running"] is True
        assert out["request_error"][0] == "PermissionDenied"
        assert "run gputunectl as root" in out["request_error"][1]

        Path(SOCK).chmod(0o666)  # this test only: let the kernel pass, so PEERCRED must refuse
        out = user.run(*user.own_group())
    denied = "permission denied: gputuned's control socket is for root"
    assert out["line"] == {"v": 1, "ok": False, "error": denied}
    assert out["closed"] is True
    assert out["request_error"] == ["DaemonError", denied]  # the daemon's refusal, as it sent it
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals, "the refusal was not logged"
    assert all(f"uid {user.uid} " in m and "pid " in m for m in refusals), refusals
    assert not Path(SOCK).exists()


def test_members_of_the_control_group_are_accepted(user: TestUser) -> None:
    with serving(group=USER):
        st = os.stat(SOCK)
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, user.gid)

        # The group is the user's own (the peer's gid).
        out = user.run(*user.own_group())
        assert out["line"]["ok"] is True, out
        assert (out["line"]["uid"], out["line"]["gid"]) == (user.uid, user.gid)
        assert out["closed"] is False
        assert out["request"]["uid"] == user.uid

        # The group is only a supplementary one: read from /proc/<pid>/status.
        nogroup = 65534
        out = user.run(f"--regid={nogroup}", f"--groups={user.gid}")
        assert out["line"]["ok"] is True, out
        assert out["line"]["gid"] == nogroup
        assert out["request"]["ok"] is True

        # Not in the group: refused by the peer check even where the mode lets it connect.
        Path(SOCK).chmod(0o666)
        out = user.run(f"--regid={nogroup}", "--clear-groups")
    denied = f"permission denied: gputuned's control socket is for root (or group {USER})"
    assert out["line"] == {"v": 1, "ok": False, "error": denied}
    assert out["request_error"] == ["DaemonError", denied]  # the daemon's refusal, as it sent it
