"""A whole process's cgroup v2 (``data``: pid, start time, ``mount``: the cgroup v2 mount).

The value is a cgroup path as /proc/PID/cgroup shows it (``/gputuned.inference``); writing it
moves the process with all its threads (a write to ``cgroup.procs``). The process's identity
(PID and start time) is checked before every read and write.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned.kernel.procfs import cgroup_path
from gputuned.kernel.system import nearest_cgroup
from gputuned.settings.base import (
    Op,
    Setting,
    check_identity,
    process_ids_refusal,
    read_only_reason,
)
from gputuned.settings.sysfs import CGROUP

if TYPE_CHECKING:
    from gputuned.kernel import Kernel
    from gputuned.kernel.mounts import MountTable

_CGROUP_PATH = re.compile(r"/([^/\0]+(/[^/\0]+)*)?")


class ProcessCgroup(Setting):
    kind = change_kind = "proc_cgroup"
    placement = True
    what = "the cgroup v2 of a whole process (data: pid, start, mount)"

    def read(self, kernel: Kernel, op: Op) -> str:
        check_identity(kernel, op)
        return cgroup_path(kernel.read_text(f"/proc/{op.data['pid']}/cgroup")) or "/"

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        check_identity(kernel, op)
        kernel.move_to_cgroup(int(op.data["pid"]), f"{op.data['mount']}{value}".rstrip("/") or "/")

    def impossible(self, op: Op, mounts: MountTable) -> str | None:
        """A move writes the new cgroup's cgroup.procs: refused (EROFS) under a read-only
        mount of the hierarchy (systemd's ProtectControlGroups=yes, a container's)."""
        held = mounts.covering(f"{op.data['mount']}{op.value}".rstrip("/") + "/cgroup.procs")
        return read_only_reason(held.point) if held is not None and held.refuses_writes else None

    def restoring(self, kernel: Kernel, op: Op, old: str) -> tuple[Op, str]:
        """Back to the cgroup it came from, or the nearest existing ancestor of that one when
        it was removed meanwhile (a unit restarted, a container gone)."""
        return op, nearest_cgroup(kernel, str(op.data["mount"]), old)

    def refusal(self, op: Op, value: str) -> str | None:
        d = op.data
        missing = process_ids_refusal(op, thread=False)
        if missing:
            return missing
        mount = d.get("mount")
        ok = isinstance(mount, str) and re.fullmatch(CGROUP, mount) is not None
        ok = ok and _CGROUP_PATH.fullmatch(value) is not None and ".." not in value.split("/")
        return None if ok else f"{value[:80]!r} is not a {op.kind} value gputuned writes"
