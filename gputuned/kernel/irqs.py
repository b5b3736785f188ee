"""The kernel's IRQ affinity files under /proc/irq (kernel/irq/proc.c), spelled here only: an
IRQ's CPUs as a list (``smp_affinity_list``) and as a mask (``smp_affinity``), and the mask new
IRQs get (``default_smp_affinity``)."""

from __future__ import annotations

import re

from gputuned.cpulist import parse_cpulist
from gputuned.kernel import Kernel

IRQ_DIR = "/proc/irq"
DEFAULT_AFFINITY = f"{IRQ_DIR}/default_smp_affinity"
#: An IRQ's affinity file in list form (group 1: the IRQ).
LIST_FILE = re.compile(r"/proc/irq/(\d{1,7})/smp_affinity_list")
#: Either form, list or mask (group 1: the IRQ, group 2: the file's name).
AFFINITY_FILE = re.compile(r"/proc/irq/(\d{1,7})/(smp_affinity_list|smp_affinity)")


def irq_dir(irq: int) -> str:
    return f"{IRQ_DIR}/{irq}"


def affinity_file(irq: int) -> str:
    """The list form, the one gputuned reads and writes."""
    return f"{irq_dir(irq)}/smp_affinity_list"


def affinity_irq(path: str) -> int | None:
    """The IRQ whose list-form affinity file ``path`` is, else None."""
    m = LIST_FILE.fullmatch(path)
    return int(m[1]) if m else None


def read_affinity(kernel: Kernel, irq: int) -> frozenset[int] | None:
    """The IRQ's CPUs; None where the file is not there (the IRQ went)."""
    raw = kernel.read_optional(affinity_file(irq))
    return parse_cpulist(raw) if raw is not None else None
