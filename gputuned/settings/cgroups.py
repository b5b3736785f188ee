"""cgroup v2: a directory gputuned makes (the partition's cgroup), and a controller it enables
for the children of a cgroup (``+cpuset`` in ``cgroup.subtree_control`` for the partition,
``+cpu`` for ``[neighbours]``).

Both are states rather than text: present, or :data:`~gputuned.settings.base.ABSENT` (before
gputuned made it), so that revert removes only what gputuned made.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned.settings.base import ABSENT, Op, Setting
from gputuned.settings.sysfs import CGROUP

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel

_STATES = ("present", ABSENT)


class CgroupDir(Setting):
    kind = change_kind = "cgroup"
    writes_path = True
    what = "a cgroup v2 directory that must exist"

    def read(self, kernel: Kernel, op: Op) -> str:
        return "present" if kernel.is_dir(op.path) else ABSENT

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        if value == ABSENT:
            if kernel.is_dir(op.path):
                kernel.rmdir(op.path)
        elif not kernel.is_dir(op.path):
            kernel.mkdir(op.path)

    def refusal(self, op: Op, value: str) -> str | None:
        if not re.fullmatch(CGROUP, op.path) or op.path == "/sys/fs/cgroup":
            return f"{op.path!r} is no cgroup gputuned makes"
        return None if value in _STATES else f"{value!r} is not present or absent"


class CgroupController(Setting):
    kind = change_kind = "controller"
    writes_path = True
    undone_by_others = True
    what = "a controller enabled in a cgroup's cgroup.subtree_control (data: controller)"

    def ops(self, ch: Change) -> list[Op]:
        # wanted reads "+cpuset" for people; the op's value is a state
        return [Op(ch.key, ch.tuner, ch.target, self.kind, ch.path, "present", data=dict(ch.data))]

    def read(self, kernel: Kernel, op: Op) -> str:
        have = (kernel.read_optional(op.path) or "").split()
        return "present" if op.data["controller"] in have else ABSENT

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        sign = "-" if value == ABSENT else "+"
        kernel.write_text(op.path, f"{sign}{op.data['controller']}")

    def refusal(self, op: Op, value: str) -> str | None:
        if not re.fullmatch(rf"{CGROUP}/cgroup\.subtree_control", op.path):
            return f"{op.path!r} is no cgroup.subtree_control"
        if op.data.get("controller") not in ("cpuset", "cpu"):
            return f"controller {op.data.get('controller')!r} is not one gputuned enables"
        return None if value in _STATES else f"{value!r} is not present or absent"


class CgroupCpu(Setting):
    """``cpu.weight`` or ``cpu.max`` of another cgroup (``[neighbours]``).

    Those cgroups come and go with their users (a login session's scope, a container): one
    that has gone holds any value, since there is nothing left to write or to restore, so
    apply skips it and revert counts it done rather than failing on it.
    """

    kind = change_kind = "cgroup_cpu"
    writes_path = True
    what = "cpu.weight or cpu.max of a cgroup gputuned weights or caps ([neighbours])"

    def read(self, kernel: Kernel, op: Op) -> str:
        return kernel.read_value(op.path)

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        kernel.write_text(op.path, value)

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        now = kernel.read_optional(op.path)
        if now is None and not kernel.is_dir(op.path.rsplit("/", 1)[0]):
            return True, "(the cgroup has gone)"
        return now == value, now or ""

    def refusal(self, op: Op, value: str) -> str | None:
        if not re.fullmatch(rf"{CGROUP}/cpu\.(weight|max)", op.path):
            return f"{op.path!r} is no cpu.weight or cpu.max"
        form = r"[0-9]{1,5}" if op.path.endswith("weight") else r"(max|[0-9]{1,12}) [0-9]{1,7}"
        return None if re.fullmatch(form, value) else f"{value[:40]!r} is not a value of it"
