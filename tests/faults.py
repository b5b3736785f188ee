"""The kernel tests install: injected faults, crash points and a log of every write.

:class:`FaultKernel` wraps a backend of the kernel port (a tree's simulated kernel, or the live
one) and sees every call gputuned makes through it:

- ``writes``: every mutation that reached the kernel, in order, as a :class:`WriteRecord`:
  file writes by path; thread operations as a pseudo-path such as
  ``/proc/1234/task/1235:nice`` with data ``b"-10"``; directories as ``/sys/fs/cgroup/x:mkdir``
  / ``:rmdir`` with empty data; remounts as ``/sys/fs/cgroup:remount`` with the new options;
- ``inject(path, op, errno)``: ``op`` ("read", "write", "mkdir", "rmdir") on ``path`` fails
  with ``errno`` from now on; thread operations and remounts are writes to their pseudo-path;
  "drop" makes a write "succeed" and store nothing (a register field the device keeps
  read-only; a thread that sets its own CPUs back at once). A tree's ``gputuned-tree.json``
  may list such faults under ``inject`` (for fault tests through the command line):
  ``[{"path": ..., "op": "write", "errno": "EIO"}]``;
- a failpoint, ``kill-before-write:N`` / ``kill-after-write:N``: SIGKILL this process just
  before or just after its N-th write. A process gets it from ``GPUTUNED_FAILPOINT`` through
  :mod:`tests.failpoint`, which makes every kernel gputuned opens one of these.

None of this is in gputuned: the daemon's kernel keeps no log and injects nothing.
"""

from __future__ import annotations

import contextlib
import errno as E
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gputuned import errors
from gputuned.cpulist import format_cpulist
from gputuned.kernel.base import KernelBase
from gputuned.kernel.oserrors import translate
from gputuned.kernel.port import TREE_META, Kernel
from gputuned.kernel.tasks import where

#: Crash tests: "kill-before-write:N" / "kill-after-write:N" (docs/dev/reliability.md).
FAILPOINT_ENV = "GPUTUNED_FAILPOINT"
_ERRNO_NAMES = {name: getattr(E, name) for name in dir(E) if name.startswith("E")}


@dataclass(frozen=True)
class Fault:
    """``op`` ("read", "write", "mkdir", "rmdir", or "drop") on ``path`` fails with ``errno``."""

    path: str
    op: str
    errno: int


@dataclass(frozen=True)
class WriteRecord:
    """One write that reached the kernel."""

    path: str
    data: bytes
    offset: int | None = None


class FaultKernel(KernelBase):
    """``inner`` with faults, a failpoint and a write log (see the module)."""

    def __init__(self, inner: Kernel, *, failpoint: str = "") -> None:
        super().__init__(inner.root)
        self.inner = inner
        self.proc_connector = inner.proc_connector
        self.udev = inner.udev
        self.nvml = inner.nvml
        self.abstract_sockets = inner.abstract_sockets
        self.services = inner.services
        self.runs_gputuned = inner.runs_gputuned
        self.trusted_uid = inner.trusted_uid
        self.recorded_refusals = inner.recorded_refusals
        self.recorded_nvml = inner.recorded_nvml
        self.faults: list[Fault] = []
        self.writes: list[WriteRecord] = []
        self._mutations = 0
        self._failpoint = parse_failpoint(failpoint)
        # Remounts under way in their threads: a failpoint's SIGKILL waits for them, as a real
        # one takes effect only once the mount(2) in progress has returned.
        self._in_kernel: list[Callable[[], None]] = []
        meta = self.root / TREE_META
        if self.root != Path("/") and meta.is_file():
            for f in json.loads(meta.read_text()).get("inject", []):
                code = 0 if f["op"] == "drop" else _ERRNO_NAMES[f["errno"]]
                self.faults.append(Fault(f["path"], f["op"], code))

    def inject(self, path: str, op: str, errno_: int) -> None:
        """Make ``op`` on ``path`` fail with ``errno_`` from now on ("drop": store nothing)."""
        self.faults.append(Fault(path, op, errno_))

    # -- the port, through the faults -------------------------------------------------------

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        self._check_fault("read", hpath)
        return self.inner.read_bytes(hpath, offset, size)

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        self._check_fault("write", hpath)
        if not self._dropped(hpath):
            self.inner.write_bytes(hpath, data, offset)
        self._wrote(WriteRecord(hpath, data, offset))

    def mkdir(self, hpath: str) -> None:
        self._check_fault("mkdir", hpath)
        self.inner.mkdir(hpath)
        self._wrote(WriteRecord(f"{hpath}:mkdir", b""))

    def rmdir(self, hpath: str) -> None:
        self._check_fault("rmdir", hpath)
        self.inner.rmdir(hpath)
        self._wrote(WriteRecord(f"{hpath}:rmdir", b""))

    def char_device(self, hpath: str) -> tuple[int, int] | None:
        return self.inner.char_device(hpath)

    def thread_group(self, tid: int) -> int:
        return self.inner.thread_group(tid)

    def set_nice(self, tid: int, nice: int) -> None:
        self._thread_op(tid, "nice", str(nice), lambda: self.inner.set_nice(tid, nice))

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        shown = format_cpulist(cpus)
        self._thread_op(tid, "affinity", shown, lambda: self.inner.set_affinity(tid, cpus))

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        self._thread_op(
            tid,
            "scheduler",
            f"{policy} {priority}",
            lambda: self.inner.set_scheduler(tid, policy, priority),
        )

    def user_id(self, name: str) -> int | None:
        return self.inner.user_id(name)

    def unit_property(self, unit: str, name: str) -> str | None:
        self._check_fault("read", f"{unit}:{name}")
        return self.inner.unit_property(unit, name)

    def set_unit_property(self, unit: str, name: str, value: str) -> None:
        hpath = f"{unit}:{name}"  # as the tree's write_errors name it (sim/tree.py)
        self._check_fault("write", hpath)
        if not self._dropped(hpath):
            self.inner.set_unit_property(unit, name, value)
        self._wrote(WriteRecord(hpath, value.encode()))

    def start_remount(self, point: str, fstype: str, super_options: str) -> Callable[[], None]:
        """Fault checks and the write record stay in the calling thread, so injected faults
        and crash points count writes in one order."""
        hpath = f"{point}:remount"
        self._check_fault("write", hpath)
        record = WriteRecord(hpath, super_options.encode())
        if self._dropped(hpath):
            return lambda: self._wrote(record)  # "succeeds", changes nothing
        started = self.inner.start_remount(point, fstype, super_options)
        self._in_kernel.append(started)

        def finish() -> None:
            self._in_kernel.remove(started)
            started()
            self._wrote(record)

        return finish

    # -- faults, the failpoint, the log --------------------------------------------------------

    def _thread_op(self, tid: int, what: str, data: str, run: Callable[[], None]) -> None:
        hpath = where(self.inner.thread_group(tid), tid, what)
        self._check_fault("write", hpath)
        if not self._dropped(hpath):  # "drop": as if the thread set its own value back at once
            run()
        self._wrote(WriteRecord(hpath, data.encode()))

    def _dropped(self, hpath: str) -> bool:
        return any(f.op == "drop" and f.path == hpath for f in self.faults)

    def _check_fault(self, op: str, hpath: str) -> None:
        if op != "read":
            self._mutations += 1
            if self._failpoint == ("before", self._mutations):
                self._kill(f"before write {self._mutations} ({hpath})")
        for f in self.faults:
            if f.op == op and f.path == hpath:
                raise translate(OSError(f.errno, os.strerror(f.errno)), op, hpath)

    def _wrote(self, rec: WriteRecord) -> None:
        self.writes.append(rec)
        # ">=": a write the kernel refused is not "done", so "after N" is the first done write
        # from the N-th attempt on.
        fp = self._failpoint
        if fp is not None and fp[0] == "after" and self._mutations >= fp[1]:
            self._kill(f"after write {self._mutations} ({rec.path})")

    def _kill(self, where_: str) -> None:
        """The failpoint's SIGKILL. A signal ends a task only on its way out of the kernel, so a
        remount in progress in its thread completes (or fails) first, as mount(2) would."""
        for started in list(self._in_kernel):
            with contextlib.suppress(Exception):  # its error no longer matters: we die
                started()
        _die(where_)


def _die(where_: str) -> None:
    sys.stderr.write(f"gputuned: {FAILPOINT_ENV}: SIGKILL {where_}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def parse_failpoint(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    kind, _, n = text.partition(":")
    if kind not in ("kill-before-write", "kill-after-write") or not n.isdigit():
        raise errors.GputunedError(
            f"{FAILPOINT_ENV}={text!r}: use kill-before-write:N or kill-after-write:N"
        )
    return (kind.split("-")[1], int(n))


def tree_kernel(root: Path | str) -> FaultKernel:
    """The kernel of the host tree at ``root``, with faults and a write log."""
    from gputuned.sim.tree import SimKernel

    return FaultKernel(SimKernel(Path(root)))


def live_kernel() -> FaultKernel:
    """This machine's kernel, with faults and a write log (integration tests)."""
    from gputuned.kernel.live import LiveKernel

    return FaultKernel(LiveKernel())
