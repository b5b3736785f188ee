"""gputuned started on this machine for a live test, up once it says READY=1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running_daemon(profile: Path, tmp: Path) -> Iterator[subprocess.Popen[str]]:
    """``gputuned --profile PROFILE``, yielded once READY=1 arrives on a notify socket in
    ``tmp``; killed by PID at the end if the test did not stop it. Its stderr must hold no
    traceback."""
    sock = tmp / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock))
    listener.settimeout(0.5)
    d = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--profile", str(profile)],
        env={**os.environ, "NOTIFY_SOCKET": str(sock)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready(listener, d, deadline=time.monotonic() + 60)
        yield d
    finally:
        if d.poll() is None:
            d.kill()
        err = d.communicate()[1]
        listener.close()
        sock.unlink(missing_ok=True)
        assert "Traceback" not in err, err


def _wait_ready(listener: socket.socket, d: subprocess.Popen[str], deadline: float) -> None:
    """Until READY=1; a daemon that exits first is reported with its exit status and its
    stderr at once (another gputuned holding the host, a refused profile), not as a timeout."""
    while True:
        try:
            if "READY=1" in listener.recv(4096).decode().split("\n"):
                return
        except TimeoutError:
            pass
        if d.poll() is not None:
            err = d.stderr.read() if d.stderr else ""
            raise AssertionError(f"gputuned exited {d.returncode} before READY=1:\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError("gputuned sent no READY=1 within 60 s")
