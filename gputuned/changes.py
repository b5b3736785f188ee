"""What tuners return from ``plan``: changes, refusals, notes. Data only.

A :class:`Change` is (tuner, target, current value, wanted value, why). Tuners import these
types from here; the engine collects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gputuned.host import Host
    from gputuned.host.proc import ProcInfo
    from gputuned.host.system import CgroupLayout, Irq
    from gputuned.inspect import Snapshot
    from gputuned.profile import Profile, ResolvedCpus
    from gputuned.topology import HostCpus


@dataclass(frozen=True)
class Change:
    """One difference between the host and the profile."""

    tuner: str
    target: str
    current: str
    wanted: str
    why: str
    path: str = ""  # the host file written, where there is one
    report_only: bool = False  # listed, never applied (the tuner's report_only switch)


@dataclass(frozen=True)
class Refusal:
    """Something the profile asks for that gputuned will not or cannot do here, and why."""

    tuner: str
    target: str
    reason: str


@dataclass
class TunerPlan:
    changes: list[Change] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending_boot: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PlanContext:
    """What tuners plan against: the host read once, the profile, resolved CPU sets."""

    host: Host
    profile: Profile
    snap: Snapshot
    cpus: HostCpus
    sets: ResolvedCpus
    irqs: list[Irq]
    default_affinity: frozenset[int] | None
    cgroup: CgroupLayout
    processes: list[ProcInfo]


class Tuner(Protocol):
    name: str

    def plan(self, ctx: PlanContext) -> TunerPlan: ...
