"""`[cpusets]`: named CPU sets, the checks across the tables that name them, and resolved sets.

This module holds the set model (:class:`CpuSetSpec`), the profile checks that need no host
(every set named is defined, sets that must not share CPUs do not), and
:class:`ResolvedCpus`, what a profile's sets became on one host. Resolving them on a host is
:mod:`gputuned.profile.cpuresolve`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from gputuned.cpulist import CpuListError, parse_cpulist
from gputuned.kernel.topology import GpuRef, HostCpus

if TYPE_CHECKING:
    from gputuned.profile.tables.cpuset import Config as CpusetConfig

Problems = list[tuple[str, str]]
PARTITION_MODES = ("isolated", "root")
_BASES = ("cpus", "gpu_local", "numa_node", "all", "per")


class CpuSetSpec(BaseModel):
    """One named CPU set: a base, minus the sets in `exclude`, cut to `count` CPUs or `cores`.

    Bases (give exactly one):

    - `cpus = "0-3,8"`: these CPUs. A CPU this host does not have online makes the profile fail
      to plan here: the set is refused, never trimmed.
    - `gpu_local = N`: the NUMA-local CPUs of GPU N (sysfs `local_cpulist`).
    - `numa_node = N`: the CPUs of NUMA node N.
    - `all = true`: every online CPU.
    - `per = "gpu"`: one member per GPU: the GPU's NUMA-local CPUs, divided among the GPUs that
      share them, so that no two GPUs get the same core while there are cores enough.
      `count` and `cores` are per GPU; without either, the GPUs of a node share its cores
      equally. The same profile thus gives 1, 2, 4 or 8 GPUs a set each.
    - `per = "node"`: one member per NUMA node with CPUs: that node's CPUs; `count` and `cores`
      are per node (`cores = 1`: the first core of every node, e.g. for housekeeping).

    Whole cores: SMT siblings (`/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`)
    stay together. `exclude` removes every core that has any CPU in an excluded set, `count`
    takes the lowest whole cores until it has at least that many CPUs (`count = 3` with two
    threads per core takes 2 cores, 4 CPUs), `cores` takes that many cores, and `max_percent`
    caps the share of each node in whole cores. A computed set therefore gives a core to the
    server or to its neighbours, never half to each. A literal `cpus` list is taken as written;
    the plan notes where it splits a core.

    How the tables use a set: `[irq] gpu_cpus` sends each GPU's vectors to that GPU's member
    (`per = "gpu"`), else to the set's CPUs on the GPU's NUMA node; only where the set has none
    there do they go elsewhere, and the plan says so. `[irq] others_cpus` sends each other IRQ
    to the set's CPUs on its device's node. `[cpuset] cpus` with `partitions = "node"` or
    `"gpu"` makes one partition per node or per GPU member. Everywhere else (`[[process]]`,
    `[bootargs]`, `[irq] default_affinity`) a set means all its CPUs, every member together.
    `gputunectl plan` prints each set per GPU and per node.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: StrictStr | None = Field(default=None, description="Base: a CPU list such as '0-3,8'.")
    gpu_local: StrictInt | None = Field(
        default=None, ge=0, description="Base: the NUMA-local CPUs of the GPU with this index."
    )
    numa_node: StrictInt | None = Field(
        default=None, ge=0, description="Base: the CPUs of this NUMA node."
    )
    all: Literal[True] | None = Field(default=None, description="Base: every online CPU.")
    per: Literal["gpu", "node"] | None = Field(
        default=None,
        description=(
            "Base: one member per GPU (its NUMA-local CPUs, divided among the GPUs that share "
            "them) or per NUMA node (its CPUs); count and cores then apply to each member."
        ),
    )
    exclude: tuple[StrictStr, ...] = Field(
        default=(),
        description="Names of other sets whose cores (whole, SMT siblings too) are removed.",
    )
    count: StrictInt | None = Field(
        default=None,
        ge=1,
        description=(
            "Keep the lowest whole cores that give at least N CPUs (per member with per)."
        ),
    )
    cores: StrictInt | None = Field(
        default=None, ge=1, description="Keep the lowest N whole cores (per member with per)."
    )
    max_percent: StrictInt | None = Field(
        default=None,
        ge=1,
        le=100,
        description=(
            "Take at most this share of each NUMA node's cores, rounded down to whole cores but "
            "at least one (with per = 'gpu': all GPUs of the node together)."
        ),
    )
    fallback_all: StrictBool = Field(
        default=True,
        description=(
            "With gpu_local or per = 'gpu', on a host without that GPU (without GPUs): use all "
            "online CPUs and say so in the plan. With false, planning fails instead."
        ),
    )

    @field_validator("cpus")
    @classmethod
    def _cpulist(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                cpus = parse_cpulist(value)
            except CpuListError as exc:
                raise ValueError(str(exc)) from None
            if not cpus:
                raise ValueError("names no CPUs; give at least one, e.g. '0'")
        return value

    @model_validator(mode="after")
    def _one_base(self) -> CpuSetSpec:
        given = [k for k in _BASES if getattr(self, k) is not None]
        if len(given) != 1:
            found = " and ".join(given) if given else "none"
            raise ValueError(
                "give exactly one base: cpus, gpu_local, numa_node, all = true or per = 'gpu' "
                f"or 'node' (found {found})"
            )
        if self.count is not None and self.cores is not None:
            raise ValueError("give count (CPUs) or cores, not both")
        return self


# -- sets resolved on a host -------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedCpus:
    """Named CPU sets resolved on one host, with what the plan should tell the user."""

    #: Every set's CPUs; for a per-GPU or per-node set, all its members together.
    sets: dict[str, frozenset[int]]
    #: Sets with per = "gpu": GPU index -> that GPU's CPUs.
    per_gpu: dict[str, dict[int, frozenset[int]]] = field(default_factory=dict)
    #: Sets with per = "node": NUMA node -> that node's CPUs.
    per_node: dict[str, dict[int, frozenset[int]]] = field(default_factory=dict)
    #: Things the user should know, such as a fallback to all CPUs or a count cut short.
    notes: list[str] = field(default_factory=list)

    def for_gpu(self, name: str, gpu: GpuRef, host: HostCpus) -> tuple[frozenset[int], str]:
        """The CPUs of set ``name`` that serve ``gpu``, and where they are:

        "own" (the GPU's member of a per-GPU set), "local" (the set's CPUs among the GPU's
        NUMA-local ones: its node's member, or that part of a plain set) or "elsewhere" (the
        set has no CPU local to the GPU: the whole set, which the plan must point out).
        """
        own = self.per_gpu.get(name, {}).get(gpu.index, frozenset())
        if own:
            return own, "own"
        local = self.sets[name] & host.gpu_local(gpu)
        if local:
            return local, "local"
        return self.sets[name], "elsewhere"

    def for_node(self, name: str, node: int | None, host: HostCpus) -> frozenset[int]:
        """The set's CPUs on NUMA node ``node``; the whole set where it has none there (or the
        node is unknown)."""
        here = self.sets[name] & host.nodes.get(node, frozenset()) if node is not None else None
        return here or self.sets[name]


# -- partitions on a host ---------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionSpec:
    """One partition the profile makes: its cgroup (relative to the mount) and its CPUs."""

    cgroup: str
    cpus: frozenset[int]
    of: str = ""  # " of node 1", " of GPU 3": what the plan says it is for


def partition_layout(cfg: CpusetConfig, sets: ResolvedCpus, host: HostCpus) -> list[PartitionSpec]:
    """The partitions of ``[cpuset]`` on this host, siblings under the cgroup v2 root.

    Siblings rather than children of one gputuned cgroup: a partition's parent must itself be
    a partition root (cgroup-v2.rst, "cpuset.cpus.partition"), and a parent whose CPUs all go
    to its children can hold no task. With several, a [[process]] rule moves each process into
    the partition of its GPU (by_gpu, tuners/gpuplace.py).
    """
    assert cfg.cpus is not None
    cpus = sets.sets[cfg.cpus]
    if cfg.partitions == "node":
        return [
            PartitionSpec(f"{cfg.cgroup}.node{n}", cpus & here, f" of node {n}")
            for n, here in host.nodes.items()
            if cpus & here
        ]
    members = sets.per_gpu.get(cfg.cpus, {})
    if cfg.partitions == "gpu" and members:
        return [
            PartitionSpec(f"{cfg.cgroup}.gpu{i}", c, f" of GPU {i}")
            for i, c in sorted(members.items())
            if c
        ]
    return [PartitionSpec(cfg.cgroup, cpus)]


def shared_cpus(parts: list[PartitionSpec]) -> list[tuple[PartitionSpec, PartitionSpec]]:
    """Pairs of partitions that would share CPUs (per-GPU members share cores when a node has
    fewer cores than GPUs); the kernel lets no two sibling partitions share a CPU."""
    return [(a, b) for i, a in enumerate(parts) for b in parts[i + 1 :] if a.cpus & b.cpus]
