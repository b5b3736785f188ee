"""gputunectl and gputuned run in processes forked from a server that imported gputuned once.

The crash-point gauntlet (test_crash_points.py) starts about 300 commands and daemons; started as
``python3 -m`` each, two thirds of every run were the imports (0.45 of 0.7 s of CPU here), and
the suite runs three times in CI (here, and in the quick-start lane's two roots). So each run is
a child of multiprocessing's forkserver, which has gputuned and the crash-point entry imported:
a new process (its own PID, environment, stdio and exit status, SIGKILL as real as ever), not
a new interpreter. The module runs as ``__main__`` exactly as ``python3 -m tests.failpoint
MODULE`` runs it. A crash point that did not fire would show: every point but the last must
end in SIGKILL, and the gauntlet asserts that for each.

:class:`Forked` has the part of :class:`subprocess.Popen` the gauntlet uses. The gauntlet starts
and waits from several threads, and multiprocessing's ``Process.start()`` polls every live child
of the process: two threads polling one child both read its status pipe, and the one that reads
second gets end-of-file, which multiprocessing reports as exit status 255 (a SIGKILL seen as
``exit 255``: test_forked.py). Every start and every poll here holds one lock; waiting for a
child only watches its pipe, and reads it under the lock.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: Imported once, in the forkserver, before any child is forked.
PRELOAD = ["gputuned.cli.main", "gputuned.daemon.main", "tests.failpoint"]

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(PRELOAD)

#: Held for every ``Process.start()``, ``is_alive()`` and ``close()`` (the module says why).
_LOCK = threading.Lock()


def _child(module: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: its environment and stdio, the crash point, then the module."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    import tests.failpoint

    tests.failpoint.install_from_env()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """``MODULE ARGS`` in a forked child; stdout and stderr go to files read at the end."""

    def __init__(self, module: str, args: list[str], env: dict[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gputuned-forked-")
        self._out = Path(self._dir.name) / "out"
        self._err = Path(self._dir.name) / "err"
        self._proc = _CTX.Process(
            target=_child, args=(module, args, env, str(self._out), str(self._err))
        )
        with _LOCK:
            self._proc.start()
        self.pid = self._proc.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with _LOCK:
                if not self._proc.is_alive():
                    self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            multiprocessing.connection.wait([self._proc.sentinel], timeout)
        if self.poll() is None:
            assert self.pid is not None
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: signal.Signals) -> None:
        if self.poll() is None:
            assert self.pid is not None
            os.kill(self.pid, sig)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait, then (stdout, stderr); the files are removed."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.wait(10)
            raise
        out = self._out.read_text(errors="replace")
        err = self._err.read_text(errors="replace")
        with _LOCK:
            self._proc.close()
        self._dir.cleanup()
        return out, err


def run(
    module: str, *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Like :func:`tests.reliability.conftest.run_module`, in a forked child."""
    child = Forked(module, list(args), env)
    out, err = child.communicate(timeout)
    assert child.returncode is not None
    return subprocess.CompletedProcess([module, *args], child.returncode, out, err)
