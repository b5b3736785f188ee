"""The super options of a mounted filesystem: the cgroup2 hierarchy's, for ``favordynmods``.

Compared as a set of options (``options``), since the kernel prints them in an order of its
own. The write is a remount, which apply starts in a thread (:meth:`MountOptions.start`):
switching favordynmods on waits for an RCU grace period inside mount(2), and apply goes on
with its next writes meanwhile (see :meth:`gputuned.kernel.base.KernelBase.start_remount`).
"""

from __future__ import annotations

import errno as E
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.kernel import mounts
from gputuned.settings.base import Op, Setting
from gputuned.settings.sysfs import CGROUP, same

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel

_OPTIONS = re.compile(r"[a-z0-9_]+(=[a-z0-9_]+)?(,[a-z0-9_]+(=[a-z0-9_]+)?)*")


class MountOptions(Setting):
    kind = change_kind = "mount"
    in_background = True
    what = "the super options of the mount at a path (a remount; data: fstype)"

    def ops(self, ch: Change) -> list[Op]:
        return [
            Op(ch.key, ch.tuner, ch.target, self.kind, ch.path, ch.wanted, "options", dict(ch.data))
        ]

    def read(self, kernel: Kernel, op: Op) -> str:
        return mounts.find(kernel, op.path, op.data["fstype"]).super_options

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        kernel.remount(op.path, op.data["fstype"], value)

    def start(self, kernel: Kernel, op: Op, value: str) -> Callable[[], None]:
        return kernel.start_remount(op.path, op.data["fstype"], value)

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        now = self.read(kernel, op)
        return same(op.compare, now, value), now

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        if getattr(exc, "errno", None) == E.EINVAL:
            # fs_parse() refuses an option the kernel does not know (favordynmods: Linux 6.0+).
            return f"the kernel does not know one of these mount options (EINVAL): {exc}"
        return None

    def refusal(self, op: Op, value: str) -> str | None:
        if op.data.get("fstype") != "cgroup2" or not re.fullmatch(CGROUP, op.path):
            return "a mount that is not the cgroup2 hierarchy"
        return None if _OPTIONS.fullmatch(value) else f"{value[:80]!r} are not mount options"
