"""cgroup v2: a directory gputuned makes (the partition's cgroup), and a controller it enables
for the children of a cgroup (``+cpuset`` in ``cgroup.subtree_control``).

Both are states rather than text: present, or :data:`~gputuned.settings.base.ABSENT` (before
gputuned made it), so that revert removes only what gputuned made.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned.settings.base import ABSENT, Op, Setting
from gputuned.settings.sysfs import CGROUP

if TYPE_CHECKING:
    from gputuned.engine.changes import Change
    from gputuned.kernel import Kernel

_STATES = ("present", ABSENT)


class CgroupDir(Setting):
    kind = change_kind = "cgroup"
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
        if op.data.get("controller") != "cpuset":
            return f"controller {op.data.get('controller')!r} is not one gputuned enables"
        return None if value in _STATES else f"{value!r} is not present or absent"
