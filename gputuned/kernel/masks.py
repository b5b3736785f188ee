"""Kernel files that hold a CPU mask: printed as the kernel prints masks (``%*pb``: hex in
32-bit groups, ``format_mask``) and written the same way, with at least one online CPU. The
sysfs setting writes only files listed here or named by another kernel module
(gputuned/settings/sysfs.py), and the simulator stores a mask written to one as the kernel
prints it (gputuned/sim/model.py). And which threads' CPU mask is the kernel's alone."""

from __future__ import annotations

import re

from gputuned.kernel.irqs import DEFAULT_AFFINITY

#: kernel/workqueue.c (Linux 4.2+): the unbound workqueues' mask, and a folder per workqueue
#: made with WQ_SYSFS that holds its own.
WORKQUEUES = "/sys/devices/virtual/workqueue"
UNBOUND_WORKQUEUES = f"{WORKQUEUES}/cpumask"
WORKQUEUE_MASK = re.compile(rf"{WORKQUEUES}/([A-Za-z0-9_][A-Za-z0-9_.:-]{{0,63}}/)?cpumask")

#: include/linux/sched.h: the flags field of /proc/PID/stat (kernel/procfs.py FLAGS) of a thread
#: whose CPUs only the kernel sets: per-CPU kernel threads (kthread_bind()), workqueue workers.
#: sched_setaffinity() refuses it with EINVAL (kernel/sched/syscalls.c).
PF_NO_SETAFFINITY = 0x04000000

#: Every CPU mask file gputuned writes.
MASK_FILES = re.compile("|".join((re.escape(DEFAULT_AFFINITY), WORKQUEUE_MASK.pattern)))
