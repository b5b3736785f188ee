"""What a partition made in place writes (tuners/inplace.py): the cpuset files of a cgroup
gputuned did not make (a unit's or container's cgroup, and its ancestors'), and the unit's
``AllowedCPUs=`` told to systemd at run time (gputuned/kernel/systemd.py).

Both are :attr:`~gputuned.settings.base.Setting.borrowed`: the unit's cgroup is removed when it
stops, the kernel gives back the CPUs its partition held, and there is nothing to restore.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.kernel.sysinstall import remove_dir_if_empty
from gputuned.kernel.systemd import ALLOWED_CPUS, UNIT_NAME, dropin
from gputuned.settings.base import Op, Setting
from gputuned.settings.sysfs import CGROUP, CPUSET_FILE, SysfsAttribute
from gputuned.store import state

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel

_CPULIST = re.compile(r"[0-9,\-]{0,4000}")


class BorrowedCpuset(SysfsAttribute):
    kind = change_kind = "borrowed_cpuset"
    borrowed = True
    what = (
        "a cpuset file of a cgroup gputuned did not make (a unit's or container's cgroup made "
        "a partition in place, and its ancestors)"
    )

    def refusal(self, op: Op, value: str) -> str | None:
        if not CPUSET_FILE.fullmatch(op.path) or op.path.startswith("/sys/fs/cgroup/cpuset."):
            return f"{op.path!r} is no cpuset file of a cgroup below the root"
        return None if len(value) <= 4096 else "a value too long for the file it names"


class UnitProperty(Setting):
    """``AllowedCPUs=`` of a unit, with whether its runtime drop-in existed.

    The value is ``CPUS|present`` or ``CPUS|absent``: the property as systemd shows it, and
    whether /run/systemd/system.control/UNIT.d/50-AllowedCPUs.conf is there (for a transient
    unit, such as a container runtime's scope, under /run/systemd/transient). Writing sets the
    property at run time (which writes that drop-in) and, for ``absent``, removes the drop-in
    again, so a revert leaves /run as it was. ``data``: unit, property.
    """

    kind = change_kind = "unit_property"
    borrowed = True
    what = "a systemd unit's AllowedCPUs= set at run time (data: unit, property)"

    def ops(self, ch: Change) -> list[Op]:
        # wanted reads "2-3" for people; the op's value also says the drop-in is there
        value = f"{ch.wanted}|present"
        return [Op(ch.key, ch.tuner, ch.target, self.kind, ch.path, value, data=dict(ch.data))]

    def read(self, kernel: Kernel, op: Op) -> str:
        unit, prop = op.data["unit"], op.data["property"]
        have = kernel.unit_property(unit, prop)
        if have is None:
            raise errors.TargetGone(f"unit {unit} is not loaded", path=op.path)
        cpus = format_cpulist(parse_cpulist(have)) if have else ""
        return f"{cpus}|{'present' if kernel.exists(op.path) else 'absent'}"

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        cpus, _, dropin_state = value.partition("|")
        kernel.set_unit_property(op.data["unit"], op.data["property"], cpus)
        # systemd realizes the unit's parents with the controllers its units need, writing
        # "-cpuset" where none needs it now (the root too, in the QEMU lane's guest): the
        # parents that had it before gputuned told systemd anything get it back, top down,
        # or a partition there (gputuned's own placeholder, a neighbour's) would end with it.
        for parent in op.data.get("cpuset_kept") or ():
            ctl = f"{parent}/cgroup.subtree_control"
            if "cpuset" not in (kernel.read_optional(ctl) or "").split():
                kernel.write_text(ctl, "+cpuset")
        if dropin_state == "absent":  # systemd wrote it for us: the file and its folder go
            # (not system.control itself: gputuned.service mounts it writable, a mount point)
            state.remove(kernel, op.path)
            remove_dir_if_empty(kernel, op.path.rsplit("/", 1)[0])

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        now = self.read(kernel, op)
        return _same(now, value), now

    def refusal(self, op: Op, value: str) -> str | None:
        unit, prop = op.data.get("unit"), op.data.get("property")
        if not (isinstance(unit, str) and UNIT_NAME.fullmatch(unit)) or prop != ALLOWED_CPUS:
            return "not a unit's AllowedCPUs= that gputuned sets"
        if op.path not in (dropin(unit, prop), dropin(unit, prop, transient=True)):
            return f"{op.path!r} is not the runtime drop-in of {unit}"
        kept = op.data.get("cpuset_kept", [])
        if not (
            isinstance(kept, list)
            and len(kept) <= 64
            and all(isinstance(p, str) and re.fullmatch(CGROUP, p) for p in kept)
        ):
            return "cpuset_kept is not a list of cgroup folders"
        cpus, bar, dropin_state = value.partition("|")
        if not (bar and _CPULIST.fullmatch(cpus) and dropin_state in ("present", "absent")):
            return f"{value[:80]!r} is not CPUS|present or CPUS|absent"
        return None


def _same(have: str, want: str) -> bool:
    hc, _, hd = have.partition("|")
    wc, _, wd = want.partition("|")
    return parse_cpulist(hc) == parse_cpulist(wc) and hd == wd
