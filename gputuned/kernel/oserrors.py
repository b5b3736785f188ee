"""How an ``OSError`` becomes the gputuned error that says what to do about it.

Every module that reaches the machine (the kernel port and its backends, gputuned's own files,
its sockets) raises through :func:`translate`, once, so that everything above raises and
catches only :mod:`gputuned.errors`.
"""

from __future__ import annotations

import errno as E
import os

from gputuned import errors


def translate(exc: OSError, op: str, hpath: str) -> errors.HostError:
    """Turn an OSError into the gputuned exception that says what to do about it.

    An OSError whose ``strerror`` is not the C library's text carries a reason of its own (the
    tree's kernel model and gputuned.kernel.tasks give one); it replaces the generic hint.
    """
    code = exc.errno or 0
    what = f"{op} {hpath}"
    name = E.errorcode.get(code, str(code))
    reason = exc.strerror if exc.strerror and exc.strerror != os.strerror(code) else None
    if code in (E.ENOENT, E.ENODEV, E.ENXIO, E.ESRCH):
        return errors.TargetGone(
            f"{what}: not there ({name}); "
            + (
                reason
                or "the device, IRQ, process or cgroup may have gone, "
                "or this kernel does not have that interface"
            ),
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.EPERM, E.EACCES, E.EROFS):
        hint = reason or (
            "run gputunectl as root"
            if os.geteuid() != 0
            else "the kernel refused it; see the reason gputuned reports for this setting"
        )
        return errors.PermissionDenied(
            f"{what}: permission denied ({name}); {hint}", path=hpath, errno=code, op=op
        )
    if code in (E.EINVAL, E.ERANGE, E.EOVERFLOW):
        return errors.InvalidValue(
            f"{what}: the kernel rejected the value ({name}); "
            + (reason or "check the profile's value"),
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.EOPNOTSUPP, E.ENOSYS, E.ENOTTY):
        tail = f"; {reason}" if reason else ""
        return errors.NotSupported(
            f"{what}: not supported here ({name}){tail}", path=hpath, errno=code, op=op
        )
    if code == E.EBUSY:
        return errors.Busy(
            f"{what}: busy ({name}); {reason or 'retry when the device is idle'}",
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.ENOSPC, E.EDQUOT):
        # An IRQ affinity write gets ENOSPC when no interrupt vector is free on the target
        # CPUs (arch/x86/kernel/apic/vector.c: irq_matrix_alloc()): not a full file system.
        # So does a cpuset write that would leave the cgroup's processes without a CPU or
        # memory node (kernel/cgroup/cpuset.c validate_change(): a populated cpuset cannot
        # be emptied), and a move into a cgroup whose cpuset is empty.
        name_ = hpath.rsplit("/", 1)[-1]
        if hpath.startswith("/proc/irq/"):
            hint = (
                "no free interrupt vector on the target CPUs; give this IRQ more CPUs, or move "
                "other IRQs off them"
            )
        elif name_.startswith(("cpuset.cpus", "cpuset.mems")):
            hint = (
                "the cgroup still holds processes, and a cpuset with processes in it cannot be "
                "left without CPUs or memory nodes; move them out of the cgroup first (its "
                "cgroup.procs lists them)"
            )
        elif name_ == "cgroup.procs":
            hint = "the cgroup's cpuset has no CPU or memory node; give it CPUs first"
        else:
            hint = "free space on that filesystem"
        return errors.NoSpace(
            f"{what}: no space left ({name}); {reason or hint}",
            path=hpath,
            errno=code,
            op=op,
        )
    return errors.HostError(
        f"{what}: {exc.strerror or exc} ({name})", path=hpath, errno=code, op=op
    )
