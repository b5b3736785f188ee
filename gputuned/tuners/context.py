"""What tuners plan against (:class:`PlanContext`: the host read once, the profile, the
resolved CPU sets) and what a tuner is (:class:`Tuner`). The engine builds the context
(gputuned/engine/plan.py ``read_context``); tuners read it and return a TunerPlan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gputuned.changes import Change, TunerPlan
    from gputuned.kernel import Kernel
    from gputuned.kernel.proc import ProcInfo
    from gputuned.kernel.snapshot import Snapshot
    from gputuned.kernel.system import CgroupLayout, Irq
    from gputuned.kernel.topology import HostCpus
    from gputuned.profile.cpusets import ResolvedCpus
    from gputuned.profile.model import Profile
    from gputuned.tuners.gpuuse import GpuUse


@dataclass(frozen=True)
class Claim:
    """A process a rule claims. ``role``: "match" (the rule's keys, or a registration),
    "child" (a descendant, placed like the match) or "excluded" (a descendant the rule leaves
    out: it gets back what its ancestor had before gputuned). ``parent``: the claimed process
    it descends from, 0 for none."""

    rule: str
    role: str
    start: int
    parent: int = 0
    #: Why an "excluded" descendant is left out, where plan says so ("another user").
    why: str = ""


@dataclass(frozen=True)
class Held:
    """The CPUs of a placed process's threads, as its placement left them."""

    start: int
    threads: dict[int, frozenset[int]]


@dataclass(frozen=True)
class PlanContext:
    """What tuners plan against: the host read once, the profile, resolved CPU sets."""

    kernel: Kernel
    profile: Profile
    snap: Snapshot
    cpus: HostCpus
    sets: ResolvedCpus
    irqs: list[Irq]
    default_affinity: frozenset[int] | None
    cgroup: CgroupLayout
    processes: list[ProcInfo]
    #: PIDs placed by hand (gputunectl register) -> (start time, name of the rule).
    registered: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: IRQ -> NUMA node of the PCI function that owns it (read on hosts with several nodes).
    irq_nodes: dict[int, int] = field(default_factory=dict)
    #: Processes claimed by a rule earlier (the daemon's): parents of the processes listed.
    claimed: dict[int, Claim] = field(default_factory=dict)
    #: The CPUs of the threads of processes placed earlier (the daemon's), by PID: a tree
    #: spread over a partition is planned whole when one new process of it is placed.
    held: dict[int, Held] = field(default_factory=dict)
    #: The journaled original of a setting by its key, None when it is not journaled.
    original: Callable[[str], str | None] = field(default=lambda _key: None)
    #: Which GPUs a process uses (NVML, device nodes, environment), read when first asked.
    gpu_use: GpuUse | None = None
    #: What tuners work out once from this reading of the host and share (the partition made
    #: in place: tuners/inplace.py decision()); a copy made with dataclasses.replace shares it.
    memo: dict[str, Any] = field(default_factory=dict, compare=False)
    #: Processes whose CPUs the daemon leaves to them (they bind themselves): pid -> start
    #: time (gputuned/daemon/selfbind.py). Their affinity is not planned.
    self_bound: Mapping[int, int] = field(default_factory=dict)


class Tuner(Protocol):
    """What a table's declaration names (gputuned/profile/tables/, ``tuner``): the engine
    calls ``plan`` in the declared order, with every change planned before it (``planned``)."""

    name: str

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan: ...
