"""Plain data about the host's CPUs and GPUs, as the profile layer needs it.

Built by :func:`gputuned.host.topology.read_topology` from a :class:`~gputuned.host.Host`;
profiles resolve named CPU sets against it without touching the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuRef:
    """One GPU as CPU placement sees it. ``index`` follows NVML when present, else BDF order."""

    index: int
    bdf: str
    numa_node: int | None
    local_cpus: frozenset[int]
    name: str = ""


@dataclass(frozen=True)
class HostCpus:
    """CPUs online, NUMA nodes and their CPUs, and GPUs with their local CPUs."""

    online: frozenset[int]
    numa: dict[int, frozenset[int]] = field(default_factory=dict)
    gpus: tuple[GpuRef, ...] = ()
    isolated: frozenset[int] = frozenset()
    nohz_full: frozenset[int] = frozenset()

    @property
    def nr_cpus(self) -> int:
        """Highest CPU number plus one (the kernel's nr_cpu_ids when CPUs are contiguous)."""
        return max(self.online) + 1 if self.online else 0
