"""The machine as gputuned sees it: the kernel port, its live backend, and the typed readers.

:mod:`gputuned.kernel.port` says what the port offers; :mod:`gputuned.kernel.base` is what its
backends share, :mod:`gputuned.kernel.live` the running machine; :mod:`gputuned.sim` simulates
a host tree. :mod:`gputuned.kernel.procfs` parses the formats of /proc/PID files and
:mod:`gputuned.kernel.tasks` names thread operations and explains their refusals.

The typed readers, each through the port: ``pci`` and ``pciconfig`` (links, config space),
``system`` (CPUs, NUMA, IRQs, cgroups), ``mounts``, ``nvml``, ``irqbalance``, ``sampling``
(scheduler and IRQ counters), ``users``; and the commands' machine side: ``capture`` (a host
into a tree) and ``sysinstall`` (install-system's files and systemd's tools).
"""

from gputuned.kernel.port import Kernel

__all__ = ["Kernel"]
