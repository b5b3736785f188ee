"""A text attribute of sysfs or procfs: the ASPM policy and per-link ASPM states, an IRQ's
affinity and the default affinity, a cgroup's cpuset files.

``compare`` says how two values are compared, since the kernel prints some values in a form of
its own: ``text``; ``cpulist`` (as sets of CPUs); ``cpulist_subset`` (held when the CPUs read
are within those wanted: an IRQ that need only stay inside a set); ``mask`` (a hex CPU mask);
``policy`` (the ASPM policy file lists every choice with the current one in brackets);
``partition`` (``cpuset.cpus.partition``: a partition the kernel made invalid reads
``isolated invalid (<reason>)``, which never holds).
"""

from __future__ import annotations

import errno as E
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.cpulist import parse_cpulist, parse_mask
from gputuned.kernel.irqs import LIST_FILE, affinity_irq
from gputuned.kernel.masks import MASK_FILES
from gputuned.settings.base import Op, Setting, read_only_reason

if TYPE_CHECKING:
    from gputuned.kernel import Kernel

_BDF = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"  # PCI domains past ffff exist (VMD)
PCI_DEVICE = rf"/sys/devices/pci[0-9a-f]{{4,8}}:[0-9a-f]{{2}}(/{_BDF})+"
CGROUP = r"/sys/fs/cgroup(/[^/\0]+)*"
#: The files gputuned writes as text attributes (what the tuners produce).
_FILES = re.compile(
    "|".join(
        (
            r"/sys/module/pcie_aspm/parameters/policy",
            rf"{PCI_DEVICE}/link/(l0s_aspm|l1_aspm|l1_1_aspm|l1_2_aspm)",
            LIST_FILE.pattern,
            MASK_FILES.pattern,
            rf"{CGROUP}/cpuset\.cpus(\.exclusive|\.partition)?",
        )
    )
)
CPUSET_FILE = re.compile(rf"{CGROUP}/cpuset\.cpus(\.exclusive|\.partition)?")


def writable_form(compare: str, raw: str) -> str:
    """What to write to a sysfs file so that it reads ``raw`` again."""
    text = raw.strip()
    if compare == "policy":
        m = re.search(r"\[(\w+)\]", text)
        return m.group(1) if m else text
    if compare == "partition":
        return text.split()[0] if text else "member"
    return text


def same(compare: str, have: str, want: str) -> bool:
    if compare in ("cpulist", "cpulist_subset"):
        h, w = parse_cpulist(have), parse_cpulist(want)
        return h <= w if compare == "cpulist_subset" else h == w
    if compare == "mask":
        return parse_mask(have) == parse_mask(want)
    if compare == "options":  # mount options: the kernel prints them in an order of its own
        return set(have.split(",")) == set(want.split(","))
    return have == want


class SysfsAttribute(Setting):
    kind = change_kind = "sysfs"
    writes_path = True
    what = "a text attribute under /sys or /proc"

    def read(self, kernel: Kernel, op: Op) -> str:
        return writable_form(op.compare, kernel.read_text(op.path))

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        kernel.write_text(op.path, value if value else "\n")

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        raw = kernel.read_text(op.path).strip()
        if op.compare == "partition" and "invalid" in raw:
            return False, raw  # e.g. "isolated invalid (Cpu list in cpuset.cpus not exclusive)"
        return same(op.compare, writable_form(op.compare, raw), value), raw

    def batched(self, op: Op) -> bool:
        return affinity_irq(op.path) is not None

    def gone(self, kernel: Kernel, op: Op) -> str | None:
        """A cpuset file of a cgroup that was removed, or whose parent no longer enables
        cpuset for it: its value went with it, and the kernel starts from its defaults when
        either comes back."""
        if not CPUSET_FILE.fullmatch(op.path):
            return None
        folder = op.path.rsplit("/", 1)[0]
        if not kernel.is_dir(folder):
            return f"its cgroup {folder} no longer exists (its values went with it)"
        controllers = kernel.read_optional(f"{folder}/cgroup.controllers")
        if controllers is not None and "cpuset" not in controllers.split():
            return f"{folder} has no cpuset controller now (its parent disabled it)"
        return None

    def restoring(self, kernel: Kernel, op: Op, old: str) -> tuple[Op, str]:
        """An IRQ that only had to stay inside a set gets back exactly its old CPUs."""
        if op.compare == "cpulist_subset":
            return replace(op, compare="cpulist"), old
        return op, old

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        code = getattr(exc, "errno", None)
        # Only a refused *write* says the IRQ cannot move. Reading its affinity has no such
        # answer in the kernel (kernel/irq/proc.c show_irq_affinity()): a read error there is
        # an unexplained fault, a failure like any other (rolled back without --keep-going).
        if affinity_irq(op.path) is not None and getattr(exc, "op", "") == "write":
            if code == E.EIO:
                return "unmovable (EIO): a kernel-managed IRQ; its affinity is fixed by the kernel"
            if code in (E.EPERM, E.EACCES):
                # EACCES: the kernel made this IRQ's file read-only (0444) for an IRQ it will
                # not move, and the caller lacks CAP_DAC_OVERRIDE.
                return f"unmovable ({E.errorcode[code]}): the kernel refuses to move this IRQ"
        if code == E.EROFS and getattr(exc, "op", "") == "write":
            # plan says so before apply where mountinfo shows the mount (Setting.impossible)
            return read_only_reason("/proc/irq" if op.path.startswith("/proc/irq/") else op.path)
        if op.path.endswith("/pcie_aspm/parameters/policy") and code == E.EPERM:
            return "firmware owns ASPM: the kernel refuses policy writes (EPERM)"
        return None

    def refusal(self, op: Op, value: str) -> str | None:
        if not _FILES.fullmatch(op.path):
            return f"{op.path!r} is no file gputuned writes"
        return None if len(value) <= 4096 else "a value too long for the file it names"
