"""The live backend of the kernel port: the running machine.

Files are written with one ``write(2)`` each, threads are changed with ``setpriority(2)`` (per
thread when given a TID), ``sched_setaffinity(2)`` and ``sched_setscheduler(2)``, and a
remount is ``mount(2)`` with ``MS_REMOUNT`` through libc (no shell, no mount(8)). Every
``OSError`` becomes a gputuned error that says why (:mod:`gputuned.kernel.tasks`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as E
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path

from gputuned import errors
from gputuned.kernel import mounts, units
from gputuned.kernel.base import KernelBase, translating, write_file
from gputuned.kernel.sysinstall import run_tool
from gputuned.kernel.systemd import dropin
from gputuned.kernel.tasks import check_scheduler, explain, where

_OS_POLICY = {
    "other": os.SCHED_OTHER,
    "fifo": os.SCHED_FIFO,
    "rr": os.SCHED_RR,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
}
_RMDIR_BUSY = "a cgroup that still has processes or child cgroups, or a mount point; empty it first"


class LiveKernel(KernelBase):
    """The machine gputuned runs on, rooted at ``/``."""

    proc_connector = True
    udev = True
    nvml = True
    abstract_sockets = True
    services = True
    runs_gputuned = True
    trusted_uid: int | None = 0

    def __init__(self) -> None:
        super().__init__(Path("/"))

    # -- files ----------------------------------------------------------------------------

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        with translating("write", hpath):
            write_file(self._real(hpath), data, offset)

    def mkdir(self, hpath: str) -> None:
        with translating("mkdir", hpath):
            os.mkdir(self._real(hpath))

    def rmdir(self, hpath: str) -> None:
        with translating("rmdir", hpath):
            try:
                os.rmdir(self._real(hpath))
            except OSError as exc:
                if exc.errno != E.EBUSY:
                    raise
                raise OSError(E.EBUSY, _RMDIR_BUSY) from exc

    # -- threads --------------------------------------------------------------------------

    def set_nice(self, tid: int, nice: int) -> None:
        at = where(self.thread_group(tid), tid, "nice")
        _syscall(lambda: os.setpriority(os.PRIO_PROCESS, tid, nice), at)

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        at = where(self.thread_group(tid), tid, "affinity")
        _syscall(lambda: os.sched_setaffinity(tid, cpus), at, cpus=cpus)

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        at = where(self.thread_group(tid), tid, "scheduler")
        check_scheduler(policy, priority)
        param = os.sched_param(priority)
        _syscall(lambda: os.sched_setscheduler(tid, _OS_POLICY[policy], param), at, policy=policy)

    def user_id(self, name: str) -> int | None:
        """Asks the system's user database (NSS: /etc/passwd, LDAP, ...)."""
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None

    # -- systemd's units ------------------------------------------------------------------

    def unit_property(self, unit: str, name: str) -> str | None:
        """``systemctl show``: LoadState first, since a unit systemd does not know shows
        empty values and exit status 0. CPUQuota and CPUWeight come back in the form an
        assignment takes (:func:`gputuned.kernel.units.show_form`)."""
        shown = units.SHOWN_AS.get(name, name)
        argv = ["systemctl", "--no-ask-password", "show", "-p", f"LoadState,{shown}", "--", unit]
        run = run_tool(argv, timeout=30)
        if run.rc != 0:
            raise _unit_error(unit, "read", run.rc, run.output)
        fields = dict(line.partition("=")[::2] for line in run.output.splitlines())
        if fields.get("LoadState") != "loaded":
            return None
        value = fields.get(shown, "").strip()
        return units.show_form(name, value) if name in units.SHOWN_AS else value

    def set_unit_property(self, unit: str, name: str, value: str) -> None:
        if name in units.SHOWN_AS:
            units.check_property(name, value)
        # "--" ends the options: a unit name never reaches systemctl as one of them.
        argv = ["systemctl", "--no-ask-password", "set-property", "--runtime", "--", unit]
        argv.append(f"{name}={value}")
        run = run_tool(argv, timeout=30)
        if run.rc == 0:
            return
        said = run.output or f"exit status {run.rc}"
        if "not loaded" in said or "not found" in said:
            raise errors.TargetGone(f"unit {unit}: {said}", path=dropin(unit, name), errno=E.ENOENT)
        raise _unit_error(unit, "set", run.rc, run.output)

    # -- mounts ---------------------------------------------------------------------------

    def _mount(self, mount: mounts.Mount, flags: int, data: str) -> None:
        point, fstype = mount.point, mount.fstype
        sys.audit("gputuned.kernel.mount", point, fstype, flags, data)  # tests/unit's guard
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        libc.mount.restype = ctypes.c_int
        rc = libc.mount(
            mount.source.encode(), point.encode(), fstype.encode(), flags, data.encode() or None
        )
        if rc == 0:
            return
        code = ctypes.get_errno()
        reason = os.strerror(code)
        if code == E.EINVAL:
            # fs_parse() refuses an option the filesystem does not know (cgroup2_parse_param()).
            reason = f"the kernel does not take {fstype} options {data!r}: one is unknown to it" + (
                f" (those it has are listed in {mounts.CGROUP_FEATURES})"
                if fstype == "cgroup2"
                else ""
            )
        elif code == E.EPERM:
            reason = (
                "mount(2) needs CAP_SYS_ADMIN, and a seccomp filter (systemd SystemCallFilter=) "
                "or an LSM may refuse it"
            )
        raise OSError(code, reason)


def set_own_realtime(priority: int) -> None:
    """SCHED_FIFO at ``priority`` for the calling thread (the daemon's event thread), with
    SCHED_RESET_ON_FORK: a thread or process it starts begins at SCHED_OTHER (sched(7)).
    gputuned's own thread is on this machine whatever kernel it tunes."""
    check_scheduler("fifo", priority)
    param = os.sched_param(priority)
    policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    _syscall(
        lambda: os.sched_setscheduler(0, policy, param),
        "/proc/thread-self:scheduler",
        policy="fifo",
    )


def _unit_error(unit: str, what: str, rc: int, output: str) -> errors.HostError:
    """systemctl's failure as a gputuned error; a unit that is gone is TargetGone."""
    text = output.strip()[:300] or f"exit status {rc}"
    if "not loaded" in text or "not found" in text.lower():
        return errors.TargetGone(
            f"systemd unit {unit}: not loaded ({text}); it has stopped", path=unit, errno=E.ENOENT
        )
    return errors.HostError(
        f"systemctl could not {what} a property of {unit}: {text}; check `systemctl status "
        f"{unit}` and that systemd answers on D-Bus",
        path=unit,
        errno=E.EIO,
    )


def _syscall(call: Callable[[], None], at: str, **ctx: object) -> None:
    try:
        call()
    except OSError as exc:
        raise explain(exc, at, **ctx) from exc
