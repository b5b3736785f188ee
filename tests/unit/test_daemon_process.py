"""gputuned as a real process on a tree: sd_notify over a real socket, signals, control socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.service.control import request
from tests.faults import tree_kernel
from tests.unit.test_apply import digest, tree_copy
from tests.unit.test_daemon import profile_file


class NotifyListener:
    """Stands in for systemd's NOTIFY_SOCKET: collects the datagrams the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def wait_for(self, field: str, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.messages.append(self.sock.recv(65536).decode())
            except TimeoutError:
                continue
            if field in self.messages[-1].split("\n"):
                return self.messages[-1].split("\n")
        raise AssertionError(f"no {field} within {timeout} s; got {self.messages}")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], NotifyListener, Path]]:
    root = tree_copy("h200-captured", tmp_path)
    sock_dir = Path(f"/tmp/gtd-{os.getpid()}")  # sun_path is short: keep it out of tmp_path
    sock_dir.mkdir(exist_ok=True)
    listener = NotifyListener(sock_dir / "notify")
    env = {**os.environ, "NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "400000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputuned.daemon",
            "--root",
            str(root),
            "--profile",
            str(profile_file(tmp_path)),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc, listener, root
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    listener.sock.close()
    listener.path.unlink(missing_ok=True)
    sock_dir.rmdir()


def test_daemon_process_cycle(daemon: tuple[subprocess.Popen[str], NotifyListener, Path]) -> None:
    proc, notify, root = daemon
    before_digest = None  # the tree is tuned by the time READY arrives
    ready = notify.wait_for("READY=1")
    assert any(f.startswith("STATUS=applied shared-host:") for f in ready), ready
    assert (root / "proc/irq/42/smp_affinity_list").read_text() == "1\n"
    notify.wait_for("WATCHDOG=1", timeout=3)
    status = request(tree_kernel(root), {"cmd": "status"})
    assert status["ok"] and status["daemon"]["pid"] == proc.pid
    proc.send_signal(signal.SIGUSR2)  # stop the watchdog pings: none may come after this
    time.sleep(0.3)
    notify.messages.clear()
    time.sleep(0.6)
    assert not [m for m in notify.messages if m == "WATCHDOG=1"]
    proc.send_signal(signal.SIGHUP)
    notify.wait_for("RELOADING=1")
    notify.wait_for("READY=1")
    proc.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    assert proc.wait(timeout=20) == 0
    _, err = proc.communicate()
    assert "<6>daemon: ready" in err  # syslog priority prefixes on stderr
    assert (root / "proc/irq/42/smp_affinity_list").read_text() == "0-15\n"
    assert before_digest is None and digest(root)
