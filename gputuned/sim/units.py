"""systemd's side of a unit's cgroup property, in a tree (a tree with /run/systemd/system).

``set-property --runtime UNIT AllowedCPUs=CPUS`` as systemd 257 carries it out
(src/core/dbus-cgroup.c bus_cgroup_set_property(), src/core/cgroup.c): it writes the drop-in
under /run/systemd/system.control, and while the unit has a cgroup it enables the cpuset
controller from the top down to the unit's parent (cgroup.subtree_control) and writes the
unit's ``cpuset.cpus``. Simplified: no unit files are read (a property is what the drop-in
says, else empty), a ``.service`` is always loaded, a ``.scope`` only while its cgroup exists,
and on a reset the cpuset controller goes from the parents (the root too) whose units no
longer need it.
"""

from __future__ import annotations

import errno as E
import os

from gputuned.cpulist import format_cpulist
from gputuned.kernel.systemd import TRANSIENT_DIR, dropin, section
from gputuned.sim import cgroups, cpusets
from gputuned.sim.files import TreeFiles, fail


def unit_cgroup(tf: TreeFiles, unit: str) -> str | None:
    """The unit's cgroup in the tree (a directory of that name below slices), or None."""
    for mount in tf.cgroup2_mounts():
        for top, dirs, _files in os.walk(tf.real(mount)):
            if unit in dirs:
                rel = os.path.relpath(os.path.join(top, unit), tf.root)
                return "/" + rel
            dirs[:] = [d for d in dirs if d.endswith(".slice")]
    return None


#: Where a tree keeps unit files: transient units (a runtime's scope: podman's libpod scopes
#: are made with Delegate=yes), then the administrator's.
_UNIT_DIRS = (TRANSIENT_DIR, "/etc/systemd/system")


def delegate(tf: TreeFiles, unit: str) -> str | None:
    """``Delegate=`` as ``systemctl show`` prints it: "yes" where the unit's file says so,
    else "no"; None for a unit that is not loaded."""
    if not _loaded(tf, unit):
        return None
    for d in _UNIT_DIRS:
        for line in (tf.get(f"{d}/{unit}") or "").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "Delegate":
                return "yes" if value.strip().lower() in ("yes", "true", "on", "1") else "no"
    return "no"


def _loaded(tf: TreeFiles, unit: str) -> bool:
    return unit.endswith(".service") or unit_cgroup(tf, unit) is not None


def _dropin(tf: TreeFiles, unit: str, name: str) -> str:
    """The drop-in systemd writes: a transient unit's (its file in /run/systemd/transient)
    beside that file."""
    return dropin(unit, name, transient=tf.get(f"{TRANSIENT_DIR}/{unit}") is not None)


def show(tf: TreeFiles, unit: str, name: str) -> str | None:
    if not _loaded(tf, unit):
        return None
    for line in (tf.get(_dropin(tf, unit, name)) or "").splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() == name:
            return value.strip()
    return ""


def set_property(tf: TreeFiles, unit: str, name: str, value: str) -> None:
    if not _loaded(tf, unit):
        raise fail(E.ENOENT, f"Unit {unit} not loaded.")
    if name != "AllowedCPUs":
        raise fail(E.EINVAL, f"property {name} is not modelled")
    cpus = tf.parse_cpus(value, as_list=True) if value.strip() else frozenset()
    path = tf.real(_dropin(tf, unit, name))
    path.parent.mkdir(parents=True, exist_ok=True)
    shown = format_cpulist(cpus) if cpus else ""
    path.write_text(
        '# This is a drop-in unit file extension, created via "systemctl set-property"\n'
        "# or an equivalent operation. Do not edit.\n"
        f"[{section(unit)}]\n{name}={shown}\n"
    )
    cg = unit_cgroup(tf, unit)
    if cg is None:
        return
    mount = tf.cgroup2_mount(cg)
    assert mount is not None
    parents = _parents(mount, cg)
    if cpus:
        for at in parents:  # the cpuset controller on every parent, from the top
            if "cpuset" not in (tf.get(f"{at}/cgroup.subtree_control") or "").split():
                cgroups.write_subtree_control(tf, mount, at, "+cpuset")
    cpusets.write_cpus(tf, mount, cg, shown)
    if not cpus:
        realize_parents(tf, mount, parents)


def realize_parents(tf: TreeFiles, mount: str, parents: list[str]) -> None:
    """A slice's members that need cpuset no more: systemd realizes the slice with the
    controllers its members need (src/core/cgroup.c unit_get_members_mask()), and cg_enable()
    writes "-cpuset" for it. The root slice too: the cgroups below it that are no unit
    (gputuned's own) are not systemd's and count for nothing, so their cpuset files go with
    the controller (seen in the QEMU lane's guest, systemd 257)."""
    for at in reversed(parents):
        needed = any(_needs_cpuset(tf, kid) for kid in tf.children(at) if _unit_like(kid))
        if not needed and "cpuset" in (tf.get(f"{at}/cgroup.subtree_control") or "").split():
            cgroups.write_subtree_control(tf, mount, at, "-cpuset")


def _parents(mount: str, cg: str) -> list[str]:
    parts = cg[len(mount) :].strip("/").split("/")
    return [mount] + [f"{mount}/{'/'.join(parts[:i])}" for i in range(1, len(parts))]


def _unit_like(cg: str) -> bool:
    """A cgroup systemd made for a unit (a slice, service or scope)."""
    return cg.rsplit("/", 1)[-1].endswith((".slice", ".service", ".scope"))


def _needs_cpuset(tf: TreeFiles, cg: str) -> bool:
    """A unit with AllowedCPUs= (a non-empty cpuset.cpus), or a slice enabling it below."""
    return (
        bool((tf.get(f"{cg}/cpuset.cpus") or "").strip())
        or "cpuset" in (tf.get(f"{cg}/cgroup.subtree_control") or "").split()
    )
