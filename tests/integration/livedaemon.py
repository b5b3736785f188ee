"""gputuned started on this machine for a live test, up once it says READY=1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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
    listener.settimeout(30)
    d = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--profile", str(profile)],
        env={**os.environ, "NOTIFY_SOCKET": str(sock)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while "READY=1" not in listener.recv(4096).decode().split("\n"):
            pass
        yield d
    finally:
        if d.poll() is None:
            d.kill()
        err = d.communicate()[1]
        listener.close()
        sock.unlink(missing_ok=True)
        assert "Traceback" not in err, err
