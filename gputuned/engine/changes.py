"""What tuners return from ``plan``: changes, refusals, notes. Data only.

A :class:`Change` is (tuner, target, current value, wanted value, why). Tuners import these
types from here; the engine collects them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gputuned.engine.inspect import Snapshot
    from gputuned.kernel import Kernel
    from gputuned.kernel.proc import ProcInfo
    from gputuned.kernel.system import CgroupLayout, Irq
    from gputuned.profile.cpusets import ResolvedCpus
    from gputuned.profile.model import Profile
    from gputuned.profile.topology import HostCpus
    from gputuned.tuners.gpuuse import GpuUse
    from gputuned.tuners.proctree import Claim
    from gputuned.tuners.spread import Held


@dataclass(frozen=True)
class Change:
    """One setting a profile manages: what it is now, what the profile wants, and why.

    ``in_sync`` settings are already right; plan lists only the others, but apply and verify
    need both (a setting that is right is still managed: switching profiles must not revert it).
    """

    tuner: str
    target: str
    current: str
    wanted: str
    why: str
    path: str = ""  # the host file written, where there is one
    report_only: bool = False  # listed, never applied (the tuner's report_only switch)
    key: str = ""  # identity of the setting across plans and in the journal
    #: How it is read and written: the change kind of one class of gputuned/settings/ (the
    #: module says what ``path``, ``compare`` and ``data`` hold for it).
    kind: str = "sysfs"
    compare: str = "text"  # sysfs: text | cpulist | mask | policy | partition; mount: options
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    in_sync: bool = False

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", f"{self.kind}:{self.path or self.target}")


@dataclass(frozen=True)
class Refusal:
    """Something the profile asks for that gputuned will not or cannot do here, and why.

    Most refusals leave the rest of the profile to be applied. A ``blocking`` one means that
    applying any of it would do harm here (another cgroup's partition already holds the
    profile's CPUs): ``plan_profile`` then raises PlanError and apply writes nothing.
    """

    tuner: str
    target: str
    reason: str
    blocking: bool = False


@dataclass
class TunerPlan:
    changes: list[Change] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending_boot: list[str] = field(default_factory=list)


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
    name: str

    def plan(self, ctx: PlanContext) -> TunerPlan: ...
