"""Kernel files that hold a CPU mask: printed as the kernel prints masks (``%*pb``: hex in
32-bit groups, ``format_mask``) and written the same way, with at least one online CPU. The
sysfs setting writes only files listed here or named by another kernel module
(gputuned/settings/sysfs.py), and the simulator stores a mask written to one as the kernel
prints it (gputuned/sim/model.py)."""

from __future__ import annotations

import re

from gputuned.kernel.irqs import DEFAULT_AFFINITY

#: Every CPU mask file gputuned writes.
MASK_FILES = re.compile("|".join((re.escape(DEFAULT_AFFINITY),)))
