"""systemd's view of a unit's cgroup: the properties gputuned sets at run time.

A cgroup a unit owns is systemd's to write: at every realize (a ``daemon-reload``, a
``set-property`` on any unit of the slice, a restart) it writes the unit's ``cpuset.cpus``
from ``AllowedCPUs=``. A partition made in place in a unit's cgroup therefore first tells
systemd the same CPUs, at run time: ``systemctl set-property --runtime UNIT AllowedCPUs=...``
(the D-Bus SetUnitProperties call with runtime=true), which systemd keeps in the drop-in
:func:`dropin` under /run and applies at once (src/core/dbus-cgroup.c
bus_cgroup_set_property(); it also enables the cpuset controller on the parents'
``cgroup.subtree_control``). Put back, the old value is set the same way and the drop-in is
removed when it was not there before, so nothing of gputuned stays in /run.

The machine's side (``systemctl``) is the kernel port's (:meth:`~gputuned.kernel.port.Kernel.
set_unit_property`); a tree's is modelled in :mod:`gputuned.sim.units`.
"""

from __future__ import annotations

import re

#: sd_booted(3): PID 1 is systemd exactly when this directory exists.
SYSTEMD_RUNTIME = "/run/systemd/system"
#: Where ``set-property --runtime`` keeps what it was told (src/core/unit.c
#: unit_write_setting(): the "control" drop-in directory, 50-<property>.conf).
CONTROL_DIR = "/run/systemd/system.control"
#: The one property gputuned sets.
ALLOWED_CPUS = "AllowedCPUs"
#: systemd's unit name characters (src/basic/unit-name.c VALID_CHARS), '@' for instances.
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,200}\.(service|scope)")


#: Where systemd keeps a transient unit (a runtime's scope: podman's libpod-<id>.scope) and
#: every drop-in written for it (src/core/unit.c unit_drop_in_dir()); it removes them with
#: the unit.
TRANSIENT_DIR = "/run/systemd/transient"


def dropin(unit: str, prop: str = ALLOWED_CPUS, *, transient: bool = False) -> str:
    """The runtime drop-in systemd writes for ``set-property --runtime UNIT PROP=``: under
    the transient units' folder for a transient unit, else the "control" one."""
    return f"{TRANSIENT_DIR if transient else CONTROL_DIR}/{unit}.d/50-{prop}.conf"


def unit_of(cgroup: str) -> str | None:
    """The unit whose own cgroup ``cgroup`` is (slices from the top, then the unit, nothing
    below it: /system.slice/vllm.service, /machine.slice/libpod-<id>.scope), or None."""
    parts = [p for p in cgroup.split("/") if p]
    if len(parts) < 2 or not all(p.endswith(".slice") for p in parts[:-1]):
        return None
    return parts[-1] if UNIT_NAME.fullmatch(parts[-1]) else None


def section(unit: str) -> str:
    """The drop-in section systemd writes a cgroup property under: [Service], [Scope]."""
    return "Scope" if unit.endswith(".scope") else "Service"
