"""A CPU property of a systemd unit (CPUQuota=, CPUWeight=: the [neighbours] table), set at run time (``systemctl set-property --runtime``).

``path`` is the unit's name (``user.slice``), ``data``: ``property`` (CPUQuota or CPUWeight)
and ``cgroup`` (the unit's cgroup, for people reading the journal). The value is the
property's assignment form ("400%", "50", or "" for systemd's default), read back through
``systemctl show`` (:mod:`gputuned.kernel.units`): revert sets the value read before the
first change, which puts systemd's view and the cgroup file back as they were. The runtime
drop-in that ``set-property`` leaves in /run/systemd/system.control stays until reboot, with
the original value (an empty assignment where there was none). The read-back (and the daemon's
drift check) reads the unit's cgroup file, which systemd writes from the property, rather than
start ``systemctl`` for every check.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.kernel.units import CGROUP_FILE, SHOWN_AS, UNIT_NAME, file_form, file_holds
from gputuned.settings.base import Op, Setting
from gputuned.settings.sysfs import CGROUP

if TYPE_CHECKING:
    from gputuned.kernel import Kernel

_VALUE = {
    "CPUQuota": re.compile(r"([0-9]{1,6}(\.[0-9]{1,2})?%)?"),
    "CPUWeight": re.compile(r"[0-9]{0,5}"),
}


class UnitCpuProperty(Setting):
    kind = change_kind = "unit_cpu"
    what = "a systemd unit's runtime property (path: the unit; data: property, cgroup)"

    def read(self, kernel: Kernel, op: Op) -> str:
        value = kernel.unit_property(op.path, str(op.data["property"]))
        if value is None:
            raise errors.TargetGone(f"systemd unit {op.path}: not loaded", path=op.path)
        return value

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        kernel.set_unit_property(op.path, str(op.data["property"]), value)

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        # A unit that has stopped (a session's scope) holds any value: nothing to restore.
        cgroup = str(op.data["cgroup"])
        if not kernel.is_dir(cgroup):
            return True, "(the unit has stopped)"
        prop = str(op.data["property"])
        text = kernel.read_optional(f"{cgroup}/{CGROUP_FILE[prop]}")
        return file_holds(prop, value, text), file_form(prop, text)

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        if isinstance(exc, errors.TargetGone):
            return "the unit has stopped: nothing left to cap"
        return None

    def refusal(self, op: Op, value: str) -> str | None:
        prop = op.data.get("property")
        if not UNIT_NAME.fullmatch(op.path):
            return f"{op.path[:80]!r} is no unit name"
        if prop not in SHOWN_AS:
            return f"property {str(prop)[:40]!r} is not one gputuned sets"
        cg = op.data.get("cgroup")
        if not isinstance(cg, str) or not re.fullmatch(CGROUP, cg):
            return "a unit property without its cgroup"
        return (
            None if _VALUE[str(prop)].fullmatch(value) else f"{value[:40]!r} is not a {prop} value"
        )
