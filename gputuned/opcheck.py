"""What a journal entry may ask revert to write: only the paths and kinds gputuned writes.

The journal is root's file in a root-only folder, and gputuned refuses it when others could
have written it; still, revert writes whatever its entries name, as root, so an entry is checked
against what the tuners produce before it is trusted (issue 14, finding 13). An entry that names
anything else (``/etc/passwd`` as a "sysfs" value, a "file" other than the GRUB drop-in, a
config-space write outside Device Control's payload fields, a mount that is not cgroup2) is
refused: revert leaves it alone and reports it, and it stays in the journal for a person to see.

The forms, by kind (gputuned/changes.py names them; the tuners build them):

- ``sysfs``: the ASPM policy; a PCI function's ``link/l*_aspm``; ``/proc/irq/N/smp_affinity_list``
  or ``/proc/irq/default_smp_affinity``; ``cpuset.cpus``, ``cpuset.cpus.exclusive`` or
  ``cpuset.cpus.partition`` of a cgroup under /sys/fs/cgroup;
- ``pcie``: a function's ``config``, at the PCIe capability's Device Control (offset 0x48..0xfe),
  in its MPS (bits 7:5) or MRRS (bits 14:12) field, a value 0..5;
- ``cgroup``: a folder below /sys/fs/cgroup; ``controller``: its ``cgroup.subtree_control``,
  cpuset; ``file``: the GRUB drop-in; ``mount``: the cgroup2 mount's options;
- process kinds (``nice``, ``affinity``, ``policy``, ``proc_cgroup``, ``irqbalance``): integer
  pid, start time and thread id, and a value of the form the setting takes.
"""

from __future__ import annotations

import re

from gputuned.actions import Op
from gputuned.host.state import GRUB_DROPIN

_BDF = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"  # PCI domains past ffff exist (VMD)
_PCI_DEV = rf"/sys/devices/pci[0-9a-f]{{4,8}}:[0-9a-f]{{2}}(/{_BDF})+"
_CG = r"/sys/fs/cgroup(/[^/\0]+)*"
_SYSFS = re.compile(
    "|".join(
        (
            r"/sys/module/pcie_aspm/parameters/policy",
            rf"{_PCI_DEV}/link/(l0s_aspm|l1_aspm|l1_1_aspm|l1_2_aspm)",
            r"/proc/irq/\d{1,7}/smp_affinity_list",
            r"/proc/irq/default_smp_affinity",
            rf"{_CG}/cpuset\.cpus(\.exclusive|\.partition)?",
        )
    )
)
_FIELDS = {0x00E0: 5, 0x7000: 12}  # DevCtl MPS and MRRS (tuners/pcie_payload.py)
_COMPARES = ("text", "cpulist", "cpulist_subset", "mask", "policy", "partition", "options")
_CPULIST = re.compile(r"[0-9,\-:/]{0,4096}")
_POLICY = re.compile(r"(other|batch|idle)|(fifo|rr):\d{1,2}")
_OPTIONS = re.compile(r"[a-z0-9_]+(=[a-z0-9_]+)?(,[a-z0-9_]+(=[a-z0-9_]+)?)*")
_CGROUP_PATH = re.compile(r"/([^/\0]+(/[^/\0]+)*)?")
_PROCESS = ("nice", "affinity", "policy", "irqbalance", "proc_cgroup")


def refusal(op: Op, value: str) -> str | None:
    """Why revert must not write ``value`` through ``op`` (None: it is one of gputuned's)."""
    if not all(isinstance(v, str) for v in (op.key, op.tuner, op.target, op.kind, op.path)):
        return "a field of the wrong type"
    if ".." in op.path.split("/") or "\0" in op.path:
        return f"the path {op.path!r} climbs out with '..'"
    if op.compare not in _COMPARES:
        return f"an unknown comparison {op.compare!r}"
    check = _CHECKS.get(op.kind)
    if check is None:
        return f"an unknown kind {op.kind!r}"
    return check(op, value)


def _sysfs(op: Op, value: str) -> str | None:
    if not _SYSFS.fullmatch(op.path):
        return f"{op.path!r} is no file gputuned writes"
    return None if len(value) <= 4096 else "a value too long for the file it names"


def _pcie(op: Op, value: str) -> str | None:
    if not re.fullmatch(rf"{_PCI_DEV}/config", op.path):
        return f"{op.path!r} is no PCI function's config space"
    d = op.data
    off, mask, shift = d.get("offset"), d.get("mask"), d.get("shift")
    if type(off) is not int or not 0x48 <= off <= 0xFE or off % 2:
        return f"config space offset {off!r} is not a Device Control register"
    if mask not in _FIELDS or _FIELDS[mask] != shift:
        return f"mask {mask!r} and shift {shift!r} are not the MPS or MRRS field"
    return None if value.isdigit() and int(value) <= 5 else f"{value!r} is not a payload code"


def _cgroup(op: Op, value: str) -> str | None:
    if not re.fullmatch(_CG, op.path) or op.path == "/sys/fs/cgroup":
        return f"{op.path!r} is no cgroup gputuned makes"
    return None if value in ("present", "\0absent") else f"{value!r} is not present or absent"


def _controller(op: Op, value: str) -> str | None:
    if not re.fullmatch(rf"{_CG}/cgroup\.subtree_control", op.path):
        return f"{op.path!r} is no cgroup.subtree_control"
    if op.data.get("controller") != "cpuset":
        return f"controller {op.data.get('controller')!r} is not one gputuned enables"
    return None if value in ("present", "\0absent") else f"{value!r} is not present or absent"


def _file(op: Op, value: str) -> str | None:
    if op.path != GRUB_DROPIN:
        return f"{op.path!r} is not {GRUB_DROPIN}, the one file gputuned writes"
    return None if len(value) <= 65536 else "a value too long for the GRUB drop-in"


def _mount(op: Op, value: str) -> str | None:
    if op.data.get("fstype") != "cgroup2" or not re.fullmatch(_CG, op.path):
        return "a mount that is not the cgroup2 hierarchy"
    return None if _OPTIONS.fullmatch(value) else f"{value[:80]!r} are not mount options"


def _process(op: Op, value: str) -> str | None:
    d = op.data
    ids = [d.get("pid"), d.get("start")] + ([d.get("tid")] if op.kind in _PROCESS[:3] else [])
    if not all(type(i) is int and i >= 0 for i in ids) or not d.get("pid"):
        return "a process entry without a pid, start time and thread id"
    if op.kind == "nice":
        ok = re.fullmatch(r"-?\d{1,2}", value) is not None and -20 <= int(value) <= 19
    elif op.kind == "affinity":
        ok = value == "cgroup-default" or _CPULIST.fullmatch(value) is not None
    elif op.kind == "policy":
        ok = _POLICY.fullmatch(value) is not None
    elif op.kind == "irqbalance":
        ok = (
            d.get("attr") in ("cpus", "irqs")
            and re.fullmatch(r"[0-9,\- ]{0,8192}", value) is not None
        )
    else:  # proc_cgroup
        mount = d.get("mount")
        ok = isinstance(mount, str) and re.fullmatch(_CG, mount) is not None
        ok = ok and _CGROUP_PATH.fullmatch(value) is not None and ".." not in value.split("/")
    return None if ok else f"{value[:80]!r} is not a {op.kind} value gputuned writes"


_CHECKS = {
    "sysfs": _sysfs,
    "pcie": _pcie,
    "cgroup": _cgroup,
    "controller": _controller,
    "file": _file,
    "mount": _mount,
    **dict.fromkeys(_PROCESS, _process),
}
