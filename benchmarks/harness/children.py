"""The processes a benchmark starts: tracked by PID, stopped by PID, dying with it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.repo import REPO

_libc: Any = None


def _die_with_parent(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets ``sig`` when this process dies (prctl PR_SET_PDEATHSIG)."""
    global _libc  # noqa: PLW0603  loaded once, before any fork
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc = _libc

    def pre() -> None:
        libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (include/uapi/linux/prctl.h)

    return pre


class Children:
    """Every process started here, by PID; ``stop_all`` ends them newest first."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started: list[int] = []

    def start(
        self, argv: list[str], *, death_signal: int = signal.SIGKILL, **kw: Any
    ) -> subprocess.Popen[bytes]:
        env = kw.pop("env", None) or dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            argv,
            env=env,
            # This process starts no threads, so a preexec_fn is safe here.
            preexec_fn=_die_with_parent(death_signal),  # noqa: PLW1509
            **kw,
        )
        self.procs[proc.pid] = proc
        self.started.append(proc.pid)
        return proc

    def stop(
        self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 5.0
    ) -> int:
        """Signal one child by its PID, wait, SIGKILL if it does not go; returns its status."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.pop(proc.pid, None)
        return proc.returncode

    def stop_all(self) -> None:
        for pid in reversed(list(self.procs)):
            self.stop(self.procs[pid], wait=2.0)

    def alive(self) -> list[int]:
        """PIDs started here that still exist (a reaped child's PID is gone)."""
        out = []
        for pid in self.started:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            out.append(pid)
        return out


def running(pid: int) -> bool:
    """Still running (a zombie, which only waits for its parent to reap it, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
