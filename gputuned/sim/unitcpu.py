"""systemd's runtime unit properties in a tree whose PID 1 is systemd (``/run/systemd/system``).

What ``systemctl set-property --runtime UNIT CPUQuota=400%`` leaves behind: the drop-in
``/run/systemd/system.control/UNIT.d/50-CPUQuota.conf`` (src/core/dbus-unit.c
unit_write_settingf()), and the unit's cgroup file written by systemd (``cpu.max`` "400000
100000"; ``cpu.weight``), the ``cpu`` controller enabled on the way down first
(unit_realize_cgroup()). An empty assignment resets the property to its default and, as on a
real host, still leaves a drop-in holding that empty assignment. A tree's unit is the cgroup of
that name under its cgroup v2 mount; systemd's own unit files are not modelled (a property no
drop-in sets reads as the default, "").
"""

from __future__ import annotations

import errno as E
from collections.abc import Callable

from gputuned.kernel.units import CONTROL_DIR, check_property
from gputuned.sim.files import TreeFiles, fail

_SECTION = {"slice": "Slice", "service": "Service", "scope": "Scope"}
_HEADER = (
    '# This is a drop-in unit file extension, created via "systemctl set-property"\n'
    "# or an equivalent operation. Do not edit.\n"
)
#: The cgroup file and its default value, per property (systemd.resource-control(5)).
_FILE = {"CPUQuota": ("cpu.max", "max 100000"), "CPUWeight": ("cpu.weight", "100")}


def _dropin(unit: str, name: str) -> str:
    return f"{CONTROL_DIR}/{unit}.d/50-{name}.conf"


def read(tf: TreeFiles, unit: str, name: str) -> str:
    check_property(name, "")
    text = tf.get(_dropin(unit, name))
    if text is None:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def unit_cgroup(tf: TreeFiles, unit: str) -> str:
    """The cgroup systemd made for ``unit``; ENOENT ("not loaded") when there is none."""
    for mount in tf.cgroup2_mounts():
        todo = [mount]
        while todo:
            cg = todo.pop()
            for kid in tf.children(cg):
                if kid.rsplit("/", 1)[-1] == unit:
                    return kid
                todo.append(kid)
    raise fail(E.ENOENT, f"unit {unit} not loaded")


def write(
    tf: TreeFiles, unit: str, name: str, value: str, write_cg: Callable[[str, str], None]
) -> None:
    """Set the property: the drop-in, then the cgroup file (``write_cg(hpath, text)``, the
    kernel model's own write, so the kernel's checks apply)."""
    check_property(name, value)
    cg = unit_cgroup(tf, unit)
    mount = tf.cgroup2_mount(cg) or ""
    # systemd enables the controller in every ancestor's subtree_control, top down.
    parts = cg[len(mount) :].strip("/").split("/")
    for depth in range(len(parts)):
        parent = "/".join([mount, *parts[:depth]])
        if "cpu" not in (tf.get(f"{parent}/cgroup.subtree_control") or "").split():
            write_cg(f"{parent}/cgroup.subtree_control", "+cpu")
    kind = unit.rsplit(".", 1)[-1]
    path = _dropin(unit, name)
    tf.real(path).parent.mkdir(parents=True, exist_ok=True)
    tf.real(path).write_text(f"{_HEADER}[{_SECTION[kind]}]\n{name}={value}\n")
    file, default = _FILE[name]
    text = default
    if value and name == "CPUQuota":
        text = f"{round(float(value.rstrip('%')) * 1000)} 100000"
    elif value:
        text = value
    write_cg(f"{cg}/{file}", text)
