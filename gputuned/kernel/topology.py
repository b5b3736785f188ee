"""Plain data about the host's CPUs and GPUs: what the planner and the profile's CPU sets read.

Built by :func:`gputuned.kernel.system.read_host_cpus` through the kernel port;
profiles resolve named CPU sets against it without touching the machine.

A *core* here is one physical core: its SMT siblings, as the kernel lists them in
``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`` (Documentation/ABI/stable/
sysfs-devices-system-cpu). Firmware numbers siblings in one of two common ways: every core's
first thread before any second thread (siblings N and N + the number of cores, usual on
two-socket x86 servers), or the threads of a core next to each other (siblings 2k and 2k + 1,
as QEMU and some ARM servers do). Nothing here assumes either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


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
    """CPUs online, NUMA nodes and their CPUs, SMT siblings, and GPUs with their local CPUs."""

    online: frozenset[int]
    numa: dict[int, frozenset[int]] = field(default_factory=dict)
    gpus: tuple[GpuRef, ...] = ()
    isolated: frozenset[int] = frozenset()
    nohz_full: frozenset[int] = frozenset()
    #: Each core's CPUs as thread_siblings_list gives them. Empty when the kernel shows no
    #: topology files: every CPU is then a core of its own.
    smt: tuple[frozenset[int], ...] = ()

    @property
    def nr_cpus(self) -> int:
        """Highest CPU number plus one (the kernel's nr_cpu_ids when CPUs are contiguous)."""
        return max(self.online) + 1 if self.online else 0

    @cached_property
    def cores(self) -> tuple[frozenset[int], ...]:
        """Every online CPU in exactly one core (its online siblings), cores by lowest CPU."""
        out: list[frozenset[int]] = []
        seen: set[int] = set()
        for group in self.smt:
            core = (group & self.online) - seen
            if core:
                out.append(frozenset(core))
                seen |= core
        out += [frozenset({c}) for c in self.online - seen]
        return tuple(sorted(out, key=min))

    @cached_property
    def _core_index(self) -> dict[int, frozenset[int]]:
        return {cpu: core for core in self.cores for cpu in core}

    def core_of(self, cpu: int) -> frozenset[int]:
        """The online CPUs of ``cpu``'s core (just ``cpu`` when it is offline or unknown)."""
        return self._core_index.get(cpu, frozenset({cpu}))

    def whole_cores(self, cpus: frozenset[int]) -> frozenset[int]:
        """``cpus`` and every SMT sibling of them: the cores they touch, whole."""
        return frozenset(c for cpu in cpus for c in self.core_of(cpu))

    def units(self, cpus: frozenset[int]) -> list[frozenset[int]]:
        """``cpus`` cut along cores: each core's part of ``cpus``, cores by lowest CPU."""
        return [core & cpus for core in self.cores if core & cpus]

    @property
    def threads_per_core(self) -> int:
        return max((len(c) for c in self.cores), default=1)

    @cached_property
    def nodes(self) -> dict[int, frozenset[int]]:
        """NUMA node -> its online CPUs, for nodes with any. Without NUMA information (a kernel
        built without CONFIG_NUMA has no /sys/devices/system/node) the host is one node 0."""
        nodes = {n: cpus & self.online for n, cpus in sorted(self.numa.items())}
        nodes = {n: cpus for n, cpus in nodes.items() if cpus}
        return nodes or ({0: self.online} if self.online else {})

    def node_of(self, cpu: int) -> int | None:
        return next((n for n, cpus in self.nodes.items() if cpu in cpus), None)

    def gpu_local(self, gpu: GpuRef) -> frozenset[int]:
        """The GPU's online local CPUs, or every online CPU when it reports none."""
        return (gpu.local_cpus & self.online) or self.online

    def gpu_node(self, gpu: GpuRef) -> int | None:
        """The NUMA node of ``gpu``'s local CPUs, when they all lie in one node."""
        local = self.gpu_local(gpu)
        found = {n for n, cpus in self.nodes.items() if cpus & local}
        return found.pop() if len(found) == 1 else None
